#pragma once
/// \file params.hpp
/// Parameters shared by every kfa pass, and the error type kfa throws.

#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kfa {

/// Thrown on the host, before any kernel is launched, when an argument is invalid.
/// The message names the argument and, for shapes, both sizes that disagree.
class Error : public std::invalid_argument {
 public:
  /// \param what the argument and what is wrong with it; prefixed with "kfa: ".
  explicit Error(const std::string& what) : std::invalid_argument("kfa: " + what) {}
};

/// Where the diagonal of causal and sliding-window masks sits when seqlen_q != seqlen_k.
enum class Align {
  /// Query i sees key j when j <= i + (seqlen_k - seqlen_q): the last query sees the last key.
  /// flash-attn >= 2.1's convention, and kfa's default.
  bottom_right,
  /// Query i sees key j when j <= i: PyTorch SDPA's convention for is_causal.
  top_left
};

/// How the backward computes dQ (Params::dq_mode). Every mode gives the same gradients within
/// rounding; they differ in speed, memory and repeatability (README, "Using the library").
enum class DqMode {
  /// atomic, except where atomic adds are slow (host spaces with threads) or
  /// Params::deterministic asks for repeatability: query_pass there.
  automatic,
  /// FlashAttention-2's Algorithm 2: one team per key tile adds its dQ contributions with
  /// atomics. Not bitwise repeatable where teams run concurrently.
  atomic,
  /// A second pass, one team per query tile, recomputes P and dS for dQ: no atomics, bitwise
  /// repeatable, twice the score products.
  query_pass,
  /// One kernel for self-attention (seqlen_q == seqlen_k, heads_q == heads_k): the team of
  /// tile j computes dK_j and dV_j from every query tile i that sees it and dQ_j from every key
  /// tile it sees, never writing dQ from an inner loop (the seed's Algorithm 7, two tiles per
  /// step): no atomics, bitwise repeatable, the query pass's products in one launch.
  symmetric
};

/// Options of an attention pass. Masks combine: a key is visible to a query when every
/// enabled mask lets it through. With d = j - i - shift (shift = seqlen_k - seqlen_q for
/// bottom_right, 0 for top_left), key j is visible to query i when
///   -window_left <= d (if window_left >= 0), d <= window_right (if window_right >= 0),
///   and d <= 0 (if causal).
/// A query that sees no key at all gets O = 0 and LSE = -inf.
struct Params {
  /// Multiplies Q K^T; any value < 0 means 1/sqrt(head_dim). Must be finite.
  double scale = -1;
  /// Causal mask (equivalent to window_right = 0, combinable with a window).
  bool causal = false;
  /// Alignment of causal and window masks when seqlen_q != seqlen_k.
  Align align = Align::bottom_right;
  /// Sliding window: keys visible left of the diagonal; -1 means unbounded, 0 none.
  int window_left = -1;
  /// Sliding window: keys visible right of the diagonal; -1 means unbounded, 0 none.
  int window_right = -1;
  /// Soft-capping of the scaled scores, S <- softcap * tanh(S / softcap); 0 turns it off.
  double softcap = 0;
  /// Dropout probability on the normalised P, in [0, 1); 0 turns it off. Kept probabilities
  /// are scaled by 1 / (1 - p); LSE is not affected. The mask is a function of (seed, offset,
  /// batch, query head, query index, key index) only: see kfa/dropout.hpp.
  double dropout = 0;
  /// Dropout seed (the Philox key).
  std::uint64_t seed = 0;
  /// Dropout stream: each (seed, offset) pair gives an unrelated mask. Advance it (by 1 is
  /// enough) between calls that need fresh masks; a backward uses its forward's pair.
  std::uint64_t offset = 0;
  /// Backward without atomics, bitwise repeatable: with dq_mode automatic, the query pass;
  /// refused with dq_mode atomic.
  bool deterministic = false;
  /// How the backward computes dQ (DqMode).
  DqMode dq_mode = DqMode::automatic;
  /// Forward split-KV: the keys each query tile sees are cut into this many contiguous chunks,
  /// computed by separate teams and merged with the combiner. 0 lets kfa choose from the
  /// problem size and the execution space's concurrency (it splits only when the unsplit
  /// launch has fewer teams than the space runs at once); 1 never splits; n > 1 forces n,
  /// capped at the number of key tiles. Any choice gives the same result within rounding
  /// and is bitwise repeatable.
  int num_splits = 0;
};

namespace msa {

/// Options of a multi-scale attention pass (kfa::msa::forward, kfa::msa::backward, in
/// <kfa/multiscale.hpp>). The masks are kfa::Params' causal and window masks, with the same
/// definition and alignment; a key they hide has S = 0.
struct Params {
  /// Multiplies Q K^T before the mask tensor; any finite value (the default, 1, is the
  /// formula without a scale). Unlike kfa::Params::scale, a negative value is not a default.
  double scale = 1.0;
  /// Causal mask (keys right of the diagonal hidden).
  bool causal = false;
  /// Alignment of causal and window masks when seqlen_q != seqlen_k.
  Align align = Align::bottom_right;
  /// Sliding window: keys visible left of the diagonal; -1 means unbounded.
  int window_left = -1;
  /// Sliding window: keys visible right of the diagonal; -1 means unbounded.
  int window_right = -1;
  /// Backward without atomics, bitwise repeatable (as kfa::Params::deterministic).
  bool deterministic = false;
  /// How the backward computes dQ (as kfa::Params::dq_mode).
  DqMode dq_mode = DqMode::automatic;
  /// Forward split-KV chunks (as kfa::Params::num_splits): 0 chooses, 1 never splits.
  int num_splits = 0;
};

}  // namespace msa

