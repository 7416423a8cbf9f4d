#pragma once
// The score terms of kfa/masks.hpp as the suites draw them: a kind, the reference's host Terms
// of that kind for a shape, and the library's term object on the suite's space (test_bias,
// and kfa::mpi's in test_seqpar).

#include <cstdint>
#include <random>

#include "problem.hpp"

namespace kfa_test {

/// The value type of slopes and bias for inputs of type T: the accumulation type.
template <class T>
using term_t = lse_t<T>;

/// The kinds of term under test: ALiBi, a bias of extents (B or 1, Hq or 1, Nq, Nk), a boolean
/// mask of such extents, key padding.
enum class Kind {
  alibi,
  bias,
  bias_1h,
  bias_b1,
  bias_11,
  dense,
  dense_1h,
  dense_11,
  keypad,
  blocks,
  blocks_1h,
  blocks_b1
};

inline const char* name_of(Kind k) {
  switch (k) {
    case Kind::alibi:
      return "alibi";
    case Kind::bias:
      return "bias(B,H)";
    case Kind::bias_1h:
      return "bias(1,H)";
    case Kind::bias_b1:
      return "bias(B,1)";
    case Kind::bias_11:
      return "bias(1,1)";
    case Kind::dense:
      return "mask(B,H)";
    case Kind::dense_1h:
      return "mask(1,H)";
    case Kind::dense_11:
      return "mask(1,1)";
    case Kind::blocks:
      return "block mask(B,H)";
    case Kind::blocks_1h:
      return "block mask(1,H)";
    case Kind::blocks_b1:
      return "block mask(B,1)";
    default:
      return "key_lengths";
  }
}

/// A boolean mask of density 0.5 whose rows i = 2 (mod 5) are hidden entirely, so that some
/// rows see no key whatever the interval mask leaves them.
inline Keep4 random_mask(int b, int h, int nq, int nk, std::mt19937_64& gen) {
  Keep4 m("mask", b, h, nq, nk);
  std::bernoulli_distribution coin(0.5);
  for (int x = 0; x < b; ++x)
    for (int y = 0; y < h; ++y)
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j)
          m(x, y, i, j) = i % 5 != 2 && coin(gen) ? 1 : 0;
  return m;
}

/// A boolean mask of blocks of 64 queries by 128 keys at global positions (the host forward's
/// largest tiles, 64 x 128 at head_dim <= 64; its 64 x 64 tiles and the backward's lie inside
/// them): by (block row + 2 block column + x + y) mod 3 for batch x and head y, a block
/// hides every key, shows every key, or is random of density 0.5, so that every query tile
/// meets tiles of the three kinds, differently per batch and head; a block cut by the end of
/// the sequence keeps its kind.
inline Keep4 block_mask(int b, int h, int nq, int nk, std::mt19937_64& gen) {
  Keep4 m("mask", b, h, nq, nk);
  std::bernoulli_distribution coin(0.5);
  for (int x = 0; x < b; ++x)
    for (int y = 0; y < h; ++y)
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j) {
          const int kind = (i / 64 + 2 * (j / 128) + x + y) % 3;
          m(x, y, i, j) = kind == 1 || (kind == 2 && coin(gen)) ? 1 : 0;
        }
  return m;
}

/// Terms of kind `kind` for shape s: the standard ALiBi slopes, or a bias uniform in (-2, 2),
/// rounded to T like the inputs.
template <class T>
kfa::reference::Terms make_terms(const Shape& s, Kind kind, std::mt19937_64& gen) {
  kfa::reference::Terms t;
  if (kind == Kind::keypad) {  // batch b: Nk, 1, 0, then a length in the middle, cyclically
    for (int b = 0; b < s.batch; ++b) {
      const int pick[] = {s.seqlen_k, 1, 0, (s.seqlen_k * 2) / 3};
      t.key_lengths.push_back(pick[(b + 3) % 4]);
    }
    return t;
  }
  if (kind == Kind::blocks || kind == Kind::blocks_1h || kind == Kind::blocks_b1) {
    t.mask = block_mask(kind == Kind::blocks_1h ? 1 : s.batch,
                        kind == Kind::blocks_b1 ? 1 : s.heads_q, s.seqlen_q, s.seqlen_k, gen);
    return t;
  }
  if (kind == Kind::dense || kind == Kind::dense_1h || kind == Kind::dense_11) {
    t.mask = random_mask(kind == Kind::dense ? s.batch : 1, kind == Kind::dense_11 ? 1 : s.heads_q,
                         s.seqlen_q, s.seqlen_k, gen);
    return t;
  }
  if (kind == Kind::alibi) {
    t.alibi = kfa::masks::alibi_slopes(s.heads_q);
    for (double& x : t.alibi)
      x = static_cast<double>(static_cast<term_t<T>>(x));
    return t;
  }
  const int b = kind == Kind::bias || kind == Kind::bias_b1 ? s.batch : 1;
  const int h = kind == Kind::bias || kind == Kind::bias_1h ? s.heads_q : 1;
  t.bias = Tensor4("bias", b, h, s.seqlen_q, s.seqlen_k);
  std::uniform_real_distribution<double> dist(-2, 2);
  for (std::size_t e = 0; e < t.bias.span(); ++e)
    t.bias.data()[e] = static_cast<double>(static_cast<term_t<T>>(dist(gen)));
  return t;
}

/// Calls f with the kfa/masks.hpp object of t on the suite's space (dbias: the backward's
/// output, or empty).
template <class T, class F>
void with_term(const kfa::reference::Terms& t, const View4<term_t<T>>& dbias, F&& f) {
  if (!t.alibi.empty()) {
    Kokkos::View<term_t<T>*, Device> slopes("slopes", t.alibi.size());
    auto h = Kokkos::create_mirror_view(slopes);
    for (std::size_t i = 0; i < t.alibi.size(); ++i)
      h(i) = static_cast<term_t<T>>(t.alibi[i]);
    Kokkos::deep_copy(slopes, h);
    f(kfa::masks::Alibi{slopes});
  } else if (t.mask.span() > 0) {
    View4<std::uint8_t> m("mask", t.mask.extent(0), t.mask.extent(1), t.mask.extent(2),
                          t.mask.extent(3));
    Kokkos::deep_copy(m, t.mask);
    f(kfa::masks::Dense{m});
  } else if (!t.key_lengths.empty()) {
    Kokkos::View<std::int32_t*, Device> len("key_lengths", t.key_lengths.size());
    auto h = Kokkos::create_mirror_view(len);
    for (std::size_t b = 0; b < t.key_lengths.size(); ++b)
      h(b) = t.key_lengths[b];
    Kokkos::deep_copy(len, h);
    f(kfa::masks::KeyPadding{len});
  } else {
    f(kfa::masks::Bias{to_device<term_t<T>>(t.bias), dbias});
  }
}

}  // namespace kfa_test
