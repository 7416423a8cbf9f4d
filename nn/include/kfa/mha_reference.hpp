#pragma once
/// \file mha_reference.hpp
/// The naive multi-head attention block kfa::nn::mha_forward and mha_backward are checked
/// against (test_mha, `kfa mha --check`), and the tolerance rule applied to each of its outputs.
///
/// Host only, step by step from the block's definition: the linears are plain triple loops,
/// the heads are copied out of the QKV matrix into (B, H, L, hd) tensors and back, the
/// attention is kfa::reference::forward/backward and the residual layer norm
/// kfa::reference::layer_norm/layer_norm_backward. It shares no code with kfa/mha.hpp or
/// KokkosBlas, so comparing with it tests something the block did not compute. Run in double
/// it is the oracle; run in float it is the naive computation that sets float's tolerance.

#include <kfa/params.hpp>
#include <kfa/reference.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfa::reference {

/// The block's options, as the reference reads them (the fields of kfa::nn::MhaParams that
/// change the result; the biases are on when their tensors are not empty).
struct MhaSpec {
  int batch = 1;                     ///< B
  int seqlen = 1;                    ///< L
  int heads_q = 1;                   ///< Hq; head_dim = d_model / Hq
  int heads_kv = 1;                  ///< Hkv (grouped-query attention when < Hq)
  Params attention;                  ///< the attention's options
  bool residual_layer_norm = false;  ///< y = layer_norm(Z + x) instead of Z
  double eps = 1e-5;                 ///< the layer norm's eps
  bool unbiased = false;             ///< the layer norm's variance divides by D - 1
};

/// The block's inputs as host matrices: x and dy (B L, d_model), w_qkv (d_model,
/// (Hq + 2 Hkv) hd), w_o (Hq hd, d_model); b_qkv, b_o, gamma, beta vectors, empty when off.
/// dy may be empty for a forward alone.
struct MhaTensors {
  Tensor2 x;      ///< (B L, d_model)
  Tensor2 dy;     ///< (B L, d_model), or empty for a forward alone
  Tensor2 w_qkv;  ///< (d_model, (Hq + 2 Hkv) hd)
  Tensor2 w_o;    ///< (Hq hd, d_model)
  Tensor1 b_qkv;  ///< ((Hq + 2 Hkv) hd), or empty: no QKV bias
  Tensor1 b_o;    ///< (d_model), or empty: no output bias
  Tensor1 gamma;  ///< (d_model) with the residual layer norm, else empty
  Tensor1 beta;   ///< (d_model) with the residual layer norm, else empty
};

/// The block's output and gradients; a gradient the block has no parameter for is empty, and
/// so is every gradient of a forward alone.
struct MhaResult {
  Tensor2 y;       ///< (B L, d_model)
  Tensor2 dx;      ///< (B L, d_model)
  Tensor2 dw_qkv;  ///< like w_qkv
  Tensor2 dw_o;    ///< like w_o
  Tensor1 db_qkv;  ///< like b_qkv
  Tensor1 db_o;    ///< like b_o
  Tensor1 dgamma;  ///< like gamma
  Tensor1 dbeta;   ///< like beta
};

namespace mha_detail {

/// op(A) op(B) (+ bias) in T, each element accumulated in T and rounded to T, stored as double.
template <class T>
Tensor2 matmul(const Tensor2& a, bool ta, const Tensor2& b, bool tb, const Tensor1& bias = {}) {
  const int m = ta ? a.extent(1) : a.extent(0), k = ta ? a.extent(0) : a.extent(1);
  const int n = tb ? b.extent(0) : b.extent(1);
  Tensor2 c("kfa::ref::matmul", m, n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      T s = bias.span() > 0 ? static_cast<T>(bias(j)) : T(0);
      for (int l = 0; l < k; ++l)
        s += static_cast<T>(ta ? a(l, i) : a(i, l)) * static_cast<T>(tb ? b(j, l) : b(l, j));
      c(i, j) = double(s);
    }
  return c;
}

/// The column sums of m in T, in row order.
template <class T>
Tensor1 colsum(const Tensor2& m) {
  Tensor1 out("kfa::ref::colsum", m.extent(1));
  for (int j = 0; j < int(m.extent(1)); ++j) {
    T s = 0;
    for (int r = 0; r < int(m.extent(0)); ++r)
      s += static_cast<T>(m(r, j));
    out(j) = double(s);
  }
  return out;
}

/// The heads [h0, h0 + H) of a (B L, W) matrix as a (B, H, L, hd) tensor.
inline Tensor4 heads(const Tensor2& m, int B, int L, int h0, int H, int hd) {
  Tensor4 t("kfa::ref::heads", B, H, L, hd);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l)
        for (int e = 0; e < hd; ++e)
          t(b, h, l, e) = m(std::size_t(b) * L + l, std::size_t(h0 + h) * hd + e);
  return t;
}

/// A (B, H, L, hd) tensor written back as the heads [h0, h0 + H) of a (B L, W) matrix.
inline void unheads(const Tensor4& t, const Tensor2& m, int h0) {
  const int B = t.extent(0), H = t.extent(1), L = t.extent(2), hd = t.extent(3);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l)
        for (int e = 0; e < hd; ++e)
          m(std::size_t(b) * L + l, std::size_t(h0 + h) * hd + e) = t(b, h, l, e);
}

}  // namespace mha_detail

