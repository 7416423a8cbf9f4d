#pragma once
/// \file layer_norm.hpp
/// kfa::layer_norm: y = (z - mean) / sqrt(var + eps) * gamma + beta per row of D elements, with
/// z = x + residual (residual optional), forward and backward, on any Kokkos backend.
///
/// Forward: one team per row. The row's moments come from one pass over z, in blocks of
/// ln_block elements (the moments of a block directly, from registers), merged by Chan's
/// formula across the blocks of a thread and by kfa::MomentsReducer across the team's
/// threads (welford.hpp), because the one-pass alternative E[z^2] - E[z]^2 cancels
/// catastrophically in float when |mean| >> std. The elements are taken less a shift, the
/// mean of the row's first block: Welford on z itself rounds its running mean to the ulp of
/// |mean| (with D = 2, mean 1e3 and a spread of 0.01 in float, that is 1 % of the variance),
/// while z - shift is of the size of the spread and its mean near 0. Then
/// var = M2 / n_var with n_var = D (the population variance, PyTorch's LayerNorm, the default)
/// or D - 1 (LayerNormParams::unbiased), rstd = 1 / sqrt(var + eps), and the row is written.
/// mean and rstd are saved for the backward.
///
/// Backward, with xhat = (z - mean) rstd and g = dy o gamma:
///   dz = rstd (g - sum(g) / D - (xhat - sum(xhat) / D) sum(g o (xhat - sum(xhat) / D)) / n_var)
/// (the mean's path gives the 1 / D, the variance's the 1 / n_var), one team per row again;
/// dz is dL/dx and, when a residual was added, dL/dresidual as well. sum(xhat) is 0 in exact
/// arithmetic; it is kept because the saved mean is rounded (to the ulp of |mean|, 6e-5 at 1e3
/// in float), which offsets every xhat of the row by the same constant, and the centring
/// removes that offset: without it a row whose spread is small against its mean (D = 2, mean
/// 1e3, spread 0.01 in float) gets dz wrong by percents. (The chain rule through the variance
/// and the mean, as the reference takes it, has the same term.) The column sums
/// dgamma = sum_rows dy o xhat and dbeta = sum_rows dy are a second kernel in which each column
/// is summed over the rows in row order by one thread, without atomics: the result is bitwise
/// repeatable and the same for any team size or backend. dgamma takes xhat centred per row as
/// dz does.
///
/// Value types: float, double or a 16-bit kfa type (computed in float, rounded once on store);
/// mean and rstd float or wider. Shapes: x, residual, y, dy, dz (rows, D) or (B, L, D) (rows
/// = B L), any layout; gamma, beta, dgamma, dbeta (D); mean, rstd (rows).

#include <kfa/backends/portability.hpp>
#include <kfa/combiners.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>
#include <kfa/welford.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

namespace kfa {

/// Options of kfa::layer_norm and kfa::layer_norm_backward.
struct LayerNormParams {
  double eps = 1e-5;      ///< added to the variance before the square root; finite, >= 0
  bool unbiased = false;  ///< divide M2 by D - 1 (the sample variance) instead of D (PyTorch)
};

}  // namespace kfa

