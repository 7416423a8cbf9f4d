#pragma once
/// \file seqpar.hpp
/// The vocabulary of kfa::mpi (target kfa::mpi): how a sequence is split across the ranks of a
/// communicator (Layout, owned_rows), how partial results meet (Mode), the problem every rank
/// describes alike (SeqPar), and the collective error agreement (agree). The passes are in
/// kfa/distributed.hpp.
///
/// Layouts (which global rows a rank owns, see owned_rows):
///  - contiguous: rank r owns rows [r N / P, (r + 1) N / P) (integer division), so any N works,
///    including N < P (some ranks own nothing);
///  - zigzag: the sequence is cut into 2P chunks the same way and rank r owns chunks r and
///    2P - 1 - r, in that order, which balances causal work across ranks.

#include <kfa/params.hpp>

#include <mpi.h>

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

/// How partial results meet (kfa/distributed.hpp describes each).
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

/// SeqPar's fields that every rank must pass alike (all but comm and timings), in declaration
/// order: calls f(name, member) for each, with `member` a (const) reference into sp. The passes'
/// collective check compares them across ranks with this list, as it does Params' with
/// kfa::for_each_field, so a new field here is checked with no other edit. Member types are
/// integers or enums with an EnumNames specialisation.
template <class S, class F>
void for_each_agreed_field(S& sp, F&& f) {
  static_assert(std::is_same_v<std::remove_const_t<S>, SeqPar>,
                "for_each_agreed_field takes SeqPar");
  f("seqlen_q", sp.seqlen_q);
  f("seqlen_k", sp.seqlen_k);
  f("layout", sp.layout);
  f("mode", sp.mode);
}

/// The kfa::Error that every rank of a communicator throws alike, at the same point (from agree
/// and from the passes' check that ranks were given the same values): a program may report it
/// once and end normally, where any other error may be on one rank only and must end the job.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

/// Collective error agreement: every rank passes its own error message (empty: none); when any
/// rank has one, every rank throws CollectiveError("rank R: <message>") with the lowest failing
/// rank R, so no rank goes on into a collective the others have left. Every rank of comm must call
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
  throw CollectiveError("rank " + std::to_string(first) + ": " + text);
}

}  // namespace kfa::mpi
