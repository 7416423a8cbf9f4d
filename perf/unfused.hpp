#pragma once
// The unfused attention a user writes without kfa, and the baseline kfa is measured against
// (docs/performance.md): S = scale Q K^T and O = P V with Kokkos Kernels' gemm, one call per
// (batch, head) on 2-D subviews, and a Kokkos softmax kernel between them that also yields the LSE.
// S (then P, in place) is held for all B * H heads at once, B * H * Nq * Nk values, as PyTorch and
// a plain user code hold it: that matrix is what the memory comparison with kfa is about.
//
// The backward keeps P from the forward instead of recomputing it, as autograd does (PyTorch
// saves the softmax output), so its four products are dV = P^T dO, dP = dO V^T, dQ = scale dS K
// and dK = scale dS^T Q, with dS = P * (dP - delta) and delta = rowsum(dO * O) in a row kernel;
// dP and then dS share a second B * H * Nq * Nk buffer, allocated by the first backward.
//
// The causal mask (key j visible to query i iff j <= i + Nk - Nq: kfa's default bottom-right
// alignment, j <= i when Nq == Nk) is applied by the softmax alone; the gemms compute every
// score and every product with the zeros of P, as a masked softmax between dense products does.
// The benchmarks credit every implementation with the visible pairs only (flash-attn's count).
//
// The softmax calls Kokkos' exp, as a user's kernel would; it shares no code with kfa's
// kernels (which carry their own vectorisable exp). On a CPU core that scalar exp, not the
// gemms, takes most of the float forward's time; PyTorch's softmax is vectorised, one reason
// the comparison script measures PyTorch as well.
//
// With LayoutRight (B, H, N, D) views the per-head subviews are LayoutRight too, which is what
// Kokkos Kernels hands to a host BLAS when it was built with one; other layouts still give the
// right result through its own gemm. Heads of q and k must match (no grouped-query attention).

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <string>

namespace kfa_bench::unfused {

#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::log;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
#endif

/// Unfused attention in precision T (float or double) on Space, for one problem shape.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class Attention {
 public:
  /// (batch, heads, seqlen_q, seqlen_k) scores, probabilities or their gradients.
  using Matrix = Kokkos::View<T****, Kokkos::LayoutRight, typename Space::memory_space>;

  /// Bytes of the B * H * Nq * Nk buffers: one for the forward (P), two with the backward.
  static std::size_t matrix_bytes(int batch, int heads, int seqlen_q, int seqlen_k, bool backward) {
    return (backward ? 2 : 1) * std::size_t(batch) * heads * seqlen_q * seqlen_k * sizeof(T);
  }

  /// scale < 0 means 1 / sqrt(head_dim), as kfa::Params.
  Attention(int batch, int heads, int seqlen_q, int seqlen_k, int head_dim, bool causal,
            double scale = -1)
      : B_(batch),
        H_(heads),
        Nq_(seqlen_q),
        Nk_(seqlen_k),
        causal_(causal),
        scale_(static_cast<T>(scale < 0 ? 1.0 / std::sqrt(double(head_dim)) : scale)),
        p_(Kokkos::view_alloc(std::string("unfused::p"), Kokkos::WithoutInitializing), batch, heads,
           seqlen_q, seqlen_k) {}

  /// O = softmax(scale Q K^T) V and LSE; P stays in probabilities() for the backward.
  template <class Q, class K, class V, class O, class Lse>
  void forward(const Q& q, const K& k, const V& v, const O& o, const Lse& lse) {
    static_assert(Q::rank == 4 && K::rank == 4 && V::rank == 4 && O::rank == 4 && Lse::rank == 3);
    for (int b = 0; b < B_; ++b)
      for (int h = 0; h < H_; ++h)
        KokkosBlas::gemm("N", "T", scale_, head(q, b, h), head(k, b, h), T(0), head(p_, b, h));
    softmax(lse);
    for (int b = 0; b < B_; ++b)
      for (int h = 0; h < H_; ++h)
        KokkosBlas::gemm("N", "N", T(1), head(p_, b, h), head(v, b, h), T(0), head(o, b, h));
  }

