#pragma once
/// \file mha.hpp
/// kfa::nn: the transformer block around the attention, forward and backward, on any Kokkos
/// backend. Part of the kfa::nn target, which adds Kokkos Kernels (KokkosBlas::gemm, for the
/// projections) to kfa::kfa.
///
/// The fused multi-head attention block (mha_forward, mha_backward), for x of shape
/// (B, L, d_model), Hq query heads and Hkv key/value heads of hd = d_model / Hq elements:
///   1. QKV = x W_qkv + b_qkv, one gemm on x seen as (B L, d_model);
///   2. Q, K and V are strided views of QKV, (B, H, L, hd) with strides (L W, hd, W, 1),
///      W = (Hq + 2 Hkv) hd: the transpose to heads-first order is in the strides, not a copy;
///   3. O = softmax(Q K^T) V by kfa::forward (every kfa::Params option), written through a
///      strided (B, Hq, L, hd) view of (B, L, Hq, hd) storage, so O is already the (B L, Hq hd)
///      matrix the next gemm reads;
///   4. Z = O W_o + b_o, one gemm;
///   5. y = layer_norm(Z + x) (kfa::layer_norm with x as the residual) when
///      MhaParams::residual_layer_norm, else y = Z.
/// The backward runs the same steps in reverse: dZ from layer_norm_backward (or dy),
/// dW_o = O^T dZ, dO = dZ W_o^T, kfa::backward writing dQ, dK, dV through strided views into
/// dQKV, dW_qkv = x^T dQKV, dx = dQKV W_qkv^T (+ dZ when x is the residual). Every product is
/// a KokkosBlas::gemm; the bias gradients are column sums taken in row order by one thread per
/// column, without atomics, so they are bitwise repeatable.
///
/// The FFN (ffn_forward, ffn_backward): y = max(0, x W1 + b1) W2 + b2.
///
/// Value types: float and double (what KokkosBlas::gemm takes on every backend).

#include <kfa/backward.hpp>
#include <kfa/forward.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/layer_norm.hpp>
#include <kfa/params.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

namespace kfa::nn {

/// Options of the multi-head attention block.
struct MhaParams {
  int heads_q = 1;   ///< query heads Hq; hd = d_model / Hq must be a whole number
  int heads_kv = 1;  ///< key/value heads Hkv; Hq must be a multiple (grouped-query attention)
  Params attention;  ///< the attention's options (scale, masks, dropout, dQ mode), as kfa::forward
  bool qkv_bias = true;              ///< add b_qkv after the QKV projection
  bool out_bias = true;              ///< add b_o after the output projection
  bool residual_layer_norm = false;  ///< y = layer_norm(O W_o + b_o + x) instead of O W_o + b_o
  LayerNormParams ln;                ///< eps and variance of that layer norm
};

/// The block's parameters, and (same struct) their gradients. Row-major matrices:
/// w_qkv (d_model, (Hq + 2 Hkv) hd) with columns ordered q heads, then k heads, then v heads,
/// each head's hd columns contiguous; b_qkv ((Hq + 2 Hkv) hd); w_o (Hq hd, d_model);
/// b_o (d_model); gamma, beta (d_model). A bias or layer-norm vector that MhaParams switches
/// off is empty (size 0).
template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
struct MhaWeights {
  using matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;  ///< a weight matrix
  using vector = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;   ///< a bias or scale vector
  matrix w_qkv;                                                ///< (d_model, (Hq + 2 Hkv) hd)
  vector b_qkv;  ///< ((Hq + 2 Hkv) hd), or empty without MhaParams::qkv_bias
  matrix w_o;    ///< (Hq hd, d_model)
  vector b_o;    ///< (d_model), or empty without MhaParams::out_bias
  vector gamma;  ///< (d_model), or empty without MhaParams::residual_layer_norm
  vector beta;   ///< (d_model), or empty without MhaParams::residual_layer_norm

  MhaWeights() = default;
  /// Zero-filled views of the shapes that d_model and p ask for (for weights or gradients).
  /// d_model must be a multiple of p.heads_q (not checked here: the passes check it).
  MhaWeights(const std::string& label, int d_model, const MhaParams& p) {
    const int hd = p.heads_q > 0 ? d_model / p.heads_q : 0;
    const int width = (p.heads_q + 2 * p.heads_kv) * hd;
    w_qkv = matrix(label + "::w_qkv", d_model, width);
    w_o = matrix(label + "::w_o", p.heads_q * hd, d_model);
    if (p.qkv_bias) b_qkv = vector(label + "::b_qkv", width);
    if (p.out_bias) b_o = vector(label + "::b_o", d_model);
    if (p.residual_layer_norm) {
      gamma = vector(label + "::gamma", d_model);
      beta = vector(label + "::beta", d_model);
    }
  }
};

/// What mha_backward needs from mha_forward; mha_forward (re)allocates the views when their
/// shapes do not fit, so a default-constructed MhaSaved may be passed.
template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
struct MhaSaved {
  using stat_type = backends::accum_t<T>;            ///< type of lse, mean and rstd
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> qkv;  ///< x W_qkv + b_qkv, (B, L, (Hq + 2 Hkv) hd)
  Kokkos::View<T****, Kokkos::LayoutRight, Mem> o;   ///< attention output, (B, L, Hq, hd)
  Kokkos::View<stat_type***, Kokkos::LayoutRight, Mem> lse;  ///< attention LSE, (B, Hq, L)
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> z;            ///< O W_o + b_o, (B, L, d_model)
  Kokkos::View<stat_type*, Mem> mean;  ///< layer-norm row means (B L), with the layer norm
  Kokkos::View<stat_type*, Mem> rstd;  ///< layer-norm 1 / sqrt(var + eps) (B L), likewise
};

}  // namespace kfa::nn

