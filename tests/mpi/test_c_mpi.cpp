// The C interface's kfa_mpi_ functions against kfa::mpi on the same rows, bitwise, at any rank
// count (ctest runs 1 and 2): forward and backward, float and double, both layouts and modes,
// causal, GQA; and an invalid argument on one rank fails every rank's call with that rank's
// message, writing nothing, instead of leaving the others in a collective.
#include <gtest/gtest.h>
#include <kfa/kfa.h>
#include <mpi.h>
#include <kfa/distributed.hpp>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "../c_arrays.hpp"

#ifdef KFA_TEST_FORTRAN
extern "C" {
void fortran_mpi_forward_f64(int d, int nq, int hq, int nk, int hk, int b, const double* q,
                             const double* k, const double* v, double* o, double* lse, int comm,
                             int seqlen_q, int seqlen_k, int layout, int mode, int causal,
                             int* status);
void fortran_mpi_backward_f32(int d, int nq, int hq, int nk, int hk, int b, const float* q,
                              const float* k, const float* v, const float* o, const float* lse,
                              const float* dout, const float* dlse, float* dq, float* dk, float* dv,
                              int comm, int seqlen_q, int seqlen_k, int layout, int mode,
                              int causal, int* status);
}
#endif

namespace {

using kfa_test::Arrays;
using kfa_test::Dims;
using kfa_test::same_bits;

int comm_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int comm_size() {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

/// Rank-local arrays of a problem with global lengths nq, nk: any values make a valid global
/// problem, so each rank draws its own rows.
template <class T>
Arrays<T> local(const Dims& global, kfa_mpi_layout layout, unsigned salt) {
  const auto l =
      layout == KFA_MPI_LAYOUT_ZIGZAG ? kfa::mpi::Layout::zigzag : kfa::mpi::Layout::contiguous;
  Dims s = global;
  s.nq = static_cast<int>(kfa::mpi::owned_count(l, global.nq, comm_rank(), comm_size()));
  s.nk = static_cast<int>(kfa::mpi::owned_count(l, global.nk, comm_rank(), comm_size()));
  return Arrays<T>(s, false, 1000 * salt + comm_rank());
}

template <class T>
void check_same(const Dims& g, kfa_mpi_layout layout, kfa_mpi_mode mode, int causal) {
  SCOPED_TRACE(::testing::Message() << "Nq=" << g.nq << " Nk=" << g.nk << " Hq=" << g.hq
                                    << " Hk=" << g.hk << " layout=" << layout << " mode=" << mode
                                    << " causal=" << causal << " " << sizeof(T) * 8 << "-bit");
  Arrays<T> c = local<T>(g, layout, 1), cxx = local<T>(g, layout, 1);
  const Dims& s = c.s;
  kfa_params cp = kfa_params_default();
  cp.causal = causal;
  const kfa_seqpar seqpar{g.nq, g.nk, static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)), layout, mode};
  kfa::Params p;
  p.causal = causal != 0;
  kfa::mpi::SeqPar sp{MPI_COMM_WORLD, g.nq, g.nk, static_cast<kfa::mpi::Layout>(layout),
                      static_cast<kfa::mpi::Mode>(mode)};
  const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                   v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                   lse = c.rows(c.lse), dout = c.tensor(c.dout, s.hq, s.nq), dlse = c.rows(c.dlse),
                   dq = c.tensor(c.dq, s.hq, s.nq), dk = c.tensor(c.dk, s.hk, s.nk),
                   dv = c.tensor(c.dv, s.hk, s.nk);
  const auto fwd = std::is_same_v<T, float> ? kfa_mpi_forward_f32 : kfa_mpi_forward_f64;
  const auto bwd = std::is_same_v<T, float> ? kfa_mpi_backward_f32 : kfa_mpi_backward_f64;
  ASSERT_EQ(fwd(&q, &k, &v, &o, &lse, &cp, &seqpar, KFA_MEMORY_HOST), KFA_OK) << kfa_last_error();
  using Host = Kokkos::DefaultHostExecutionSpace;
  kfa::mpi::forward(Host(), cxx.view(cxx.q, s.hq, s.nq), cxx.view(cxx.k, s.hk, s.nk),
                    cxx.view(cxx.v, s.hk, s.nk), cxx.view(cxx.o, s.hq, s.nq), cxx.row_view(cxx.lse),
                    p, sp);
  EXPECT_TRUE(same_bits(c.o, cxx.o));
  EXPECT_TRUE(same_bits(c.lse, cxx.lse));
  ASSERT_EQ(bwd(&q, &k, &v, &o, &lse, &dout, &dlse, &dq, &dk, &dv, &cp, &seqpar, KFA_MEMORY_HOST),
            KFA_OK)
      << kfa_last_error();
  kfa::mpi::backward(Host(), cxx.view(cxx.q, s.hq, s.nq), cxx.view(cxx.k, s.hk, s.nk),
                     cxx.view(cxx.v, s.hk, s.nk), cxx.view(cxx.o, s.hq, s.nq),
                     cxx.row_view(cxx.lse), cxx.view(cxx.dout, s.hq, s.nq), cxx.row_view(cxx.dlse),
                     cxx.view(cxx.dq, s.hq, s.nq), cxx.view(cxx.dk, s.hk, s.nk),
                     cxx.view(cxx.dv, s.hk, s.nk), p, sp);
  EXPECT_TRUE(same_bits(c.dq, cxx.dq));
  EXPECT_TRUE(same_bits(c.dk, cxx.dk));
  EXPECT_TRUE(same_bits(c.dv, cxx.dv));
}

