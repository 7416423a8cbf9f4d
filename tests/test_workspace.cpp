// The workspace pool (kfa/workspace.hpp, impl/workspace.hpp): idle memory is reused, a buffer
// is lent to one holder at a time (threads included), it grows and is released as documented,
// and the passes that take temporaries from it give the same bits whatever ran before them
// (no result depends on what an earlier call left in the memory). Run twice by ctest: as is,
// and with KFA_WORKSPACE_CACHE=0, where nothing is kept between calls.
#include <kfa/workspace.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "problem.hpp"

namespace {

using namespace kfa_test;

using Memory = Device::memory_space;
using Pool = kfa::impl::WorkspacePool<Memory>;
template <class T>
using Temp = kfa::impl::Temporary<Kokkos::View<T*, Device>, Exec>;

bool caching() {
  return kfa::impl::workspace_cache_enabled();
}

TEST(Workspace, IdleMemoryIsReusedAndEachBufferLentOnce) {
  kfa::release_workspaces();
  ASSERT_EQ(Pool::get().bytes(), 0u);
  const void* first = nullptr;
  const void* second = nullptr;
  {
    const Temp<float> a(Exec(), 1000);
    const Temp<float> b(Exec(), 10);
    first = a.view().data();
    second = b.view().data();
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    EXPECT_NE(first, second);  // both lent at once: two buffers
    EXPECT_EQ(a.view().extent(0), 1000u);
    EXPECT_EQ(Pool::get().bytes(), 4040u);
  }
  if (!caching()) {
    EXPECT_EQ(Pool::get().bytes(), 0u);
    return;
  }
  EXPECT_EQ(Pool::get().bytes(), 4040u);  // kept when idle
  {
    const Temp<float> c(Exec(), 500);  // the smallest idle buffer that fits: a's
    const Temp<float> d(Exec(), 10);   // then b's
    EXPECT_EQ(c.view().data(), first);
    EXPECT_EQ(d.view().data(), second);
    EXPECT_EQ(Pool::get().bytes(), 4040u);
  }
  {
    const Temp<double> e(Exec(), 5000);  // fits no buffer: the largest idle one grows
    EXPECT_EQ(e.view().extent(0), 5000u);
    EXPECT_EQ(Pool::get().bytes(), 40000u + 40u);
  }
  kfa::release_workspaces();
  EXPECT_EQ(Pool::get().bytes(), 0u);
}

TEST(Workspace, ReleaseDuringALoanFreesItWhenItEnds) {
  kfa::release_workspaces();
  {
    const Temp<float> a(Exec(), 256);
    { const Temp<float> b(Exec(), 64); }  // idle, then released below
    kfa::release_workspaces();
    EXPECT_EQ(Pool::get().bytes(), 1024u);  // a's, still lent
    EXPECT_EQ(kfa::workspace_bytes(), 1024u);
  }
  EXPECT_EQ(Pool::get().bytes(), 0u);
}

TEST(Workspace, ZeroElementsTakeNothing) {
  kfa::release_workspaces();
  const Temp<float> a(Exec(), 0);
  EXPECT_EQ(a.view().extent(0), 0u);
  EXPECT_EQ(Pool::get().bytes(), 0u);
}

// Threads taking and giving back host buffers at once: each writes its own pattern into its
// buffer, yields, and finds the pattern intact (a buffer lent twice would be overwritten).
TEST(Workspace, ThreadsNeverShareABuffer) {
  using HostPool = kfa::impl::WorkspacePool<Kokkos::HostSpace>;
  constexpr int kThreads = 4, kRounds = 300;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &failures] {
      std::mt19937 gen(static_cast<unsigned>(t));
      std::uniform_int_distribution<int> words(1, 4096);
      for (int r = 0; r < kRounds; ++r) {
        const int n = words(gen);
        void* data = nullptr;
        const std::size_t slot = HostPool::get().take(sizeof(std::uint32_t) * n, data);
        auto* w = static_cast<std::uint32_t*>(data);
        const std::uint32_t mark =
            (static_cast<std::uint32_t>(t) << 16) | static_cast<std::uint32_t>(r);
        for (int i = 0; i < n; ++i)
          w[i] = mark;
        std::this_thread::yield();
        for (int i = 0; i < n; ++i)
          if (w[i] != mark) {
            ++failures[t];
            break;
          }
        HostPool::get().give_back(slot);
      }
    });
  for (auto& th : threads)
    th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  // At most one buffer per thread was ever needed at once, none over 4096 words.
  if (caching()) {
    EXPECT_LE(HostPool::get().bytes(), std::size_t(kThreads) * 4 * 4096);
  }
  kfa::release_workspaces();
  EXPECT_EQ(HostPool::get().bytes(), 0u);
}

