#pragma once
/// \file impl/backward_kernel.hpp
/// The FlashAttention-2 backward as Kokkos team kernels.
///
/// Nothing of the forward is stored but O and LSE: every tile recomputes
///   S = scale Q_i K_j^T (softcapped: impl/score.hpp), P = exp(S - LSE), dP = dO_i V_j^T,
///   dS = P * (dP * Z - delta) (times the transform's dS/dx, 1 - tanh^2 under softcap),
/// where delta = rowsum(dO * O) - dLSE comes from a small preprocessing kernel (the dLSE term
/// is the gradient through the LSE: dLSE/dS = P) and Z is the dropout weight (1 without
/// dropout; regenerated from the element's position, impl/dropout.hpp). Then
///   dV_j += (P * Z)^T dO_i,  dK_j += scale dS^T Q_i,  dQ_i += scale dS K_j.
/// (With O = (P * Z) V, rowsum(dO * O) = rowsum(P * Z * dP) still, so delta needs no mask.)
///
/// KeyValueKernel: one team per (batch, kv head, key tile K_j). It keeps K_j, K_j^T, V_j^T and
/// the accumulators dK_j, dV_j in team scratch and walks the query heads of its group and the
/// query tiles the mask leaves visible, so dK and dV (summed over the group in a fixed order)
/// are written once, without atomics. With `atomic_dq` it also adds each tile's dQ_i into dq
/// with atomics (FlashAttention-2's Algorithm 2); without, QueryKernel recomputes the tiles in
/// a query-outer pass that owns dQ_i, so all three gradients are bitwise repeatable.
///
/// Threads own query rows while S, P, dP and dS are formed, and key rows while dK_j and dV_j
/// accumulate; vector lanes share the keys or the head_dim as in the forward.
///
/// Under MultiScaleRule (impl/rule.hpp) the same kernels run with the row statistic r in
/// LSE's place and c = [r >= 1] (dO . O) / max(r, 1) in delta's; the row step then makes
/// P = S / d and dS = M (dP / d - c sign(S)), which is dL/dx for x = scale q.k, so dQ, dK and
/// dV follow from the unchanged products.

#include <kfa/backends/traits.hpp>
#include <kfa/combine.hpp>
#include <kfa/impl/bias.hpp>
#include <kfa/impl/counters.hpp>
#include <kfa/impl/dropout.hpp>
#include <kfa/impl/launch.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/packed.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/rule.hpp>
#include <kfa/impl/score.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/impl/workspace.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kfa::impl {

/// The views of a backward pass, carried as one value by the kernels, and where its sequences
/// lie in them (impl/packed.hpp: a padded batch, or packed sequences in batch 0).
template <class Q, class K, class V, class DO, class Lse, class DQ, class DK, class DV,
          class Seqs = PaddedBatch>
struct BackwardViews {
  using dq_value = typename DQ::value_type;  ///< float for narrow types on the atomic path
  Q q;
  K k;
  V v;
  DO dout;
  Lse lse;
  DQ dq;
  DK dk;
  DV dv;
  Seqs seqs{};
};

/// What the backward kernels share: the views, the problem sizes, the mask and the row step.
template <class ExecSpace, class T, class Views, class Rule = SoftmaxRule>
struct BackwardCommon : TeamKernel<ExecSpace, T> {
  using base = TeamKernel<ExecSpace, T>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using typename base::traits;
  /// Teams of one thread without vector lanes (the host's): the tile steps take the backend's
  /// blocked forms (transposes in registers, Philox blocks 16 at a time). Elsewhere they keep
  /// the element loops the team's threads and lanes share.
  static constexpr bool one_thread = traits::team_size == 1 && traits::vector_length == 1;
  // Strided, so that a block of rows of a larger problem's delta can be passed (kfa::mpi).
  using delta_view = Kokkos::View<acc_t***, Kokkos::LayoutStride, typename ExecSpace::memory_space>;

  Views t;           // q, k, v, dout, lse, dq, dk, dv
  delta_view delta;  // rowsum(dO * O) - dLSE, (batch, heads_q, seqlen_q)
  // Add into dq, dk and dv instead of writing them: a block of a larger problem whose
  // gradients sum over blocks (kfa::mpi). Without atomic dQ the sums stay bitwise repeatable.
  bool accumulate = false;
  int heads_q, heads_k, group, seqlen_q, seqlen_k, head_dim;
  int head_dim_v;  // Dv: v's, dout's and dv's head dim, which may differ from q's and k's D
  int Bt, q_tiles, k_tiles;  // Br = Bc = Bt
  // Row strides of the scratch tiles D, Dv and Bt wide (Q_i, K_j, dQ_i, dK_j; dO_i, dV_j;
  // P, dS and the transposes): padded by traits::pad.
  int ldd, ldv, ldt;
  using bias_t = typename bias_of<Rule, acc_t>::type;  // the additive term (impl/bias.hpp)
  ScoreTransform<acc_t, bias_t> score;
  Mask mask;
  Dropout<acc_t> dropout;
  int level_kv, level_q;  // scratch levels of KeyValueKernel and QueryKernel
  Rule rule;
  TileCount<typename ExecSpace::memory_space> tiles_staged;  // KFA_TEST_COUNTERS only
  static constexpr bool packed = decltype(Views::seqs)::packed;

  BackwardCommon(const Views& views, const delta_view& delta_, const Params& p,
                 const Origin& at = {}, const Rule& rule_ = {})
      : t(views), delta(delta_), rule(rule_) {
    heads_q = static_cast<int>(t.q.extent(1));
    heads_k = static_cast<int>(t.k.extent(1));
    group = heads_q / heads_k;
    seqlen_q = static_cast<int>(t.q.extent(2));
    seqlen_k = static_cast<int>(t.k.extent(2));
    head_dim = static_cast<int>(t.q.extent(3));
    head_dim_v = static_cast<int>(t.v.extent(3));
    Bt = traits::block_bwd(tile_dim(head_dim, head_dim_v));
    ldd = head_dim + traits::pad;
    ldv = head_dim_v + traits::pad;
    ldt = Bt + traits::pad;
    q_tiles = (seqlen_q + Bt - 1) / Bt;
    k_tiles = (seqlen_k + Bt - 1) / Bt;
    mask = make_mask(p, seqlen_q, seqlen_k, at);
    score = ScoreTransform<acc_t, bias_t>(p, head_dim, bias_of<Rule, acc_t>::make(rule, mask, at));
    if constexpr (!Rule::softmax) score.scale = rule.scale;
    dropout = make_dropout<acc_t>(p, at);
    level_kv = base::scratch_level(scratch_bytes(true));
    level_q = base::scratch_level(scratch_bytes(false));
  }

  /// out = x, or out += x when accumulating, rounded once to out's type (a narrow type is
  /// summed in acc_t, not in 16 bits).
  template <class Out>
  KOKKOS_INLINE_FUNCTION void store(Out& out, acc_t x) const {
    store(out, x, accumulate);
  }
  /// The same rule for a caller that holds `accumulate` itself (a kernel's by-value state).
  template <class Out>
  static KOKKOS_INLINE_FUNCTION void store(Out& out, acc_t x, bool accumulate) {
    out = Out(accumulate ? static_cast<acc_t>(out) + x : x);
  }

  /// Writes (or adds, when accumulating) the dK_j and dV_j accumulators of key tile k0 (nc
  /// keys) of kv head (b, hk): rows ldd and ldv apart in scratch.
  KOKKOS_INLINE_FUNCTION void store_dk_dv(const member_t& team, int b, int hk, int k0, int nc,
                                          const acc_t* dks, const acc_t* dvs) const {
    if (head_dim == head_dim_v) {  // one pass over the tile's rows
      ops::for_each_element(team, nc, head_dim, [&](int c, int d) {
        const int idx = c * ldd + d;
        store(t.dk(b, hk, k0 + c, d), dks[idx]);
        store(t.dv(b, hk, k0 + c, d), dvs[idx]);
      });
      return;
    }
    ops::for_each_element(team, nc, head_dim,
                          [&](int c, int d) { store(t.dk(b, hk, k0 + c, d), dks[c * ldd + d]); });
    ops::for_each_element(team, nc, head_dim_v,
                          [&](int c, int d) { store(t.dv(b, hk, k0 + c, d), dvs[c * ldv + d]); });
  }

