#pragma once
/// \file impl/backward_kernel.hpp
/// The FlashAttention-2 backward as Kokkos team kernels.
///
/// Nothing of the forward is stored but O and LSE: every tile recomputes
///   S = scale Q_i K_j^T (softcapped), P = exp(S - LSE), dP = dO_i V_j^T,
///   dS = P * (dP * Z - delta) (times 1 - tanh^2 under softcap),
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

#include <kfa/backends/traits.hpp>
#include <kfa/impl/dropout.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kfa::impl {

/// The views of a backward pass, carried as one value by the kernels.
template <class Q, class K, class V, class DO, class Lse, class DQ, class DK, class DV>
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
};

/// What the backward kernels share: the views, the problem sizes, the mask and the row step.
template <class ExecSpace, class T, class Views>
struct BackwardCommon {
  using acc_t = backends::accum_t<T>;
  using traits = backends::TileTraits<ExecSpace, T>;
  using ops = backends::TileOps<ExecSpace, T>;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  using scratch_view =
      Kokkos::View<acc_t*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  // Strided, so that a block of rows of a larger problem's delta can be passed (kfa::mpi).
  using delta_view = Kokkos::View<acc_t***, Kokkos::LayoutStride, typename ExecSpace::memory_space>;

  Views t;           // q, k, v, dout, lse, dq, dk, dv
  delta_view delta;  // rowsum(dO * O) - dLSE, (batch, heads_q, seqlen_q)
  // Add into dq, dk and dv instead of writing them: a block of a larger problem whose
  // gradients sum over blocks (kfa::mpi). Without atomic dQ the sums stay bitwise repeatable.
  bool accumulate = false;
  int heads_q, heads_k, group, seqlen_q, seqlen_k, head_dim;
  int Bt, q_tiles, k_tiles;  // Br = Bc = Bt
  int ldd, ldt;  // row strides of the scratch tiles D and Bt wide: padded by traits::pad
  acc_t scale, softcap;
  Mask mask;
  Dropout<acc_t> dropout;

  BackwardCommon(const Views& views, const delta_view& delta_, const Params& p,
                 const Origin& at = {})
      : t(views), delta(delta_) {
    heads_q = static_cast<int>(t.q.extent(1));
    heads_k = static_cast<int>(t.k.extent(1));
    group = heads_q / heads_k;
    seqlen_q = static_cast<int>(t.q.extent(2));
    seqlen_k = static_cast<int>(t.k.extent(2));
    head_dim = static_cast<int>(t.q.extent(3));
    Bt = traits::block_bwd(head_dim);
    ldd = head_dim + traits::pad;
    ldt = Bt + traits::pad;
    q_tiles = (seqlen_q + Bt - 1) / Bt;
    k_tiles = (seqlen_k + Bt - 1) / Bt;
    scale =
        static_cast<acc_t>(p.scale < 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : p.scale);
    softcap = static_cast<acc_t>(p.softcap);
    mask = make_mask(p, seqlen_q, seqlen_k, at);
    dropout = make_dropout<acc_t>(p, at);
  }

  /// Whether any row of the query tile at q0 (nr rows) sees any key of the tile at k0 (nc keys):
  /// mask ends grow with the row, so the first row's lo and the last row's hi bound the tile.
  /// out = x, or out += x when accumulating, rounded once to out's type (a narrow type is
  /// summed in acc_t, not in 16 bits).
  template <class Out>
  KOKKOS_INLINE_FUNCTION void store(Out& out, acc_t x) const {
    out = Out(accumulate ? static_cast<acc_t>(out) + x : x);
  }

  KOKKOS_INLINE_FUNCTION bool tiles_meet(int q0, int nr, int k0, int nc) const {
    return mask.lo(q0) <= k0 + nc - 1 && mask.hi(q0 + nr - 1) >= k0 &&
           mask.lo(q0) <= mask.hi(q0 + nr - 1);
  }