namespace kfa::nn::impl {

using kfa::impl::fail;
using kfa::impl::shape_of;

/// Unmanaged views on the pass's execution space: KokkosBlas::gemm runs on the execution space
/// of its output's device type.
template <class T, int Rank>
struct data_type {
  using type = typename data_type<T, Rank - 1>::type*;  ///< T with Rank stars
};
/// T itself (the recursion's end).
template <class T>
struct data_type<T, 0> {
  using type = T;  ///< T
};
template <class ExecSpace, class Mem, class T, int Rank, class Layout = Kokkos::LayoutRight>
using Unmanaged =
    Kokkos::View<typename data_type<T, Rank>::type, Layout, Kokkos::Device<ExecSpace, Mem>,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// C = alpha op(A) op(B) + beta C through KokkosBlas::gemm. The Kokkos Kernels of Kokkos 3.4
/// has no overload taking an execution space instance: its gemm runs on the default instance
/// of C's space, so the pass's instance is fenced before and that one after, which orders the
/// gemm between the pass's kernels on any backend.
template <class ExecSpace, class T, class A, class B, class C>
void gemm(const ExecSpace& space, const char* ta, const char* tb, T alpha, const A& a, const B& b,
          T beta, const C& c) {
  space.fence();
  KokkosBlas::gemm(ta, tb, alpha, a, b, beta, c);
  typename C::execution_space().fence();
}

/// Every row of the rank-2 m set to the vector bias (or to 0 when bias is empty): the start of
/// a gemm with beta = 1 that adds the bias.
template <class ExecSpace, class M, class V>
void fill_rows(const ExecSpace& space, const M& m, const V& bias) {
  using T = typename M::non_const_value_type;
  const bool has = bias.size() > 0;
  const int cols = static_cast<int>(m.extent(1));
  Kokkos::parallel_for(
      "kfa::nn::fill_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(
          space, {0, 0}, {static_cast<long>(m.extent(0)), static_cast<long>(cols)}),
      KOKKOS_LAMBDA(long r, long c) { m(r, c) = has ? bias(c) : T(0); });
}

/// out(c) = sum over the rows r of m(r, c), in row order in the accumulation type, one thread
/// per column: no atomics, so bitwise repeatable and the same on every backend.
template <class ExecSpace, class M, class V>
void column_sums(const ExecSpace& space, const M& m, const V& out) {
  using T = typename M::non_const_value_type;
  using Acc = backends::accum_t<T>;
  const long rows = static_cast<long>(m.extent(0));
  Kokkos::parallel_for(
      "kfa::nn::column_sums",
      Kokkos::RangePolicy<ExecSpace>(space, 0, static_cast<long>(m.extent(1))),
      KOKKOS_LAMBDA(long c) {
        Acc s = 0;
        for (long r = 0; r < rows; ++r)
          s += static_cast<Acc>(m(r, c));
        out(c) = static_cast<T>(s);
      });
}

/// A rank-3 (B, L, D) view seen as the row-major (B L, D) matrix it is stored as; it must be
/// stored row-major without gaps (LayoutRight, or LayoutStride with those strides).
template <class ExecSpace, class Mem, class X>
auto as_rows(const char* pass, const char* name, const X& x) {
  const std::size_t B = x.extent(0), L = x.extent(1), D = x.extent(2);
  const bool ok = (D <= 1 || x.stride(2) == 1) && (L <= 1 || x.stride(1) == D) &&
                  (B <= 1 || x.stride(0) == L * D);
  if (!ok)
    fail(pass, name, " of shape ", shape_of(x), " must be stored row-major without gaps ",
         "(LayoutRight, or LayoutStride with strides (L D, D, 1)), got strides (", x.stride(0),
         ", ", x.stride(1), ", ", x.stride(2), ")");
  using T = typename X::value_type;
  return Unmanaged<ExecSpace, Mem, T, 2>(x.data(), B * L, D);
}

/// The sizes of a block pass, from x and the head counts.
struct MhaShape {
  int B = 0, L = 0, d_model = 0, hq = 0, hkv = 0, hd = 0, width = 0;
};