namespace kfa::impl {

/// Element (r, j) of a (rows, D) or (B, L, D) view, with row r = b L + l for the latter.
template <class V>
KOKKOS_INLINE_FUNCTION typename V::reference_type row_elem(const V& v, int r, int j) {
  if constexpr (V::rank == 2) {
    return v(r, j);
  } else {
    const int L = static_cast<int>(v.extent(1));
    return v(r / L, r % L, j);
  }
}

/// Compile-time checks of the row tensors (x, residual, y; dy, dz in the backward), the
/// parameter vectors and the row statistics.
template <class ExecSpace, class X, class Vec, class Stat, class... Rows>
constexpr void static_check_layer_norm() {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::layer_norm: the first argument must be a Kokkos execution space");
  static_assert(is_view_of_rank<X, 2>::value || is_view_of_rank<X, 3>::value,
                "kfa::layer_norm: x must be a rank-2 (rows, D) or rank-3 (B, L, D) View");
  static_assert((is_view_of_rank<Rows, X::rank>::value && ...),
                "kfa::layer_norm: residual, y, dy and dz must be Views of the rank of x");
  using T = typename X::non_const_value_type;
  static_assert(backends::is_value_type_v<T>,
                "kfa::layer_norm: value type must be float, double or a 16-bit float type");
  static_assert((std::is_same_v<T, typename Rows::non_const_value_type> && ...),
                "kfa::layer_norm: x, residual, y, dy and dz must share one value type");
  static_assert(
      is_view_of_rank<Vec, 1>::value && std::is_same_v<T, typename Vec::non_const_value_type>,
      "kfa::layer_norm: gamma, beta, dgamma and dbeta must be rank-1 Views (D) of the "
      "value type of x");
  using S = typename Stat::non_const_value_type;
  static_assert(
      is_view_of_rank<Stat, 1>::value && std::is_floating_point_v<S> && sizeof(S) >= sizeof(float),
      "kfa::layer_norm: mean and rstd must be rank-1 Views (rows) of float or wider");
  static_check_accessible<ExecSpace, X>();
  static_check_accessible<ExecSpace, Vec>();
  static_check_accessible<ExecSpace, Stat>();
  (static_check_accessible<ExecSpace, Rows>(), ...);
}

/// Output views must be writable.
template <class... Out>
constexpr void static_check_outputs() {
  static_assert(((!std::is_const_v<typename Out::value_type>)&&...),
                "kfa::layer_norm: outputs (y, mean, rstd; dz, dgamma, dbeta) must be non-const");
}

/// Rows and D of x.
struct RowShape {
  std::size_t rows = 0, D = 0;
};

/// Rows and D of x, checked against the kernels' int indices.
template <class X>
RowShape row_shape(const char* pass, const X& x) {
  RowShape s;
  s.D = x.extent(X::rank - 1);
  s.rows = X::rank == 2 ? x.extent(0) : x.extent(0) * x.extent(1);
  if (s.D == 0) fail(pass, "x has shape ", shape_of(x), ": D (its last extent) must be >= 1");
  if (s.D > static_cast<std::size_t>(max_extent) || s.rows > static_cast<std::size_t>(max_extent))
    fail(pass, "x has shape ", shape_of(x), ": rows and D must each be at most ", max_extent);
  return s;
}

/// A row tensor (y, dy, dz, a residual) must have the shape of x.
template <class X, class V>
void expect_like_x(const char* pass, const char* name, const V& v, const X& x) {
  bool same = true;
  for (int d = 0; d < static_cast<int>(X::rank); ++d)
    same = same && v.extent(d) == x.extent(d);
  if (!same) fail(pass, name, " has shape ", shape_of(v), " but x has shape ", shape_of(x));
}

/// A vector (gamma, beta, dgamma, dbeta, mean, rstd) must have `want` elements.
template <class V, class X>
void expect_vector(const char* pass, const char* name, const V& v, std::size_t want,
                   const char* what, const X& x) {
  if (v.extent(0) != want)
    fail(pass, name, " has shape ", shape_of(v), " but must be (", want, ") = (", what,
         ") from x of shape ", shape_of(x));
}

/// eps and unbiased against D, in the accumulation type Acc.
template <class Acc, class X>
void validate_layer_norm_params(const char* pass, const LayerNormParams& p, std::size_t D,
                                const X& x) {
  if (!(p.eps >= 0) || !std::isfinite(p.eps))
    fail(pass, "eps must be finite and >= 0, got ", p.eps);
  if (p.eps > 0 && !(static_cast<Acc>(p.eps) > Acc(0)))
    fail(pass, "eps = ", p.eps, " rounds to 0 in the accumulation type");
  if (p.unbiased && D < 2)
    fail(pass, "unbiased variance divides by D - 1 and needs D >= 2; x has shape ", shape_of(x));
}

/// The backward's three sums of a row at once, sum(g), sum(g xhat) and sum(xhat), as a
/// combiner (kfa/combiners.hpp).
template <class T>
struct RowSums {
  /// (sum g, sum g xhat, sum xhat).
  struct state_type {
    T g = T(0), gx = T(0), x = T(0);
  };
  KOKKOS_INLINE_FUNCTION static state_type identity() { return {}; }
  KOKKOS_INLINE_FUNCTION static void join(state_type& a, const state_type& b) {
    a.g += b.g;
    a.gx += b.gx;
    a.x += b.x;
  }
};

/// Elements of a row whose moments the forward takes directly (sum, then squared deviations,
/// in registers) before merging them with Chan's formula: a float Welford that pushes every
/// element rounds its running mean D times, and at D = 4096 that alone (about sqrt(D) / 2
/// ulps) exceeds the float tolerance on the mean; blocks of 32 round it D / 32 times.
inline constexpr int ln_block = 32;

/// Columns each iteration of the column-sum kernel sums: on a host a block, so that each row's
/// columns are read contiguously; on a device one, so that there are D threads.
template <class ExecSpace>
constexpr int column_block() {
  return Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ? 16 : 1;
}

template <class ExecSpace, class X, class Res, class G, class Bt, class Y, class M, class R>
void layer_norm(const ExecSpace& space, const X& x, const Res& residual, const G& gamma,
                const Bt& beta, const Y& y, const M& mean, const R& rstd,
                const LayerNormParams& p) {
  static_check_layer_norm<ExecSpace, X, G, M, Res, Y>();
  static_check_layer_norm<ExecSpace, X, Bt, R>();
  static_check_outputs<Y, M, R>();
  using T = typename X::non_const_value_type;
  using Acc = backends::accum_t<T>;
  const char* pass = "layer_norm";
  ScopedRegion region("kfa::layer_norm");
  const RowShape s = row_shape(pass, x);
  const bool has_res = residual.size() > 0;
  if (has_res) expect_like_x(pass, "residual", residual, x);
  expect_like_x(pass, "y", y, x);
  expect_vector(pass, "gamma", gamma, s.D, "D", x);
  expect_vector(pass, "beta", beta, s.D, "D", x);
  expect_vector(pass, "mean", mean, s.rows, "rows", x);
  expect_vector(pass, "rstd", rstd, s.rows, "rows", x);
  validate_layer_norm_params<Acc>(pass, p, s.D, x);
  if (s.rows == 0) return;
  const int D = static_cast<int>(s.D);
  const Acc eps = static_cast<Acc>(p.eps), n_var = static_cast<Acc>(p.unbiased ? D - 1 : D);
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  Kokkos::parallel_for(
      "kfa::layer_norm", Policy(space, static_cast<int>(s.rows), Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int r = team.league_rank();
        const auto z = [&](int j) {
          Acc v = static_cast<Acc>(row_elem(x, r, j));
          if (has_res) v += static_cast<Acc>(row_elem(residual, r, j));
          return v;
        };
        // Moments of z - shift, shift the mean of the first block: numbers of the size of the
        // row's spread whatever its mean, with a mean near 0 (so rounded on a fine grid).
        const int w0 = D < ln_block ? D : ln_block;
        Acc shift = 0;
        for (int j = 0; j < w0; ++j)
          shift += z(j);
        shift /= static_cast<Acc>(w0);
        Moments<Acc> mom;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, (D + ln_block - 1) / ln_block),
            [&](int b, Moments<Acc>& a) {
              const int j0 = b * ln_block, n = D - j0 < ln_block ? D - j0 : ln_block;
              Acc sum = 0, m2 = 0;
              for (int k = 0; k < n; ++k)
                sum += z(j0 + k) - shift;
              const Acc m = sum / static_cast<Acc>(n);
              for (int k = 0; k < n; ++k) {
                const Acc d = (z(j0 + k) - shift) - m;
                m2 += d * d;
              }
              a = combine(a, Moments<Acc>{static_cast<Acc>(n), m, m2});
            },
            MomentsReducer<Acc>(mom));
        const Acc mu = shift + mom.mean, rs = Acc(1) / backends::sqrt(mom.m2 / n_var + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, D), [&](int j) {
          row_elem(y, r, j) =
              static_cast<T>(((z(j) - shift) - mom.mean) * rs * static_cast<Acc>(gamma(j)) +
                             static_cast<Acc>(beta(j)));
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean(r) = mu;
          rstd(r) = rs;
        });
      });
}

