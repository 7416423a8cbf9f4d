#pragma once
/// \file distributed.hpp
/// Sequence parallelism over MPI (target kfa::mpi): the sequence is split across the ranks of
/// a communicator, each rank holds its rows of Q, K, V (and O, LSE, dO, dQ, dK, dV), and the
/// partial results over key shards merge with the combiner of kfa/combine.hpp. Softmax attention
/// (kfa::mpi::forward, backward) and multi-scale attention (kfa::mpi::msa::forward, backward,
/// kfa::msa's definition) run through the same modes and code, each a rule of
/// kfa/impl/mpi/rules.hpp (its partial row and join). The vocabulary
/// (Layout, Mode, SeqPar, owned_rows, agree) is in kfa/seqpar.hpp.
///
/// Modes (how partials meet):
///  - ring: K/V shards travel around the ring, the next exchange posted before the current
///    block is computed; each rank merges its queries' partials locally and skips the blocks
///    the masks hide. The backward carries the dK/dV accumulators along; dQ stays local.
///  - tree: the queries are gathered, each rank computes their partials against its own keys,
///    and a reduce-scatter with the combiner as a non-commutative MPI_Op (a sum of dQ in the
///    backward) leaves each rank its rows.
///
/// The backward uses the final, global LSE and D = rowsum(dO * O), so each block's
/// P = exp(S - LSE) is exact and no re-merge is needed. Masks and dropout are evaluated at
/// global positions, so every mode, layout and rank count gives the single-device result
/// within rounding (and, with dropout, the same mask). Multi-scale likewise with the final,
/// global r and c = [r >= 1] rowsum(dO * O) / max(r, 1); its mask tensor is passed whole on
/// every rank, as are the score terms of kfa/masks.hpp (ALiBi, a dense bias with its gradient,
/// a boolean mask, key padding), which each block reads at its global position.
/// params.deterministic: no atomics in the kernels and every cross-rank sum in a fixed order, so
/// the backward is bitwise repeatable run to run for a given rank count and layout (not across rank
/// counts: the blocks, and so the rounding, change with them).
///
/// Invalid input on any rank (a bad shape, params or SeqPar fields that differ between ranks)
/// is found by a collective check before the first collective that could hang: every rank
/// throws the same kfa::Error, naming the lowest failing rank or the fields that differ. MPI
/// counts are ints, so the largest message (a K/V shard pair, or the tree's gathered rows)
/// must hold fewer than 2^31 values; the check refuses larger problems on every rank (use more
/// ranks, or fewer heads per call). Views in a memory space the host cannot access are staged
/// through host buffers for MPI (portable without a GPU-aware MPI).
///
/// Where things live (namespace kfa::mpi::impl under kfa/impl/mpi/):
///  - comm.hpp: host-staged point-to-point Channel, the collectives on packed rows
///    (allgather_rows, reduce_scatter_rows), the MPI_Ops (combiner, ordered sum), MPI timing;
///  - check.hpp: the collective check, with every value the ranks must share encoded exactly
///    (Params through kfa::for_each_field, SeqPar through for_each_agreed_field);
///  - rules.hpp: the attention rules (softmax, multi-scale): a rank's partial row, the join of
///    two, a block's kernels, the backward's row term, what the ranks compare;
///  - blocks.hpp: the blocks a rank computes (for_each_block, forward_block, backward_block),
///    row packing for messages (pack_rows, unpack_rows), the merge of results;
///  - ring.hpp, tree.hpp: one mode each, a class with largest_message, forward and backward.
/// This file holds the public passes (kfa::mpi and kfa::mpi::msa): compile-time checks, the
/// collective check, the backward's row term and the dispatch on Mode (with_mode), written once
/// for every rule. A new mode is one file like ring.hpp
/// (included here), one value of Mode with its name in EnumNames<Mode>, and one case in
/// with_mode (the compiler's -Wswitch names a missing one).

#include <kfa/backends/traits.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/mpi/blocks.hpp>
#include <kfa/impl/mpi/check.hpp>
#include <kfa/impl/mpi/comm.hpp>
#include <kfa/impl/mpi/ring.hpp>
#include <kfa/impl/mpi/rules.hpp>
#include <kfa/impl/mpi/tree.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/impl/workspace.hpp>
#include <kfa/multiscale.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>

