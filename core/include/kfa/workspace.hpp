#pragma once
/// \file workspace.hpp
/// The memory kfa keeps between calls for its temporaries.
///
/// Some calls need memory of their own besides the arrays they are given: the backward's row
/// statistic delta (B x Hq x Nq accumulators), with 16-bit inputs on the atomic dQ path a float
/// copy of dQ, in the query pass (DqMode::query_pass) transposed copies of K and V, with
/// split-KV the partial results of the chunks, and in a bfloat16 forward on a host with pair
/// products (AVX-512 BF16) V's rows as pair words (the size of V). kfa takes that memory from
/// a pool per memory space and keeps it when the call ends, so that the next call of the same
/// or a smaller size allocates nothing: on CUDA an allocation is a cudaMalloc and a free is a
/// cudaFree, which waits for the whole device.
///
/// - A call that used such memory returns after its own kernels have finished (it fences its
///   execution space instance before the memory goes back to the pool). In steady state other
///   calls do not wait for it; a first use, a larger request or a release allocates or frees
///   (on CUDA: waits for the device). Calls from several threads at once each get memory of
///   their own.
/// - The pool grows to the largest sizes used (and to one buffer per temporary in use at the
///   same time) and holds that until kfa::release_workspaces() or Kokkos::finalize().
/// - `KFA_WORKSPACE_CACHE=0` in the environment frees each buffer at the end of its call
///   instead (read once per process).
/// The dense bias's gradient buffer (B x Hq x Nq x Nk, `kfa::masks::Bias` with dbias) is not
/// pooled: it is allocated and freed per backward, as a buffer quadratic in the sequence length
/// should not outlive its call. Nor are those of kfa::nn and kfa::layer_norm. kfa::mpi takes
/// all of its per-call buffers from the pool (the ring's K/V and dK/dV shards and block results,
/// the tree's gathered and packed rows and partials, delta, and the passes it runs on its
/// blocks), except, on a device, the host copies that stage its messages.

#include <kfa/impl/workspace.hpp>

#include <cstddef>

namespace kfa {

/// Bytes of memory (all memory spaces together) kfa holds for its temporaries, lent or idle.
inline std::size_t workspace_bytes() {
  return impl::WorkspaceRegistry::get().bytes_all();
}

/// Frees the memory kfa holds for its temporaries now; memory lent to a call still running is
/// freed when that call ends. Thread-safe; Kokkos::finalize does it too.
inline void release_workspaces() {
  impl::WorkspaceRegistry::get().release_all();
}

}  // namespace kfa
