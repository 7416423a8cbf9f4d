#pragma once
/// \file impl/validate.hpp
/// Host-side checks of a pass's arguments. Everything here runs before any kernel; each
/// failure throws kfa::Error naming the argument and the sizes involved.

#include <kfa/backends/portability.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
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
  if (p.dq_mode != DqMode::automatic && p.dq_mode != DqMode::atomic &&
      p.dq_mode != DqMode::query_pass && p.dq_mode != DqMode::symmetric)
    fail(pass, "dq_mode must be a DqMode value");
  if (p.deterministic && p.dq_mode == DqMode::atomic)
    fail(pass,
         "deterministic asks for a repeatable dQ, which dq_mode atomic is not (use "
         "query_pass, symmetric or automatic)");
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

/// A View's extents for the messages, "(2, 4, 10, 12)".
template <class View>
std::string shape_of(const View& v) {
  std::string s = "(";
  for (unsigned d = 0; d < View::rank; ++d)
    s += (d ? ", " : "") + std::to_string(v.extent(d));
  return s + ")";
}

/// The largest extent the kernels index with int: batch, heads, seqlen and head_dim each, and
/// batch * heads (one team index per (batch, head) pair).
inline constexpr long long max_extent = INT_MAX;

/// Checks that extent `dim` (named `what`) of view `name` fits the kernels' int indices,
/// printing its true value.
template <class View>
void expect_int_extent(const char* pass, const char* name, const View& v, int dim,
                       const char* what) {
  if (v.extent(dim) > static_cast<std::size_t>(max_extent))
    fail(pass, name, " has ", what, " = ", v.extent(dim), " (", name, ".extent(", dim,
         ")), more than the kernels' int indices hold (", max_extent, ")");
}

/// Checks that view `name` has the head dim (extent 3) of view `ref_name`, naming both shapes:
/// q and k share D, v, o, dout and dv share Dv, which may differ from D.
template <class View, class Ref>
void expect_head_dim(const char* pass, const char* name, const View& v, const char* ref_name,
                     const Ref& ref, const char* what) {
  if (v.extent(3) != ref.extent(3))
    fail(pass, name, " is ", shape_of(v), " but ", ref_name, " is ", shape_of(ref), ": ", name,
         "'s head_dim (", name, ".extent(3) = ", v.extent(3), ") must equal ", ref_name, "'s ",
         what, " = ", ref.extent(3));
}

/// Checks that a head dim (extent 3 of view `name`, named `what`: D or Dv) is in [1,
/// max_head_dim], read as size_t: a head_dim of 2^32 + 5 cut to int would pass as 5.
template <class View>
void expect_head_dim_range(const char* pass, const char* name, const View& v, const char* what) {
  const std::size_t d = v.extent(3);
  if (d < 1 || d > static_cast<std::size_t>(max_head_dim))
    fail(pass, "head_dim = ", d, " (", name, ".extent(3), ", what,
         ") is unsupported: must be in [1, ", max_head_dim, "]");
}

/// Shapes shared by forward and backward: q (B,Hq,Nq,D), k (B,Hk,Nk,D), v (B,Hk,Nk,Dv), o
/// (B,Hq,Nq,Dv), lse (B,Hq,Nq), named lse_name in messages (the row statistic of another rule:
/// rsum); D and Dv each in [1, max_head_dim]; every extent, and batch * heads, within int (the
/// kernels' index type).
template <class Q, class K, class V, class O, class Lse>
void validate_shapes(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse, const char* lse_name = "lse") {
  expect_head_dim_range(pass, "q", q, "D");
  static const char* what[] = {"batch", "heads", "seqlen", "head_dim"};
  for (int dim = 0; dim < 3; ++dim) {
    expect_int_extent(pass, "q", q, dim, what[dim]);
    expect_int_extent(pass, "k", k, dim, what[dim]);
  }
  if (static_cast<double>(q.extent(0)) * static_cast<double>(q.extent(1)) >
      static_cast<double>(max_extent))
    fail(pass, "batch * heads = ", q.extent(0), " * ", q.extent(1),
         " (q) is more than the kernels' int indices hold (", max_extent, ")");
  expect_extent(pass, "k", k, 0, what[0], q.extent(0), "q");
  expect_head_dim(pass, "k", k, "q", q, "D");
  expect_extent(pass, "v", v, 0, what[0], q.extent(0), "q");
  expect_extent(pass, "v", v, 1, "heads", k.extent(1), "k");
  expect_extent(pass, "v", v, 2, "seqlen", k.extent(2), "k");
  expect_head_dim_range(pass, "v", v, "Dv");
  if (k.extent(1) == 0 || q.extent(1) % k.extent(1) != 0)
    fail(pass, "heads of q (", q.extent(1), ") must be a positive multiple of heads of k and v (",
         k.extent(1), ")");
  for (int dim = 0; dim < 3; ++dim)
    expect_extent(pass, "o", o, dim, what[dim], q.extent(dim), "q");
  expect_head_dim(pass, "o", o, "v", v, "Dv");
  for (int dim = 0; dim < 3; ++dim)
    expect_extent(pass, lse_name, lse, dim, what[dim], q.extent(dim), "q");
  expect_unit_stride(pass, "q", q);
  expect_unit_stride(pass, "k", k);
  expect_unit_stride(pass, "v", v);
  expect_unit_stride(pass, "o", o);
}

