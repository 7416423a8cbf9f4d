#pragma once
// The members of kfa::c_api::Passes (passes.hpp): the caller's arrays as Views, the score term
// as its kfa/masks.hpp object, and the C++ pass. Included by passes_f32.cpp and passes_f64.cpp
// only.
#include "passes.hpp"

#include <kfa/backward.hpp>
#include <kfa/forward.hpp>
#include <kfa/masks.hpp>
#include <kfa/varlen.hpp>

#include <cstdint>
#include <type_traits>

namespace kfa::c_api {

/// What only C can get wrong in a score term (the C++ layer checks its shape against q and k):
/// the kind, the lengths type, its tensors, and fields its kind does not read. The term's
/// tensors do not set the call's layout: their Views are strided in every call.
inline void check_term(const char* fn, const kfa_term* term, bool backward) {
  if (term == nullptr) return;
  const int kind = term->kind;
  if (kind < KFA_TERM_NONE || kind > KFA_TERM_ALIBI)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "term.kind = ", kind,
         " is not a kfa_term_kind (KFA_TERM_NONE 0 .. KFA_TERM_ALIBI 4)");
  if (kind == KFA_TERM_NONE && term->values.data != nullptr)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn,
         "term.kind is KFA_TERM_NONE but term.values.data is set; set the kind of the term");
  if (kind != KFA_TERM_BIAS && term->dbias.data != nullptr)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "term.dbias.data is set but term.kind = ", kind,
         " is not KFA_TERM_BIAS (3): only a bias has a gradient");
  if (kind == KFA_TERM_KEY_PADDING) {
    if (term->lengths_type != KFA_INT32 && term->lengths_type != KFA_INT64)
      fail(KFA_ERROR_INVALID_ARGUMENT, fn, "term.lengths_type = ", term->lengths_type,
           " is neither KFA_INT32 (0) nor KFA_INT64 (1)");
  } else if (term->lengths_type != 0) {
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "term.lengths_type = ", term->lengths_type,
         " is set but term.kind = ", kind, " is not KFA_TERM_KEY_PADDING (2)");
  }
  if (kind == KFA_TERM_NONE) return;
  const bool rank1 = kind == KFA_TERM_KEY_PADDING || kind == KFA_TERM_ALIBI;
  check_tensor(fn, Arg{&term->values, "term.values", rank1 ? 1 : 4, true, false});
  if (backward && kind == KFA_TERM_BIAS && term->dbias.data != nullptr)
    check_tensor(fn, Arg{&term->dbias, "term.dbias", 4, true, false});
}

/// Calls f with the term's kfa/masks.hpp object in memory space M (kfa::impl::NoTerm for none),
/// after check_term.
template <class T, class M, class F>
void with_term(const kfa_term* term, F&& f) {
  using S = Kokkos::LayoutStride;
  if (term == nullptr || term->kind == KFA_TERM_NONE) return f(kfa::impl::NoTerm{});
  const kfa_tensor& x = term->values;
  switch (term->kind) {
    case KFA_TERM_MASK:
      return f(kfa::masks::Dense{view_of<std::uint8_t, 4, S, M>(x)});
    case KFA_TERM_KEY_PADDING:
      if (term->lengths_type == KFA_INT64)
        return f(kfa::masks::KeyPadding{view_of<std::int64_t, 1, S, M>(x)});
      return f(kfa::masks::KeyPadding{view_of<std::int32_t, 1, S, M>(x)});
    case KFA_TERM_BIAS: {
      const auto bias = view_of<T, 4, S, M>(x);
      using B = std::decay_t<decltype(bias)>;
      // One View type with and without a gradient: an empty dbias means none.
      return f(
          kfa::masks::Bias<B, B>{bias, term->dbias.data ? view_of<T, 4, S, M>(term->dbias) : B()});
    }
    default:
      return f(kfa::masks::Alibi{view_of<T, 1, S, M>(x)});
  }
}

template <class E>
constexpr bool no_term = std::is_same_v<E, kfa::impl::NoTerm>;

template <class T>
kfa_status Passes<T>::forward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                              const kfa_tensor* v, const kfa_tensor* o, const kfa_tensor* lse,
                              const kfa_params* params, const kfa_term* term, const SeqPar* sp,
                              int memory) {
  return guarded([&] {
    dispatch(
        fn, params, sp, {{q, "q", 4}, {k, "k", 4}, {v, "v", 4}, {o, "o", 4}, {lse, "lse", 3}},
        memory, [&] { check_term(fn, term, false); },
        [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
          using M = decltype(mem);
          using L = decltype(layout);
          const auto in4 = [](const kfa_tensor* t) { return view_of<T, 4, L, M>(*t); };
          const auto o4 = view_of<T, 4, L, M>(*o);
          const auto lse3 = view_of<T, 3, L, M>(*lse);
          with_term<T, M>(term, [&](const auto& extra) {
            using E = std::decay_t<decltype(extra)>;
#ifdef KFA_C_WITH_MPI
            if (sp) {
              if constexpr (no_term<E>)
                return kfa::mpi::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p, *sp);
              else
                return kfa::mpi::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p, *sp, extra);
            }
#endif
            if constexpr (no_term<E>)
              kfa::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p);
            else
              kfa::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p, extra);
          });
        });
  });
}

