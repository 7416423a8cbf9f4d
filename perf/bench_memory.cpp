// Google Benchmark of the memory system under Kokkos, on any backend: the figures the
// FlashAttention papers build their I/O argument on (reads far cheaper than writes, on-chip
// scratch an order of magnitude faster than device memory), measured on the machine at hand.
//   BM_read, BM_write, BM_copy, BM_triad: bandwidth of a sum (16 elements per reduction step),
//     a fill, a copy and STREAM's triad over one array of `bytes` (two or three for copy and
//     triad), float and double.
//   BM_read_latency: one thread chasing pointers over a random cyclic permutation of `bytes`,
//     ns per dependent load (the cache levels show as steps).
//   BM_write_latency: one thread storing to pseudo-random addresses of `bytes`, with a memory
//     fence after every store, ns per store: the store has to leave the core before the next
//     one starts, the closest measurable analogue of a write's latency.
//   BM_atomic_add: FlashAttention-2's dQ pattern: `teams` teams each add a Br x D tile (64 x 64
//     floats) into the same rows with atomics, against plain stores of the same volume into
//     separate rows (mode 0 stores, 1 atomics).
//   BM_scratch: team-scratch read+write bandwidth (each team streams a 32 KiB tile through its
//     scratch 64 times): the "SRAM" of the papers.
// Sizes 4 KiB .. 1 GiB (latency: .. 256 MiB, so a run stays within minutes on a CPU). Results:
// perf/results/*-memory-*.md. No assertion on any figure: speed is measured, never asserted.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common.hpp"

namespace {

using kfa_bench::Exec;
using Mem = Exec::memory_space;
using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;

template <class T>
using Array = Kokkos::View<T*, Mem>;

/// A bytes/s counter for `bytes` moved per iteration.
benchmark::Counter byte_rate(double bytes) {
  return benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                            benchmark::Counter::kIs1024);
}

/// The sum of 16 consecutive values as a tree: one add per 16 elements joins a reduction's
/// running sum, so a read runs at the loads' rate, not at one add's latency per element.
template <class T>
KOKKOS_INLINE_FUNCTION T block_sum(const T* x) {
  T p[8];
  for (int k = 0; k < 8; ++k)
    p[k] = x[k] + x[k + 8];
  for (int w = 4; w > 0; w /= 2)
    for (int k = 0; k < w; ++k)
      p[k] += p[k + w];
  return p[0];
}

template <class T>
void BM_read(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(T));
  Array<T> a("a", n);
  kfa_bench::fill_hash(a, 1);
  T sum = 0;
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_reduce(
        "read", Range(0, n / 16),
        KOKKOS_LAMBDA(std::int64_t i, T & s) { s += block_sum(a.data() + 16 * i); }, sum);
  });
  benchmark::DoNotOptimize(sum);
  state.counters["B/s"] = byte_rate(double(n) * sizeof(T));
}

template <class T>
void BM_write(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(T));
  Array<T> a("a", n);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "write", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { a(i) = T(i & 7); });
  });
  state.counters["B/s"] = byte_rate(double(n) * sizeof(T));
}

template <class T>
void BM_copy(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(T));
  Array<T> a("a", n), b("b", n);
  kfa_bench::fill_hash(a, 1);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "copy", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { b(i) = a(i); });
  });
  state.counters["B/s"] = byte_rate(2.0 * double(n) * sizeof(T));
}

template <class T>
void BM_triad(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(T));
  Array<T> a("a", n), b("b", n), c("c", n);
  kfa_bench::fill_hash(b, 2);
  kfa_bench::fill_hash(c, 3);
  const T s = T(0.5);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "triad", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { a(i) = b(i) + s * c(i); });
  });
  state.counters["B/s"] = byte_rate(3.0 * double(n) * sizeof(T));
}

/// One random cycle through all n slots (Sattolo's algorithm), so that a chase visits each.
std::vector<std::int64_t> random_cycle(std::int64_t n) {
  std::vector<std::int64_t> next(static_cast<std::size_t>(n));
  std::iota(next.begin(), next.end(), std::int64_t(0));
  std::mt19937_64 gen(42);
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::uniform_int_distribution<std::int64_t> pick(0, i - 1);
    std::swap(next[static_cast<std::size_t>(i)], next[static_cast<std::size_t>(pick(gen))]);
  }
  return next;
}

void BM_read_latency(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(std::int64_t));
  const std::int64_t loads = 1 << 20;
  Array<std::int64_t> next("next", n);
  {
    const auto cycle = random_cycle(n);
    auto h = Kokkos::create_mirror_view(next);
    for (std::int64_t i = 0; i < n; ++i)
      h(i) = cycle[static_cast<std::size_t>(i)];
    Kokkos::deep_copy(next, h);
  }
  Array<std::int64_t> end("end", 1);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "chase", Range(0, 1), KOKKOS_LAMBDA(std::int64_t) {
          std::int64_t p = 0;
          for (std::int64_t l = 0; l < loads; ++l)
            p = next(p);
          end(0) = p;
        });
  });
  state.counters["ns/load"] =
      benchmark::Counter(double(loads) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                   benchmark::Counter::kInvert);
}