/// The bytes a View may touch, as a kernel sees them: every element lies in [begin, end), and,
/// when period > 0, at (address - begin) mod period in [0, block). A contiguous View is one
/// block (period 0); a strided one, such as q sliced out of a packed (B, N, 3, H, D) QKV
/// buffer, is a contiguous block of its innermost dimensions repeated at multiples of the gcd
/// of the other strides.
struct Footprint {
  std::uintptr_t begin = 0, end = 0;
  std::size_t block = 0, period = 0;
};

template <class View>
Footprint footprint_of(const View& v) {
  Footprint f;
  const std::size_t elem = sizeof(typename View::value_type);
  // One past the last element, from the extents and strides: Kokkos' span() of a strided
  // subview may reach past its last element (to the end of the parent's rows).
  std::size_t last = 0;
  for (int r = 0; r < static_cast<int>(View::rank); ++r) {
    if (v.extent(r) == 0) return f;
    last += (v.extent(r) - 1) * static_cast<std::size_t>(v.stride(r));
  }
  f.begin = reinterpret_cast<std::uintptr_t>(v.data());
  f.end = f.begin + (last + 1) * elem;
  // Dimensions of extent > 1 by increasing stride: the innermost ones that tile each other
  // without gaps make the block; the gcd of the rest's strides is the period.
  std::size_t stride[8] = {}, extent[8] = {};
  int n = 0;
  for (int r = 0; r < static_cast<int>(View::rank); ++r)
    if (v.extent(r) > 1) {
      int at = n++;
      for (; at > 0 && stride[at - 1] > static_cast<std::size_t>(v.stride(r)); --at) {
        stride[at] = stride[at - 1];
        extent[at] = extent[at - 1];
      }
      stride[at] = static_cast<std::size_t>(v.stride(r));
      extent[at] = v.extent(r);
    }
  std::size_t block = elem, period = 0;
  int r = 0;
  for (; r < n && stride[r] * elem == block; ++r)
    block *= extent[r];
  for (; r < n; ++r)
    period = std::gcd(period, stride[r] * elem);
  if (period > 0 && block <= period) {
    f.block = block;
    f.period = period;
  }
  return f;
}

/// Whether the bytes [lo, hi) meet a block of the strided footprint f (period > 0).
inline bool meets(const Footprint& f, std::uintptr_t lo, std::uintptr_t hi) {
  lo = lo > f.begin ? lo : f.begin;
  hi = hi < f.end ? hi : f.end;
  if (lo >= hi) return false;
  const std::size_t into = (lo - f.begin) % f.period;
  return into < f.block || lo + (f.period - into) < hi;  // in a block, or one starts before hi
}

