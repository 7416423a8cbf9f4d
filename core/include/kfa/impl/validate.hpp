#pragma once
/// \file impl/validate.hpp
/// Host-side checks of a pass's arguments. Everything here runs before any kernel; each
/// failure throws kfa::Error naming the argument and the sizes involved.

#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <sstream>
#include <string>

namespace kfa::impl {

/// Largest head_dim any backend's tiles are sized for.
inline constexpr int max_head_dim = 256;

template <class... Args>
[[noreturn]] void fail(const char* pass, Args&&... args) {
  std::ostringstream os;
  os << pass << ": ";
  (os << ... << args);
  throw Error(os.str());
}

/// Checks that view `name` has extent `want` along `dim` (named `what`).
template <class View>
void expect_extent(const char* pass, const char* name, const View& v, int dim, const char* what,
                   std::size_t want, const char* ref_name) {
  if (v.extent(dim) != want)
    fail(pass, name, " has ", what, " = ", v.extent(dim), " (", name, ".extent(", dim, ")) but ",
         ref_name, " has ", what, " = ", want);
}

/// head_dim must be contiguous: the tile loads read rows of head_dim with unit stride.
template <class View>
void expect_unit_stride(const char* pass, const char* name, const View& v) {
  if (v.extent(3) > 1 && v.stride(3) != 1)
    fail(pass, name, " must have unit stride in head_dim (dimension 3), got stride ", v.stride(3),
         "; use LayoutRight or a LayoutStride view with stride(3) == 1");
}

template <class View>
constexpr void static_check_tensor() {
  static_assert(Kokkos::is_view<View>::value, "kfa: tensors must be Kokkos::View");
  static_assert(View::rank == 4, "kfa: q, k, v, o must be rank-4 (batch, heads, seqlen, head_dim)");
}

template <class ExecSpace, class View>
constexpr void static_check_accessible() {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "kfa: every View must be accessible from the execution space passed to kfa");
}

/// Compile-time checks every pass makes of its rank-4 tensors: Views of rank 4, accessible
/// from the execution space.
template <class ExecSpace, class... Views>
constexpr void static_check_tensors() {
  (static_check_tensor<Views>(), ...);
  (static_check_accessible<ExecSpace, Views>(), ...);
}

inline void validate_params(const char* pass, const Params& p) {
  if (!std::isfinite(p.scale)) fail(pass, "scale must be finite, got ", p.scale);
  if (!(p.softcap >= 0) || !std::isfinite(p.softcap))
    fail(pass, "softcap must be finite and >= 0 (0 = off), got ", p.softcap);
  if (p.window_left < -1)
    fail(pass, "window_left must be >= -1 (-1 = unbounded), got ", p.window_left);
  if (p.window_right < -1)
    fail(pass, "window_right must be >= -1 (-1 = unbounded), got ", p.window_right);
  if (!(p.dropout >= 0 && p.dropout < 1)) fail(pass, "dropout must be in [0, 1), got ", p.dropout);
  if (p.num_splits < 0)
    fail(pass, "num_splits must be >= 0 (0 = automatic, 1 = no split), got ", p.num_splits);
  if (p.align != Align::bottom_right && p.align != Align::top_left)
    fail(pass, "align must be Align::bottom_right or Align::top_left");
}

/// Shapes shared by forward and backward: q (B,Hq,Nq,D), k and v (B,Hk,Nk,D), o like q,
/// lse (B,Hq,Nq).
template <class Q, class K, class V, class O, class Lse>
void validate_shapes(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse) {
  const int d = static_cast<int>(q.extent(3));
  if (d < 1 || d > max_head_dim)
    fail(pass, "head_dim = ", d, " (q.extent(3)) is unsupported: must be in [1, ", max_head_dim,
         "]");
  for (int dim : {0, 3}) {
    const char* what = dim == 0 ? "batch" : "head_dim";
    expect_extent(pass, "k", k, dim, what, q.extent(dim), "q");
    expect_extent(pass, "v", v, dim, what, q.extent(dim), "q");
  }
  expect_extent(pass, "v", v, 1, "heads", k.extent(1), "k");
  expect_extent(pass, "v", v, 2, "seqlen", k.extent(2), "k");
  if (k.extent(1) == 0 || q.extent(1) % k.extent(1) != 0)
    fail(pass, "heads of q (", q.extent(1), ") must be a positive multiple of heads of k and v (",
         k.extent(1), ")");
  for (int dim = 0; dim < 4; ++dim) {
    static const char* what[] = {"batch", "heads", "seqlen", "head_dim"};
    expect_extent(pass, "o", o, dim, what[dim], q.extent(dim), "q");
  }
  for (int dim = 0; dim < 3; ++dim) {
    static const char* what[] = {"batch", "heads", "seqlen"};
    expect_extent(pass, "lse", lse, dim, what[dim], q.extent(dim), "q");
  }
  expect_unit_stride(pass, "q", q);
  expect_unit_stride(pass, "k", k);
  expect_unit_stride(pass, "v", v);
  expect_unit_stride(pass, "o", o);
  constexpr long long int_max = 2147483647;
  if (static_cast<long long>(q.extent(2)) > int_max ||
      static_cast<long long>(k.extent(2)) > int_max)
    fail(pass, "seqlen must fit in int, got seqlen_q = ", q.extent(2),
         ", seqlen_k = ", k.extent(2));
}

}  // namespace kfa::impl