void BM_write_latency(benchmark::State& state) {
  const std::int64_t n = state.range(0) / std::int64_t(sizeof(std::int64_t));
  const std::int64_t stores = 1 << 18;
  Array<std::int64_t> a("a", n);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "scatter", Range(0, 1), KOKKOS_LAMBDA(std::int64_t) {
          std::uint64_t x = 0x9E3779B97F4A7C15ULL;
          for (std::int64_t s = 0; s < stores; ++s) {
            x ^= x << 13;  // xorshift: addresses the prefetchers cannot follow
            x ^= x >> 7;
            x ^= x << 17;
            a(static_cast<std::int64_t>(x % static_cast<std::uint64_t>(n))) = s;
            Kokkos::memory_fence();
          }
        });
  });
  state.counters["ns/store"] =
      benchmark::Counter(double(stores) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                    benchmark::Counter::kInvert);
}

using Team = Kokkos::TeamPolicy<Exec>;
using Member = Team::member_type;

// FlashAttention-2's dQ pattern: every key-tile team adds a 64 x 64 tile into the same rows.
void BM_atomic_add(benchmark::State& state) {
  const int teams = static_cast<int>(state.range(0));
  const bool atomic = state.range(1) != 0;
  constexpr int kTile = 64 * 64;
  Array<float> dq("dq", atomic ? kTile : std::int64_t(kTile) * teams);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "dq", Team(teams, Kokkos::AUTO), KOKKOS_LAMBDA(const Member& team) {
          const std::int64_t base = atomic ? 0 : std::int64_t(team.league_rank()) * kTile;
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, kTile), [&](int e) {
            if (atomic)
              Kokkos::atomic_add(&dq(e), 1.0f);
            else
              dq(base + e) = 1.0f;
          });
        });
  });
  state.counters["B/s"] = byte_rate(double(teams) * kTile * sizeof(float));
}

// Team-scratch bandwidth: each team writes then reads a 32 KiB float tile 64 times.
void BM_scratch(benchmark::State& state) {
  const int teams = static_cast<int>(state.range(0));
  constexpr int kElems = 8192, kSweeps = 64;
  using Scratch = Kokkos::View<float*, Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  Array<float> out("out", teams);
  kfa_bench::time_iterations(state, [&] {
    Kokkos::parallel_for(
        "scratch",
        Team(teams, Kokkos::AUTO).set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(kElems))),
        KOKKOS_LAMBDA(const Member& team) {
          Scratch s(team.team_scratch(0), kElems);
          float total = 0;
          for (int sweep = 0; sweep < kSweeps; ++sweep) {
            Kokkos::parallel_for(Kokkos::TeamVectorRange(team, kElems),
                                 [&](int e) { s(e) = float(e + sweep); });
            team.team_barrier();
            float part = 0;
            Kokkos::parallel_reduce(
                Kokkos::TeamVectorRange(team, kElems / 16),
                [&](int e, float& acc) { acc += block_sum(s.data() + std::ptrdiff_t(16) * e); },
                part);
            total += part;
            team.team_barrier();
          }
          Kokkos::single(Kokkos::PerTeam(team), [&]() { out(team.league_rank()) = total; });
        });
  });
  state.counters["B/s"] = byte_rate(2.0 * teams * kSweeps * kElems * sizeof(float));
}

void sizes(benchmark::internal::Benchmark* b, std::int64_t most) {
  for (std::int64_t bytes = 4 << 10; bytes <= most; bytes *= 4)
    b->Arg(bytes);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}
void bandwidth_sizes(benchmark::internal::Benchmark* b) {
  sizes(b, std::int64_t(1) << 30);
}
void latency_sizes(benchmark::internal::Benchmark* b) {
  sizes(b, std::int64_t(256) << 20);
}

BENCHMARK_TEMPLATE(BM_read, float)->Apply(bandwidth_sizes);
BENCHMARK_TEMPLATE(BM_read, double)->Apply(bandwidth_sizes);
BENCHMARK_TEMPLATE(BM_write, float)->Apply(bandwidth_sizes);
BENCHMARK_TEMPLATE(BM_write, double)->Apply(bandwidth_sizes);
BENCHMARK_TEMPLATE(BM_copy, float)->Apply(bandwidth_sizes);
BENCHMARK_TEMPLATE(BM_triad, float)->Apply(bandwidth_sizes);
BENCHMARK(BM_read_latency)->Apply(latency_sizes);
BENCHMARK(BM_write_latency)->Apply(latency_sizes);
BENCHMARK(BM_atomic_add)
    ->ArgNames({"teams", "atomic"})
    ->ArgsProduct({{1, 16, 256}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_scratch)
    ->ArgName("teams")
    ->Arg(1)
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  return kfa_bench::run_main(argc, argv);
}
