// kfa's C interface (kfa/kfa.h): wraps the caller's arrays in unmanaged Kokkos Views and calls
// kfa::forward / kfa::backward. Argument checks are the C++ layer's (kfa::Error names the
// argument); this file adds only what C can get wrong and C++ cannot: NULL pointers, negative
// extents and strides, enum values out of range, and Kokkos not initialised. Every exception is
// caught here and turned into a status code and a thread-local message.
#include <kfa/kfa.h>

#include "params.hpp"

#include <kfa/backward.hpp>
#include <kfa/forward.hpp>
#include <kfa/params.hpp>
#ifdef KFA_C_WITH_MPI
#include <kfa/distributed.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <exception>
#include <new>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace {

thread_local std::string last_error;  // NOLINT(cert-err58-cpp): a default-constructed string

// Whether kfa_initialize started Kokkos (so kfa_finalize stops it) and whether it stopped it.
bool kfa_started_kokkos = false;
bool kfa_stopped_kokkos = false;

/// A failure detected here rather than in the C++ layer, with its status.
struct Failure {
  kfa_status status;
  std::string message;
};

template <class... Args>
[[noreturn]] void fail(kfa_status status, const char* fn, Args&&... args) {
  std::ostringstream os;
  os << "kfa: " << fn << ": ";
  (os << ... << args);
  throw Failure{status, os.str()};
}

/// Runs f, turning whatever it throws into a status and last_error; f writes nothing before
/// every check has passed (the C++ layer validates before launching).
template <class F>
kfa_status guarded(F&& f) noexcept {
  kfa_status status = KFA_OK;
  try {
    try {
      std::forward<F>(f)();
      last_error.clear();
      return KFA_OK;
    } catch (const Failure& e) {
      status = e.status;
      last_error = e.message;
    } catch (const kfa::Error& e) {
      status = KFA_ERROR_INVALID_ARGUMENT;
      last_error = e.what();
    } catch (const std::bad_alloc& e) {
      status = KFA_ERROR_OUT_OF_MEMORY;
      last_error = std::string("kfa: out of memory: ") + e.what();
    } catch (const std::exception& e) {
      status = KFA_ERROR_INTERNAL;
      last_error = std::string("kfa: internal error: ") + e.what();
    } catch (...) {
      status = KFA_ERROR_INTERNAL;
      last_error = "kfa: internal error: unknown exception";
    }
  } catch (...) {  // the message itself could not be stored
    last_error.clear();
  }
  return status;
}

/// params as kfa::Params; the C++ layer checks the values, this the pointer and the enum.
kfa::Params params_of(const char* fn, const kfa_params* params) {
  if (params == nullptr)
    fail(KFA_ERROR_NULL_POINTER, fn, "params is NULL (use kfa_params_default())");
  if (params->align != KFA_ALIGN_BOTTOM_RIGHT && params->align != KFA_ALIGN_TOP_LEFT)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "params.align = ", params->align,
         " is neither KFA_ALIGN_BOTTOM_RIGHT (0) nor KFA_ALIGN_TOP_LEFT (1)");
  if (params->dq_mode < KFA_DQ_AUTO || params->dq_mode > KFA_DQ_SYMMETRIC)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "params.dq_mode = ", params->dq_mode,
         " is not a kfa_dq_mode (KFA_DQ_AUTO 0 .. KFA_DQ_SYMMETRIC 3)");
  return kfa::c_api::to_params(*params);
}

/// One tensor argument: its name in messages and its rank (4, or 3 for lse and dlse).
struct Arg {
  const kfa_tensor* t;
  const char* name;
  int rank;
};

/// Checks what only C can get wrong in a tensor; returns whether it is contiguous row-major.
bool check_tensor(const char* fn, const Arg& a) {
  if (a.t == nullptr) fail(KFA_ERROR_NULL_POINTER, fn, a.name, " is NULL");
  bool empty = false, zero_strides = true;
  for (int d = 0; d < a.rank; ++d) {
    if (a.t->extent[d] < 0)
      fail(KFA_ERROR_INVALID_ARGUMENT, fn, a.name, ".extent[", d, "] = ", a.t->extent[d],
           " is negative");
    if (a.t->stride[d] < 0)
      fail(KFA_ERROR_INVALID_ARGUMENT, fn, a.name, ".stride[", d, "] = ", a.t->stride[d],
           " is negative");
    empty = empty || a.t->extent[d] == 0;
    zero_strides = zero_strides && a.t->stride[d] == 0;
  }
  if (a.t->data == nullptr && !empty) fail(KFA_ERROR_NULL_POINTER, fn, a.name, ".data is NULL");
  return zero_strides;
}

