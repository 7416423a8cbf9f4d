#pragma once
/// \file distributed.hpp
/// Sequence parallelism over MPI (target kfa::mpi): the sequence is split across the ranks of
/// a communicator, each rank holds its rows of Q, K, V (and O, LSE, dO, dQ, dK, dV), and the
/// partial results over key shards merge with the combiner of kfa/combine.hpp.
///
/// Layouts (which global rows a rank owns, see owned_rows):
///  - contiguous: rank r owns rows [r N / P, (r + 1) N / P) (integer division), so any N works,
///    including N < P (some ranks own nothing);
///  - zigzag: the sequence is cut into 2P chunks the same way and rank r owns chunks r and
///    2P - 1 - r, in that order, which balances causal work across ranks.
///
/// Modes:
///  - ring: K/V shards travel around the ring (rank r sends to r + 1) in P - 1 steps; the
///    send and receive of the next shard are posted before the current one is computed, so
///    communication can overlap compute (not measured yet). Each rank merges the partials of its
///    queries locally. Blocks that the masks hide entirely are skipped (causal: shards after the
///    rank's rows). The backward sends dK/dV accumulators along with K/V; they come home after the
///    last step; dQ stays local.
///  - tree: every rank gathers all queries (MPI_Allgatherv), computes their partials against its
///    own key shard, and the partials meet in MPI_Reduce_scatter with a user-defined,
///    non-commutative MPI_Op that applies the combiner in rank order (so the result is the same
///    on every run), leaving each rank its own rows of O and their global LSE. Chosen over an
///    MPI_Allreduce because each rank needs only its rows: a reduce-scatter moves N (D + 1)
///    values per rank instead of twice that. The backward gathers the rows [Q, dO, LSE, delta]
///    likewise, computes dK/dV of its shard completely and reduces dQ by a reduce-scatter (a
///    sum; in rank order under params.deterministic).
///
/// params.deterministic: no atomics in the kernels and every cross-rank sum in a fixed order,
/// so the backward is bitwise repeatable run to run for a given rank count and layout (not
/// across rank counts: the blocks, and so the rounding, change with them).
///
/// Message sizes: MPI counts are ints, so the largest message (a K/V shard pair, or the tree's
/// gathered rows) must hold fewer than 2^31 values; the collective check refuses larger
/// problems on every rank (use more ranks, or fewer heads per call).
/// The backward uses the final, global LSE and D = rowsum(dO * O), so each shard's
/// P = exp(S - LSE) is exact and no re-merge is needed. Masks and dropout are evaluated at
/// global positions, so every mode, layout and rank count gives the single-device result
/// within rounding (and, with dropout, the same mask).
///
/// Invalid input on any rank (a bad shape, params that differ between ranks) is found by a
/// collective check before the first collective that could hang: every rank throws the same
/// kfa::Error, naming the lowest failing rank.
///
/// Memory: Views in a memory space the host cannot access are staged through host buffers for
/// MPI (portable, without a GPU-aware MPI; the staging copies themselves are synchronous).

#include <kfa/backward.hpp>
#include <kfa/combine.hpp>
#include <kfa/forward.hpp>
#include <kfa/impl/backward_kernel.hpp>
#include <kfa/impl/forward_kernel.hpp>
#include <kfa/impl/mask.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/params.hpp>

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfa::mpi {

/// How the sequence is split across ranks.
enum class Layout {
  contiguous,  ///< one block per rank
  zigzag       ///< chunks r and 2P - 1 - r of 2P chunks
};

/// How partial results meet.
enum class Mode {
  ring,  ///< K/V shards travel around the ring, merged locally
  tree   ///< queries gathered, partials reduce-scattered with the combiner
};

}  // namespace kfa::mpi

namespace kfa {
/// Layout's names (kfa-seqpar's --layout).
template <>
struct EnumNames<mpi::Layout> {
  /// Each value with its name.
  static constexpr std::pair<mpi::Layout, const char*> values[] = {
      {mpi::Layout::contiguous, "contiguous"}, {mpi::Layout::zigzag, "zigzag"}};
};
/// Mode's names (kfa-seqpar's --mode).
template <>
struct EnumNames<mpi::Mode> {
  /// Each value with its name.
  static constexpr std::pair<mpi::Mode, const char*> values[] = {{mpi::Mode::ring, "ring"},
                                                                 {mpi::Mode::tree, "tree"}};
};
}  // namespace kfa