/// A vector that p switches on must have `want` elements, one it switches off none.
template <class V>
void expect_vec(const char* pass, const char* name, const V& v, bool on, std::size_t want,
                const char* why, const std::string& x_shape) {
  if (on && v.extent(0) != want)
    fail(pass, name, " has shape ", shape_of(v), " but must be (", want, ") for x of shape ",
         x_shape, " (", why, ")");
  if (!on && v.extent(0) != 0)
    fail(pass, name, " has shape ", shape_of(v), " but is not used (", why,
         " is off): pass an empty view");
}

/// A matrix must be (rows, cols).
template <class V>
void expect_mat(const char* pass, const char* name, const V& v, std::size_t rows, std::size_t cols,
                const char* what, const std::string& x_shape, const MhaShape& s) {
  if (v.extent(0) != rows || v.extent(1) != cols)
    fail(pass, name, " has shape ", shape_of(v), " but must be (", rows, ", ", cols, ") = ", what,
         " for x of shape ", x_shape, ", heads_q = ", s.hq, ", heads_kv = ", s.hkv);
}

/// Checks x, the head counts and every weight (or gradient) of w against each other.
template <class X, class T, class Mem>
MhaShape check_block(const char* pass, const X& x, const MhaWeights<T, Mem>& w,
                     const MhaParams& p) {
  MhaShape s;
  const std::string xs = shape_of(x);
  s.B = static_cast<int>(x.extent(0));
  s.L = static_cast<int>(x.extent(1));
  s.d_model = static_cast<int>(x.extent(2));
  s.hq = p.heads_q;
  s.hkv = p.heads_kv;
  if (x.extent(2) == 0) fail(pass, "x has shape ", xs, ": d_model (its last extent) must be >= 1");
  for (int d = 0; d < 3; ++d)
    if (x.extent(d) > static_cast<std::size_t>(kfa::impl::max_extent))
      fail(pass, "x has shape ", xs, ": each extent must be at most ", kfa::impl::max_extent);
  if (s.hq < 1 || s.hkv < 1)
    fail(pass, "heads_q = ", s.hq, " and heads_kv = ", s.hkv, " must both be >= 1");
  if (s.d_model % s.hq != 0)
    fail(pass, "d_model = ", s.d_model, " (x of shape ", xs,
         ") is not divisible by heads_q = ", s.hq);
  if (s.hq % s.hkv != 0) fail(pass, "heads_q = ", s.hq, " is not a multiple of heads_kv = ", s.hkv);
  s.hd = s.d_model / s.hq;
  // What kfa::forward and kfa::backward would refuse, refused here: after the QKV gemm would
  // be too late (work done, and the caller's outputs half written).
  if (s.hd > kfa::impl::max_head_dim)
    fail(pass, "head_dim = d_model / heads_q = ", s.d_model, " / ", s.hq, " = ", s.hd,
         " (x of shape ", xs, ") is more than the attention takes (", kfa::impl::max_head_dim,
         "): use more heads");
  if (p.attention.dq_mode == DqMode::symmetric && s.hq != s.hkv)
    fail(pass,
         "attention.dq_mode symmetric needs heads_q == heads_kv (no GQA), got heads_q = ", s.hq,
         ", heads_kv = ", s.hkv);
  s.width = (s.hq + 2 * s.hkv) * s.hd;
  const std::size_t d = s.d_model, width = s.width, inner = std::size_t(s.hq) * s.hd;
  expect_mat(pass, "w_qkv", w.w_qkv, d, width, "(d_model, (heads_q + 2 heads_kv) head_dim)", xs, s);
  expect_mat(pass, "w_o", w.w_o, inner, d, "(heads_q head_dim, d_model)", xs, s);
  expect_vec(pass, "b_qkv", w.b_qkv, p.qkv_bias, width, "qkv_bias", xs);
  expect_vec(pass, "b_o", w.b_o, p.out_bias, d, "out_bias", xs);
  expect_vec(pass, "gamma", w.gamma, p.residual_layer_norm, d, "residual_layer_norm", xs);
  expect_vec(pass, "beta", w.beta, p.residual_layer_norm, d, "residual_layer_norm", xs);
  return s;
}

/// Compile-time checks of a block pass's row tensors.
template <class ExecSpace, class T, class Mem, class... Rows>
constexpr void static_check_block() {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::nn: the first argument must be a Kokkos execution space");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kfa::nn: the value type must be float or double");
  static_assert((kfa::impl::is_view_of_rank<Rows, 3>::value && ...),
                "kfa::nn: x, y, dy and dx must be rank-3 Views (B, L, d_model)");
  static_assert((std::is_same_v<T, typename Rows::non_const_value_type> && ...),
                "kfa::nn: x, y, dy, dx and the weights must share one value type");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, Mem>::accessible,
                "kfa::nn: the weights must be accessible from the execution space");
  (kfa::impl::static_check_accessible<ExecSpace, Rows>(), ...);
}

