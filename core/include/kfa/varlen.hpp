#pragma once
/// \file varlen.hpp
/// kfa::varlen: attention over a batch of sequences of different lengths packed without
/// padding, flash-attn's varlen interface (flash_attn_varlen_func).
///
/// Sequence s holds the query rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of the packed q and
/// the key rows [cu_seqlens_k[s], cu_seqlens_k[s + 1]) of the packed k and v, and is its own
/// attention problem: every option of kfa::Params (causal and window masks aligned to that
/// sequence's lengths, softcap, GQA, dropout, the dQ modes) applies to it as to batch element s
/// of a padded call whose lengths are the sequence's own. Dropout uses batch index s and the
/// positions within the sequence, so the keep-mask of sequence s is element s of the padded
/// batch's (kfa::dropout_mask on (B, heads_q, max seqlen_q, max seqlen_k)).
///
/// Each sequence runs as a batch of one on strided views of the packed arrays: the kernels of
/// kfa::forward and kfa::backward unchanged, with no padded rows computed or stored. That costs
/// one launch (forward) or a few (backward) per sequence. On a host space it is nothing next to
/// the work; on a GPU each launch costs some microseconds and a short sequence fills few
/// multiprocessors (one team per (head, query tile)), so a batch of many short sequences runs
/// below the device's throughput, where one launch over (sequence, head, tile) would not.

#include <kfa/backward.hpp>
#include <kfa/forward.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace kfa::varlen {

namespace detail {

/// Rows [begin, begin + n) of a packed (total, heads, head_dim) tensor as the (1, heads, n,
/// head_dim) tensor of a batch of one; n = 0 gives an empty view.
template <class V3>
auto rows(const V3& v, std::size_t begin, std::size_t n) {
  using View = Kokkos::View<typename V3::value_type****, Kokkos::LayoutStride,
                            typename V3::device_type, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const std::size_t s0 = v.stride(0), s1 = v.stride(1), s2 = v.stride(2);
  return View(v.data() + begin * s0,
              Kokkos::LayoutStride(1, n * s0, v.extent(1), s1, n, s0, v.extent(2), s2));
}

/// Columns [begin, begin + n) of a (heads, total) LSE as the (1, heads, n) LSE of a batch of one.
template <class V2>
auto lse_rows(const V2& v, std::size_t begin, std::size_t n) {
  using View = Kokkos::View<typename V2::value_type***, Kokkos::LayoutStride,
                            typename V2::device_type, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const std::size_t s0 = v.stride(0), s1 = v.stride(1);
  return View(v.data() + begin * s1,
              Kokkos::LayoutStride(1, v.extent(0) * s0, v.extent(0), s0, n, s1));
}

/// Sets rows [begin, begin + n) of a packed (total, heads, head_dim) tensor, or columns
/// [begin, begin + n) of a (heads, total) LSE, to x (Kokkos' deep_copy of a scalar takes no
/// strided view on every Kokkos version kfa builds with).
template <class ExecSpace, class View>
void fill(const ExecSpace& space, const View& v, std::size_t begin, std::size_t n,
          typename View::non_const_value_type x) {
  const bool rows_first = View::rank == 3;
  const std::size_t inner = rows_first ? v.extent(1) * v.extent(2) : v.extent(0);
  if (n == 0 || inner == 0) return;
  Kokkos::parallel_for(
      "kfa::varlen::fill",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::size_t>>(space, 0, n * inner),
      KOKKOS_LAMBDA(std::size_t e) {
        // Every capture is named before the constexpr-if: nvcc refuses an extended lambda's
        // first capture of a variable inside one.
        const View& w = v;
        const std::size_t r0 = begin, m = inner;
        const auto value = x;
        if constexpr (View::rank == 3) {
          const std::size_t r = r0 + e / m, c = e % m;
          w(r, c / w.extent(2), c % w.extent(2)) = value;
        } else {
          w(e % m, r0 + e / m) = value;
        }
      });
}

template <class View>
constexpr void static_check_packed() {
  static_assert(Kokkos::is_view<View>::value && View::rank == 3,
                "kfa::varlen: q, k, v, o (and dout, dq, dk, dv) must be rank-3 Views (total, "
                "heads, head_dim)");
}

template <class Cu>
constexpr void static_check_cu() {
  static_assert(Kokkos::is_view<Cu>::value && Cu::rank == 1 &&
                    std::is_same_v<typename Cu::non_const_value_type, std::int32_t>,
                "kfa::varlen: cu_seqlens_q and cu_seqlens_k must be rank-1 Views of std::int32_t "
                "(batch + 1 offsets)");
}

template <class Lse>
constexpr void static_check_lse() {
  static_assert(Kokkos::is_view<Lse>::value && Lse::rank == 2,
                "kfa::varlen: lse (and dlse) must be rank-2 Views (heads_q, total_q)");
}

/// Host copy of offsets `name`, checked: batch + 1 entries from 0 to `total`, non-decreasing.
template <class Cu>
std::vector<std::int32_t> offsets(const char* pass, const char* name, const Cu& cu,
                                  std::size_t total, const char* total_name) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cu);
  const std::size_t n = host.extent(0);
  if (n == 0) impl::fail(pass, name, " is empty; it needs batch + 1 offsets, starting with 0");
  std::vector<std::int32_t> c(n);
  for (std::size_t s = 0; s < n; ++s)
    c[s] = host(s);
  if (c[0] != 0) impl::fail(pass, name, "[0] = ", c[0], ", must be 0");
  for (std::size_t s = 1; s < n; ++s)
    if (c[s] < c[s - 1])
      impl::fail(pass, name, "[", s, "] = ", c[s], " is less than ", name, "[", s - 1,
                 "] = ", c[s - 1], "; offsets must be non-decreasing");
  if (static_cast<std::size_t>(c[n - 1]) != total)
    impl::fail(pass, name, "[", n - 1, "] = ", c[n - 1], " (the last entry) must equal ",
               total_name, " = ", total);
  return c;
}