template <class T>
kfa_status Passes<T>::backward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                               const kfa_tensor* v, const kfa_tensor* o, const kfa_tensor* lse,
                               const kfa_tensor* dout, const kfa_tensor* dlse, const kfa_tensor* dq,
                               const kfa_tensor* dk, const kfa_tensor* dv, const kfa_params* params,
                               const kfa_term* term, const SeqPar* sp, int memory) {
  return guarded([&] {
    // dlse is optional: rank 0 skips its check when it is NULL.
    dispatch(
        fn, params, sp,
        {{q, "q", 4},
         {k, "k", 4},
         {v, "v", 4},
         {o, "o", 4},
         {lse, "lse", 3},
         {dout, "dout", 4},
         {dlse, "dlse", dlse ? 3 : 0},
         {dq, "dq", 4},
         {dk, "dk", 4},
         {dv, "dv", 4}},
        memory, [&] { check_term(fn, term, true); },
        [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
          using M = decltype(mem);
          using L = decltype(layout);
          const auto in4 = [](const kfa_tensor* t) { return view_of<T, 4, L, M>(*t); };
          const auto in3 = [](const kfa_tensor* t) { return view_of<T, 3, L, M>(*t); };
          // The trailing arguments: the term when there is one, after params (and sp).
          const auto pass = [&](const auto&... tail) {
            const auto with_dlse = [&](const auto&... dl) {
#ifdef KFA_C_WITH_MPI
              if (sp)
                return kfa::mpi::backward(exec, in4(q), in4(k), in4(v), in4(o), in3(lse), in4(dout),
                                          dl..., in4(dq), in4(dk), in4(dv), p, *sp, tail...);
#endif
              kfa::backward(exec, in4(q), in4(k), in4(v), in4(o), in3(lse), in4(dout), dl...,
                            in4(dq), in4(dk), in4(dv), p, tail...);
            };
            if (dlse)
              with_dlse(in3(dlse));
            else
              with_dlse();
          };
          with_term<T, M>(term, [&](const auto& extra) {
            if constexpr (no_term<std::decay_t<decltype(extra)>>)
              pass();
            else
              pass(extra);
          });
        });
  });
}

template <class T>
kfa_status Passes<T>::varlen_forward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                                     const kfa_tensor* v, const kfa_tensor* cu_q,
                                     const kfa_tensor* cu_k, const kfa_tensor* o,
                                     const kfa_tensor* lse, const kfa_params* params, int memory) {
  return guarded([&] {
    dispatch(
        fn, params, nullptr,
        {{q, "q", 3, true},
         {k, "k", 3, true},
         {v, "v", 3, true},
         {cu_q, "cu_seqlens_q", 1, true, false},
         {cu_k, "cu_seqlens_k", 1, true, false},
         {o, "o", 3, true},
         {lse, "lse", 2, true}},
        memory, [] {},
        [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
          using M = decltype(mem);
          using L = decltype(layout);
          const auto in3 = [](const kfa_tensor* t) { return view_of<T, 3, L, M>(*t); };
          const auto cu = [](const kfa_tensor* t) {
            return view_of<std::int32_t, 1, Kokkos::LayoutStride, M>(*t);
          };
          kfa::varlen::forward(exec, in3(q), in3(k), in3(v), cu(cu_q), cu(cu_k), in3(o),
                               view_of<T, 2, L, M>(*lse), p);
        });
  });
}

template <class T>
kfa_status Passes<T>::varlen_backward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                                      const kfa_tensor* v, const kfa_tensor* o,
                                      const kfa_tensor* lse, const kfa_tensor* dout,
                                      const kfa_tensor* dlse, const kfa_tensor* cu_q,
                                      const kfa_tensor* cu_k, const kfa_tensor* dq,
                                      const kfa_tensor* dk, const kfa_tensor* dv,
                                      const kfa_params* params, int memory) {
  return guarded([&] {
    dispatch(
        fn, params, nullptr,
        {{q, "q", 3, true},
         {k, "k", 3, true},
         {v, "v", 3, true},
         {o, "o", 3, true},
         {lse, "lse", 2, true},
         {dout, "dout", 3, true},
         {dlse, "dlse", dlse ? 2 : 0, true},
         {cu_q, "cu_seqlens_q", 1, true, false},
         {cu_k, "cu_seqlens_k", 1, true, false},
         {dq, "dq", 3, true},
         {dk, "dk", 3, true},
         {dv, "dv", 3, true}},
        memory, [] {},
        [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
          using M = decltype(mem);
          using L = decltype(layout);
          const auto in3 = [](const kfa_tensor* t) { return view_of<T, 3, L, M>(*t); };
          const auto in2 = [](const kfa_tensor* t) { return view_of<T, 2, L, M>(*t); };
          const auto cu = [](const kfa_tensor* t) {
            return view_of<std::int32_t, 1, Kokkos::LayoutStride, M>(*t);
          };
          if (dlse)
            kfa::varlen::backward(exec, in3(q), in3(k), in3(v), in3(o), in2(lse), in3(dout),
                                  in2(dlse), cu(cu_q), cu(cu_k), in3(dq), in3(dk), in3(dv), p);
          else
            kfa::varlen::backward(exec, in3(q), in3(k), in3(v), in3(o), in2(lse), in3(dout),
                                  cu(cu_q), cu(cu_k), in3(dq), in3(dk), in3(dv), p);
        });
  });
}

}  // namespace kfa::c_api