/// (B, H, L, hd) strided view of the heads [head0, head0 + H) of a (B, L, W) buffer.
template <class ExecSpace, class Mem, class T>
Unmanaged<ExecSpace, Mem, T, 4, Kokkos::LayoutStride> heads_of(T* base, const MhaShape& s,
                                                               int head0, int H, int row_width) {
  const std::size_t W = row_width;
  const Kokkos::LayoutStride layout(s.B, std::size_t(s.L) * W, H, s.hd, s.L, W, s.hd, 1);
  return Unmanaged<ExecSpace, Mem, T, 4, Kokkos::LayoutStride>(
      base + static_cast<std::ptrdiff_t>(head0) * s.hd, layout);
}

template <class ExecSpace, class X, class T, class Mem, class Y>
void mha_forward(const ExecSpace& space, const X& x, const MhaWeights<T, Mem>& w, const Y& y,
                 MhaSaved<T, Mem>& saved, const MhaParams& p) {
  static_check_block<ExecSpace, T, Mem, X, Y>();
  static_assert(!std::is_const_v<typename Y::value_type>, "kfa::nn::mha_forward: y is an output");
  const char* pass = "mha_forward";
  kfa::impl::ScopedRegion region("kfa::nn::mha_forward");
  const MhaShape s = check_block(pass, x, w, p);
  kfa::impl::expect_like_x(pass, "y", y, x);
  const auto x2 = as_rows<ExecSpace, Mem>(pass, "x", x);
  if (!p.residual_layer_norm) as_rows<ExecSpace, Mem>(pass, "y", y);
  kfa::impl::validate_params<T>(pass, p.attention);
  if (p.residual_layer_norm)
    kfa::impl::validate_layer_norm_params<backends::accum_t<T>>(pass, p.ln, s.d_model, x);

  const std::size_t rows = std::size_t(s.B) * s.L;
  using Stat = typename MhaSaved<T, Mem>::stat_type;
  const auto alloc = [&](const char* label) {
    return Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                              std::string("kfa::nn::mha::") + label);
  };
  // (Re)allocation only when a shape changed, so a training loop reuses the buffers.
  if (saved.qkv.extent(0) != std::size_t(s.B) || saved.qkv.extent(1) != std::size_t(s.L) ||
      saved.qkv.extent(2) != std::size_t(s.width) || saved.z.extent(2) != std::size_t(s.d_model) ||
      saved.o.extent(2) != std::size_t(s.hq)) {
    saved.qkv = decltype(saved.qkv)(alloc("qkv"), s.B, s.L, s.width);
    saved.o = decltype(saved.o)(alloc("o"), s.B, s.L, s.hq, s.hd);
    saved.lse = decltype(saved.lse)(alloc("lse"), s.B, s.hq, s.L);
    saved.z = decltype(saved.z)(alloc("z"), s.B, s.L, s.d_model);
  }
  if (p.residual_layer_norm && saved.mean.extent(0) != rows) {
    saved.mean = Kokkos::View<Stat*, Mem>(alloc("mean"), rows);
    saved.rstd = Kokkos::View<Stat*, Mem>(alloc("rstd"), rows);
  }
  if (rows == 0) return;

  // 1. QKV = x W_qkv + b_qkv.
  const Unmanaged<ExecSpace, Mem, T, 2> qkv2(saved.qkv.data(), rows, s.width);
  fill_rows(space, qkv2, w.b_qkv);
  gemm(space, "N", "N", T(1), x2, w.w_qkv, T(1), qkv2);
  // 2-3. Attention on strided views of QKV, O written through a strided view.
  using CT = const T;
  CT* qkv = saved.qkv.data();
  const auto q = heads_of<ExecSpace, Mem, CT>(qkv, s, 0, s.hq, s.width);
  const auto k = heads_of<ExecSpace, Mem, CT>(qkv, s, s.hq, s.hkv, s.width);
  const auto v = heads_of<ExecSpace, Mem, CT>(qkv, s, s.hq + s.hkv, s.hkv, s.width);
  const auto o = heads_of<ExecSpace, Mem, T>(saved.o.data(), s, 0, s.hq, s.hq * s.hd);
  kfa::forward(space, q, k, v, o, saved.lse, p.attention);
  // 4. Z = O W_o + b_o.
  const Unmanaged<ExecSpace, Mem, CT, 2> o2(saved.o.data(), rows, std::size_t(s.hq) * s.hd);
  const Unmanaged<ExecSpace, Mem, T, 2> z2(saved.z.data(), rows, s.d_model);
  fill_rows(space, z2, w.b_o);
  gemm(space, "N", "N", T(1), o2, w.w_o, T(1), z2);
  // 5. y = layer_norm(Z + x) or Z.
  if (p.residual_layer_norm)
    kfa::layer_norm(space, saved.z, x, w.gamma, w.beta, y, saved.mean, saved.rstd, p.ln);
  else
    Kokkos::deep_copy(space, y, saved.z);
}