TEST(CApiMpi, SameBitsAsKfaMpi) {
  check_same<double>({1, 2, 2, 37, 37, 16}, KFA_MPI_LAYOUT_ZIGZAG, KFA_MPI_MODE_RING, 1);
  check_same<float>({2, 4, 2, 29, 41, 16}, KFA_MPI_LAYOUT_CONTIGUOUS, KFA_MPI_MODE_TREE, 1);
  check_same<float>({1, 2, 1, 33, 33, 32}, KFA_MPI_LAYOUT_CONTIGUOUS, KFA_MPI_MODE_RING, 0);
}

// A score term through kfa_mpi_forward_term_f64 / kfa_mpi_backward_term_f64: a global bias
// (the same on every rank) with its gradient, bitwise kfa::mpi's with kfa::masks::Bias on the
// same rows; every rank receives the whole dbias.
TEST(CApiMpi, BiasSameBitsAsKfaMpi) {
  const Dims g{2, 4, 2, 19, 23, 16};
  for (kfa_mpi_mode mode : {KFA_MPI_MODE_RING, KFA_MPI_MODE_TREE}) {
    SCOPED_TRACE(::testing::Message() << "mode=" << mode);
    Arrays<double> c = local<double>(g, KFA_MPI_LAYOUT_ZIGZAG, 5),
                   cxx = local<double>(g, KFA_MPI_LAYOUT_ZIGZAG, 5);
    const Dims& s = c.s;
    const std::size_t n = std::size_t(g.b) * g.hq * g.nq * g.nk;
    std::vector<double> bias(n), cdb(n, std::nan("")), xdb(n, std::nan(""));
    for (std::size_t e = 0; e < n; ++e)
      bias[e] = 0.01 * static_cast<double>(e % 89) - 0.4;
    const kfa_term term = kfa_term_bias(kfa_tensor_contiguous(bias.data(), g.b, g.hq, g.nq, g.nk),
                                        kfa_tensor_contiguous(cdb.data(), g.b, g.hq, g.nq, g.nk));
    kfa_params cp = kfa_params_default();
    cp.causal = 1;
    const kfa_seqpar seqpar{g.nq, g.nk, static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)),
                            KFA_MPI_LAYOUT_ZIGZAG, mode};
    const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                     v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                     lse = c.rows(c.lse), dout = c.tensor(c.dout, s.hq, s.nq),
                     dq = c.tensor(c.dq, s.hq, s.nq), dk = c.tensor(c.dk, s.hk, s.nk),
                     dv = c.tensor(c.dv, s.hk, s.nk);
    ASSERT_EQ(kfa_mpi_forward_term_f64(&q, &k, &v, &o, &lse, &cp, &term, &seqpar, KFA_MEMORY_HOST),
              KFA_OK)
        << kfa_last_error();
    ASSERT_EQ(kfa_mpi_backward_term_f64(&q, &k, &v, &o, &lse, &dout, nullptr, &dq, &dk, &dv, &cp,
                                        &term, &seqpar, KFA_MEMORY_HOST),
              KFA_OK)
        << kfa_last_error();
    using Host = Kokkos::DefaultHostExecutionSpace;
    using B4 = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    const kfa::masks::Bias<B4, B4> xb{B4(bias.data(), g.b, g.hq, g.nq, g.nk),
                                      B4(xdb.data(), g.b, g.hq, g.nq, g.nk)};
    kfa::Params p;
    p.causal = true;
    const kfa::mpi::SeqPar sp{MPI_COMM_WORLD, g.nq, g.nk, kfa::mpi::Layout::zigzag,
                              static_cast<kfa::mpi::Mode>(mode)};
    kfa::mpi::forward(Host(), cxx.view(cxx.q, s.hq, s.nq), cxx.view(cxx.k, s.hk, s.nk),
                      cxx.view(cxx.v, s.hk, s.nk), cxx.view(cxx.o, s.hq, s.nq),
                      cxx.row_view(cxx.lse), p, sp, xb);
    kfa::mpi::backward(Host(), cxx.view(cxx.q, s.hq, s.nq), cxx.view(cxx.k, s.hk, s.nk),
                       cxx.view(cxx.v, s.hk, s.nk), cxx.view(cxx.o, s.hq, s.nq),
                       cxx.row_view(cxx.lse), cxx.view(cxx.dout, s.hq, s.nq),
                       cxx.view(cxx.dq, s.hq, s.nq), cxx.view(cxx.dk, s.hk, s.nk),
                       cxx.view(cxx.dv, s.hk, s.nk), p, sp, xb);
    Host().fence();
    EXPECT_TRUE(same_bits(c.o, cxx.o));
    EXPECT_TRUE(same_bits(c.lse, cxx.lse));
    EXPECT_TRUE(same_bits(c.dq, cxx.dq));
    EXPECT_TRUE(same_bits(c.dk, cxx.dk));
    EXPECT_TRUE(same_bits(c.dv, cxx.dv));
    EXPECT_TRUE(same_bits(cdb, xdb));
    for (double x : cdb)
      ASSERT_TRUE(x == x) << "dbias not written";
  }
}

