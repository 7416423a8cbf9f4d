#pragma once
/// \file combine.hpp
/// The associative combiners of partial attention results: softmax's (kfa::Partial) and
/// multi-scale attention's (kfa::msa::Partial, at the end).
///
/// A partial result of one query row over a set of keys is (m, l, O~): the largest score m,
/// the sum l of exp(score - m), and the unnormalised output O~ = sum exp(score - m) v. Two
/// partials over disjoint key sets merge into the partial over their union by rescaling both
/// to the larger maximum. The merge is associative and commutative (within rounding), the
/// empty partial (m = -inf, l = 0, O~ = 0) is its identity, and it never forms -inf - -inf.
/// The forward kernel's online softmax is this merge applied tile by tile; split-KV and the
/// MPI layer apply it across teams and ranks.
///
/// The (m, l) form is kept rather than (lse, O): the tile loop then needs one exp per score and
/// no log, and lse = m + log l is formed once at the end.
///
/// Both merges are members of the combiner family (kfa/combiners.hpp: combiners::Softmax and
/// combiners::MultiScale wrap combine_into as identity and join, beside Welford's moments and
/// the log-softmax combiner); the kernels call combine_into directly.

#include <kfa/backends/portability.hpp>

#include <Kokkos_Core.hpp>

namespace kfa {

/// Row statistics of a partial result: running maximum m and sum l (see combine.hpp).
template <class T>
struct Partial {
  T m = -backends::infinity<T>();  ///< largest score seen; -inf when no key was seen
  T l = T(0);                      ///< sum of exp(score - m); 0 when no key was seen
};

/// How two partials with maxima ma and mb are brought to a common maximum m:
/// O~ = alpha * O~_a + beta * O~_b and l = alpha * l_a + beta * l_b.
template <class T>
struct Rescale {
  T m;      ///< max(ma, mb)
  T alpha;  ///< exp(ma - m), 0 for an empty a
  T beta;   ///< exp(mb - m), 0 for an empty b
};

/// Factors that merge partials with maxima ma and mb. Both empty: m = -inf, alpha = beta = 0.
template <class T>
KOKKOS_INLINE_FUNCTION Rescale<T> rescale(T ma, T mb) {
  const T m = ma > mb ? ma : mb;
  if (m == -backends::infinity<T>()) return {m, T(0), T(0)};
  return {m, backends::exp(ma - m), backends::exp(mb - m)};
}

/// Merges the statistics of two partials; the outputs merge with the same factors:
/// O~ = r.alpha * O~_a + r.beta * O~_b where r = rescale(a.m, b.m).
template <class T>
KOKKOS_INLINE_FUNCTION Partial<T> combine(const Partial<T>& a, const Partial<T>& b) {
  const Rescale<T> r = rescale(a.m, b.m);
  return {r.m, r.alpha * a.l + r.beta * b.l};
}

/// Merges partial b, with output row ob, into partial a, with output row oa (n elements each).
template <class T>
KOKKOS_INLINE_FUNCTION void combine_into(Partial<T>& a, T* oa, const Partial<T>& b, const T* ob,
                                         int n) {
  const Rescale<T> r = rescale(a.m, b.m);
  for (int d = 0; d < n; ++d)
    oa[d] = r.alpha * oa[d] + r.beta * ob[d];
  a = {r.m, r.alpha * a.l + r.beta * b.l};
}

/// Log-sum-exp of a partial: m + log l, or -inf when it is empty.
template <class T>
KOKKOS_INLINE_FUNCTION T lse(const Partial<T>& p) {
  return p.l > T(0) ? p.m + backends::log(p.l) : -backends::infinity<T>();
}

namespace msa {

/// Partial multi-scale result of a row over a set of keys: r = sum |S_ij| over the set; the
/// unnormalised output O~ = sum S_ij v_j is kept beside it. Both are plain sums, so the merge
/// is addition and the empty partial (r = 0, O~ = 0) is its identity. The clamp d = max(r, 1)
/// is applied once, to the whole row: clamped partials do not merge (max(r_a, 1) +
/// max(r_b, 1) is not max(r_a + r_b, 1)).
template <class T>
struct Partial {
  T r = T(0);  ///< sum of |S_ij| over the partial's keys
};

/// Merges the statistics of two multi-scale partials.
template <class T>
KOKKOS_INLINE_FUNCTION Partial<T> combine(const Partial<T>& a, const Partial<T>& b) {
  return {a.r + b.r};
}

/// Merges multi-scale partial b, with output row ob, into partial a, with output row oa
/// (n elements each): r = r_a + r_b, O~ = O~_a + O~_b.
template <class T>
KOKKOS_INLINE_FUNCTION void combine_into(Partial<T>& a, T* oa, const Partial<T>& b, const T* ob,
                                         int n) {
  for (int d = 0; d < n; ++d)
    oa[d] += ob[d];
  a = combine(a, b);
}

/// The normaliser of a complete row: d = max(r, 1).
template <class T>
KOKKOS_INLINE_FUNCTION T denominator(const Partial<T>& p) {
  return p.r > T(1) ? p.r : T(1);
}

}  // namespace msa

}  // namespace kfa
