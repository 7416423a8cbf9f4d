// kfa's C interface (kfa/kfa.h): wraps the caller's arrays in unmanaged Kokkos Views and calls
// kfa::forward / kfa::backward / kfa::varlen / kfa::mpi (passes.hpp). Argument checks are the
// C++ layer's (kfa::Error names the argument); call.hpp adds only what C can get wrong and C++
// cannot: NULL pointers, negative extents and strides, enum values out of range, and Kokkos
// not initialised. Every exception is caught there and turned into a status code and a
// thread-local message.
#include <kfa/kfa.h>

#include "call.hpp"
#include "passes.hpp"

#include <kfa/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace {

using kfa::c_api::fail;
using kfa::c_api::guarded;
using kfa::c_api::SeqPar;
using F32 = kfa::c_api::Passes<float>;
using F64 = kfa::c_api::Passes<double>;

// Whether kfa_initialize started Kokkos (so kfa_finalize stops it) and whether it stopped it.
bool kfa_started_kokkos = false;
bool kfa_stopped_kokkos = false;

/// The kfa_mpi_ functions: sp from the C struct, then the pass.
template <class Pass>
kfa_status collective(const char* fn, const kfa_seqpar* seqpar, Pass&& pass) {
#ifdef KFA_C_WITH_MPI
  static_assert(std::is_same_v<MPI_Fint, int>, "kfa_seqpar.comm is an int: MPI_Fint must be");
  SeqPar sp;
  const kfa_status status = guarded([&] {
    int mpi_started = 0;
    MPI_Initialized(&mpi_started);
    if (!mpi_started) fail(KFA_ERROR_NOT_INITIALIZED, fn, "MPI is not initialized");
    if (seqpar == nullptr) fail(KFA_ERROR_NULL_POINTER, fn, "seqpar is NULL");
    sp.comm = MPI_Comm_f2c(seqpar->comm);
    if (sp.comm == MPI_COMM_NULL)
      fail(KFA_ERROR_INVALID_ARGUMENT, fn, "seqpar.comm is MPI_COMM_NULL");
    sp.seqlen_q = seqpar->seqlen_q;
    sp.seqlen_k = seqpar->seqlen_k;
    // Out-of-range enum values go through as they are; kfa::mpi's agreed checks reject them.
    sp.layout = static_cast<kfa::mpi::Layout>(seqpar->layout);
    sp.mode = static_cast<kfa::mpi::Mode>(seqpar->mode);
  });
  return status != KFA_OK ? status : pass(&sp);
#else
  (void)seqpar;
  (void)pass;
  return guarded([&] {
    fail(KFA_ERROR_UNSUPPORTED, fn, "this kfa was built without MPI (KFA_ENABLE_MPI=OFF)");
  });
#endif
}

}  // namespace

extern "C" {

kfa_params kfa_params_default(void) {
  return kfa::c_api::from_params(kfa::Params{});
}

kfa_tensor kfa_tensor_contiguous(void* data, int64_t batch, int64_t heads, int64_t seqlen,
                                 int64_t head_dim) {
  kfa_tensor t{};
  t.data = data;
  t.extent[0] = batch;
  t.extent[1] = heads;
  t.extent[2] = seqlen;
  t.extent[3] = head_dim;
  return t;
}

kfa_status kfa_initialize(void) {
  return guarded([] {
    if (kfa_stopped_kokkos)
      fail(KFA_ERROR_UNSUPPORTED, "kfa_initialize",
           "kfa_finalize has finalized Kokkos, which cannot be initialized twice in a process");
    if (!Kokkos::is_initialized()) {
      Kokkos::initialize();
      kfa_started_kokkos = true;
    }
  });
}

kfa_status kfa_finalize(void) {
  return guarded([] {
    if (kfa_started_kokkos && !kfa_stopped_kokkos) {
      Kokkos::finalize();
      kfa_stopped_kokkos = true;
    }
  });
}

const char* kfa_last_error(void) {
  return kfa::c_api::last_error.c_str();
}

kfa_status kfa_release_workspaces(void) {
  return guarded([] { kfa::release_workspaces(); });
}

int64_t kfa_workspace_bytes(void) {
  std::int64_t bytes = -1;
  if (guarded([&] { bytes = static_cast<std::int64_t>(kfa::workspace_bytes()); }) != KFA_OK)
    return -1;
  return bytes;
}

kfa_term kfa_term_mask(kfa_tensor mask) {
  kfa_term t{};
  t.kind = KFA_TERM_MASK;
  t.values = mask;
  return t;
}

kfa_term kfa_term_key_padding(const void* lengths, int64_t batch, int lengths_type) {
  kfa_term t{};
  t.kind = KFA_TERM_KEY_PADDING;
  t.values.data = const_cast<void*>(lengths);  // kfa never writes through an input
  t.values.extent[0] = batch;
  t.lengths_type = lengths_type;
  return t;
}

kfa_term kfa_term_bias(kfa_tensor bias, kfa_tensor dbias) {
  kfa_term t{};
  t.kind = KFA_TERM_BIAS;
  t.values = bias;
  t.dbias = dbias;
  return t;
}

kfa_term kfa_term_alibi(const void* slopes, int64_t heads_q) {
  kfa_term t{};
  t.kind = KFA_TERM_ALIBI;
  t.values.data = const_cast<void*>(slopes);  // kfa never writes through an input
  t.values.extent[0] = heads_q;
  return t;
}

kfa_status kfa_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory) {
  return F32::forward("kfa_forward_f32", q, k, v, o, lse, params, nullptr, nullptr, memory);
}