/// Both offset arrays, checked and of one batch.
template <class CuQ, class CuK>
void sequences(const char* pass, const CuQ& cu_q, const CuK& cu_k, std::size_t total_q,
               std::size_t total_k, std::vector<std::int32_t>& cq, std::vector<std::int32_t>& ck) {
  cq = offsets(pass, "cu_seqlens_q", cu_q, total_q, "total_q (q.extent(0))");
  ck = offsets(pass, "cu_seqlens_k", cu_k, total_k, "total_k (k.extent(0))");
  if (cq.size() != ck.size())
    impl::fail(pass, "cu_seqlens_q has ", cq.size(), " entries but cu_seqlens_k has ", ck.size(),
               "; both need batch + 1");
}

/// Rows of sequence s in the offsets c.
inline std::size_t len(const std::vector<std::int32_t>& c, std::size_t s) {
  return static_cast<std::size_t>(c[s + 1] - c[s]);
}

}  // namespace detail

/// Forward pass over packed sequences, on `space` (asynchronously, as kfa::forward).
///
/// \param space  the execution space instance the kernels run on.
/// \param q      (total_q, heads_q, head_dim): the queries of every sequence, one after another.
/// \param k      (total_k, heads_k, head_dim); heads_q a multiple of heads_k (GQA).
/// \param v      (total_k, heads_k, head_dim_v): v's head dim Dv may differ from q's and k's.
/// \param cu_seqlens_q, cu_seqlens_k  batch + 1 offsets each, std::int32_t, any memory space
///               (read on the host before any launch): sequence s has the query rows
///               [cu_seqlens_q[s], cu_seqlens_q[s+1]) and the key rows [cu_seqlens_k[s],
///               cu_seqlens_k[s+1]). A length may be 0; a sequence without keys gets o = 0,
///               lse = -inf.
/// \param o      output (total_q, heads_q, head_dim_v).
/// \param lse    output (heads_q, total_q), flash-attn's varlen softmax_lse layout.
/// \param params as for kfa::forward; masks align to each sequence's own lengths.
/// Every tensor needs a unit head_dim stride (LayoutRight packed arrays have it).
/// \throws kfa::Error before any launch for what kfa::forward refuses, offsets that do not run
///         non-decreasing from 0 to total (naming the array and the entry), or offset arrays of
///         different lengths.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const CuQ& cu_seqlens_q,
             const CuK& cu_seqlens_k, const O& o, const Lse& lse, const Params& params = {}) {
  detail::static_check_packed<Q>();
  detail::static_check_packed<K>();
  detail::static_check_packed<V>();
  detail::static_check_packed<O>();
  detail::static_check_lse<Lse>();
  detail::static_check_cu<CuQ>();
  detail::static_check_cu<CuK>();
  using namespace detail;
  using R4 = decltype(rows(q, 0, 0));
  using L3 = decltype(lse_rows(lse, 0, 0));
  impl::static_check_pass<ExecSpace, true, L3>(
      impl::Inputs<R4, decltype(rows(k, 0, 0)), decltype(rows(v, 0, 0))>{},
      impl::Outputs<decltype(rows(o, 0, 0))>{});
  const char* pass = "varlen::forward";
  impl::validate_params<typename Q::non_const_value_type>(pass, params);
  const std::size_t tq = q.extent(0), tk = k.extent(0);
  impl::validate_forward(pass, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                         lse_rows(lse, 0, tq));
  std::vector<std::int32_t> cq, ck;
  sequences(pass, cu_seqlens_q, cu_seqlens_k, tq, tk, cq, ck);

  using LseT = typename Lse::non_const_value_type;
  for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
    const std::size_t nq = len(cq, s), nk = len(ck, s);
    if (nq == 0) continue;
    if (nk == 0) {  // no key: o = 0, lse = -inf, as for a fully masked row
      fill(space, o, cq[s], nq, typename O::non_const_value_type(0.0f));
      fill(space, lse, cq[s], nq, -std::numeric_limits<LseT>::infinity());
      continue;
    }
    impl::Origin at;
    at.b = static_cast<long long>(s);
    impl::forward(space, rows(q, cq[s], nq), rows(k, ck[s], nk), rows(v, ck[s], nk),
                  rows(o, cq[s], nq), lse_rows(lse, cq[s], nq), params, at);
  }
}

