#pragma once
/// \file impl/forward_kernel.hpp
/// The FlashAttention-2 forward as a Kokkos team kernel.
///
/// One team per (batch, query head, query tile of Br rows). The team stages Q_i once, then
/// walks the key/value tiles K_j, V_j (Bc keys) that the mask leaves visible, staging each in
/// team scratch. Each query row keeps a running maximum m, a running sum l and an unnormalised
/// output row O~; a tile updates them with the online-softmax rule
///   m' = max(m, rowmax(S_ij)),  P = exp(S_ij - m'),  l' = e^(m - m') l + rowsum(P),
///   O~' = e^(m - m') O~ + P V_j,
/// (the combiner of kfa/combine.hpp, merging the tile's partial into the row's),
/// and at the end O = O~ / l and LSE = m + log l (O = 0, LSE = -inf for a row that saw nothing).
/// Threads own query rows; vector lanes share the keys of a tile or the head_dim.
///
/// Split-KV (impl/split_kv.hpp): with splits > 1 the league has one team per (query tile,
/// chunk of its visible key tiles); each team ends by writing its unnormalised partial
/// (m, l, O~) instead of O and LSE, and SplitMerge combines the chunks.
///
/// The row rule (impl/rule.hpp) is a template parameter: SoftmaxRule is all of the above;
/// MultiScaleRule keeps the tile loop, the tile skipping and split-KV and replaces the
/// online-softmax step by S = x M, r += rowsum |S| (msa_row), the end by O = O~ / max(r, 1),
/// r in lse's place. In the key-major sweep (the host's) the step runs down the columns for all
/// rows at once (TileOps::col_abs_sum, the mask tile staged transposed so that it is read like
/// S^T); the query-major sweep (the device backends') runs it row by row.

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
#include <kfa/impl/split_kv.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/impl/workspace.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace kfa::impl {

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Rule = SoftmaxRule,
          class Seqs = PaddedBatch>
struct ForwardKernel : TeamKernel<ExecSpace, typename Q::non_const_value_type> {
  using value_type = typename Q::non_const_value_type;
  using base = TeamKernel<ExecSpace, value_type>;
  using typename base::acc_t;
  using typename base::member_t;
  using typename base::ops;
  using typename base::traits;

  Q q;
  K k;
  V v;
  O o;
  Lse lse;
  int heads_q, group, seqlen_q, seqlen_k, head_dim;
  int head_dim_v;  // Dv: v's and o's head dim, which may differ from q's and k's D
  int Br, Bc, q_tiles;
  // Row strides of the scratch tiles D, Dv and Bc wide (Q_i and K_j; V_j and O~; S): padded
  // by traits::pad.
  int ldd, ldv, ldc;
  using bias_t = typename bias_of<Rule, acc_t>::type;  // the additive term (impl/bias.hpp)
  ScoreTransform<acc_t, bias_t> score;
  Mask mask;
  Dropout<acc_t> dropout;
  int scratch_level;  // 0 when the tiles fit the fast scratch, else 1
  // Key-major: the products read K and V in the views, not from scratch copies, when they hold
  // acc_t and their row strides fit the products' int strides.
  static constexpr bool kv_in_place_type =
      std::is_same_v<typename K::non_const_value_type, acc_t> &&
      std::is_same_v<typename V::non_const_value_type, acc_t>;
  bool kv_in_place = false;
  // Key-major with bfloat16 inputs where the backend multiplies them in pairs
  // (TileTraits::bf16x2_products) and that outruns the float products on this CPU
  // (TileOps::bf16x2_pays): taken when D, Dv and the K and V row strides are even, so that
  // every row is a row of pair words (backends/bf16x2.hpp).
  static constexpr bool pairs_type =
      Rule::softmax && traits::bf16x2_products && std::is_same_v<acc_t, float> &&
      backends::is_bfloat16<value_type>::value &&
      backends::is_bfloat16<typename K::non_const_value_type>::value &&
      backends::is_bfloat16<typename V::non_const_value_type>::value;
  bool pairs = false;
  // With pairs, V's rows as pair words once per launch (PairV: keys 2w and 2w + 1 of the view
  // in word row w of their (batch, kv head), ldv words a row) rather than per query tile and
  // key tile: a build without the per-tile interleave ran a bf16 forward 1.06-1.07x faster on
  // AVX-512, this pass 1.02-1.05x (perf/results/2026-12-07-zen5-v-pairs.md). Lent by launch where
  // whole_v_pairs: padded batches (a packed sequence may start on an odd key) whose query tiles
  // read each key twice or more on average (a window over a long cache, or a single query row,
  // would interleave keys no tile reads). A tile takes them where they pair its keys as its own
  // interleave does (sweep_key_major), so the results do not depend on the choice.
  using pairs_view =
      Kokkos::View<std::uint32_t**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  pairs_view v_pairs;
  bool whole_v_pairs = false;
  int key_pairs = 0;  // word rows per (batch, kv head): (seqlen_k + 1) / 2
  // The register-resident forward (TileTraits::warp_tiles: CUDA, 16-bit inputs, and float by
  // 3xTF32 under KFA_CUDA_TF32X3): a team's 64 or 128 query rows (TileOps::warp_rows) keep
  // their work in registers (TileOps::warp_forward). Taken at the head dims it has (with Dv = D:
  // its registers hold O rows of D), when every row of q, k and v starts on 16 bytes (its
  // copies are 16-byte ones) and without an additive term (a biased pass takes the tile path).
  // Dropout is drawn in its registers (WarpScore::Row::kept_pair), by a kernel of its own
  // (WarpKernel<D, true>) so that the common kernel holds no Philox.
  static constexpr bool warp_type = Rule::softmax && !bias_t::enabled && !Seqs::packed &&
                                    traits::warp_tiles &&
                                    std::is_same_v<typename K::non_const_value_type, value_type> &&
                                    std::is_same_v<typename V::non_const_value_type, value_type>;
  bool warp = false;
  int splits = 1;  // chunks of key tiles per query tile (1: no split-KV)
  SplitPartials<acc_t, typename ExecSpace::memory_space> part;  // lent by launch if splits > 1
  Rule rule;
  bool mask_rows = false;  // multi-scale: a mask tensor whose rows have unit stride
  TileCount<typename ExecSpace::memory_space> tiles_staged;  // KFA_TEST_COUNTERS only
  // Packed sequences (impl/packed.hpp): the views are batch 0 of (1, heads, total, head_dim)
  // tensors and each team places itself on its sequence (enter).
  Seqs seqs;

  ForwardKernel(const ExecSpace& space, const Q& q_, const K& k_, const V& v_, const O& o_,
                const Lse& lse_, const Params& p, const Origin& at = {}, const Rule& rule_ = {})
      : q(q_), k(k_), v(v_), o(o_), lse(lse_), rule(rule_) {
    heads_q = static_cast<int>(q.extent(1));
    group = heads_q / static_cast<int>(k.extent(1));
    seqlen_q = static_cast<int>(q.extent(2));
    seqlen_k = static_cast<int>(k.extent(2));
    head_dim = static_cast<int>(q.extent(3));
    head_dim_v = static_cast<int>(v.extent(3));
    mask = make_mask(p, seqlen_q, seqlen_k, at);
    score = ScoreTransform<acc_t, bias_t>(p, head_dim, bias_of<Rule, acc_t>::make(rule, mask, at));
    if constexpr (!Rule::softmax) {
      score.scale = rule.scale;
      mask_rows = rule.has_mask && rule.m.stride(2) == 1;
    }
    dropout = make_dropout<acc_t>(p, at);
    if constexpr (warp_type)
      warp = ops::warp_head_dim(head_dim) && head_dim_v == head_dim && ops::warp_runs(space) &&
             base::rows_on_16_bytes(q) && base::rows_on_16_bytes(k) && base::rows_on_16_bytes(v);
    Br = traits::block_q(tile_dim(head_dim, head_dim_v), tile_keys());
    Bc = traits::block_k(tile_dim(head_dim, head_dim_v));
    if constexpr (warp_type)
      if (warp) {
        Br = ops::warp_rows(head_dim, dropout.enabled);
        Bc = ops::warp_keys;
      }
    ldd = head_dim + traits::pad;
    ldv = head_dim_v + traits::pad;
    ldc = Bc + traits::pad;
    q_tiles = (seqlen_q + Br - 1) / Br;
    scratch_level = base::scratch_level(scratch_bytes());
    kv_in_place = kv_in_place_type && k.stride(2) <= 2147483647 && v.stride(2) <= 2147483647;
    pairs = pairs_type && ops::bf16x2_pays() && head_dim % 2 == 0 && head_dim_v % 2 == 0 &&
            k.stride(2) % 2 == 0 && v.stride(2) % 2 == 0 && k.stride(2) / 2 <= 2147483647;
    whole_v_pairs = pairs && !Seqs::packed && Bc % 2 == 0;  // key tiles start on even keys
    key_pairs = (seqlen_k + 1) / 2;
    if (whole_v_pairs) {  // the keys the query tiles read (the interval mask's), per kv head
      long long read = 0;
      for (int q0 = 0; q0 < seqlen_q; q0 += Br) {
        const int nr = seqlen_q - q0 < Br ? seqlen_q - q0 : Br;
        const int lo = mask.lo(q0), hi = mask.hi(q0 + nr - 1) + 1;
        if (hi > lo) read += hi - lo;
      }
      whole_v_pairs = read * group >= 2LL * seqlen_k;
    }
    const int key_tiles = (seqlen_k + Bc - 1) / Bc;
    const long long teams = static_cast<long long>(q.extent(0)) * heads_q * q_tiles;
    splits = p.num_splits > 0 ? p.num_splits
                              : choose_splits(teams, key_tiles, traits::concurrent_teams(space));
    if (splits > key_tiles) splits = key_tiles > 1 ? key_tiles : 1;
    if constexpr (Seqs::packed) splits = 1;  // one team per (sequence, head, query tile)
    if (splits > 1) {
      part.splits = splits;
      part.batch = static_cast<int>(q.extent(0));
      part.heads = heads_q;
      part.seqlen_q = seqlen_q;
    }
  }

