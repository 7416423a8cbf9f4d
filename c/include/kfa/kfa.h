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

/// The kinds of score term a kfa_term describes (kfa/masks.hpp in C++).
typedef enum kfa_term_kind {
  KFA_TERM_NONE = 0,         ///< No term: the pass of the functions without one.
  KFA_TERM_MASK = 1,         ///< A boolean mask: key j visible to query i iff mask != 0.
  KFA_TERM_KEY_PADDING = 2,  ///< Key lengths per batch: key j of batch b visible iff j < len[b].
  KFA_TERM_BIAS = 3,         ///< An additive bias, with its gradient in the backward if asked.
  KFA_TERM_ALIBI = 4         ///< ALiBi: bias -slope[h] |i + shift - j|, shift the masks' diagonal.
} kfa_term_kind;

/// The integer type of key lengths: the `lengths_type` field of kfa_term.
typedef enum kfa_index_type {
  KFA_INT32 = 0,  ///< int32_t lengths (the default of a zero-initialised kfa_term).
  KFA_INT64 = 1   ///< int64_t lengths.
} kfa_index_type;

/// One term of the score besides the masks of kfa_params (kfa::masks::Dense, KeyPadding, Bias,
/// Alibi): S = softcap(scale Q K^T) + bias, then the masks. Build it with kfa_term_mask,
/// kfa_term_key_padding, kfa_term_bias or kfa_term_alibi, or zero-initialise it and set the
/// fields. Its tensors live where the call's memory argument says, like q.
///
/// - KFA_TERM_MASK: `values` holds uint8_t, extents (B or 1, Hq or 1, Nq, Nk): an extent of 1
///   broadcasts over that dimension; any strides, but unit stride along Nk.
/// - KFA_TERM_KEY_PADDING: `values` holds B lengths (extent[0] = B, stride[0], the others
///   unused and 0), each in [0, Nk], of the type `lengths_type` names.
/// - KFA_TERM_BIAS: `values` holds the pass's type (float for _f32, double for _f64), extents
///   (B or 1, Hq or 1, Nq, Nk) as a mask's. `dbias`, shaped like the bias, is the backward's
///   output dL/dbias (summed over the broadcast dimensions, written, not added to, bitwise
///   repeatable); its data NULL means no gradient. The forward ignores it, so one kfa_term
///   serves both passes.
/// - KFA_TERM_ALIBI: `values` holds Hq slopes of the pass's type (extent[0] = Hq, stride[0]).
///
/// A row left with no visible key gets o = 0, lse = -inf and no gradient. What a kind does not
/// read must stay zero (values.data of KFA_TERM_NONE, dbias.data of any kind but a bias,
/// lengths_type of any kind but key padding, the entries past extent[0] and stride[0] of
/// lengths and slopes): a call rejects it rather than ignore it.
typedef struct kfa_term {
  int kind;           ///< A kfa_term_kind value.
  kfa_tensor values;  ///< The mask, lengths, bias or slopes.
  kfa_tensor dbias;   ///< KFA_TERM_BIAS only: the backward's dL/dbias; data NULL for none.
  int lengths_type;   ///< KFA_TERM_KEY_PADDING only: a kfa_index_type value.
} kfa_term;

/// The defaults of kfa::Params (scale 1/sqrt(head_dim), no mask, no dropout).
kfa_params kfa_params_default(void);

/// A contiguous row-major (batch, heads, seqlen, head_dim) tensor at data.
kfa_tensor kfa_tensor_contiguous(void* data, int64_t batch, int64_t heads, int64_t seqlen,
                                 int64_t head_dim);

/// A boolean mask term: mask is (B or 1, Hq or 1, Nq, Nk) of uint8_t (see kfa_term).
kfa_term kfa_term_mask(kfa_tensor mask);

/// A key padding term: batch lengths at `lengths`, int32_t or int64_t as lengths_type says
/// (a kfa_index_type value), contiguous.
kfa_term kfa_term_key_padding(const void* lengths, int64_t batch, int lengths_type);

/// A bias term: bias (B or 1, Hq or 1, Nq, Nk) of the pass's type; dbias shaped like it, or a
/// tensor with NULL data for no gradient (see kfa_term).
kfa_term kfa_term_bias(kfa_tensor bias, kfa_tensor dbias);

/// An ALiBi term: heads_q slopes of the pass's type at `slopes`, contiguous.
kfa_term kfa_term_alibi(const void* slopes, int64_t heads_q);

/// Initialises Kokkos with its defaults when nobody has (a program that initialises Kokkos
/// itself may skip this; kfa then leaves Kokkos to it). Call from one thread, before any pass.
/// Fails with KFA_ERROR_UNSUPPORTED after kfa_finalize: Kokkos cannot start twice.
kfa_status kfa_initialize(void);

/// Finalises Kokkos if kfa_initialize initialised it; otherwise does nothing.
kfa_status kfa_finalize(void);

/// The message of the last call on this thread that failed, or "" when the last call
/// succeeded. Valid until this thread's next kfa call.
const char* kfa_last_error(void);

/// Frees the memory kfa keeps between passes for their temporaries (kfa::release_workspaces
/// in <kfa/workspace.hpp>: the backward's delta, the query pass's transposed K and V, split-KV
/// partials); the next pass that needs some allocates it again. Finalising Kokkos frees it too.
kfa_status kfa_release_workspaces(void);

/// Bytes kfa holds for those temporaries now (kfa::workspace_bytes), or -1 on failure.
int64_t kfa_workspace_bytes(void);

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