template <class ExecSpace, class X, class T, class Mem, class DY, class DX>
void mha_backward(const ExecSpace& space, const X& x, const MhaWeights<T, Mem>& w,
                  const MhaSaved<T, Mem>& saved, const DY& dy, const DX& dx,
                  const MhaWeights<T, Mem>& grads, const MhaParams& p) {
  static_check_block<ExecSpace, T, Mem, X, DY, DX>();
  static_assert(!std::is_const_v<typename DX::value_type>,
                "kfa::nn::mha_backward: dx is an output");
  const char* pass = "mha_backward";
  kfa::impl::ScopedRegion region("kfa::nn::mha_backward");
  const MhaShape s = check_block(pass, x, w, p);
  // The gradients have the weights' shapes (checked by the same rule).
  {
    const std::string xs = shape_of(x);
    const std::size_t d = s.d_model, width = s.width, inner = std::size_t(s.hq) * s.hd;
    expect_mat(pass, "dw_qkv", grads.w_qkv, d, width, "(d_model, (heads_q + 2 heads_kv) head_dim)",
               xs, s);
    expect_mat(pass, "dw_o", grads.w_o, inner, d, "(heads_q head_dim, d_model)", xs, s);
    expect_vec(pass, "db_qkv", grads.b_qkv, p.qkv_bias, width, "qkv_bias", xs);
    expect_vec(pass, "db_o", grads.b_o, p.out_bias, d, "out_bias", xs);
    expect_vec(pass, "dgamma", grads.gamma, p.residual_layer_norm, d, "residual_layer_norm", xs);
    expect_vec(pass, "dbeta", grads.beta, p.residual_layer_norm, d, "residual_layer_norm", xs);
  }
  kfa::impl::expect_like_x(pass, "dy", dy, x);
  kfa::impl::expect_like_x(pass, "dx", dx, x);
  const std::size_t rows = std::size_t(s.B) * s.L;
  const bool fits =
      saved.qkv.extent(0) == std::size_t(s.B) && saved.qkv.extent(1) == std::size_t(s.L) &&
      saved.qkv.extent(2) == std::size_t(s.width) && saved.z.extent(2) == std::size_t(s.d_model) &&
      saved.o.extent(2) == std::size_t(s.hq) && saved.o.extent(3) == std::size_t(s.hd) &&
      saved.lse.extent(1) == std::size_t(s.hq) &&  // head counts with the same width differ here
      (!p.residual_layer_norm || saved.mean.extent(0) == rows);
  if (!fits)
    fail(pass, "saved holds qkv of shape ", shape_of(saved.qkv), " and z of shape ",
         shape_of(saved.z), ", not the forward of x of shape ", shape_of(x),
         " with heads_q = ", s.hq, ", heads_kv = ", s.hkv,
         " (run mha_forward with these arguments first)");
  const auto x2 = as_rows<ExecSpace, Mem>(pass, "x", x);
  const auto dx2 = as_rows<ExecSpace, Mem>(pass, "dx", dx);
  if (!p.residual_layer_norm) as_rows<ExecSpace, Mem>(pass, "dy", dy);
  kfa::impl::validate_params<T>(pass, p.attention);
  if (p.residual_layer_norm)
    kfa::impl::validate_layer_norm_params<backends::accum_t<T>>(pass, p.ln, s.d_model, x);
  if (rows == 0) {  // no rows: the weight gradients are sums over nothing
    Kokkos::deep_copy(space, grads.w_qkv, T(0));
    Kokkos::deep_copy(space, grads.w_o, T(0));
    Kokkos::deep_copy(space, grads.b_qkv, T(0));
    Kokkos::deep_copy(space, grads.b_o, T(0));
    Kokkos::deep_copy(space, grads.gamma, T(0));
    Kokkos::deep_copy(space, grads.beta, T(0));
    return;
  }
  const auto alloc = [&](const char* label) {
    return Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                              std::string("kfa::nn::mha_backward::") + label);
  };
  using CT = const T;
  // dZ: through the layer norm (dL/d(Z + x), so also x's residual path), or dy itself.
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> dz;
  if (p.residual_layer_norm) {
    dz = decltype(dz)(alloc("dz"), s.B, s.L, s.d_model);
    kfa::layer_norm_backward(space, saved.z, x, w.gamma, saved.mean, saved.rstd, dy, dz,
                             grads.gamma, grads.beta, p.ln);
  }
  Unmanaged<ExecSpace, Mem, CT, 2> dz2;
  if (p.residual_layer_norm)
    dz2 = Unmanaged<ExecSpace, Mem, CT, 2>(dz.data(), rows, s.d_model);
  else
    dz2 = as_rows<ExecSpace, Mem>(pass, "dy", dy);
  // dW_o = O^T dZ, db_o = sum_rows dZ, dO = dZ W_o^T.
  const std::size_t inner = std::size_t(s.hq) * s.hd;
  const Unmanaged<ExecSpace, Mem, CT, 2> o2(saved.o.data(), rows, inner);
  gemm(space, "T", "N", T(1), o2, dz2, T(0), grads.w_o);
  if (p.out_bias) column_sums(space, dz2, grads.b_o);
  Kokkos::View<T****, Kokkos::LayoutRight, Mem> dout(alloc("do"), s.B, s.L, s.hq, s.hd);
  const Unmanaged<ExecSpace, Mem, T, 2> do2(dout.data(), rows, inner);
  gemm(space, "N", "T", T(1), dz2, w.w_o, T(0), do2);
  // dQ, dK, dV through strided views into dQKV (zeroed: every element is a gradient).
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> dqkv("kfa::nn::mha_backward::dqkv", s.B, s.L,
                                                    s.width);
  CT* qkv = saved.qkv.data();
  const auto q = heads_of<ExecSpace, Mem, CT>(qkv, s, 0, s.hq, s.width);
  const auto k = heads_of<ExecSpace, Mem, CT>(qkv, s, s.hq, s.hkv, s.width);
  const auto v = heads_of<ExecSpace, Mem, CT>(qkv, s, s.hq + s.hkv, s.hkv, s.width);
  const auto o = heads_of<ExecSpace, Mem, CT>(saved.o.data(), s, 0, s.hq, s.hq * s.hd);
  const auto do4 = heads_of<ExecSpace, Mem, CT>(dout.data(), s, 0, s.hq, s.hq * s.hd);
  const auto dq = heads_of<ExecSpace, Mem, T>(dqkv.data(), s, 0, s.hq, s.width);
  const auto dk = heads_of<ExecSpace, Mem, T>(dqkv.data(), s, s.hq, s.hkv, s.width);
  const auto dv = heads_of<ExecSpace, Mem, T>(dqkv.data(), s, s.hq + s.hkv, s.hkv, s.width);
  const typename MhaSaved<T, Mem>::stat_type* lse_data = saved.lse.data();
  const Kokkos::View<const typename MhaSaved<T, Mem>::stat_type***, Kokkos::LayoutRight, Mem,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      lse(lse_data, s.B, s.hq, s.L);
  kfa::backward(space, q, k, v, o, lse, do4, dq, dk, dv, p.attention);
  // dW_qkv = x^T dQKV, db_qkv = sum_rows dQKV, dx = dQKV W_qkv^T (+ dZ, x's residual path).
  const Unmanaged<ExecSpace, Mem, CT, 2> dqkv2(dqkv.data(), rows, s.width);
  gemm(space, "T", "N", T(1), x2, dqkv2, T(0), grads.w_qkv);
  if (p.qkv_bias) column_sums(space, dqkv2, grads.b_qkv);
  if (p.residual_layer_norm) Kokkos::deep_copy(space, dx2, dz2);
  gemm(space, "N", "T", T(1), dqkv2, w.w_qkv, p.residual_layer_norm ? T(1) : T(0), dx2);
}