  /// Launches `kernel` with `bytes` of team scratch over `league` teams, or throws kfa::Error.
  template <class Kernel>
  void launch(const ExecSpace& space, const char* label, const Kernel& kernel, long long league,
              std::size_t bytes, int level) const {
    if (league == 0) return;
    if (league > 2147483647LL)
      fail("backward", label, " needs ", league, " teams, more than the league size limit");
    if (bytes > static_cast<std::size_t>(policy_t::scratch_size_max(level)))
      fail("backward", "head_dim = ", head_dim, " needs ", bytes, " bytes of team scratch (tile ",
           Bt, "), more than this execution space offers (", policy_t::scratch_size_max(level),
           ")");
    const int vl = traits::vector_length;
    policy_t policy = traits::team_size > 0
                          ? policy_t(space, static_cast<int>(league), traits::team_size, vl)
                          : policy_t(space, static_cast<int>(league), Kokkos::AUTO, vl);
    policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
    const int team_max = policy.team_size_max(kernel, Kokkos::ParallelForTag());
    if (traits::team_size > team_max)
      fail("backward", "tile traits ask for team_size = ", traits::team_size,
           " but this execution space allows at most ", team_max, " for head_dim = ", head_dim);
    Kokkos::parallel_for(label, policy, kernel);
  }

  static int level_for(std::size_t bytes) {
    return bytes > std::size_t(policy_t::scratch_size_max(0)) ? 1 : 0;
  }

  /// Team scratch of a backward kernel: the tiles both kernels stage (K_j (Bt x D), K_j^T and
  /// V_j^T (D x Bt), Q_i, dO_i and a dQ_i accumulator (Bt x D), P and dS (Bt x Bt), LSE and
  /// delta (Bt)) plus, for the key-tile kernel, the dK_j and dV_j accumulators (Bt x D).
  /// Sized and carved in one place so the two cannot drift apart.
  struct Tiles {
    acc_t *ks, *kt, *vt, *qs, *dos, *dqs, *p, *ds, *lse_s, *delta_s;
    acc_t* dks = nullptr;
    acc_t* dvs = nullptr;
  };

  std::size_t scratch_bytes(bool with_dkdv) const {
    const std::size_t tile = std::size_t(Bt) * ldd, tile_t = std::size_t(head_dim) * ldt,
                      sq = std::size_t(Bt) * ldt;
    return (with_dkdv ? 6 : 4) * scratch_view::shmem_size(tile) +
           2 * scratch_view::shmem_size(tile_t) + 2 * scratch_view::shmem_size(sq) +
           2 * scratch_view::shmem_size(std::size_t(Bt));
  }

  KOKKOS_INLINE_FUNCTION Tiles carve(const member_t& team, int level, bool with_dkdv) const {
    const auto& scr = team.team_scratch(level);
    const std::size_t tile = std::size_t(Bt) * ldd, tile_t = std::size_t(head_dim) * ldt,
                      sq = std::size_t(Bt) * ldt;
    Tiles s;
    for (acc_t** t : {&s.ks, &s.qs, &s.dos, &s.dqs})
      *t = scratch_view(scr, tile).data();
    s.kt = scratch_view(scr, tile_t).data();
    s.vt = scratch_view(scr, tile_t).data();
    if (with_dkdv) {
      s.dks = scratch_view(scr, tile).data();
      s.dvs = scratch_view(scr, tile).data();
    }
    s.p = scratch_view(scr, sq).data();
    s.ds = scratch_view(scr, sq).data();
    s.lse_s = scratch_view(scr, std::size_t(Bt)).data();
    s.delta_s = scratch_view(scr, std::size_t(Bt)).data();
    return s;
  }

