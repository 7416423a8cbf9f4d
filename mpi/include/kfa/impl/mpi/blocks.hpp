#pragma once
/// \file impl/mpi/blocks.hpp
/// What every mode does with rows: the blocks of (query rows, key rows) a rank computes, each
/// a call of the single-device kernels at its global position; results merged with the
/// rule's join (rules.hpp); rows packed into and out of MPI messages; small elementwise helpers.

#include <kfa/backends/portability.hpp>
#include <kfa/combine.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/mpi/comm.hpp>
#include <kfa/impl/mpi/rules.hpp>
#include <kfa/impl/workspace.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace kfa::mpi::impl {

/// Internal (B, H, rows, D) tensors: LayoutRight whatever the space's default, since the
/// kernels need unit stride along head_dim (the default is LayoutLeft on GPUs).
template <class T, class Mem>
using Tensor = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
template <class T, class Mem>
using Rows = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

/// A pooled per-call temporary (core's workspace pool, kfa::impl::Temporary): no allocation
/// and no page faults in steady state, contents undefined until written.
template <class ViewType, class ExecSpace>
using Temp = kfa::impl::Temporary<ViewType, ExecSpace>;

/// The largest number of rows any rank owns.
inline long long max_count(Layout layout, long long seqlen, int nranks) {
  long long m = 0;
  for (int r = 0; r < nranks; ++r)
    m = std::max(m, owned_count(layout, seqlen, r, nranks));
  return m;
}

/// Each rank's number of rows, as MPI counts them.
inline std::vector<int> row_counts(Layout layout, long long seqlen, int nranks) {
  std::vector<int> rows(nranks);
  for (int r = 0; r < nranks; ++r)
    rows[r] = static_cast<int>(owned_count(layout, seqlen, r, nranks));
  return rows;
}

/// Every rank's rows in rank order: the order of the rows allgather_rows gathers.
inline std::vector<Segment> all_rows(Layout layout, long long seqlen, int nranks) {
  std::vector<Segment> all;
  for (int r = 0; r < nranks; ++r)
    for (const Segment& s : owned_rows(layout, seqlen, r, nranks))
      all.push_back(s);
  return all;
}

/// Whether any query of segment qs sees any key of segment ks under the masks of p.
inline bool blocks_meet(const Params& p, const SeqPar& sp, const Segment& qs, const Segment& ks) {
  if (qs.size == 0 || ks.size == 0) return false;
  kfa::impl::Origin at{qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k};
  const kfa::impl::Mask m = kfa::impl::make_mask(p, int(qs.size), int(ks.size), at);
  const int lo = m.lo(0), hi = m.hi(int(qs.size) - 1);
  return lo <= hi && lo < ks.size && hi >= 0;
}

/// Calls f(Block) for each block of the query rows `qrows` (global segments, stored one after
/// another in the query tensors) against the key rows `krows` (likewise) that the masks do not
/// hide entirely, query segments outermost.
template <class F>
void for_each_block(const Params& p, const SeqPar& sp, const std::vector<Segment>& qrows,
                    const std::vector<Segment>& krows, F&& f) {
  long long q_at = 0;
  for (const Segment& qs : qrows) {
    long long k_at = 0;
    for (const Segment& ks : krows) {
      if (blocks_meet(p, sp, qs, ks))
        f(Block{{q_at, qs.size}, {k_at, ks.size}, {qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k}});
      k_at += ks.size;
    }
    q_at += qs.size;
  }
}

/// Calls f(b, h, i) on `space` for each row of a (B, H, rows[, D]) view, as one kernel.
template <class ExecSpace, class View, class F>
void for_each_row(const ExecSpace& space, const char* label, const View& x, const F& f) {
  const int B = x.extent(0), H = x.extent(1), N = x.extent(2);
  if (std::size_t(B) * H * N == 0) return;
  Kokkos::parallel_for(
      label, Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, N}), f);
}

/// (o, s) <- join((o, s), (ob, sb)) row by row under rule R (rules.hpp): two normalised results
/// over disjoint keys, with their row statistics s (LSE or r).
template <class R, class ExecSpace, class O, class L, class OB, class LB>
void merge_rows(const ExecSpace& space, const O& o, const L& stat, const OB& ob, const LB& statb) {
  using T = typename O::non_const_value_type;
  using A = typename L::non_const_value_type;
  const int D = o.extent(3);
  for_each_row(
      space, "kfa::mpi::merge", o, KOKKOS_LAMBDA(int b, int h, int i) {
        const Join<A> j = R::template join<A>(stat(b, h, i), static_cast<A>(statb(b, h, i)));
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) =
              static_cast<T>((j.wa * A(o(b, h, i, d)) + j.wb * A(ob(b, h, i, d))) * j.inv);
        stat(b, h, i) = j.stat;
      });
}

/// The forward of block b into the running result (o, stat) of its queries: computed into the
/// scratch (ob, sb) at the queries' rows, then merged.
template <class R, class ExecSpace, class Q, class K, class V, class OB, class LB, class O, class L>
void forward_block(const ExecSpace& space, const R& rule, const Block& b, const Q& q, const K& k,
                   const V& v, const OB& ob, const LB& sb, const O& o, const L& stat) {
  rule.forward(space, b, rows_of(q, b.q), rows_of(k, b.k), rows_of(v, b.k), rows_of(ob, b.q),
               rows_of(sb, b.q));
  merge_rows<R>(space, rows_of(o, b.q), rows_of(stat, b.q), rows_of(ob, b.q), rows_of(sb, b.q));
}