  /// Whether any row of the query tile at q0 (nr rows) sees any key of the tile at k0 (nc keys)
  /// (Mask::tile_visible). Key padding (a term with key_limit) also hides the key tiles past
  /// batch b's length.
  KOKKOS_INLINE_FUNCTION bool tiles_meet(int b, int q0, int nr, int k0, int nc) const {
    if constexpr (has_key_limit<bias_t>::value)
      if (k0 >= key_limit_of(score.bias, b, seqlen_k)) return false;
    return mask.tile_visible(q0, nr, k0, nc);
  }

  /// Whether a boolean mask (is_visibility) leaves visible any pair of the query tile at q0 (nr
  /// rows, head h of batch b) and the key tile at k0 (nc keys) that the interval masks leave
  /// (tiles_meet is asked first), by the whole team: a tile pair the mask hides entirely is
  /// skipped as the interval masks' are (mask_sees_tile). true without a boolean mask.
  KOKKOS_INLINE_FUNCTION bool mask_meets(const member_t& team, int b, int h, int q0, int nr, int k0,
                                         int nc) const {
    if constexpr (is_visibility<bias_t>::value) {
      return mask_sees_tile(team, score.bias.line(b, h), mask, q0, nr, k0, nc);
    } else {
      (void)team, (void)b, (void)h, (void)q0, (void)nr, (void)k0, (void)nc;
      return true;
    }
  }

  /// Launches `kernel`: the key-tile kernel (`key_outer`: one team per (batch, kv head, key
  /// tile), with the dK_j and dV_j accumulators in scratch) or the query-tile kernel (one team
  /// per (batch, query head, query tile)).
  template <class Kernel>
  void launch(const ExecSpace& space, const char* label, const Kernel& kernel,
              bool key_outer) const {
    const int heads = key_outer ? heads_k : heads_q;
    long long tiles = key_outer ? k_tiles : q_tiles;
    tiles *= static_cast<long long>(t.q.extent(0));
    if constexpr (packed) tiles = key_outer ? t.seqs.total_key_tiles : t.seqs.total_tiles;
    base::launch(space, "backward", label, kernel, heads * tiles, scratch_bytes(key_outer),
                 key_outer ? level_kv : level_q, {head_dim, Bt, Bt});
  }

  /// Places this copy of a kernel on the packed sequence `at` (PackedSequences::Seq): its rows
  /// of the views, its lengths and the diagonal they give the masks and ALiBi, and its index as
  /// dropout's batch, so that the rest of the kernel runs it as a batch of one.
  template <class Seq>
  KOKKOS_INLINE_FUNCTION void enter(const Seq& at) {
    seqlen_q = at.nq;
    seqlen_k = at.nk;
    q_tiles = (at.nq + Bt - 1) / Bt;
    k_tiles = (at.nk + Bt - 1) / Bt;
    mask.seqlen_k = at.nk;
    mask.shift = t.seqs.shift(at.nq, at.nk);
    if constexpr (bias_t::enabled) score.bias.shift = mask.shift;  // ALiBi, the one packed term
    dropout.b_origin = at.s;
    const auto qb = static_cast<std::ptrdiff_t>(at.q_begin),
               kb = static_cast<std::ptrdiff_t>(at.k_begin);
    rows_from(t.q, qb);
    rows_from(t.dout, qb);
    rows_from(t.lse, qb);
    rows_from(t.dq, qb);
    rows_from(delta, qb);
    rows_from(t.k, kb);
    rows_from(t.v, kb);
    rows_from(t.dk, kb);
    rows_from(t.dv, kb);
  }
  /// x re-pointed to start at row `first` of its dimension 2 (rows of a sequence).
  template <class X>
  KOKKOS_INLINE_FUNCTION static void rows_from(X& x, std::ptrdiff_t first) {
    x = X(x.data() + first * static_cast<std::ptrdiff_t>(x.stride(2)), x.layout());
  }

  /// The kernel `k` (a copy of which is placed on its team's sequence when packed) on the team:
  /// k.run(team, rank), rank the team's index in its batch of one (the league index when
  /// padded). The league enumerates (global tile, head) when packed, key tiles for `keys`.
  template <class Kernel>
  KOKKOS_INLINE_FUNCTION static void dispatch(const Kernel& k, const member_t& team, bool keys) {
    if constexpr (packed) {
      const int r = team.league_rank(), heads = keys ? k.heads_k : k.heads_q;
      const auto at = k.t.seqs.locate(r / heads, keys);
      Kernel self = k;
      self.enter(at);
      self.run(team, (r % heads) * (keys ? self.k_tiles : self.q_tiles) + at.tile);
    } else {
      k.run(team, team.league_rank());
    }
  }

  /// Team scratch of a backward kernel: the tiles both kernels stage (K_j (Bt x D), K_j^T
  /// (D x Bt), V_j^T (Dv x Bt), Q_i and a dQ_i accumulator (Bt x D), dO_i (Bt x Dv), P and dS
  /// (Bt x Bt), LSE and delta (Bt)) plus, for the key-tile kernel, the dK_j (Bt x D) and dV_j
  /// (Bt x Dv) accumulators.
  /// Sized and carved in one place so the two cannot drift apart.
  struct Tiles {
    acc_t *ks, *kt, *vt, *qs, *dos, *dqs, *p, *ds, *lse_s, *delta_s;
    acc_t* dks = nullptr;
    acc_t* dvs = nullptr;
  };

  /// What a team of a launch works on: batch b, head h (the kv head when key_outer), the
  /// first row t0 of its tile and the tile's n rows, and its scratch tiles.
  struct TeamWork {
    int b, h, t0, n;
    Tiles sc;
  };
  KOKKOS_INLINE_FUNCTION TeamWork team_work(const member_t& team, int rank, bool key_outer) const {
    const int heads = key_outer ? heads_k : heads_q, tiles = key_outer ? k_tiles : q_tiles;
    const int seqlen = key_outer ? seqlen_k : seqlen_q;
    const int t0 = rank % tiles * Bt, bh = rank / tiles;
    return {bh / heads, bh % heads, t0, tile_rows(t0, seqlen), carve(team, key_outer)};
  }

  /// Rows of the tile that starts at row t0 of a sequence of `seqlen`.
  KOKKOS_INLINE_FUNCTION int tile_rows(int t0, int seqlen) const {
    return seqlen - t0 < Bt ? seqlen - t0 : Bt;
  }

  /// The head dim the traits size the tiles for: the larger of D and Dv, so that every tile
  /// fits as it does when both are that dim.
  static constexpr int tile_dim(int head_dim, int head_dim_v) {
    return head_dim > head_dim_v ? head_dim : head_dim_v;
  }

  /// Team scratch of the key-tile kernel (`with_dkdv`) or the query-tile kernel at head_dim
  /// and head_dim_v (0: head_dim): a function of the head dims alone, so that it can be
  /// reported without a launch (perf/cuda_report.sh). The order of carve(), tile by tile.
  static std::size_t scratch_bytes(int head_dim, bool with_dkdv, int head_dim_v = 0) {
    if (head_dim_v <= 0) head_dim_v = head_dim;
    const std::size_t bt = traits::block_bwd(tile_dim(head_dim, head_dim_v)), d = head_dim,
                      dv = head_dim_v, ldd = d + traits::pad, ldv = dv + traits::pad,
                      ldt = bt + traits::pad;
    const std::size_t tile = bt * ldd, tile_v = bt * ldv, sq = bt * ldt, row = bt;
    return with_dkdv ? base::scratch_bytes({tile, tile, tile_v, tile, d * ldt, dv * ldt, tile,
                                            tile_v, sq, sq, row, row})
                     : base::scratch_bytes(
                           {tile, tile, tile_v, tile, d * ldt, dv * ldt, sq, sq, row, row});
  }
  std::size_t scratch_bytes(bool with_dkdv) const {
    return scratch_bytes(head_dim, with_dkdv, head_dim_v);
  }

