#pragma once
/// \file impl/mpi/comm.hpp
/// kfa::mpi's messages: point-to-point buffers staged through the host where MPI cannot read
/// the memory space (portable without a GPU-aware MPI; the staging copies are synchronous),
/// the tree mode's collectives on packed rows, the reduction operators, and the timing of MPI.

#include <kfa/combine.hpp>
#include <kfa/impl/workspace.hpp>
#include <kfa/seqpar.hpp>

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfa::mpi::impl {

/// This rank and the number of ranks of comm (0 and 1 for MPI_COMM_NULL, which the collective
/// check then refuses).
struct Ranks {
  int rank = 0, size = 1;
};
inline Ranks ranks_of(MPI_Comm comm) {
  Ranks r;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &r.rank);
    MPI_Comm_size(comm, &r.size);
  }
  return r;
}

/// Adds the wall time of its scope to *sink (nothing when sink is null).
class Meter {
 public:
  explicit Meter(double* sink) : sink_(sink), t0_(sink ? MPI_Wtime() : 0) {}
  ~Meter() {
    if (sink_) *sink_ += MPI_Wtime() - t0_;
  }
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

 private:
  double* sink_;
  double t0_;
};

/// Where a Meter of a pass's MPI time adds; fences `space` first when measuring, so that
/// kernels still running are not booked as communication.
template <class ExecSpace>
double* comm_sink(const ExecSpace& space, const SeqPar& sp) {
  if (!sp.timings) return nullptr;
  space.fence();
  return &sp.timings->comm_s;
}
inline double* total_sink(const SeqPar& sp) {
  return sp.timings ? &sp.timings->total_s : nullptr;
}

/// MPI_Waitall on n requests, booked as MPI time.
template <class ExecSpace>
void wait_all(const ExecSpace& space, const SeqPar& sp, int n, MPI_Request* reqs) {
  const Meter m(comm_sink(space, sp));
  MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
}

template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "float or double");
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// A flat buffer seen as (B, H, rows, D) tensors, for the messages.
template <class T, class Mem>
struct Flat {
  Kokkos::View<T*, Mem> data;
  using tensor = Kokkos::View<T****, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged>;
  tensor at(std::size_t offset, std::size_t b, std::size_t h, std::size_t rows,
            std::size_t d) const {
    return tensor(data.data() + offset, b, h, rows, d);
  }
};

/// MPI send/receive of a contiguous device or host buffer; staged through the host when MPI
/// cannot read the memory space.
template <class T, class Mem>
struct Channel {
  static constexpr bool host_ok = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  Kokkos::View<T*, Kokkos::HostSpace> send_stage, recv_stage;

  void isend(const Kokkos::View<T*, Mem>& buf, std::size_t n, int to, int tag, MPI_Comm comm,
             MPI_Request* req) {
    const T* p = buf.data();
    if constexpr (!host_ok) {
      if (send_stage.extent(0) < n) send_stage = decltype(send_stage)("kfa::mpi::send", n);
      Kokkos::deep_copy(Kokkos::subview(send_stage, std::make_pair(std::size_t(0), n)),
                        Kokkos::subview(buf, std::make_pair(std::size_t(0), n)));
      p = send_stage.data();
    }
    MPI_Isend(p, static_cast<int>(n), mpi_type<T>(), to, tag, comm, req);
  }
  void irecv(const Kokkos::View<T*, Mem>& buf, std::size_t n, int from, int tag, MPI_Comm comm,
             MPI_Request* req) {
    T* p = buf.data();
    if constexpr (!host_ok) {
      if (recv_stage.extent(0) < n) recv_stage = decltype(recv_stage)("kfa::mpi::recv", n);
      p = recv_stage.data();
    }
    MPI_Irecv(p, static_cast<int>(n), mpi_type<T>(), from, tag, comm, req);
  }
  /// After the receive completed: moves staged data into buf.
  void finish_recv(const Kokkos::View<T*, Mem>& buf, std::size_t n) {
    if constexpr (!host_ok)
      Kokkos::deep_copy(Kokkos::subview(buf, std::make_pair(std::size_t(0), n)),
                        Kokkos::subview(recv_stage, std::make_pair(std::size_t(0), n)));
    (void)buf;
    (void)n;
  }
};

/// Rows of W values per (row, b, h), packed row-outermost as (rows, B, H, W) so that each
/// rank's rows are one contiguous message.
template <class T, class Mem>
using Packed = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;

