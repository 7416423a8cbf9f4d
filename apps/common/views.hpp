#pragma once
// Datasets (row-major doubles) to and from Kokkos Views, for the kfa programs, and the C++
// value type of each dataset type.

#include <kfa/float16.hpp>
#include <kfa/reference.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "h5io.hpp"

namespace kfa_apps {

/// f(T{}) for the value type T of tensors of type t: float, double, kfa::bf16 or kfa::half.
template <class F>
decltype(auto) with_value_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(kfa::bf16{});
    case DType::f16:
      return f(kfa::half{});
    case DType::u8:
      break;
  }
  throw std::logic_error("with_value_type: uint8 is not a tensor type");
}

/// x rounded to the value type of tensors of type t (x itself for float64).
inline double rounded(DType t, double x) {
  return with_value_type(t, [x](auto v) { return static_cast<double>(decltype(v)(x)); });
}

/// A dataset of type t and shape dims drawn uniformly from [centre - amp, centre + amp] by gen,
/// each value rounded to t (the --random inputs of kfa layernorm and kfa mha).
inline Dataset random_dataset(std::vector<hsize_t> dims, DType t, std::mt19937_64& gen,
                              double centre, double amp) {
  Dataset d;
  d.dims = std::move(dims);
  d.dtype = t;
  d.data.resize(d.size());
  std::uniform_real_distribution<double> dist(centre - amp, centre + amp);
  for (auto& v : d.data)
    v = rounded(t, dist(gen));
  return d;
}

/// A dataset of rank >= 2 as the reference's host rows: (product of the leading extents, last
/// extent); empty for an empty dataset.
inline kfa::reference::Tensor2 reference_rows(const Dataset& d) {
  if (d.dims.empty()) return {};
  const std::size_t cols = d.dims.back();
  kfa::reference::Tensor2 t("kfa::ref", cols == 0 ? 0 : d.data.size() / cols, cols);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

/// A rank-1 dataset as the reference's host vector; empty for an empty dataset.
inline kfa::reference::Tensor1 reference_vector(const Dataset& d) {
  if (d.dims.empty()) return {};
  kfa::reference::Tensor1 t("kfa::ref", d.dims[0]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

/// The decay mask of --multiscale --random, (H, Nq, Nk): M[h,i,j] = gamma_h^|i-j| with gamma_h
/// spread evenly over (0.5, 0.999) by head (retention's per-head decay rates), rounded to t.
inline Dataset decay_mask(hsize_t H, hsize_t Nq, hsize_t Nk, DType t) {
  Dataset d;
  d.dims = {H, Nq, Nk};
  d.dtype = t;
  d.data.resize(d.size());
  for (hsize_t h = 0; h < H; ++h) {
    const double gamma = 0.5 + 0.499 * double(h + 1) / double(H + 1);
    for (hsize_t i = 0; i < Nq; ++i)
      for (hsize_t j = 0; j < Nk; ++j)
        d.data[(h * Nq + i) * Nk + j] =
            rounded(t, std::pow(gamma, std::fabs(double(i) - double(j))));
  }
  return d;
}

/// A new View of the dataset's shape (rank 4 for tensors, 3 for LSE and its gradient, 2 for
/// layer norm's rows, 1 for its vectors and for ALiBi slopes) holding its values converted to
/// the View's type.
template <class View>
View dataset_to_view(const Dataset& d, const char* label) {
  const auto alloc = Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label));
  View v;
  if constexpr (View::rank == 4)
    v = View(alloc, d.dims[0], d.dims[1], d.dims[2], d.dims[3]);
  else if constexpr (View::rank == 3)
    v = View(alloc, d.dims[0], d.dims[1], d.dims[2]);
  else if constexpr (View::rank == 2)
    v = View(alloc, d.dims[0], d.dims[1]);
  else
    v = View(alloc, d.dims[0]);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t e = 0; e < d.data.size(); ++e)
    h.data()[e] = static_cast<typename View::value_type>(d.data[e]);
  Kokkos::deep_copy(v, h);
  return v;
}

/// The View's values as a dataset of type t (to be written in that type).
template <class View>
Dataset view_to_dataset(const View& v, DType t) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  Dataset d;
  d.dtype = t;
  for (unsigned r = 0; r < View::rank; ++r)
    d.dims.push_back(v.extent(r));
  d.data.resize(h.span());
  for (std::size_t e = 0; e < d.data.size(); ++e)
    d.data[e] = static_cast<double>(h.data()[e]);
  return d;
}

}  // namespace kfa_apps