  KOKKOS_INLINE_FUNCTION Tiles carve(const member_t& team, bool with_dkdv) const {
    return carve(team.team_scratch(with_dkdv ? level_kv : level_q), with_dkdv);
  }
  /// The tiles carved from `scr` (what scratch_bytes counts), leaving the rest of it to the
  /// caller (SymmetricKernel carves a second set of tiles after them).
  KOKKOS_INLINE_FUNCTION Tiles carve(const typename ExecSpace::scratch_memory_space& scr,
                                     bool with_dkdv) const {
    const std::size_t tile = std::size_t(Bt) * ldd, tile_v = std::size_t(Bt) * ldv,
                      sq = std::size_t(Bt) * ldt;
    Tiles s;
    s.ks = base::carve(scr, tile);
    s.qs = base::carve(scr, tile);
    s.dos = base::carve(scr, tile_v);
    s.dqs = base::carve(scr, tile);
    s.kt = base::carve(scr, std::size_t(head_dim) * ldt);
    s.vt = base::carve(scr, std::size_t(head_dim_v) * ldt);
    if (with_dkdv) {
      s.dks = base::carve(scr, tile);
      s.dvs = base::carve(scr, tile_v);
    }
    s.p = base::carve(scr, sq);
    s.ds = base::carve(scr, sq);
    s.lse_s = base::carve(scr, std::size_t(Bt));
    s.delta_s = base::carve(scr, std::size_t(Bt));
    return s;
  }

  /// Stages the query-side rows of tile q0 (nr rows) of head (b, h): Q_i pre-multiplied by the
  /// scale, dO_i, LSE and delta.
  KOKKOS_INLINE_FUNCTION void load_query_tile(const member_t& team, int b, int h, int q0, int nr,
                                              acc_t* qs, acc_t* dos, acc_t* lse_s,
                                              acc_t* delta_s) const {
    base::stage_rows(
        team, nr, head_dim, [&](int r) { return &t.q(b, h, q0 + r, 0); }, qs, ldd,
        [&](auto x) { return score.scaled(static_cast<acc_t>(x)); });
    base::stage_rows(
        team, nr, head_dim_v, [&](int r) { return &t.dout(b, h, q0 + r, 0); }, dos, ldv,
        [](auto x) { return static_cast<acc_t>(x); });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr), [&](int r) {
      lse_s[r] = static_cast<acc_t>(t.lse(b, h, q0 + r));
      delta_s[r] = delta(b, h, q0 + r);
    });
  }

  /// Stages key tile k0 (nc keys) of kv head (b, hk): K_j (nc x D), K_j^T (D x Bt) and V_j^T
  /// (Dv x Bt). One-thread teams: the transposes by the backend's stage_transposed (8 x 8
  /// register blocks on the host, where the element loop stores one scattered element at a
  /// time).
  KOKKOS_INLINE_FUNCTION void load_key_tile(const member_t& team, int b, int hk, int k0, int nc,
                                            acc_t* ks, acc_t* kt, acc_t* vt) const {
    if constexpr (one_thread) {
      const auto k_row = [&](int c) { return &t.k(b, hk, k0 + c, 0); };
      base::stage_rows(team, nc, head_dim, k_row, ks, ldd,
                       [](auto x) { return static_cast<acc_t>(x); });
      ops::stage_transposed(team, nc, 0, head_dim, k_row, kt, ldt);
      ops::stage_transposed(
          team, nc, 0, head_dim_v, [&](int c) { return &t.v(b, hk, k0 + c, 0); }, vt, ldt);
      return;
    }
    if (head_dim == head_dim_v) {  // one pass over the tile's rows
      ops::for_each_element(team, nc, head_dim, [&](int c, int d) {
        const acc_t kv = static_cast<acc_t>(t.k(b, hk, k0 + c, d));
        ks[c * ldd + d] = kv;
        kt[d * ldt + c] = kv;
        vt[d * ldt + c] = static_cast<acc_t>(t.v(b, hk, k0 + c, d));
      });
      return;
    }
    ops::for_each_element(team, nc, head_dim, [&](int c, int d) {
      const acc_t kv = static_cast<acc_t>(t.k(b, hk, k0 + c, d));
      ks[c * ldd + d] = kv;
      kt[d * ldt + c] = kv;
    });
    ops::for_each_element(team, nc, head_dim_v, [&](int c, int d) {
      vt[d * ldt + c] = static_cast<acc_t>(t.v(b, hk, k0 + c, d));
    });
  }

  /// P * Z and dS of query tile q0 (nr rows, staged in sc) of head (b, h) against key tile k0
  /// (nc keys), into sc.p and sc.ds (Bt x Bt, columns [0, nc)): S = Q_i K_j^T and
  /// dP = dO_i V_j^T as tile products on the keys any row sees, then the row step. Ends with a
  /// team barrier, so the caller may read P and dS at once. `owner`: this call is the one pass
  /// over the element that hands dL/dS to an additive term with a gradient (the key-tile pass).
  KOKKOS_INLINE_FUNCTION void tile_p_ds(const member_t& team, int b, int h, int q0, int nr, int k0,
                                        int nc, const Tiles& sc, bool owner) const {
    int cb, ce;  // never empty: callers check tiles_meet first
    mask.tile_columns(q0, nr, k0, nc, cb, ce);
    ops::gemm(team, nr, ce - cb, head_dim, sc.qs, ldd, 1, sc.kt + cb, ldt, sc.p + cb, ldt,
              false);  // S
    ops::gemm(team, nr, ce - cb, head_dim_v, sc.dos, ldv, 1, sc.vt + cb, ldt, sc.ds + cb, ldt,
              false);  // dP
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
      row_p_ds(team, b, h, q0 + r, k0, nc, sc.lse_s[r], sc.delta_s[r], sc.p + r * ldt,
               sc.ds + r * ldt, owner);
    });
    team.team_barrier();
  }

  /// Row i of head (b, h) against the key tile at k0 (nc keys): turns the scores S in prow and
  /// dP in dsrow into P * Z and dS (zero for masked keys, and for the whole row when the query
  /// saw no key). With `owner`, hands dL/dS of each visible element to the additive term.
  KOKKOS_INLINE_FUNCTION void row_p_ds(const member_t& team, int b, int h, int i, int k0, int nc,
                                       acc_t lse_i, acc_t delta_i, acc_t* prow, acc_t* dsrow,
                                       bool owner) const {
    const int lo = mask.lo(i) - k0, hi = mask.hi(i) + 1 - k0;
    int c0 = lo > 0 ? lo : 0, c1 = hi < nc ? hi : nc;
    // A query that saw no key has LSE = -inf; its P is 0, not exp(+inf). (Multi-scale: r is
    // finite, and such a row's S is 0.)
    if (c0 >= c1 || (Rule::softmax && !(lse_i > -backends::infinity<acc_t>()))) c0 = c1 = nc;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0), [&](int c) {
      prow[c] = acc_t(0);
      dsrow[c] = acc_t(0);
    });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c1, nc), [&](int c) {
      prow[c] = acc_t(0);
      dsrow[c] = acc_t(0);
    });
    if (c0 >= c1) return;
    if constexpr (!Rule::softmax) {  // lse_i is r, delta_i is c
      const msa::Partial<acc_t> row{lse_i};
      const acc_t inv_d = acc_t(1) / msa::denominator(row);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) {
        const acc_t w = rule.weight(h, i, k0 + c), s = prow[c] * w;
        const acc_t sign_c = s > acc_t(0) ? delta_i : s < acc_t(0) ? -delta_i : acc_t(0);
        prow[c] = s * inv_d;
        dsrow[c] = w * (dsrow[c] * inv_d - sign_c);
      });
      return;
    }
    if (!dropout.enabled && score.identity()) {     // the common case, vectorised
      ops::row_exp_sum(team, prow, c0, c1, lse_i);  // P = exp(S - LSE); the sum is not needed
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1),
                           [&](int c) { dsrow[c] = prow[c] * (dsrow[c] - delta_i); });
      return;
    }
    if constexpr (one_thread)
      if (score.identity()) {
        // Dropout without a transform: P by the vectorised exp, then the weights of a run of
        // 64 keys at a time (16 Philox blocks) in a loop the compiler vectorises.
        ops::row_exp_sum(team, prow, c0, c1, lse_i);
        for (int ca = c0; ca < c1;) {
          acc_t z[64];
          const int first = dropout.template row_weights64<ops>(b, h, i, k0, ca, z);
          const int cz = first + 64 < c1 ? first + 64 : c1;
          for (int c = ca; c < cz; ++c) {
            const acc_t p = prow[c], zc = z[c - first];
            prow[c] = p * zc;
            dsrow[c] = p * (dsrow[c] * zc - delta_i);
          }
          ca = cz;
        }
        return;
      }
    dropout.for_each(team, b, h, i, k0, c0, c1, [&](int c, acc_t z) {
      acc_t slope;
      const acc_t p = backends::exp(score.at(prow[c], b, h, i, k0 + c, slope) - lse_i);
      prow[c] = p * z;
      // dL/dS (an additive term's gradient) times dS/dx.
      const acc_t g = p * (dsrow[c] * z - delta_i);
      if constexpr (bias_t::has_gradient)
        if (owner && score.bias.wants_gradient()) score.bias.gradient(b, h, i, k0 + c, g);
      dsrow[c] = g * slope;
    });
  }
};