kfa_status kfa_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory) {
  return F64::forward("kfa_forward_f64", q, k, v, o, lse, params, nullptr, nullptr, memory);
}

kfa_status kfa_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory) {
  return F32::backward("kfa_backward_f32", q, k, v, o, lse, dout, dlse, dq, dk, dv, params, nullptr,
                       nullptr, memory);
}

kfa_status kfa_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory) {
  return F64::backward("kfa_backward_f64", q, k, v, o, lse, dout, dlse, dq, dk, dv, params, nullptr,
                       nullptr, memory);
}

kfa_status kfa_forward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse,
                                const kfa_params* params, const kfa_term* term, int memory) {
  return F32::forward("kfa_forward_term_f32", q, k, v, o, lse, params, term, nullptr, memory);
}

kfa_status kfa_forward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse,
                                const kfa_params* params, const kfa_term* term, int memory) {
  return F64::forward("kfa_forward_term_f64", q, k, v, o, lse, params, term, nullptr, memory);
}

kfa_status kfa_backward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                 const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                 const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                 const kfa_tensor* dv, const kfa_params* params,
                                 const kfa_term* term, int memory) {
  return F32::backward("kfa_backward_term_f32", q, k, v, o, lse, dout, dlse, dq, dk, dv, params,
                       term, nullptr, memory);
}

kfa_status kfa_backward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                 const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                 const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                 const kfa_tensor* dv, const kfa_params* params,
                                 const kfa_term* term, int memory) {
  return F64::backward("kfa_backward_term_f64", q, k, v, o, lse, dout, dlse, dq, dk, dv, params,
                       term, nullptr, memory);
}

kfa_status kfa_mpi_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F32::forward(fn, q, k, v, o, lse, params, nullptr, sp, memory);
  });
}

kfa_status kfa_mpi_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F64::forward(fn, q, k, v, o, lse, params, nullptr, sp, memory);
  });
}

kfa_status kfa_mpi_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F32::backward(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, nullptr, sp, memory);
  });
}

kfa_status kfa_mpi_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F64::backward(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, nullptr, sp, memory);
  });
}

kfa_status kfa_mpi_forward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                    const kfa_tensor* o, const kfa_tensor* lse,
                                    const kfa_params* params, const kfa_term* term,
                                    const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_term_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F32::forward(fn, q, k, v, o, lse, params, term, sp, memory);
  });
}

kfa_status kfa_mpi_forward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                    const kfa_tensor* o, const kfa_tensor* lse,
                                    const kfa_params* params, const kfa_term* term,
                                    const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_term_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F64::forward(fn, q, k, v, o, lse, params, term, sp, memory);
  });
}

kfa_status kfa_mpi_backward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                     const kfa_tensor* o, const kfa_tensor* lse,
                                     const kfa_tensor* dout, const kfa_tensor* dlse,
                                     const kfa_tensor* dq, const kfa_tensor* dk,
                                     const kfa_tensor* dv, const kfa_params* params,
                                     const kfa_term* term, const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_term_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F32::backward(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, sp, memory);
  });
}

kfa_status kfa_mpi_backward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                     const kfa_tensor* o, const kfa_tensor* lse,
                                     const kfa_tensor* dout, const kfa_tensor* dlse,
                                     const kfa_tensor* dq, const kfa_tensor* dk,
                                     const kfa_tensor* dv, const kfa_params* params,
                                     const kfa_term* term, const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_term_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return F64::backward(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, sp, memory);
  });
}

kfa_status kfa_varlen_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                  const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                  const kfa_tensor* o, const kfa_tensor* lse,
                                  const kfa_params* params, int memory) {
  return F32::varlen_forward("kfa_varlen_forward_f32", q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse,
                             params, memory);
}

kfa_status kfa_varlen_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                  const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                  const kfa_tensor* o, const kfa_tensor* lse,
                                  const kfa_params* params, int memory) {
  return F64::varlen_forward("kfa_varlen_forward_f64", q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse,
                             params, memory);
}

kfa_status kfa_varlen_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                   const kfa_tensor* o, const kfa_tensor* lse,
                                   const kfa_tensor* dout, const kfa_tensor* dlse,
                                   const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                   const kfa_tensor* dq, const kfa_tensor* dk, const kfa_tensor* dv,
                                   const kfa_params* params, int memory) {
  return F32::varlen_backward("kfa_varlen_backward_f32", q, k, v, o, lse, dout, dlse, cu_seqlens_q,
                              cu_seqlens_k, dq, dk, dv, params, memory);
}

kfa_status kfa_varlen_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                   const kfa_tensor* o, const kfa_tensor* lse,
                                   const kfa_tensor* dout, const kfa_tensor* dlse,
                                   const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                   const kfa_tensor* dq, const kfa_tensor* dk, const kfa_tensor* dv,
                                   const kfa_params* params, int memory) {
  return F64::varlen_backward("kfa_varlen_backward_f64", q, k, v, o, lse, dout, dlse, cu_seqlens_q,
                              cu_seqlens_k, dq, dk, dv, params, memory);
}

}  // extern "C"