namespace kfa::mpi {

/// Global rows [begin, begin + size) of the sequence.
struct Segment {
  long long begin = 0;  ///< first global row
  long long size = 0;   ///< number of rows
};

/// The global rows a rank owns, in the order they are stored locally.
inline std::vector<Segment> owned_rows(Layout layout, long long seqlen, int rank, int nranks) {
  auto cut = [&](long long i, long long n) { return i * seqlen / n; };
  if (layout == Layout::contiguous)
    return {{cut(rank, nranks), cut(rank + 1, nranks) - cut(rank, nranks)}};
  const long long n = 2LL * nranks, a = rank, b = n - 1 - rank;
  return {{cut(a, n), cut(a + 1, n) - cut(a, n)}, {cut(b, n), cut(b + 1, n) - cut(b, n)}};
}

/// Number of rows owned_rows gives a rank.
inline long long owned_count(Layout layout, long long seqlen, int rank, int nranks) {
  long long n = 0;
  for (const Segment& s : owned_rows(layout, seqlen, rank, nranks))
    n += s.size;
  return n;
}

/// Where a pass adds the time it took, when SeqPar::timings points at one: the whole call, and
/// the part spent in MPI (waiting for messages the compute did not hide, collectives, the
/// collective check; waiting for a slower rank counts here too). compute = total - comm.
/// Measuring fences the execution space before each MPI wait, so kernels are not counted as
/// communication.
struct Timings {
  double total_s = 0;  ///< wall time of the calls
  double comm_s = 0;   ///< wall time inside MPI during the calls
};

/// The distributed problem: communicator, global sequence lengths, layout and mode.
struct SeqPar {
  MPI_Comm comm = MPI_COMM_NULL;       ///< the ranks sharing the sequence (never assumed WORLD)
  long long seqlen_q = 0;              ///< global number of queries
  long long seqlen_k = 0;              ///< global number of keys
  Layout layout = Layout::contiguous;  ///< who owns which rows (queries and keys alike)
  Mode mode = Mode::ring;              ///< how partials meet
  Timings* timings = nullptr;          ///< adds each call's times here when set
};

/// Collective error agreement: every rank passes its own error message (empty: none); when any
/// rank has one, every rank throws kfa::Error("rank R: <message>") with the lowest failing rank
/// R, so no rank goes on into a collective the others have left. Every rank of comm must call
/// it at the same point. kfa::mpi's passes use it for their input checks; programs can use it
/// for their own (reading files, say).
inline void agree(MPI_Comm comm, const std::string& local_error) {
  int rank = 0, nranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &nranks);
  const int mine = local_error.empty() ? nranks : rank;
  int first = nranks;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == nranks) return;
  int len = rank == first ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::string msg = rank == first ? local_error : std::string(static_cast<std::size_t>(len), ' ');
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, comm);
  const std::string text = msg.rfind("kfa: ", 0) == 0 ? msg.substr(5) : msg;
  throw Error("rank " + std::to_string(first) + ": " + text);
}

namespace detail {

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

/// A Meter of the MPI time of a pass; fences `space` first when measuring, so that kernels
/// still running are not booked as communication.
template <class ExecSpace>
double* comm_sink(const ExecSpace& space, const SeqPar& sp) {
  if (!sp.timings) return nullptr;
  space.fence();
  return &sp.timings->comm_s;
}
inline double* total_sink(const SeqPar& sp) {
  return sp.timings ? &sp.timings->total_s : nullptr;
}

template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "float or double");
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// The parameters every rank must share, as numbers that MPI can compare.
inline std::vector<double> shared_numbers(const Params& p, const SeqPar& sp,
                                          const std::vector<long long>& dims) {
  std::vector<double> v = {p.scale,
                           double(p.causal),
                           double(p.align == Align::top_left),
                           double(p.window_left),
                           double(p.window_right),
                           p.softcap,
                           p.dropout,
                           double(p.seed & 0xffffffffu),
                           double(p.seed >> 32),
                           double(p.offset & 0xffffffffu),
                           double(p.offset >> 32),
                           double(p.deterministic),
                           double(sp.seqlen_q),
                           double(sp.seqlen_k),
                           double(sp.layout == Layout::zigzag),
                           double(sp.mode == Mode::tree)};
  v.insert(v.end(), dims.begin(), dims.end());
  return v;
}

/// The collective check: local validation on every rank, then agreement on the numbers that
/// must be equal everywhere (params, global lengths, batch, heads, head_dim).
template <class Local>
void check_collectively(const char* pass, const SeqPar& sp, const Params& p,
                        const std::vector<long long>& dims, const Local& local_check) {
  if (sp.comm == MPI_COMM_NULL) throw Error(std::string(pass) + ": SeqPar::comm is MPI_COMM_NULL");
  std::string err;
  try {
    local_check();
  } catch (const Error& e) {
    err = e.what();
  }
  const Meter m(sp.timings ? &sp.timings->comm_s : nullptr);
  agree(sp.comm, err);
  const std::vector<double> mine = shared_numbers(p, sp, dims);
  std::vector<double> lo(mine.size()), hi(mine.size());
  MPI_Allreduce(mine.data(), lo.data(), int(mine.size()), MPI_DOUBLE, MPI_MIN, sp.comm);
  MPI_Allreduce(mine.data(), hi.data(), int(mine.size()), MPI_DOUBLE, MPI_MAX, sp.comm);
  static const char* names[] = {"params.scale",
                                "params.causal",
                                "params.align",
                                "params.window_left",
                                "params.window_right",
                                "params.softcap",
                                "params.dropout",
                                "params.seed",
                                "params.seed",
                                "params.offset",
                                "params.offset",
                                "params.deterministic",
                                "SeqPar::seqlen_q",
                                "SeqPar::seqlen_k",
                                "SeqPar::layout",
                                "SeqPar::mode",
                                "batch",
                                "heads_q",
                                "heads_k",
                                "head_dim",
                                "whether dlse is given"};
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (!(lo[i] == hi[i]) && !(lo[i] != lo[i] && hi[i] != hi[i]))
      throw Error(std::string(pass) + ": " + names[i] + " differs between ranks (" +
                  std::to_string(lo[i]) + " vs " + std::to_string(hi[i]) + ")");
}

/// Local extents must match the layout: `rows` along seqlen for this rank.
template <class View>
void expect_rows(const char* pass, const char* name, const View& v, long long rows,
                 const char* which) {
  if (static_cast<long long>(v.extent(2)) != rows)
    impl::fail(pass, name, " has seqlen ", v.extent(2), " on this rank but the layout gives it ",
               rows, " of the ", which, " rows");
}

template <class View>
auto rows_of(const View& v, long long begin, long long size) {
  return Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, std::make_pair(begin, begin + size),
                         Kokkos::ALL);
}

template <class View>
auto rows_of3(const View& v, long long begin, long long size) {
  return Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, std::make_pair(begin, begin + size));
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