namespace kfa::mpi::impl {

/// Calls f(M{}) with the class M that implements `mode` (see ring.hpp): the one list of modes.
/// The collective check has refused values outside Mode before any pass dispatches.
template <class F>
void with_mode(Mode mode, F&& f) {
  switch (mode) {
    case Mode::ring:
      return f(Ring{});
    case Mode::tree:
      return f(Tree{});
  }
}

/// The rule R with the score term Extra bound, as R::with_term makes it for values of T on
/// ExecSpace.
template <class R, class T, class ExecSpace, class Extra>
using Bound = std::decay_t<
    decltype(std::declval<const R&>().template with_term<backends::accum_t<T>, ExecSpace>(
        "", std::declval<const Extra&>(), std::declval<const kfa::impl::Dims&>(), false))>;

/// The checks of a pass's arguments that need no other rank, common to both passes and every
/// rule.
template <class T, class R, class Q, class K>
void check_locally(const Call& call, const R& rule, const SeqPar& sp, int rank, int P, const Q& q,
                   const K& k) {
  rule.template validate<T>(call.name, q, sp);
  if (call.pass == Passes::backward && rule.params.dq_mode == DqMode::symmetric)
    kfa::impl::fail(call.name,
                    "params.dq_mode symmetric needs the whole self-attention problem "
                    "in one call; kfa::mpi's blocks take atomic or query_pass");
  check_seqpar(call.name, sp);
  with_mode(sp.mode, [&](auto mode) {
    check_message_size(call.name, sp, mode.largest_message(sp, P, call));
  });
  expect_rows(call.name, "q", q, owned_count(sp.layout, sp.seqlen_q, rank, P), "query");
  expect_rows(call.name, "k", k, owned_count(sp.layout, sp.seqlen_k, rank, P), "key");
}

/// A pass's name in its errors: its profiling region's name ("kfa::mpi::forward") less the
/// leading "kfa::" ("mpi::forward"), as the single-device passes name themselves.
inline const char* error_prefix(const char* region) {
  return region + std::strlen("kfa::");
}

/// The whole problem's extents, which a score term is checked against.
template <class Q>
kfa::impl::Dims whole_dims(const Q& q, const SeqPar& sp) {
  return {q.extent(0), q.extent(1), static_cast<std::size_t>(sp.seqlen_q),
          static_cast<std::size_t>(sp.seqlen_k)};
}

/// What a backward with a score term does after the blocks: nothing, except for a dense bias
/// with dbias: each rank sums its pairs' dL/dS over the broadcast dimensions into dbias (the
/// single-device pass's fixed order), then the ranks sum dbias, in which every element is one
/// rank's (each (i, j) pair is computed once, by one rank), so every rank ends with the whole
/// dbias, the same bits on every rank.
template <class ExecSpace, class R, class Extra>
void store_term_gradient(const ExecSpace&, const R&, const Extra&, const SeqPar&) {}
template <class ExecSpace, class Rule, class BiasView, class DBiasView>
void store_term_gradient(const ExecSpace& space, const SoftmaxRows<Rule>& rows,
                         const masks::Bias<BiasView, DBiasView>& m, const SeqPar& sp) {
  if (m.dbias.data() == nullptr) return;  // alike on every rank: the check compared it
  kfa::impl::store_gradient(space, rows.rule, m);
  sum_over_ranks(space, m.dbias, sp);
}

/// The forward of every rule R (rules.hpp): o and stat (lse or rsum) of this rank's rows, with
/// the score term `extra` (kfa/masks.hpp; NoTerm: none), whole on every rank.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class R,
          class Extra = kfa::impl::NoTerm>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const R& rows, const SeqPar& sp, const char* name, const Extra& extra = {}) {
  using T = typename Q::non_const_value_type;
  kfa::impl::static_check_pass<ExecSpace, true, Lse>(kfa::impl::Inputs<Q, K, V>{},
                                                     kfa::impl::Outputs<O>{});
  static_assert(std::is_same_v<typename Lse::value_type, T>,
                "kfa::mpi: lse (rsum) has the value type of q (kfa::mpi takes float and double)");
  const kfa::impl::ScopedRegion region(name);
  const Meter whole_call(total_sink(sp));
  const Ranks ranks = ranks_of(sp.comm);
  const int rank = ranks.rank, P = ranks.size;
  Call call =
      call_of<T>(error_prefix(name), Passes::forward, q, k, v, false, R::name, rows.has_mask());
  call.term = term_shape(extra, false);
  // The rule the blocks run, bound to the term by the check (which validates the term).
  std::optional<Bound<R, T, ExecSpace, Extra>> rule;
  check_collectively(call, sp, rows.agreed(), [&] {
    check_locally<T>(call, rows, sp, rank, P, q, k);
    kfa::impl::validate_forward(call.name, q, k, v, o, lse, R::stat_name);
    if (std::strcmp(R::name, SoftmaxRows<>::name) != 0)  // multi-scale keeps Dv = D
      kfa::impl::msa_validate_value_head_dim(call.name, q, v);
    rule.emplace(rows.template with_term<backends::accum_t<T>, ExecSpace>(
        call.name, extra, whole_dims(q, sp), false));
  });
  with_mode(sp.mode, [&](auto mode) { mode.forward(space, q, k, v, o, lse, *rule, sp, rank, P); });
  space.fence();
}