  static constexpr bool key_major = traits::key_major_scores;  ///< S^T = K_j Q_i^T

  /// The head dim the traits size the tiles for: the larger of D and Dv, so that every tile
  /// fits as it does when both are that dim.
  static constexpr int tile_dim(int head_dim, int head_dim_v) {
    return head_dim > head_dim_v ? head_dim : head_dim_v;
  }

  /// The key count the traits size Br for (TileTraits::block_q): the keys' extent, or 0 for
  /// packed sequences, whose views hold every sequence's keys and whose lengths are not known
  /// here.
  int tile_keys() const { return Seqs::packed ? 0 : seqlen_k; }

  /// Team scratch: Q_i (Br x D), O~_i (Br x Dv), K_j^T (D x Bc), V_j (Bc x Dv), S_ij (Br x Bc),
  /// m, l (Br); rows ldd, ldv or ldc apart. Key-major (TileTraits::key_major_scores): Q_i^T
  /// (D x Br), K_j (Bc x D) and S_ij^T (Bc x Br), rows of Br elements ldq apart, and one more
  /// array of Br (the rows' rescale factors); with bfloat16 pair products, Q_i^T holds pair
  /// words; under the multi-scale rule, one more Bc x Br tile for the mask tile M_ij^T. A
  /// function of the head dims (head_dim_v 0: head_dim) and of the key count that sizes Br
  /// (tile_keys; 0: the short-sequence tiles), so that it can be reported without a launch
  /// (perf/cuda_report.sh).
  static std::size_t scratch_bytes(int head_dim, int head_dim_v = 0, int keys = 0) {
    if (head_dim_v <= 0) head_dim_v = head_dim;
    const int td = tile_dim(head_dim, head_dim_v);
    const std::size_t br = traits::block_q(td, keys), bc = traits::block_k(td), d = head_dim,
                      ldd = d + traits::pad, ldv = std::size_t(head_dim_v) + traits::pad,
                      ldc = bc + traits::pad, ldq = br + traits::pad;
    // A boolean mask's bits (mask_words), carved last.
    const std::size_t words = mask_words ? base::scratch_bytes({mask_word_elements(br, bc)}) : 0;
    if (key_major && pairs_type)  // and the pair words of P and V_j, (Bc + 1) / 2 rows each
      return base::scratch_bytes({d * ldq, br * ldv, bc * ldd, bc * ldv, bc * ldq, br, br, br,
                                  (bc + 1) / 2 * ldq, (bc + 1) / 2 * ldv}) +
             words;
    if (key_major && !Rule::softmax)
      return base::scratch_bytes(
          {d * ldq, br * ldv, bc * ldd, bc * ldv, bc * ldq, br, br, br, bc * ldq});
    if (key_major)
      return base::scratch_bytes({d * ldq, br * ldv, bc * ldd, bc * ldv, bc * ldq, br, br, br}) +
             words;
    return base::scratch_bytes({br * ldd, br * ldv, d * ldc, bc * ldv, br * ldc, br, br});
  }
  std::size_t scratch_bytes() const {
    if constexpr (warp_type)
      if (warp) return ops::warp_scratch_bytes(head_dim);
    return scratch_bytes(head_dim, head_dim_v, tile_keys());
  }

  /// Row stride of the key-major tiles Br wide.
  KOKKOS_INLINE_FUNCTION int ldq() const { return Br + traits::pad; }

  void launch(const ExecSpace& space) const {
    if constexpr (pairs_type)
      if (whole_v_pairs) {  // V as pair words on a temporary for this launch (PairV)
        const Temporary<pairs_view, ExecSpace> memory(
            space, v.extent(0) * v.extent(1) * static_cast<std::size_t>(key_pairs),
            static_cast<std::size_t>(ldv));
        ForwardKernel lent = *this;
        lent.v_pairs = memory.view();
        const int key_tiles = (seqlen_k + Bc - 1) / Bc;
        base::launch(space, "forward", "kfa::forward_v_pairs", PairV{lent},
                     static_cast<long long>(v.extent(0)) * v.extent(1) * key_tiles, 0, 0,
                     {head_dim, Bc, head_dim_v});
        lent.launch_chunks(space);
        return;
      }
    launch_chunks(space);
  }

 private:
  /// launch, past V's pair words: the forward, and with split-KV its partials and merge.
  void launch_chunks(const ExecSpace& space) const {
    if (splits > 1) {  // the partials on temporaries for this launch and the merge
      using rows_view = typename decltype(part)::rows_view;
      const Temporary<rows_view, ExecSpace> o_memory(space, part.rows(), head_dim_v);
      const Temporary<rows_view, ExecSpace> ml_memory(space, part.rows(), 2);
      ForwardKernel lent = *this;
      lent.part.o = o_memory.view();
      lent.part.ml = ml_memory.view();
      lent.run(space);
    } else {
      run(space);
    }
  }

  /// One key tile of V's rows as pair words into v_pairs per team: league rank
  /// (b * kv heads + hk) * key tiles + t. Every key of the view; an odd last key's pair is
  /// completed with 0, as the per-tile interleave completes an odd count.
  struct PairV {
    ForwardKernel fk;
    KOKKOS_FUNCTION void operator()(const member_t& team) const {
      if constexpr (pairs_type) {
        const int key_tiles = (fk.seqlen_k + fk.Bc - 1) / fk.Bc;
        const int heads_k = static_cast<int>(fk.v.extent(1)), rank = team.league_rank();
        const int t = rank % key_tiles, bh = rank / key_tiles;
        const int k0 = t * fk.Bc, n = fk.seqlen_k - k0 < fk.Bc ? fk.seqlen_k - k0 : fk.Bc;
        ops::interleave_bf16x2_rows(
            team, &fk.v(bh / heads_k, bh % heads_k, k0, 0), fk.v.stride(2), n, fk.head_dim_v,
            &fk.v_pairs(static_cast<std::size_t>(bh) * fk.key_pairs + k0 / 2, 0), fk.ldv);
      }
    }
  };

  void run(const ExecSpace& space) const {
    long long league = static_cast<long long>(q.extent(0)) * heads_q * q_tiles * splits;
    if constexpr (Seqs::packed) league = static_cast<long long>(heads_q) * seqs.total_tiles;
    const typename base::Shape shape{head_dim, Br, Bc};
    bool launched = false;
    if constexpr (warp_type)
      if (warp) {
        const auto go = [&](auto kernel) {
          base::launch(space, "forward", "kfa::forward", kernel, league, scratch_bytes(),
                       scratch_level, shape);
        };
        if (head_dim == 64 && dropout.enabled)
          go(WarpKernel<64, true>{*this});
        else if (head_dim == 64)
          go(WarpKernel<64, false>{*this});
        else if (dropout.enabled)
          go(WarpKernel<128, true>{*this});
        else
          go(WarpKernel<128, false>{*this});
        launched = true;
      }
    if (!launched)
      base::launch(space, "forward", "kfa::forward", *this, league, scratch_bytes(), scratch_level,
                   shape);
    if (splits > 1)
      SplitMerge<ExecSpace, acc_t, O, Lse, Rule>{part, o, lse, head_dim_v}.launch(space);
  }