/// delta = rowsum(dO * O) - dLSE, one work item per (batch, head, query) row; also zeroes the
/// row of dq when the key-tile teams are to add into it. Multi-scale (`rsum`): dlse holds r,
/// and delta = c = [r >= 1] rowsum(dO * O) / max(r, 1).
template <class ExecSpace, class Delta, class DO, class O, class DLse, class DQ>
struct BackwardPreprocess {
  using acc_t = typename Delta::value_type;
  Delta delta;
  DO dout;
  O o;
  DLse dlse;  // rank-3 view, or an empty one when there is no LSE gradient
  bool has_dlse;
  DQ dq;
  bool zero_dq;
  bool rsum;

  void launch(const ExecSpace& space) const {
    const std::size_t n = delta.size();
    if (n == 0) return;
    Kokkos::parallel_for(
        "kfa::backward::delta",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::size_t>>(space, 0, n), *this);
  }

  KOKKOS_FUNCTION void operator()(std::size_t idx) const {
    const int nq = static_cast<int>(delta.extent(2)), hq = static_cast<int>(delta.extent(1));
    const int i = static_cast<int>(idx % nq);
    const int h = static_cast<int>(idx / nq % hq);
    const int b = static_cast<int>(idx / nq / hq);
    const int D = static_cast<int>(o.extent(3));
    acc_t sum = 0;  // fused: the same bits for every layout of dout and o (portability.hpp)
    for (int d = 0; d < D; ++d)
      sum = backends::fma(static_cast<acc_t>(dout(b, h, i, d)), static_cast<acc_t>(o(b, h, i, d)),
                          sum);
    if (rsum) {
      const acc_t r = static_cast<acc_t>(dlse(b, h, i));
      sum = r >= acc_t(1) ? sum / r : acc_t(0);
    } else if (has_dlse) {
      sum -= static_cast<acc_t>(dlse(b, h, i));
    }
    delta(b, h, i) = sum;
    if (zero_dq)
      for (int d = 0; d < static_cast<int>(dq.extent(3)); ++d)  // D, not o's Dv
        dq(b, h, i, d) = typename DQ::value_type(acc_t(0));
  }
};

/// dK, dV (and, with atomic_dq, dQ by atomic adds): one team per (batch, kv head, key tile).
template <class ExecSpace, class T, class Views, class Rule = SoftmaxRule>
struct KeyValueKernel : BackwardCommon<ExecSpace, T, Views, Rule> {
  using base = BackwardCommon<ExecSpace, T, Views, Rule>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  bool atomic_dq;

  /// Narrow dq types take no atomic adds: impl::backward gives them a float accumulator.
  static constexpr bool atomic_capable =
      !backends::is_narrow_float<typename Views::dq_value>::value;

  /// Kokkos::Serial: one thread, whose dQ adds need no atomics.
#ifdef KOKKOS_ENABLE_SERIAL
  static constexpr bool serial_space = std::is_same_v<ExecSpace, Kokkos::Serial>;
#else
  static constexpr bool serial_space = false;
#endif

  KeyValueKernel(const base& common, bool atomic_dq_) : base(common), atomic_dq(atomic_dq_) {
    if (atomic_dq && !atomic_capable)
      fail("backward", "internal: atomic dQ into a 16-bit view (use a float accumulator)");
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const {
    base::dispatch(*this, team, true);
  }

  /// The team of index `rank` in its batch (base::dispatch).
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, int rank) const {
    const int D = this->head_dim, Dv = this->head_dim_v, ldd = this->ldd, ldv = this->ldv,
              ldt = this->ldt;
    const auto work = this->team_work(team, rank, true);
    const auto& sc = work.sc;
    const int b = work.b, hk = work.h, k0 = work.t0, nc = work.n;

    this->load_key_tile(team, b, hk, k0, nc, sc.ks, sc.kt, sc.vt);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nc * ldd),
                         [&](int idx) { sc.dks[idx] = acc_t(0); });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nc * ldv),
                         [&](int idx) { sc.dvs[idx] = acc_t(0); });

    for (int h = hk * this->group; h < (hk + 1) * this->group; ++h)
      for (int qt = 0; qt < this->q_tiles; ++qt) {
        const int q0 = qt * this->Bt;
        const int nr = this->tile_rows(q0, this->seqlen_q);
        if (!this->tiles_meet(b, q0, nr, k0, nc) || !this->mask_meets(team, b, h, q0, nr, k0, nc))
          continue;
        team.team_barrier();  // the previous query tile is no longer read
        this->tiles_staged.add(team, TileCounter::key_value, nr);
        this->load_query_tile(team, b, h, q0, nr, sc.qs, sc.dos, sc.lse_s, sc.delta_s);
        team.team_barrier();
        this->tile_p_ds(team, b, h, q0, nr, k0, nc, sc, true);
        if constexpr (atomic_capable) {
          if (atomic_dq) {  // dQ_i += scale dS K_j, added into dq
            ops::gemm(team, nr, D, nc, sc.ds, ldt, 1, sc.ks, ldd, sc.dqs, ldd, false);
            team.team_barrier();
            if constexpr (serial_space) {
              // One thread: plain adds a row at a time (dq has unit stride in d), which the
              // compiler vectorises (and may fuse with the multiply: a rounding fewer than the
              // atomic's product-then-add); the element-wise atomic_add below, one call per
              // element (a compare-and-swap loop where Kokkos has other host spaces too), cost
              // ~13 % of a backward at N = 2048 on one core.
              const acc_t scale = this->score.scale;  // scaled(x), hoisted
              for (int r = 0; r < nr; ++r) {
                auto* dst = &this->t.dq(b, h, q0 + r, 0);
                const acc_t* src = sc.dqs + static_cast<std::ptrdiff_t>(r) * ldd;
                for (int d = 0; d < D; ++d)
                  dst[d] += typename Views::dq_value(scale * src[d]);
              }
            } else {
              ops::for_each_element(team, nr, D, [&](int r, int d) {
                Kokkos::atomic_add(
                    &this->t.dq(b, h, q0 + r, d),
                    typename Views::dq_value(this->score.scaled(sc.dqs[r * ldd + d])));
              });
            }
          }
        }
        // dV_j += P^T dO_i and dK_j += dS^T (scale Q_i), reading P and dS transposed in place.
        ops::gemm(team, nc, Dv, nr, sc.p, 1, ldt, sc.dos, ldv, sc.dvs, ldv, true);
        ops::gemm(team, nc, D, nr, sc.ds, 1, ldt, sc.qs, ldd, sc.dks, ldd, true);
      }
    team.team_barrier();
    this->store_dk_dv(team, b, hk, k0, nc, sc.dks, sc.dvs);
  }
};