/// The backward of every rule R with an optional dlse (nullptr: none; softmax only) and the
/// forward's score term (dbias, when a dense bias has one, on every rank: store_term_gradient).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV, class R, class Extra = kfa::impl::NoTerm>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
              const DV& dv, const R& rows, const SeqPar& sp, const char* name,
              const Extra& extra = {}) {
  using T = typename Q::non_const_value_type;
  kfa::impl::static_check_pass<ExecSpace, false, Lse>(kfa::impl::Inputs<Q, K, V, O, DO>{},
                                                      kfa::impl::Outputs<DQ, DK, DV>{});
  static_assert(std::is_same_v<typename Lse::non_const_value_type, T>,
                "kfa::mpi: lse (rsum) has the value type of q (kfa::mpi takes float and double)");
  static_assert(kfa::impl::is_view_of_rank<DLse, 3>::value,
                "kfa::mpi::backward: dlse must be a rank-3 View");
  kfa::impl::static_check_accessible<ExecSpace, DLse>();
  const kfa::impl::ScopedRegion region(name);
  const Meter whole_call(total_sink(sp));
  const Ranks ranks = ranks_of(sp.comm);
  const int rank = ranks.rank, P = ranks.size;
  Call call = call_of<T>(error_prefix(name), Passes::backward, q, k, v, dlse != nullptr, R::name,
                         rows.has_mask());
  call.term = term_shape(extra, true);
  std::optional<Bound<R, T, ExecSpace, Extra>> rule;
  check_collectively(call, sp, rows.agreed(), [&] {
    check_locally<T>(call, rows, sp, rank, P, q, k);
    kfa::impl::validate_backward(call.name, q, k, v, o, lse, dout, dlse, dq, dk, dv, R::stat_name);
    if (std::strcmp(R::name, SoftmaxRows<>::name) != 0)  // multi-scale keeps Dv = D
      kfa::impl::msa_validate_value_head_dim(call.name, q, v);
    rule.emplace(rows.template with_term<backends::accum_t<T>, ExecSpace>(call.name, extra,
                                                                          whole_dims(q, sp), true));
  });
  // The rule's row term of this rank's rows from the final O and statistic (softmax: delta =
  // rowsum(dO * O) - dLSE; multi-scale: c): with the global statistic every block's P is the
  // exact global one, so blocks need no re-merge.
  // From the workspace pool (kfa/workspace.hpp), as the single-process backward's.
  const kfa::impl::Temporary<Rows<backends::accum_t<T>, typename ExecSpace::memory_space>,
                             ExecSpace>
      delta_memory(space, q.extent(0), q.extent(1), q.extent(2));
  const auto& delta = delta_memory.view();
  rule->delta(space, delta, dout, o, lse, dlse, dq);
  with_mode(sp.mode, [&](auto mode) {
    mode.backward(space, q, k, v, dout, lse, delta, dq, dk, dv, *rule, sp, rank, P);
  });
  store_term_gradient(space, *rule, extra, sp);
  space.fence();
}

}  // namespace kfa::mpi::impl

