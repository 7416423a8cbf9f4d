#pragma once
/// \file impl/mpi/tree.hpp
/// Mode::tree. Every rank gathers all queries (MPI_Allgatherv), computes their partials against
/// its own key shard, and the partials meet in MPI_Reduce_scatter with a user-defined,
/// non-commutative MPI_Op that applies the rule's join (rules.hpp) in rank order (so the result
/// is the same on every run), leaving each rank its own rows of O and their global LSE (or r).
/// Chosen over an MPI_Allreduce because each rank needs only its rows: a reduce-scatter moves N (D
/// + 1) values per rank instead of twice that. The backward gathers the rows [Q, dO, LSE, delta]
/// likewise, computes dK/dV of its shard completely and reduces dQ by a reduce-scatter (a sum; in
/// rank order under params.deterministic).

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
    const auto all = allgather_rows(pack_rows(space, "kfa::mpi::pack_q", q), counts, sp);
    const long long total = all.extent(0);
    // All queries in the order of the ranks' rows, and their partials against the local keys.
    const Tensor<T, Mem> qg("kfa::mpi::qg", B, H, total, D), og("kfa::mpi::og", B, H, total, Dv);
    const Rows<T, Mem> lg("kfa::mpi::lg", B, H, total);
    unpack_rows(space, "kfa::mpi::unpack_q", all, qg);
    clear_result<R>(space, og, lg);
    {
      // One block result at a time, in scratch allocated once and cut at the block's rows.
      const Tensor<T, Mem> ob("kfa::mpi::ob", B, H, total, Dv);
      const Rows<T, Mem> lb("kfa::mpi::lb", B, H, total);
      for_each_block(rule.masks(), sp, all_rows(sp.layout, sp.seqlen_q, P),
                     owned_rows(sp.layout, sp.seqlen_k, rank, P), [&](const Block& b) {
                       forward_block(space, rule, b, qg, k, v, ob, lb, og, lg);
                     });
    }
    // Partials as rows [lse or r, O], reduced with the rule's join.
    const ScopedOp combine(&combine_op<R, T>);
    const auto mine = reduce_scatter_rows(pack_rows(space, "kfa::mpi::pack_partial", lg, og),
                                          counts, combine.get(), /*whole_rows=*/true, sp);
    unpack_rows(space, "kfa::mpi::unpack_o", mine, lse, o);
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
    const auto all =
        allgather_rows(pack_rows(space, "kfa::mpi::pack_rows", q, dout, lse, delta), counts, sp);
    const long long total = all.extent(0);
    const Tensor<T, Mem> qg("kfa::mpi::qg", B, H, total, D), dog("kfa::mpi::dog", B, H, total, Dv),
        dqg("kfa::mpi::dqg", B, H, total, D);
    const Rows<T, Mem> lg("kfa::mpi::lg", B, H, total);
    const Rows<A, Mem> deltag("kfa::mpi::deltag", B, H, total);
    unpack_rows(space, "kfa::mpi::unpack_rows", all, qg, dog, lg, deltag);
    clear(space, dk);
    clear(space, dv);
    for_each_block(rule.masks(), sp, all_rows(sp.layout, sp.seqlen_q, P),
                   owned_rows(sp.layout, sp.seqlen_k, rank, P), [&](const Block& b) {
                     backward_block(space, rule, b, qg, k, v, dog, lg, deltag, dqg, dk, dv);
                   });
    // dQ of every query, summed over ranks into each rank's rows.
    const ScopedOp sum(rule.masks().deterministic ? &sum_op<T> : nullptr);
    const auto mine = reduce_scatter_rows(pack_rows(space, "kfa::mpi::pack_dq", dqg), counts,
                                          sum.get(), /*whole_rows=*/false, sp);
    unpack_rows(space, "kfa::mpi::unpack_dq", mine, dq);
  }
};

}  // namespace kfa::mpi::impl