/// dK, dV and, by atomic adds, dQ with the work in registers (TileTraits::warp_backward: CUDA,
/// 16-bit inputs; TileOps::warp_backward, cuda/warp_backward.hpp): one team per (batch, kv
/// head, tile of TileOps::warp_keys keys) walks the query heads of its group and the query
/// tiles the mask leaves visible, as KeyValueKernel does with atomic dQ. Taken (`takes`) for
/// softmax attention at the head dims it has with Dv = D, dQ into a float accumulator, every
/// row of q, k, v, dout and dq on 16 bytes, and neither softcap nor an additive term; the tile
/// kernels run everything else. Dropout is drawn in its registers (WarpMask::kept), by a
/// kernel of its own (Kernel<D, true>) so that the common kernel holds no Philox.
template <class ExecSpace, class T, class Views, class Rule = SoftmaxRule>
struct WarpKeyValueKernel : BackwardCommon<ExecSpace, T, Views, Rule> {
  using base = BackwardCommon<ExecSpace, T, Views, Rule>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using typename base::traits;
  using value_type = typename decltype(Views::q)::non_const_value_type;
  template <class X>
  static constexpr bool same_16_bit = std::is_same_v<typename X::non_const_value_type, value_type>;
  /// Whether the types allow it at all (the rest is `takes`).
  static constexpr bool possible =
      Rule::softmax && !base::bias_t::enabled && !base::packed && traits::warp_backward &&
      sizeof(value_type) == 2 && same_16_bit<decltype(Views::k)> &&
      same_16_bit<decltype(Views::v)> && same_16_bit<decltype(Views::dout)> &&
      std::is_same_v<typename Views::dq_value, float>;

  explicit WarpKeyValueKernel(const base& common) : base(common) {}

  /// Whether `common`'s problem runs here when dQ is added with atomics.
  static bool takes(const base& c) {
    if constexpr (possible)
      return ops::warp_head_dim(c.head_dim) && c.head_dim_v == c.head_dim && c.score.identity() &&
             base::rows_on_16_bytes(c.t.q) && base::rows_on_16_bytes(c.t.k) &&
             base::rows_on_16_bytes(c.t.v) && base::rows_on_16_bytes(c.t.dout) &&
             base::rows_on_16_bytes(c.t.dq);
    (void)c;
    return false;
  }

  /// What cuda::WarpBackward asks of the mask: the interval mask's answers and, with Dropped,
  /// which elements dropout keeps (query head h of the team's group).
  template <bool Dropped>
  struct WarpMask {
    static constexpr bool dropped = Dropped;  ///< whether kept is to be called
    // References to the kernel's members, not copies: copies made the kernel without dropout
    // spill 4-8 bytes on sm_90 (its registers are at 255).
    const Mask& mask;
    const Dropout<acc_t>& dropout;
    int b, h0;
    KOKKOS_INLINE_FUNCTION bool tile_visible(int q0, int n, int k0, int nc) const {
      return mask.tile_visible(q0, n, k0, nc);
    }
    KOKKOS_INLINE_FUNCTION bool tile_inside(int q0, int n, int k0, int nc) const {
      return mask.tile_inside(q0, n, k0, nc);
    }
    KOKKOS_INLINE_FUNCTION bool visible(int i, int j) const { return mask.visible(i, j); }
    /// Whether dropout keeps query i of head h0 + h against key j.
    KOKKOS_INLINE_FUNCTION bool kept(int h, int i, int j) const {
      return dropout.kept(b, h0 + h, i, j);
    }
    /// The same for keys j .. j + 3 (bits 0 .. 3), where group_starts(j) (Dropout::kept4).
    KOKKOS_INLINE_FUNCTION unsigned kept4(int h, int i, int j) const {
      return dropout.kept4(b, h0 + h, i, j);
    }
    /// Whether one of dropout's groups of four keys (one Philox call each) starts at key j.
    KOKKOS_INLINE_FUNCTION bool group_starts(int j) const { return dropout.group_starts(j); }
    /// The weight of a kept element, 1 / (1 - p).
    KOKKOS_INLINE_FUNCTION acc_t keep_scale() const { return dropout.scale; }
  };

  /// One team: batch, kv head and key tile from the league rank.
  template <int HeadDim, bool Dropped>
  struct Kernel {
    WarpKeyValueKernel kk;
    KOKKOS_FUNCTION void operator()(const member_t& team) const {
      const int keys = ops::warp_keys, k_tiles = (kk.seqlen_k + keys - 1) / keys;
      const int rank = team.league_rank();
      const int kt = rank % k_tiles, hk = rank / k_tiles % kk.heads_k,
                b = rank / k_tiles / kk.heads_k;
      const int k0 = kt * keys, nc = kk.seqlen_k - k0 < keys ? kk.seqlen_k - k0 : keys;
      const int h0 = hk * kk.group;
      using bits = const std::uint16_t*;
      // Views by value: a capture by reference would put them in local memory.
      const auto q = kk.t.q;
      const auto k = kk.t.k;
      const auto v = kk.t.v;
      const auto dout = kk.t.dout;
      const auto k_row = [=](int j) { return reinterpret_cast<bits>(&k(b, hk, j, 0)); };
      const auto v_row = [=](int j) { return reinterpret_cast<bits>(&v(b, hk, j, 0)); };
      const auto q_row = [=](int h, int i) { return reinterpret_cast<bits>(&q(b, h0 + h, i, 0)); };
      const auto do_row = [=](int h, int i) {
        return reinterpret_cast<bits>(&dout(b, h0 + h, i, 0));
      };
      struct Stats {
        decltype(Views::lse) lse_v;
        typename base::delta_view delta_v;
        int b, h0;
        KOKKOS_INLINE_FUNCTION float lse(int h, int i) const {
          return static_cast<float>(lse_v(b, h0 + h, i));
        }
        KOKKOS_INLINE_FUNCTION float delta(int h, int i) const {
          return static_cast<float>(delta_v(b, h0 + h, i));
        }
      } stats{kk.t.lse, kk.delta, b, h0};
      // The gradients' views by value too (base::store's rule: one rounding, added when
      // accumulating).
      struct Grads {
        decltype(Views::dq) dq_v;
        decltype(Views::dk) dk_v;
        decltype(Views::dv) dv_v;
        int b, hk, h0;
        bool accumulate;
        KOKKOS_INLINE_FUNCTION float* dq_row(int h, int i) const { return &dq_v(b, h0 + h, i, 0); }
        KOKKOS_INLINE_FUNCTION void dk(int j, int c, float x) const {
          base::store(dk_v(b, hk, j, c), x, accumulate);
        }
        KOKKOS_INLINE_FUNCTION void dv(int j, int c, float x) const {
          base::store(dv_v(b, hk, j, c), x, accumulate);
        }
      } grads{kk.t.dq, kk.t.dk, kk.t.dv, b, hk, h0, kk.accumulate};
      const WarpMask<Dropped> mask{kk.mask, kk.dropout, b, h0};
      ops::template warp_backward<HeadDim>(team, k0, nc, kk.group, kk.seqlen_q,
                                           static_cast<float>(kk.score.scale), k_row, v_row, q_row,
                                           do_row, stats, mask, grads);
    }
  };

  void launch(const ExecSpace& space) const {
    const int keys = ops::warp_keys;
    const long long league = static_cast<long long>(this->t.q.extent(0)) * this->heads_k *
                             ((this->seqlen_k + keys - 1) / keys);
    const int d = this->head_dim;
    const bool dropped = this->dropout.enabled;
    const typename base::base::Shape shape{d, ops::warp_backward_rows(d, dropped), keys};
    const std::size_t bytes = ops::warp_backward_scratch_bytes(d, dropped);
    const auto run = [&](auto kernel) {
      base::base::launch(space, "backward", "kfa::backward::dkdv", kernel, league, bytes, 0, shape);
    };
    if (d == 64 && dropped)
      run(Kernel<64, true>{*this});
    else if (d == 64)
      run(Kernel<64, false>{*this});
    else if (dropped)
      run(Kernel<128, true>{*this});
    else
      run(Kernel<128, false>{*this});
  }
};