/// kfa_forward_f32 with a score term (kfa::forward with a kfa/masks.hpp object); term NULL or
/// of kind KFA_TERM_NONE is kfa_forward_f32 itself. The term is checked against q and k before
/// any kernel runs (a shape that does not fit, lengths outside [0, Nk], ...).
kfa_status kfa_forward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse,
                                const kfa_params* params, const kfa_term* term, int memory);

/// kfa_forward_term_f32 in double (bias and slopes in double too).
kfa_status kfa_forward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                const kfa_tensor* o, const kfa_tensor* lse,
                                const kfa_params* params, const kfa_term* term, int memory);

/// kfa_backward_f32 with the forward's score term; a bias term's dbias, when its data is not
/// NULL, receives dL/dbias.
kfa_status kfa_backward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                 const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                 const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                 const kfa_tensor* dv, const kfa_params* params,
                                 const kfa_term* term, int memory);

/// kfa_backward_term_f32 in double.
kfa_status kfa_backward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                 const kfa_tensor* o, const kfa_tensor* lse, const kfa_tensor* dout,
                                 const kfa_tensor* dlse, const kfa_tensor* dq, const kfa_tensor* dk,
                                 const kfa_tensor* dv, const kfa_params* params,
                                 const kfa_term* term, int memory);

/// kfa_mpi_forward_f32 with a score term (kfa::mpi::forward with one): the term is the WHOLE
/// problem's on every rank, at global positions (a bias or mask of the global Nq and Nk), with
/// the same kind and extents on every rank.
kfa_status kfa_mpi_forward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                    const kfa_tensor* o, const kfa_tensor* lse,
                                    const kfa_params* params, const kfa_term* term,
                                    const kfa_seqpar* seqpar, int memory);

/// kfa_mpi_forward_term_f32 in double.
kfa_status kfa_mpi_forward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                    const kfa_tensor* o, const kfa_tensor* lse,
                                    const kfa_params* params, const kfa_term* term,
                                    const kfa_seqpar* seqpar, int memory);

/// kfa_mpi_backward_f32 with the forward's score term: a bias term's dbias (every rank passes
/// one, or none) receives the whole dL/dbias on every rank.
kfa_status kfa_mpi_backward_term_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                     const kfa_tensor* o, const kfa_tensor* lse,
                                     const kfa_tensor* dout, const kfa_tensor* dlse,
                                     const kfa_tensor* dq, const kfa_tensor* dk,
                                     const kfa_tensor* dv, const kfa_params* params,
                                     const kfa_term* term, const kfa_seqpar* seqpar, int memory);

/// kfa_mpi_backward_term_f32 in double.
kfa_status kfa_mpi_backward_term_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                     const kfa_tensor* o, const kfa_tensor* lse,
                                     const kfa_tensor* dout, const kfa_tensor* dlse,
                                     const kfa_tensor* dq, const kfa_tensor* dk,
                                     const kfa_tensor* dv, const kfa_params* params,
                                     const kfa_term* term, const kfa_seqpar* seqpar, int memory);

/// Forward pass in float over a batch of sequences packed without padding (kfa::varlen::forward,
/// flash-attn's varlen interface). q and o: (total_q, Hq, D); k, v: (total_k, Hk, D), as
/// kfa_tensors whose extent[3] and stride[3] are unused (0); lse: (Hq, total_q), extent[2..3]
/// unused. cu_seqlens_q and cu_seqlens_k: B + 1 int32_t offsets each (extent[0] = B + 1),
/// non-decreasing from 0 to total_q and total_k: sequence s has the query rows
/// [cu_seqlens_q[s], cu_seqlens_q[s+1]) and the key rows [cu_seqlens_k[s], cu_seqlens_k[s+1]),
/// and is its own attention problem (masks aligned to its own lengths; a length may be 0). The
/// offsets are read on the host before any kernel runs. No score terms here.
kfa_status kfa_varlen_forward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                  const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                  const kfa_tensor* o, const kfa_tensor* lse,
                                  const kfa_params* params, int memory);

/// kfa_varlen_forward_f32 in double (lse in double too).
kfa_status kfa_varlen_forward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                  const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                  const kfa_tensor* o, const kfa_tensor* lse,
                                  const kfa_params* params, int memory);

/// Backward pass in float over packed sequences (kfa::varlen::backward): dq like q, dk and dv
/// like k, from the forward's tensors, dout (like q) and dlse ((Hq, total_q), may be NULL).
kfa_status kfa_varlen_backward_f32(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                   const kfa_tensor* o, const kfa_tensor* lse,
                                   const kfa_tensor* dout, const kfa_tensor* dlse,
                                   const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                   const kfa_tensor* dq, const kfa_tensor* dk, const kfa_tensor* dv,
                                   const kfa_params* params, int memory);

/// kfa_varlen_backward_f32 in double.
kfa_status kfa_varlen_backward_f64(const kfa_tensor* q, const kfa_tensor* k, const kfa_tensor* v,
                                   const kfa_tensor* o, const kfa_tensor* lse,
                                   const kfa_tensor* dout, const kfa_tensor* dlse,
                                   const kfa_tensor* cu_seqlens_q, const kfa_tensor* cu_seqlens_k,
                                   const kfa_tensor* dq, const kfa_tensor* dk, const kfa_tensor* dv,
                                   const kfa_params* params, int memory);

#ifdef __cplusplus
}
#endif

#endif /* KFA_KFA_H */