  /// Stages the query-side rows of tile q0 (nr rows) of head (b, h): Q_i pre-multiplied by the
  /// scale, dO_i, LSE and delta.
  KOKKOS_INLINE_FUNCTION void load_query_tile(const member_t& team, int b, int h, int q0, int nr,
                                              acc_t* qs, acc_t* dos, acc_t* lse_s,
                                              acc_t* delta_s) const {
    const int D = head_dim;
    ops::for_each_element(team, nr, D, [&](int r, int d) {
      qs[r * ldd + d] = scale * static_cast<acc_t>(t.q(b, h, q0 + r, d));
      dos[r * ldd + d] = static_cast<acc_t>(t.dout(b, h, q0 + r, d));
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr), [&](int r) {
      lse_s[r] = static_cast<acc_t>(t.lse(b, h, q0 + r));
      delta_s[r] = delta(b, h, q0 + r);
    });
  }

  /// Stages key tile k0 (nc keys) of kv head (b, hk): K_j (nc x D), K_j^T and V_j^T (D x Bt).
  KOKKOS_INLINE_FUNCTION void load_key_tile(const member_t& team, int b, int hk, int k0, int nc,
                                            acc_t* ks, acc_t* kt, acc_t* vt) const {
    const int D = head_dim;
    ops::for_each_element(team, nc, D, [&](int c, int d) {
      const acc_t kv = static_cast<acc_t>(t.k(b, hk, k0 + c, d));
      ks[c * ldd + d] = kv;
      kt[d * ldt + c] = kv;
      vt[d * ldt + c] = static_cast<acc_t>(t.v(b, hk, k0 + c, d));
    });
  }

  /// P * Z and dS of query tile q0 (nr rows, staged in sc) of head (b, h) against key tile k0
  /// (nc keys), into sc.p and sc.ds (Bt x Bt, columns [0, nc)): S = Q_i K_j^T and
  /// dP = dO_i V_j^T as tile products on the keys any row sees, then the row step. Ends with a
  /// team barrier, so the caller may read P and dS at once.
  KOKKOS_INLINE_FUNCTION void tile_p_ds(const member_t& team, int b, int h, int q0, int nr, int k0,
                                        int nc, const Tiles& sc) const {
    const int D = head_dim;
    int cb, ce;  // never empty: callers check tiles_meet first
    mask.tile_columns(q0, nr, k0, nc, cb, ce);
    ops::gemm(team, nr, ce - cb, D, sc.qs, ldd, 1, sc.kt + cb, ldt, sc.p + cb, ldt, false);  // S
    ops::gemm(team, nr, ce - cb, D, sc.dos, ldd, 1, sc.vt + cb, ldt, sc.ds + cb, ldt,
              false);  // dP
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
      row_p_ds(team, b, h, q0 + r, k0, nc, sc.lse_s[r], sc.delta_s[r], sc.p + r * ldt,
               sc.ds + r * ldt);
    });
    team.team_barrier();
  }

  /// Row i of head (b, h) against the key tile at k0 (nc keys): turns the scores S in prow and
  /// dP in dsrow into P * Z and dS (zero for masked keys, and for the whole row when the query
  /// saw no key).
  KOKKOS_INLINE_FUNCTION void row_p_ds(const member_t& team, int b, int h, int i, int k0, int nc,
                                       acc_t lse_i, acc_t delta_i, acc_t* prow,
                                       acc_t* dsrow) const {
    const int lo = mask.lo(i) - k0, hi = mask.hi(i) + 1 - k0;
    int c0 = lo > 0 ? lo : 0, c1 = hi < nc ? hi : nc;
    // A query that saw no key has LSE = -inf; its P is 0, not exp(+inf).
    if (c0 >= c1 || !(lse_i > -backends::infinity<acc_t>())) c0 = c1 = nc;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0), [&](int c) {
      prow[c] = acc_t(0);
      dsrow[c] = acc_t(0);
    });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c1, nc), [&](int c) {
      prow[c] = acc_t(0);
      dsrow[c] = acc_t(0);
    });
    if (c0 >= c1) return;
    if (!dropout.enabled && !(softcap > acc_t(0))) {  // the common case, vectorised
      ops::row_exp_sum(team, prow, c0, c1, lse_i);    // P = exp(S - LSE); the sum is not needed
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1),
                           [&](int c) { dsrow[c] = prow[c] * (dsrow[c] - delta_i); });
      return;
    }
    const acc_t cap = softcap, inv_cap = cap > acc_t(0) ? acc_t(1) / cap : acc_t(0);
    dropout.for_each(team, b, h, i, k0, c0, c1, [&](int c, acc_t z) {
      acc_t s = prow[c], dcap = acc_t(1);
      if (cap > acc_t(0)) {
        const acc_t th = backends::tanh(s * inv_cap);
        s = cap * th;
        dcap = acc_t(1) - th * th;  // d(cap tanh(x / cap))/dx
      }
      const acc_t p = backends::exp(s - lse_i);
      prow[c] = p * z;
      dsrow[c] = p * (dsrow[c] * z - delta_i) * dcap;
    });
  }
};