/// (o, lse) <- combine((o, lse), (ob, lseb)) row by row: two normalised results over disjoint
/// keys are the partials {m = lse, l = 1, O~ = O}; the merged row is renormalised.
template <class ExecSpace, class O, class L, class OB, class LB>
void merge_rows(const ExecSpace& space, const O& o, const L& lse, const OB& ob, const LB& lseb) {
  using T = typename O::non_const_value_type;
  using A = typename L::non_const_value_type;
  const int B = o.extent(0), H = o.extent(1), N = o.extent(2), D = o.extent(3);
  if (std::size_t(B) * H * N == 0) return;
  Kokkos::parallel_for(
      "kfa::mpi::merge",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, N}),
      KOKKOS_LAMBDA(int b, int h, int i) {
        const Partial<A> pa{lse(b, h, i), A(1)}, pb{static_cast<A>(lseb(b, h, i)), A(1)};
        const Rescale<A> r = rescale(pa.m, pb.m);
        const A l = r.alpha + r.beta;
        const A inv = l > A(0) ? A(1) / l : A(0);
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) =
              static_cast<T>((r.alpha * A(o(b, h, i, d)) + r.beta * A(ob(b, h, i, d))) * inv);
        lse(b, h, i) = kfa::lse(Partial<A>{r.m, l});
      });
}

/// o = 0 and lse = -inf: the empty result, the combiner's identity (any layout).
template <class ExecSpace, class O, class L>
void clear_result(const ExecSpace& space, const O& o, const L& lse) {
  using T = typename O::non_const_value_type;
  using A = typename L::non_const_value_type;
  const int B = o.extent(0), H = o.extent(1), N = o.extent(2), D = o.extent(3);
  if (std::size_t(B) * H * N == 0) return;
  Kokkos::parallel_for(
      "kfa::mpi::clear",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, N}),
      KOKKOS_LAMBDA(int b, int h, int i) {
        lse(b, h, i) = -backends::infinity<A>();
        for (int d = 0; d < D; ++d)
          o(b, h, i, d) = T(0);
      });
}

/// dst += src, elementwise over rank-4 views of one shape.
template <class ExecSpace, class Dst, class Src>
void add_into(const ExecSpace& space, const Dst& dst, const Src& src) {
  const int B = dst.extent(0), H = dst.extent(1), N = dst.extent(2), D = dst.extent(3);
  if (std::size_t(B) * H * N * D == 0) return;
  Kokkos::parallel_for(
      "kfa::mpi::add",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(space, {0, 0, 0, 0}, {B, H, N, D}),
      KOKKOS_LAMBDA(int b, int h, int i, int d) { dst(b, h, i, d) += src(b, h, i, d); });
}

/// x = 0, over a rank-4 view of any layout.
template <class ExecSpace, class X>
void clear(const ExecSpace& space, const X& x) {
  using T = typename X::non_const_value_type;
  const int B = x.extent(0), H = x.extent(1), N = x.extent(2), D = x.extent(3);
  if (std::size_t(B) * H * N * D == 0) return;
  Kokkos::parallel_for(
      "kfa::mpi::clear",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(space, {0, 0, 0, 0}, {B, H, N, D}),
      KOKKOS_LAMBDA(int b, int h, int i, int d) { x(b, h, i, d) = T(0); });
}

/// The largest number of rows any rank owns.
inline long long max_count(Layout layout, long long seqlen, int nranks) {
  long long m = 0;
  for (int r = 0; r < nranks; ++r)
    m = std::max(m, owned_count(layout, seqlen, r, nranks));
  return m;
}

/// Internal (B, H, rows, D) tensors: LayoutRight whatever the space's default, since the
/// kernels need unit stride along head_dim (the default is LayoutLeft on GPUs).
template <class T, class Mem>
using Tensor = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
template <class T, class Mem>
using Rows = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

/// Rows of W values per (row, b, h), packed row-outermost as (rows, B, H, W) so that each
/// rank's rows are one contiguous message.
template <class T, class Mem>
using Packed = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;

/// Every rank's packed rows, in rank order (MPI_Allgatherv; staged through the host).
template <class T, class Mem>
Packed<T, Mem> allgather_rows(const Packed<T, Mem>& mine, const std::vector<int>& rows,
                              const SeqPar& sp) {
  MPI_Comm comm = sp.comm;
  const int P = int(rows.size());
  long long total = 0;
  for (int r : rows)
    total += r;
  const int per_row = int(mine.extent(1) * mine.extent(2) * mine.extent(3));
  std::vector<int> counts(P), offs(P);
  for (int r = 0, off = 0; r < P; ++r) {
    counts[r] = rows[r] * per_row;
    offs[r] = off;
    off += counts[r];
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Packed<T, Mem> all("kfa::mpi::gathered", total, mine.extent(1), mine.extent(2), mine.extent(3));
  auto host_mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mine);
  auto host_all = Kokkos::create_mirror_view(all);
  {
    const Meter m(comm_sink(Kokkos::DefaultHostExecutionSpace(), sp));
    MPI_Allgatherv(host_mine.data(), counts[rank], mpi_type<T>(), host_all.data(), counts.data(),
                   offs.data(), mpi_type<T>(), comm);
  }
  Kokkos::deep_copy(all, host_all);
  return all;
}