/// dst(b, h, d, j) = src(b, h, j, d), converted to dst's type: the last two extents swapped.
template <class ExecSpace, class Src, class Dst>
void transpose_rows(const ExecSpace& space, const Src& src, const Dst& dst) {
  using value = typename Dst::non_const_value_type;
  Kokkos::parallel_for(
      "kfa::backward::transpose",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0},
          {static_cast<std::int64_t>(src.extent(0)), static_cast<std::int64_t>(src.extent(1)),
           static_cast<std::int64_t>(src.extent(2)), static_cast<std::int64_t>(src.extent(3))}),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t d) {
        dst(b, h, d, j) = static_cast<value>(src(b, h, j, d));
      });
}

/// dQ without atomics: one team per (batch, query head, query tile) owns dQ_i and recomputes
/// P and dS for every key tile it sees. K^T and V^T come from copies of K and V transposed
/// once per call (kt_all, vt_all: (batch, kv head, D or Dv, seqlen_k) in acc_t, as much memory
/// as K and V): every team stages every key tile, and transposing each in the team cost more
/// than the products of the tile on a one-thread host team.
template <class ExecSpace, class T, class Views, class Rule = SoftmaxRule>
struct QueryKernel : BackwardCommon<ExecSpace, T, Views, Rule> {
  using base = BackwardCommon<ExecSpace, T, Views, Rule>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using transposed_view =
      Kokkos::View<acc_t****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

  transposed_view kt_all, vt_all;

  /// kt and vt: (B, Hk, D, Nk) and (B, Hk, Dv, Nk) buffers (temporaries of the caller, which
  /// keep them until the kernel has run), filled here with K and V transposed.
  QueryKernel(const ExecSpace& space, const base& common, const transposed_view& kt,
              const transposed_view& vt)
      : base(common), kt_all(kt), vt_all(vt) {
    transpose_rows(space, this->t.k, kt_all);
    transpose_rows(space, this->t.v, vt_all);
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const {
    base::dispatch(*this, team, false);
  }

  /// The packed sequence `at` (base::enter), and its rows of the transposed K and V.
  template <class Seq>
  KOKKOS_INLINE_FUNCTION void enter(const Seq& at) {
    base::enter(at);
    const auto kb = static_cast<std::ptrdiff_t>(at.k_begin);  // keys are their last dimension
    kt_all = transposed_view(kt_all.data() + kb, kt_all.layout());
    vt_all = transposed_view(vt_all.data() + kb, vt_all.layout());
  }

  /// The team of index `rank` in its batch (base::dispatch).
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, int rank) const {
    const int D = this->head_dim, ldd = this->ldd, ldt = this->ldt;
    const auto work = this->team_work(team, rank, false);
    const auto& sc = work.sc;
    const int b = work.b, h = work.h, hk = h / this->group, q0 = work.t0, nr = work.n;

    this->load_query_tile(team, b, h, q0, nr, sc.qs, sc.dos, sc.lse_s, sc.delta_s);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr * this->ldd),
                         [&](int idx) { sc.dqs[idx] = acc_t(0); });
    for (int kt_i = 0; kt_i < this->k_tiles; ++kt_i) {
      const int k0 = kt_i * this->Bt;
      const int nc = this->tile_rows(k0, this->seqlen_k);
      if (!this->tiles_meet(b, q0, nr, k0, nc) || !this->mask_meets(team, b, h, q0, nr, k0, nc))
        continue;
      team.team_barrier();  // the previous key tile is no longer read
      this->tiles_staged.add(team, TileCounter::query, nc);
      load_key_tile(team, b, hk, k0, nc, sc);
      team.team_barrier();
      this->tile_p_ds(team, b, h, q0, nr, k0, nc, sc, false);
      ops::gemm(team, nr, D, nc, sc.ds, ldt, 1, sc.ks, ldd, sc.dqs, ldd, true);  // dQ_i += dS K_j
    }
    team.team_barrier();
    ops::for_each_element(team, nr, D, [&](int r, int d) {
      this->store(this->t.dq(b, h, q0 + r, d), this->score.scaled(sc.dqs[r * ldd + d]));
    });
  }

  /// K_j, K_j^T and V_j^T of key tile k0 (nc keys) as base::load_key_tile stages them, every
  /// one by row copies: K_j from k, the transposes from kt_all and vt_all.
  KOKKOS_INLINE_FUNCTION void load_key_tile(const member_t& team, int b, int hk, int k0, int nc,
                                            const typename base::Tiles& sc) const {
    const int D = this->head_dim, ldd = this->ldd, ldt = this->ldt;
    const auto same = [](acc_t x) { return x; };
    this->stage_rows(
        team, nc, D, [&](int c) { return &this->t.k(b, hk, k0 + c, 0); }, sc.ks, ldd,
        [](auto x) { return static_cast<acc_t>(x); });
    this->stage_rows(
        team, D, nc, [&](int d) { return &kt_all(b, hk, d, k0); }, sc.kt, ldt, same);
    this->stage_rows(
        team, this->head_dim_v, nc, [&](int d) { return &vt_all(b, hk, d, k0); }, sc.vt, ldt, same);
  }
};

/// All three gradients in one kernel for self-attention (DqMode::symmetric; seqlen_q ==
/// seqlen_k, heads_q == heads_k): one team per (batch, head, tile j) holds tile j in both roles
/// (K_j, K_j^T, V_j^T as keys; Q_j, dO_j, LSE_j, delta_j as queries) and, for every tile i that
/// meets it in either direction, stages tile i in the roles it needs and takes two tile steps:
/// (query tile i, key tile j) adds to dK_j and dV_j as KeyValueKernel does, (query tile j, key
/// tile i) adds to dQ_j as QueryKernel does. dQ_j, dK_j and dV_j are written once, at the end:
/// no atomics, no second launch, no transposed copies of K and V; every sum runs over i in
/// ascending order, as in the two-kernel path, so the result is bitwise repeatable. Twice the
/// scratch of the key-tile kernel (level 1 where level 0 is too small).
template <class ExecSpace, class T, class Views, class Rule = SoftmaxRule>
struct SymmetricKernel : BackwardCommon<ExecSpace, T, Views, Rule> {
  using base = BackwardCommon<ExecSpace, T, Views, Rule>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using typename base::Tiles;
  int level_sym;

  explicit SymmetricKernel(const base& common) : base(common) {
    level_sym = base::scratch_level(scratch_bytes(this->head_dim, this->head_dim_v));
  }

  /// The key-tile kernel's tiles for tile j, then tile i's: K_i, Q_i (Bt x D), dO_i
  /// (Bt x Dv), K_i^T (D x Bt), V_i^T (Dv x Bt), LSE_i and delta_i (Bt). head_dim_v 0:
  /// head_dim.
  static std::size_t scratch_bytes(int head_dim, int head_dim_v = 0) {
    using traits = typename base::traits;
    if (head_dim_v <= 0) head_dim_v = head_dim;
    const std::size_t bt = traits::block_bwd(base::tile_dim(head_dim, head_dim_v)), d = head_dim,
                      dv = head_dim_v, ldd = d + traits::pad, ldv = dv + traits::pad,
                      ldt = bt + traits::pad;
    const std::size_t tile = bt * ldd;
    return base::scratch_bytes(head_dim, true, head_dim_v) +
           base::base::scratch_bytes({tile, tile, bt * ldv, d * ldt, dv * ldt, bt, bt});
  }