/// delta = rowsum(dO * O) - dLSE, one work item per (batch, head, query) row; also zeroes the
/// row of dq when the key-tile teams are to add into it.
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
    acc_t sum = 0;
    for (int d = 0; d < D; ++d)
      sum += static_cast<acc_t>(dout(b, h, i, d)) * static_cast<acc_t>(o(b, h, i, d));
    if (has_dlse) sum -= static_cast<acc_t>(dlse(b, h, i));
    delta(b, h, i) = sum;
    if (zero_dq)
      for (int d = 0; d < D; ++d)
        dq(b, h, i, d) = typename DQ::value_type(acc_t(0));
  }
};

/// dK, dV (and, with atomic_dq, dQ by atomic adds): one team per (batch, kv head, key tile).
template <class ExecSpace, class T, class Views>
struct KeyValueKernel : BackwardCommon<ExecSpace, T, Views> {
  using base = BackwardCommon<ExecSpace, T, Views>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using Tiles = typename base::Tiles;
  bool atomic_dq;
  int level;

  /// Narrow dq types take no atomic adds: impl::backward gives them a float accumulator.
  static constexpr bool atomic_capable =
      !backends::is_narrow_float<typename Views::dq_value>::value;

  KeyValueKernel(const base& common, bool atomic_dq_)
      : base(common), atomic_dq(atomic_dq_), level(base::level_for(scratch_bytes())) {
    if (atomic_dq && !atomic_capable)
      fail("backward", "internal: atomic dQ into a 16-bit view (use a float accumulator)");
  }

  std::size_t scratch_bytes() const { return base::scratch_bytes(true); }

  void launch(const ExecSpace& space) const {
    const long long league =
        static_cast<long long>(this->t.q.extent(0)) * this->heads_k * this->k_tiles;
    base::launch(space, "kfa::backward::dkdv", *this, league, scratch_bytes(), level);
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const {
    const int Bt = this->Bt, D = this->head_dim, ldd = this->ldd, ldt = this->ldt;
    const int kt_i = team.league_rank() % this->k_tiles;
    const int bhk = team.league_rank() / this->k_tiles;
    const int hk = bhk % this->heads_k, b = bhk / this->heads_k;
    const int k0 = kt_i * Bt;
    const int nc = this->seqlen_k - k0 < Bt ? this->seqlen_k - k0 : Bt;

    const Tiles sc = this->carve(team, level, true);

    this->load_key_tile(team, b, hk, k0, nc, sc.ks, sc.kt, sc.vt);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nc * this->ldd), [&](int idx) {
      sc.dks[idx] = acc_t(0);
      sc.dvs[idx] = acc_t(0);
    });