/// Each rank's own rows of the reduction over ranks of `all` (every rank's packed rows, in
/// rank order) with `op` (MPI_Reduce_scatter; staged through the host). With whole_rows the op
/// sees rows of W values as one element (the combiner); otherwise single values (a sum, which
/// MPI's built-in ops allow on the base type only).
template <class T, class Mem>
Packed<T, Mem> reduce_scatter_rows(const Packed<T, Mem>& all, const std::vector<int>& rows,
                                   MPI_Op op, bool whole_rows, const SeqPar& sp) {
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
  std::vector<int> counts(P);
  for (int r = 0; r < P; ++r)
    counts[r] = rows[r] * int(B * H * (whole_rows ? 1 : W));
  auto host_all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all);
  Packed<T, Kokkos::HostSpace> host_mine("kfa::mpi::mine", rows[rank], B, H, W);
  {
    const Meter m(comm_sink(Kokkos::DefaultHostExecutionSpace(), sp));
    MPI_Reduce_scatter(host_all.data(), host_mine.data(), counts.data(), type, op, comm);
  }
  if (whole_rows) MPI_Type_free(&type);
  return Kokkos::create_mirror_view_and_copy(Mem(), host_mine);
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

/// MPI counts are ints: the largest message of a pass (values of T) must fit in one. Ring: the
/// [K, V] (or [dK, dV]) pair of the largest shard; tree: all ranks' gathered rows of `width`
/// values per (row, batch, head), and their displacements.
inline void check_message_sizes(const char* pass, const SeqPar& sp, int nranks, double batch,
                                double heads_q, double heads_k, double head_dim, double width) {
  const double ring =
      2 * batch * heads_k * double(max_count(sp.layout, sp.seqlen_k, nranks)) * head_dim;
  const double tree = double(sp.seqlen_q) * batch * heads_q * width;
  const double biggest = sp.mode == Mode::ring ? ring : tree;
  if (biggest > 2147483647.0)
    impl::fail(pass, "the ", sp.mode == Mode::ring ? "ring" : "tree",
               " mode needs MPI messages of ", biggest,
               " values, more than an MPI count (int) holds; use more ranks or split ",
               "the batch or heads across calls");
}

/// The global sequence lengths must be usable as the kernels' int extents.
inline void check_lengths(const char* pass, const SeqPar& sp) {
  if (sp.seqlen_q < 1 || sp.seqlen_k < 1 || sp.seqlen_q > 2147483647LL ||
      sp.seqlen_k > 2147483647LL)
    impl::fail(pass, "SeqPar seqlen_q = ", sp.seqlen_q, " and seqlen_k = ", sp.seqlen_k,
               " must be in [1, 2^31)");
}

/// Whether any query of segment qs sees any key of segment ks under the masks of p.
inline bool blocks_meet(const Params& p, const SeqPar& sp, const Segment& qs, const Segment& ks) {
  if (qs.size == 0 || ks.size == 0) return false;
  impl::Origin at{qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k};
  const impl::Mask m = impl::make_mask(p, int(qs.size), int(ks.size), at);
  const int lo = m.lo(0), hi = m.hi(int(qs.size) - 1);
  return lo <= hi && lo < ks.size && hi >= 0;
}

/// The block of query rows qs against key rows ks (q, k, v: their local rows), computed into
/// the scratch (ob, lb) and merged into the running result (o, lse) of those query rows.
template <class ExecSpace, class Q, class K, class V, class OB, class LB, class O, class L>
void add_block(const ExecSpace& space, const Q& q, const K& k, const V& v, const OB& ob,
               const LB& lb, const O& o, const L& lse, const Params& params, const SeqPar& sp,
               const Segment& qs, const Segment& ks) {
  impl::forward(space, q, k, v, ob, lb, params,
                impl::Origin{qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k});
  merge_rows(space, o, lse, ob, lb);
}

/// The combiner as an MPI_Op on rows [lse, O_0 .. O_{D-1}] of T (D from the datatype's size):
/// inout <- combine(in, inout), both normalised. Registered non-commutative, so MPI applies it
/// in rank order and the result is the same on every run.
template <class T>
void combine_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const int w = bytes / int(sizeof(T)), D = w - 1;
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int r = 0; r < *len; ++r, a += w, b += w) {
    const Rescale<T> s = rescale(a[0], b[0]);
    const T l = s.alpha + s.beta;
    const T inv = l > T(0) ? T(1) / l : T(0);
    for (int d = 1; d <= D; ++d)
      b[d] = (s.alpha * a[d] + s.beta * b[d]) * inv;
    b[0] = kfa::lse(Partial<T>{s.m, l});
  }
}

}  // namespace detail

