#ifndef KFA_KFA_H
#define KFA_KFA_H
/// \file kfa.h
/// kfa's C interface: the forward and backward passes of kfa::forward and kfa::backward on
/// the caller's arrays, for C, Fortran (the `kfa` module wraps this header) and any language
/// with a C foreign-function interface. Link kfa::c (CMake) or `pkg-config --libs kfa`.
///
/// Every function returns a kfa_status; on anything but KFA_OK nothing has been written to any
/// output and kfa_last_error() says which argument was wrong and why (the message kfa::Error
/// carries in C++). No C++ exception leaves this library.

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// What a kfa function returns.
typedef enum kfa_status {
  KFA_OK = 0,                      ///< Success: the outputs hold the result.
  KFA_ERROR_INVALID_ARGUMENT = 1,  ///< A shape, stride or parameter kfa rejects (kfa::Error).
  KFA_ERROR_NULL_POINTER = 2,      ///< A tensor, its data, or the params pointer is NULL.
  KFA_ERROR_NOT_INITIALIZED = 3,   ///< Kokkos is not initialised: call kfa_initialize() first.
  KFA_ERROR_UNSUPPORTED = 4,       ///< Asked for something this build lacks (device memory).
  KFA_ERROR_OUT_OF_MEMORY = 5,     ///< A workspace could not be allocated.
  KFA_ERROR_INTERNAL = 6           ///< Any other failure (a bug: please report the message).
} kfa_status;

/// Where the diagonal of causal and window masks sits when seqlen_q != seqlen_k (kfa::Align).
typedef enum kfa_align {
  KFA_ALIGN_BOTTOM_RIGHT = 0,  ///< The last query sees the last key (flash-attn; the default).
  KFA_ALIGN_TOP_LEFT = 1       ///< Query i sees key j <= i (PyTorch SDPA's is_causal).
} kfa_align;

/// How the backward computes dQ: the `dq_mode` field of kfa_params (kfa::DqMode).
typedef enum kfa_dq_mode {
  KFA_DQ_AUTO = 0,        ///< Atomics where they are cheap, the query pass where asked to repeat.
  KFA_DQ_ATOMIC = 1,      ///< Atomic adds from the key-tile teams (FlashAttention-2).
  KFA_DQ_QUERY_PASS = 2,  ///< A second, query-outer pass: no atomics, bitwise repeatable.
  KFA_DQ_SYMMETRIC = 3    ///< One kernel for self-attention: no atomics, bitwise repeatable.
} kfa_dq_mode;

/// Where the tensors of one call live: the `memory` argument of the passes (an int, so that any
/// value a caller passes is defined; others are rejected).
typedef enum kfa_memory {
  KFA_MEMORY_HOST = 0,   ///< Host memory: the pass runs on Kokkos' default host space.
  KFA_MEMORY_DEVICE = 1  ///< Memory of Kokkos' default device space (builds with one only).
} kfa_memory;

/// The options of a pass: kfa::Params field for field (see its documentation for what each
/// means); start from kfa_params_default(). Booleans are ints (0 false, anything else true)
/// so that Fortran and other languages map the struct without a C bool.
typedef struct kfa_params {
  double scale;       ///< Multiplies Q K^T; < 0 means 1/sqrt(head_dim). Must be finite.
  int causal;         ///< Causal mask.
  int align;          ///< A kfa_align value.
  int window_left;    ///< Keys visible left of the diagonal; -1 unbounded.
  int window_right;   ///< Keys visible right of the diagonal; -1 unbounded.
  double softcap;     ///< S <- softcap * tanh(S / softcap); 0 turns it off.
  double dropout;     ///< Dropout probability in [0, 1).
  uint64_t seed;      ///< Dropout seed.
  uint64_t offset;    ///< Dropout stream.
  int deterministic;  ///< Backward without atomics, bitwise repeatable.
  int num_splits;     ///< Forward split-KV chunks: 0 lets kfa choose, 1 never splits.
  int dq_mode;        ///< A kfa_dq_mode value (backward).
} kfa_params;

/// One tensor: a pointer to its first element, its extents in the order
/// (batch, heads, seqlen, head_dim) and the distance in elements between consecutive indices
/// of each dimension. Strides all 0 mean row-major and contiguous (head_dim fastest); otherwise
/// they are used as given, so (batch, seqlen, heads, head_dim) storage is passed without a copy
/// as strides {seqlen*heads*head_dim, head_dim, heads*head_dim, 1}. head_dim's stride must be 1.
/// lse and dlse are (batch, heads, seqlen): extent[3] and stride[3] are ignored.
/// data may be NULL only for a tensor with no elements.
typedef struct kfa_tensor {
  void* data;         ///< First element (const for inputs: kfa never writes through it).
  int64_t extent[4];  ///< (batch, heads, seqlen, head_dim).
  int64_t stride[4];  ///< In elements; all 0 = contiguous row-major.
} kfa_tensor;