/// The block in precision T (double: the oracle) from double inputs, stored as double:
/// QKV = x W_qkv + b_qkv; Q, K, V its heads; O = attention(Q, K, V) (keep: the dropout
/// keep-mask, needed only with attention.dropout > 0); Z = O W_o + b_o; y = layer_norm(Z + x)
/// or Z. With `backward` (in.dy given), the chain rule back through every step: dx and the
/// gradient of every weight the block has.
template <class T>
MhaResult mha(const MhaSpec& s, const MhaTensors& in, const Keep4& keep, bool backward) {
  using mha_detail::heads;
  using mha_detail::matmul;
  using mha_detail::unheads;
  const int B = s.batch, L = s.seqlen, d = in.x.extent(1), hq = s.heads_q, hkv = s.heads_kv;
  const int hd = d / hq, rows = B * L, width = (hq + 2 * hkv) * hd;
  const Params& ap = s.attention;
  const Tensor2 qkv = matmul<T>(in.x, false, in.w_qkv, false, in.b_qkv);
  const Tensor4 q = heads(qkv, B, L, 0, hq, hd), k = heads(qkv, B, L, hq, hkv, hd),
                v = heads(qkv, B, L, hq + hkv, hkv, hd);
  Tensor4 o("kfa::ref::o", B, hq, L, hd);
  Tensor3 lse("kfa::ref::lse", B, hq, L);
  forward<T>(q, k, v, ap, o, lse, keep);
  Tensor2 o2("kfa::ref::o2", rows, std::size_t(hq) * hd);
  unheads(o, o2, 0);
  const Tensor2 z = matmul<T>(o2, false, in.w_o, false, in.b_o);
  MhaResult r;
  if (s.residual_layer_norm) {
    r.y = Tensor2("kfa::ref::y", rows, d);
    Tensor1 mean("kfa::ref::mean", rows), rstd("kfa::ref::rstd", rows);
    layer_norm<T>(z, in.x, in.gamma, in.beta, s.eps, s.unbiased, r.y, mean, rstd);
  } else {
    r.y = z;
  }
  if (!backward) return r;
  Tensor2 dz = in.dy;
  if (s.residual_layer_norm) {
    dz = Tensor2("kfa::ref::dz", rows, d);
    r.dgamma = Tensor1("kfa::ref::dgamma", d);
    r.dbeta = Tensor1("kfa::ref::dbeta", d);
    layer_norm_backward<T>(z, in.x, in.gamma, s.eps, s.unbiased, in.dy, dz, r.dgamma, r.dbeta);
  }
  r.dw_o = matmul<T>(o2, true, dz, false);
  if (in.b_o.span() > 0) r.db_o = mha_detail::colsum<T>(dz);
  const Tensor4 dout = heads(matmul<T>(dz, false, in.w_o, true), B, L, 0, hq, hd);
  Tensor4 dq("kfa::ref::dq", B, hq, L, hd), dk("kfa::ref::dk", B, hkv, L, hd),
      dv("kfa::ref::dv", B, hkv, L, hd);
  kfa::reference::backward<T>(q, k, v, ap, dout, Tensor3(), dq, dk, dv, keep);
  Tensor2 dqkv("kfa::ref::dqkv", rows, width);
  unheads(dq, dqkv, 0);
  unheads(dk, dqkv, hq);
  unheads(dv, dqkv, hq + hkv);
  r.dw_qkv = matmul<T>(in.x, true, dqkv, false);
  if (in.b_qkv.span() > 0) r.db_qkv = mha_detail::colsum<T>(dqkv);
  r.dx = matmul<T>(dqkv, false, in.w_qkv, true);
  if (s.residual_layer_norm)  // x is also the residual: its gradient adds dz
    for (std::size_t e = 0; e < r.dx.span(); ++e)
      r.dx.data()[e] = double(static_cast<T>(r.dx.data()[e]) + static_cast<T>(dz.data()[e]));
  return r;
}

/// The tolerance rule (docs/testing.md) on every output of `got` that is not empty (y, dx,
/// dw_qkv, dw_o, db_qkv, db_o, dgamma, dbeta, in that order), computed in precision T by the
/// code under test, against mha<double> and, for float, mha<T> as the naive computation.
/// Returns (name, check) pairs.
template <class T>
std::vector<std::pair<std::string, Check>> mha_check(const MhaSpec& s, const MhaTensors& in,
                                                     const MhaResult& got, const Keep4& keep) {
  const bool backward = got.dx.span() > 0;
  const MhaResult ref = mha<double>(s, in, keep, backward);
  const MhaResult naive = std::is_same_v<T, double> ? ref : mha<T>(s, in, keep, backward);
  std::vector<std::pair<std::string, Check>> out;
  const auto rule = [&](const char* name, const auto& g, const auto& n, const auto& r) {
    if (g.span() > 0) out.emplace_back(name, apply_rule<T>(g, n, r));
  };
  rule("y", got.y, naive.y, ref.y);
  rule("dx", got.dx, naive.dx, ref.dx);
  rule("dw_qkv", got.dw_qkv, naive.dw_qkv, ref.dw_qkv);
  rule("dw_o", got.dw_o, naive.dw_o, ref.dw_o);
  rule("db_qkv", got.db_qkv, naive.db_qkv, ref.db_qkv);
  rule("db_o", got.db_o, naive.db_o, ref.db_o);
  rule("dgamma", got.dgamma, naive.dgamma, ref.dgamma);
  rule("dbeta", got.dbeta, naive.dbeta, ref.dbeta);
  return out;
}

}  // namespace kfa::reference