/// Compile-time checks of the FFN's matrices (Mats) and vectors (Vecs).
template <class ExecSpace, class T, class... Views>
constexpr void static_check_ffn() {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::nn: the first argument must be a Kokkos execution space");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kfa::nn: the value type must be float or double");
  static_assert((std::is_same_v<T, typename Views::non_const_value_type> && ...),
                "kfa::nn::ffn: every View must have the value type of x");
  (kfa::impl::static_check_accessible<ExecSpace, Views>(), ...);
}

/// The FFN's shapes: x (rows, D), w1 (D, F), b1 (F), w2 (F, D), b2 (D).
template <class X, class W1, class B1, class W2, class B2>
void check_ffn(const char* pass, const X& x, const W1& w1, const B1& b1, const W2& w2,
               const B2& b2) {
  static_assert(kfa::impl::is_view_of_rank<X, 2>::value &&
                    kfa::impl::is_view_of_rank<W1, 2>::value &&
                    kfa::impl::is_view_of_rank<W2, 2>::value,
                "kfa::nn::ffn: x, y, w1, w2, h and their gradients must be rank-2 Views");
  static_assert(
      kfa::impl::is_view_of_rank<B1, 1>::value && kfa::impl::is_view_of_rank<B2, 1>::value,
      "kfa::nn::ffn: b1, b2 and their gradients must be rank-1 Views");
  const std::size_t D = x.extent(1), F = w1.extent(1);
  if (D == 0) fail(pass, "x has shape ", shape_of(x), ": D (its last extent) must be >= 1");
  if (w1.extent(0) != D || F == 0)
    fail(pass, "w1 has shape ", shape_of(w1), " but must be (D, F) with F >= 1 for x of shape ",
         shape_of(x));
  if (b1.extent(0) != F)
    fail(pass, "b1 has shape ", shape_of(b1), " but must be (", F, ") for w1 of shape ",
         shape_of(w1));
  if (w2.extent(0) != F || w2.extent(1) != D)
    fail(pass, "w2 has shape ", shape_of(w2), " but must be (", F, ", ", D, ") for w1 of shape ",
         shape_of(w1), " and x of shape ", shape_of(x));
  if (b2.extent(0) != D)
    fail(pass, "b2 has shape ", shape_of(b2), " but must be (", D, ") for x of shape ",
         shape_of(x));
}