namespace kfa::mpi {

/// Sequence-parallel forward. Each rank passes its rows (owned_rows(sp.layout, ...)) of q
/// (B, Hq, local Nq, D), k and v (B, Hk, local Nk, D), and receives its rows of o and lse.
/// Collective over sp.comm: every rank must call it with the same params and SeqPar.
/// \throws kfa::Error on every rank when any rank's input is invalid.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params, const SeqPar& sp) {
  impl::forward(space, q, k, v, o, lse, impl::SoftmaxRows<>{params}, sp, "kfa::mpi::forward");
}

/// Sequence-parallel backward: each rank passes its rows of q, k, v (as to forward), of o and
/// lse (forward's results) and of dout, and receives its rows of dq, dk and dv. Collective
/// over sp.comm, with the forward's params (params.deterministic as in kfa::backward: no
/// atomics, and the cross-rank sums in a fixed order, so the result is bitwise repeatable).
/// \throws kfa::Error on every rank when any rank's input is invalid.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, std::enable_if_t<kfa::impl::is_view_of_rank<DQ, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params, const SeqPar& sp) {
  impl::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv,
                 impl::SoftmaxRows<>{params}, sp, "kfa::mpi::backward");
}

/// As above, with dlse = dL/dLSE of this rank's rows (batch, heads_q, local seqlen_q).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV,
          std::enable_if_t<kfa::impl::is_view_of_rank<DLse, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const SeqPar& sp) {
  impl::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, impl::SoftmaxRows<>{params}, sp,
                 "kfa::mpi::backward");
}

/// kfa::mpi::forward with a score term of kfa/masks.hpp, as kfa::forward takes one:
/// kfa::masks::Alibi{slopes}, Bias{bias}, Dense{mask} or KeyPadding{lengths}. The term is the
/// WHOLE problem's on every rank, at global positions: slopes (heads_q), a bias or boolean mask
/// (batch or 1, heads_q or 1, seqlen_q, seqlen_k) with seqlen_q and seqlen_k those of SeqPar,
/// key lengths (batch) in [0, seqlen_k]; the same values on every rank. A rank reads the rows
/// and columns of the blocks it computes (ring: its queries against every key; tree: every
/// query against its keys), so a bias or mask costs each rank its whole B Hq Nq Nk values
/// (less where it broadcasts). Key padding and the masks of params skip the tiles they hide,
/// as on one device; a row left with no key gets o = 0, lse = -inf. Every rank must pass a
/// term of the same kind and, for a bias or mask, the same extents, or none.
/// \throws kfa::Error on every rank when any rank's input is invalid, a term's shape does not
///         fit the whole problem, or the ranks' terms differ in kind or extents.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Extra,
          std::enable_if_t<kfa::impl::is_term<Extra>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params, const SeqPar& sp, const Extra& term) {
  impl::forward(space, q, k, v, o, lse, impl::SoftmaxRows<>{params}, sp, "kfa::mpi::forward", term);
}

/// kfa::mpi::backward with the forward's score term (as kfa::mpi::forward above). With
/// kfa::masks::Bias{bias, dbias} and dbias not empty, EVERY rank receives the whole dbias
/// (shaped like bias: dL/dbias summed over its broadcast dimensions), the same bits on every
/// rank and those a repeated run gives: each (i, j) pair is computed by one rank, which sums
/// it over the broadcast dimensions in a fixed order, and the ranks' parts meet in a sum where
/// each element is nonzero on one rank only. It takes a dL/dS buffer of the whole problem per
/// rank, (batch, heads_q, seqlen_q, seqlen_k) in the accumulation type; dbias holds float or
/// double. Every rank must pass a dbias, or none.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK,
    class DV, class Extra,
    std::enable_if_t<kfa::impl::is_view_of_rank<DQ, 4>::value && kfa::impl::is_term<Extra>::value,
                     int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params, const SeqPar& sp, const Extra& term) {
  impl::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv,
                 impl::SoftmaxRows<>{params}, sp, "kfa::mpi::backward", term);
}