/// Sequence-parallel forward. Each rank passes its rows (owned_rows(sp.layout, ...)) of q
/// (B, Hq, local Nq, D), k and v (B, Hk, local Nk, D), and receives its rows of o and lse.
/// Collective over sp.comm: every rank must call it with the same params and SeqPar.
/// \throws kfa::Error on every rank when any rank's input is invalid.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
             const Params& params, const SeqPar& sp) {
  using T = typename Q::non_const_value_type;
  static_assert(
      std::is_same_v<typename O::value_type, T> && std::is_same_v<typename Lse::value_type, T>,
      "kfa::mpi::forward: o and lse share the value type of q (non-const)");
  impl::static_check_tensors<ExecSpace, Q, K, V, O>();
  int rank = 0, P = 1;
  if (sp.comm != MPI_COMM_NULL) {
    MPI_Comm_rank(sp.comm, &rank);
    MPI_Comm_size(sp.comm, &P);
  }
  const detail::Meter whole_call(detail::total_sink(sp));
  const auto qseg = owned_rows(sp.layout, sp.seqlen_q, rank, P);
  const std::vector<long long> dims = {(long long)q.extent(0), (long long)q.extent(1),
                                       (long long)k.extent(1), (long long)q.extent(3)};
  detail::check_collectively("mpi::forward", sp, params, dims, [&] {
    impl::validate_params("mpi::forward", params);
    detail::check_lengths("mpi::forward", sp);
    detail::check_message_sizes("mpi::forward", sp, P, q.extent(0), q.extent(1), k.extent(1),
                                q.extent(3), q.extent(3) + 1.0);
    detail::expect_rows("mpi::forward", "q", q, owned_count(sp.layout, sp.seqlen_q, rank, P),
                        "query");
    detail::expect_rows("mpi::forward", "k", k, owned_count(sp.layout, sp.seqlen_k, rank, P),
                        "key");
    impl::validate_shapes("mpi::forward", q, k, v, o, lse);
  });

  using Mem = typename ExecSpace::memory_space;
  const std::size_t B = q.extent(0), Hq = q.extent(1), Hk = k.extent(1), D = q.extent(3);
  const long long nq_local = q.extent(2);

  if (sp.mode == Mode::ring) {
    // Running result in o, lse; each visible block's (O, LSE) merges into it.
    detail::clear_result(space, o, lse);
    const std::size_t kv_elems =
        B * Hk * std::size_t(detail::max_count(sp.layout, sp.seqlen_k, P)) * D;
    detail::Flat<T, Mem> buf[2] = {{Kokkos::View<T*, Mem>("kfa::mpi::kv0", 2 * kv_elems)},
                                   {Kokkos::View<T*, Mem>("kfa::mpi::kv1", 2 * kv_elems)}};
    // Stage the local shard as the first travelling block.
    {
      const long long nk = k.extent(2);
      Kokkos::deep_copy(space, buf[0].at(0, B, Hk, nk, D), k);
      Kokkos::deep_copy(space, buf[0].at(B * Hk * nk * D, B, Hk, nk, D), v);
    }
    detail::Tensor<T, Mem> ob("kfa::mpi::ob", B, Hq, nq_local, D);
    detail::Rows<T, Mem> lseb("kfa::mpi::lseb", B, Hq, nq_local);
    detail::Channel<T, Mem> ch;
    for (int s = 0; s < P; ++s) {
      const int src = (rank - s + P) % P;
      const long long nk = owned_count(sp.layout, sp.seqlen_k, src, P);
      const detail::Flat<T, Mem>& cur = buf[s % 2];
      MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      const int nsrc = (rank - s - 1 + 2 * P) % P;
      const long long nk_next = owned_count(sp.layout, sp.seqlen_k, nsrc, P);
      if (s + 1 < P) {  // post the next step's exchange before computing this one
        space.fence();
        ch.irecv(buf[(s + 1) % 2].data, 2 * B * Hk * nk_next * D, (rank - 1 + P) % P, s, sp.comm,
                 &req[0]);
        ch.isend(cur.data, 2 * B * Hk * nk * D, (rank + 1) % P, s, sp.comm, &req[1]);
      }
      const auto kk = cur.at(0, B, Hk, nk, D), vv = cur.at(B * Hk * nk * D, B, Hk, nk, D);
      long long q_off = 0;
      for (const Segment& qs : qseg) {
        long long k_off = 0;
        for (const Segment& ks : owned_rows(sp.layout, sp.seqlen_k, src, P)) {
          if (detail::blocks_meet(params, sp, qs, ks))
            detail::add_block(
                space, detail::rows_of(q, q_off, qs.size), detail::rows_of(kk, k_off, ks.size),
                detail::rows_of(vv, k_off, ks.size), detail::rows_of(ob, q_off, qs.size),
                detail::rows_of3(lseb, q_off, qs.size), detail::rows_of(o, q_off, qs.size),
                detail::rows_of3(lse, q_off, qs.size), params, sp, qs, ks);
          k_off += ks.size;
        }
        q_off += qs.size;
      }
      if (s + 1 < P) {
        const detail::Meter m(detail::comm_sink(space, sp));
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        ch.finish_recv(buf[(s + 1) % 2].data, 2 * B * Hk * nk_next * D);
      }
    }
    space.fence();
    return;
  }

  // Tree: gather every rank's queries, compute their partials against the local key shard,
  // reduce-scatter the partials with the combiner.
  std::vector<int> rows(P);
  for (int r = 0; r < P; ++r)
    rows[r] = int(owned_count(sp.layout, sp.seqlen_q, r, P));
  using Packed = detail::Packed<T, Mem>;
  Packed qpack("kfa::mpi::qpack", nq_local, B, Hq, D);
  Kokkos::parallel_for(
      "kfa::mpi::pack_q",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0}, {(long long)B, (long long)Hq, nq_local, (long long)D}),
      KOKKOS_LAMBDA(long long b, long long h, long long i, long long d) {
        qpack(i, b, h, d) = q(b, h, i, d);
      });
  space.fence();
  const Packed qall = detail::allgather_rows(qpack, rows, sp);
  const long long total = qall.extent(0);
  // All queries as (B, Hq, total, D), in the order of the ranks' rows.
  detail::Tensor<T, Mem> qg("kfa::mpi::qg", B, Hq, total, D);
  Kokkos::parallel_for(
      "kfa::mpi::unpack_q",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0}, {(long long)B, (long long)Hq, total, (long long)D}),
      KOKKOS_LAMBDA(long long b, long long h, long long i, long long d) {
        qg(b, h, i, d) = qall(i, b, h, d);
      });
  // Partials of every query against the local keys.
  detail::Tensor<T, Mem> og("kfa::mpi::og", B, Hq, total, D);
  detail::Rows<T, Mem> lg("kfa::mpi::lg", B, Hq, total);
  detail::clear_result(space, og, lg);
  {
    // One block result at a time, in scratch allocated once and cut at the block's rows.
    detail::Tensor<T, Mem> ob("kfa::mpi::ob", B, Hq, total, D);
    detail::Rows<T, Mem> lb("kfa::mpi::lb", B, Hq, total);
    long long g_off = 0;
    for (int r = 0; r < P; ++r)
      for (const Segment& qs : owned_rows(sp.layout, sp.seqlen_q, r, P)) {
        long long k_off = 0;
        for (const Segment& ks : owned_rows(sp.layout, sp.seqlen_k, rank, P)) {
          if (detail::blocks_meet(params, sp, qs, ks))
            detail::add_block(
                space, detail::rows_of(qg, g_off, qs.size), detail::rows_of(k, k_off, ks.size),
                detail::rows_of(v, k_off, ks.size), detail::rows_of(ob, g_off, qs.size),
                detail::rows_of3(lb, g_off, qs.size), detail::rows_of(og, g_off, qs.size),
                detail::rows_of3(lg, g_off, qs.size), params, sp, qs, ks);
          k_off += ks.size;
        }
        g_off += qs.size;
      }
  }
  // Partials as rows [lse, O], reduced with the combiner.
  Packed part("kfa::mpi::part", total, B, Hq, D + 1);
  Kokkos::parallel_for(
      "kfa::mpi::pack_partial",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                        {(long long)B, (long long)Hq, total}),
      KOKKOS_LAMBDA(long long b, long long h, long long i) {
        part(i, b, h, 0) = lg(b, h, i);
        for (std::size_t d = 0; d < D; ++d)
          part(i, b, h, d + 1) = og(b, h, i, d);
      });
  space.fence();
  MPI_Op op;
  MPI_Op_create(&detail::combine_op<T>, 0, &op);
  const Packed mine = detail::reduce_scatter_rows(part, rows, op, /*whole_rows=*/true, sp);
  MPI_Op_free(&op);
  Kokkos::parallel_for(
      "kfa::mpi::unpack_o",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                        {(long long)B, (long long)Hq, nq_local}),
      KOKKOS_LAMBDA(long long b, long long h, long long i) {
        lse(b, h, i) = mine(i, b, h, 0);
        for (std::size_t d = 0; d < D; ++d)
          o(b, h, i, d) = mine(i, b, h, d + 1);
      });
  space.fence();
}