/// The gradients of block b, added into dq (its queries' rows) and dk, dv (its keys' rows);
/// the row statistic and delta are the global ones, so the block needs no re-merge.
template <class R, class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta,
          class DQ, class DK, class DV>
void backward_block(const ExecSpace& space, const R& rule, const Block& b, const Q& q, const K& k,
                    const V& v, const DO& dout, const Lse& stat, const Delta& delta, const DQ& dq,
                    const DK& dk, const DV& dv) {
  rule.backward(space, b, rows_of(q, b.q), rows_of(k, b.k), rows_of(v, b.k), rows_of(dout, b.q),
                rows_of(stat, b.q), rows_of(delta, b.q), rows_of(dq, b.q), rows_of(dk, b.k),
                rows_of(dv, b.k));
}

/// packed = value (into_packed) or value = packed, converting.
template <bool into_packed, class P, class V>
KOKKOS_INLINE_FUNCTION void transfer(P& packed, V& value) {
  if constexpr (into_packed)
    packed = static_cast<P>(value);
  else
    value = static_cast<V>(packed);
}

/// The views whose values make up a packed row, in order: a (B, H, rows, D) view gives D
/// columns, a (B, H, rows) view one. Nested rather than a tuple, so it copies to any device.
template <class... Views>
struct Columns {
  int width() const { return 0; }
  template <bool into_packed, class P>
  KOKKOS_INLINE_FUNCTION void copy(const P&, int, int, int, int) const {}
};
template <class View, class... Rest>
struct Columns<View, Rest...> {
  View v;
  Columns<Rest...> rest;

  static constexpr bool tensor = View::rank == 4;
  int width() const { return (tensor ? int(v.extent(3)) : 1) + rest.width(); }
  /// Row i of head h of batch b between the views and p(i, b, h, col...): into p when
  /// `into_packed`, else out of it.
  template <bool into_packed, class P>
  KOKKOS_INLINE_FUNCTION void copy(const P& p, int b, int h, int i, int col) const {
    if constexpr (tensor) {
      const int D = v.extent(3);
      for (int d = 0; d < D; ++d)
        transfer<into_packed>(p(i, b, h, col + d), v(b, h, i, d));
      rest.template copy<into_packed>(p, b, h, i, col + D);
    } else {
      transfer<into_packed>(p(i, b, h, col), v(b, h, i));
      rest.template copy<into_packed>(p, b, h, i, col + 1);
    }
  }
};

inline Columns<> columns_of() {
  return {};
}
template <class View, class... Rest>
Columns<View, Rest...> columns_of(const View& v, const Rest&... rest) {
  return {v, columns_of(rest...)};
}

/// Values per (row, b, h) that pack_rows packs from these views (D for a (B, H, rows, D) view, 1
/// for a (B, H, rows) one).
template <class... Views>
int packed_width(const Views&... views) {
  return columns_of(views...).width();
}

/// The rows of `first`, `rest`... ((B, H, rows[, D]) views of one batch, heads and row count)
/// into p, side by side as (rows, B, H, packed_width) in p's value type, for MPI (fenced).
template <class ExecSpace, class P, class First, class... Rest>
void pack_rows(const ExecSpace& space, const char* label, const P& p, const First& first,
               const Rest&... rest) {
  const Columns<First, Rest...> cols = columns_of(first, rest...);
  for_each_row(
      space, label, first,
      KOKKOS_LAMBDA(int b, int h, int i) { cols.template copy<true>(p, b, h, i, 0); });
  space.fence();
}

/// The inverse of pack_rows: packed rows p into the views' rows, in the views' value types.
template <class ExecSpace, class P, class First, class... Rest>
void unpack_rows(const ExecSpace& space, const char* label, const P& p, const First& first,
                 const Rest&... rest) {
  const Columns<First, Rest...> cols = columns_of(first, rest...);
  for_each_row(
      space, label, first,
      KOKKOS_LAMBDA(int b, int h, int i) { cols.template copy<false>(p, b, h, i, 0); });
}

/// o = 0 and the statistic of the empty row: the identity of rule R's join (any layout).
template <class R, class ExecSpace, class O, class L>
void clear_result(const ExecSpace& space, const O& o, const L& stat) {
  using T = typename O::non_const_value_type;
  using A = typename L::non_const_value_type;
  const int D = o.extent(3);
  for_each_row(
      space, "kfa::mpi::clear", o, KOKKOS_LAMBDA(int b, int h, int i) {
        stat(b, h, i) = R::template empty<A>();
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) = T(0);
      });
}

/// dst += src, elementwise over rank-4 views of one shape.
template <class ExecSpace, class Dst, class Src>
void add_into(const ExecSpace& space, const Dst& dst, const Src& src) {
  const int D = dst.extent(3);
  for_each_row(
      space, "kfa::mpi::add", dst, KOKKOS_LAMBDA(int b, int h, int i) {
        for (int d = 0; d < D; ++d)
          dst(b, h, i, d) += src(b, h, i, d);
      });
}

/// x = 0, over a rank-4 view of any layout.
template <class ExecSpace, class X>
void clear(const ExecSpace& space, const X& x) {
  using T = typename X::non_const_value_type;
  const int D = x.extent(3);
  for_each_row(
      space, "kfa::mpi::clear", x, KOKKOS_LAMBDA(int b, int h, int i) {
        for (int d = 0; d < D; ++d)
          x(b, h, i, d) = T(0);
      });
}

}  // namespace kfa::mpi::impl
