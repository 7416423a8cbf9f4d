#pragma once
/// \file combiners.hpp
/// The combiner family: partial results that merge associatively, and a Kokkos reducer for any
/// of them.
///
/// Several of kfa's computations reduce a row in pieces (key tiles, split-KV chunks, teams,
/// threads, MPI ranks) and merge the pieces' partial results. Each such partial is a member of
/// one concept, a Combiner C:
///   using state_type = ...;                               // the partial result
///   KOKKOS_INLINE_FUNCTION static state_type identity();  // the partial of no elements
///   KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b);  // a <- a (+) b
/// with join associative (within rounding) and identity() its exact two-sided identity, so a
/// reduction may group the pieces any way and skip empty ones. Members:
///   combiners::Softmax<T, D>     (m, l, O~[D]): online softmax (kfa::combine_into, combine.hpp)
///   combiners::MultiScale<T, D>  (r, O~[D]): multi-scale attention (kfa::msa::combine_into)
///   combiners::Welford<T>        (n, mean, M2): row moments (kfa::Moments, welford.hpp)
///   combiners::LogSoftmax<T, D>  (m, d, o[D], ysum[D]): sum_j logsoftmax(x)_j y_j
/// kfa::Reducer<C, Space> turns any of them into a Kokkos custom reducer (parallel_reduce over a
/// RangePolicy, or nested over TeamThreadRange / ThreadVectorRange), and anything that needs a
/// merge in another setting (an MPI_Op, a split-KV merge) can take a Combiner likewise. The
/// attention kernels keep calling kfa::combine_into directly: Softmax and MultiScale wrap it,
/// so the family adds no second copy of the merge arithmetic.
///
/// D = 0 in Softmax or LogSoftmax keeps the row statistics alone: Softmax<T, 0> is the
/// log-sum-exp merge of (m, l) pairs.

#include <kfa/backends/portability.hpp>
#include <kfa/combine.hpp>

#include <Kokkos_Core.hpp>

namespace kfa {

/// A Kokkos custom reducer (value_type, join, init, reference, view) from Combiner C: init is
/// C::identity() and join C::join. Space is the memory space of the result, as in Kokkos'
/// own reducers (Kokkos::Sum and the like).
template <class C, class Space = Kokkos::HostSpace>
struct Reducer {
  using reducer = Reducer;                                   ///< Kokkos' reducer tag
  using value_type = typename C::state_type;                 ///< the partial result
  using result_view_type = Kokkos::View<value_type, Space>;  ///< where the result goes

  /// Reduces into `v` (a scalar on the stack of the caller).
  KOKKOS_INLINE_FUNCTION Reducer(value_type& v) : value_(&v), references_scalar_(true) {}
  /// Reduces into the rank-0 View `v`.
  KOKKOS_INLINE_FUNCTION Reducer(const result_view_type& v)
      : value_(v), references_scalar_(false) {}

  /// dest <- dest (+) src.
  KOKKOS_INLINE_FUNCTION void join(value_type& dest, const value_type& src) const {
    C::join(dest, src);
  }
#if KOKKOS_VERSION < 40000
  /// Kokkos 3 joins through volatile references; the objects themselves are not volatile, so
  /// the qualifier may be cast away.
  KOKKOS_INLINE_FUNCTION void join(volatile value_type& dest,
                                   const volatile value_type& src) const {
    C::join(const_cast<value_type&>(dest), const_cast<const value_type&>(src));
  }
#endif
  /// val <- the identity.
  KOKKOS_INLINE_FUNCTION void init(value_type& val) const {
    val = C::identity();
  }
  /// The result.
  KOKKOS_INLINE_FUNCTION value_type& reference() const {
    return *value_.data();
  }
  /// The result as a View.
  KOKKOS_INLINE_FUNCTION result_view_type view() const {
    return value_;
  }
  /// Whether the result is a scalar (rather than a View).
  KOKKOS_INLINE_FUNCTION bool references_scalar() const {
    return references_scalar_;
  }