  void launch(const ExecSpace& space) const {
    long long tiles = static_cast<long long>(this->t.q.extent(0)) * this->k_tiles;
    if constexpr (base::packed) tiles = this->t.seqs.total_key_tiles;
    base::base::launch(space, "backward", "kfa::backward::symmetric", *this, this->heads_q * tiles,
                       scratch_bytes(this->head_dim, this->head_dim_v), level_sym,
                       {this->head_dim, this->Bt, this->Bt});
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const { base::dispatch(*this, team, true); }

  /// The team of index `rank` in its batch (base::dispatch; heads_k = heads_q here).
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, int rank) const {
    const int D = this->head_dim, Dv = this->head_dim_v, ldd = this->ldd, ldv = this->ldv,
              ldt = this->ldt, tiles = this->k_tiles;
    const int j0 = rank % tiles * this->Bt, bh = rank / tiles;
    const int b = bh / this->heads_q, h = bh % this->heads_q;
    const int nj = this->tile_rows(j0, this->seqlen_k);
    const auto& scr = team.team_scratch(level_sym);
    const Tiles own = this->carve(scr, true);
    Tiles other = own;  // P, dS and the accumulators are shared; tile i gets its own inputs
    using arrays = typename base::base;  // TeamKernel::carve: n elements (base's is hidden)
    other.ks = arrays::carve(scr, std::size_t(this->Bt) * ldd);
    other.qs = arrays::carve(scr, std::size_t(this->Bt) * ldd);
    other.dos = arrays::carve(scr, std::size_t(this->Bt) * ldv);
    other.kt = arrays::carve(scr, std::size_t(D) * ldt);
    other.vt = arrays::carve(scr, std::size_t(Dv) * ldt);
    other.lse_s = arrays::carve(scr, std::size_t(this->Bt));
    other.delta_s = arrays::carve(scr, std::size_t(this->Bt));

    this->load_key_tile(team, b, h, j0, nj, own.ks, own.kt, own.vt);
    this->load_query_tile(team, b, h, j0, nj, own.qs, own.dos, own.lse_s, own.delta_s);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nj * ldd), [&](int idx) {
      own.dks[idx] = acc_t(0);
      own.dqs[idx] = acc_t(0);
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nj * ldv),
                         [&](int idx) { own.dvs[idx] = acc_t(0); });

    for (int i0 = 0; i0 < this->seqlen_q; i0 += this->Bt) {
      const int ni = this->tile_rows(i0, this->seqlen_q);
      const bool i_sees_j = this->tiles_meet(b, i0, ni, j0, nj) &&  // feeds dK_j, dV_j
                            this->mask_meets(team, b, h, i0, ni, j0, nj);
      const bool j_sees_i = this->tiles_meet(b, j0, nj, i0, ni) &&  // feeds dQ_j
                            this->mask_meets(team, b, h, j0, nj, i0, ni);
      if (!i_sees_j && !j_sees_i) continue;
      team.team_barrier();  // the previous tile i is no longer read
      this->tiles_staged.add(team, TileCounter::symmetric, ni);
      if (i_sees_j) {
        this->tiles_staged.add(team, TileCounter::symmetric_query, ni);
        this->load_query_tile(team, b, h, i0, ni, other.qs, other.dos, other.lse_s, other.delta_s);
      }
      if (j_sees_i) {
        this->tiles_staged.add(team, TileCounter::symmetric_key, ni);
        this->load_key_tile(team, b, h, i0, ni, other.ks, other.kt, other.vt);
      }
      team.team_barrier();
      if (i_sees_j) {  // rows of tile i against keys of tile j
        Tiles step = own;
        step.qs = other.qs;
        step.dos = other.dos;
        step.lse_s = other.lse_s;
        step.delta_s = other.delta_s;
        this->tile_p_ds(team, b, h, i0, ni, j0, nj, step, true);  // owns dS(i, j) for d_bias
        ops::gemm(team, nj, Dv, ni, own.p, 1, ldt, other.dos, ldv, own.dvs, ldv, true);
        ops::gemm(team, nj, D, ni, own.ds, 1, ldt, other.qs, ldd, own.dks, ldd, true);
      }
      if (j_sees_i) {                       // rows of tile j against keys of tile i
        if (i_sees_j) team.team_barrier();  // P and dS of the step above are no longer read
        Tiles step = own;
        step.ks = other.ks;
        step.kt = other.kt;
        step.vt = other.vt;
        this->tile_p_ds(team, b, h, j0, nj, i0, ni, step, false);
        ops::gemm(team, nj, D, ni, own.ds, ldt, 1, other.ks, ldd, own.dqs, ldd, true);
      }
    }
    team.team_barrier();
    this->store_dk_dv(team, b, h, j0, nj, own.dks, own.dvs);
    ops::for_each_element(team, nj, D, [&](int r, int d) {
      this->store(this->t.dq(b, h, j0 + r, d), this->score.scaled(own.dqs[r * ldd + d]));
    });
  }
};

/// delta = rowsum(dO * O) - dLSE into `delta` (dlse may be nullptr), zeroing dq when zero_dq;
/// with `rsum`, dlse is the multi-scale r and delta is c (BackwardPreprocess).
template <class ExecSpace, class Delta, class DO, class O, class DLse, class DQ>
void backward_delta(const ExecSpace& space, const Delta& delta, const DO& dout, const O& o,
                    const DLse* dlse, const DQ& dq, bool zero_dq, bool rsum = false) {
  BackwardPreprocess<ExecSpace, Delta, DO, O, DLse, DQ>{
      delta, dout, o, dlse ? *dlse : DLse(), dlse != nullptr, dq, zero_dq, rsum}
      .launch(space);
}

/// The dQ mode a backward runs: the one asked for, or for DqMode::automatic atomics unless
/// the caller asks for a deterministic backward, except on host spaces with threads (OpenMP,
/// Threads), where an atomic add of a float is a compare-and-swap loop, one per element of
/// every dQ tile: there the query pass, which recomputes the tiles instead, measured faster
/// even on one thread (N = 4096, D = 64, H = 2, Kokkos 4.6 OpenMP: 178 ms against 253 ms on
/// one thread, 88 against 125 on two). Serial keeps the atomic path (Kokkos' Serial atomics
/// are plain adds).
template <class ExecSpace>
DqMode dq_mode_of(const Params& params) {
  if (params.dq_mode != DqMode::automatic) return params.dq_mode;
  bool host_threads = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
#ifdef KOKKOS_ENABLE_SERIAL
  if (std::is_same_v<ExecSpace, Kokkos::Serial>) host_threads = false;
#endif
  return !params.deterministic && !host_threads ? DqMode::atomic : DqMode::query_pass;
}

/// The tile kernels of `mode`: the symmetric kernel, or the key-tile kernel and, when dQ is
/// not added with atomics, the query-tile kernel.
template <class ExecSpace, class T, class Views, class Rule>
void launch_backward(const ExecSpace& space,
                     const BackwardCommon<ExecSpace, T, Views, Rule>& common, DqMode mode) {
  if (mode == DqMode::symmetric) {
    SymmetricKernel<ExecSpace, T, Views, Rule>(common).launch(space);
    return;
  }
  const bool atomic_dq = mode == DqMode::atomic;
  using Warp = WarpKeyValueKernel<ExecSpace, T, Views, Rule>;
  if constexpr (Warp::possible)
    if (atomic_dq && Warp::takes(common)) {
      Warp(common).launch(space);
      return;
    }
  common.launch(space, "kfa::backward::dkdv",
                KeyValueKernel<ExecSpace, T, Views, Rule>(common, atomic_dq), true);
  if (!atomic_dq) {
    using Query = QueryKernel<ExecSpace, T, Views, Rule>;
    const auto& k = common.t.k;
    const auto& v = common.t.v;
    const Temporary<typename Query::transposed_view, ExecSpace> kt(space, k.extent(0), k.extent(1),
                                                                   k.extent(3), k.extent(2));
    const Temporary<typename Query::transposed_view, ExecSpace> vt(space, v.extent(0), v.extent(1),
                                                                   v.extent(3), v.extent(2));
    common.launch(space, "kfa::backward::dq", Query(space, common, kt.view(), vt.view()), false);
  }
}

