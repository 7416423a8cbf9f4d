#pragma once
/// \file impl/mpi/tree.hpp
/// Mode::tree. Every rank gathers all queries (MPI_Allgatherv), computes their partials against
/// its own key shard, and the partials meet in a reduce-scatter (reduce_scatter_rows: point to
/// point, then MPI_Reduce_local) with a user-defined, non-commutative MPI_Op that applies the
/// rule's join (rules.hpp) in rank order (so the result is the same on every run), leaving each
/// rank its own rows of O and their global LSE (or r).
/// Chosen over an MPI_Allreduce because each rank needs only its rows: a reduce-scatter moves N (D
/// + 1) values per rank instead of twice that. The backward gathers the rows [Q, dO, LSE, delta]
/// likewise, computes dK/dV of its shard completely and reduces dQ by a reduce-scatter (a sum, in
/// rank order).

#include <kfa/backends/portability.hpp>
#include <kfa/impl/mpi/blocks.hpp>
#include <kfa/impl/mpi/check.hpp>
#include <kfa/impl/mpi/comm.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <Kokkos_Core.hpp>

#include <vector>

namespace kfa::mpi::impl {

/// Mode::tree (see the file comment), with the interface of Ring.
struct Tree {
  /// Values in the largest message: every rank's gathered rows, [Q] forward (D) or its
  /// partials [LSE, O] (1 + Dv) and [Q, dO, LSE, delta] backward, per (row, batch, head).
  static double largest_message(const SeqPar& sp, int /*nranks*/, const Call& c) {
    const double width = c.pass == Passes::forward
                             ? double(c.head_dim > c.head_dim_v ? c.head_dim : c.head_dim_v) + 1
                             : double(c.head_dim + c.head_dim_v) + 2;
    return double(sp.seqlen_q) * c.batch * c.heads_q * width;
  }

  template <class R, class ExecSpace, class Q, class K, class V, class O, class Lse>
  static void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const R& rule, const SeqPar& sp, int rank, int P) {
    using T = typename Q::non_const_value_type;
    using Mem = typename ExecSpace::memory_space;
    const std::size_t B = q.extent(0), H = q.extent(1), D = q.extent(3), Dv = o.extent(3);
    const std::vector<int> counts = row_counts(sp.layout, sp.seqlen_q, P);
    const long long total = sp.seqlen_q;  // the ranks' rows partition the sequence
    // Every buffer of the call pooled (Temp, kfa::impl::Temporary: no allocation and no page
    // faults in steady state), each written before it is read.
    const Temp<Packed<T, Mem>, ExecSpace> q_mine(space, q.extent(2), B, H, D),
        q_all(space, total, B, H, D);
    pack_rows(space, "kfa::mpi::pack_q", q_mine.view(), q);
    allgather_rows(q_mine.view(), q_all.view(), counts, sp);
    const auto& all = q_all.view();
    // All queries in the order of the ranks' rows (written by the unpack), and their partials
    // against the local keys (by clear_result, then each block's merge).
    const Temp<Tensor<T, Mem>, ExecSpace> qg_t(space, B, H, total, D), og_t(space, B, H, total, Dv);
    const Temp<Rows<T, Mem>, ExecSpace> lg_t(space, B, H, total);
    const auto &qg = qg_t.view(), &og = og_t.view();
    const auto& lg = lg_t.view();
    unpack_rows(space, "kfa::mpi::unpack_q", all, qg);
    clear_result<R>(space, og, lg);
    {
      // One block result at a time, in scratch taken once and cut at the block's rows.
      const Temp<Tensor<T, Mem>, ExecSpace> ob_t(space, B, H, total, Dv);
      const Temp<Rows<T, Mem>, ExecSpace> lb_t(space, B, H, total);
      const auto& ob = ob_t.view();
      const auto& lb = lb_t.view();
      for_each_block(rule.masks(), sp, all_rows(sp.layout, sp.seqlen_q, P),
                     owned_rows(sp.layout, sp.seqlen_k, rank, P), [&](const Block& b) {
                       forward_block(space, rule, b, qg, k, v, ob, lb, og, lg);
                     });
    }
    // Partials as rows [lse or r, O], reduced with the rule's join.
    const ScopedOp combine(&combine_op<R, T>);
    const int W = packed_width(lg, og);
    const Temp<Packed<T, Mem>, ExecSpace> part_all(space, total, B, H, W),
        part_mine(space, counts[rank], B, H, W);
    pack_rows(space, "kfa::mpi::pack_partial", part_all.view(), lg, og);
    reduce_scatter_rows(part_all.view(), part_mine.view(), counts, combine.get(),
                        /*whole_rows=*/true, sp);
    unpack_rows(space, "kfa::mpi::unpack_o", part_mine.view(), lse, o);
  }

