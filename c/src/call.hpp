#pragma once
// The machinery of every function of the C interface (kfa/kfa.h), shared by its translation
// units: exceptions to status codes and the thread's message, the checks that only C can fail
// (NULL pointers, negative extents and strides, enum values out of range, Kokkos not
// initialised), the caller's arrays as unmanaged Views, and the dispatch on memory and layout,
// agreed across ranks for the kfa_mpi_ functions. Internal to the C interface.
#include <kfa/kfa.h>

#include "params.hpp"

#include <kfa/params.hpp>
#ifdef KFA_C_WITH_MPI
#include <kfa/distributed.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <exception>
#include <initializer_list>
#include <new>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace kfa::c_api {

/// The message of this thread's last failed call ("" after a success).
inline thread_local std::string last_error;  // NOLINT(cert-err58-cpp): a default-constructed string

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
inline kfa::Params params_of(const char* fn, const kfa_params* params) {
  if (params == nullptr)
    fail(KFA_ERROR_NULL_POINTER, fn, "params is NULL (use kfa_params_default())");
  if (params->align != KFA_ALIGN_BOTTOM_RIGHT && params->align != KFA_ALIGN_TOP_LEFT)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "params.align = ", params->align,
         " is neither KFA_ALIGN_BOTTOM_RIGHT (0) nor KFA_ALIGN_TOP_LEFT (1)");
  if (params->dq_mode < KFA_DQ_AUTO || params->dq_mode > KFA_DQ_SYMMETRIC)
    fail(KFA_ERROR_INVALID_ARGUMENT, fn, "params.dq_mode = ", params->dq_mode,
         " is not a kfa_dq_mode (KFA_DQ_AUTO 0 .. KFA_DQ_SYMMETRIC 3)");
  return to_params(*params);
}

/// One tensor argument: its name in messages and its rank (4; 3 for lse and dlse, whose
/// extent[3] is ignored; 0 skips the check, for an optional tensor passed as NULL). `strict`:
/// the extents and strides past the rank must be 0 (the arguments added with varlen and the
/// score terms, which reject what they do not read). `sets_layout`: whether the tensor takes
/// part in the call's choice of contiguous or strided Views (the score terms' and offsets'
/// Views are strided in every call).
struct Arg {
  const kfa_tensor* t;
  const char* name;
  int rank;
  bool strict = false;
  bool sets_layout = true;
};

/// Checks what only C can get wrong in a tensor; returns whether it is contiguous row-major.
inline bool check_tensor(const char* fn, const Arg& a) {
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
  for (int d = a.rank; a.strict && d < 4; ++d)
    if (a.t->extent[d] != 0 || a.t->stride[d] != 0)
      fail(KFA_ERROR_INVALID_ARGUMENT, fn, a.name, " has rank ", a.rank, " but extent[", d,
           "] = ", a.t->extent[d], ", stride[", d, "] = ", a.t->stride[d],
           "; the entries past its rank must be 0");
  if (a.t->data == nullptr && !empty) fail(KFA_ERROR_NULL_POINTER, fn, a.name, ".data is NULL");
  return zero_strides;
}

/// The View data type of rank Rank: T*, T**, ...
template <class T, int Rank>
struct DataType {
  using type = typename DataType<T, Rank - 1>::type*;
};
template <class T>
struct DataType<T, 0> {
  using type = T;
};

/// The unmanaged View of a tensor: Layout is LayoutRight when every tensor of the call is
/// contiguous (the layout a C++ caller's Views have, so the same kernels run), LayoutStride
/// otherwise.
template <class T, int Rank, class Layout, class Mem>
using Unmanaged = Kokkos::View<typename DataType<T, Rank>::type, Layout, Mem,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T, int Rank, class Layout, class Mem>
Unmanaged<T, Rank, Layout, Mem> view_of(const kfa_tensor& t) {
  static_assert(Rank >= 1 && Rank <= 4, "kfa_tensor has at most 4 dimensions");
  using V = Unmanaged<T, Rank, Layout, Mem>;
  auto* data = static_cast<T*>(t.data);
  const auto e = [&](int d) { return static_cast<std::size_t>(t.extent[d]); };
  if constexpr (std::is_same_v<Layout, Kokkos::LayoutRight>) {
    if constexpr (Rank == 4)
      return V(data, e(0), e(1), e(2), e(3));
    else if constexpr (Rank == 3)
      return V(data, e(0), e(1), e(2));
    else if constexpr (Rank == 2)
      return V(data, e(0), e(1));
    else
      return V(data, e(0));
  } else {
    // Contiguous tensors of a strided call get their row-major strides.
    std::size_t s[4] = {};
    bool given = false;
    for (int d = 0; d < Rank; ++d)
      given = given || t.stride[d] != 0;
    std::size_t step = 1;
    for (int d = Rank - 1; d >= 0; --d) {
      s[d] = given ? static_cast<std::size_t>(t.stride[d]) : step;
      step *= e(d);
    }
    using L = Kokkos::LayoutStride;
    if constexpr (Rank == 4)
      return V(data, L(e(0), s[0], e(1), s[1], e(2), s[2], e(3), s[3]));
    else if constexpr (Rank == 3)
      return V(data, L(e(0), s[0], e(1), s[1], e(2), s[2]));
    else if constexpr (Rank == 2)
      return V(data, L(e(0), s[0], e(1), s[1]));
    else
      return V(data, L(e(0), s[0]));
  }
}

/// The checks common to every pass that only C can fail (Kokkos started, the tensors, the memory
/// flag); returns whether every tensor that sets the layout is contiguous.
inline bool check_call(const char* fn, std::initializer_list<Arg> args, int memory) {
  if (!Kokkos::is_initialized())
    fail(KFA_ERROR_NOT_INITIALIZED, fn, "Kokkos is not initialized: call kfa_initialize() first");
  bool contiguous = true;
  for (const Arg& a : args)
    if (a.rank > 0) {
      const bool c = check_tensor(fn, a);
      contiguous = contiguous && (c || !a.sets_layout);
    }
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

/// The params and tensors of a call, checked, and whatever `check` adds (it throws Failure);
/// then f(params, exec, memory space, layout). With sp (kfa::mpi), the checks are agreed across
/// sp->comm first, so a NULL pointer on one rank fails every rank's call instead of leaving the
/// others waiting in a collective.
template <class Check, class F>
void dispatch(const char* fn, const kfa_params* params, const SeqPar* sp,
              std::initializer_list<Arg> args, int memory, Check&& check, F&& f) {
  if (sp == nullptr) {
    const kfa::Params p = params_of(fn, params);
    const bool contiguous = check_call(fn, args, memory);
    check();
    return run(contiguous, memory, [&](auto... tags) { f(p, tags...); });
  }
#ifdef KFA_C_WITH_MPI
  kfa::Params p;
  bool contiguous = false;
  Failure local{KFA_OK, ""};
  try {
    p = params_of(fn, params);
    contiguous = check_call(fn, args, memory);
    check();
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

}  // namespace kfa::c_api