#ifdef KFA_TEST_FORTRAN
// The Fortran module's kfa_mpi_forward (double) and kfa_mpi_backward (float, with dlse), with
// the communicator's Fortran handle: bitwise the C interface's results on the same rows.
TEST(CApiMpi, FortranSameBitsAsC) {
  const Dims g{1, 4, 2, 23, 31, 16};
  const int comm = static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD));
  const kfa_seqpar seqpar{g.nq, g.nk, comm, KFA_MPI_LAYOUT_ZIGZAG, KFA_MPI_MODE_TREE};
  kfa_params cp = kfa_params_default();
  cp.causal = 1;
  {
    Arrays<double> f = local<double>(g, KFA_MPI_LAYOUT_ZIGZAG, 3),
                   c = local<double>(g, KFA_MPI_LAYOUT_ZIGZAG, 3);
    const Dims& s = c.s;
    int status = -1;
    fortran_mpi_forward_f64(s.d, s.nq, s.hq, s.nk, s.hk, s.b, f.q.data(), f.k.data(), f.v.data(),
                            f.o.data(), f.lse.data(), comm, g.nq, g.nk, KFA_MPI_LAYOUT_ZIGZAG,
                            KFA_MPI_MODE_TREE, 1, &status);
    ASSERT_EQ(status, KFA_OK) << kfa_last_error();
    const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                     v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                     lse = c.rows(c.lse);
    ASSERT_EQ(kfa_mpi_forward_f64(&q, &k, &v, &o, &lse, &cp, &seqpar, KFA_MEMORY_HOST), KFA_OK);
    EXPECT_TRUE(same_bits(f.o, c.o));
    EXPECT_TRUE(same_bits(f.lse, c.lse));
  }
  Arrays<float> f = local<float>(g, KFA_MPI_LAYOUT_ZIGZAG, 4),
                c = local<float>(g, KFA_MPI_LAYOUT_ZIGZAG, 4);
  const Dims& s = c.s;
  const kfa_tensor q = c.tensor(c.q, s.hq, s.nq), k = c.tensor(c.k, s.hk, s.nk),
                   v = c.tensor(c.v, s.hk, s.nk), o = c.tensor(c.o, s.hq, s.nq),
                   lse = c.rows(c.lse), dout = c.tensor(c.dout, s.hq, s.nq), dlse = c.rows(c.dlse),
                   dq = c.tensor(c.dq, s.hq, s.nq), dk = c.tensor(c.dk, s.hk, s.nk),
                   dv = c.tensor(c.dv, s.hk, s.nk);
  ASSERT_EQ(kfa_mpi_forward_f32(&q, &k, &v, &o, &lse, &cp, &seqpar, KFA_MEMORY_HOST), KFA_OK);
  f.o = c.o;
  f.lse = c.lse;
  int status = -1;
  fortran_mpi_backward_f32(s.d, s.nq, s.hq, s.nk, s.hk, s.b, f.q.data(), f.k.data(), f.v.data(),
                           f.o.data(), f.lse.data(), f.dout.data(), f.dlse.data(), f.dq.data(),
                           f.dk.data(), f.dv.data(), comm, g.nq, g.nk, KFA_MPI_LAYOUT_ZIGZAG,
                           KFA_MPI_MODE_TREE, 1, &status);
  ASSERT_EQ(status, KFA_OK) << kfa_last_error();
  ASSERT_EQ(kfa_mpi_backward_f32(&q, &k, &v, &o, &lse, &dout, &dlse, &dq, &dk, &dv, &cp, &seqpar,
                                 KFA_MEMORY_HOST),
            KFA_OK);
  EXPECT_TRUE(same_bits(f.dq, c.dq));
  EXPECT_TRUE(same_bits(f.dk, c.dk));
  EXPECT_TRUE(same_bits(f.dv, c.dv));
}
#endif