  template <class R, class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta,
            class DQ, class DK, class DV>
  static void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                       const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                       const R& rule, const SeqPar& sp, int rank, int P) {
    using T = typename Q::non_const_value_type;
    using A = typename Delta::non_const_value_type;
    using Mem = typename ExecSpace::memory_space;
    const std::size_t B = q.extent(0), H = q.extent(1), D = q.extent(3), Dv = dout.extent(3);
    const std::vector<int> counts = row_counts(sp.layout, sp.seqlen_q, P);
    const long long total = sp.seqlen_q;  // the ranks' rows partition the sequence
    // Pooled as in the forward. The unpack writes qg, dog, lg and deltag; dqg gathers the
    // blocks' dQ by additions, so it is cleared.
    const int W = packed_width(q, dout, lse, delta);
    const Temp<Packed<T, Mem>, ExecSpace> rows_mine(space, q.extent(2), B, H, W),
        rows_all(space, total, B, H, W);
    pack_rows(space, "kfa::mpi::pack_rows", rows_mine.view(), q, dout, lse, delta);
    allgather_rows(rows_mine.view(), rows_all.view(), counts, sp);
    const auto& all = rows_all.view();
    const Temp<Tensor<T, Mem>, ExecSpace> qg_t(space, B, H, total, D),
        dog_t(space, B, H, total, Dv), dqg_t(space, B, H, total, D);
    const Temp<Rows<T, Mem>, ExecSpace> lg_t(space, B, H, total);
    const Temp<Rows<A, Mem>, ExecSpace> deltag_t(space, B, H, total);
    const auto &qg = qg_t.view(), &dog = dog_t.view(), &dqg = dqg_t.view();
    const auto& lg = lg_t.view();
    const auto& deltag = deltag_t.view();
    unpack_rows(space, "kfa::mpi::unpack_rows", all, qg, dog, lg, deltag);
    clear(space, dqg);
    clear(space, dk);
    clear(space, dv);
    for_each_block(rule.masks(), sp, all_rows(sp.layout, sp.seqlen_q, P),
                   owned_rows(sp.layout, sp.seqlen_k, rank, P), [&](const Block& b) {
                     backward_block(space, rule, b, qg, k, v, dog, lg, deltag, dqg, dk, dv);
                   });
    // dQ of every query, summed over ranks into each rank's rows.
    const ScopedOp sum(rule.masks().deterministic ? &sum_op<T> : nullptr);
    const Temp<Packed<T, Mem>, ExecSpace> dq_all(space, total, B, H, D),
        dq_mine(space, counts[rank], B, H, D);
    pack_rows(space, "kfa::mpi::pack_dq", dq_all.view(), dqg);
    reduce_scatter_rows(dq_all.view(), dq_mine.view(), counts, sum.get(), /*whole_rows=*/false, sp);
    unpack_rows(space, "kfa::mpi::unpack_dq", dq_mine.view(), dq);
  }
};

}  // namespace kfa::mpi::impl