    for (int h = hk * this->group; h < (hk + 1) * this->group; ++h)
      for (int qt = 0; qt < this->q_tiles; ++qt) {
        const int q0 = qt * Bt;
        const int nr = this->seqlen_q - q0 < Bt ? this->seqlen_q - q0 : Bt;
        if (!this->tiles_meet(q0, nr, k0, nc)) continue;
        team.team_barrier();  // the previous query tile is no longer read
        this->load_query_tile(team, b, h, q0, nr, sc.qs, sc.dos, sc.lse_s, sc.delta_s);
        team.team_barrier();
        this->tile_p_ds(team, b, h, q0, nr, k0, nc, sc);
        if constexpr (atomic_capable) {
          if (atomic_dq) {  // dQ_i += scale dS K_j, added into dq
            ops::gemm(team, nr, D, nc, sc.ds, ldt, 1, sc.ks, ldd, sc.dqs, ldd, false);
            team.team_barrier();
            const acc_t dq_scale = this->scale;
            ops::for_each_element(team, nr, D, [&](int r, int d) {
              Kokkos::atomic_add(&this->t.dq(b, h, q0 + r, d),
                                 typename Views::dq_value(dq_scale * sc.dqs[r * ldd + d]));
            });
          }
        }
        // dV_j += P^T dO_i and dK_j += dS^T (scale Q_i), reading P and dS transposed in place.
        ops::gemm(team, nc, D, nr, sc.p, 1, ldt, sc.dos, ldd, sc.dvs, ldd, true);
        ops::gemm(team, nc, D, nr, sc.ds, 1, ldt, sc.qs, ldd, sc.dks, ldd, true);
      }
    team.team_barrier();
    ops::for_each_element(team, nc, D, [&](int c, int d) {
      const int idx = c * ldd + d;
      this->store(this->t.dk(b, hk, k0 + c, d), sc.dks[idx]);
      this->store(this->t.dv(b, hk, k0 + c, d), sc.dvs[idx]);
    });
  }
};

/// dQ without atomics: one team per (batch, query head, query tile) owns dQ_i and recomputes
/// P and dS for every key tile it sees.
template <class ExecSpace, class T, class Views>
struct QueryKernel : BackwardCommon<ExecSpace, T, Views> {
  using base = BackwardCommon<ExecSpace, T, Views>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using Tiles = typename base::Tiles;
  int level;

  explicit QueryKernel(const base& common)
      : base(common), level(base::level_for(scratch_bytes())) {}

  std::size_t scratch_bytes() const { return base::scratch_bytes(false); }

  void launch(const ExecSpace& space) const {
    const long long league =
        static_cast<long long>(this->t.q.extent(0)) * this->heads_q * this->q_tiles;
    base::launch(space, "kfa::backward::dq", *this, league, scratch_bytes(), level);
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const {
    const int Bt = this->Bt, D = this->head_dim, ldd = this->ldd, ldt = this->ldt;
    const int qt = team.league_rank() % this->q_tiles;
    const int bh = team.league_rank() / this->q_tiles;
    const int h = bh % this->heads_q, b = bh / this->heads_q, hk = h / this->group;
    const int q0 = qt * Bt;
    const int nr = this->seqlen_q - q0 < Bt ? this->seqlen_q - q0 : Bt;

    const Tiles sc = this->carve(team, level, false);

    this->load_query_tile(team, b, h, q0, nr, sc.qs, sc.dos, sc.lse_s, sc.delta_s);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr * this->ldd),
                         [&](int idx) { sc.dqs[idx] = acc_t(0); });
    for (int kt_i = 0; kt_i < this->k_tiles; ++kt_i) {
      const int k0 = kt_i * Bt;
      const int nc = this->seqlen_k - k0 < Bt ? this->seqlen_k - k0 : Bt;
      if (!this->tiles_meet(q0, nr, k0, nc)) continue;
      team.team_barrier();  // the previous key tile is no longer read
      this->load_key_tile(team, b, hk, k0, nc, sc.ks, sc.kt, sc.vt);
      team.team_barrier();
      this->tile_p_ds(team, b, h, q0, nr, k0, nc, sc);
      ops::gemm(team, nr, D, nc, sc.ds, ldt, 1, sc.ks, ldd, sc.dqs, ldd, true);  // dQ_i += dS K_j
    }
    team.team_barrier();
    const acc_t dq_scale = this->scale;
    ops::for_each_element(team, nr, D, [&](int r, int d) {
      this->store(this->t.dq(b, h, q0 + r, d), dq_scale * sc.dqs[r * ldd + d]);
    });
  }
};