/// Every rank's packed rows into `all` ((sum of rows, B, H, W)), in rank order
/// (MPI_Allgatherv; staged through the host where Mem is not host memory). `rows`: each rank's
/// row count, `mine` this rank's (rows[rank], B, H, W).
template <class T, class Mem>
void allgather_rows(const Packed<T, Mem>& mine, const Packed<T, Mem>& all,
                    const std::vector<int>& rows, const SeqPar& sp) {
  MPI_Comm comm = sp.comm;
  const int P = int(rows.size());
  const int per_row = int(mine.extent(1) * mine.extent(2) * mine.extent(3));
  std::vector<int> counts(P), offs(P);
  for (int r = 0, off = 0; r < P; ++r) {
    counts[r] = rows[r] * per_row;
    offs[r] = off;
    off += counts[r];
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // In host memory the mirrors are the views themselves, and the copies do nothing.
  auto host_mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mine);
  auto host_all = Kokkos::create_mirror_view(all);
  {
    const Meter m(comm_sink(Kokkos::DefaultHostExecutionSpace(), sp));
    MPI_Allgatherv(host_mine.data(), counts[rank], mpi_type<T>(), host_all.data(), counts.data(),
                   offs.data(), mpi_type<T>(), comm);
  }
  Kokkos::deep_copy(all, host_all);
}

/// This rank's rows of the reduction over ranks of `all` (every rank's packed rows, in rank
/// order) with `op`, into `mine` ((rows[rank], B, H, W)), staged through the host where Mem is
/// not host memory. With whole_rows the op sees rows of W values as one element (the
/// combiner); otherwise single values (a sum, which MPI's built-in ops allow on the base type
/// only). Point to point rather than MPI_Reduce_scatter: each rank sends every other rank its
/// rows and applies op to what it receives (MPI_Reduce_local) in rank order, b_0 op (b_1 op
/// (... op b_{P-1})), the same on every run. Open MPI reduces a non-commutative op (the
/// combiner) on one rank and scatters the result, which kept 12-29 % of a 2-rank tree forward
/// inside MPI (perf/results/2026-12-07-seqpar-zen5.md); the receive buffers are pooled.
template <class T, class Mem>
void reduce_scatter_rows(const Packed<T, Mem>& all, const Packed<T, Mem>& mine,
                         const std::vector<int>& rows, MPI_Op op, bool whole_rows,
                         const SeqPar& sp) {
  MPI_Comm comm = sp.comm;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int P = int(rows.size());
  const std::size_t B = all.extent(1), H = all.extent(2), W = all.extent(3);
  MPI_Datatype type = mpi_type<T>();
  if (whole_rows) {
    MPI_Type_contiguous(int(W), mpi_type<T>(), &type);
    MPI_Type_commit(&type);
  }
  // Elements (of `type`) and values per row of the packed layout, and each rank's first row.
  const std::size_t per_row = B * H * (whole_rows ? 1 : W), values_per_row = B * H * W;
  std::vector<std::size_t> first(P + 1, 0);
  for (int r = 0; r < P; ++r)
    first[r + 1] = first[r] + std::size_t(rows[r]);
  auto host_all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all);
  auto host_mine = Kokkos::create_mirror_view(mine);
  const std::size_t n = std::size_t(rows[rank]) * values_per_row;  // values of this rank's rows
  using HostBuffer = Kokkos::View<T*, Kokkos::HostSpace>;
  const kfa::impl::Temporary<HostBuffer, Kokkos::DefaultHostExecutionSpace> received(
      Kokkos::DefaultHostExecutionSpace(), n * std::size_t(P > 1 ? P - 1 : 0));
  {
    const Meter m(comm_sink(Kokkos::DefaultHostExecutionSpace(), sp));
    constexpr int tag = 30011;  // apart from the ring's tags (2 s and 2 s + 1 for step s)
    std::vector<MPI_Request> req;
    req.reserve(2 * std::size_t(P));
    // Slot of rank s's rows in `received`: ranks other than this one, in rank order.
    const auto slot = [&](int s) {
      return received.view().data() + n * std::size_t(s < rank ? s : s - 1);
    };
    for (int s = 0; s < P && rows[rank] > 0; ++s) {  // as the senders' test below
      if (s == rank) continue;
      req.emplace_back();
      MPI_Irecv(slot(s), int(std::size_t(rows[rank]) * per_row), type, s, tag, comm, &req.back());
    }
    for (int s = 0; s < P; ++s) {
      if (s == rank || rows[s] == 0) continue;
      req.emplace_back();
      MPI_Isend(host_all.data() + first[s] * values_per_row, int(std::size_t(rows[s]) * per_row),
                type, s, tag, comm, &req.back());
    }
    MPI_Waitall(int(req.size()), req.data(), MPI_STATUSES_IGNORE);
    // b_0 op (b_1 op (... op b_{P-1})): MPI_Reduce_local(in, inout) makes inout = in op inout.
    const auto block = [&](int s) -> const T* {
      return s == rank ? host_all.data() + first[rank] * values_per_row : slot(s);
    };
    if (n > 0) {
      std::copy(block(P - 1), block(P - 1) + n, host_mine.data());
      for (int s = P - 2; s >= 0; --s)
        MPI_Reduce_local(block(s), host_mine.data(), int(std::size_t(rows[rank]) * per_row), type,
                         op);
    }
  }
  if (whole_rows) MPI_Type_free(&type);
  Kokkos::deep_copy(mine, host_mine);
}