namespace detail {

/// Both backward overloads: dlse may be nullptr.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class CuQ, class CuK, class DQ, class DK, class DV>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const CuQ& cu_q, const CuK& cu_k,
              const DQ& dq, const DK& dk, const DV& dv, const Params& params) {
  static_check_packed<Q>();
  static_check_packed<K>();
  static_check_packed<V>();
  static_check_packed<O>();
  static_check_packed<DO>();
  static_check_packed<DQ>();
  static_check_packed<DK>();
  static_check_packed<DV>();
  static_check_lse<Lse>();
  static_check_lse<DLse>();
  static_check_cu<CuQ>();
  static_check_cu<CuK>();
  const char* pass = "varlen::backward";
  impl::validate_params<typename Q::non_const_value_type>(pass, params);
  const std::size_t tq = q.extent(0), tk = k.extent(0);
  const auto dl = dlse ? lse_rows(*dlse, 0, tq) : decltype(lse_rows(*dlse, 0, 0))();
  impl::validate_backward(pass, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                          lse_rows(lse, 0, tq), rows(dout, 0, tq), dlse ? &dl : nullptr,
                          rows(dq, 0, tq), rows(dk, 0, tk), rows(dv, 0, tk));
  std::vector<std::int32_t> cq, ck;
  sequences(pass, cu_q, cu_k, tq, tk, cq, ck);
  // The symmetric pass needs self-attention in every sequence: refuse before any launch.
  if (impl::dq_mode_of<ExecSpace>(params) == DqMode::symmetric)
    for (std::size_t s = 0; s + 1 < cq.size(); ++s)
      if (len(cq, s) != len(ck, s) || q.extent(1) != k.extent(1))
        impl::fail(pass,
                   "dq_mode symmetric needs self-attention (seqlen_q == seqlen_k, heads_q "
                   "== heads_k) in every sequence; sequence ",
                   s, " has seqlen_q = ", len(cq, s), ", seqlen_k = ", len(ck, s),
                   ", heads_q = ", q.extent(1), ", heads_k = ", k.extent(1));

  for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
    const std::size_t nq = len(cq, s), nk = len(ck, s);
    // A sequence without queries gives its keys no gradient, one without keys its queries none.
    if (nq == 0 || nk == 0) {
      fill(space, dq, cq[s], nq, typename DQ::non_const_value_type(0.0f));
      fill(space, dk, ck[s], nk, typename DK::non_const_value_type(0.0f));
      fill(space, dv, ck[s], nk, typename DV::non_const_value_type(0.0f));
      continue;
    }
    impl::Origin at;
    at.b = static_cast<long long>(s);
    const auto qs = rows(q, cq[s], nq);
    const auto ls = lse_rows(lse, cq[s], nq);
    const auto dls = dlse ? lse_rows(*dlse, cq[s], nq) : decltype(lse_rows(*dlse, 0, 0))();
    impl::backward(space, qs, rows(k, ck[s], nk), rows(v, ck[s], nk), rows(o, cq[s], nq), ls,
                   rows(dout, cq[s], nq), dlse ? &dls : static_cast<const decltype(dls)*>(nullptr),
                   rows(dq, cq[s], nq), rows(dk, ck[s], nk), rows(dv, ck[s], nk), params, at);
  }
}

}  // namespace detail