namespace detail {

/// The ring backward: K/V shards travel as in the forward; each carries the dK/dV accumulator
/// of its keys, which the next rank receives while computing its own block (the block's
/// gradients go into a zeroed buffer and the incoming accumulator is added afterwards), so
/// that message overlaps compute too. After the last step each accumulator is one hop from
/// home. dq (zeroed by the caller) gathers the blocks of every step locally.
template <class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta, class DQ,
          class DK, class DV>
void ring_backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                   const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                   const Params& params, const SeqPar& sp, int rank, int P) {
  using T = typename Q::non_const_value_type;
  using Mem = typename ExecSpace::memory_space;
  const std::size_t B = q.extent(0), Hk = k.extent(1), D = q.extent(3);
  const auto qseg = owned_rows(sp.layout, sp.seqlen_q, rank, P);
  const std::size_t max_elems = 2 * B * Hk * std::size_t(max_count(sp.layout, sp.seqlen_k, P)) * D;
  auto flat = [&](const char* label) {
    return Flat<T, Mem>{Kokkos::View<T*, Mem>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), max_elems)};
  };
  // [K, V] of the travelling shard (double-buffered), [dK, dV] of this step's block (two, one
  // of which may still be in flight), and the incoming accumulator.
  const Flat<T, Mem> kv[2] = {flat("kfa::mpi::kv0"), flat("kfa::mpi::kv1")};
  const Flat<T, Mem> acc[2] = {flat("kfa::mpi::acc0"), flat("kfa::mpi::acc1")};
  const Flat<T, Mem> incoming = flat("kfa::mpi::acc_in");
  const long long nk_own = k.extent(2);
  Kokkos::deep_copy(space, kv[0].at(0, B, Hk, nk_own, D), k);
  Kokkos::deep_copy(space, kv[0].at(B * Hk * nk_own * D, B, Hk, nk_own, D), v);
  Channel<T, Mem> kv_ch, acc_ch;
  const int next = (rank + 1) % P, prev = (rank - 1 + P) % P;
  MPI_Request acc_sent = MPI_REQUEST_NULL;
  for (int s = 0; s < P; ++s) {
    const int src = (rank - s + P) % P;
    const long long nk = owned_count(sp.layout, sp.seqlen_k, src, P);
    const std::size_t n = 2 * B * Hk * std::size_t(nk) * D;  // [K, V] or [dK, dV] of shard src
    const Flat<T, Mem>& cur = kv[s % 2];
    MPI_Request kv_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Request acc_req = MPI_REQUEST_NULL;
    const long long nk_next = owned_count(sp.layout, sp.seqlen_k, (rank - s - 1 + 2 * P) % P, P);
    space.fence();
    if (s + 1 < P) {  // next step's K/V, posted before this step's compute
      kv_ch.irecv(kv[(s + 1) % 2].data, 2 * B * Hk * nk_next * D, prev, 2 * s, sp.comm, &kv_req[0]);
      kv_ch.isend(cur.data, n, next, 2 * s, sp.comm, &kv_req[1]);
    }
    // The accumulator of shard src, which the previous rank finished at step s - 1.
    if (s > 0) acc_ch.irecv(incoming.data, n, prev, 2 * s - 1, sp.comm, &acc_req);
    const Flat<T, Mem>& mine = acc[s % 2];
    const auto kk = cur.at(0, B, Hk, nk, D), vv = cur.at(B * Hk * nk * D, B, Hk, nk, D);
    const auto dkk = mine.at(0, B, Hk, nk, D), dvv = mine.at(B * Hk * nk * D, B, Hk, nk, D);
    clear(space, mine.at(0, 2 * B, Hk, nk, D));
    long long q_off = 0;
    for (const Segment& qs : qseg) {
      long long k_off = 0;
      for (const Segment& ks : owned_rows(sp.layout, sp.seqlen_k, src, P)) {
        if (blocks_meet(params, sp, qs, ks))
          impl::backward_add(space, rows_of(q, q_off, qs.size), rows_of(kk, k_off, ks.size),
                             rows_of(vv, k_off, ks.size), rows_of(dout, q_off, qs.size),
                             rows_of3(lse, q_off, qs.size), rows_of3(delta, q_off, qs.size),
                             rows_of(dq, q_off, qs.size), rows_of(dkk, k_off, ks.size),
                             rows_of(dvv, k_off, ks.size), params,
                             impl::Origin{qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k});
        k_off += ks.size;
      }
      q_off += qs.size;
    }
    if (s > 0) {
      {
        const Meter m(comm_sink(space, sp));
        MPI_Wait(&acc_req, MPI_STATUS_IGNORE);
      }
      acc_ch.finish_recv(incoming.data, n);
      add_into(space, mine.at(0, 2 * B, Hk, nk, D), incoming.at(0, 2 * B, Hk, nk, D));
    }
    space.fence();
    // One accumulator send in flight at a time, so the buffer written next step is free.
    {
      const Meter m(comm_sink(space, sp));
      MPI_Wait(&acc_sent, MPI_STATUS_IGNORE);
    }
    acc_ch.isend(mine.data, n, next, 2 * s + 1, sp.comm, &acc_sent);
    if (s + 1 < P) {
      const Meter m(comm_sink(space, sp));
      MPI_Waitall(2, kv_req, MPI_STATUSES_IGNORE);
      kv_ch.finish_recv(kv[(s + 1) % 2].data, 2 * B * Hk * nk_next * D);
    }
  }
  // The last step sent every accumulator home: this rank's comes from the previous rank.
  MPI_Request home = MPI_REQUEST_NULL;
  const std::size_t n_own = 2 * B * Hk * std::size_t(nk_own) * D;
  acc_ch.irecv(incoming.data, n_own, prev, 2 * P - 1, sp.comm, &home);
  {
    const Meter m(comm_sink(space, sp));
    MPI_Wait(&home, MPI_STATUS_IGNORE);
    MPI_Wait(&acc_sent, MPI_STATUS_IGNORE);
  }
  acc_ch.finish_recv(incoming.data, n_own);
  Kokkos::deep_copy(space, dk, incoming.at(0, B, Hk, nk_own, D));
  Kokkos::deep_copy(space, dv, incoming.at(B * Hk * nk_own * D, B, Hk, nk_own, D));
}

