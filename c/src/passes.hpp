#pragma once
// The passes of the C interface for one value type T: the kfa_*_f32 functions call
// Passes<float>, the _f64 ones Passes<double>. The members are defined in passes_impl.hpp and
// instantiated once per type in its own translation unit (passes_f32.cpp, passes_f64.cpp), so
// that the two halves of the kernels' instantiations compile in parallel. Internal.
#include <kfa/kfa.h>

#include "call.hpp"

namespace kfa::c_api {

template <class T>
struct Passes {
  /// kfa::forward, or kfa::mpi::forward with sp; term may be NULL.
  static kfa_status forward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                            const kfa_tensor* v, const kfa_tensor* o, const kfa_tensor* lse,
                            const kfa_params* params, const kfa_term* term, const SeqPar* sp,
                            int memory);
  /// kfa::backward, or kfa::mpi::backward with sp; dlse and term may be NULL.
  static kfa_status backward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                             const kfa_tensor* v, const kfa_tensor* o, const kfa_tensor* lse,
                             const kfa_tensor* dout, const kfa_tensor* dlse, const kfa_tensor* dq,
                             const kfa_tensor* dk, const kfa_tensor* dv, const kfa_params* params,
                             const kfa_term* term, const SeqPar* sp, int memory);
  /// kfa::varlen::forward.
  static kfa_status varlen_forward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                                   const kfa_tensor* v, const kfa_tensor* cu_q,
                                   const kfa_tensor* cu_k, const kfa_tensor* o,
                                   const kfa_tensor* lse, const kfa_params* params, int memory);
  /// kfa::varlen::backward; dlse may be NULL.
  static kfa_status varlen_backward(const char* fn, const kfa_tensor* q, const kfa_tensor* k,
                                    const kfa_tensor* v, const kfa_tensor* o, const kfa_tensor* lse,
                                    const kfa_tensor* dout, const kfa_tensor* dlse,
                                    const kfa_tensor* cu_q, const kfa_tensor* cu_k,
                                    const kfa_tensor* dq, const kfa_tensor* dk,
                                    const kfa_tensor* dv, const kfa_params* params, int memory);
};

extern template struct Passes<float>;
extern template struct Passes<double>;

}  // namespace kfa::c_api