/// Whether View is a Kokkos::View of rank Rank: tells the two backward overloads apart.
template <class View, int Rank, class = void>
struct is_view_of_rank : std::false_type {};
template <class View, int Rank>
struct is_view_of_rank<View, Rank, std::enable_if_t<Kokkos::is_view<View>::value>>
    : std::bool_constant<static_cast<int>(View::rank) == Rank> {};

/// The extents of a backward's tensors against q and k (forward's checks included), for
/// the pass named `pass`. dlse may be nullptr.
template <class Q, class K, class V, class O, class Lse, class DO, class DLse, class DQ, class DK,
          class DV>
void validate_backward(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                       const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
                       const DV& dv) {
  validate_shapes(pass, q, k, v, o, lse);
  for (int dim = 0; dim < 4; ++dim) {
    static const char* what[] = {"batch", "heads", "seqlen", "head_dim"};
    expect_extent(pass, "dout", dout, dim, what[dim], q.extent(dim), "q");
    expect_extent(pass, "dq", dq, dim, what[dim], q.extent(dim), "q");
    expect_extent(pass, "dk", dk, dim, what[dim], k.extent(dim), "k");
    expect_extent(pass, "dv", dv, dim, what[dim], k.extent(dim), "k");
  }
  if (dlse)
    for (int dim = 0; dim < 3; ++dim) {
      static const char* what[] = {"batch", "heads", "seqlen"};
      expect_extent(pass, "dlse", *dlse, dim, what[dim], q.extent(dim), "q");
    }
  expect_unit_stride(pass, "dout", dout);
  expect_unit_stride(pass, "dq", dq);
  expect_unit_stride(pass, "dk", dk);
  expect_unit_stride(pass, "dv", dv);
}

/// delta = rowsum(dO * O) - dLSE into `delta` (dlse may be nullptr), zeroing dq when zero_dq.
template <class ExecSpace, class Delta, class DO, class O, class DLse, class DQ>
void backward_delta(const ExecSpace& space, const Delta& delta, const DO& dout, const O& o,
                    const DLse* dlse, const DQ& dq, bool zero_dq) {
  BackwardPreprocess<ExecSpace, Delta, DO, O, DLse, DQ>{
      delta, dout, o, dlse ? *dlse : DLse(), dlse != nullptr, dq, zero_dq}
      .launch(space);
}

/// The key-tile kernel, and the query-tile kernel when dQ is not added with atomics.
template <class ExecSpace, class T, class Views>
void launch_backward(const ExecSpace& space, const BackwardCommon<ExecSpace, T, Views>& common,
                     bool atomic_dq) {
  KeyValueKernel<ExecSpace, T, Views>(common, atomic_dq).launch(space);
  if (!atomic_dq) QueryKernel<ExecSpace, T, Views>(common).launch(space);
}