/// The tree backward: every rank gathers all rows of [Q, dO, LSE, delta], computes the
/// gradients of all queries against its own keys (dk, dv complete there) and the partial dQ
/// of every query, which MPI_Reduce_scatter sums into each rank's rows (in rank order under
/// params.deterministic).
template <class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta, class DQ,
          class DK, class DV>
void tree_backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                   const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                   const Params& params, const SeqPar& sp, int rank, int P) {
  using T = typename Q::non_const_value_type;
  using A = typename Delta::non_const_value_type;
  using Mem = typename ExecSpace::memory_space;
  const std::size_t B = q.extent(0), Hq = q.extent(1), D = q.extent(3);
  const long long nq_local = q.extent(2);
  std::vector<int> rows(P);
  for (int r = 0; r < P; ++r)
    rows[r] = int(owned_count(sp.layout, sp.seqlen_q, r, P));
  Packed<T, Mem> pack("kfa::mpi::pack_rows", nq_local, B, Hq, 2 * D + 2);
  Kokkos::parallel_for(
      "kfa::mpi::pack_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                        {(long long)B, (long long)Hq, nq_local}),
      KOKKOS_LAMBDA(long long b, long long h, long long i) {
        for (std::size_t d = 0; d < D; ++d) {
          pack(i, b, h, d) = q(b, h, i, d);
          pack(i, b, h, D + d) = dout(b, h, i, d);
        }
        pack(i, b, h, 2 * D) = lse(b, h, i);
        pack(i, b, h, 2 * D + 1) = static_cast<T>(delta(b, h, i));
      });
  space.fence();
  const Packed<T, Mem> all = allgather_rows(pack, rows, sp);
  const long long total = all.extent(0);
  detail::Tensor<T, Mem> qg("kfa::mpi::qg", B, Hq, total, D), dog("kfa::mpi::dog", B, Hq, total, D),
      dqg("kfa::mpi::dqg", B, Hq, total, D);
  detail::Rows<T, Mem> lg("kfa::mpi::lg", B, Hq, total);
  detail::Rows<A, Mem> deltag("kfa::mpi::deltag", B, Hq, total);
  Kokkos::parallel_for(
      "kfa::mpi::unpack_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                        {(long long)B, (long long)Hq, total}),
      KOKKOS_LAMBDA(long long b, long long h, long long i) {
        for (std::size_t d = 0; d < D; ++d) {
          qg(b, h, i, d) = all(i, b, h, d);
          dog(b, h, i, d) = all(i, b, h, D + d);
        }
        lg(b, h, i) = all(i, b, h, 2 * D);
        deltag(b, h, i) = static_cast<A>(all(i, b, h, 2 * D + 1));
      });
  clear(space, dk);
  clear(space, dv);
  long long g_off = 0;
  for (int r = 0; r < P; ++r)
    for (const Segment& qs : owned_rows(sp.layout, sp.seqlen_q, r, P)) {
      long long k_off = 0;
      for (const Segment& ks : owned_rows(sp.layout, sp.seqlen_k, rank, P)) {
        if (blocks_meet(params, sp, qs, ks))
          impl::backward_add(space, rows_of(qg, g_off, qs.size), rows_of(k, k_off, ks.size),
                             rows_of(v, k_off, ks.size), rows_of(dog, g_off, qs.size),
                             rows_of3(lg, g_off, qs.size), rows_of3(deltag, g_off, qs.size),
                             rows_of(dqg, g_off, qs.size), rows_of(dk, k_off, ks.size),
                             rows_of(dv, k_off, ks.size), params,
                             impl::Origin{qs.begin, ks.begin, sp.seqlen_q, sp.seqlen_k});
        k_off += ks.size;
      }
      g_off += qs.size;
    }
  Packed<T, Mem> part("kfa::mpi::dq_part", total, B, Hq, D);
  Kokkos::parallel_for(
      "kfa::mpi::pack_dq",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0}, {(long long)B, (long long)Hq, total, (long long)D}),
      KOKKOS_LAMBDA(long long b, long long h, long long i, long long d) {
        part(i, b, h, d) = dqg(b, h, i, d);
      });
  space.fence();
  MPI_Op op = MPI_SUM;
  if (params.deterministic) MPI_Op_create(&sum_op<T>, 0, &op);
  const Packed<T, Mem> mine = reduce_scatter_rows(part, rows, op, /*whole_rows=*/false, sp);
  if (params.deterministic) MPI_Op_free(&op);
  Kokkos::parallel_for(
      "kfa::mpi::unpack_dq",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0}, {(long long)B, (long long)Hq, nq_local, (long long)D}),
      KOKKOS_LAMBDA(long long b, long long h, long long i, long long d) {
        dq(b, h, i, d) = mine(i, b, h, d);
      });
}