/// The kfa::Params with the masks, split count and dQ mode of a multi-scale pass, and
/// no softcap or dropout; its scale is left at the default, since the multi-scale kernels
/// set their own (a negative msa scale is a real scale, not the default).
inline Params masks_of(const msa::Params& m) {
  Params p;
  p.causal = m.causal;
  p.align = m.align;
  p.window_left = m.window_left;
  p.window_right = m.window_right;
  p.deterministic = m.deterministic;
  p.dq_mode = m.dq_mode;
  p.num_splits = m.num_splits;
  return p;
}

/// Which passes read a field of Params (a program reports a flag its pass does not use).
enum class Passes { both, forward, backward };

/// One field of a parameter struct as the programs and the MPI agreement check see it.
struct Field {
  /// The member's name; also its key in the programs' JSON lines.
  const char* name;
  /// Its command-line flag in the kfa programs (a bool field's flag takes no value).
  const char* flag;
  /// The passes that read it.
  Passes passes;
  /// One line for the programs' usage text.
  const char* help;
};

/// Whether `pass` reads field f (Passes::both asks for every field).
inline bool reads(const Field& f, Passes pass) {
  return f.passes == Passes::both || pass == Passes::both || f.passes == pass;
}

/// The one list of Params' fields, in declaration order: calls f(Field, member) for each, with
/// `member` a (const) reference into p. The programs parse flags, print the run description and
/// write JSON from it, and kfa::mpi checks that every rank passed the same values with it, so
/// adding a parameter is one member above and one line here. Member types are bool, int,
/// double, std::uint64_t or an enum with an EnumNames specialisation.
template <class P, class F>
void for_each_field(P& p, F&& f) {
  static_assert(std::is_same_v<std::remove_const_t<P>, Params>, "for_each_field takes Params");
  f(Field{"scale", "--scale", Passes::both, "multiplies Q K^T (default 1/sqrt(head_dim))"},
    p.scale);
  f(Field{"causal", "--causal", Passes::both, "causal mask"}, p.causal);
  f(Field{"align", "--align", Passes::both, "mask diagonal: bottom-right (default) or top-left"},
    p.align);
  f(Field{"window_left", "--window-left", Passes::both, "keys visible left of the diagonal"},
    p.window_left);
  f(Field{"window_right", "--window-right", Passes::both, "keys visible right of the diagonal"},
    p.window_right);
  f(Field{"softcap", "--softcap", Passes::both, "S <- C tanh(S / C); 0 = off"}, p.softcap);
  f(Field{"dropout", "--dropout", Passes::both, "dropout probability in [0, 1)"}, p.dropout);
  f(Field{"seed", "--seed", Passes::both, "dropout seed"}, p.seed);
  f(Field{"offset", "--offset", Passes::both, "dropout stream"}, p.offset);
  f(Field{"deterministic", "--deterministic", Passes::backward, "no atomics, bitwise repeatable"},
    p.deterministic);
  f(Field{"dq_mode", "--dq-mode", Passes::backward,
          "dQ: auto (default), atomic, query-pass or symmetric (self-attention, one kernel)"},
    p.dq_mode);
  f(Field{"num_splits", "--splits", Passes::forward, "split-KV chunks (0 = choose, 1 = none)"},
    p.num_splits);
}

/// The names of an enum's values, as the programs spell them: a specialisation has
/// `static constexpr std::pair<E, const char*> values[]`. Every enum that appears in a field
/// list has one.
template <class E>
struct EnumNames;

/// Align's names.
template <>
struct EnumNames<Align> {
  /// Each value with its name.
  static constexpr std::pair<Align, const char*> values[] = {{Align::bottom_right, "bottom-right"},
                                                             {Align::top_left, "top-left"}};
};

/// DqMode's names.
template <>
struct EnumNames<DqMode> {
  /// Each value with its name.
  static constexpr std::pair<DqMode, const char*> values[] = {{DqMode::automatic, "auto"},
                                                              {DqMode::atomic, "atomic"},
                                                              {DqMode::query_pass, "query-pass"},
                                                              {DqMode::symmetric, "symmetric"}};
};

/// The name of e ("?" for a value without one).
template <class E>
const char* name_of(E e) {
  for (const auto& [v, n] : EnumNames<E>::values)
    if (v == e) return n;
  return "?";
}

/// Sets e to the value named `text`; false (e unchanged) when no value has that name.
template <class E>
bool parse_name(std::string_view text, E& e) {
  for (const auto& [v, n] : EnumNames<E>::values)
    if (text == n) {
      e = v;
      return true;
    }
  return false;
}

/// "a, b or c": the names of E's values, for error messages.
template <class E>
std::string names_of() {
  std::string s;
  const std::size_t n = std::size(EnumNames<E>::values);
  for (std::size_t i = 0; i < n; ++i)
    s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + EnumNames<E>::values[i].second;
  return s;
}

}  // namespace kfa
