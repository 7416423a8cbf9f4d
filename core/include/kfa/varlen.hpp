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
/// ALiBi (kfa::masks::Alibi, after the Params) is taken within each sequence: its bias
/// -slopes(h) |i + shift - j| has i, j and the diagonal shift of that sequence. The other terms
/// of kfa/masks.hpp (a dense bias or boolean mask, key padding) are tensors of a padded batch
/// with no packed layout (each sequence's lengths are already its padding): they do not compile
/// with kfa::varlen.
///
/// Each pass launches each of its kernels once for all sequences: the forward's over
/// (sequence, head, query tile), the backward's key-tile kernel over (sequence, kv head, key
/// tile) and its query-tile (or symmetric) kernel like the forward's. A small device array of
/// each sequence's first tile (built on the host from cu_seqlens) maps a team to its sequence,
/// whose rows, lengths and diagonal it then works on (impl/packed.hpp): no padded row is
/// computed or stored, and many short sequences fill a GPU as one batch does. There is no
/// split-KV (num_splits > 1 is refused).

#include <kfa/backward.hpp>
#include <kfa/forward.hpp>
#include <kfa/impl/bias.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/masks.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
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

template <class Extra>
struct is_alibi : std::false_type {};
template <class S>
struct is_alibi<masks::Alibi<S>> : std::true_type {};

/// The terms a packed call takes: none, or ALiBi, whose slopes are per head. A dense bias or
/// mask and key padding are (batch, heads, seqlen_q, seqlen_k) or per-batch tensors of a padded
/// batch: they have no packed meaning.
template <class Extra>
constexpr void static_check_term() {
  static_assert(std::is_same_v<Extra, impl::NoTerm> || is_alibi<Extra>::value,
                "kfa::varlen takes kfa::masks::Alibi only: a dense bias (masks::Bias), a boolean "
                "mask (masks::Dense) or key padding (masks::KeyPadding) is a padded batch's "
                "tensor and has no packed meaning (each sequence's lengths are its padding)");
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

namespace detail {

/// Both forward overloads: extra is impl::NoTerm or ALiBi.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class Extra>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const CuQ& cu_seqlens_q,
             const CuK& cu_seqlens_k, const O& o, const Lse& lse, const Params& params,
             const Extra& extra) {
  static_check_packed<Q>();
  static_check_packed<K>();
  static_check_packed<V>();
  static_check_packed<O>();
  static_check_lse<Lse>();
  static_check_cu<CuQ>();
  static_check_cu<CuK>();
  static_check_term<Extra>();
  using R4 = decltype(rows(q, 0, 0));
  using L3 = decltype(lse_rows(lse, 0, 0));
  impl::static_check_pass<ExecSpace, true, L3>(
      impl::Inputs<R4, decltype(rows(k, 0, 0)), decltype(rows(v, 0, 0))>{},
      impl::Outputs<decltype(rows(o, 0, 0))>{});
  const char* pass = "varlen::forward";
  impl::validate_params<typename Q::non_const_value_type>(pass, params);
  if (params.num_splits > 1)
    impl::fail(pass, "num_splits = ", params.num_splits,
               ": packed sequences run one team per (sequence, head, query tile), without "
               "split-KV; give 0 or 1");
  const std::size_t tq = q.extent(0), tk = k.extent(0);
  impl::validate_forward(pass, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                         lse_rows(lse, 0, tq));
  impl::term_rule<backends::accum_t<typename Q::non_const_value_type>, ExecSpace>(
      pass, extra, impl::dims_of(rows(q, 0, tq), rows(k, 0, tk)), false);
  std::vector<std::int32_t> cq, ck;
  sequences(pass, cu_seqlens_q, cu_seqlens_k, tq, tk, cq, ck);

  // One launch over (sequence, head, query tile); a sequence without keys gets o = 0 and
  // lse = -inf from it, as a fully masked row does.
  impl::forward_packed(space, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                       lse_rows(lse, 0, tq), cq, ck, params, extra);
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
  detail::forward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, params, impl::NoTerm{});
}