template <class ExecSpace, class X, class Res, class G, class M, class R, class DY, class DZ,
          class DG, class DB>
void layer_norm_backward(const ExecSpace& space, const X& x, const Res& residual, const G& gamma,
                         const M& mean, const R& rstd, const DY& dy, const DZ& dz, const DG& dgamma,
                         const DB& dbeta, const LayerNormParams& p) {
  static_check_layer_norm<ExecSpace, X, G, M, Res, DY, DZ>();
  static_check_layer_norm<ExecSpace, X, DG, R>();
  static_check_layer_norm<ExecSpace, X, DB, R>();
  static_check_outputs<DZ, DG, DB>();
  using T = typename X::non_const_value_type;
  using Acc = backends::accum_t<T>;
  const char* pass = "layer_norm_backward";
  ScopedRegion region("kfa::layer_norm_backward");
  const RowShape s = row_shape(pass, x);
  const bool has_res = residual.size() > 0;
  if (has_res) expect_like_x(pass, "residual", residual, x);
  expect_like_x(pass, "dy", dy, x);
  expect_like_x(pass, "dz", dz, x);
  expect_vector(pass, "gamma", gamma, s.D, "D", x);
  expect_vector(pass, "dgamma", dgamma, s.D, "D", x);
  expect_vector(pass, "dbeta", dbeta, s.D, "D", x);
  expect_vector(pass, "mean", mean, s.rows, "rows", x);
  expect_vector(pass, "rstd", rstd, s.rows, "rows", x);
  validate_layer_norm_params<Acc>(pass, p, s.D, x);
  const int D = static_cast<int>(s.D), rows = static_cast<int>(s.rows);
  const Acc inv_d = Acc(1) / static_cast<Acc>(D),
            inv_n_var = Acc(1) / static_cast<Acc>(p.unbiased ? D - 1 : D);
  const auto z = KOKKOS_LAMBDA(int r, int j) {
    Acc v = static_cast<Acc>(row_elem(x, r, j));
    if (has_res) v += static_cast<Acc>(row_elem(residual, r, j));
    return v;
  };
  // Each row's mean of xhat (0 but for the saved mean's rounding), for the column sums too.
  Kokkos::View<Acc*, typename ExecSpace::memory_space> offset(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                         std::string("kfa::layer_norm_backward::xhat_offset")),
      s.rows);
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  if (rows > 0)
    Kokkos::parallel_for(
        "kfa::layer_norm_backward::dz", Policy(space, rows, Kokkos::AUTO),
        KOKKOS_LAMBDA(const typename Policy::member_type& team) {
          const int r = team.league_rank();
          const Acc mu = static_cast<Acc>(mean(r)), rs = static_cast<Acc>(rstd(r));
          using Sums = RowSums<Acc>;
          typename Sums::state_type sum;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, D),
              [&](int j, typename Sums::state_type& a) {
                const Acc g = static_cast<Acc>(row_elem(dy, r, j)) * static_cast<Acc>(gamma(j));
                const Acc xhat = (z(r, j) - mu) * rs;
                a.g += g;
                a.gx += g * xhat;
                a.x += xhat;
              },
              Reducer<Sums>(sum));
          // sum(g (xhat - mean_x)) = sum(g xhat) - mean_x sum(g)
          const Acc mean_g = sum.g * inv_d, mean_x = sum.x * inv_d,
                    c = (sum.gx - mean_x * sum.g) * inv_n_var;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, D), [&](int j) {
            const Acc g = static_cast<Acc>(row_elem(dy, r, j)) * static_cast<Acc>(gamma(j));
            const Acc xhat = (z(r, j) - mu) * rs;
            row_elem(dz, r, j) = static_cast<T>(rs * (g - mean_g - (xhat - mean_x) * c));
          });
          Kokkos::single(Kokkos::PerTeam(team), [&]() { offset(r) = mean_x; });
        });
  constexpr int W = column_block<ExecSpace>();
  Kokkos::parallel_for(
      "kfa::layer_norm_backward::dgamma_dbeta",
      Kokkos::RangePolicy<ExecSpace>(space, 0, (D + W - 1) / W), KOKKOS_LAMBDA(int b) {
        const int j0 = b * W, n = D - j0 < W ? D - j0 : W;
        Acc sg[W] = {}, sb[W] = {};
        for (int r = 0; r < rows; ++r) {
          const Acc mu = static_cast<Acc>(mean(r)), rs = static_cast<Acc>(rstd(r)), off = offset(r);
          for (int k = 0; k < n; ++k) {
            const Acc d = static_cast<Acc>(row_elem(dy, r, j0 + k));
            sg[k] += d * ((z(r, j0 + k) - mu) * rs - off);
            sb[k] += d;
          }
        }
        for (int k = 0; k < n; ++k) {
          dgamma(j0 + k) = static_cast<T>(sg[k]);
          dbeta(j0 + k) = static_cast<T>(sb[k]);
        }
      });
}

}  // namespace kfa::impl

