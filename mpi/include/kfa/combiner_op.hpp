#pragma once
/// \file combiner_op.hpp
/// Any member of the combiner family (kfa/combiners.hpp: Softmax, MultiScale, Welford,
/// LogSoftmax, or a user's type with state_type, identity() and join()) as an MPI reduction
/// (target kfa::mpi). A code that keeps one partial per row on each rank (softmax statistics
/// of a sharded row, a layer norm's moments over a sharded feature axis) merges them across
/// ranks with one MPI_Allreduce or MPI_Reduce:
/// \code
///   kfa::mpi::CombinerOp<kfa::combiners::Welford<double>> op;
///   MPI_Allreduce(MPI_IN_PLACE, moments.data(), n, op.type(), op.op(), comm);
///   // or: kfa::mpi::allreduce<kfa::combiners::Welford<double>>(moments.data(), n, comm);
/// \endcode
/// The operation is registered non-commutative, so MPI applies the join in rank order: the
/// result is the same on every run and every rank, and equals a left-to-right merge of the
/// ranks' partials (within the join's rounding when MPI groups them differently). The state
/// travels as raw bytes, which is why it must be trivially copyable; all ranks must run the
/// same binary (the same layout of state_type).

#include <kfa/combiners.hpp>

#include <mpi.h>

#include <type_traits>

namespace kfa::mpi {

/// C's state as an MPI datatype and C::join as an MPI_Op, both freed by the destructor (before
/// MPI_Finalize). Not copyable: it owns the two MPI handles.
template <class C>
class CombinerOp {
 public:
  using state_type = typename C::state_type;  ///< one partial result
  static_assert(std::is_trivially_copyable_v<state_type>,
                "kfa::mpi::CombinerOp: the combiner's state travels as bytes");

  /// Creates and commits the datatype (sizeof(state_type) bytes) and creates the operation.
  CombinerOp() {
    MPI_Type_contiguous(static_cast<int>(sizeof(state_type)), MPI_BYTE, &type_);
    MPI_Type_commit(&type_);
    MPI_Op_create(&apply, /*commute=*/0, &op_);
  }
  ~CombinerOp() {
    MPI_Op_free(&op_);
    MPI_Type_free(&type_);
  }
  CombinerOp(const CombinerOp&) = delete;
  CombinerOp& operator=(const CombinerOp&) = delete;

  /// The datatype of one partial.
  MPI_Datatype type() const { return type_; }
  /// The reduction: inout <- in (+) inout, `in` holding the lower ranks' partials.
  MPI_Op op() const { return op_; }

 private:
  static void apply(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
    const auto* a = static_cast<const state_type*>(in);
    auto* b = static_cast<state_type*>(inout);
    for (int i = 0; i < *len; ++i) {
      state_type lower = a[i];
      C::join(lower, b[i]);
      b[i] = lower;
    }
  }

  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op op_ = MPI_OP_NULL;
};

/// Merges the `n` partials at `inout` (host memory) of every rank of `comm` in rank order and
/// leaves the result on every rank (MPI_Allreduce in place with CombinerOp<C>).
template <class C>
void allreduce(typename C::state_type* inout, int n, MPI_Comm comm) {
  const CombinerOp<C> op;
  MPI_Allreduce(MPI_IN_PLACE, inout, n, op.type(), op.op(), comm);
}

}  // namespace kfa::mpi
