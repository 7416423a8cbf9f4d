// The combiner family as MPI reductions (kfa/combiner_op.hpp), and the sequence-parallel
// forward and backward (kfa::mpi) at any rank count: every mode x layout
// x mask (and dropout, GQA, seqlen_q != seqlen_k, dlse, sequences shorter than the rank count)
// gives each rank its rows of the double-precision reference under the tolerance rule, and so
// does multi-scale attention (kfa::mpi::msa, float and double, dense and decay masks); the
// deterministic backward is bitwise repeatable; the score terms of kfa/masks.hpp (ALiBi, a
// bias with dbias, a boolean mask, key padding) give the reference's result with the same term,
// dbias whole and bitwise alike on every rank; invalid input on one rank makes every rank
// throw the same kfa::Error. Run by ctest under mpiexec -n 1, 2, 3, 4.
#include <gtest/gtest.h>
#include <kfa/combiner_op.hpp>
#include <kfa/distributed.hpp>
#include <kfa/welford.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../msa_mask.hpp"
#include "../problem.hpp"
#include "../terms.hpp"

namespace {

using namespace kfa_test;
namespace kmpi = kfa::mpi;
namespace ref = kfa::reference;
namespace msa = kfa_test::msa;
using ref::Mask3;

int comm_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int comm_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// This rank's rows (along dimension 2) of a global host tensor, in owned order.
template <class HostView>
HostView my_rows(const HostView& g, kmpi::Layout layout, const char* label) {
  const auto segs = kmpi::owned_rows(layout, g.extent(2), comm_rank(), comm_size());
  long long n = 0;
  for (const auto& s : segs)
    n += s.size;
  HostView out;
  if constexpr (HostView::rank == 4)
    out = HostView(std::string(label), g.extent(0), g.extent(1), n, g.extent(3));
  else
    out = HostView(std::string(label), g.extent(0), g.extent(1), n);
  long long row = 0;
  for (const auto& s : segs)
    for (long long i = 0; i < s.size; ++i, ++row)
      for (std::size_t b = 0; b < g.extent(0); ++b)
        for (std::size_t h = 0; h < g.extent(1); ++h) {
          if constexpr (HostView::rank == 4) {
            for (std::size_t d = 0; d < g.extent(3); ++d)
              out(b, h, row, d) = g(b, h, s.begin + i, d);
          } else {
            out(b, h, row) = g(b, h, s.begin + i);
          }
        }
  return out;
}

// Every value of a mode or layout enum, from the names the library gives them, so a new mode
// or layout is tested here without an edit.
template <class E>
std::vector<E> every() {
  std::vector<E> all;
  for (const auto& value_name : kfa::EnumNames<E>::values)
    all.push_back(value_name.first);
  return all;
}

struct Case {
  Shape shape;
  kfa::Params params;
};

// The forward of one case in float: every rank checks its rows against the reference.
void check_forward(const Case& c, kmpi::Mode mode, kmpi::Layout layout) {
  const Shape& s = c.shape;
  const std::uint64_t seed = seed_of(s, 91);
  SCOPED_TRACE(::testing::Message()
               << s << " " << describe(c.params) << " mode=" << kfa::name_of(mode) << " layout="
               << kfa::name_of(layout) << " ranks=" << comm_size() << " rank=" << comm_rank());
  Problem pb(s, seed);
  // The global reference, in double and in float (the rule's naive same-precision error).
  const Keep4 keep = keep_mask(s, c.params);
  Tensor4 o64("o64", s.batch, s.heads_q, s.seqlen_q, s.dv()),
      o32("o32", s.batch, s.heads_q, s.seqlen_q, s.dv());
  Tensor3 l64("l64", s.batch, s.heads_q, s.seqlen_q), l32("l32", s.batch, s.heads_q, s.seqlen_q);
  ref::forward<double>(pb.q, pb.k, pb.v, c.params, o64, l64, keep);
  ref::forward<float>(pb.q, pb.k, pb.v, c.params, o32, l32, keep);

  auto q = to_device<float>(my_rows(pb.q, layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, layout, "k"));
  auto v = to_device<float>(my_rows(pb.v, layout, "v"));
  Kokkos::View<float****, Kokkos::LayoutRight, Exec::memory_space> o("o", q.extent(0), q.extent(1),
                                                                     q.extent(2), v.extent(3));
  Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space> lse("lse", q.extent(0),
                                                                      q.extent(1), q.extent(2));
  Kokkos::deep_copy(o, std::numeric_limits<float>::quiet_NaN());
  Kokkos::deep_copy(lse, std::numeric_limits<float>::quiet_NaN());
  const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
  kmpi::forward(Exec(), q, k, v, o, lse, c.params, sp);
  const Tensor4 oh = to_host<Tensor4>(o, "oh");
  const Tensor3 lh = to_host<Tensor3>(lse, "lh");
  EXPECT_TRUE(all_written(oh));
  EXPECT_TRUE(all_written(lh));
  const auto co =
      ref::apply_rule<float>(oh, my_rows(o32, layout, "o32r"), my_rows(o64, layout, "o64r"));
  const auto cl =
      ref::apply_rule<float>(lh, my_rows(l32, layout, "l32r"), my_rows(l64, layout, "l64r"));
  EXPECT_TRUE(co.ok()) << "O err " << co.err << " > bound " << co.bound;
  EXPECT_TRUE(cl.ok()) << "LSE err " << cl.err << " > bound " << cl.bound;
}

/// The global tensor (N rows along dimension 2) that every rank's local rows make up, on every
/// rank: each places its rows into zeros and MPI sums the ranks' tensors.
Tensor4 assemble(const Tensor4& local, long long N, kmpi::Layout layout) {
  Tensor4 g("global", local.extent(0), local.extent(1), N, local.extent(3));
  long long row = 0;
  for (const auto& s : kmpi::owned_rows(layout, N, comm_rank(), comm_size()))
    for (long long i = 0; i < s.size; ++i, ++row)
      for (std::size_t b = 0; b < g.extent(0); ++b)
        for (std::size_t h = 0; h < g.extent(1); ++h)
          for (std::size_t d = 0; d < g.extent(3); ++d)
            g(b, h, s.begin + i, d) = local(b, h, row, d);
  MPI_Allreduce(MPI_IN_PLACE, g.data(), int(g.span()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return g;
}

using Dev4 = Kokkos::View<float****, Kokkos::LayoutRight, Exec::memory_space>;
using Dev3 = Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space>;

/// kfa::mpi::forward then kfa::mpi::backward on this rank's rows, in float; the gradients are
/// poisoned with NaN beforehand.
struct RankGradients {
  Tensor4 dq, dk, dv;
};
RankGradients run_backward(const Problem& pb, const kfa::Params& p, const Tensor4& dout,
                           const Tensor3& dlse, const kmpi::SeqPar& sp) {
  auto q = to_device<float>(my_rows(pb.q, sp.layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, sp.layout, "k"));
  auto v = to_device<float>(my_rows(pb.v, sp.layout, "v"));
  auto dod = to_device<float>(my_rows(dout, sp.layout, "do"));
  Dev4 o("o", q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  Dev3 lse("lse", q.extent(0), q.extent(1), q.extent(2));
  kmpi::forward(Exec(), q, k, v, o, lse, p, sp);
  Dev4 dq("dq", q.extent(0), q.extent(1), q.extent(2), q.extent(3)),
      dk("dk", k.extent(0), k.extent(1), k.extent(2), k.extent(3)),
      dv("dv", v.extent(0), v.extent(1), v.extent(2), v.extent(3));
  for (const auto& g : {dq, dk, dv})
    Kokkos::deep_copy(g, std::numeric_limits<float>::quiet_NaN());
  if (dlse.span() > 0) {
    const Tensor3 mine = my_rows(dlse, sp.layout, "dlse");
    Dev3 dl("dl", mine.extent(0), mine.extent(1), mine.extent(2));
    auto h = Kokkos::create_mirror_view(dl);
    for (std::size_t e = 0; e < h.span(); ++e)
      h.data()[e] = static_cast<float>(mine.data()[e]);
    Kokkos::deep_copy(dl, h);
    kmpi::backward(Exec(), q, k, v, o, lse, dod, dl, dq, dk, dv, p, sp);
  } else {
    kmpi::backward(Exec(), q, k, v, o, lse, dod, dq, dk, dv, p, sp);
  }
  return {to_host<Tensor4>(dq, "dqh"), to_host<Tensor4>(dk, "dkh"), to_host<Tensor4>(dv, "dvh")};
}

// The backward of one case in float: the ranks' rows of dQ, dK, dV, put together, against the
// reference gradients under the tolerance rule (checked on every rank).
void check_backward(const Case& c, kmpi::Mode mode, kmpi::Layout layout, bool with_dlse) {
  const Shape& s = c.shape;
  const std::uint64_t seed = seed_of(s, 92);
  SCOPED_TRACE(::testing::Message()
               << s << " " << describe(c.params) << (with_dlse ? " dlse" : "")
               << (c.params.deterministic ? " deterministic" : " atomic")
               << " mode=" << kfa::name_of(mode) << " layout=" << kfa::name_of(layout)
               << " ranks=" << comm_size() << " rank=" << comm_rank());
  Problem pb(s, seed);
  std::mt19937_64 gen(seed + 1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.dv(), gen);
  const Tensor3 dlse = with_dlse ? random_dlse(s, gen) : Tensor3();
  const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
  const RankGradients g = run_backward(pb, c.params, dout, dlse, sp);
  EXPECT_TRUE(all_written(g.dq) && all_written(g.dk) && all_written(g.dv));
  const Tensor4 dq = assemble(g.dq, s.seqlen_q, layout), dk = assemble(g.dk, s.seqlen_k, layout),
                dv = assemble(g.dv, s.seqlen_k, layout);
  const auto r = ref::check_backward<float>(pb.q, pb.k, pb.v, c.params, dout, dlse, dq, dk, dv,
                                            keep_mask(s, c.params));
  for (const auto& [name, cr] : {std::pair{"dQ", r.dq}, {"dK", r.dk}, {"dV", r.dv}})
    EXPECT_TRUE(cr.ok()) << name << ": err " << cr.err << " > bound " << cr.bound
                         << " (naive same-precision err " << cr.naive_err << ")";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const auto m = masks();
  // none, causal (both alignments), window both sides, softcap + causal + window
  for (int mi : {0, 1, 2, 5, 9}) {
    out.push_back({{1, 2, 1, 67, 67, 32}, m[mi]});
    out.push_back({{2, 2, 2, 50, 83, 16}, m[mi]});
  }
  kfa::Params drop = m[1];
  drop.dropout = 0.3;
  drop.seed = 5;
  drop.offset = 2;
  out.push_back({{1, 2, 2, 70, 70, 32}, drop});
  out.push_back({{1, 1, 1, 3, 3, 16}, m[1]});  // fewer rows than some rank counts need
  out.push_back({{1, 1, 1, 1, 5, 16}, m[0]});  // one query: most ranks own no query
  // v with a head dim of its own: the exchanged K/V shards and dK/dV accumulators (ring), the
  // gathered dO rows and the partials' O (tree) carry Dv columns.
  out.push_back({{1, 2, 1, 53, 61, 32, 16}, m[1]});
  out.push_back({{2, 2, 2, 40, 40, 16, 40}, m[5]});
  return out;
}

// ---- The combiner family across ranks (kfa/combiner_op.hpp) ---------------------------------

/// Rows of values split across the ranks, some ranks holding none: every rank generates the
/// whole row (the same generator) and merges only its share, so the merged partials can be
/// checked against a two-pass computation over the whole row in long double.
struct ShardedRows {
  static constexpr int rows = 4, width = 2;  // width: the values each element carries (y, v)
  std::vector<std::vector<double>> x, y;     // x[row][k]; y[row][k * width + w]
  int begin = 0, end = 0;                    // this rank's elements [begin, end)
  ShardedRows() {
    const int P = comm_size(), r = comm_rank();
    std::vector<int> share(P);
    for (int q = 0; q < P; ++q)
      share[q] = q % 3 == 1 ? 0 : 5 + 3 * q;  // rank 1 (and 4, ...) holds nothing
    int total = 0;
    for (int q = 0; q < P; ++q) {
      if (q == r) begin = total;
      total += share[q];
    }
    end = begin + share[r];
    std::mt19937_64 gen(7);
    std::normal_distribution<double> dist(0.0, 1.0);
    x.assign(rows, std::vector<double>(total));
    y.assign(rows, std::vector<double>(std::size_t(total) * width));
    for (int i = 0; i < rows; ++i) {
      for (double& v : x[i])
        v = 1e3 + 3.0 * dist(gen) + 2.0 * i;  // a large mean: naive moments would cancel
      for (double& v : y[i])
        v = dist(gen);
    }
  }
};

TEST(CombinerOp, EveryMemberMergesShardsAsTheWholeRow) {
  const ShardedRows d;
  using Welford = kfa::combiners::Welford<double>;
  using Softmax = kfa::combiners::Softmax<double, ShardedRows::width>;
  using LogSoftmax = kfa::combiners::LogSoftmax<double, ShardedRows::width>;
  std::vector<Welford::state_type> mom(ShardedRows::rows, Welford::identity());
  std::vector<Softmax::state_type> soft(ShardedRows::rows, Softmax::identity());
  std::vector<LogSoftmax::state_type> logs(ShardedRows::rows, LogSoftmax::identity());
  for (int i = 0; i < ShardedRows::rows; ++i)
    for (int k = d.begin; k < d.end; ++k) {
      const double xs = d.x[i][k] - 1e3;  // scores of moderate size for the softmax members
      const double* yk = &d.y[i][std::size_t(k) * ShardedRows::width];
      kfa::push(mom[i], d.x[i][k]);
      Softmax::state_type one;
      one.s = {xs, 1.0};
      for (int w = 0; w < ShardedRows::width; ++w)
        one.o[w] = yk[w];
      Softmax::join(soft[i], one);
      LogSoftmax::join(logs[i], LogSoftmax::single(xs, yk));
    }
  kfa::mpi::allreduce<Welford>(mom.data(), ShardedRows::rows, MPI_COMM_WORLD);
  kfa::mpi::allreduce<Softmax>(soft.data(), ShardedRows::rows, MPI_COMM_WORLD);
  kfa::mpi::allreduce<LogSoftmax>(logs.data(), ShardedRows::rows, MPI_COMM_WORLD);

  for (int i = 0; i < ShardedRows::rows; ++i) {
    const auto& x = d.x[i];
    const std::size_t n = x.size();
    long double mean = 0, m2 = 0, mx = -1e300L, z = 0;
    for (double v : x)
      mean += v;
    mean /= n;
    for (double v : x) {
      m2 += (v - mean) * (v - mean);
      mx = std::max<long double>(mx, v - 1e3);
    }
    for (double v : x)
      z += std::exp(static_cast<long double>(v - 1e3) - mx);
    const long double lse = mx + std::log(z);
    EXPECT_EQ(mom[i].n, double(n));
    EXPECT_NEAR(mom[i].mean, double(mean), 1e-12 * std::fabs(double(mean)));
    EXPECT_NEAR(mom[i].m2, double(m2), 1e-10 * double(m2));
    EXPECT_NEAR(soft[i].s.m + std::log(soft[i].s.l), double(lse), 1e-12);
    EXPECT_NEAR(LogSoftmax::lse(logs[i]), double(lse), 1e-12);
    for (int w = 0; w < ShardedRows::width; ++w) {
      long double out = 0, ll = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const long double yk = d.y[i][k * ShardedRows::width + w];
        out += std::exp(static_cast<long double>(x[k] - 1e3) - lse) * yk;
        ll += (static_cast<long double>(x[k] - 1e3) - lse) * yk;
      }
      EXPECT_NEAR(soft[i].o[w] / soft[i].s.l, double(out), 1e-12);
      EXPECT_NEAR(logs[i].o[w], double(ll), 1e-10 * std::max(1.0, std::fabs(double(ll))));
    }
  }
  // Rank order: the same bytes on every rank.
  std::vector<char> mine(reinterpret_cast<const char*>(mom.data()),
                         reinterpret_cast<const char*>(mom.data() + mom.size()));
  std::vector<char> first = mine;
  MPI_Bcast(first.data(), int(first.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(mine, first);
}

TEST(SeqPar, ForwardEveryModeAndLayoutMatchesReference) {
  for (const Case& c : cases())
    for (auto mode : every<kmpi::Mode>())
      for (auto layout : every<kmpi::Layout>())
        check_forward(c, mode, layout);
}

TEST(SeqPar, BackwardEveryModeAndLayoutMatchesReference) {
  const std::vector<Case> all = cases();
  for (std::size_t i = 0; i < all.size(); ++i)
    for (bool deterministic : {false, true})  // both dQ paths, every case
      for (auto mode : every<kmpi::Mode>())
        for (auto layout : every<kmpi::Layout>()) {
          Case c = all[i];
          c.params.deterministic = deterministic;
          check_backward(c, mode, layout, /*with_dlse=*/(i + deterministic) % 2 == 0);
        }
}

// kfa::mpi takes its buffers from the workspace pool (kfa::impl::Temporary), whose contents
// are undefined until written. A forward and a backward on NaN inputs, of a shape larger than
// the cases after them, leave the pool's buffers full of NaN; the cases then run on those
// buffers, so a buffer read before it is written would carry NaN into their results.
TEST(SeqPar, ResultsDoNotDependOnWhatThePoolHeld) {
  const auto m = masks();
  const std::vector<Case> after = {{{1, 2, 1, 67, 67, 32}, m[1]},
                                   {{2, 2, 2, 40, 40, 16, 40}, m[5]}};
  const Shape big{2, 2, 2, 96, 96, 40};
  const auto poison = [&](kmpi::Mode mode, kmpi::Layout layout) {
    Problem pb(big, seed_of(big, 93));
    Tensor4 dout("dout", big.batch, big.heads_q, big.seqlen_q, big.dv());
    for (Tensor4* t : {&pb.q, &pb.k, &pb.v, &dout})
      for (std::size_t e = 0; e < t->span(); ++e)
        t->data()[e] = std::numeric_limits<double>::quiet_NaN();
    const kmpi::SeqPar sp{MPI_COMM_WORLD, big.seqlen_q, big.seqlen_k, layout, mode};
    run_backward(pb, kfa::Params{}, dout, Tensor3(), sp);  // a forward, then a backward
  };
  for (auto mode : every<kmpi::Mode>())
    for (auto layout : every<kmpi::Layout>())
      for (const Case& c : after) {
        poison(mode, layout);
        check_forward(c, mode, layout);
        poison(mode, layout);
        check_backward(c, mode, layout, /*with_dlse=*/false);
      }
}

// Deterministic: two runs give the same bits, in both modes (sums across ranks in rank order).
TEST(SeqPar, DeterministicBackwardIsBitwiseRepeatable) {
  const Shape s{1, 4, 2, 97, 97, 32};
  Problem pb(s, 17);
  std::mt19937_64 gen(18);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  kfa::Params p;
  p.causal = true;
  p.deterministic = true;
  for (auto mode : every<kmpi::Mode>()) {
    const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, kmpi::Layout::zigzag, mode};
    const RankGradients a = run_backward(pb, p, dout, {}, sp),
                        b = run_backward(pb, p, dout, {}, sp);
    for (const auto& [x, y] : {std::pair{a.dq, b.dq}, {a.dk, b.dk}, {a.dv, b.dv}})
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.span() * sizeof(double)))
          << "mode " << kfa::name_of(mode);
  }
}

TEST(SeqPar, OwnedRowsCoverTheSequenceOnce) {
  for (int P : {1, 2, 3, 4, 7})
    for (long long N : {0LL, 1LL, 3LL, 10LL, 1001LL})
      for (auto layout : every<kmpi::Layout>()) {
        std::vector<int> hits(N, 0);
        for (int r = 0; r < P; ++r) {
          long long end = 0;  // each rank's rows ascend (row-slab I/O relies on it)
          for (const auto& s : kmpi::owned_rows(layout, N, r, P)) {
            EXPECT_GE(s.begin, end) << "P=" << P << " N=" << N << " rank " << r;
            end = s.begin + s.size;
            for (long long i = s.begin; i < s.begin + s.size; ++i)
              ++hits[i];
          }
        }
        for (long long i = 0; i < N; ++i)
          EXPECT_EQ(hits[i], 1) << "P=" << P << " N=" << N << " row " << i;
      }
}

// Invalid input on one rank only: every rank throws the same error (no rank waits forever).
TEST(SeqPar, BadInputOnOneRankEndsEveryRank) {
  const int P = comm_size(), last = P - 1;
  const Shape s{1, 2, 2, 40, 40, 16};
  Problem pb(s, 3);
  const auto layout = kmpi::Layout::contiguous;
  auto expect_all_throw = [&](const kfa::Params& p, bool bad_rows, const std::string& want) {
    auto q = to_device<float>(my_rows(pb.q, layout, "q"));
    auto k = to_device<float>(my_rows(pb.k, layout, "k"));
    auto v = to_device<float>(my_rows(pb.v, layout, "v"));
    if (bad_rows && comm_rank() == last)  // one row too many on the last rank
      q = to_device<float>(Tensor4("q", 1, 2, q.extent(2) + 1, 16));
    Kokkos::View<float****, Kokkos::LayoutRight, Exec::memory_space> o(
        "o", q.extent(0), q.extent(1), q.extent(2), 16);
    Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space> lse("lse", q.extent(0),
                                                                        q.extent(1), q.extent(2));
    for (auto mode : every<kmpi::Mode>()) {
      const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
      std::string got;
      try {
        kmpi::forward(Exec(), q, k, v, o, lse, p, sp);
      } catch (const kfa::Error& e) {
        got = e.what();
      }
      EXPECT_NE(got.find(want), std::string::npos) << "rank " << comm_rank() << ": '" << got << "'";
      // The same message on every rank.
      int len = static_cast<int>(got.size()), lo = 0, hi = 0;
      MPI_Allreduce(&len, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(&len, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      EXPECT_EQ(lo, hi);
    }
  };
  expect_all_throw({}, true, "rank " + std::to_string(last) + ": mpi::forward: q has seqlen");
  kfa::Params bad;
  bad.dropout = comm_rank() == last ? 1.5 : 0.0;
  expect_all_throw(bad, false, "dropout must be in [0, 1)");
  if (P > 1) {
    kfa::Params differ;
    differ.causal = comm_rank() == 0;
    expect_all_throw(differ, false, "params.causal differs between ranks");
  }
  // The backward: dk one row short on the last rank.
  auto q = to_device<float>(my_rows(pb.q, layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, layout, "k"));
  Dev4 o("o", q.extent(0), q.extent(1), q.extent(2), 16), dq("dq", q.extent(0), 2, q.extent(2), 16);
  Dev3 lse("lse", q.extent(0), q.extent(1), q.extent(2));
  const std::size_t nk = k.extent(2) - (comm_rank() == last && k.extent(2) > 0 ? 1 : 0);
  Dev4 dk("dk", 1, 2, nk, 16), dv("dv", 1, 2, k.extent(2), 16);
  for (auto mode : every<kmpi::Mode>()) {
    const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
    std::string got;
    try {
      kmpi::backward(Exec(), q, k, k, o, lse, q, dq, dk, dv, kfa::Params{}, sp);
    } catch (const kfa::Error& e) {
      got = e.what();
    }
    EXPECT_NE(got.find("rank " + std::to_string(last) + ": mpi::backward: dk"), std::string::npos)
        << "rank " << comm_rank() << ": '" << got << "'";
  }
}

// What every rank must pass alike is compared exactly across ranks: each rank throws the same
// kfa::Error naming every field that differs, with the values printed exactly (enums by name).
TEST(SeqPar, ValuesThatDifferBetweenRanksAreNamedExactly) {
  const int P = comm_size(), rank = comm_rank(), last = P - 1;
  if (P == 1) GTEST_SKIP() << "needs two ranks";
  const Shape s{1, 2, 2, 40, 40, 16};
  Problem pb(s, 5);
  const kmpi::SeqPar base{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, kmpi::Layout::contiguous,
                          kmpi::Mode::ring};
  // The message of the error the forward threw on this rank, in value type T ("" for none).
  auto forward_error = [&](auto zero, const kfa::Params& p, const kmpi::SeqPar& sp) {
    using T = decltype(zero);
    auto q = to_device<T>(my_rows(pb.q, sp.layout, "q"));
    auto k = to_device<T>(my_rows(pb.k, sp.layout, "k"));
    auto v = to_device<T>(my_rows(pb.v, sp.layout, "v"));
    Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space> o("o", q.extent(0), q.extent(1),
                                                                   q.extent(2), q.extent(3));
    Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space> lse("lse", q.extent(0), q.extent(1),
                                                                    q.extent(2));
    try {
      kmpi::forward(Exec(), q, k, v, o, lse, p, sp);
    } catch (const kfa::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto expect_everywhere = [&](const std::string& got, const std::string& want) {
    EXPECT_EQ(got, "kfa: mpi::forward: " + want);
    std::string first = got;  // rank 0's message, on every rank
    int len = static_cast<int>(first.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    first.resize(static_cast<std::size_t>(len));
    MPI_Bcast(first.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
    EXPECT_EQ(got, first);
  };
  const bool odd = rank == last;  // the one rank that passes another value
  {
    kfa::Params p;
    p.align = odd ? kfa::Align::top_left : kfa::Align::bottom_right;
    expect_everywhere(forward_error(0.0f, p, base),
                      "params.align differs between ranks (bottom-right vs top-left)");
  }
  {
    kmpi::SeqPar sp = base;
    sp.mode = odd ? kmpi::Mode::tree : kmpi::Mode::ring;
    expect_everywhere(forward_error(0.0f, {}, sp),
                      "SeqPar::mode differs between ranks (ring vs tree)");
  }
  {
    // 64-bit integers whole, doubles to the last bit, several fields in one message.
    kfa::Params p;
    p.seed = 0xfffffffffffffffeULL + (odd ? 1 : 0);
    p.scale = odd ? std::nextafter(0.1, 1.0) : 0.1;
    p.num_splits = odd ? 2 : 0;
    expect_everywhere(forward_error(0.0f, p, base),
                      "params.scale differs between ranks (0.1 vs 0.10000000000000002); "
                      "params.seed differs between ranks (18446744073709551614 vs "
                      "18446744073709551615); params.num_splits differs between ranks (0 vs 2)");
  }
  {
    // Each rank passes the rows its own layout gives it, so only the comparison can tell.
    kmpi::SeqPar sp = base;
    sp.layout = odd ? kmpi::Layout::zigzag : kmpi::Layout::contiguous;
    const std::string got = odd ? forward_error(0.0, {}, sp) : forward_error(0.0f, {}, sp);
    expect_everywhere(got,
                      "SeqPar::layout differs between ranks (contiguous vs zigzag); the "
                      "value type differs between ranks (float vs double)");
  }
  // The forward reads no params.deterministic: ranks may differ there.
  kfa::Params p;
  p.deterministic = odd;
  EXPECT_EQ(forward_error(0.0f, p, base), "");
}

// One rank calls the forward while the others call the backward: the pass is compared first,
// so every rank throws instead of the backward ranks waiting for messages that never come.
TEST(SeqPar, DifferentPassesOnDifferentRanksEndEveryRank) {
  const int P = comm_size(), rank = comm_rank();
  if (P == 1) GTEST_SKIP() << "needs two ranks";
  const Shape s{1, 2, 2, 40, 40, 16};
  Problem pb(s, 6);
  const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, kmpi::Layout::contiguous,
                        kmpi::Mode::ring};
  auto q = to_device<float>(my_rows(pb.q, sp.layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, sp.layout, "k"));
  auto v = to_device<float>(my_rows(pb.v, sp.layout, "v"));
  Dev4 o("o", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  Dev3 lse("lse", q.extent(0), q.extent(1), q.extent(2));
  kmpi::forward(Exec(), q, k, v, o, lse, kfa::Params{}, sp);
  Dev4 dq("dq", q.extent(0), q.extent(1), q.extent(2), q.extent(3)),
      dk("dk", k.extent(0), k.extent(1), k.extent(2), k.extent(3)),
      dv("dv", k.extent(0), k.extent(1), k.extent(2), k.extent(3));
  std::string got;
  try {
    if (rank == P - 1)
      kmpi::forward(Exec(), q, k, v, o, lse, kfa::Params{}, sp);
    else
      kmpi::backward(Exec(), q, k, v, o, lse, o, dq, dk, dv, kfa::Params{}, sp);
  } catch (const kmpi::CollectiveError& e) {
    got = e.what();
  }
  EXPECT_NE(got.find("the pass differs between ranks (forward vs backward)"), std::string::npos)
      << got;
}

// Multi-scale attention (kfa::mpi::msa): the cases of the multi-scale suite's kinds, small.
std::vector<msa::Case> msa_cases() {
  using msa::MaskKind;
  std::vector<msa::Case> out;
  kfa::msa::Params causal;
  causal.causal = true;
  kfa::msa::Params top_left = causal;
  top_left.align = kfa::Align::top_left;
  kfa::msa::Params window;
  window.window_left = 9;
  window.window_right = 4;
  window.scale = 0.3;
  // Dense over both regimes of the clamp, GQA 4:2, seqlen_q != seqlen_k, two zero mask rows.
  out.push_back({{1, 4, 2, 45, 61, 16}, {}, MaskKind::dense, {}, 2});
  // Decay masks with gamma 0.5, 0.9, 0.99 and causal.
  out.push_back({{1, 3, 3, 53, 53, 24}, causal, MaskKind::decay, {0.5, 0.9, 0.99}});
  // No mask (M = 1) with a window, GQA 4:1.
  out.push_back({{2, 4, 1, 37, 37, 16}, window, MaskKind::none});
  // Dense with top-left causal, seqlen_q > seqlen_k, and one query (most ranks own none).
  out.push_back({{1, 2, 1, 41, 29, 16}, top_left, MaskKind::dense});
  out.push_back({{1, 2, 2, 1, 5, 16}, {}, MaskKind::dense});
  return out;
}

template <class T>
using DevT4 = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;
template <class T>
using DevT3 = Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>;

/// kfa::mpi::msa::forward on this rank's rows in T, the whole mask (or none) on every rank;
/// outputs poisoned with NaN beforehand.
template <class T>
struct MsaRank {
  DevT4<T> q, k, v, o;
  DevT3<T> rsum;
  msa::Mask3Dev<T> mask;
  bool has_mask;
};
template <class T>
MsaRank<T> msa_forward_rank(const Problem& pb, const Mask3& mask, const kfa::msa::Params& p,
                            const kmpi::SeqPar& sp) {
  MsaRank<T> r{to_device<T>(my_rows(pb.q, sp.layout, "q")),
               to_device<T>(my_rows(pb.k, sp.layout, "k")),
               to_device<T>(my_rows(pb.v, sp.layout, "v")),
               {},
               {},
               mask.span() > 0 ? msa::mask_to_device<T>(mask) : msa::Mask3Dev<T>(),
               mask.span() > 0};
  r.o = DevT4<T>("o", r.q.extent(0), r.q.extent(1), r.q.extent(2), r.q.extent(3));
  r.rsum = DevT3<T>("rsum", r.q.extent(0), r.q.extent(1), r.q.extent(2));
  Kokkos::deep_copy(r.o, std::numeric_limits<T>::quiet_NaN());
  Kokkos::deep_copy(r.rsum, std::numeric_limits<T>::quiet_NaN());
  if (r.has_mask)
    kmpi::msa::forward(Exec(), r.q, r.k, r.v, r.mask, r.o, r.rsum, p, sp);
  else
    kmpi::msa::forward(Exec(), r.q, r.k, r.v, r.o, r.rsum, p, sp);
  return r;
}

// The multi-scale forward and backward of one case in T, every rank against the reference's
// rows (float: the tolerance rule; double: 1e-12 relative). The dense masks must put at least
// 20 % of the rows on each side of the clamp.
template <class T>
void check_msa(const msa::Case& c, kmpi::Mode mode, kmpi::Layout layout, bool deterministic) {
  const Shape& s = c.shape;
  const std::uint64_t seed = seed_of(s, 93);
  kfa::msa::Params p = c.p;
  p.deterministic = deterministic;
  SCOPED_TRACE(::testing::Message()
               << s << " " << msa::describe(c) << (deterministic ? " deterministic" : " atomic")
               << " mode=" << kfa::name_of(mode) << " layout=" << kfa::name_of(layout)
               << " ranks=" << comm_size() << " rank=" << comm_rank() << " "
               << (std::is_same_v<T, float> ? "float" : "double"));
  Problem pb(s, seed);
  const Mask3 mask = msa::make_mask<T>(c, pb, seed);
  const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
  const MsaRank<T> r = msa_forward_rank<T>(pb, mask, p, sp);
  const Tensor4 oh = to_host<Tensor4>(r.o, "oh");
  const Tensor3 rh = to_host<Tensor3>(r.rsum, "rh");
  EXPECT_TRUE(all_written(oh) && all_written(rh));
  // The reference forward, cut to this rank's rows.
  Tensor4 o64("o64", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
      oT("oT", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  Tensor3 r64("r64", s.batch, s.heads_q, s.seqlen_q), rT("rT", s.batch, s.heads_q, s.seqlen_q);
  ref::msa_forward<double>(pb.q, pb.k, pb.v, mask, p, o64, r64);
  ref::msa_forward<T>(pb.q, pb.k, pb.v, mask, p, oT, rT);
  const auto co = ref::apply_rule<T>(oh, my_rows(oT, layout, "oTr"), my_rows(o64, layout, "o64r"));
  const auto cr = ref::apply_rule<T>(rh, my_rows(rT, layout, "rTr"), my_rows(r64, layout, "r64r"));
  EXPECT_TRUE(co.ok()) << "O err " << co.err << " > bound " << co.bound;
  EXPECT_TRUE(cr.ok()) << "rsum err " << cr.err << " > bound " << cr.bound;
  if (c.kind == msa::MaskKind::dense && s.seqlen_q >= 10) {
    std::size_t below = 0;
    for (std::size_t e = 0; e < r64.span(); ++e)
      below += r64.data()[e] < 1 ? 1 : 0;
    EXPECT_GE(below, r64.span() / 5) << "rows with r < 1";
    EXPECT_GE(r64.span() - below, r64.span() / 5) << "rows with r > 1";
  }
  // The backward from the forward's rows.
  std::mt19937_64 gen(seed + 1);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  const auto dod = to_device<T>(my_rows(dout, layout, "do"));
  DevT4<T> dq("dq", r.q.extent(0), r.q.extent(1), r.q.extent(2), r.q.extent(3)),
      dk("dk", r.k.extent(0), r.k.extent(1), r.k.extent(2), r.k.extent(3)),
      dv("dv", r.k.extent(0), r.k.extent(1), r.k.extent(2), r.k.extent(3));
  for (const auto& g : {dq, dk, dv})
    Kokkos::deep_copy(g, std::numeric_limits<T>::quiet_NaN());
  if (r.has_mask)
    kmpi::msa::backward(Exec(), r.q, r.k, r.v, r.mask, r.o, r.rsum, dod, dq, dk, dv, p, sp);
  else
    kmpi::msa::backward(Exec(), r.q, r.k, r.v, r.o, r.rsum, dod, dq, dk, dv, p, sp);
  const Tensor4 dqh = to_host<Tensor4>(dq, "dqh"), dkh = to_host<Tensor4>(dk, "dkh"),
                dvh = to_host<Tensor4>(dv, "dvh");
  EXPECT_TRUE(all_written(dqh) && all_written(dkh) && all_written(dvh));
  const auto g = ref::msa_check_backward<T>(
      pb.q, pb.k, pb.v, mask, p, dout, assemble(dqh, s.seqlen_q, layout),
      assemble(dkh, s.seqlen_k, layout), assemble(dvh, s.seqlen_k, layout));
  for (const auto& [name, cg] : {std::pair{"dQ", g.dq}, {"dK", g.dk}, {"dV", g.dv}})
    EXPECT_TRUE(cg.ok()) << name << ": err " << cg.err << " > bound " << cg.bound
                         << " (naive same-precision err " << cg.naive_err << ")";
}

TEST(SeqPar, MultiScaleEveryModeAndLayoutMatchesReference) {
  const std::vector<msa::Case> all = msa_cases();
  for (std::size_t i = 0; i < all.size(); ++i)
    for (bool deterministic : {false, true})
      for (auto mode : every<kmpi::Mode>())
        for (auto layout : every<kmpi::Layout>()) {
          check_msa<double>(all[i], mode, layout, deterministic);
          check_msa<float>(all[i], mode, layout, deterministic);
        }
}

// A mask that is not the whole (heads_q, seqlen_q, seqlen_k) on one rank (say, its own rows
// only): every rank throws the same error naming both shapes.
TEST(SeqPar, MultiScaleMaskNotWholeEndsEveryRank) {
  const int last = comm_size() - 1;
  const Shape s{1, 2, 2, 40, 40, 16};
  Problem pb(s, 7);
  const auto layout = kmpi::Layout::zigzag;
  auto q = to_device<float>(my_rows(pb.q, layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, layout, "k"));
  Dev4 o("o", q.extent(0), q.extent(1), q.extent(2), 16);
  Dev3 rsum("rsum", q.extent(0), q.extent(1), q.extent(2));
  // The last rank's own rows: fewer than 40 when there are several ranks.
  const long long own = static_cast<long long>(kmpi::owned_count(layout, 40, last, comm_size()));
  const long long rows = comm_rank() == last ? own : 40;
  msa::Mask3Dev<float> mask("mask", 2, rows, 40);
  for (auto mode : every<kmpi::Mode>()) {
    const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
    std::string got;
    try {
      kmpi::msa::forward(Exec(), q, k, k, mask, o, rsum, kfa::msa::Params{}, sp);
    } catch (const kmpi::CollectiveError& e) {
      got = e.what();
    }
    if (own == 40) {  // one rank: its rows are the whole mask
      EXPECT_EQ(got, "");
    } else {
      const std::string want = "rank " + std::to_string(last) + ": mpi::msa::forward: mask has " +
                               "shape (2, " + std::to_string(own) + ", 40) but must be the " +
                               "whole (heads_q, seqlen_q, seqlen_k) = (2, 40, 40)";
      EXPECT_NE(got.find(want), std::string::npos) << "rank " << comm_rank() << ": '" << got << "'";
    }
  }
}

// ---- Score terms (kfa/masks.hpp) ---------------------------------------------------------

/// Whether x holds the same bytes on every rank (rank 0's, broadcast).
bool same_on_every_rank(const Tensor4& x) {
  std::vector<double> first(x.data(), x.data() + x.span());
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(first.data(), x.data(), x.span() * sizeof(double)) == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

// The forward and backward of one case with a term of `kind` in T, the whole term on every
// rank: each rank's rows of O and LSE against the reference's rows with the same term, the
// assembled gradients against its gradients (float: the tolerance rule; double: 1e-12
// relative), and with a bias, dbias, whole on every rank, against the reference's and the
// same bits on every rank.
template <class T>
void check_term(const Shape& s, kfa::Params p, Kind kind, kmpi::Mode mode, kmpi::Layout layout,
                bool with_dlse) {
  const std::uint64_t seed = seed_of(s, 94 + static_cast<int>(kind));
  SCOPED_TRACE(::testing::Message()
               << s << " " << describe(p) << " " << name_of(kind)
               << (p.deterministic ? " deterministic" : " atomic") << (with_dlse ? " dlse" : "")
               << " mode=" << kfa::name_of(mode) << " layout=" << kfa::name_of(layout)
               << " ranks=" << comm_size() << " rank=" << comm_rank() << " "
               << (std::is_same_v<T, float> ? "float" : "double"));
  Problem pb(s, seed);
  pb.rounded<T>();
  std::mt19937_64 gen(seed + 1);
  const kfa::reference::Terms t = make_terms<T>(s, kind, gen);
  const Tensor4 dout = random_tensor("dout", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  const Tensor3 dlse = with_dlse ? random_dlse(s, gen) : Tensor3();
  const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
  const Keep4 keep = keep_mask(s, p);

  auto q = to_device<T>(my_rows(pb.q, layout, "q"));
  auto k = to_device<T>(my_rows(pb.k, layout, "k"));
  auto v = to_device<T>(my_rows(pb.v, layout, "v"));
  DevT4<T> o("o", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
  DevT3<T> lse("lse", q.extent(0), q.extent(1), q.extent(2));
  Kokkos::deep_copy(o, std::numeric_limits<T>::quiet_NaN());
  Kokkos::deep_copy(lse, std::numeric_limits<T>::quiet_NaN());
  with_term<T>(t, {},
               [&](const auto& term) { kmpi::forward(Exec(), q, k, v, o, lse, p, sp, term); });
  const Tensor4 oh = to_host<Tensor4>(o, "oh");
  const Tensor3 lh = to_host<Tensor3>(lse, "lh");
  EXPECT_TRUE(all_written(oh) && all_written(lh));
  Tensor4 o64("o64", s.batch, s.heads_q, s.seqlen_q, s.head_dim),
      oT("oT", s.batch, s.heads_q, s.seqlen_q, s.head_dim);
  Tensor3 l64("l64", s.batch, s.heads_q, s.seqlen_q), lT("lT", s.batch, s.heads_q, s.seqlen_q);
  ref::forward<double>(pb.q, pb.k, pb.v, p, o64, l64, keep, t);
  ref::forward<T>(pb.q, pb.k, pb.v, p, oT, lT, keep, t);
  const auto co = ref::apply_rule<T>(oh, my_rows(oT, layout, "oTr"), my_rows(o64, layout, "o64r"));
  const auto cl = ref::apply_rule<T>(lh, my_rows(lT, layout, "lTr"), my_rows(l64, layout, "l64r"));
  EXPECT_TRUE(co.ok()) << "O err " << co.err << " > bound " << co.bound;
  EXPECT_TRUE(cl.ok()) << "LSE err " << cl.err << " > bound " << cl.bound;

  const auto dod = to_device<T>(my_rows(dout, layout, "do"));
  DevT4<T> dq("dq", q.extent(0), q.extent(1), q.extent(2), q.extent(3)),
      dk("dk", k.extent(0), k.extent(1), k.extent(2), k.extent(3)),
      dv("dv", k.extent(0), k.extent(1), k.extent(2), k.extent(3));
  for (const auto& g : {dq, dk, dv})
    Kokkos::deep_copy(g, std::numeric_limits<T>::quiet_NaN());
  View4<term_t<T>> db;
  if (t.bias.span() > 0) {
    db = View4<term_t<T>>("dbias", t.bias.extent(0), t.bias.extent(1), t.bias.extent(2),
                          t.bias.extent(3));
    Kokkos::deep_copy(db, std::numeric_limits<term_t<T>>::quiet_NaN());
  }
  with_term<T>(t, db, [&](const auto& term) {
    if (with_dlse) {
      const Tensor3 mine = my_rows(dlse, layout, "dlse");
      DevT3<T> dl("dl", mine.extent(0), mine.extent(1), mine.extent(2));
      auto h = Kokkos::create_mirror_view(dl);
      for (std::size_t e = 0; e < h.span(); ++e)
        h.data()[e] = static_cast<T>(mine.data()[e]);
      Kokkos::deep_copy(dl, h);
      kmpi::backward(Exec(), q, k, v, o, lse, dod, dl, dq, dk, dv, p, sp, term);
    } else {
      kmpi::backward(Exec(), q, k, v, o, lse, dod, dq, dk, dv, p, sp, term);
    }
  });
  const Tensor4 dqh = to_host<Tensor4>(dq, "dqh"), dkh = to_host<Tensor4>(dk, "dkh"),
                dvh = to_host<Tensor4>(dv, "dvh");
  EXPECT_TRUE(all_written(dqh) && all_written(dkh) && all_written(dvh));
  const auto g = ref::check_backward<T>(
      pb.q, pb.k, pb.v, p, dout, dlse, assemble(dqh, s.seqlen_q, layout),
      assemble(dkh, s.seqlen_k, layout), assemble(dvh, s.seqlen_k, layout), keep, t);
  for (const auto& [name, cg] : {std::pair{"dQ", g.dq}, {"dK", g.dk}, {"dV", g.dv}})
    EXPECT_TRUE(cg.ok()) << name << ": err " << cg.err << " > bound " << cg.bound
                         << " (naive same-precision err " << cg.naive_err << ")";
  if (db.span() > 0) {
    const Tensor4 dbh = to_host<Tensor4>(db, "dbh");
    EXPECT_TRUE(all_written(dbh));
    const auto cd = ref::check_dbias<T>(pb.q, pb.k, pb.v, p, dout, dlse, dbh, keep, t);
    EXPECT_TRUE(cd.ok()) << "dbias: err " << cd.err << " > bound " << cd.bound;
    EXPECT_TRUE(same_on_every_rank(dbh)) << "dbias differs between ranks";
  }
}

// Each kind of term, with no mask, causal (bottom_right: seqlen_q > seqlen_k leaves the first
// rows with no key) and a window with softcap, in every mode and layout, in float or double
// and either dQ path by turns. The boolean mask hides whole rows; the key lengths include 0 and 1
// (batch 4).
TEST(SeqPar, ScoreTermsEveryModeAndLayoutMatchReference) {
  const auto m = masks();
  const std::vector<std::pair<Kind, Shape>> kinds = {
      {Kind::alibi, {2, 2, 1, 41, 33, 16}},    {Kind::bias, {2, 2, 2, 33, 41, 16}},
      {Kind::bias_1h, {2, 2, 1, 41, 33, 16}},  {Kind::dense, {2, 2, 2, 33, 41, 16}},
      {Kind::dense_11, {1, 2, 1, 41, 41, 16}}, {Kind::keypad, {4, 2, 2, 29, 37, 16}}};
  int n = 0;
  for (const auto& [kind, shape] : kinds)
    for (int mi : {0, 1, 9})
      for (auto mode : every<kmpi::Mode>())
        for (auto layout : every<kmpi::Layout>()) {
          kfa::Params p = m[mi];
          ++n;  // each kind meets both types, both dQ paths and dlse over its cases
          p.deterministic = n / 2 % 2 == 1;
          if (n % 2 == 0)
            check_term<float>(shape, p, kind, mode, layout, n % 3 == 0);
          else
            check_term<double>(shape, p, kind, mode, layout, n % 3 == 0);
        }
}

// A term on some ranks and not on others, or of other extents, or dbias on one rank only:
// every rank throws the same kfa::Error naming what differs, before any message that could
// wait for a rank that is not coming.
TEST(SeqPar, ScoreTermOnOneRankEndsEveryRank) {
  const int P = comm_size(), last = P - 1;
  if (P == 1) GTEST_SKIP() << "needs two ranks";
  const Shape s{2, 2, 2, 24, 24, 16};
  Problem pb(s, 8);
  std::mt19937_64 gen(3);
  const auto layout = kmpi::Layout::zigzag;
  auto q = to_device<float>(my_rows(pb.q, layout, "q"));
  auto k = to_device<float>(my_rows(pb.k, layout, "k"));
  Dev4 o("o", q.extent(0), q.extent(1), q.extent(2), 16), dq("dq", 2, 2, q.extent(2), 16),
      dk("dk", 2, 2, k.extent(2), 16), dv("dv", 2, 2, k.extent(2), 16);
  Dev3 lse("lse", q.extent(0), q.extent(1), q.extent(2));
  const bool odd = comm_rank() == last;
  const kfa::reference::Terms alibi = make_terms<float>(s, Kind::alibi, gen),
                              bias = make_terms<float>(s, odd ? Kind::bias_1h : Kind::bias, gen);
  View4<float> db("db", 1, 2, 24, 24);  // shaped like the last rank's bias
  auto expect_everywhere = [&](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << "rank " << comm_rank() << ": '" << got << "'";
    int len = static_cast<int>(got.size()), lo = 0, hi = 0;
    MPI_Allreduce(&len, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&len, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
  };
  for (auto mode : every<kmpi::Mode>()) {
    const kmpi::SeqPar sp{MPI_COMM_WORLD, s.seqlen_q, s.seqlen_k, layout, mode};
    std::string got;
    try {  // ALiBi on the last rank only
      if (odd)
        with_term<float>(alibi, {}, [&](const auto& term) {
          kmpi::forward(Exec(), q, k, k, o, lse, kfa::Params{}, sp, term);
        });
      else
        kmpi::forward(Exec(), q, k, k, o, lse, kfa::Params{}, sp);
    } catch (const kmpi::CollectiveError& e) {
      got = e.what();
    }
    expect_everywhere(got, "mpi::forward: the score term differs between ranks");
    got.clear();
    try {  // a bias broadcast over batch on the last rank only, and dbias there only
      with_term<float>(bias, odd ? db : View4<float>(), [&](const auto& term) {
        kmpi::backward(Exec(), q, k, k, o, lse, q, dq, dk, dv, kfa::Params{}, sp, term);
      });
    } catch (const kmpi::CollectiveError& e) {
      got = e.what();
    }
    expect_everywhere(got, "the score term's batch extent differs between ranks (1 vs 2)");
    expect_everywhere(got, "whether dbias is given differs between ranks (false vs true)");
    got.clear();
    try {  // a bias of the last rank's rows only: not the whole problem's
      kfa::reference::Terms rows;
      rows.bias = odd ? Tensor4("b", 2, 2, q.extent(2), 24) : bias.bias;
      with_term<float>(rows, {}, [&](const auto& term) {
        kmpi::forward(Exec(), q, k, k, o, lse, kfa::Params{}, sp, term);
      });
    } catch (const kmpi::CollectiveError& e) {
      got = e.what();
    }
    expect_everywhere(got, "rank " + std::to_string(last) + ": mpi::forward: bias has shape");
  }
}

/// Names the rank in every failure. Rank 0 keeps GoogleTest's printer (one copy of the
/// progress), after this listener, which starts each failure's first line with "[rank 0] ";
/// the other ranks print their failures whole: "[rank r] file:line: Failure" and the message.
class RankPrefix : public ::testing::EmptyTestEventListener {
 public:
  explicit RankPrefix(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("[rank %d] ", rank_);
    if (rank_ != 0)
      std::printf("%s:%d: Failure\n%s\n", r.file_name() ? r.file_name() : "unknown file",
                  r.line_number(), r.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  ::testing::TestEventListener* printer = listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankPrefix(comm_rank()));
  if (comm_rank() == 0)
    listeners.Append(printer);
  else
    delete printer;
  Kokkos::initialize(argc, argv);
  int result = RUN_ALL_TESTS();
  Kokkos::finalize();
  // The suite fails if it failed on any rank.
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