 public:
  /// Where a team is: batch, query head, its key/value head, first query row and row count.
  struct Place {
    int b, h, hk, q0, nr;
  };

  /// A team's work: its place, its split and its chunk [k_begin, k_end) of the key tiles
  /// visible to any row of its query tile (tiles outside are never touched; with split-KV the
  /// team takes its chunk of those tiles).
  struct Work {
    Place tile;
    int split, k_begin, k_end;
  };
  KOKKOS_INLINE_FUNCTION Work work_of(int rank) const {
    const int split = rank % splits;
    const int qt = (rank / splits) % q_tiles;
    const int bh = rank / splits / q_tiles;
    const int h = bh % heads_q, b = bh / heads_q;
    const int q0 = qt * Br, nr = seqlen_q - q0 < Br ? seqlen_q - q0 : Br;
    const int kbeg = mask.lo(q0);
    int kend = mask.hi(q0 + nr - 1) + 1;
    if constexpr (has_key_limit<bias_t>::value) {  // key padding: batch b's keys end earlier
      const int e = key_limit_of(score.bias, b, seqlen_k);
      kend = e < kend ? e : kend;
    }
    const int t_first = kbeg / Bc, t_count = kend > kbeg ? (kend - 1) / Bc + 1 - t_first : 0;
    int t_begin = t_first, t_n = t_count;
    if (splits > 1) split_range(t_first, t_count, splits, split, t_begin, t_n);
    return {{b, h, h / group, q0, nr}, split, t_begin * Bc, (t_begin + t_n) * Bc};
  }

  /// Places a copy of the kernel on the packed sequence `at` (PackedSequences::Seq): its rows
  /// of the views, its lengths and the diagonal they give the masks and ALiBi, and its index as
  /// dropout's batch, so that the rest of the kernel runs it as a batch of one.
  template <class Seq>
  KOKKOS_INLINE_FUNCTION void enter(const Seq& at) {
    seqlen_q = at.nq;
    seqlen_k = at.nk;
    q_tiles = (at.nq + Br - 1) / Br;
    mask.seqlen_k = at.nk;
    mask.shift = seqs.shift(at.nq, at.nk);
    if constexpr (bias_t::enabled) score.bias.shift = mask.shift;  // ALiBi, the one packed term
    dropout.b_origin = at.s;
    const auto qb = static_cast<std::ptrdiff_t>(at.q_begin),
               kb = static_cast<std::ptrdiff_t>(at.k_begin);
    q = Q(q.data() + qb * static_cast<std::ptrdiff_t>(q.stride(2)), q.layout());
    k = K(k.data() + kb * static_cast<std::ptrdiff_t>(k.stride(2)), k.layout());
    v = V(v.data() + kb * static_cast<std::ptrdiff_t>(v.stride(2)), v.layout());
    o = O(o.data() + qb * static_cast<std::ptrdiff_t>(o.stride(2)), o.layout());
    lse = Lse(lse.data() + qb * static_cast<std::ptrdiff_t>(lse.stride(2)), lse.layout());
  }

  KOKKOS_FUNCTION void operator()(const member_t& team) const {
    if constexpr (Seqs::packed) {
      // League index = global query tile * heads_q + head; the tile's sequence from the tile
      // offsets, and the rank it has in that sequence as a batch of one.
      const int r = team.league_rank();
      const auto at = seqs.locate(r / heads_q);
      ForwardKernel fk = *this;
      fk.enter(at);
      fk.run(team, (r % heads_q) * fk.q_tiles + at.tile);
    } else {
      run(team, team.league_rank());
    }
  }