namespace kfa {

/// Layer norm forward on `space`: per row, z = x + residual, y = (z - mean) rstd gamma + beta
/// with rstd = 1 / sqrt(var + eps) (the file comment has the details).
///
/// \param space    execution space the kernel runs on (asynchronously; fence before reading).
/// \param x        (rows, D) or (B, L, D), any layout; float, double or a 16-bit kfa type.
/// \param residual like x, added to it; an empty View of the rank and value type of x (size 0,
///                 a default-constructed one) means none.
/// \param gamma, beta (D), of the value type of x.
/// \param y        output like x (may not overlap the inputs).
/// \param mean, rstd outputs (rows), float or wider: each row's mean and 1 / sqrt(var + eps),
///                 for layer_norm_backward.
/// \param p        eps (default 1e-5) and unbiased (default false: var = M2 / D as PyTorch).
/// \throws kfa::Error on the host, before any launch: a shape that does not fit x's (both
///         shapes named), D = 0, a negative or non-finite eps, unbiased with D < 2.
template <class ExecSpace, class X, class Res, class G, class Bt, class Y, class M, class R>
void layer_norm(const ExecSpace& space, const X& x, const Res& residual, const G& gamma,
                const Bt& beta, const Y& y, const M& mean, const R& rstd,
                const LayerNormParams& p = {}) {
  impl::layer_norm(space, x, residual, gamma, beta, y, mean, rstd, p);
}

/// Layer norm backward on `space`: from dy = dL/dy, dz = dL/dz (which is dL/dx and, with a
/// residual, dL/dresidual), dgamma and dbeta; dgamma and dbeta are summed over the rows in
/// row order without atomics (bitwise repeatable).
///
/// \param space, x, residual, gamma, p as given to layer_norm.
/// \param mean, rstd the forward's.
/// \param dy       like x.
/// \param dz       output like x.
/// \param dgamma, dbeta outputs (D), overwritten.
/// \throws kfa::Error as layer_norm, and for dy, dz, dgamma, dbeta of the wrong shape.
template <class ExecSpace, class X, class Res, class G, class M, class R, class DY, class DZ,
          class DG, class DB>
void layer_norm_backward(const ExecSpace& space, const X& x, const Res& residual, const G& gamma,
                         const M& mean, const R& rstd, const DY& dy, const DZ& dz, const DG& dgamma,
                         const DB& dbeta, const LayerNormParams& p = {}) {
  impl::layer_norm_backward(space, x, residual, gamma, mean, rstd, dy, dz, dgamma, dbeta, p);
}

}  // namespace kfa