/// Backward pass over packed sequences (as kfa::backward, sequence by sequence).
///
/// \param space  the execution space instance the kernels run on.
/// \param q, k, v, cu_seqlens_q, cu_seqlens_k, params  as given to kfa::varlen::forward.
/// \param o, lse  the forward's outputs, (total_q, heads_q, head_dim_v) and (heads_q, total_q).
/// \param dout    gradient with respect to o, like o.
/// \param dq, dk, dv  outputs like q, k, v; dk and dv summed over each group's query heads.
/// \throws kfa::Error before any launch, as kfa::varlen::forward and kfa::backward do, and for
///         dq_mode symmetric when some sequence is not self-attention.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class CuQ,
          class CuK, class DQ, class DK, class DV,
          std::enable_if_t<impl::is_view_of_rank<DQ, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
              const DQ& dq, const DK& dk, const DV& dv, const Params& params = {}) {
  detail::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), cu_seqlens_q,
                   cu_seqlens_k, dq, dk, dv, params);
}

/// Backward pass over packed sequences with the gradient through the LSE (as the overload
/// above, plus dlse).
///
/// \param space  the execution space instance the kernels run on.
/// \param q, k, v, cu_seqlens_q, cu_seqlens_k, params  as given to kfa::varlen::forward.
/// \param o, lse  the forward's outputs, (total_q, heads_q, head_dim_v) and (heads_q, total_q).
/// \param dout    gradient with respect to o, like o.
/// \param dlse    gradient with respect to lse, (heads_q, total_q), floating point.
/// \param dq, dk, dv  outputs like q, k, v; dk and dv summed over each group's query heads.
/// \throws kfa::Error as the overload above.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class CuQ, class CuK, class DQ, class DK, class DV,
          std::enable_if_t<impl::is_view_of_rank<DLse, 2>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const CuQ& cu_seqlens_q,
              const CuK& cu_seqlens_k, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params = {}) {
  detail::backward(space, q, k, v, o, lse, dout, &dlse, cu_seqlens_q, cu_seqlens_k, dq, dk, dv,
                   params);
}

}  // namespace kfa::varlen
