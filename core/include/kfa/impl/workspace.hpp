#pragma once
/// \file impl/workspace.hpp
/// The memory of kfa's per-call temporaries (the backward's delta and float dQ accumulator,
/// the query pass's transposed K and V, split-KV's partials, the bf16 forward's V pair words,
/// kfa::mpi's exchange buffers), lent by a pool per memory space and kept between calls.
///
/// Why: Kokkos allocates a View with the memory space's allocator on every construction; on
/// CUDA (Kokkos 4.6 without MALLOC_ASYNC) that is cudaMalloc, and freeing is cudaFree, which
/// waits for the whole device. A backward that allocated its temporaries per call therefore
/// paid one to three allocations and a device-wide synchronisation every call; on the host,
/// large allocations are fresh pages faulted in each call.
///
/// The contract (kfa/workspace.hpp says it to users):
/// - A Temporary holds its memory from construction to destruction; no other Temporary gets
///   it meanwhile, in this thread or another (the pool's lock).
/// - Its destructor fences its execution space instance before the memory goes back, so that a
///   later call, on another instance too, never writes it while this call's kernels may still
///   read it. A call that used temporaries therefore returns after its kernels have finished,
///   as it did when their cudaFree waited for the device (now only its own instance waits).
/// - Idle memory stays in the pool until kfa::release_workspaces() or Kokkos::finalize (a
///   finalize hook) frees it; after that hook nothing is kept. KFA_WORKSPACE_CACHE=0 in the
///   environment (read once) frees each buffer when its Temporary ends, as before the pool.
/// - Only in steady state does a call allocate nothing: a first use, a larger request, a
///   release and every loan without the cache allocate or free (on CUDA a cudaMalloc or a
///   cudaFree, which waits for the device), under the pool's lock.
/// - The pool never hands out memory with contents a caller may rely on: every user writes its
///   temporary before reading it.

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kfa::impl {

/// Every pool made so far, as functions kfa::release_workspaces and kfa::workspace_bytes call,
/// and the Kokkos finalize hook that releases them. Never destroyed (static destruction may
/// run after Kokkos::finalize, when a View may no longer be freed; the hook has freed the
/// memory by then).
struct WorkspaceRegistry {
  /// One pool's functions.
  struct Pool {
    void (*release)();       ///< its release()
    std::size_t (*bytes)();  ///< its bytes()
  };
  std::mutex mutex;         ///< guards pools and hooked
  std::vector<Pool> pools;  ///< every pool made so far
  bool hooked = false;      ///< the finalize hook is registered
  /// The hook has run: from then on nothing is kept (a later finalize hook of the program
  /// that calls kfa, or a Kokkos initialised again, must not leave memory in the pools).
  std::atomic<bool> finalized{false};
  /// The process's registry.
  static WorkspaceRegistry& get() {
    static auto* registry = new WorkspaceRegistry;
    return *registry;
  }
  /// The pools, copied under the lock (a pool's functions take its own lock, not this one).
  std::vector<Pool> snapshot() {
    const std::lock_guard<std::mutex> lock(mutex);
    return pools;
  }
  /// Frees the idle memory of every pool.
  void release_all() {
    for (const Pool& p : snapshot())
      p.release();
  }
  /// Bytes held by every pool, idle or lent.
  std::size_t bytes_all() {
    std::size_t total = 0;
    for (const Pool& p : snapshot())
      total += p.bytes();
    return total;
  }
  /// Registers the finalize hook, once per process. It is never pushed from inside a
  /// finalize (Kokkos pops the hook it ran by position, so one pushed meanwhile would be
  /// popped in its place and the other run twice): after it has run, pools keep nothing.
  void ensure_hook() {
    const std::lock_guard<std::mutex> lock(mutex);
    if (hooked) return;
    hooked = true;
    Kokkos::push_finalize_hook([] {
      auto& r = WorkspaceRegistry::get();
      r.finalized = true;
      r.release_all();
    });
  }
};

/// Whether idle buffers are kept: KFA_WORKSPACE_CACHE unset or anything but "0".
inline bool workspace_cache_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KFA_WORKSPACE_CACHE");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

/// Buffers of bytes in MemorySpace, each lent to one holder at a time (see the file comment).
template <class MemorySpace>
class WorkspacePool {
 public:
  /// The pool of MemorySpace, made and registered on first use.
  static WorkspacePool& get() {
    static WorkspacePool* pool = [] {
      auto* p = new WorkspacePool;
      auto& r = WorkspaceRegistry::get();
      const std::lock_guard<std::mutex> lock(r.mutex);
      r.pools.push_back(
          {[] { WorkspacePool::get().release(); }, [] { return WorkspacePool::get().bytes(); }});
      return p;
    }();
    return *pool;
  }

  /// Lends a buffer of at least `bytes` (> 0): the smallest idle one that fits, else the
  /// largest idle one grown to `bytes` (freed first, so that the old and the new buffer are
  /// never both held), else a new one. Returns its slot, for give_back, and its address.
  std::size_t take(std::size_t bytes, void*& data) {
    WorkspaceRegistry::get().ensure_hook();
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t best = npos, largest = npos;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.busy) continue;
      if (s.buffer.size() >= bytes &&
          (best == npos || s.buffer.size() < slots_[best].buffer.size()))
        best = i;
      if (largest == npos || s.buffer.size() > slots_[largest].buffer.size()) largest = i;
    }
    if (best == npos) {
      if (largest == npos) {
        slots_.emplace_back();
        largest = slots_.size() - 1;
      }
      best = largest;
      slots_[best].buffer = buffer_t();  // the old buffer first
      slots_[best].buffer = buffer_t(
          Kokkos::view_alloc(std::string("kfa::workspace"), Kokkos::WithoutInitializing), bytes);
    }
    slots_[best].busy = true;
    data = slots_[best].buffer.data();
    return best;
  }

  /// Ends the loan of `slot`; its buffer is freed instead of kept after release() ran during
  /// the loan, when the cache is off, or after Kokkos' finalize hook.
  void give_back(std::size_t slot) {
    const std::lock_guard<std::mutex> lock(mutex_);
    Slot& s = slots_[slot];
    s.busy = false;
    if (s.drop || !workspace_cache_enabled() || WorkspaceRegistry::get().finalized)
      s.buffer = buffer_t();
    s.drop = false;
  }

  /// Frees the idle buffers now and the lent ones when they come back.
  void release() {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& s : slots_) {
      if (s.busy)
        s.drop = true;
      else
        s.buffer = buffer_t();
    }
  }

  /// Bytes held, idle or lent.
  std::size_t bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const Slot& s : slots_)
      total += s.buffer.size();
    return total;
  }

 private:
  using buffer_t = Kokkos::View<unsigned char*, MemorySpace>;
  static constexpr std::size_t npos = ~std::size_t(0);
  struct Slot {
    buffer_t buffer;
    bool busy = false;  // lent
    bool drop = false;  // free it when it comes back
  };
  WorkspacePool() = default;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;  // only grows: a slot's index stays valid while it is lent
};

