#pragma once
/// \file params.hpp
/// Parameters shared by every kfa pass, and the error type kfa throws.

#include <cstdint>
#include <stdexcept>
#include <string>

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
  /// Backward without atomics, bitwise repeatable.
  bool deterministic = false;
  /// Forward split-KV: the keys each query tile sees are cut into this many contiguous chunks,
  /// computed by separate teams and merged with the combiner. 0 lets kfa choose from the
  /// problem size and the execution space's concurrency (it splits only when the unsplit
  /// launch has fewer teams than the space runs at once); 1 never splits; n > 1 forces n,
  /// capped at the number of key tiles. Any choice gives the same result within rounding
  /// and is bitwise repeatable.
  int num_splits = 0;
};

}  // namespace kfa