// Rank P-1 passes a NULL q: every rank's call fails with that rank's message, and no rank
// writes anything.
TEST(CApiMpi, OneRanksErrorFailsEveryRank) {
  const int P = comm_size(), r = comm_rank();
  Arrays<float> a = local<float>({1, 2, 2, 16, 16, 16}, KFA_MPI_LAYOUT_CONTIGUOUS, 2);
  const Dims& s = a.s;
  const kfa_tensor q = a.tensor(a.q, s.hq, s.nq), k = a.tensor(a.k, s.hk, s.nk),
                   o = a.tensor(a.o, s.hq, s.nq), lse = a.rows(a.lse);
  const kfa_params p = kfa_params_default();
  const kfa_seqpar seqpar{16, 16, static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)),
                          KFA_MPI_LAYOUT_CONTIGUOUS, KFA_MPI_MODE_RING};
  const kfa_status st = kfa_mpi_forward_f32(r == P - 1 ? nullptr : &q, &k, &k, &o, &lse, &p,
                                            &seqpar, KFA_MEMORY_HOST);
  EXPECT_EQ(st, r == P - 1 ? KFA_ERROR_NULL_POINTER : KFA_ERROR_INVALID_ARGUMENT);
  const std::string msg = kfa_last_error();
  EXPECT_NE(msg.find("rank " + std::to_string(P - 1) + ": kfa_mpi_forward_f32: q is NULL"),
            std::string::npos)
      << msg;
  for (float x : a.o)
    EXPECT_TRUE(x != x) << "o written on error";
  // Every rank: kfa::mpi's own checks (here a global seqlen that the rows do not add up to).
  kfa_seqpar wrong = seqpar;
  wrong.seqlen_q = 17;
  EXPECT_EQ(kfa_mpi_forward_f32(&q, &k, &k, &o, &lse, &p, &wrong, KFA_MEMORY_HOST),
            KFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kfa_last_error()).find("seqlen"), std::string::npos) << kfa_last_error();
  EXPECT_EQ(kfa_mpi_forward_f32(&q, &k, &k, &o, &lse, &p, nullptr, KFA_MEMORY_HOST),
            KFA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(kfa_last_error()).find("seqpar is NULL"), std::string::npos);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (comm_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = 0;
  if (kfa_initialize() != KFA_OK) {
    result = 1;
  } else {
    result = RUN_ALL_TESTS();
    kfa_finalize();
  }
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