 private:
  result_view_type value_;
  bool references_scalar_;
};

namespace combiners {

/// Number of output elements a state of D columns stores (at least one, so that D = 0 is a
/// valid array bound; the element is then never read).
constexpr int stored(int D) {
  return D > 0 ? D : 1;
}

/// A partial result (statistic s, output row o[D]) for the attention combiners.
template <class Stat, class T, int D>
struct Row {
  Stat s{};             ///< the row statistic
  T o[stored(D)] = {};  ///< the unnormalised output row (unused when D = 0)
};

/// Online softmax over keys: (m, l) and O~ = sum exp(score - m) v; join = kfa::combine_into.
template <class T, int D>
struct Softmax {
  using state_type = Row<Partial<T>, T, D>;  ///< (m, l, O~[D])
  /// m = -inf, l = 0, O~ = 0.
  KOKKOS_INLINE_FUNCTION static state_type identity() { return {}; }
  /// a <- a (+) b by kfa::combine_into.
  KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b) {
    combine_into(a.s, a.o, b.s, b.o, D);
  }
};

/// Multi-scale attention: r = sum |S| and O~ = sum S v; join = kfa::msa::combine_into.
template <class T, int D>
struct MultiScale {
  using state_type = Row<msa::Partial<T>, T, D>;  ///< (r, O~[D])
  /// r = 0, O~ = 0.
  KOKKOS_INLINE_FUNCTION static state_type identity() { return {}; }
  /// a <- a (+) b by kfa::msa::combine_into.
  KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b) {
    msa::combine_into(a.s, a.o, b.s, b.o, D);
  }
};

/// Partial of sum_j logsoftmax(x)_j y_j (y_j rows of D) over a set J of elements:
/// m = max_J x_j, d = sum_J exp(x_j - m), o = sum_J (x_j - m - log d) y_j, ysum = sum_J y_j.
/// o is the answer over J itself (J's log-softmax weights); a merge shifts each side's o by the
/// change of its log-normaliser times its ysum. The empty partial has d = 0.
template <class T>
struct LogSoftmaxStat {
  T m = -backends::infinity<T>();  ///< largest x; -inf when empty
  T d = T(0);                      ///< sum of exp(x - m); 0 when empty
};

/// The log-softmax combiner: state (m, d, o[D], ysum[D]) as LogSoftmaxStat describes.
template <class T, int D>
struct LogSoftmax {
  /// The partial result.
  struct state_type {
    LogSoftmaxStat<T> s{};   ///< (m, d)
    T o[stored(D)] = {};     ///< sum (x_j - m - log d) y_j
    T ysum[stored(D)] = {};  ///< sum y_j
  };
  /// m = -inf, d = 0, o = ysum = 0.
  KOKKOS_INLINE_FUNCTION static state_type identity() { return {}; }
  /// a <- a (+) b: m = max(m_a, m_b), d = e^(m_a - m) d_a + e^(m_b - m) d_b,
  /// o = (m_a - m - log d + log d_a) ysum_a + o_a + (the same for b), ysum = ysum_a + ysum_b;
  /// an empty side leaves the other unchanged (no log 0 is formed).
  KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b) {
    if (!(b.s.d > T(0))) return;
    if (!(a.s.d > T(0))) {
      a = b;
      return;
    }
    const Rescale<T> r = rescale(a.s.m, b.s.m);
    const T d = r.alpha * a.s.d + r.beta * b.s.d, log_d = backends::log(d);
    const T shift_a = a.s.m - r.m - log_d + backends::log(a.s.d);
    const T shift_b = b.s.m - r.m - log_d + backends::log(b.s.d);
    for (int k = 0; k < D; ++k) {
      a.o[k] = shift_a * a.ysum[k] + a.o[k] + shift_b * b.ysum[k] + b.o[k];
      a.ysum[k] += b.ysum[k];
    }
    a.s = {r.m, d};
  }
  /// The partial of one element x with row y (D values).
  KOKKOS_INLINE_FUNCTION static state_type single(T x, const T* y) {
    state_type p;
    p.s = {x, T(1)};
    for (int k = 0; k < D; ++k) {
      p.o[k] = T(0);  // x - m - log d = 0 for one element
      p.ysum[k] = y[k];
    }
    return p;
  }
  /// log-sum-exp of the partial, m + log d; -inf when empty.
  KOKKOS_INLINE_FUNCTION static T lse(const state_type& p) {
    return p.s.d > T(0) ? p.s.m + backends::log(p.s.d) : -backends::infinity<T>();
  }
};

}  // namespace combiners
}  // namespace kfa