/// A rank-2 view must be (rows, cols) like `ref`.
template <class V>
void expect_2d(const char* pass, const char* name, const V& v, std::size_t rows, std::size_t cols,
               const char* ref_name, const std::string& ref_shape) {
  if (v.extent(0) != rows || v.extent(1) != cols)
    fail(pass, name, " has shape ", shape_of(v), " but must be (", rows, ", ", cols, ") for ",
         ref_name, " of shape ", ref_shape);
}

/// m(r, c) = max(0, m(r, c)) when relu, else m(r, c) = h(r, c) > 0 ? m(r, c) : 0 (the ReLU's
/// derivative applied to a gradient).
template <class ExecSpace, class M, class H>
void relu_rows(const ExecSpace& space, const M& m, const H& h, bool relu) {
  using T = typename M::non_const_value_type;
  Kokkos::parallel_for(
      "kfa::nn::relu",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(
          space, {0, 0}, {static_cast<long>(m.extent(0)), static_cast<long>(m.extent(1))}),
      KOKKOS_LAMBDA(long r, long c) {
        if (relu)
          m(r, c) = h(r, c) > T(0) ? h(r, c) : T(0);
        else if (!(h(r, c) > T(0)))
          m(r, c) = T(0);
      });
}

template <class ExecSpace, class X, class W1, class B1, class W2, class B2, class Y, class H>
void ffn_forward(const ExecSpace& space, const X& x, const W1& w1, const B1& b1, const W2& w2,
                 const B2& b2, const Y& y, const H& h) {
  using T = typename X::non_const_value_type;
  static_check_ffn<ExecSpace, T, X, W1, B1, W2, B2, Y, H>();
  const char* pass = "ffn_forward";
  kfa::impl::ScopedRegion region("kfa::nn::ffn_forward");
  check_ffn(pass, x, w1, b1, w2, b2);
  const std::size_t rows = x.extent(0), D = x.extent(1), F = w1.extent(1);
  expect_2d(pass, "y", y, rows, D, "x", shape_of(x));
  expect_2d(pass, "h", h, rows, F, "x W1",
            "(" + std::to_string(rows) + ", " + std::to_string(F) + ")");
  if (rows == 0) return;
  fill_rows(space, h, b1);
  gemm(space, "N", "N", T(1), x, w1, T(1), h);
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::Device<ExecSpace, typename H::memory_space>> a(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("kfa::nn::ffn::relu")),
      rows, F);
  relu_rows(space, a, h, true);
  fill_rows(space, y, b2);
  gemm(space, "N", "N", T(1), a, w2, T(1), y);
}

template <class ExecSpace, class X, class W1, class W2, class H, class DY, class DX, class DW1,
          class DB1, class DW2, class DB2>
void ffn_backward(const ExecSpace& space, const X& x, const W1& w1, const W2& w2, const H& h,
                  const DY& dy, const DX& dx, const DW1& dw1, const DB1& db1, const DW2& dw2,
                  const DB2& db2) {
  using T = typename X::non_const_value_type;
  static_check_ffn<ExecSpace, T, X, W1, W2, H, DY, DX, DW1, DB1, DW2, DB2>();
  const char* pass = "ffn_backward";
  kfa::impl::ScopedRegion region("kfa::nn::ffn_backward");
  check_ffn(pass, x, w1, db1, w2, db2);
  const std::size_t rows = x.extent(0), D = x.extent(1), F = w1.extent(1);
  expect_2d(pass, "h", h, rows, F, "x W1",
            "(" + std::to_string(rows) + ", " + std::to_string(F) + ")");
  expect_2d(pass, "dy", dy, rows, D, "x", shape_of(x));
  expect_2d(pass, "dx", dx, rows, D, "x", shape_of(x));
  expect_2d(pass, "dw1", dw1, D, F, "w1", shape_of(w1));
  expect_2d(pass, "dw2", dw2, F, D, "w2", shape_of(w2));
  if (rows == 0) {
    Kokkos::deep_copy(space, dw1, T(0));
    Kokkos::deep_copy(space, dw2, T(0));
    Kokkos::deep_copy(space, db1, T(0));
    Kokkos::deep_copy(space, db2, T(0));
    return;
  }
  // One (rows, F) buffer: relu(H) for dW2, then dA = (dy W2^T) o 1[H > 0].
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::Device<ExecSpace, typename H::memory_space>> a(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("kfa::nn::ffn::grad")),
      rows, F);
  relu_rows(space, a, h, true);
  gemm(space, "T", "N", T(1), a, dy, T(0), dw2);
  column_sums(space, dy, db2);
  gemm(space, "N", "T", T(1), dy, w2, T(0), a);
  relu_rows(space, a, h, false);
  gemm(space, "T", "N", T(1), x, a, T(0), dw1);
  column_sums(space, a, db1);
  gemm(space, "N", "T", T(1), a, w1, T(0), dx);
}

}  // namespace kfa::nn::impl