/// DqMode::symmetric's premise, checked before any launch: the problem is self-attention.
template <class Q, class K>
void validate_symmetric(const char* pass, const Q& q, const K& k) {
  if (q.extent(2) != k.extent(2))
    fail(pass, "dq_mode symmetric needs seqlen_q == seqlen_k (self-attention), got q.extent(2) = ",
         q.extent(2), " and k.extent(2) = ", k.extent(2));
  if (q.extent(1) != k.extent(1))
    fail(pass,
         "dq_mode symmetric needs heads_q == heads_k (no GQA), got q.extent(1) = ", q.extent(1),
         " and k.extent(1) = ", k.extent(1));
}

/// The launches of a validated backward under `rule`: the preprocessing (delta), the tile
/// kernels, and for a narrow type on the atomic path the float dQ accumulator. lse is the
/// rule's row statistic (multi-scale: r, with dlse nullptr). `seqs`: where the sequences lie
/// (impl/packed.hpp); the preprocessing and the dQ rounding work row by row, on every sequence
/// at once either way.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV, class Rule, class Seqs = PaddedBatch>
void backward_validated(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                        const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq,
                        const DK& dk, const DV& dv, const Params& params, const Origin& at,
                        const Rule& rule, const Seqs& seqs = {}) {
  using T = typename Q::non_const_value_type;
  using Views = BackwardViews<Q, K, V, DO, Lse, DQ, DK, DV, Seqs>;
  using Common = BackwardCommon<ExecSpace, T, Views, Rule>;
  // Multi-scale: the preprocessing reads r where dlse would be.
  const Lse* stat = nullptr;
  if constexpr (!Rule::softmax) stat = &lse;
  const bool rsum = !Rule::softmax;
  // Temporaries from the workspace pool (impl/workspace.hpp): their destructors fence `space`
  // after every launch below.
  const Temporary<Kokkos::View<typename Common::acc_t***, Kokkos::LayoutRight,
                               typename ExecSpace::memory_space>,
                  ExecSpace>
      delta_memory(space, q.extent(0), q.extent(1), q.extent(2));
  const auto& delta = delta_memory.view();
  const DqMode mode = dq_mode_of<ExecSpace>(params);
  if (mode == DqMode::symmetric) validate_symmetric("backward", q, k);
  const bool atomic_dq = mode == DqMode::atomic;
  if constexpr (backends::is_narrow_float<T>::value) {
    if (atomic_dq) {
      // 16-bit atomic adds would round dQ's running sum once per key tile: the key-tile teams
      // add into a float copy, rounded to T once at the end (FlashAttention-2's dq_accum).
      using Acc4 = Kokkos::View<float****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
      const Temporary<Acc4, ExecSpace> dq_memory(space, q.extent(0), q.extent(1), q.extent(2),
                                                 q.extent(3));
      const Acc4& dq_acc = dq_memory.view();
      if constexpr (Rule::softmax)
        backward_delta(space, delta, dout, o, dlse, dq_acc, true);
      else
        backward_delta(space, delta, dout, o, stat, dq_acc, true, rsum);
      using AccViews = BackwardViews<Q, K, V, DO, Lse, Acc4, DK, DV, Seqs>;
      launch_backward(
          space,
          BackwardCommon<ExecSpace, T, AccViews, Rule>(
              AccViews{q, k, v, dout, lse, dq_acc, dk, dv, seqs}, delta, params, at, rule),
          mode);
      Kokkos::parallel_for(
          "kfa::backward::dq_round",
          Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
              space, {0, 0, 0, 0},
              {static_cast<std::int64_t>(q.extent(0)), static_cast<std::int64_t>(q.extent(1)),
               static_cast<std::int64_t>(q.extent(2)), static_cast<std::int64_t>(q.extent(3))}),
          KOKKOS_LAMBDA(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) {
            dq(b, h, i, d) = T(dq_acc(b, h, i, d));
          });
      return;
    }
  }
  if constexpr (Rule::softmax)
    backward_delta(space, delta, dout, o, dlse, dq, atomic_dq);
  else
    backward_delta(space, delta, dout, o, stat, dq, atomic_dq, rsum);
  launch_backward(
      space, Common(Views{q, k, v, dout, lse, dq, dk, dv, seqs}, delta, params, at, rule), mode);
}

/// The backward of packed sequences (kfa::varlen) in a few launches for all of them: the views
/// are batch 0 of (1, heads, total, head_dim) and (1, heads_q, total_q) views of the packed
/// arrays, cq and ck the checked host offsets; the key-tile kernel runs one team per
/// (sequence, kv head, key tile), the query-tile kernel one per (sequence, head, query tile).
/// The caller validates (dq_mode symmetric: self-attention in every sequence).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV, class Extra = NoTerm>
void backward_packed(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
                     const DV& dv, const std::vector<std::int32_t>& cq,
                     const std::vector<std::int32_t>& ck, const Params& params,
                     const Extra& extra = {}) {
  using T = typename Q::non_const_value_type;
  ScopedRegion region("kfa::backward");
  const auto rule =
      term_rule<backends::accum_t<T>, ExecSpace>("backward", extra, dims_of(q, k), true);
  // The kernels' Bt: from the wider of D and Dv (BackwardCommon::tile_dim), or the sequences'
  // tiles would be numbered in other rows than the kernels cut.
  const int tile = backends::TileTraits<ExecSpace, T>::block_bwd(
      static_cast<int>(q.extent(3) > v.extent(3) ? q.extent(3) : v.extent(3)));
  backward_validated(space, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, Origin{}, rule,
                     packed_sequences<typename ExecSpace::memory_space>(cq, ck, tile, params));
}

/// kfa::backward with an optional dlse (nullptr: none) and an additive term of the score
/// (kfa/masks.hpp; NoTerm: none): static checks, validation (the term's after the tensors'),
/// launches, and the term's gradient where it has one and the caller asked for it.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV, class Extra = NoTerm>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const Origin& at = {}, const Extra& extra = {}) {
  static_check_pass<ExecSpace, false, Lse>(Inputs<Q, K, V, O, DO>{}, Outputs<DQ, DK, DV>{});
  static_assert(is_view_of_rank<DLse, 3>::value &&
                    std::is_floating_point_v<typename DLse::non_const_value_type>,
                "kfa::backward: dlse must be a rank-3 View (batch, heads_q, seqlen_q), floating "
                "point");
  static_check_accessible<ExecSpace, DLse>();
  using T = typename Q::non_const_value_type;

  ScopedRegion region("kfa::backward");
  validate_params<T>("backward", params);
  validate_backward("backward", q, k, v, o, lse, dout, dlse, dq, dk, dv);
  const auto rule =
      term_rule<backends::accum_t<T>, ExecSpace>("backward", extra, dims_of(q, k), true);
  backward_validated(space, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, at, rule);
  store_gradient(space, rule, extra);
}

/// The tile kernels of a backward block whose delta is known (backward_delta over the whole
/// problem's rows), adding into dq, dk and dv, which the caller initialised: a block of a
/// larger problem placed by `at`, whose gradients are sums over blocks (kfa::mpi). The caller
/// validates; q, k, v, dout, lse and delta are the block's rows (under MultiScaleRule: r and
/// c, the rule's mask cut to the block).
template <class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta, class DQ,
          class DK, class DV, class Rule = SoftmaxRule>
void backward_add(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                  const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                  const Params& params, const Origin& at, const Rule& rule = {}) {
  using T = typename Q::non_const_value_type;
  using Views = BackwardViews<Q, K, V, DO, Lse, DQ, DK, DV>;
  BackwardCommon<ExecSpace, T, Views, Rule> common(Views{q, k, v, dout, lse, dq, dk, dv}, delta,
                                                   params, at, rule);
  common.accumulate = true;
  const DqMode mode = dq_mode_of<ExecSpace>(params);
  if (mode == DqMode::symmetric)  // every rank gets the same params: all throw here
    fail("backward",
         "dq_mode symmetric needs the whole self-attention problem in one call; a "
         "block of a distributed one takes atomic or query_pass");
  launch_backward(space, common, mode);
}

}  // namespace kfa::impl