template <class T, int Rank>
struct DataType;
template <class T>
struct DataType<T, 3> {
  using type = T***;
};
template <class T>
struct DataType<T, 4> {
  using type = T****;
};

/// The unmanaged View of a tensor: Layout is LayoutRight when every tensor of the call is
/// contiguous (the layout a C++ caller's Views have, so the same kernels run), LayoutStride
/// otherwise.
template <class T, int Rank, class Layout, class Mem>
using Unmanaged = Kokkos::View<typename DataType<T, Rank>::type, Layout, Mem,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T, int Rank, class Layout, class Mem>
Unmanaged<T, Rank, Layout, Mem> view_of(const kfa_tensor& t) {
  using V = Unmanaged<T, Rank, Layout, Mem>;
  auto* data = static_cast<T*>(t.data);
  const auto e = [&](int d) { return static_cast<std::size_t>(t.extent[d]); };
  if constexpr (std::is_same_v<Layout, Kokkos::LayoutRight>) {
    if constexpr (Rank == 4)
      return V(data, e(0), e(1), e(2), e(3));
    else
      return V(data, e(0), e(1), e(2));
  } else {
    // Contiguous tensors of a strided call get their row-major strides.
    std::size_t s[4] = {};
    const bool given = t.stride[0] || t.stride[1] || t.stride[2] || (Rank == 4 && t.stride[3]);
    std::size_t step = 1;
    for (int d = Rank - 1; d >= 0; --d) {
      s[d] = given ? static_cast<std::size_t>(t.stride[d]) : step;
      step *= e(d);
    }
    if constexpr (Rank == 4)
      return V(data, Kokkos::LayoutStride(e(0), s[0], e(1), s[1], e(2), s[2], e(3), s[3]));
    else
      return V(data, Kokkos::LayoutStride(e(0), s[0], e(1), s[1], e(2), s[2]));
  }
}

/// The checks common to every pass that only C can fail (Kokkos started, the tensors, the memory
/// flag); returns whether every tensor is contiguous.
bool check_call(const char* fn, std::initializer_list<Arg> args, int memory) {
  if (!Kokkos::is_initialized())
    fail(KFA_ERROR_NOT_INITIALIZED, fn, "Kokkos is not initialized: call kfa_initialize() first");
  bool contiguous = true;
  for (const Arg& a : args)
    if (a.rank > 0) contiguous = check_tensor(fn, a) && contiguous;
  if (memory != KFA_MEMORY_HOST && memory != KFA_MEMORY_DEVICE)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "memory = ", memory,
         " is neither KFA_MEMORY_HOST (0) nor KFA_MEMORY_DEVICE (1)");
  using Device = Kokkos::DefaultExecutionSpace;
  if (memory == KFA_MEMORY_DEVICE && std::is_same_v<Device, Kokkos::DefaultHostExecutionSpace>)
    fail(KFA_ERROR_UNSUPPORTED, fn,
         "memory = KFA_MEMORY_DEVICE but this kfa's Kokkos has no device backend (", Device::name(),
         " only); pass host memory with KFA_MEMORY_HOST");
  return contiguous;
}

/// Calls f(exec space, memory space tag, layout tag) for the call's memory and layout (after
/// check_call), then fences: the C caller reads the results on return.
template <class F>
void run(bool contiguous, int memory, F&& f) {
  const auto with_layout = [&](auto exec) {
    using Exec = decltype(exec);
    if (contiguous)
      f(exec, typename Exec::memory_space{}, Kokkos::LayoutRight{});
    else
      f(exec, typename Exec::memory_space{}, Kokkos::LayoutStride{});
    exec.fence();
  };
  using Device = Kokkos::DefaultExecutionSpace;
  if constexpr (!std::is_same_v<Device, Kokkos::DefaultHostExecutionSpace>)
    if (memory == KFA_MEMORY_DEVICE) return with_layout(Device{});
  with_layout(Kokkos::DefaultHostExecutionSpace{});
}

#ifdef KFA_C_WITH_MPI
using SeqPar = kfa::mpi::SeqPar;
#else
struct SeqPar {};  // never made: the kfa_mpi_ functions fail first
#endif