/// kfa::backward with an optional dlse (nullptr: none): static checks, validation, launches.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const Origin& at = {}) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::backward: the first argument must be a Kokkos execution space");
  static_check_tensors<ExecSpace, Q, K, V, O, DO, DQ, DK, DV>();
  static_assert(is_view_of_rank<Lse, 3>::value && is_view_of_rank<DLse, 3>::value,
                "kfa::backward: lse and dlse must be rank-3 Views (batch, heads_q, seqlen_q)");
  using T = typename Q::non_const_value_type;
  static_assert(std::is_same_v<T, typename K::non_const_value_type> &&
                    std::is_same_v<T, typename V::non_const_value_type> &&
                    std::is_same_v<T, typename O::non_const_value_type> &&
                    std::is_same_v<T, typename DO::non_const_value_type>,
                "kfa::backward: q, k, v, o and dout must share one value type");
  static_assert(std::is_same_v<T, typename DQ::value_type> &&
                    std::is_same_v<T, typename DK::value_type> &&
                    std::is_same_v<T, typename DV::value_type>,
                "kfa::backward: dq, dk and dv must be non-const and of the value type of q");
  static_assert(backends::is_value_type_v<T>,
                "kfa::backward: value type must be float, double, or Kokkos half_t / bhalf_t "
                "where they are 16-bit types (backends::is_narrow_float)");
  static_assert(std::is_floating_point_v<typename Lse::non_const_value_type> &&
                    sizeof(typename Lse::non_const_value_type) >= sizeof(float) &&
                    std::is_floating_point_v<typename DLse::non_const_value_type>,
                "kfa::backward: lse must be float or wider, dlse floating point");
  static_check_accessible<ExecSpace, Lse>();
  static_check_accessible<ExecSpace, DLse>();

  ScopedRegion region("kfa::backward");
  validate_params("backward", params);
  validate_backward("backward", q, k, v, o, lse, dout, dlse, dq, dk, dv);

  using Views = BackwardViews<Q, K, V, DO, Lse, DQ, DK, DV>;
  using Common = BackwardCommon<ExecSpace, T, Views>;
  Kokkos::View<typename Common::acc_t***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      delta(Kokkos::view_alloc(std::string("kfa::backward::delta"), Kokkos::WithoutInitializing),
            q.extent(0), q.extent(1), q.extent(2));
  const bool atomic_dq = !params.deterministic;
  if constexpr (backends::is_narrow_float<T>::value) {
    if (atomic_dq) {
      // 16-bit atomic adds would round dQ's running sum once per key tile: the key-tile teams
      // add into a float copy, rounded to T once at the end (FlashAttention-2's dq_accum).
      using Acc4 = Kokkos::View<float****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
      Acc4 dq_acc(
          Kokkos::view_alloc(std::string("kfa::backward::dq_accum"), Kokkos::WithoutInitializing),
          q.extent(0), q.extent(1), q.extent(2), q.extent(3));
      backward_delta(space, delta, dout, o, dlse, dq_acc, true);
      using AccViews = BackwardViews<Q, K, V, DO, Lse, Acc4, DK, DV>;
      launch_backward(space,
                      BackwardCommon<ExecSpace, T, AccViews>(
                          AccViews{q, k, v, dout, lse, dq_acc, dk, dv}, delta, params, at),
                      true);
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
  backward_delta(space, delta, dout, o, dlse, dq, atomic_dq);
  launch_backward(space, Common(Views{q, k, v, dout, lse, dq, dk, dv}, delta, params, at),
                  atomic_dq);
}

/// The tile kernels of a backward block whose delta is known (backward_delta over the whole
/// problem's rows), adding into dq, dk and dv, which the caller initialised: a block of a
/// larger problem placed by `at`, whose gradients are sums over blocks (kfa::mpi). The caller
/// validates; q, k, v, dout, lse and delta are the block's rows.
template <class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta, class DQ,
          class DK, class DV>
void backward_add(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                  const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                  const Params& params, const Origin& at) {
  using T = typename Q::non_const_value_type;
  using Views = BackwardViews<Q, K, V, DO, Lse, DQ, DK, DV>;
  BackwardCommon<ExecSpace, T, Views> common(Views{q, k, v, dout, lse, dq, dk, dv}, delta, params,
                                             at);
  common.accumulate = true;
  launch_backward(space, common, !params.deterministic);
}

}  // namespace kfa::impl