  /// dQ, dK, dV from dO, with P from the last forward on the same q, k, v (o is its output).
  template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
  void backward(const Q& q, const K& k, const V& v, const O& o, const DO& dout, const DQ& dq,
                const DK& dk, const DV& dv) {
    if (ds_.span() == 0)
      ds_ = Matrix(Kokkos::view_alloc(std::string("unfused::ds"), Kokkos::WithoutInitializing), B_,
                   H_, Nq_, Nk_);
    for (int b = 0; b < B_; ++b)
      for (int h = 0; h < H_; ++h) {
        KokkosBlas::gemm("T", "N", T(1), head(p_, b, h), head(dout, b, h), T(0), head(dv, b, h));
        KokkosBlas::gemm("N", "T", T(1), head(dout, b, h), head(v, b, h), T(0), head(ds_, b, h));
      }
    softmax_backward(o, dout);
    for (int b = 0; b < B_; ++b)
      for (int h = 0; h < H_; ++h) {
        KokkosBlas::gemm("N", "N", scale_, head(ds_, b, h), head(k, b, h), T(0), head(dq, b, h));
        KokkosBlas::gemm("T", "N", scale_, head(ds_, b, h), head(q, b, h), T(0), head(dk, b, h));
      }
  }

  /// P of the last forward, zero where masked.
  const Matrix& probabilities() const { return p_; }

 private:
  using Team = typename Kokkos::TeamPolicy<Space>::member_type;

  template <class View>
  static auto head(const View& t, int b, int h) {
    return Kokkos::subview(t, b, h, Kokkos::ALL, Kokkos::ALL);
  }

  // Row (b, h, i) of S becomes P in place; lse(b, h, i) = log sum_j exp(S_ij) over the visible
  // keys, -inf (with P = 0) for a query that sees none. One team per row.
  template <class Lse>
  void softmax(const Lse& lse) const {
    const Matrix p = p_;
    const int H = H_, Nq = Nq_, Nk = Nk_;
    const bool causal = causal_;
    Kokkos::parallel_for(
        "unfused::softmax", Kokkos::TeamPolicy<Space>(Space(), B_ * H_ * Nq_, Kokkos::AUTO),
        KOKKOS_LAMBDA(const Team& team) {
          const int r = team.league_rank(), i = r % Nq, h = (r / Nq) % H, b = r / (Nq * H);
          const int last = i + Nk - Nq;  // the last visible key under the causal mask
          const int hi = !causal ? Nk : last < 0 ? 0 : last < Nk ? last + 1 : Nk;
          auto s = Kokkos::subview(p, b, h, i, Kokkos::ALL);
          T mx = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, hi), [&](int j, T& m) { m = s(j) > m ? s(j) : m; },
              Kokkos::Max<T>(mx));
          T sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, hi),
              [&](int j, T& acc) {
                s(j) = exp(s(j) - mx);
                acc += s(j);
              },
              sum);
          team.team_barrier();
          const T inv = hi > 0 ? T(1) / sum : T(0);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Nk),
                               [&](int j) { s(j) = j < hi ? s(j) * inv : T(0); });
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            lse(b, h, i) = hi > 0 ? mx + log(sum) : -Kokkos::Experimental::infinity<T>::value;
          });
        });
  }

  // Row (b, h, i) of dP becomes dS = P * (dP - delta_i) in place, delta_i = dO_i . O_i.
  template <class O, class DO>
  void softmax_backward(const O& o, const DO& dout) const {
    const Matrix p = p_, ds = ds_;
    const int H = H_, Nq = Nq_, Nk = Nk_, D = o.extent(3);
    Kokkos::parallel_for(
        "unfused::softmax_backward",
        Kokkos::TeamPolicy<Space>(Space(), B_ * H_ * Nq_, Kokkos::AUTO),
        KOKKOS_LAMBDA(const Team& team) {
          const int r = team.league_rank(), i = r % Nq, h = (r / Nq) % H, b = r / (Nq * H);
          T delta = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, D),
              [&](int d, T& acc) { acc += dout(b, h, i, d) * o(b, h, i, d); }, delta);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Nk), [&](int j) {
            ds(b, h, i, j) = p(b, h, i, j) * (ds(b, h, i, j) - delta);
          });
        });
  }

  int B_, H_, Nq_, Nk_;
  bool causal_;
  T scale_;
  Matrix p_;   // S, then P
  Matrix ds_;  // dP, then dS
};

}  // namespace kfa_bench::unfused
