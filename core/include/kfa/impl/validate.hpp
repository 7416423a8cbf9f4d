#pragma once
/// \file impl/validate.hpp
/// Host-side checks of a pass's arguments. Everything here runs before any kernel; each
/// failure throws kfa::Error naming the argument and the sizes involved.

#include <kfa/backends/portability.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

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

/// Whether View is a Kokkos::View of rank Rank: tells the two backward overloads apart.
template <class View, int Rank, class = void>
struct is_view_of_rank : std::false_type {};
template <class View, int Rank>
struct is_view_of_rank<View, Rank, std::enable_if_t<Kokkos::is_view<View>::value>>
    : std::bool_constant<static_cast<int>(View::rank) == Rank> {};

/// The rank-4 tensors a pass reads (q, k, v, and o, dout in the backward).
template <class... Views>
struct Inputs {};
/// The rank-4 tensors a pass writes (o; dq, dk, dv).
template <class... Views>
struct Outputs {};

/// Compile-time checks of a pass's tensors: ExecSpace is an execution space, every tensor a
/// rank-4 View accessible from it, all of one value type kfa takes (that of the first input,
/// q), the outputs non-const; lse (rank 3) float or wider, non-const when `lse_written`.
template <class ExecSpace, bool lse_written, class Lse, class Q, class... In, class... Out>
constexpr void static_check_pass(Inputs<Q, In...>, Outputs<Out...>) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa: the first argument must be a Kokkos execution space");
  static_check_tensors<ExecSpace, Q, In..., Out...>();
  using T = typename Q::non_const_value_type;
  static_assert((std::is_same_v<T, typename In::non_const_value_type> && ...),
                "kfa: q, k, v (and o and dout in the backward) must share one value type");
  static_assert((std::is_same_v<T, typename Out::value_type> && ...),
                "kfa: the outputs (o; dq, dk, dv) must be non-const and of the value type of q");
  static_assert(backends::is_value_type_v<T>,
                "kfa: value type must be float, double, kfa::bf16, kfa::half, or Kokkos half_t / "
                "bhalf_t where those are 16-bit types (backends::is_narrow_float)");
  static_assert(is_view_of_rank<Lse, 3>::value,
                "kfa: lse must be a rank-3 View (batch, heads_q, seqlen_q)");
  using L = typename Lse::non_const_value_type;
  static_assert(std::is_floating_point_v<L> && sizeof(L) >= sizeof(float),
                "kfa: lse must be float or wider");
  static_assert(!lse_written || std::is_same_v<L, typename Lse::value_type>,
                "kfa: lse is an output of the forward and must be non-const");
  static_check_accessible<ExecSpace, Lse>();
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

/// validate_params, then scale and softcap as the kernels hold them: in Acc, the accumulation
/// type of the pass's value type T (backends::accum_t). A value Acc cannot hold would turn the
/// result into NaN (scale 1e300 in float) or silently change the pass (softcap 1e-300 rounds to
/// 0 in float, which means "off"), so it is refused here, where the type is known.
template <class T>
void validate_params(const char* pass, const Params& p) {
  validate_params(pass, p);
  using Acc = backends::accum_t<T>;
  const char* acc = std::is_same_v<Acc, float> ? "float" : "double";
  if (p.scale > 0) {
    const Acc s = static_cast<Acc>(p.scale);
    if (!(std::isfinite(s) && s > Acc(0)))
      fail(pass, "scale = ", p.scale, " is outside what the accumulation type (", acc, ") holds");
  }
  if (p.softcap > 0) {
    const Acc cap = static_cast<Acc>(p.softcap), inv_cap = Acc(1) / cap;
    if (!(std::isfinite(cap) && cap > Acc(0) && std::isfinite(inv_cap)))
      fail(pass, "softcap = ", p.softcap, " is outside what the accumulation type (", acc,
           ") holds with its reciprocal");
  }
}

/// Shapes shared by forward and backward: q (B,Hq,Nq,D), k and v (B,Hk,Nk,D), o like q,
/// lse (B,Hq,Nq), named lse_name in messages (the row statistic of another rule: rsum).
template <class Q, class K, class V, class O, class Lse>
void validate_shapes(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse, const char* lse_name = "lse") {
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
    expect_extent(pass, lse_name, lse, dim, what[dim], q.extent(dim), "q");
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

/// The extents of a backward's tensors against q and k (forward's checks included), for
/// the pass named `pass`. dlse may be nullptr.
template <class Q, class K, class V, class O, class Lse, class DO, class DLse, class DQ, class DK,
          class DV>
void validate_backward(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                       const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
                       const DV& dv, const char* lse_name = "lse") {
  validate_shapes(pass, q, k, v, o, lse, lse_name);
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

}  // namespace kfa::impl
