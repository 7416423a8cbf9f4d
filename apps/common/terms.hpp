#pragma once
// The score terms of kfa/masks.hpp as the programs read them (kfa and kfa-seqpar alike):
// /alibi_slopes (heads_q) or --alibi, /bias (batch or 1, heads_q or 1, seqlen_q, seqlen_k),
// /mask (uint8, same extents) and /key_lengths (batch), one per pass; their checks against the
// problem, the library's term object on the device and the reference's Terms.

#include <kfa/masks.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5io.hpp"
#include "views.hpp"

namespace kfa_apps {

/// A pass's score terms, each whole (empty dims: not given): at most one is given.
struct Terms {
  Dataset slopes, bias;    // ALiBi slopes (heads_q) or a bias, float
  Dataset dense, lengths;  // or a boolean mask (uint8 in bytes) or key lengths (batch)
};

/// The terms' shapes against the (global) dims of /q and /k, and the key lengths' range; one
/// term per pass.
inline void check_term_shapes(const Terms& p, const std::vector<hsize_t>& q,
                              const std::vector<hsize_t>& k) {
  std::vector<std::string> given;
  for (const auto& [d, ds] : {std::pair{&p.slopes, "ALiBi slopes"},
                              {&p.bias, "/bias"},
                              {&p.dense, "/mask"},
                              {&p.lengths, "/key_lengths"}})
    if (!d->dims.empty()) given.emplace_back(ds);
  if (given.size() > 1)
    throw InputError(given[0] + " and " + given[1] +
                     " were both given; a pass takes one score term (kfa::masks has no "
                     "combination of terms yet" +
                     (p.dense.dims.empty() && p.lengths.dims.empty()
                          ? std::string("; add the ALiBi term to /bias instead)")
                          : std::string(")")));
  if (!p.slopes.dims.empty() && p.slopes.dims[0] != q[1])
    throw InputError("dataset /alibi_slopes has shape " + shape_of(p.slopes.dims) +
                     " but /q has shape " + shape_of(q) + ": one slope per query head");
  for (const auto& [d, ds] : {std::pair{&p.bias.dims, "/bias"}, {&p.dense.dims, "/mask"}}) {
    const auto& b = *d;
    if (!b.empty() && ((b[0] != q[0] && b[0] != 1) || (b[1] != q[1] && b[1] != 1) || b[2] != q[2] ||
                       b[3] != k[2]))
      throw InputError(std::string("dataset ") + ds + " has shape " + shape_of(b) +
                       " but /q has shape " + shape_of(q) + " and /k " + shape_of(k) +
                       ": it must be (batch or 1, heads or 1, seqlen of /q, seqlen of /k)");
  }
  if (!p.lengths.dims.empty()) {
    if (p.lengths.dims[0] != q[0])
      throw InputError("dataset /key_lengths has shape " + shape_of(p.lengths.dims) +
                       " but /q has shape " + shape_of(q) + ": one length per batch");
    for (std::size_t b = 0; b < p.lengths.data.size(); ++b) {
      const double n = p.lengths.data[b];
      if (!(n >= 0 && n <= double(k[2])))
        throw InputError("dataset /key_lengths holds " + std::to_string(static_cast<long long>(n)) +
                         " at (" + std::to_string(b) +
                         "), outside [0, seqlen of /k = " + std::to_string(k[2]) + "]");
    }
  }
}

/// The standard ALiBi slopes of --alibi for `heads` query heads, as a dataset.
inline Dataset standard_slopes(hsize_t heads) {
  Dataset d;
  d.dims = {heads};
  d.dtype = DType::f64;
  const auto s = kfa::masks::alibi_slopes(static_cast<int>(heads));
  d.data.assign(s.begin(), s.end());
  return d;
}

/// Calls pass(term) with the score term (kfa/masks.hpp) on the device, its floating-point
/// values in Acc (the accumulation type of the pass), or pass() when there is none; dbias: the
/// backward's gradient of a bias (empty in the forward).
template <class Acc, class Mem = Kokkos::DefaultExecutionSpace::memory_space, class Pass>
void with_term(const Terms& p, const Kokkos::View<Acc****, Kokkos::LayoutRight, Mem>& dbias,
               const Pass& pass) {
  if (!p.slopes.dims.empty()) {
    using Slopes = Kokkos::View<Acc*, Kokkos::LayoutRight, Mem>;
    pass(kfa::masks::Alibi{dataset_to_view<Slopes>(p.slopes, "kfa::alibi_slopes")});
  } else if (!p.bias.dims.empty()) {
    using Bias = Kokkos::View<Acc****, Kokkos::LayoutRight, Mem>;
    pass(kfa::masks::Bias{dataset_to_view<Bias>(p.bias, "kfa::bias"), dbias});
  } else if (!p.dense.dims.empty()) {
    const auto& m = p.dense.dims;
    Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, Kokkos::HostSpace,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>
        host(const_cast<std::uint8_t*>(p.dense.bytes.data()), m[0], m[1], m[2], m[3]);
    pass(kfa::masks::Dense{Kokkos::create_mirror_view_and_copy(Mem(), host)});
  } else if (!p.lengths.dims.empty()) {
    Kokkos::View<std::int32_t*, Mem> len("kfa::key_lengths", p.lengths.dims[0]);
    auto h = Kokkos::create_mirror_view(len);
    for (std::size_t b = 0; b < p.lengths.data.size(); ++b)
      h(b) = static_cast<std::int32_t>(p.lengths.data[b]);
    Kokkos::deep_copy(len, h);
    pass(kfa::masks::KeyPadding{len});
  } else {
    pass();
  }
}

/// The score terms for the reference.
inline kfa::reference::Terms reference_terms(const Terms& p) {
  kfa::reference::Terms t;
  t.alibi = p.slopes.data;
  if (!p.bias.dims.empty()) {
    const auto& b = p.bias.dims;
    t.bias = kfa::reference::Tensor4("kfa::ref::bias", b[0], b[1], b[2], b[3]);
    std::copy(p.bias.data.begin(), p.bias.data.end(), t.bias.data());
  }
  if (!p.dense.dims.empty()) {
    const auto& m = p.dense.dims;
    t.mask = kfa::reference::Keep4("kfa::ref::mask", m[0], m[1], m[2], m[3]);
    std::copy(p.dense.bytes.begin(), p.dense.bytes.end(), t.mask.data());
  }
  for (double n : p.lengths.data)
    t.key_lengths.push_back(static_cast<int>(n));
  return t;
}

}  // namespace kfa_apps