namespace kfa::nn {

/// Forward of the multi-head attention block on `space` (the file comment has the steps).
///
/// \param space execution space of the kernels and gemms (asynchronous: fence before reading).
/// \param x     (B, L, d_model), float or double, stored row-major without gaps.
/// \param w     the weights, of x's value type, shaped for d_model and p (MhaWeights).
/// \param y     output like x (row-major without gaps unless p.residual_layer_norm).
/// \param saved output: what mha_backward needs; allocated here when its shapes do not fit.
/// \param p     head counts, attention options, biases and the layer norm.
/// \throws kfa::Error on the host, before any launch: d_model not divisible by heads_q,
///         heads_q not a multiple of heads_kv, head_dim = d_model / heads_q over 256,
///         p.attention.dq_mode symmetric with heads_kv < heads_q, a weight whose shape does not fit
///         x and the head counts (both shapes named), a vector p switches off that is not empty,
///         and whatever kfa::forward and kfa::layer_norm reject.
template <class ExecSpace, class X, class T, class Mem, class Y>
void mha_forward(const ExecSpace& space, const X& x, const MhaWeights<T, Mem>& w, const Y& y,
                 MhaSaved<T, Mem>& saved, const MhaParams& p) {
  impl::mha_forward(space, x, w, y, saved, p);
}

/// Backward of the multi-head attention block on `space`: from dy = dL/dy, dx and the gradient
/// of every weight; the attention's by kfa::backward (p.attention.dq_mode and deterministic
/// apply), the bias and layer-norm sums without atomics.
///
/// \param space, x, w, p as given to mha_forward.
/// \param saved the forward's.
/// \param dy    like x.
/// \param dx    output like x, row-major without gaps.
/// \param grads outputs: every view of MhaWeights with the shape of its weight (overwritten).
/// \throws kfa::Error as mha_forward, and for gradients or a saved state that do not fit.
template <class ExecSpace, class X, class T, class Mem, class DY, class DX>
void mha_backward(const ExecSpace& space, const X& x, const MhaWeights<T, Mem>& w,
                  const MhaSaved<T, Mem>& saved, const DY& dy, const DX& dx,
                  const MhaWeights<T, Mem>& grads, const MhaParams& p) {
  impl::mha_backward(space, x, w, saved, dy, dx, grads, p);
}

/// FFN forward on `space`: h = x W1 + b1 (saved for the backward), y = max(0, h) W2 + b2.
///
/// \param space execution space of the kernels and gemms (asynchronous: fence before reading).
/// \param x     (rows, D), float or double, any layout KokkosBlas::gemm takes.
/// \param w1, b1 (D, F) and (F): the first linear (usually F = 4 D).
/// \param w2, b2 (F, D) and (D): the second linear.
/// \param y     output (rows, D).
/// \param h     output (rows, F): the pre-activation, for ffn_backward.
/// \throws kfa::Error on the host, before any launch, for shapes that do not fit (both named).
template <class ExecSpace, class X, class W1, class B1, class W2, class B2, class Y, class H>
void ffn_forward(const ExecSpace& space, const X& x, const W1& w1, const B1& b1, const W2& w2,
                 const B2& b2, const Y& y, const H& h) {
  impl::ffn_forward(space, x, w1, b1, w2, b2, y, h);
}

/// FFN backward on `space`: dW2 = relu(h)^T dy, db2 = sum_rows dy, dA = (dy W2^T) o 1[h > 0],
/// dW1 = x^T dA, db1 = sum_rows dA, dx = dA W1^T; the bias sums in row order, without atomics.
///
/// \param space, x, w1, w2 as given to ffn_forward.
/// \param h     ffn_forward's saved pre-activation (rows, F).
/// \param dy    (rows, D).
/// \param dx    output (rows, D).
/// \param dw1, db1, dw2, db2 outputs shaped as w1, b1, w2, b2 (overwritten).
/// \throws kfa::Error on the host, before any launch, for shapes that do not fit.
template <class ExecSpace, class X, class W1, class W2, class H, class DY, class DX, class DW1,
          class DB1, class DW2, class DB2>
void ffn_backward(const ExecSpace& space, const X& x, const W1& w1, const W2& w2, const H& h,
                  const DY& dy, const DX& dx, const DW1& dw1, const DB1& db1, const DW2& dw2,
                  const DB2& db2) {
  impl::ffn_backward(space, x, w1, w2, h, dy, dx, dw1, db1, dw2, db2);
}

}  // namespace kfa::nn