  /// The team at league index `rank` of a padded batch.
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, int rank) const {
    const Work w = work_of(rank);
    const Place& tile = w.tile;
    const int b = tile.b, h = tile.h, q0 = tile.q0, nr = tile.nr, split = w.split;
    const int k_begin = w.k_begin, k_end = w.k_end;
    const int D = head_dim, Dv = head_dim_v;

    const auto& scr = team.team_scratch(scratch_level);
    const int ldd = this->ldd, ldv = this->ldv;
    acc_t* qs = base::carve(scr, key_major ? std::size_t(D) * ldq() : std::size_t(Br) * ldd);
    acc_t* os = base::carve(scr, std::size_t(Br) * ldv);
    // Padding included: one run, no division per element (which on one host core cost ~5 %
    // of a forward at N = 1024).
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr * ldv), [&](int e) { os[e] = acc_t(0); });

    acc_t *m, *l;
    if constexpr (key_major)
      sweep_key_major(team, tile, k_begin, k_end, scr, qs, os, m, l);
    else
      sweep_query_major(team, tile, k_begin, k_end, scr, qs, os, m, l);
    team.team_barrier();

    if (splits > 1) {  // hand the partial to SplitMerge
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
        const std::size_t row = part.row(split, b, h, q0 + r);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                             [&](int d) { part.o(row, d) = os[r * ldv + d]; });
        Kokkos::single(Kokkos::PerThread(team), [&]() {
          part.ml(row, 0) = m[r];
          part.ml(row, 1) = l[r];
        });
      });
      return;
    }
    if constexpr (!Rule::softmax) {  // O = O~ / max(r, 1); r in lse's place
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
        const msa::Partial<acc_t> row{l[r]};
        const acc_t inv = acc_t(1) / msa::denominator(row);
        write_row(team, b, h, q0 + r, os + std::size_t(r) * ldv, inv);
        Kokkos::single(Kokkos::PerThread(team), [&]() { lse(b, h, q0 + r) = row.r; });
      });
      return;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
      const acc_t lr = l[r];
      const acc_t inv = lr > acc_t(0) ? acc_t(1) / lr : acc_t(0);
      write_row(team, b, h, q0 + r, os + std::size_t(r) * ldv, inv);
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        lse(b, h, q0 + r) = kfa::lse(Partial<acc_t>{m[r], lr});
      });
    });
  }

  /// Writes O's row (b, h, i): value_type(src[d] * inv) for d < head_dim_v. Through a pointer
  /// to the row (head_dim has unit stride, validate.hpp) where the view's elements are
  /// lvalues: through the view's four-index operator GCC left the loop scalar, which with a
  /// 16-bit output (a rounding per element) held 6.6 % of the samples of a bfloat16 forward at
  /// N = 1024, D = 64 on one core, 1.2 % through the pointer
  /// (perf/results/2026-12-07-zen5-output-rows.md). A view of proxies (atomic memory traits)
  /// takes the operator.
  KOKKOS_INLINE_FUNCTION void write_row(const member_t& team, int b, int h, int i, const acc_t* src,
                                        acc_t inv) const {
    if constexpr (std::is_lvalue_reference_v<typename O::reference_type>) {
      auto* const row = &o(b, h, i, 0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_dim_v),
                           [&](int d) { row[d] = value_type(src[d] * inv); });
    } else {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_dim_v),
                           [&](int d) { o(b, h, i, d) = value_type(src[d] * inv); });
    }
  }

  /// What the register-resident forward asks of core (TileOps::warp_forward): the score of a
  /// dot product under the transform and the mask, whether a key tile can be seen at all, and
  /// with Dropped which elements dropout keeps. Capped: whether softcap is on, a compile-time
  /// choice so that the key-tile loop of the common case holds no tanh (an additive term would
  /// take the full transform); likewise Dropped, so that it holds no Philox.
  template <bool Capped, bool Dropped = false>
  struct WarpScore {
    static constexpr bool dropped = Dropped;  ///< whether Row::kept_pair is to be called
    ScoreTransform<acc_t, bias_t> transform;
    Mask mask;
    Dropout<acc_t> dropout;
    int b, h;
    KOKKOS_INLINE_FUNCTION bool tile_visible(int q0, int n, int j0, int nc) const {
      return mask.tile_visible(q0, n, j0, nc);
    }
    KOKKOS_INLINE_FUNCTION bool tile_inside(int q0, int n, int j0, int nc) const {
      return mask.tile_inside(q0, n, j0, nc);
    }
    /// One query row's scores: its visible keys [lo, hi] found when the row is made (the kernel
    /// makes it per key tile).
    struct Row {
      ScoreTransform<acc_t, bias_t> transform;
      Dropout<acc_t> dropout;
      int b, h, i, lo, hi;
      KOKKOS_INLINE_FUNCTION acc_t operator()(int j, acc_t dot) const {
        if (j < lo || j > hi) return -backends::infinity<acc_t>();
        return unmasked(j, dot);
      }
      /// The score of a key the row sees.
      KOKKOS_INLINE_FUNCTION acc_t unmasked(int j, acc_t dot) const {
        if constexpr (Capped || decltype(transform.bias)::enabled)
          return transform.value(transform.scaled(dot), b, h, i, j);
        else
          return transform.scaled(dot);
      }
      /// Whether dropout keeps keys j (bit 0) and j + 1 (bit 1) of the row
      /// (Dropout::kept_pair).
      KOKKOS_INLINE_FUNCTION unsigned kept_pair(int j) const {
        return dropout.kept_pair(b, h, i, j);
      }
      /// Whether dropout keeps keys j .. j + 3 of the row (bits 0 .. 3), j starting a group of
      /// four (Dropout::kept4).
      KOKKOS_INLINE_FUNCTION unsigned kept4(int j) const { return dropout.kept4(b, h, i, j); }
    };
    /// Whether key j starts one of dropout's groups of four keys (one Philox call each).
    KOKKOS_INLINE_FUNCTION bool group_starts(int j) const { return dropout.group_starts(j); }
    /// The weight of a kept element, 1 / (1 - p).
    KOKKOS_INLINE_FUNCTION acc_t keep_scale() const { return dropout.scale; }
    KOKKOS_INLINE_FUNCTION Row row(int i) const {
      return {transform, dropout, b, h, i, mask.lo(i), mask.hi(i)};
    }
  };
  /// Where the register-resident forward puts its rows: O and the LSE, or with split-KV the
  /// partial (m, l, O~) = (LSE, 1, O) of the split, which SplitMerge combines like any other
  /// (l = 0 where the split saw no key).
  struct WarpOut {
    O out_o;
    Lse out_lse;
    SplitPartials<acc_t, typename ExecSpace::memory_space> part;
    int b, h, split;
    bool partial;
    KOKKOS_INLINE_FUNCTION void o(int i, int c, acc_t x) const {
      if (partial)
        part.o(part.row(split, b, h, i), c) = x;
      else
        out_o(b, h, i, c) = value_type(x);
    }
    KOKKOS_INLINE_FUNCTION void lse(int i, acc_t x) const {
      if (!partial) {
        out_lse(b, h, i) = x;
        return;
      }
      const std::size_t row = part.row(split, b, h, i);
      part.ml(row, 0) = x;
      part.ml(row, 1) = x == -backends::infinity<acc_t>() ? acc_t(0) : acc_t(1);
    }
  };

  /// The register-resident forward as a kernel of its own per head dim and dropout, so that
  /// its registers are allocated apart from the tile path's and from the other kernels'.
  template <int HeadDim, bool Dropped>
  struct WarpKernel {
    ForwardKernel fk;
    KOKKOS_FUNCTION void operator()(const member_t& team) const {
      const Work w = fk.work_of(team.league_rank());
      const Place& t = w.tile;
      const int b = t.b, h = t.h, hk = t.hk;
      using bits = const std::uint16_t*;
      // Views and indices by value: a capture by reference would put them in local memory.
      const Q q = fk.q;
      const K k = fk.k;
      const V v = fk.v;
      WarpOut out{fk.o, fk.lse, fk.part, b, h, w.split, fk.splits > 1};
      const int k_end = w.k_end < fk.seqlen_k ? w.k_end : fk.seqlen_k;
      const auto q_row = [=](int i) { return reinterpret_cast<bits>(&q(b, h, i, 0)); };
      const auto k_row = [=](int j) { return reinterpret_cast<bits>(&k(b, hk, j, 0)); };
      const auto v_row = [=](int j) { return reinterpret_cast<bits>(&v(b, hk, j, 0)); };
      if (fk.score.capped())
        ops::template warp_forward<HeadDim>(
            team, t.q0, t.nr, w.k_begin, k_end, q_row, k_row, v_row,
            WarpScore<true, Dropped>{fk.score, fk.mask, fk.dropout, b, h}, out);
      else
        ops::template warp_forward<HeadDim>(
            team, t.q0, t.nr, w.k_begin, k_end, q_row, k_row, v_row,
            WarpScore<false, Dropped>{fk.score, fk.mask, fk.dropout, b, h}, out);
    }
  };

  /// The key tiles [k_begin, k_end) of the query tile `tile`, query-major: S_ij = Q_i K_j^T,
  /// the online-softmax step row by row (update_row), O~ += P V_j. Carves the rest of the
  /// scratch after qs and os, and returns the rows' m and l there.
  KOKKOS_INLINE_FUNCTION void sweep_query_major(const member_t& team, const Place& tile,
                                                int k_begin, int k_end,
                                                const typename ExecSpace::scratch_memory_space& scr,
                                                acc_t* qs, acc_t* os, acc_t*& m, acc_t*& l) const {
    const int b = tile.b, h = tile.h, hk = tile.hk, q0 = tile.q0, nr = tile.nr, D = head_dim,
              Dv = head_dim_v;
    const int ldd = this->ldd, ldv = this->ldv, ldc = this->ldc;
    acc_t* kt = base::carve(scr, std::size_t(D) * ldc);
    acc_t* vs = base::carve(scr, std::size_t(Bc) * ldv);
    acc_t* s = base::carve(scr, std::size_t(Br) * ldc);
    m = base::carve(scr, std::size_t(Br));
    l = base::carve(scr, std::size_t(Br));

    // Q_i is loaded once, pre-multiplied by the scale (the score transform's x = scale q.k).
    ops::for_each_element(team, nr, D, [&](int r, int d) {
      qs[r * ldd + d] = score.scaled(static_cast<acc_t>(q(b, h, q0 + r, d)));
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr), [&](int r) {
      m[r] = -backends::infinity<acc_t>();
      l[r] = acc_t(0);
    });

    for (int k0 = k_begin; k0 < k_end; k0 += Bc) {
      const int nc = seqlen_k - k0 < Bc ? seqlen_k - k0 : Bc;
      if constexpr (is_visibility<bias_t>::value)  // a tile a boolean mask hides: P = 0
        if (!mask_sees_tile(team, score.bias.line(b, h), mask, q0, nr, k0, nc)) continue;
      team.team_barrier();  // the previous tile is no longer read
      tiles_staged.add(team, TileCounter::forward, nc);
      ops::for_each_element(team, nc, D, [&](int c, int d) {
        kt[d * ldc + c] = static_cast<acc_t>(k(b, hk, k0 + c, d));
      });
      ops::for_each_element(team, nc, Dv, [&](int c, int d) {
        vs[c * ldv + d] = static_cast<acc_t>(v(b, hk, k0 + c, d));
      });
      team.team_barrier();
      // Keys of this tile that any of its rows sees: [cb, ce). S_ij = Q_i K_j^T on those
      // columns, the online-softmax step row by row (P into S's place), then O~ += P V_j.
      int cb, ce;  // never empty: the loop visits only tiles the query tile sees
      mask.tile_columns(q0, nr, k0, nc, cb, ce);
      ops::gemm(team, nr, ce - cb, D, qs, ldd, 1, kt + cb, ldc, s + cb, ldc, false);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
        if constexpr (Rule::softmax)
          update_row(team, b, h, r, q0 + r, k0, cb, ce, s, os, m, l);
        else
          msa_row(team, h, r, q0 + r, k0, cb, ce, s, l);
      });
      team.team_barrier();
      ops::gemm(team, nr, Dv, ce - cb, s + cb, ldc, 1, vs + static_cast<std::ptrdiff_t>(cb) * ldv,
                ldv, os, ldv, true);
    }
  }

  /// The key tiles [k_begin, k_end) of the query tile `tile`, key-major: S^T = K_j Q_i^T, the
  /// row rule's step down the columns for all rows at once (online softmax, or the multi-scale
  /// S = x M and r += |S|), O~ += P V_j with P (or S) read from S^T in place. The same
  /// arithmetic as the query-major sweep; only the layout differs.
  KOKKOS_INLINE_FUNCTION void sweep_key_major(const member_t& team, const Place& tile, int k_begin,
                                              int k_end,
                                              const typename ExecSpace::scratch_memory_space& scr,
                                              acc_t* qt, acc_t* os, acc_t*& m, acc_t*& l) const {
    const int b = tile.b, h = tile.h, hk = tile.hk, q0 = tile.q0, nr = tile.nr, D = head_dim,
              Dv = head_dim_v;
    const int ldd = this->ldd, ldo = this->ldv, ldq = this->ldq();
    acc_t* ks = base::carve(scr, std::size_t(Bc) * ldd);
    acc_t* vs = base::carve(scr, std::size_t(Bc) * ldo);
    acc_t* st = base::carve(scr, std::size_t(Bc) * ldq);
    m = base::carve(scr, std::size_t(Br));
    l = base::carve(scr, std::size_t(Br));
    acc_t* alpha = base::carve(scr, std::size_t(Br));  // e^(m - m') of the last tile
    acc_t* mt = nullptr;  // multi-scale: the mask tile M_ij^T, laid out as S^T
    if constexpr (!Rule::softmax) mt = base::carve(scr, std::size_t(Bc) * ldq);
    // bfloat16 pair products (pairs): Q_i^T as pair words in qt, unscaled (the scale goes on
    // the product, so that Q is rounded to bfloat16 only once, by the caller); K_j read where
    // it lies; P packed into pair words in pp per tile, V_j's pair words read from v_pairs or
    // interleaved into vp per tile.
    void* pp = nullptr;
    void* vp = nullptr;
    if constexpr (pairs_type) {
      pp = base::carve(scr, std::size_t(Bc + 1) / 2 * ldq);
      vp = base::carve(scr, std::size_t(Bc + 1) / 2 * ldo);
    }
    const bool pair_mode = pairs_type && pairs;  // the branches below compile only for pairs_type
    // Products on tiles that load A by rows (TileOps::bf16x2_tiles: the host's AMX) take P as
    // rows of pair words, one per query (ldp words apart); the others read it by columns.
    // PairScope sets the thread up for them for the whole sweep (host/amx.hpp).
    [[maybe_unused]] const bool p_rows = pair_mode && ops::bf16x2_tiles();
    [[maybe_unused]] const int ldp = (Bc + 1) / 2;  // nr x ldp words fit in pp's (Bc + 1) / 2 x ldq
    const typename ops::PairScope products(pair_mode);
    // A boolean mask's tile as bit words for col_softmax (mask_words): Bc words (keys) for
    // each 16 query rows.
    std::uint16_t* words = nullptr;
    const int ldw = Bc;
    if constexpr (mask_words)
      words = reinterpret_cast<std::uint16_t*>(
          base::carve(scr, mask_word_elements(std::size_t(Br), std::size_t(Bc))));

    // Q_i^T, once: as pair words, or in acc_t pre-multiplied by the scale (the score
    // transform's x = scale q.k).
    if (pair_mode) {
      if constexpr (pairs_type)
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
          const auto* qr = &q(b, h, q0 + r, 0);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D / 2), [&](int p) {
            backends::bf16x2_store(qt, static_cast<std::ptrdiff_t>(p) * ldq + r,
                                   backends::bf16x2_load(qr, p));
          });
        });
    } else {
      // Transposed by the backend's blocks (an element loop stores one scattered element at a
      // time), then scaled in place: the same one rounding of scale q.
      ops::stage_transposed(
          team, nr, 0, D, [&](int r) { return &q(b, h, q0 + r, 0); }, qt, ldq);
      team.team_barrier();
      ops::for_each_element(team, D, nr,
                            [&](int d, int r) { qt[d * ldq + r] = score.scaled(qt[d * ldq + r]); });
    }
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr), [&](int r) {
      m[r] = -backends::infinity<acc_t>();
      l[r] = acc_t(0);
    });

    for (int k0 = k_begin; k0 < k_end; k0 += Bc) {
      const int nc = seqlen_k - k0 < Bc ? seqlen_k - k0 : Bc;
      // Keys of this tile that any of its rows sees: rows [cb, ce) of S^T.
      int cb, ce;  // never empty: the loop visits only tiles the query tile sees
      mask.tile_columns(q0, nr, k0, nc, cb, ce);
      // A term read as rows of its plane (has_rows): how a boolean mask sees the tile, and the
      // next tile's rows asked for while this one is computed.
      Seen seen = Seen::some;
      if constexpr (staged_term) {
        const auto line = score.bias.line(b, h);
        if (k0 + Bc < k_end && k0 + Bc < seqlen_k) {
          const int k1 = k0 + Bc, n1 = seqlen_k - k1 < Bc ? seqlen_k - k1 : Bc;
          ops::prefetch_rows(nr, 0, n1, [&](int r) { return line.row(q0 + r) + k1; });
        }
        if constexpr (mask_words) {  // the tile's bits, read once, tell how it is seen
          ops::visibility_words(
              nr, cb, ce, [&](int r) { return line.row(q0 + r) + k0; }, words, ldw);
          seen = seen_in_words(words, ldw, nr, cb, ce);
          if (seen == Seen::none) continue;  // P = 0: the tile is skipped as masks skip theirs
        } else if constexpr (is_visibility<bias_t>::value) {
          seen = seen_by_mask(team, line, q0, nr, k0, cb, ce);
          if (seen == Seen::none) continue;
        }
      }
      tiles_staged.add(team, TileCounter::forward, nc);
      // K_j and V_j where they lie when the views hold acc_t (head_dim has unit stride,
      // validate.hpp): the products read rows ldk, ldv apart. Otherwise row copies into
      // scratch, converted (stage_rows).
      const acc_t* kj = ks;
      const acc_t* vj = vs;
      int ldk = ldd, ldv = ldo;
      if constexpr (kv_in_place_type)
        if (kv_in_place) {
          kj = &k(b, hk, k0, 0);
          vj = &v(b, hk, k0, 0);
          ldk = static_cast<int>(k.stride(2));
          ldv = static_cast<int>(v.stride(2));
        }
      if (kj == ks && !pair_mode) {
        team.team_barrier();  // the previous tile is no longer read
        const auto widen = [](auto x) { return static_cast<acc_t>(x); };
        base::stage_rows(
            team, nc, D, [&](int c) { return &k(b, hk, k0 + c, 0); }, ks, ldd, widen);
        base::stage_rows(
            team, nc, Dv, [&](int c) { return &v(b, hk, k0 + c, 0); }, vs, ldo, widen);
      }
      team.team_barrier();
      // Whether the mask's edge crosses the tile: the ends of the visible intervals grow with
      // the row.
      const bool edge = mask.lo(q0 + nr - 1) - k0 > cb || mask.hi(q0) + 1 - k0 < ce;
      // S^T's column maxima from the product's registers (TileOps::gemm_col_max) where S^T is
      // the score itself (no transform, no term, no hidden key), into alpha, which holds them
      // until col_softmax_max makes them the factors.
      bool max_in_gemm = false;
      if constexpr (col_max_in_gemm) max_in_gemm = !edge && score.identity();
      // S^T by the groups of query rows that see each key (visible_key_rows) where nothing
      // reads S^T before the -inf of the hidden entries is written (no transform, no term).
      const bool by_groups = edge && Rule::softmax && !staged_term && score.identity();
      if (pair_mode) {
        if constexpr (pairs_type) {
          const auto* kp = &k(b, hk, k0 + cb, 0);
          const int ldkp = static_cast<int>(k.stride(2) / 2);
          acc_t* sp = st + static_cast<std::ptrdiff_t>(cb) * ldq;
          if (max_in_gemm) {
            if constexpr (col_max_in_gemm)
              ops::gemm_bf16x2_col_max(team, ce - cb, nr, D / 2, kp, ldkp, 1, qt, ldq, sp, ldq,
                                       score.scale, alpha);
          } else {
            visible_key_rows(by_groups, q0, nr, k0, cb, ce, [&](int j0, int j1, int r0, int r1) {
              ops::gemm_bf16x2(team, j1 - j0, r1 - r0, D / 2,
                               kp + static_cast<std::ptrdiff_t>(j0 - cb) * k.stride(2), ldkp, 1,
                               qt + r0, ldq, st + static_cast<std::ptrdiff_t>(j0) * ldq + r0, ldq,
                               score.scale, false);
            });
          }
        }
      } else if (max_in_gemm) {
        if constexpr (col_max_in_gemm)
          ops::gemm_col_max(team, ce - cb, nr, D, kj + static_cast<std::ptrdiff_t>(cb) * ldk, ldk,
                            1, qt, ldq, st + static_cast<std::ptrdiff_t>(cb) * ldq, ldq, alpha);
      } else {
        visible_key_rows(by_groups, q0, nr, k0, cb, ce, [&](int j0, int j1, int r0, int r1) {
          ops::gemm(team, j1 - j0, r1 - r0, D, kj + static_cast<std::ptrdiff_t>(j0) * ldk, ldk, 1,
                    qt + r0, ldq, st + static_cast<std::ptrdiff_t>(j0) * ldq + r0, ldq, false);
        });
      }
      team.team_barrier();
      // x -> S (impl/score.hpp), and -inf where a row does not see a key of [cb, ce) (0 under
      // the multi-scale rule, whose S enters O~ as it is): only in tiles the mask's edge
      // crosses.
      constexpr acc_t hidden = Rule::softmax ? -backends::infinity<acc_t>() : acc_t(0);
      bool edge_left = edge;  // the interval mask's -inf still to be written
      if constexpr (staged_term) {
        // softcap a key at a time, then the term's tile added at once: read a query row of the
        // plane at a time (unit stride) and written transposed into S^T. Nothing where a mask
        // sees every key of the tile.
        if (score.capped()) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cb, ce), [&](int c) {
            score.softcap_column(team, nr, st + static_cast<std::ptrdiff_t>(c) * ldq);
          });
          team.team_barrier();  // threads own keys there, query rows below
        }
        if (!mask_words && seen != Seen::all) {  // mask_words: col_softmax reads the words
          const auto line = score.bias.line(b, h);
          ops::stage_transposed(
              team, nr, cb, ce, [&](int r) { return line.row(q0 + r) + k0; }, st, ldq,
              typename bias_t::convert{}, true);
        }
        team.team_barrier();
      } else if (Rule::softmax && !score.identity()) {  // a key at a time: the loops vectorise
        edge_left = false;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cb, ce), [&](int c) {
          acc_t* col = st + static_cast<std::ptrdiff_t>(c) * ldq;
          score.column(team, b, h, q0, nr, k0 + c, col);
          if (edge)
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, nr), [&](int r) {
              if (k0 + c < mask.lo(q0 + r) || k0 + c > mask.hi(q0 + r))
                col[r] = -backends::infinity<acc_t>();
            });
        });
        team.team_barrier();
      }
      if (edge_left) {
        // Key c of the tile is hidden from the rows whose interval ends before it and from those
        // whose interval starts after it: mask.lo and mask.hi grow with the row, so these are a
        // first and a last run of S^T's row c (unit stride), and both runs' bounds grow with c.
        // Keys in chunks of 16: a bisection for the chunk's first key, then the bounds walked
        // up (a bisection per key, with its unpredictable branches, cost more than it saved).
        // Runs that overlap (rows seeing nothing) are written twice. Row by row instead, the
        // runs went down S^T's columns one scalar store at a time.
        constexpr int chunk = 16;
        Kokkos::parallel_for(
            Kokkos::TeamThreadRange(team, (ce - cb + chunk - 1) / chunk), [&](int n) {
              const int c0 = cb + n * chunk, c1 = ce - c0 < chunk ? ce : c0 + chunk;
              int ended = first_row(nr, [&](int r) { return mask.hi(q0 + r) >= k0 + c0; });
              int later = first_row(nr, [&](int r) { return mask.lo(q0 + r) > k0 + c0; });
              for (int c = c0; c < c1; ++c) {
                while (ended < nr && mask.hi(q0 + ended) < k0 + c)
                  ++ended;
                while (later < nr && mask.lo(q0 + later) <= k0 + c)
                  ++later;
                acc_t* row = st + static_cast<std::ptrdiff_t>(c) * ldq;
                Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ended),
                                     [&](int r) { row[r] = hidden; });
                Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, later, nr),
                                     [&](int r) { row[r] = hidden; });
              }
            });
        team.team_barrier();
      }
      if constexpr (!Rule::softmax) {
        // The multi-scale step of every row at once: S = x M in S^T's place and the tile's
        // partial r = sum |S| merged into each row's by kfa::msa::combine (TileOps::
        // col_abs_sum). M_ij^T is staged first, read a query row of M at a time (unit stride
        // in a row-major mask), 0 where the row does not see the key, so that the column pass
        // reads both tiles alike.
        if (rule.has_mask) {
          stage_mask_tile(team, h, q0, nr, k0, cb, ce, edge, mt);
          team.team_barrier();
          if (mask_rows && k0 + Bc < k_end && k0 + Bc < seqlen_k) {  // the next mask tile
            const int k1 = k0 + Bc, n1 = seqlen_k - k1 < Bc ? seqlen_k - k1 : Bc;
            ops::prefetch_rows(nr, 0, n1, [&](int r) { return &rule.m(h, q0 + r, k1); });
          }
        }
        ops::col_abs_sum(team, st, ldq, rule.has_mask ? mt : nullptr, cb, ce, nr, l);
      } else {
        // The online-softmax step of every row at once: the combiner of kfa/combine.hpp down
        // the columns (TileOps::col_softmax), P in S^T's place, alpha = e^(m - m') per row.
        // A boolean mask's hidden scores as -inf through its words (mask_words).
        if (mask_words && seen != Seen::all) {
          if constexpr (mask_words)
            ops::col_softmax(team, st, ldq, cb, ce, nr, m, l, alpha, words, ldw);
        } else if (max_in_gemm) {
          if constexpr (col_max_in_gemm)
            ops::col_softmax_max(team, st, ldq, cb, ce, nr, m, l, alpha);
        } else {
          ops::col_softmax(team, st, ldq, cb, ce, nr, m, l, alpha);
        }
      }
      if (Rule::softmax && dropout.enabled) {
        team.team_barrier();
        // Blocks of 16 query rows (scale_key_major's batch) over the team's threads.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (nr + 15) / 16), [&](int blk) {
          const int r0 = 16 * blk, n = nr - r0 < 16 ? nr - r0 : 16;
          dropout.template scale_key_major<ops>(b, h, q0 + r0, n, k0, cb, ce, st + r0, ldq);
        });
      }
      team.team_barrier();
      if constexpr (Rule::softmax)
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
          const acc_t a = alpha[r];
          acc_t* orow = os + static_cast<std::ptrdiff_t>(r) * ldo;
          if (a != acc_t(1))  // 1 for most rows once their maximum has settled
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv), [&](int d) { orow[d] *= a; });
        });
      if (pair_mode) {  // P rounded to bfloat16 once, as FlashAttention-2 rounds it to 16 bits
        if constexpr (pairs_type) {
          const acc_t* pt = st + static_cast<std::ptrdiff_t>(cb) * ldq;
          if (p_rows)
            ops::pack_bf16x2_columns(team, pt, ldq, ce - cb, nr, pp, ldp);
          else
            ops::pack_bf16x2_rows(team, pt, ldq, ce - cb, nr, pp, ldq);
          // The launch's pair words (v_pairs: an even key of the view with the next) where they
          // are the tile's own: from an even cb, and an odd count only where the tile's last
          // key ends the view (the extra key is then the 0 the interleave pads with). Elsewhere
          // they would put a key no row of the tile sees into a pair (P = 0 there, but
          // 0 x Inf or NaN is NaN, and a cache's unwritten rows may hold either).
          const std::uint32_t* vw = static_cast<const std::uint32_t*>(vp);
          if (v_pairs.data() != nullptr && cb % 2 == 0 &&
              ((ce - cb) % 2 == 0 || k0 + ce == seqlen_k))
            vw = &v_pairs(
                (static_cast<std::size_t>(b) * v.extent(1) + hk) * key_pairs + (k0 + cb) / 2, 0);
          else
            ops::interleave_bf16x2_rows(team, &v(b, hk, k0 + cb, 0), v.stride(2), ce - cb, Dv, vp,
                                        ldo);
          team.team_barrier();
          // Pair words from cb: a group's keys [a, z) widened to whole pairs (P is 0 in the
          // extra key). Not on AMX tiles (p_rows), which take 16 rows at a time.
          visible_row_groups(
              edge && !p_rows, q0, nr, k0, cb, ce, [&](int r0, int rn, int a, int z) {
                const int w0 = (a - cb) / 2, w1 = (z - cb + 1) / 2;
                const std::ptrdiff_t at =
                    p_rows ? std::ptrdiff_t(r0) * ldp + w0 : std::ptrdiff_t(w0) * ldq + r0;
                ops::gemm_bf16x2(team, rn, Dv, w1 - w0, static_cast<const std::uint32_t*>(pp) + at,
                                 p_rows ? ldp : 1, p_rows ? 1 : ldq, vw + std::ptrdiff_t(w0) * ldo,
                                 ldo, os + static_cast<std::ptrdiff_t>(r0) * ldo, ldo, 1.0f, true);
              });
        }
      } else {
        team.team_barrier();
        visible_row_groups(edge, q0, nr, k0, cb, ce, [&](int r0, int rn, int a, int z) {
          ops::gemm(team, rn, Dv, z - a, st + static_cast<std::ptrdiff_t>(a) * ldq + r0, 1, ldq,
                    vj + static_cast<std::ptrdiff_t>(a) * ldv, ldv,
                    os + static_cast<std::ptrdiff_t>(r0) * ldo, ldo, true);
        });
      }
    }
  }

  /// Query rows per P V product on a tile the mask's edge crosses (TileOps::gemm_row_group; 0
  /// where the backend has none: one product over the whole tile).
  template <class Ops, class = void>
  struct row_group_of : std::integral_constant<int, 0> {};
  template <class Ops>
  struct row_group_of<Ops, std::void_t<decltype(Ops::gemm_row_group)>>
      : std::integral_constant<int, Ops::gemm_row_group> {};
  static constexpr int row_group = row_group_of<ops>::value;

  /// f(r0, rn, a, z) for the P V products of a tile: rows [r0, r0 + rn) of the query tile
  /// with keys [a, z) of the key tile. Where the mask's edge crosses the tile (`edge`), in
  /// groups of row_group rows, each to the keys of [cb, ce) that its rows see: P is 0 past
  /// them (a causal diagonal tile's P V about halves), and a group that sees none is skipped.
  /// Otherwise all nr rows with [cb, ce).
  template <class F>
  KOKKOS_INLINE_FUNCTION void visible_row_groups(bool edge, int q0, int nr, int k0, int cb, int ce,
                                                 const F& f) const {
    if (!edge || row_group == 0) {
      f(0, nr, cb, ce);
      return;
    }
    for (int r0 = 0; r0 < nr; r0 += row_group) {
      const int rn = nr - r0 < row_group ? nr - r0 : row_group;
      // lo and hi grow with the row: the group's first row has the smallest lo, its last the
      // largest hi.
      const int lo = mask.lo(q0 + r0) - k0, hi = mask.hi(q0 + r0 + rn - 1) + 1 - k0;
      const int a = lo > cb ? lo : cb, z = hi < ce ? hi : ce;
      if (a < z) f(r0, rn, a, z);
    }
  }

  /// The first r of [0, n) where pred(r) holds, n if none; pred false then true over [0, n).
  template <class Pred>
  static KOKKOS_INLINE_FUNCTION int first_row(int n, const Pred& pred) {
    int lo = 0, hi = n;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (pred(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }

  /// Query columns per group of S^T's product on a tile the mask's edge crosses
  /// (TileOps::gemm_column_group; 0 where the backend has none: one product over the tile).
  template <class Ops, class = void>
  struct column_group_of : std::integral_constant<int, 0> {};
  template <class Ops>
  struct column_group_of<Ops, std::void_t<decltype(Ops::gemm_column_group)>>
      : std::integral_constant<int, Ops::gemm_column_group> {};
  static constexpr int column_group = column_group_of<ops>::value;

  /// f(j0, j1, r0, r1) for the products of S^T = K_j Q_i^T on a tile: keys [j0, j1) of the key
  /// tile (rows of S^T) with query rows [r0, r1) (its columns). Where the mask's edge crosses
  /// the tile (`edge`), the query rows go in groups of column_group, and each key row is
  /// computed only for the groups that have a row seeing it: a causal diagonal tile's S^T
  /// loses the groups wholly above the diagonal (3/8 of it at 64 rows in groups of 16). The
  /// entries left out are hidden from every row of their group, and the caller writes -inf
  /// there as on every hidden entry. Otherwise keys [cb, ce) with all nr rows.
  template <class F>
  KOKKOS_INLINE_FUNCTION void visible_key_rows(bool edge, int q0, int nr, int k0, int cb, int ce,
                                               const F& f) const {
    constexpr int G = column_group;
    if (!edge || G == 0 || nr <= G) {
      f(cb, ce, 0, nr);
      return;
    }
    const int groups = (nr + G - 1) / G;
    const auto clip = [&](int x) { return x < cb ? cb : (x > ce ? ce : x); };
    // Group g sees keys [first(g), end(g)) of the tile; both grow with g (mask.lo and mask.hi
    // grow with the row), so the groups that see key j are a run [g_lo, g_hi], and the run
    // changes only where j reaches end(g_lo) or first(g_hi + 1).
    const auto first = [&](int g) { return clip(mask.lo(q0 + g * G) - k0); };
    const auto end = [&](int g) {
      const int last = (g + 1) * G < nr ? (g + 1) * G - 1 : nr - 1;
      return clip(mask.hi(q0 + last) + 1 - k0);
    };
    int g_lo = 0, g_hi = -1;
    for (int j = cb; j < ce;) {
      while (g_lo < groups && end(g_lo) <= j)
        ++g_lo;
      while (g_hi + 1 < groups && first(g_hi + 1) <= j)
        ++g_hi;
      const int leaves = g_lo < groups ? end(g_lo) : ce;
      const int enters = g_hi + 1 < groups ? first(g_hi + 1) : ce;
      const int t = leaves < enters ? leaves : enters;
      if (g_lo <= g_hi) f(j, t, g_lo * G, (g_hi + 1) * G < nr ? (g_hi + 1) * G : nr);
      j = t;
    }
  }

  /// How a boolean mask sees a tile: no key of it, some, or all (of columns [cb, ce) of its nr
  /// rows; the interval mask may hide more).
  enum class Seen { none, some, all };
  /// The softmax forward's term as rows of its plane (impl/score.hpp, has_rows).
  static constexpr bool staged_term = Rule::softmax && has_rows<bias_t>::value;
  /// Whether the backend gives S^T's column maxima with the product (TileOps::gemm_col_max,
  /// gemm_bf16x2_col_max and col_softmax_max: the host's tiles), taken for float tiles (the
  /// host's col_softmax has vector blocks for float only): the online softmax then skips its
  /// pass over S^T for them.
  template <class Ops, class = void>
  struct has_col_max : std::false_type {};
  template <class Ops>
  struct has_col_max<Ops, std::void_t<decltype(&Ops::template gemm_col_max<member_t>),
                                      decltype(&Ops::template gemm_bf16x2_col_max<member_t>),
                                      decltype(&Ops::template col_softmax_max<member_t>)>>
      : std::true_type {};
  static constexpr bool col_max_in_gemm =
      Rule::softmax && !staged_term && std::is_same_v<acc_t, float> && has_col_max<ops>::value;

  /// A boolean mask the backend's col_softmax takes as bit words (TileOps::visibility_words)
  /// instead of -inf written into S^T: one pass over the tile fewer.
  template <class Ops, class = void>
  struct words_in_ops : std::false_type {};
  template <class Ops>
  struct words_in_ops<Ops, std::enable_if_t<Ops::has_visibility_words>> : std::true_type {};
  static constexpr bool mask_words =
      staged_term && is_visibility<bias_t>::value && words_in_ops<ops>::value;
  /// Words of a Br x Bc tile's visibility bits (16 query rows a word) in acc_t elements.
  static constexpr std::size_t mask_word_elements(std::size_t br, std::size_t bc) {
    if (!mask_words) return 0;
    return (bc * ((br + 15) / 16) * sizeof(std::uint16_t) + sizeof(acc_t) - 1) / sizeof(acc_t);
  }

  /// How a tile's visibility words (TileOps::visibility_words) see keys [cb, ce) from its nr
  /// query rows: or and and of the words, the bits of rows past nr set for the and.
  static KOKKOS_INLINE_FUNCTION Seen seen_in_words(const std::uint16_t* w, int ldw, int nr, int cb,
                                                   int ce) {
    unsigned any = 0, all = 0xFFFF;
    for (int g = 0; g * 16 < nr; ++g) {
      const unsigned absent = nr - g * 16 >= 16 ? 0U : 0xFFFFU << (nr - g * 16);
      const std::uint16_t* wg = w + static_cast<std::ptrdiff_t>(g) * ldw;
      for (int c = cb; c < ce; ++c) {
        any |= wg[c];
        all &= wg[c] | absent;
      }
    }
    return (all & 0xFFFFU) == 0xFFFFU ? Seen::all : any ? Seen::some : Seen::none;
  }

  /// How the mask's plane (its Line) sees keys [k0 + cb, k0 + ce) from query rows [q0, q0 + nr):
  /// two flags or-ed over the tile's bytes, a query row at a time (unit stride).
  template <class Line>
  KOKKOS_INLINE_FUNCTION Seen seen_by_mask(const member_t& team, const Line& line, int q0, int nr,
                                           int k0, int cb, int ce) const {
    unsigned flags = 0;  // 1: a visible key, 2: a hidden one
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, nr),
        [&](int r, unsigned& f) {
          const auto* src = line.row(q0 + r) + k0;
          unsigned char any = 0, all = 1;
          for (int c = cb; c < ce; ++c) {
            const unsigned char v = src[c] != 0;
            any |= v;
            all &= v;
          }
          f |= (any ? 1U : 0U) | (all ? 0U : 2U);
        },
        Kokkos::BOr<unsigned>(flags));
    return flags == 1 ? Seen::all : (flags & 1U) ? Seen::some : Seen::none;
  }

  /// The mask tile of the key-major multi-scale step: mt[c][r] = M[h, q0 + r, k0 + c] for keys
  /// [cb, ce) of the tile and its nr query rows (row stride ldq), 0 where row r does not see
  /// the key (only in edge tiles). A query row of M at a time, so that its reads are unit
  /// stride in a row-major mask and the writes stay in the scratch tile.
  KOKKOS_INLINE_FUNCTION void stage_mask_tile(const member_t& team, int h, int q0, int nr, int k0,
                                              int cb, int ce, bool edge, acc_t* mt) const {
    const int ldq = this->ldq();
    if (mask_rows && !edge) {  // rows of M copied transposed (TileOps::stage_transposed)
      ops::stage_transposed(
          team, nr, cb, ce, [&](int r) { return &rule.m(h, q0 + r, k0); }, mt, ldq);
      return;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int r) {
      const int i = q0 + r;
      int lo = cb, hi = ce;
      if (edge) {
        lo = mask.lo(i) - k0 > cb ? mask.lo(i) - k0 : cb;
        hi = mask.hi(i) + 1 - k0 < ce ? mask.hi(i) + 1 - k0 : ce;
        if (lo > hi) lo = hi = ce;
      }
      acc_t* col = mt + r;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cb, lo),
                           [&](int c) { col[static_cast<std::ptrdiff_t>(c) * ldq] = acc_t(0); });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lo, hi), [&](int c) {
        col[static_cast<std::ptrdiff_t>(c) * ldq] = static_cast<acc_t>(rule.m(h, i, k0 + c));
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hi, ce),
                           [&](int c) { col[static_cast<std::ptrdiff_t>(c) * ldq] = acc_t(0); });
    });
  }

  /// Multi-scale step of query row r (local index i) of query head h against the key tile at
  /// k0 whose products x = scale q.k fill columns [cb, ce) of s: S = x M[h, i, j] in place (0
  /// for keys the row does not see, so that O~ += S V_j follows for the whole tile) and
  /// r += sum |S|: the tile's partial merged into the row's by kfa::msa::combine. No exp, no
  /// rescaling: O~ stays unnormalised until the end.
  KOKKOS_INLINE_FUNCTION void msa_row(const member_t& team, int h, int r, int i, int k0, int cb,
                                      int ce, acc_t* s, acc_t* l) const {
    const int lo = mask.lo(i) - k0, hi = mask.hi(i) + 1 - k0;
    int c0 = lo > cb ? lo : cb, c1 = hi < ce ? hi : ce;
    if (c0 >= c1) c0 = c1 = ce;  // sees none of [cb, ce): the first loop below zeroes them all
    acc_t* srow = s + r * ldc;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cb, c0), [&](int c) { srow[c] = 0; });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c1, ce), [&](int c) { srow[c] = 0; });
    acc_t tile_r = 0;
    if (rule.has_mask)
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, c0, c1),
          [&](int c, acc_t& acc) {
            const acc_t x = srow[c] * rule.weight(h, i, k0 + c);
            srow[c] = x;
            acc += backends::abs(x);
          },
          tile_r);
    else
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, c0, c1),
          [&](int c, acc_t& acc) { acc += backends::abs(srow[c]); }, tile_r);
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      l[r] = msa::combine(msa::Partial<acc_t>{l[r]}, msa::Partial<acc_t>{tile_r}).r;
    });
  }

  /// Online-softmax step of query row r (global index i) of head (b, h) against the key tile
  /// at k0 whose products x = scale q.k fill columns [cb, ce) of s: turns them into the scores
  /// S_ij (impl/score.hpp), then into P (zero for keys the row does not see), rescales its O~
  /// and updates m and l. O~ += P V_j follows for the whole tile.
  KOKKOS_INLINE_FUNCTION void update_row(const member_t& team, int b, int h, int r, int i, int k0,
                                         int cb, int ce, acc_t* s, acc_t* os, acc_t* m,
                                         acc_t* l) const {
    const int lo = mask.lo(i) - k0, hi = mask.hi(i) + 1 - k0;
    const int c0 = lo > cb ? lo : cb, c1 = hi < ce ? hi : ce;
    acc_t* srow = s + r * ldc;
    // Keys this row does not see contribute P = 0 to the tile product.
    if (c0 >= c1) {  // none: m, l and O~ stay
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cb, ce), [&](int c) { srow[c] = 0; });
      return;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cb, c0), [&](int c) { srow[c] = 0; });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c1, ce), [&](int c) { srow[c] = 0; });
    score.row(team, b, h, i, k0, srow, c0, c1);
    const acc_t tile_max = ops::row_max(team, srow, c0, c1);
    // Merge the tile's partial into the row's with the combiner (kfa/combine.hpp). The tile's
    // P is formed relative to the merged maximum, which folds the combiner's beta into P.
    const Rescale<acc_t> merge = rescale(m[r], tile_max);
    const acc_t m_new = merge.m, alpha = merge.alpha;  // alpha = 0 on the first visible tile
    if constexpr (bias_t::enabled)  // a term hid every key so far (-inf): P = 0, m, l stay
      if (m_new == -backends::infinity<acc_t>()) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) { srow[c] = 0; });
        return;
      }
    const acc_t row_sum = ops::row_exp_sum(team, srow, c0, c1, m_new);
    // Dropout acts on P after the row statistics: m and l (hence LSE) stay those of the
    // undropped softmax, and O~ accumulates (P * Z) V.
    if (dropout.enabled)
      dropout.for_each(team, b, h, i, k0, c0, c1, [&](int c, acc_t z) { srow[c] *= z; });
    acc_t* orow = os + static_cast<std::ptrdiff_t>(r) * ldv;
    if (alpha != acc_t(1))
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_dim_v),
                           [&](int d) { orow[d] *= alpha; });
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      m[r] = m_new;
      l[r] = alpha * l[r] + row_sum;
    });
  }
};