double max_abs(const Tensor4& a) {
  double m = 0;
  for (std::size_t e = 0; e < a.span(); ++e)
    m = std::max(m, std::fabs(a.data()[e]));
  return m;
}

bool same_bits(const Tensor4& a, const Tensor4& b) {
  return a.span() == b.span() && std::memcmp(a.data(), b.data(), sizeof(double) * a.span()) == 0;
}

// The passes with temporaries (the backward's delta; bf16's float dQ on the atomic path; the
// query pass's transposed K and V; split-KV's partials; bf16's V pair words), run on shape A, then
// on a larger shape B (the buffers grow and are written with B's values), then on A again: A's
// results are bitwise the same both times.
TEST(Workspace, ResultsDoNotDependOnEarlierCalls) {
  // Nk of 3 and 5 key tiles or more on every backend, so that three splits are three.
  const Shape a{1, 2, 1, 70, 300, 64}, b{2, 3, 3, 200, 600, 64};
  const Problem pa(a, 11), pb(b, 12);
  std::mt19937_64 gen(13);
  const Tensor4 da = random_tensor("dout", a.batch, a.heads_q, a.seqlen_q, a.dv(), gen);
  const Tensor4 db = random_tensor("dout", b.batch, b.heads_q, b.seqlen_q, b.dv(), gen);
  kfa::Params atomic, query, split;
  atomic.dq_mode = kfa::DqMode::atomic;
  query.dq_mode = kfa::DqMode::query_pass;
  split.num_splits = 3;
  // dQ by atomics adds in an order threads and GPUs do not repeat: within a few roundings
  // there (a left-over accumulator would be off by dQ itself), bitwise elsewhere.
  for (const kfa::Params& p : {atomic, query}) {
    SCOPED_TRACE(describe(p));
    const auto first = run_backward<float>(pa, p, da);
    run_backward<float>(pb, p, db);
    const auto again = run_backward<float>(pa, p, da);
    if (p.dq_mode == kfa::DqMode::atomic)
      EXPECT_LE(kfa::reference::max_abs_diff(first.dq, again.dq), 1e-5 * max_abs(first.dq));
    else
      EXPECT_TRUE(same_bits(first.dq, again.dq));
    EXPECT_TRUE(same_bits(first.dk, again.dk));
    EXPECT_TRUE(same_bits(first.dv, again.dv));
  }
  {  // the float dQ accumulator, zeroed each call; 2 bf16 roundings at the largest element
    const auto first = run_backward<kfa::bf16>(pa, atomic, da);
    run_backward<kfa::bf16>(pb, atomic, db);
    const auto again = run_backward<kfa::bf16>(pa, atomic, da);
    EXPECT_LE(kfa::reference::max_abs_diff(first.dq, again.dq), 0.008 * max_abs(first.dq));
  }
  {
    const auto first = run_forward<float>(pa, split);
    run_forward<float>(pb, split);
    const auto again = run_forward<float>(pa, split);
    EXPECT_TRUE(same_bits(first.o, again.o));
    EXPECT_EQ(kfa::reference::max_abs_diff(first.lse, again.lse), 0.0);
  }
  {  // bf16's V as pair words (host pair products): A's odd key count leaves half a pair
    const Shape a1{1, 2, 1, 70, 301, 64}, b1{2, 3, 3, 200, 600, 64};
    const Problem pa1(a1, 14), pb1(b1, 15);
    const auto first = run_forward<kfa::bf16>(pa1, kfa::Params{});
    run_forward<kfa::bf16>(pb1, kfa::Params{});
    const auto again = run_forward<kfa::bf16>(pa1, kfa::Params{});
    EXPECT_TRUE(same_bits(first.o, again.o));
  }
  if (caching())
    EXPECT_GT(kfa::workspace_bytes(), 0u);  // kept for the next call
  else
    EXPECT_EQ(kfa::workspace_bytes(), 0u);
}

}  // namespace