/// Whether two footprints share a byte (conservatively: true unless shown apart).
inline bool overlap(const Footprint& a, const Footprint& b) {
  if (a.begin == a.end || b.begin == b.end || a.end <= b.begin || b.end <= a.begin) return false;
  if (a.period == 0 && b.period == 0) return true;
  if (a.period == 0) return meets(b, a.begin, a.end);
  if (b.period == 0) return meets(a, b.begin, b.end);
  // Both lie in blocks repeating at multiples of p: apart when their blocks are apart mod p.
  const std::size_t p = std::gcd(a.period, b.period);
  if (a.block + b.block > p) return true;
  const std::size_t am = a.begin % p, bm = b.begin % p;
  const std::size_t ab = (bm + p - am) % p,
                    ba = (am + p - bm) % p;  // each block's start from the other's
  return ab < a.block || ba < b.block;
}

/// A View and its name, for the overlap checks.
struct Named {
  const char* name;
  Footprint f;
};
template <class View>
Named named(const char* name, const View& v) {
  return {name, footprint_of(v)};
}

/// Outputs must not share memory with the inputs or with each other: a kernel that writes o
/// while other teams still read k (o = k) or reads q after writing dq (dq = q) would silently
/// compute something else. o = q is refused too: whether a team reads its q rows after another
/// team's writes depends on the backend and the split, so no backend promises it.
template <std::size_t NOut, std::size_t NIn>
void expect_disjoint(const char* pass, const Named (&out)[NOut], const Named (&in)[NIn]) {
  for (std::size_t i = 0; i < NOut; ++i) {
    for (std::size_t j = 0; j < NIn; ++j)
      if (overlap(out[i].f, in[j].f))
        fail(pass, "output ", out[i].name, " overlaps input ", in[j].name,
             " in memory; outputs must not share memory with inputs");
    for (std::size_t j = 0; j < i; ++j)
      if (overlap(out[i].f, out[j].f))
        fail(pass, "outputs ", out[j].name, " and ", out[i].name,
             " overlap in memory; each output needs memory of its own");
  }
}

/// The forward's checks: validate_shapes, then o and lse (named lse_name) apart from q, k, v
/// and each other.
template <class Q, class K, class V, class O, class Lse>
void validate_forward(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const char* lse_name = "lse") {
  validate_shapes(pass, q, k, v, o, lse, lse_name);
  expect_disjoint(pass, {named("o", o), named(lse_name, lse)},
                  {named("q", q), named("k", k), named("v", v)});
}

/// The extents of a backward's tensors against q and k (forward's checks included), for
/// the pass named `pass`. dlse may be nullptr.
template <class Q, class K, class V, class O, class Lse, class DO, class DLse, class DQ, class DK,
          class DV>
void validate_backward(const char* pass, const Q& q, const K& k, const V& v, const O& o,
                       const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
                       const DV& dv, const char* lse_name = "lse") {
  validate_shapes(pass, q, k, v, o, lse, lse_name);
  for (int dim = 0; dim < 3; ++dim) {
    static const char* what[] = {"batch", "heads", "seqlen"};
    expect_extent(pass, "dout", dout, dim, what[dim], q.extent(dim), "q");
    expect_extent(pass, "dq", dq, dim, what[dim], q.extent(dim), "q");
    expect_extent(pass, "dk", dk, dim, what[dim], k.extent(dim), "k");
    expect_extent(pass, "dv", dv, dim, what[dim], k.extent(dim), "k");
  }
  expect_head_dim(pass, "dout", dout, "o", o, "Dv");
  expect_head_dim(pass, "dq", dq, "q", q, "D");
  expect_head_dim(pass, "dk", dk, "k", k, "D");
  expect_head_dim(pass, "dv", dv, "v", v, "Dv");
  if (dlse)
    for (int dim = 0; dim < 3; ++dim) {
      static const char* what[] = {"batch", "heads", "seqlen"};
      expect_extent(pass, "dlse", *dlse, dim, what[dim], q.extent(dim), "q");
    }
  expect_unit_stride(pass, "dout", dout);
  expect_unit_stride(pass, "dq", dq);
  expect_unit_stride(pass, "dk", dk);
  expect_unit_stride(pass, "dv", dv);
  const Named none{"dlse", {}};
  expect_disjoint(pass, {named("dq", dq), named("dk", dk), named("dv", dv)},
                  {named("q", q), named("k", k), named("v", v), named("o", o), named("lse", lse),
                   named("dout", dout), dlse ? named("dlse", *dlse) : none});
}

}  // namespace kfa::impl
