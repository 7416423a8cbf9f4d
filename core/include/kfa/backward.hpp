#pragma once
/// \file backward.hpp
/// kfa::backward: gradients of exact attention by recomputation (FlashAttention-2).

#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/profiling.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>

namespace kfa {

namespace impl {

/// Whether View is a Kokkos::View of rank Rank: tells the two backward overloads apart.
template <class View, int Rank, class = void>
struct is_view_of_rank : std::false_type {};
template <class View, int Rank>
struct is_view_of_rank<View, Rank, std::enable_if_t<Kokkos::is_view<View>::value>>
    : std::bool_constant<static_cast<int>(View::rank) == Rank> {};

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::backward: the first argument must be a Kokkos execution space");
  static_check_tensor<Q>();
  static_check_tensor<K>();
  static_check_tensor<V>();
  static_check_tensor<O>();
  static_check_tensor<DO>();
  static_check_tensor<DQ>();
  static_check_tensor<DK>();
  static_check_tensor<DV>();
  static_assert(is_view_of_rank<Lse, 3>::value && is_view_of_rank<DLse, 3>::value,
                "kfa::backward: lse and dlse must be rank-3 Views (batch, heads_q, seqlen_q)");
  using T = typename Q::non_const_value_type;
  static_assert(std::is_same_v<T, typename K::non_const_value_type> &&
                    std::is_same_v<T, typename V::non_const_value_type> &&
                    std::is_same_v<T, typename O::non_const_value_type> &&
                    std::is_same_v<T, typename DO::non_const_value_type>,
                "kfa::backward: q, k, v, o and dout must share one value type");
  static_assert(std::is_same_v<T, typename DQ::value_type> &&
                    std::is_same_v<T, typename DK::value_type> &&
                    std::is_same_v<T, typename DV::value_type>,
                "kfa::backward: dq, dk and dv must be non-const and of the value type of q");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kfa::backward: value type must be float or double");
  static_assert(std::is_floating_point_v<typename Lse::non_const_value_type> &&
                    sizeof(typename Lse::non_const_value_type) >= sizeof(float) &&
                    std::is_floating_point_v<typename DLse::non_const_value_type>,
                "kfa::backward: lse must be float or wider, dlse floating point");
  static_check_accessible<ExecSpace, Q>();
  static_check_accessible<ExecSpace, K>();
  static_check_accessible<ExecSpace, V>();
  static_check_accessible<ExecSpace, O>();
  static_check_accessible<ExecSpace, Lse>();
  static_check_accessible<ExecSpace, DO>();
  static_check_accessible<ExecSpace, DLse>();
  static_check_accessible<ExecSpace, DQ>();
  static_check_accessible<ExecSpace, DK>();
  static_check_accessible<ExecSpace, DV>();

  ScopedRegion region("kfa::backward");
  validate_params("backward", params);
  validate_shapes("backward", q, k, v, o, lse);
  for (int dim = 0; dim < 4; ++dim) {
    static const char* what[] = {"batch", "heads", "seqlen", "head_dim"};
    expect_extent("backward", "dout", dout, dim, what[dim], q.extent(dim), "q");
    expect_extent("backward", "dq", dq, dim, what[dim], q.extent(dim), "q");
    expect_extent("backward", "dk", dk, dim, what[dim], k.extent(dim), "k");
    expect_extent("backward", "dv", dv, dim, what[dim], k.extent(dim), "k");
  }
  if (dlse)
    for (int dim = 0; dim < 3; ++dim) {
      static const char* what[] = {"batch", "heads", "seqlen"};
      expect_extent("backward", "dlse", *dlse, dim, what[dim], q.extent(dim), "q");
    }
  expect_unit_stride("backward", "dout", dout);
  expect_unit_stride("backward", "dq", dq);
  expect_unit_stride("backward", "dk", dk);
  expect_unit_stride("backward", "dv", dv);

  using Views = BackwardViews<Q, K, V, DO, Lse, DQ, DK, DV>;
  using Common = BackwardCommon<ExecSpace, T, Views>;
  typename Common::delta_view delta(
      Kokkos::view_alloc(std::string("kfa::backward::delta"), Kokkos::WithoutInitializing),
      q.extent(0), q.extent(1), q.extent(2));
  const bool atomic_dq = !params.deterministic;
  BackwardPreprocess<ExecSpace, typename Common::delta_view, DO, O, DLse, DQ>{
      delta, dout, o, dlse ? *dlse : DLse(), dlse != nullptr, dq, atomic_dq}
      .launch(space);
  const Common common(Views{q, k, v, dout, lse, dq, dk, dv}, delta, params);
  KeyValueKernel<ExecSpace, T, Views>(common, atomic_dq).launch(space);
  if (!atomic_dq) QueryKernel<ExecSpace, T, Views>(common).launch(space);
}

}  // namespace impl

/// FlashAttention-2 backward pass on `space`: the gradients of a loss L with respect to q, k
/// and v, given dout = dL/dO (and, in the overload below, dlse = dL/dLSE).
///
/// \param q, k, v, params as given to kfa::forward; o and lse the forward's outputs.
/// \param dout  (batch, heads_q, seqlen_q, head_dim) gradient with respect to o.
/// \param dq    output like q; dk, dv outputs like k and v (summed over each group of query
///              heads under grouped-query attention). Any layout with unit head_dim stride.
/// Nothing but o and lse is kept from the forward: P is recomputed as exp(S - LSE).
/// params.deterministic = false (default) adds dQ with atomics from the key-tile teams, the
/// faster way on the machines measured (perf/results); true recomputes the tiles in a
/// query-outer pass instead, so dq, dk and dv are bitwise identical run to run.
/// Rows that saw no key (LSE = -inf) contribute nothing: all gradients stay finite.
/// \throws kfa::Error on the host, before any launch, for arguments forward would reject or
///         gradients whose shapes differ from their tensors'.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, std::enable_if_t<impl::is_view_of_rank<DQ, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params = {}) {
  impl::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv,
                 params);
}

/// As above, with the gradient through the LSE as well: dlse = dL/dLSE, shape
/// (batch, heads_q, seqlen_q). Its contribution is dS += P * dlse, for losses that use the LSE
/// (z-loss, log-partition terms, merging partial attention).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV,
          std::enable_if_t<impl::is_view_of_rank<DLse, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params = {}) {
  impl::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, params);
}

}  // namespace kfa