/// As above, with dlse = dL/dLSE of this rank's rows.
template <
    class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse, class DQ,
    class DK, class DV, class Extra,
    std::enable_if_t<kfa::impl::is_view_of_rank<DLse, 3>::value && kfa::impl::is_term<Extra>::value,
                     int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const SeqPar& sp, const Extra& term) {
  impl::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, impl::SoftmaxRows<>{params}, sp,
                 "kfa::mpi::backward", term);
}

}  // namespace kfa::mpi

namespace kfa::mpi::msa {

/// Sequence-parallel multi-scale forward (kfa::msa::forward's definition, <kfa/multiscale.hpp>):
/// each rank passes its rows of q, k and v as to kfa::mpi::forward and receives its rows of o
/// and rsum (r, unclamped; the value type of q). `mask` is the WHOLE mask tensor (heads_q,
/// seqlen_q, seqlen_k) at global positions, the same on every rank: a rank reads the rows and
/// columns of the blocks it computes, which differ by mode (ring: its queries against every
/// key; tree: every query against its keys), so the whole tensor serves both. Collective over
/// sp.comm, with the same params and SeqPar, and a mask on all ranks or on none.
/// \throws kfa::Error on every rank when any rank's input is invalid (kfa::msa::forward's
///         errors, a mask that is not the whole (heads_q, seqlen_q, seqlen_k)).
template <class ExecSpace, class Q, class K, class V, class M, class O, class R,
          std::enable_if_t<kfa::impl::is_view_of_rank<M, 3>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask, const O& o,
             const R& rsum, const kfa::msa::Params& params, const SeqPar& sp) {
  kfa::impl::static_check_mask<ExecSpace, M>();
  impl::forward(space, q, k, v, o, rsum, impl::MultiScaleRows<M>{params, mask, true}, sp,
                "kfa::mpi::msa::forward");
}

/// As above with M = 1 (no mask tensor).
template <class ExecSpace, class Q, class K, class V, class O, class R,
          std::enable_if_t<kfa::impl::is_view_of_rank<O, 4>::value, int> = 0>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const R& rsum,
             const kfa::msa::Params& params, const SeqPar& sp) {
  using M = kfa::impl::MsaNoMask<ExecSpace>;
  impl::forward(space, q, k, v, o, rsum, impl::MultiScaleRows<M>{params, M(), false}, sp,
                "kfa::mpi::msa::forward");
}

/// Sequence-parallel multi-scale backward: each rank passes its rows of q, k, v, o, rsum (the
/// forward's) and dout, the whole mask as to forward, and receives its rows of dq, dk and dv.
/// c_i = [r_i >= 1] (dO_i . O_i) / max(r_i, 1) comes from each rank's own rows, like the
/// softmax backward's delta. params.deterministic as in kfa::mpi::backward.
/// \throws kfa::Error on every rank when any rank's input is invalid.
template <class ExecSpace, class Q, class K, class V, class M, class O, class R, class DO, class DQ,
          class DK, class DV, std::enable_if_t<kfa::impl::is_view_of_rank<M, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const M& mask, const O& o,
              const R& rsum, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const kfa::msa::Params& params, const SeqPar& sp) {
  kfa::impl::static_check_mask<ExecSpace, M>();
  impl::backward(space, q, k, v, o, rsum, dout, static_cast<const R*>(nullptr), dq, dk, dv,
                 impl::MultiScaleRows<M>{params, mask, true}, sp, "kfa::mpi::msa::backward");
}

/// As above with M = 1 (no mask tensor).
template <class ExecSpace, class Q, class K, class V, class O, class R, class DO, class DQ,
          class DK, class DV, std::enable_if_t<kfa::impl::is_view_of_rank<O, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const R& rsum,
              const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const kfa::msa::Params& params, const SeqPar& sp) {
  using M = kfa::impl::MsaNoMask<ExecSpace>;
  impl::backward(space, q, k, v, o, rsum, dout, static_cast<const R*>(nullptr), dq, dk, dv,
                 impl::MultiScaleRows<M>{params, M(), false}, sp, "kfa::mpi::msa::backward");
}

}  // namespace kfa::mpi::msa