/// kfa::forward after its compile-time checks, on a block at `at` of the sequence (the whole
/// sequence for a plain call), with an additive term of the score (kfa/masks.hpp; NoTerm:
/// none) or a row rule itself (kfa::mpi runs its multi-scale blocks here, with `params` the
/// masks of the multi-scale call): validation (the term's after the tensors'), then the launch.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Extra = NoTerm>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params, const Origin& at, const Extra& extra = {}) {
  using T = typename Q::non_const_value_type;
  ScopedRegion region("kfa::forward");
  validate_params<T>("forward", params);
  validate_forward("forward", q, k, v, o, lse);
  const auto rule =
      term_rule<backends::accum_t<T>, ExecSpace>("forward", extra, dims_of(q, k), false);
  ForwardKernel<ExecSpace, Q, K, V, O, Lse, std::decay_t<decltype(rule)>>(space, q, k, v, o, lse,
                                                                          params, at, rule)
      .launch(space);
}

/// The forward of packed sequences (kfa::varlen) in one launch: q, k, v, o and lse are batch 0
/// of (1, heads, total, head_dim) and (1, heads_q, total_q) views of the packed arrays, cq and
/// ck the checked host offsets. The caller validates. No split-KV (a team per sequence, head
/// and query tile), and the tile path on every backend.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Extra = NoTerm>
void forward_packed(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                    const Lse& lse, const std::vector<std::int32_t>& cq,
                    const std::vector<std::int32_t>& ck, const Params& params,
                    const Extra& extra = {}) {
  using T = typename Q::non_const_value_type;
  ScopedRegion region("kfa::forward");
  const auto rule =
      term_rule<backends::accum_t<T>, ExecSpace>("forward", extra, dims_of(q, k), false);
  using Seqs = PackedSequences<typename ExecSpace::memory_space>;
  ForwardKernel<ExecSpace, Q, K, V, O, Lse, std::decay_t<decltype(rule)>, Seqs> kernel(
      space, q, k, v, o, lse, params, Origin{}, rule);
  kernel.seqs = packed_sequences<typename ExecSpace::memory_space>(cq, ck, kernel.Br, params);
  kernel.launch(space);
}

}  // namespace kfa::impl