/// x (a rank-4 view of float or double, any layout and space) summed elementwise over the
/// ranks of sp.comm, in place on every rank, through host doubles and in pieces that MPI's int
/// counts hold. The caller sums values that are nonzero on one rank at most (dbias: each (i, j)
/// is one rank's), so every sum is exact and the same on every rank, whatever MPI's order.
template <class ExecSpace, class View>
void sum_over_ranks(const ExecSpace& space, const View& x, const SeqPar& sp) {
  using V = typename View::non_const_value_type;
  static_assert(View::rank == 4 && (std::is_same_v<V, float> || std::is_same_v<V, double>),
                "kfa::mpi: dbias must be a rank-4 View of float or double");
  space.fence();
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  std::vector<double> buf;
  buf.reserve(x.size());
  auto each = [&](auto&& f) {
    for (std::size_t b = 0; b < h.extent(0); ++b)
      for (std::size_t g = 0; g < h.extent(1); ++g)
        for (std::size_t i = 0; i < h.extent(2); ++i)
          for (std::size_t j = 0; j < h.extent(3); ++j)
            f(h(b, g, i, j));
  };
  each([&](const V& e) { buf.push_back(static_cast<double>(e)); });
  {
    const Meter m(comm_sink(space, sp));
    constexpr std::size_t piece = std::size_t(1) << 30;
    for (std::size_t at = 0; at < buf.size(); at += piece)
      MPI_Allreduce(MPI_IN_PLACE, buf.data() + at,
                    static_cast<int>(std::min(piece, buf.size() - at)), MPI_DOUBLE, MPI_SUM,
                    sp.comm);
  }
  std::size_t at = 0;
  each([&](V& e) { e = static_cast<V>(buf[at++]); });
  Kokkos::deep_copy(x, h);
}

/// inout <- in + inout elementwise, as a non-commutative MPI_Op: the sum in rank order, the
/// same on every run (for params.deterministic).
template <class T>
void sum_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const long long n = static_cast<long long>(*len) * (bytes / int(sizeof(T)));
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (long long i = 0; i < n; ++i)
    b[i] = a[i] + b[i];
}

/// Rule R's join (impl/mpi/rules.hpp) as an MPI_Op on normalised rows [s, O_0 .. O_{D-1}] of
/// T, s the row statistic (D from the datatype's size): inout <- join(in, inout). Registered
/// non-commutative, so MPI applies it in rank order and the result is the same on every run.
template <class R, class T>
void combine_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const int w = bytes / int(sizeof(T)), D = w - 1;
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int r = 0; r < *len; ++r, a += w, b += w) {
    const auto j = R::template join<T>(a[0], b[0]);
    for (int d = 1; d <= D; ++d)
      b[d] = (j.wa * a[d] + j.wb * b[d]) * j.inv;
    b[0] = j.stat;
  }
}

/// A non-commutative user-defined MPI_Op for the lifetime of a scope, or MPI_SUM when `fn` is
/// null.
class ScopedOp {
 public:
  explicit ScopedOp(MPI_User_function* fn) : owned_(fn != nullptr) {
    if (owned_) MPI_Op_create(fn, /*commute=*/0, &op_);
  }
  ~ScopedOp() {
    if (owned_) MPI_Op_free(&op_);
  }
  ScopedOp(const ScopedOp&) = delete;
  ScopedOp& operator=(const ScopedOp&) = delete;
  MPI_Op get() const { return op_; }

 private:
  bool owned_;
  MPI_Op op_ = MPI_SUM;
};

}  // namespace kfa::mpi::impl