/// kfa::mpi::backward with an optional dlse (nullptr: none).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse* dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const SeqPar& sp) {
  using T = typename Q::non_const_value_type;
  static_assert(std::is_same_v<typename Lse::non_const_value_type, T> &&
                    std::is_same_v<typename DQ::value_type, T> &&
                    std::is_same_v<typename DK::value_type, T> &&
                    std::is_same_v<typename DV::value_type, T>,
                "kfa::mpi::backward: lse, dq, dk and dv share the value type of q (dq, dk, dv "
                "non-const)");
  static_assert(impl::is_view_of_rank<Lse, 3>::value && impl::is_view_of_rank<DLse, 3>::value,
                "kfa::mpi::backward: lse and dlse must be rank-3 Views");
  impl::static_check_tensors<ExecSpace, Q, K, V, O, DO, DQ, DK, DV>();
  impl::static_check_accessible<ExecSpace, Lse>();
  impl::static_check_accessible<ExecSpace, DLse>();
  int rank = 0, P = 1;
  if (sp.comm != MPI_COMM_NULL) {
    MPI_Comm_rank(sp.comm, &rank);
    MPI_Comm_size(sp.comm, &P);
  }
  const Meter whole_call(total_sink(sp));
  const std::vector<long long> dims = {(long long)q.extent(0), (long long)q.extent(1),
                                       (long long)k.extent(1), (long long)q.extent(3),
                                       (long long)(dlse != nullptr)};
  check_collectively("mpi::backward", sp, params, dims, [&] {
    impl::validate_params("mpi::backward", params);
    check_lengths("mpi::backward", sp);
    check_message_sizes("mpi::backward", sp, P, q.extent(0), q.extent(1), k.extent(1), q.extent(3),
                        2.0 * q.extent(3) + 2);
    expect_rows("mpi::backward", "q", q, owned_count(sp.layout, sp.seqlen_q, rank, P), "query");
    expect_rows("mpi::backward", "k", k, owned_count(sp.layout, sp.seqlen_k, rank, P), "key");
    impl::validate_backward("mpi::backward", q, k, v, o, lse, dout, dlse, dq, dk, dv);
  });
  using Mem = typename ExecSpace::memory_space;
  // delta = rowsum(dO * O) - dLSE of this rank's rows, from the final O: with the global LSE,
  // every block's P = exp(S - LSE) is the exact global one, so blocks need no re-merge.
  Kokkos::View<backends::accum_t<T>***, Kokkos::LayoutRight, Mem> delta(
      "kfa::mpi::delta", q.extent(0), q.extent(1), q.extent(2));
  impl::backward_delta(space, delta, dout, o, dlse, dq, /*zero_dq=*/true);
  if (sp.mode == Mode::ring)
    ring_backward(space, q, k, v, dout, lse, delta, dq, dk, dv, params, sp, rank, P);
  else
    tree_backward(space, q, k, v, dout, lse, delta, dq, dk, dv, params, sp, rank, P);
  space.fence();
}

}  // namespace detail

/// Sequence-parallel backward: each rank passes its rows of q, k, v (as to forward), of o and
/// lse (forward's results) and of dout, and receives its rows of dq, dk and dv. Collective
/// over sp.comm, with the forward's params (params.deterministic as in kfa::backward: no
/// atomics, and the cross-rank sums in a fixed order, so the result is bitwise repeatable).
/// \throws kfa::Error on every rank when any rank's input is invalid.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, std::enable_if_t<impl::is_view_of_rank<DQ, 4>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DQ& dq, const DK& dk, const DV& dv,
              const Params& params, const SeqPar& sp) {
  detail::backward(space, q, k, v, o, lse, dout, static_cast<const Lse*>(nullptr), dq, dk, dv,
                   params, sp);
}

/// As above, with dlse = dL/dLSE of this rank's rows (batch, heads_q, local seqlen_q).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DLse,
          class DQ, class DK, class DV,
          std::enable_if_t<impl::is_view_of_rank<DLse, 3>::value, int> = 0>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
              const Lse& lse, const DO& dout, const DLse& dlse, const DQ& dq, const DK& dk,
              const DV& dv, const Params& params, const SeqPar& sp) {
  detail::backward(space, q, k, v, o, lse, dout, &dlse, dq, dk, dv, params, sp);
}

}  // namespace kfa::mpi