/// How kfa::mpi splits the sequence across ranks (kfa::mpi::Layout).
typedef enum kfa_mpi_layout {
  KFA_MPI_LAYOUT_CONTIGUOUS = 0,  ///< One block of rows per rank.
  KFA_MPI_LAYOUT_ZIGZAG = 1       ///< Chunks r and 2P - 1 - r of 2P chunks (balances causal).
} kfa_mpi_layout;

/// How kfa::mpi's partial results meet (kfa::mpi::Mode).
typedef enum kfa_mpi_mode {
  KFA_MPI_MODE_RING = 0,  ///< K/V shards travel around the ring.
  KFA_MPI_MODE_TREE = 1   ///< Queries gathered, partials reduce-scattered.
} kfa_mpi_mode;

/// The distributed problem of the kfa_mpi_ functions (kfa::mpi::SeqPar): every rank passes
/// the same values.
typedef struct kfa_seqpar {
  int64_t seqlen_q;  ///< Global number of queries.
  int64_t seqlen_k;  ///< Global number of keys.
  /// The communicator's Fortran handle (an MPI_Fint): MPI_Comm_c2f(comm) in C, the integer
  /// communicator in Fortran (comm%MPI_VAL with mpi_f08). Keeps this header free of mpi.h.
  int comm;
  int layout;  ///< A kfa_mpi_layout value.
  int mode;    ///< A kfa_mpi_mode value.
} kfa_seqpar;

/// The defaults of kfa::Params (scale 1/sqrt(head_dim), no mask, no dropout).
kfa_params kfa_params_default(void);

/// A contiguous row-major (batch, heads, seqlen, head_dim) tensor at data.
kfa_tensor kfa_tensor_contiguous(void* data, int64_t batch, int64_t heads, int64_t seqlen,
                                 int64_t head_dim);

/// Initialises Kokkos with its defaults when nobody has (a program that initialises Kokkos
/// itself may skip this; kfa then leaves Kokkos to it). Call from one thread, before any pass.
/// Fails with KFA_ERROR_UNSUPPORTED after kfa_finalize: Kokkos cannot start twice.
kfa_status kfa_initialize(void);

/// Finalises Kokkos if kfa_initialize initialised it; otherwise does nothing.
kfa_status kfa_finalize(void);

/// The message of the last call on this thread that failed, or "" when the last call
/// succeeded. Valid until this thread's next kfa call.
const char* kfa_last_error(void);

/// Forward pass in float: o and lse from q, k, v (kfa::forward).
/// q: (B, Hq, Nq, D); k, v: (B, Hk, Nk, D) with Hq a multiple of Hk; o: like q;
/// lse: (B, Hq, Nq). memory: a kfa_memory value. Returns when the results are written.
kfa_status kfa_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory);

/// kfa_forward_f32 in double (lse in double too).
kfa_status kfa_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                           const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                           int memory);

/// Backward pass in float: dq, dk, dv from the forward's q, k, v, o, lse and dout = dL/dO
/// (kfa::backward). dlse = dL/dLSE, shaped like lse, may be NULL (no loss through the LSE).
/// dq like q; dk and dv like k. params: the forward's.
kfa_status kfa_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory);

/// kfa_backward_f32 in double.
kfa_status kfa_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                            const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                            const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                            const kfa_tensor* dv, const kfa_params* params, int memory);

/// Sequence-parallel forward in float (kfa::mpi::forward): each rank passes its rows
/// (kfa::mpi::owned_rows of seqpar's layout) of q, k and v and receives its rows of o and lse.
/// Collective over seqpar->comm; an invalid argument on any rank fails every rank's call (with
/// the message of the lowest failing rank). Returns KFA_ERROR_UNSUPPORTED when kfa was built
/// without MPI.
kfa_status kfa_mpi_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory);

/// kfa_mpi_forward_f32 in double.
kfa_status kfa_mpi_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                               const kfa_tensor* o, const kfa_tensor* lse, const kfa_params* params,
                               const kfa_seqpar* seqpar, int memory);

/// Sequence-parallel backward in float (kfa::mpi::backward), on each rank's rows, collective as
/// kfa_mpi_forward_f32; dlse may be NULL.
kfa_status kfa_mpi_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory);

/// kfa_mpi_backward_f32 in double.
kfa_status kfa_mpi_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                const kfa_tensor* dv, const kfa_params* params,
                                const kfa_seqpar* seqpar, int memory);

#ifdef __cplusplus
}
#endif

#endif /* KFA_KFA_H */