/// The params and tensors of a call, checked; then f(params, exec, memory space, layout). With
/// sp (kfa::mpi), the checks are agreed across sp->comm first, so a NULL pointer on one rank
/// fails every rank's call instead of leaving the others waiting in a collective.
template <class F>
void dispatch(const char* fn, const kfa_params* params, const SeqPar* sp,
              std::initializer_list<Arg> args, int memory, F&& f) {
  if (sp == nullptr) {
    const kfa::Params p = params_of(fn, params);
    return run(check_call(fn, args, memory), memory, [&](auto... tags) { f(p, tags...); });
  }
#ifdef KFA_C_WITH_MPI
  kfa::Params p;
  bool contiguous = false;
  Failure local{KFA_OK, ""};
  try {
    p = params_of(fn, params);
    contiguous = check_call(fn, args, memory);
  } catch (const Failure& e) {
    local = e;
  }
  try {
    // agree() prefixes "kfa: rank R: " itself.
    kfa::mpi::agree(sp->comm, local.message.empty() ? "" : local.message.substr(5));
  } catch (const kfa::Error& e) {
    if (local.status != KFA_OK) throw Failure{local.status, e.what()};
    throw;
  }
  run(contiguous, memory, [&](auto... tags) { f(p, tags...); });
#endif
}

/// kfa::forward, or kfa::mpi::forward with sp.
template <class T>
kfa_status forward(const char* fn, const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                   const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                   const SeqPar* sp, int memory) {
  return guarded([&] {
    dispatch(fn, params, sp, {{q, "q", 4}, {k, "k", 4}, {v, "v", 4}, {o, "o", 4}, {lse, "lse", 3}},
             memory, [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
               using M = decltype(mem);
               using L = decltype(layout);
               const auto in4 = [](const kfa_tensor* t) { return view_of<T, 4, L, M>(*t); };
               const auto o4 = view_of<T, 4, L, M>(*o);
               const auto lse3 = view_of<T, 3, L, M>(*lse);
#ifdef KFA_C_WITH_MPI
               if (sp) return kfa::mpi::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p, *sp);
#endif
               kfa::forward(exec, in4(q), in4(k), in4(v), o4, lse3, p);
             });
  });
}

/// kfa::backward, or kfa::mpi::backward with sp; dlse may be NULL.
template <class T>
kfa_status backward(const char* fn, const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                    const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                    const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                    const kfa_tensor* dv, const kfa_params* params, const SeqPar* sp, int memory) {
  return guarded([&] {
    // dlse is optional: rank 0 skips its check when it is NULL.
    dispatch(fn, params, sp,
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
             memory, [&](const kfa::Params& p, auto exec, auto mem, auto layout) {
               using M = decltype(mem);
               using L = decltype(layout);
               const auto in4 = [](const kfa_tensor* t) { return view_of<T, 4, L, M>(*t); };
               const auto out4 = [](const kfa_tensor* t) { return view_of<T, 4, L, M>(*t); };
               const auto in3 = [](const kfa_tensor* t) { return view_of<T, 3, L, M>(*t); };
               const auto pass = [&](const auto&... dl) {
#ifdef KFA_C_WITH_MPI
                 if (sp)
                   return kfa::mpi::backward(exec, in4(q), in4(k), in4(v), in4(o), in3(lse),
                                             in4(dout), dl..., out4(dq), out4(dk), out4(dv), p,
                                             *sp);
#endif
                 kfa::backward(exec, in4(q), in4(k), in4(v), in4(o), in3(lse), in4(dout), dl...,
                               out4(dq), out4(dk), out4(dv), p);
               };
               if (dlse)
                 pass(in3(dlse));
               else
                 pass();
             });
  });
}

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
  return last_error.c_str();
}

kfa_status kfa_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory) {
  return forward<float>("kfa_forward_f32", q, k, v, o, lse, params, nullptr, memory);
}

kfa_status kfa_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory) {
  return forward<double>("kfa_forward_f64", q, k, v, o, lse, params, nullptr, memory);
}

kfa_status kfa_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory) {
  return backward<float>("kfa_backward_f32", q, k, v, o, lse, dout, dlse, dq, dk, dv, params,
                         nullptr, memory);
}

kfa_status kfa_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory) {
  return backward<double>("kfa_backward_f64", q, k, v, o, lse, dout, dlse, dq, dk, dv, params,
                          nullptr, memory);
}

kfa_status kfa_mpi_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return forward<float>(fn, q, k, v, o, lse, params, sp, memory);
  });
}

kfa_status kfa_mpi_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_forward_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return forward<double>(fn, q, k, v, o, lse, params, sp, memory);
  });
}

kfa_status kfa_mpi_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_f32";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return backward<float>(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, sp, memory);
  });
}

kfa_status kfa_mpi_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory) {
  const char* fn = "kfa_mpi_backward_f64";
  return collective(fn, seqpar, [&](const SeqPar* sp) {
    return backward<double>(fn, q, k, v, o, lse, dout, dlse, dq, dk, dv, params, sp, memory);
  });
}

}  // extern "C"