/// As above with ALiBi, kfa::masks::Alibi{slopes} (heads_q slopes): the bias
/// -slopes(h) |i + shift - j| of each sequence, i and j its own query and key positions and
/// shift its own diagonal (seqlen_k - seqlen_q of the sequence for Align::bottom_right, 0 for
/// top_left), as the padded call gives batch element s. The other terms of kfa/masks.hpp
/// (a dense bias or mask, key padding) are (batch, heads, seqlen_q, seqlen_k) tensors with no
/// packed layout: they do not compile here.
/// \throws kfa::Error as above, and for slopes whose length is not heads_q.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class Extra, std::enable_if_t<impl::is_term<Extra>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const CuQ& cu_seqlens_q,
             const CuK& cu_seqlens_k, const O& o, const Lse& lse, const Params& params,
             const Extra& extra) {
  detail::forward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, params, extra);
}

namespace detail {

/// Every backward overload: dlse may be nullptr, extra is impl::NoTerm or ALiBi.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class CuQ, class CuK, class DQ, class DK, class DV, class Extra>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const CuQ& cu_q, const CuK& cu_k,
              const DQ& dq, const DK& dk, const DV& dv, const Params& params, const Extra& extra) {
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
  static_check_term<Extra>();
  const char* pass = "varlen::backward";
  impl::validate_params<typename Q::non_const_value_type>(pass, params);
  const std::size_t tq = q.extent(0), tk = k.extent(0);
  const auto dl = dlse ? lse_rows(*dlse, 0, tq) : decltype(lse_rows(*dlse, 0, 0))();
  impl::validate_backward(pass, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                          lse_rows(lse, 0, tq), rows(dout, 0, tq), dlse ? &dl : nullptr,
                          rows(dq, 0, tq), rows(dk, 0, tk), rows(dv, 0, tk));
  impl::term_rule<backends::accum_t<typename Q::non_const_value_type>, ExecSpace>(
      pass, extra, impl::dims_of(rows(q, 0, tq), rows(k, 0, tk)), true);
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

  // A few launches for all sequences; a sequence without queries gives its keys zero
  // gradients there, one without keys its queries.
  impl::backward_packed(space, rows(q, 0, tq), rows(k, 0, tk), rows(v, 0, tk), rows(o, 0, tq),
                        lse_rows(lse, 0, tq), rows(dout, 0, tq), dlse ? &dl : nullptr,
                        rows(dq, 0, tq), rows(dk, 0, tk), rows(dv, 0, tk), cq, ck, params, extra);
}

}  // namespace detail

/// Backward pass over packed sequences (as kfa::backward for each sequence, in one launch per
/// kernel for all of them).
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
                   cu_seqlens_k, dq, dk, dv, params, impl::NoTerm{});
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
                   params, impl::NoTerm{});
}

/// The backward overload without dlse, with ALiBi: `extra` is the kfa::masks::Alibi{slopes}
/// given to kfa::varlen::forward (no other term compiles here; slopes get no gradient).
/// \param space, q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, dq, dk, dv, params  as
///        in the overload without a term.
/// \param extra  kfa::masks::Alibi{slopes}, heads_q slopes.
/// \throws kfa::Error as that overload, and for slopes whose length is not heads_q.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class CuQ, class CuK,
    class DQ, class DK, class DV, class Extra,
    std::enable_if_t<impl::is_view_of_rank<DQ, 3>::value && impl::is_term<Extra>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
              const DQ& dq, const DK& dk, const DV& dv, const Params& params, const Extra& extra) {
  detail::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), cu_seqlens_q,
                   cu_seqlens_k, dq, dk, dv, params, extra);
}

/// The backward overload with dlse, with ALiBi (as the overload above).
/// \param space, q, k, v, o, lse, dout, dlse, cu_seqlens_q, cu_seqlens_k, dq, dk, dv, params  as
///        in the overload with dlse and without a term.
/// \param extra  kfa::masks::Alibi{slopes}, heads_q slopes.
/// \throws kfa::Error as that overload, and for slopes whose length is not heads_q.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse, class CuQ,
    class CuK, class DQ, class DK, class DV, class Extra,
    std::enable_if_t<impl::is_view_of_rank<DLse, 2>::value && impl::is_term<Extra>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const CuQ& cu_seqlens_q,
              const CuK& cu_seqlens_k, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params, const Extra& extra) {
  detail::backward(space, q, k, v, o, lse, dout, &dlse, cu_seqlens_q, cu_seqlens_k, dq, dk, dv,
                   params, extra);
}

}  // namespace kfa::varlen