/// A View of type ViewType (a LayoutRight or LayoutLeft View of a memory space that ExecSpace
/// can run in) on pooled memory, for the scope of one call: what `ViewType(view_alloc(label,
/// WithoutInitializing), n...)` gave before, without the allocation. Its contents are
/// undefined until written. The destructor fences `space` and returns the memory (see the file
/// comment).
template <class ViewType, class ExecSpace>
class Temporary {
 public:
  template <class... Extents>
  explicit Temporary(const ExecSpace& space, Extents... n) : space_(space) {
    const std::size_t bytes = ViewType::required_allocation_size(static_cast<std::size_t>(n)...);
    void* data = nullptr;
    if (bytes > 0) slot_ = pool().take(bytes, data);
    view_ = ViewType(static_cast<typename ViewType::pointer_type>(data),
                     static_cast<std::size_t>(n)...);
  }
  ~Temporary() {
    if (slot_ == npos) return;
    view_ = ViewType();
    space_.fence();
    pool().give_back(slot_);
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  /// The View (unmanaged: copies of it do not extend the loan).
  const ViewType& view() const { return view_; }

 private:
  static WorkspacePool<typename ViewType::memory_space>& pool() {
    return WorkspacePool<typename ViewType::memory_space>::get();
  }
  static constexpr std::size_t npos = ~std::size_t(0);
  ExecSpace space_;
  std::size_t slot_ = npos;
  ViewType view_;
};

}  // namespace kfa::impl
