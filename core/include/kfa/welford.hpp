#pragma once
/// \file welford.hpp
/// Count, mean and M2 of a list of numbers, built one element at a time (Welford) and merged
/// pairwise (Chan, Golub and LeVeque), and a Kokkos reducer that does both in one pass.
///
/// Why not sum x and x^2: var = E[x^2] - E[x]^2 subtracts two numbers of size mean^2 to get one
/// of size std^2, losing log10(mean^2 / std^2) digits. In float with mean 1e3 and std 1 that is
/// all but one of float's seven digits. Welford's update keeps deviations from the running mean
/// instead, and Chan's merge joins two such partials exactly as if their elements had been
/// pushed one after the other (within rounding), so a row can be reduced by any tree of lanes,
/// threads, teams or ranks.
///
/// Moments are the third member of the combiner family (kfa/combiners.hpp):
/// combiners::Welford<T> with identity {0, 0, 0} and join = combine; MomentsReducer is
/// kfa::Reducer of it.

#include <kfa/combiners.hpp>

#include <Kokkos_Core.hpp>

namespace kfa {

/// Count n, mean and m2 = sum (x - mean)^2 of a list; all zero for the empty list. n is held in
/// T so that the merge's n_a n_b / n needs no conversion.
template <class T>
struct Moments {
  T n = T(0);     ///< number of elements
  T mean = T(0);  ///< their mean (0 when n = 0)
  T m2 = T(0);    ///< sum of squared deviations from the mean
};

/// Welford's update: n += 1; delta = x - mean; mean += delta / n; m2 += delta (x - mean).
template <class T>
KOKKOS_INLINE_FUNCTION void push(Moments<T>& a, T x) {
  a.n += T(1);
  const T delta = x - a.mean;
  a.mean += delta / a.n;
  a.m2 += delta * (x - a.mean);
}

/// Chan's merge: n = n_a + n_b, delta = mean_b - mean_a, mean = mean_a + delta n_b / n,
/// m2 = m2_a + m2_b + delta^2 n_a n_b / n. An empty side returns the other unchanged (bitwise),
/// which also keeps 0 / 0 out when both are empty.
template <class T>
KOKKOS_INLINE_FUNCTION Moments<T> combine(const Moments<T>& a, const Moments<T>& b) {
  if (b.n == T(0)) return a;
  if (a.n == T(0)) return b;
  const T n = a.n + b.n, delta = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

/// The variance: m2 / (n - 1) when unbiased (the sample variance), else m2 / n (the population
/// variance, PyTorch's LayerNorm). The caller makes sure n (or n - 1) is positive.
template <class T>
KOKKOS_INLINE_FUNCTION T variance(const Moments<T>& a, bool unbiased) {
  return a.m2 / (unbiased ? a.n - T(1) : a.n);
}

namespace combiners {

/// Row moments as a combiner (kfa/combiners.hpp): identity {0, 0, 0}, join = kfa::combine.
template <class T>
struct Welford {
  using state_type = Moments<T>;  ///< (n, mean, m2)
  /// The moments of the empty list.
  KOKKOS_INLINE_FUNCTION static state_type identity() { return {}; }
  /// a <- Chan's merge of a and b.
  KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b) { a = combine(a, b); }
};

}  // namespace combiners

/// Kokkos custom reducer of Moments<T>: in a parallel_reduce over a RangePolicy, or nested over
/// TeamThreadRange / ThreadVectorRange, each thread or lane `push`es its elements into its own
/// Moments and Kokkos joins them with `combine`, so a row is reduced in one pass:
/// \code
///   kfa::Moments<float> mom;
///   Kokkos::parallel_reduce(Kokkos::TeamThreadRange(team, D),
///       [&](int j, kfa::Moments<float>& a) { kfa::push(a, x(row, j)); },
///       kfa::MomentsReducer<float>(mom));
/// \endcode
template <class T, class Space = Kokkos::HostSpace>
using MomentsReducer = Reducer<combiners::Welford<T>, Space>;

}  // namespace kfa
