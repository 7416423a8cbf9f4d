// kfa-seqpar: the sequence-parallel passes of kfa::mpi as a program, under mpiexec.
//
//   mpiexec -n P kfa-seqpar forward  --in IN.h5 --out OUT.h5 [options]   reads /q /k /v,
//                writes /o /lse
//   mpiexec -n P kfa-seqpar backward --in IN.h5 --out OUT.h5 [options]   reads /q /k /v /o
//                /lse /do (and /dlse when present), writes /dq /dk /dv
//   mpiexec -n P kfa-seqpar forward|backward --random B,H,N,D [--heads-kv H] [--seqlen-k N]
//                [--head-dim-v DV]
//                [--dtype float|double] [--data-seed S] [--repeat R] [--json] [--check]
//   mpiexec -n P kfa-seqpar forward|backward --multiscale ...: multi-scale attention
//                (kfa::mpi::msa), as kfa --multiscale: forward reads /q /k /v and /mask (heads_q,
//                seqlen_q, seqlen_k) when present, writes /o /rsum; backward reads /q /k /v
//                [/mask] /o /rsum /do, writes /dq /dk /dv; --random draws kfa's decay mask
//   mpiexec -n P kfa-seqpar --version
//   score terms (softmax), as kfa: /alibi_slopes (heads_q) or --alibi, /bias (batch or 1,
//                heads_q or 1, seqlen_q, seqlen_k; the backward writes its gradient /dbias),
//                /mask (uint8, same extents) or /key_lengths (integers, batch); one per pass
//   options: --mode ring|tree (default ring), --layout contiguous|zigzag (default contiguous),
//            kfa's pass flags (one a field of kfa::Params, and --window LEFT,RIGHT)
//
// Files: every rank reads and writes only its own rows (owned_rows of the layout, along
// seqlen) through parallel HDF5; no rank holds a whole tensor, except the multi-scale mask
// and the score terms, which every rank reads whole (kfa::mpi takes them so; a bias or mask
// costs each rank B H NQ NK values, and the backward with /bias a dL/dS buffer of that size
// too), and /dbias, which every rank computes whole and rank 0 writes. --random generates each
// rank's rows from the global element index, so the problem is the same at every rank count.
// --check (with --random) compares each rank's rows with a single-rank computation of the
// whole problem (kfa::forward / kfa::backward in the run's precision and in double) under
// the tolerance rule; it needs the whole problem on every rank, so it is for checking, not
// for runs at scale.
// Timing: one untimed warm-up, then --repeat runs, each timed from a barrier to the slowest
// rank's end; prints the median, and each rank's compute and MPI time (SeqPar::timings).
//
// Exit status as kfa: 0 success; 1 when --check finds the rule broken; 2 bad input (one line
// "kfa-seqpar: error: ..." from rank 0, the same on every rank). An error on one rank ends
// every rank; an unexpected one aborts the job. Every rank must be given the same command and
// options: a difference is an error of the same kind, found before any file is opened. The
// output file appears only when every rank wrote its part.
#include <kfa/distributed.hpp>
#include <kfa/kfa.hpp>
#include <kfa/reference.hpp>

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "h5io.hpp"
#include "report.hpp"
#include "terms.hpp"
#include "views.hpp"

namespace {

using kfa_apps::Dataset;
using kfa_apps::DType;
using kfa_apps::InputError;
using kfa_apps::NamedCheck;
using kfa_apps::RowRange;
using kfa_apps::Verdict;
using Exec = Kokkos::DefaultExecutionSpace;
namespace kmpi = kfa::mpi;

const char* kUsage =
    "usage: mpiexec -n P kfa-seqpar forward|backward\n"
    "         (--in IN.h5 --out OUT.h5 | --random B,H,N,D [--heads-kv H] [--seqlen-k N]\n"
    "          [--head-dim-v DV] [--dtype float|double] [--data-seed S] [--check])\n"
    "         [--mode ring|tree] [--layout contiguous|zigzag] [--repeat R] [--json]\n"
    "         [--allow-nonfinite] [--multiscale] [--alibi]\n"
    "         [pass flags]\n"
    "       kfa-seqpar --version: kfa's version and options, the Kokkos it was compiled with\n"
    "  B,H,N,D: batch, query heads, sequence length, head dimension (of q and k; --head-dim-v:\n"
    "           v's, D by default; a file's /v, /o and /do may have a head dim of their own)\n"
    "  --check: each rank's rows against a single-rank computation of the whole problem\n"
    "           (float64 and the run's precision), under the tolerance rule; exit 1 if broken\n"
    "  --json: one JSON object of the run on the last line of rank 0's stdout\n"
    "  --allow-nonfinite: run on inputs holding NaN or Inf (refused otherwise)\n"
    "  --multiscale: multi-scale attention, as kfa's: forward reads /q /k /v [/mask (H, NQ,\n"
    "           NK), whole on every rank], writes /o /rsum; backward reads /q /k /v [/mask]\n"
    "           /o /rsum /do, writes /dq /dk /dv; --random uses kfa's decay mask\n"
    "  score terms, as kfa's: /alibi_slopes (H) or --alibi (slopes 2^(-8 (h+1) / H)), /bias (B\n"
    "           or 1, H or 1, NQ, NK; the backward writes /dbias), /mask (uint8, same extents;\n"
    "           0 = hidden) or /key_lengths (integers, B); whole on every rank, one per pass\n"
    "  --kokkos-FLAG=VALUE: passed to Kokkos after a check (threads: --kokkos-threads=N on\n"
    "           Kokkos 3.4, --kokkos-num-threads=N from 3.7)\n"
    "  GFLOP/s are those of the whole problem, all ranks together\n"
    "exit status: 0 success, 1 --check failed, 2 bad input or usage (one line from rank 0)\n"
    "pass flags, as kfa's:\n";

struct Options : kfa_apps::RunOptions {
  kmpi::Mode mode = kmpi::Mode::ring;
  kmpi::Layout layout = kmpi::Layout::contiguous;
  bool alibi = false;  // ALiBi with the standard slopes
};

Options parse(int argc, char** argv) {
  Options o;
  const auto own = [&](const std::string& flag, const kfa_apps::FlagValue& value) {
    if (flag == "--mode")
      o.mode = kfa_apps::parse_enum<kmpi::Mode>(flag, value());
    else if (flag == "--layout")
      o.layout = kfa_apps::parse_enum<kmpi::Layout>(flag, value());
    else if (flag == "--alibi")
      o.alibi = true;
    else
      return false;
    return true;
  };
  kfa_apps::parse_command_line(argc, argv, "kfa-seqpar", {"forward", "backward"}, own, o);
  if (o.action != kfa_apps::Action::run) return o;
  kfa_apps::check_sources(o);
  if (kfa_apps::is_16bit(o.dtype))
    throw InputError(std::string("--dtype ") + kfa_apps::name(o.dtype) +
                     " is kfa's only: kfa-seqpar takes float and double (kfa::mpi has no 16-bit "
                     "path)");
  if (!o.in.empty() && o.check)
    throw InputError("--check applies to --random only (it needs the whole problem on each rank)");
  if (o.multiscale && o.alibi) throw InputError("--alibi does not apply to --multiscale");
  kfa_apps::check_multiscale(o);
  return o;
}

// ---- The problem: this rank's rows ------------------------------------------------------

int comm_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int comm_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::vector<RowRange> my_rows(const Options& o, long long seqlen) {
  std::vector<RowRange> out;
  for (const kmpi::Segment& s : kmpi::owned_rows(o.layout, seqlen, comm_rank(), comm_size()))
    out.push_back({hsize_t(s.begin), hsize_t(s.size)});
  return out;
}

// Element (b, h, i, d) of tensor `which` of a --random problem: a hash of the data seed, the
// tensor and the global element index, uniform in [-1, 1) (rounded to float for float runs),
// so any rank can make any rows and the problem does not depend on the rank count.
double random_value(unsigned long long seed, int which, unsigned long long index, DType t) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + std::uint64_t(which) * 0xD1B54A32D192ED03ULL +
                    index * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 30;  // splitmix64's finaliser
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  const double u = double(x >> 11) * 0x1.0p-53 * 2.0 - 1.0;
  return t == DType::f32 ? double(float(u)) : u;
}

// Rows `rows` of random tensor `which` of global dims (B, H, N, D).
Dataset random_rows(const Options& o, int which, std::vector<hsize_t> dims,
                    const std::vector<RowRange>& rows) {
  const hsize_t N = dims[2], D = dims[3];
  Dataset d;
  d.dtype = o.dtype;
  d.dims = dims;
  d.dims[2] = 0;
  for (const RowRange& r : rows)
    d.dims[2] += r.size;
  d.data.reserve(d.size());
  for (hsize_t b = 0; b < dims[0]; ++b)
    for (hsize_t h = 0; h < dims[1]; ++h)
      for (const RowRange& r : rows)
        for (hsize_t i = r.begin; i < r.begin + r.size; ++i)
          for (hsize_t e = 0; e < D; ++e)
            d.data.push_back(
                random_value(o.data_seed, which, ((b * dims[1] + h) * N + i) * D + e, o.dtype));
  return d;
}

std::vector<RowRange> all_rows(hsize_t n) {
  return {{0, n}};
}

struct Problem : kfa_apps::Terms {  // the score terms, whole, and:
  long long B = 0, Hq = 0, Hk = 0, Nq = 0, Nk = 0, D = 0;
  long long Dv = 0;                     // v's (and o's, dout's, dv's) head dim
  Dataset q, k, v, o, lse, dout, dlse;  // this rank's rows (--multiscale: lse holds /rsum)
  Dataset mask;                         // --multiscale: the whole M, or empty (M = 1)
  const char* stat = "/lse";            // the name of the forward's row statistic
  // Global shapes of the query-side tensors, of the key-side ones and of the LSE.
  std::vector<hsize_t> q_dims() const { return {hsize_t(B), hsize_t(Hq), hsize_t(Nq), hsize_t(D)}; }
  std::vector<hsize_t> k_dims() const { return {hsize_t(B), hsize_t(Hk), hsize_t(Nk), hsize_t(D)}; }
  std::vector<hsize_t> v_dims() const {
    return {hsize_t(B), hsize_t(Hk), hsize_t(Nk), hsize_t(Dv)};
  }
  std::vector<hsize_t> o_dims() const {
    return {hsize_t(B), hsize_t(Hq), hsize_t(Nq), hsize_t(Dv)};
  }
  std::vector<hsize_t> lse_dims() const { return {hsize_t(B), hsize_t(Hq), hsize_t(Nq)}; }
  kfa_apps::Dims dims() const { return {B, Hq, Hk, Nq, Nk, D, Dv}; }
};

// Refuses, on every rank, a problem whose rows do not fit in memory: each rank's tensors
// (its rows of q, o, k, v, and dout, dq, dk, dv in the backward, in the kernel's type and the
// program's double copies; the whole problem twice more under --check), summed over the ranks
// that share this node's memory, against that memory. Collective; before anything is allocated.
void check_memory(const Options& o, const Problem& p, DType t, const std::string& source) {
  const auto rows = [&](long long n) {
    double r = 0;
    for (const RowRange& x : my_rows(o, n))
      r += double(x.size);
    return r;
  };
  const bool bwd = o.command == "backward";
  const double wide = double(std::max(p.D, p.Dv));  // every tensor counted at the wider dim
  const double q = double(p.B) * double(p.Hq) * wide, k = double(p.B) * double(p.Hk) * wide;
  const double per = double(kfa_apps::element_bytes(t)) + 8, tensors = bwd ? 4 : 2;
  double mine = tensors * per * (rows(p.Nq) * q + rows(p.Nk) * k);
  if (o.check) mine += 2 * tensors * per * (double(p.Nq) * q + double(p.Nk) * k);
  // The whole multi-scale mask, in the kernel's type and the program's doubles (once more in
  // double under --check).
  if (o.multiscale) mine += (per + (o.check ? 8 : 0)) * double(p.Hq) * double(p.Nq) * double(p.Nk);
  // A whole bias (the program's doubles and the kernel's copy; the backward's dbias twice over
  // and kfa::mpi's dL/dS buffer of the whole problem) or boolean mask (bytes, twice).
  const double whole = double(p.B) * double(p.Hq) * double(p.Nq) * double(p.Nk);
  if (!p.bias.dims.empty())
    mine += double(p.bias.size()) * (per * (bwd ? 2 : 1)) + (bwd ? whole * 8 : 0);
  mine += 2.0 * double(p.dense.size());
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm_rank(), MPI_INFO_NULL, &node);
  double on_node = mine;
  int ranks_here = 1;
  MPI_Allreduce(&mine, &on_node, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Comm_size(node, &ranks_here);
  MPI_Comm_free(&node);
  std::ostringstream what;
  what.precision(3);
  what << source << ", on rank " << comm_rank() << "'s node (" << ranks_here << " rank"
       << (ranks_here == 1 ? "" : "s") << "; this rank's rows about " << mine / (1 << 30)
       << " GiB),";
  kfa_apps::require_memory(on_node, what.str());
}

// NaN or Inf in this rank's rows of an input: refused (unless --allow-nonfinite) with the
// count on this rank and the first one's global position.
void refuse_non_finite(const Options& o, const Dataset& d, const char* name,
                       const std::vector<RowRange>& rows) {
  if (o.allow_nonfinite) return;
  kfa_apps::NonFinite nf = kfa_apps::find_non_finite(d);
  if (nf.count == 0) return;
  hsize_t local = nf.first[2];
  for (const RowRange& r : rows) {
    if (local < r.size) {
      nf.first[2] = r.begin + local;
      break;
    }
    local -= r.size;
  }
  throw InputError(std::string("dataset ") + name + " in '" + o.in + "' holds " +
                   std::to_string(nf.count) + " non-finite value" + (nf.count == 1 ? "" : "s") +
                   " in rank " + std::to_string(comm_rank()) + "'s rows, the first at " +
                   kfa_apps::shape_of(nf.first) + "; pass --allow-nonfinite to run anyway");
}

Problem load(const Options& o) {
  Problem p;
  if (o.multiscale) p.stat = "/rsum";
  if (!o.random.empty()) {
    p.B = o.random[0];
    p.Hq = o.random[1];
    p.Nq = o.random[2];
    p.D = o.random[3];
    p.Dv = o.head_dim_v.value_or(p.D);
    p.Hk = o.heads_kv.value_or(p.Hq);
    p.Nk = o.seqlen_k.value_or(p.Nq);
    check_memory(o, p, o.dtype, "the problem");
    const auto qr = my_rows(o, p.Nq), kr = my_rows(o, p.Nk);
    p.q = random_rows(o, 0, p.q_dims(), qr);
    p.k = random_rows(o, 1, p.k_dims(), kr);
    p.v = random_rows(o, 2, p.v_dims(), kr);
    if (o.command == "backward") p.dout = random_rows(o, 3, p.o_dims(), qr);
    if (o.multiscale) p.mask = kfa_apps::decay_mask(p.Hq, p.Nq, p.Nk, o.dtype);
    if (o.alibi) p.slopes = kfa_apps::standard_slopes(hsize_t(p.Hq));
    return p;
  }
  kfa_apps::ParallelH5File in(o.in, MPI_COMM_WORLD);
  kfa_apps::check_known_datasets(in.names(), o.in, o.multiscale, !o.multiscale, false,
                                 "kfa-seqpar");
  // Every header first (every rank reads the same ones, so all agree), then the rows: a
  // dataset whose shape disagrees must fail on every rank before any collective read.
  const bool bwd = o.command == "backward";
  const Dataset qh = in.header("/q", 4), kh = in.header("/k", 4), vh = in.header("/v", 4);
  if (kfa_apps::is_16bit(qh.dtype))
    throw InputError("dataset /q in '" + o.in + "' is " + kfa_apps::name(qh.dtype) +
                     ": kfa-seqpar takes float32 and float64 (kfa::mpi has no 16-bit path)");
  p.B = qh.dims[0];
  p.Hq = qh.dims[1];
  p.Nq = qh.dims[2];
  p.D = qh.dims[3];
  p.Dv = vh.dims[3];
  p.Hk = kh.dims[1];
  p.Nk = kh.dims[2];
  const std::vector<hsize_t> qd = qh.dims, kd = kh.dims, rows3(qd.begin(), qd.begin() + 3);
  // /v: /k's (batch, heads, seqlen) with a head dim of its own; /o and /do: /q's rows with /v's.
  const std::vector<hsize_t> vd{kd[0], kd[1], kd[2], vh.dims[3]}, od{qd[0], qd[1], qd[2], vd[3]};
  auto expect = [&](const char* name, const Dataset& h, const std::vector<hsize_t>& want,
                    const char* like) {
    if (h.dims != want)
      throw InputError(std::string("dataset ") + name + " has shape " + kfa_apps::shape_of(h.dims) +
                       " but " + like + " gives " + kfa_apps::shape_of(want));
    if (h.dtype != qh.dtype)
      throw InputError(std::string("dataset ") + name + " is " + kfa_apps::name(h.dtype) +
                       " but /q is " + kfa_apps::name(qh.dtype) +
                       "; all inputs must share one type");
  };
  for (hsize_t b : {qh.dims[0], kh.dims[0]})
    if (b == 0) throw InputError("datasets /q and /k must not be empty");
  expect("/v", vh, vd, "/k (with /v's own head_dim)");
  if (vh.dims[3] == 0) throw InputError("dataset /v has head_dim 0");
  if (kh.dims[0] != qh.dims[0] || kh.dims[3] != qh.dims[3])
    throw InputError("dataset /k has shape " + kfa_apps::shape_of(kd) + " but /q has " +
                     kfa_apps::shape_of(qd) + " (batch and head_dim must match)");
  const bool has_dlse = bwd && in.has("/dlse");
  if (bwd) {
    expect("/o", in.header("/o", 4), od, "/q with /v's head_dim");
    expect("/do", in.header("/do", 4), od, "/q with /v's head_dim");
    expect(p.stat, in.header(p.stat, 3), rows3, "/q");
    if (has_dlse) expect("/dlse", in.header("/dlse", 3), rows3, "/q");
  }
  const bool has_mask = o.multiscale && in.has("/mask");
  if (has_mask)
    expect("/mask", in.header("/mask", 3), {qd[1], qd[2], kd[2]}, "(heads, seqlen) of /q and /k");
  // The score terms (softmax), whole on every rank: their headers, and the integer ones whole
  // (small, or checked as bytes below), before the memory check.
  if (!o.multiscale) {
    if (in.has("/alibi_slopes")) {
      if (o.alibi)
        throw InputError("--alibi and dataset /alibi_slopes in '" + o.in +
                         "' were both given; give one");
      p.slopes = in.header("/alibi_slopes", 1);
    }
    if (o.alibi) p.slopes = kfa_apps::standard_slopes(qd[1]);
    if (in.has("/bias")) p.bias = in.header("/bias", 4);
    if (in.has("/mask")) {
      try {
        p.dense = in.read_integers("/mask", 4, true);
      } catch (const InputError& e) {
        throw InputError(std::string(e.what()) +
                         " (a float /mask is the weight tensor of --multiscale)");
      }
    }
    if (in.has("/key_lengths")) p.lengths = in.read_integers("/key_lengths", 1, false);
    kfa_apps::check_term_shapes(p, qd, kd);
  }
  check_memory(o, p, qh.dtype,
               "dataset /q " + kfa_apps::shape_of(qd) + " with /k " + kfa_apps::shape_of(kd) +
                   " (" + kfa_apps::name(qh.dtype) + ") in '" + o.in + "'");
  const auto qr = my_rows(o, p.Nq), kr = my_rows(o, p.Nk);
  p.q = in.read_rows("/q", 4, qr);
  p.k = in.read_rows("/k", 4, kr);
  p.v = in.read_rows("/v", 4, kr);
  if (bwd) {
    p.o = in.read_rows("/o", 4, qr);
    p.lse = in.read_rows(p.stat, 3, qr);
    p.dout = in.read_rows("/do", 4, qr);
    if (has_dlse) p.dlse = in.read_rows("/dlse", 3, qr);
  }
  if (has_mask) p.mask = in.read_rows("/mask", 3, all_rows(p.Nk));  // whole: (H, Nq, all Nk)
  if (!p.slopes.dims.empty() && !o.alibi) p.slopes = in.read("/alibi_slopes", 1);
  if (!p.bias.dims.empty()) p.bias = in.read("/bias", 4);
  for (const auto& [d, ds] : {std::pair{&p.slopes, "/alibi_slopes"}, {&p.bias, "/bias"}})
    if (!o.allow_nonfinite)
      kfa_apps::refuse_non_finite(*d, std::string("dataset ") + ds + " in '" + o.in + "'");
  refuse_non_finite(o, p.q, "/q", qr);
  refuse_non_finite(o, p.k, "/k", kr);
  refuse_non_finite(o, p.v, "/v", kr);
  if (bwd) refuse_non_finite(o, p.dout, "/do", qr);
  return p;
}

// ---- Device views ------------------------------------------------------------------------

template <class T>
using Dev4 = Kokkos::View<T****, Kokkos::LayoutRight, Exec::memory_space>;
template <class T>
using Dev3 = Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>;

// ---- The run's attention: softmax, or multi-scale (with the mask when given) ----------------

// The whole mask of a --multiscale run on the device, in U; empty for none (M = 1).
template <class U>
Dev3<U> mask_view(const Problem& p) {
  return p.mask.dims.empty() ? Dev3<U>() : kfa_apps::dataset_to_view<Dev3<U>>(p.mask, "mask");
}

// kfa::mpi's forward of the run's attention on this rank's rows: o and lse (or rsum), with
// the score term when one is given (softmax only: --multiscale takes none).
template <class T, class... Term>
void mpi_forward(const Options& o, const Dev3<T>& mask, const Dev4<T>& q, const Dev4<T>& k,
                 const Dev4<T>& v, const Dev4<T>& out, const Dev3<T>& stat, const kmpi::SeqPar& sp,
                 const Term&... term) {
  if (!o.multiscale) {
    kmpi::forward(Exec(), q, k, v, out, stat, o.params, sp, term...);
  } else if constexpr (sizeof...(Term) == 0) {
    if (mask.size() > 0)
      kmpi::msa::forward(Exec(), q, k, v, mask, out, stat, kfa_apps::msa_params(o), sp);
    else
      kmpi::msa::forward(Exec(), q, k, v, out, stat, kfa_apps::msa_params(o), sp);
  }
}

// kfa::mpi's backward of the run's attention; dlse (softmax only) when `with_dlse`; the
// forward's score term, if any.
template <class T, class... Term>
void mpi_backward(const Options& o, const Dev3<T>& mask, const Dev4<T>& q, const Dev4<T>& k,
                  const Dev4<T>& v, const Dev4<T>& out, const Dev3<T>& stat, const Dev4<T>& dout,
                  const Dev3<T>& dlse, bool with_dlse, const Dev4<T>& dq, const Dev4<T>& dk,
                  const Dev4<T>& dv, const kmpi::SeqPar& sp, const Term&... term) {
  if (!o.multiscale) {
    if (with_dlse)
      kmpi::backward(Exec(), q, k, v, out, stat, dout, dlse, dq, dk, dv, o.params, sp, term...);
    else
      kmpi::backward(Exec(), q, k, v, out, stat, dout, dq, dk, dv, o.params, sp, term...);
  } else if constexpr (sizeof...(Term) == 0) {
    if (mask.size() > 0)
      kmpi::msa::backward(Exec(), q, k, v, mask, out, stat, dout, dq, dk, dv,
                          kfa_apps::msa_params(o), sp);
    else
      kmpi::msa::backward(Exec(), q, k, v, out, stat, dout, dq, dk, dv, kfa_apps::msa_params(o),
                          sp);
  }
}

// ---- Timing --------------------------------------------------------------------------------

struct Timing {
  double median_s = 0;             // of the slowest rank's time per run
  double total_s = 0, comm_s = 0;  // this rank's, per run
};

// One untimed warm-up, then `repeat` runs from a barrier to the slowest rank's end.
template <class Pass>
Timing time_pass(const Options& o, kmpi::Timings& t, const Pass& pass) {
  pass();
  t = {};
  std::vector<double> times;
  for (long long r = 0; r < o.repeat; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    pass();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  Timing tm;
  tm.median_s = kfa_apps::median(times);
  tm.total_s = t.total_s / double(o.repeat);
  tm.comm_s = t.comm_s / double(o.repeat);
  return tm;
}

// ---- The check: this rank's rows against a single-rank computation --------------------------

// The whole --random problem on this rank, for the single-rank computation.
struct Whole {
  Dataset q, k, v, dout;
};
Whole whole_problem(const Options& o, const Problem& p) {
  Whole w{random_rows(o, 0, p.q_dims(), all_rows(p.Nq)),
          random_rows(o, 1, p.k_dims(), all_rows(p.Nk)),
          random_rows(o, 2, p.v_dims(), all_rows(p.Nk)),
          {}};
  if (o.command == "backward") w.dout = random_rows(o, 3, p.o_dims(), all_rows(p.Nq));
  return w;
}

// This rank's rows of a whole (B, H, N[, D]) host tensor.
template <class HostView>
HostView rows_of(const HostView& g, const std::vector<RowRange>& rows) {
  hsize_t n = 0;
  for (const RowRange& r : rows)
    n += r.size;
  HostView out;
  if constexpr (HostView::rank == 4)
    out = HostView(std::string("rows"), g.extent(0), g.extent(1), n, g.extent(3));
  else
    out = HostView(std::string("rows"), g.extent(0), g.extent(1), n);
  for (std::size_t b = 0; b < g.extent(0); ++b)
    for (std::size_t h = 0; h < g.extent(1); ++h) {
      std::size_t row = 0;
      for (const RowRange& r : rows)
        for (hsize_t i = r.begin; i < r.begin + r.size; ++i, ++row) {
          if constexpr (HostView::rank == 4) {
            for (std::size_t d = 0; d < g.extent(3); ++d)
              out(b, h, row, d) = g(b, h, i, d);
          } else {
            out(b, h, row) = g(b, h, i);
          }
        }
    }
  return out;
}

template <class View>
auto to_host_double(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  using Out = std::conditional_t<View::rank == 4, kfa::reference::Tensor4, kfa::reference::Tensor3>;
  Out out;
  if constexpr (View::rank == 4)
    out = Out(std::string("host"), v.extent(0), v.extent(1), v.extent(2), v.extent(3));
  else
    out = Out(std::string("host"), v.extent(0), v.extent(1), v.extent(2));
  for (std::size_t e = 0; e < h.span(); ++e)
    out.data()[e] = double(h.data()[e]);
  return out;
}

// The rule's verdict over all ranks: the worst rank's error and bound for each output.
Verdict agree_on(const std::vector<NamedCheck>& mine) {
  Verdict v;
  for (const NamedCheck& c : mine) {
    // The rank whose error is largest relative to its bound speaks for all; a failing rank
    // (a ratio above 1, or a non-finite error or bound) ranks above every passing one.
    const double ratio = c.check.bound > 0 ? c.check.err / c.check.bound : 0;
    struct {
      double ratio;
      int rank;
    } in{c.check.ok()           ? ratio
         : std::isfinite(ratio) ? std::max(2.0, ratio)
                                : 1e300,
         comm_rank()},
        out{};
    MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    double eb[2] = {c.check.err, c.check.bound};
    MPI_Bcast(eb, 2, MPI_DOUBLE, out.rank, MPI_COMM_WORLD);
    kfa::reference::Check w;
    w.err = eb[0];
    w.bound = eb[1];
    v.checks.push_back({c.label, c.key, w});
  }
  return v;
}

// The whole problem's forward on this rank alone, in precision U: the reference side of
// --check, whose result each rank compares with its own rows.
template <class U>
struct SingleRank {
  const Options& opts;
  Dev4<U> q, k, v, o;
  Dev3<U> lse, mask;  // lse: rsum under --multiscale
  SingleRank(const Options& opts_, const Problem& p, const Whole& w)
      : opts(opts_),
        q(kfa_apps::dataset_to_view<Dev4<U>>(w.q, "q")),
        k(kfa_apps::dataset_to_view<Dev4<U>>(w.k, "k")),
        v(kfa_apps::dataset_to_view<Dev4<U>>(w.v, "v")),
        o("o1", p.B, p.Hq, p.Nq, p.Dv),
        lse("l1", p.B, p.Hq, p.Nq),
        mask(mask_view<U>(p)) {
    if (!opts.multiscale)
      kfa_apps::with_term<U>(p, {}, [&](const auto&... term) {
        kfa::forward(Exec(), q, k, v, o, lse, opts.params, term...);
      });
    else if (mask.size() > 0)
      kfa::msa::forward(Exec(), q, k, v, mask, o, lse, kfa_apps::msa_params(opts));
    else
      kfa::msa::forward(Exec(), q, k, v, o, lse, kfa_apps::msa_params(opts));
  }
  // The gradients given dout (with the score term of p, as the forward).
  void backward(const Problem& p, const Dev4<U>& dout, const Dev4<U>& dq, const Dev4<U>& dk,
                const Dev4<U>& dv) const {
    if (!opts.multiscale)
      kfa_apps::with_term<U>(p, {}, [&](const auto&... term) {
        kfa::backward(Exec(), q, k, v, o, lse, dout, dq, dk, dv, opts.params, term...);
      });
    else if (mask.size() > 0)
      kfa::msa::backward(Exec(), q, k, v, mask, o, lse, dout, dq, dk, dv,
                         kfa_apps::msa_params(opts));
    else
      kfa::msa::backward(Exec(), q, k, v, o, lse, dout, dq, dk, dv, kfa_apps::msa_params(opts));
  }
};

// The single-rank forward of the whole problem in T and in double; this rank's rows of
// (O, LSE) against them.
template <class T>
Verdict check_forward(const Options& o, const Problem& p, const Dev4<T>& out, const Dev3<T>& lse) {
  const Whole w = whole_problem(o, p);
  const auto qr = my_rows(o, p.Nq);
  auto single = [&](auto zero) {
    const SingleRank<decltype(zero)> s(o, p, w);
    return std::pair{rows_of(to_host_double(s.o), qr), rows_of(to_host_double(s.lse), qr)};
  };
  const auto [o64, l64] = single(0.0);
  const auto [oT, lT] = single(T(0));
  return agree_on({{"O", "O", kfa::reference::apply_rule<T>(to_host_double(out), oT, o64)},
                   {o.multiscale ? "rsum" : "LSE", o.multiscale ? "rsum" : "LSE",
                    kfa::reference::apply_rule<T>(to_host_double(lse), lT, l64)}});
}

template <class T>
Verdict check_backward(const Options& o, const Problem& p, const Dev4<T>& dq, const Dev4<T>& dk,
                       const Dev4<T>& dv) {
  const Whole w = whole_problem(o, p);
  const auto qr = my_rows(o, p.Nq), kr = my_rows(o, p.Nk);
  auto single = [&](auto zero) {
    using U = decltype(zero);
    const SingleRank<U> s(o, p, w);
    const auto d = kfa_apps::dataset_to_view<Dev4<U>>(w.dout, "do");
    Dev4<U> dq1("dq1", p.B, p.Hq, p.Nq, p.D), dk1("dk1", p.B, p.Hk, p.Nk, p.D),
        dv1("dv1", p.B, p.Hk, p.Nk, p.Dv);
    s.backward(p, d, dq1, dk1, dv1);
    return std::array{rows_of(to_host_double(dq1), qr), rows_of(to_host_double(dk1), kr),
                      rows_of(to_host_double(dv1), kr)};
  };
  const auto g64 = single(0.0);
  const auto gT = single(T(0));
  return agree_on({{"dQ", "dQ", kfa::reference::apply_rule<T>(to_host_double(dq), gT[0], g64[0])},
                   {"dK", "dK", kfa::reference::apply_rule<T>(to_host_double(dk), gT[1], g64[1])},
                   {"dV", "dV", kfa::reference::apply_rule<T>(to_host_double(dv), gT[2], g64[2])}});
}

// ---- Report --------------------------------------------------------------------------------

// " term=KIND" for the run's score term, or nothing.
std::string term_name(const Problem& p) {
  for (const auto& [d, name] : {std::pair{&p.slopes, "alibi"},
                                {&p.bias, "bias"},
                                {&p.dense, "mask"},
                                {&p.lengths, "key_lengths"}})
    if (!d->dims.empty()) return std::string(" term=") + name;
  return "";
}

// Prints the summary (rank 0) with every rank's compute and MPI time, and the JSON line under
// --json; returns the exit status.
int report(const Options& o, const Problem& p, const Timing& tm,
           const std::optional<Verdict>& verdict) {
  const int P = comm_size();
  const double mine[3] = {double(p.q.dims[2]), tm.total_s - tm.comm_s, tm.comm_s};
  std::vector<double> all(3 * std::size_t(P));
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const int status = !verdict || verdict->ok() ? 0 : 1;
  if (comm_rank() != 0) return status;
  const double gflops = kfa_apps::pass_flops(o, p.dims()) / tm.median_s * 1e-9;
  const std::string extra = std::string(o.multiscale ? "multiscale " : "") +
                            "ranks=" + std::to_string(P) + " mode=" + kfa::name_of(o.mode) +
                            " layout=" + kfa::name_of(o.layout) + term_name(p);
  std::printf("%s\n", kfa_apps::describe("kfa-seqpar", o, p.dims(), p.q.dtype, extra).c_str());
  std::printf(
      "time: median %.6f s over %lld run%s (slowest rank); %.2f GFLOP/s (all %d ranks "
      "together)\n",
      tm.median_s, o.repeat, o.repeat == 1 ? "" : "s", gflops, P);
  std::vector<double> columns[3];
  for (std::size_t r = 0; r < std::size_t(P); ++r) {
    for (int c = 0; c < 3; ++c)
      columns[c].push_back(all[3 * r + c]);
    std::printf("  rank %zu: %.0f query rows, compute %.6f s, MPI %.6f s (%.1f%%) per run\n", r,
                all[3 * r], all[3 * r + 1], all[3 * r + 2],
                100 * all[3 * r + 2] / std::max(1e-300, all[3 * r + 1] + all[3 * r + 2]));
  }
  if (verdict)
    std::printf(
        "%s\n",
        kfa_apps::summary("the single-rank result (float64 and same precision)", *verdict).c_str());
  if (!o.out.empty())
    std::printf("wrote %s to %s\n",
                o.command == "forward" ? (std::string("/o ") + p.stat).c_str()
                : p.bias.dims.empty()  ? "/dq /dk /dv"
                                       : "/dq /dk /dv /dbias",
                o.out.c_str());
  if (o.json) {
    auto j = kfa_apps::pass_json(o, p.dims(), p.q.dtype)
                 .add("multiscale", o.multiscale)
                 .add("ranks", P)
                 .add("mode", o.mode)
                 .add("layout", o.layout)
                 .figure("median_s", tm.median_s, 9)
                 .figure("gflops", gflops, 6)
                 .figures("rows", columns[0], 9)
                 .figures("compute_s", columns[1], 9)
                 .figures("comm_s", columns[2], 9);
    kfa_apps::add_check(j, verdict);
    std::printf("%s\n", j.str().c_str());
  }
  return status;
}

// ---- The passes ----------------------------------------------------------------------------

// This rank's q, k and v on the device, and the SeqPar of the run, collecting its timings.
template <class T>
struct Inputs {
  Dev4<T> q, k, v;
  kmpi::Timings timings;
  kmpi::SeqPar sp;
  Inputs(const Options& o, const Problem& p)
      : q(kfa_apps::dataset_to_view<Dev4<T>>(p.q, "q")),
        k(kfa_apps::dataset_to_view<Dev4<T>>(p.k, "k")),
        v(kfa_apps::dataset_to_view<Dev4<T>>(p.v, "v")),
        sp{MPI_COMM_WORLD, p.Nq, p.Nk, o.layout, o.mode, &timings} {}
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;
};

template <class T>
int run_forward(const Options& o, const Problem& p) {
  Inputs<T> in(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  const Dev3<T> mask = mask_view<T>(p);
  Dev4<T> out("o", q.extent(0), q.extent(1), q.extent(2), v.extent(3));
  Dev3<T> lse("lse", q.extent(0), q.extent(1), q.extent(2));
  Timing tm;
  kfa_apps::with_term<T>(p, {}, [&](const auto&... term) {
    tm = time_pass(o, in.timings, [&] { mpi_forward(o, mask, q, k, v, out, lse, in.sp, term...); });
  });
  std::optional<Verdict> verdict;
  if (o.check) verdict = check_forward<T>(o, p, out, lse);
  if (!o.out.empty()) {
    const Dataset od = kfa_apps::view_to_dataset(out, p.q.dtype),
                  ld = kfa_apps::view_to_dataset(lse, p.q.dtype);
    const auto qr = my_rows(o, p.Nq);
    kfa_apps::write_rows_atomic(
        o.out, {{"/o", p.o_dims(), &od, qr}, {p.stat, p.lse_dims(), &ld, qr}}, MPI_COMM_WORLD);
  }
  return report(o, p, tm, verdict);
}

template <class T>
int run_backward(const Options& o, const Problem& p) {
  Inputs<T> in(o, p);
  const auto &q = in.q, &k = in.k, &v = in.v;
  auto dout = kfa_apps::dataset_to_view<Dev4<T>>(p.dout, "do");
  const Dev3<T> mask = mask_view<T>(p);
  Dev4<T> out;
  Dev3<T> lse, dlse;
  if (p.o.dims.empty()) {  // --random: the forward it needs, once and untimed
    out = Dev4<T>("o", q.extent(0), q.extent(1), q.extent(2), v.extent(3));
    lse = Dev3<T>("lse", q.extent(0), q.extent(1), q.extent(2));
    kfa_apps::with_term<T>(p, {}, [&](const auto&... term) {
      mpi_forward(o, mask, q, k, v, out, lse, in.sp, term...);
    });
  } else {
    out = kfa_apps::dataset_to_view<Dev4<T>>(p.o, "o");
    lse = kfa_apps::dataset_to_view<Dev3<T>>(p.lse, "lse");
  }
  if (!p.dlse.dims.empty()) dlse = kfa_apps::dataset_to_view<Dev3<T>>(p.dlse, "dlse");
  Dev4<T> dq("dq", q.extent(0), q.extent(1), q.extent(2), q.extent(3)),
      dk("dk", k.extent(0), k.extent(1), k.extent(2), k.extent(3)),
      dv("dv", v.extent(0), v.extent(1), v.extent(2), v.extent(3));
  // Whether /dlse was given: the file's, not this rank's row count, so every rank alike.
  const bool with_dlse = !p.dlse.dims.empty();
  Dev4<T> dbias;  // the bias's gradient, whole on every rank
  if (!p.bias.dims.empty())
    dbias = Dev4<T>("dbias", p.bias.dims[0], p.bias.dims[1], p.bias.dims[2], p.bias.dims[3]);
  Timing tm;
  kfa_apps::with_term<T>(p, dbias, [&](const auto&... term) {
    tm = time_pass(o, in.timings, [&] {
      mpi_backward(o, mask, q, k, v, out, lse, dout, dlse, with_dlse, dq, dk, dv, in.sp, term...);
    });
  });
  std::optional<Verdict> verdict;
  if (o.check) verdict = check_backward<T>(o, p, dq, dk, dv);
  if (!o.out.empty()) {
    const Dataset dqd = kfa_apps::view_to_dataset(dq, p.q.dtype),
                  dkd = kfa_apps::view_to_dataset(dk, p.q.dtype),
                  dvd = kfa_apps::view_to_dataset(dv, p.q.dtype);
    const auto qr = my_rows(o, p.Nq), kr = my_rows(o, p.Nk);
    std::vector<kfa_apps::RowSlab> slabs = {{"/dq", p.q_dims(), &dqd, qr},
                                            {"/dk", p.k_dims(), &dkd, kr},
                                            {"/dv", p.v_dims(), &dvd, kr}};
    // dbias: the same on every rank; rank 0 writes it (its rows: dimension 2, seqlen_q).
    Dataset dbd, none;
    if (dbias.size() > 0) {
      dbd = kfa_apps::view_to_dataset(dbias, p.q.dtype);
      none = dbd;
      none.dims[2] = 0;
      none.data.clear();
      const bool first = comm_rank() == 0;
      slabs.push_back({"/dbias", dbd.dims, first ? &dbd : &none,
                       first ? all_rows(dbd.dims[2]) : std::vector<RowRange>{}});
    }
    kfa_apps::write_rows_atomic(o.out, slabs, MPI_COMM_WORLD);
  }
  return report(o, p, tm, verdict);
}

// Runs `f` on every rank; when it throws InputError on any rank, every rank throws the lowest
// failing rank's message (so none is left in a later collective).
template <class F>
auto collectively(const F& f) {
  std::string err;
  decltype(f()) result{};
  try {
    result = f();
  } catch (const kfa_apps::SameOnEveryRank&) {
    throw;  // every rank is here with the same message: nothing to agree on
  } catch (const InputError& e) {
    err = e.what();
  }
  try {
    kmpi::agree(MPI_COMM_WORLD, err);
  } catch (const kfa::Error& e) {
    throw InputError(kfa_apps::message_of(e));
  }
  return result;
}

int main_pass(const Options& o) {
  const Problem p = collectively([&] { return load(o); });
  const bool f32 = p.q.dtype == DType::f32;
  if (o.command == "backward") return f32 ? run_backward<float>(o, p) : run_backward<double>(o, p);
  return f32 ? run_forward<float>(o, p) : run_forward<double>(o, p);
}

void print_error(const std::string& msg) {
  if (comm_rank() != 0) return;
  std::fflush(stdout);
  std::fprintf(stderr, "kfa-seqpar: error: %s\n", msg.c_str());
}

// ---- Agreement on the options ------------------------------------------------------------

// The options every rank must be given alike, each as a flag and its value as text; the
// command alone when the command line asks for help or the version (nothing collective
// follows).
std::vector<std::pair<std::string, std::string>> agreed_options(const Options& o) {
  std::vector<std::pair<std::string, std::string>> v;
  const auto add = [&](const char* flag, std::string value) {
    v.emplace_back(flag, value.empty() ? "none" : std::move(value));
  };
  const auto flag = [](bool b) { return std::string(b ? "given" : "not given"); };
  const auto maybe = [](const std::optional<long long>& x) {
    return x ? std::to_string(*x) : std::string("not given");
  };
  add("the command", o.action == kfa_apps::Action::help      ? "--help"
                     : o.action == kfa_apps::Action::version ? "--version"
                                                             : o.command);
  if (o.action != kfa_apps::Action::run) return v;
  add("--in", o.in);
  add("--out", o.out);
  std::string dims;
  for (std::size_t i = 0; i < o.random.size(); ++i)
    dims += (i ? "," : "") + std::to_string(o.random[i]);
  add("--random", dims);
  add("--heads-kv", maybe(o.heads_kv));
  add("--seqlen-k", maybe(o.seqlen_k));
  add("--head-dim-v", maybe(o.head_dim_v));
  add("--dtype", kfa_apps::name(o.dtype));
  add("--data-seed", std::to_string(o.data_seed));
  add("--repeat", std::to_string(o.repeat));
  add("--check", flag(o.check));
  add("--json", flag(o.json));
  add("--mode", kfa::name_of(o.mode));
  add("--layout", kfa::name_of(o.layout));
  add("--multiscale", flag(o.multiscale));
  add("--alibi", flag(o.alibi));
  kfa::for_each_field(o.params, [&](const kfa::Field& f, const auto& x) {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<X, bool>)
      add(f.flag, flag(x));
    else if constexpr (std::is_enum_v<X>)
      add(f.flag, kfa::name_of(x));
    else if constexpr (std::is_floating_point_v<X>)
      add(f.flag, kfa_apps::exact(x));  // distinct doubles never print alike
    else
      add(f.flag, std::to_string(x));
  });
  return v;
}

// Throws InputError on every rank, naming the first option whose value differs between
// ranks, with rank 0's value and that of the lowest rank that differs; returns on every rank
// when all agree. The values are compared as text, exactly: rank 0 sends its values, each
// rank compares, and one reduction finds the first difference.
void agree_on_options(const Options& o) {
  const auto mine = agreed_options(o);
  std::string blob;  // rank 0's values, each as its length, ':' and the text
  if (comm_rank() == 0)
    for (const auto& [flag, value] : mine)
      blob += std::to_string(value.size()) + ":" + value;
  unsigned long long size = blob.size();
  MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  blob.resize(size);
  MPI_Bcast(blob.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> theirs;
  for (std::size_t at = 0; at < blob.size();) {
    const std::size_t colon = blob.find(':', at);
    const std::size_t n = std::stoull(blob.substr(at, colon - at));
    theirs.push_back(blob.substr(colon + 1, n));
    at = colon + 1 + n;
  }
  // Ranks with help or the version list fewer options: the command itself differs first.
  const std::size_t count = std::max(mine.size(), theirs.size());
  std::size_t differs = count;
  for (std::size_t i = 0; i < count && differs == count; ++i)
    if (i >= mine.size() || i >= theirs.size() || mine[i].second != theirs[i]) differs = i;
  struct {
    int index, rank;
  } in{differs == count ? std::numeric_limits<int>::max() : static_cast<int>(differs), comm_rank()},
      first{};
  MPI_Allreduce(&in, &first, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD);
  if (first.index == std::numeric_limits<int>::max()) return;
  // Every rank lists option i: a rank listing the command alone differs at the command.
  const auto i = static_cast<std::size_t>(first.index);
  std::string value = comm_rank() == first.rank ? mine[i].second : std::string();
  int len = static_cast<int>(value.size());
  MPI_Bcast(&len, 1, MPI_INT, first.rank, MPI_COMM_WORLD);
  value.resize(static_cast<std::size_t>(len));
  MPI_Bcast(value.data(), len, MPI_CHAR, first.rank, MPI_COMM_WORLD);
  throw InputError(mine[i].first + " differs between ranks (" + theirs[i] + " on rank 0 vs " +
                   value + " on rank " + std::to_string(first.rank) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Options opts;
  // Ranks may be given different command lines: they agree on the parse's verdict, then on
  // the options, before anything collective (a file opened, a pass) can leave one waiting.
  try {
    collectively([&] {
      opts = parse(argc, argv);
      return 0;
    });
    agree_on_options(opts);
  } catch (const InputError& e) {
    print_error(e.what());
    MPI_Finalize();
    return 2;
  }
  if (opts.action != kfa_apps::Action::run) {
    if (comm_rank() == 0)
      std::cout << (opts.action == kfa_apps::Action::help ? kUsage + kfa_apps::pass_flags_usage()
                                                          : kfa_apps::version_text("kfa-seqpar"));
    MPI_Finalize();
    return 0;
  }
  int status = 2;
  {
    std::optional<Kokkos::ScopeGuard> kokkos;
    try {
      kokkos.emplace(argc, argv);
    } catch (const std::exception& e) {  // every rank reads the same (agreed) flags
      print_error(std::string("cannot initialise Kokkos: ") + e.what());
      MPI_Finalize();
      return 2;
    }
    try {
      status = main_pass(opts);
    } catch (const kfa_apps::WriteError& e) {  // raised on every rank alike
      // The temporary file is gone. HDF5 1.10's exit handlers (at exit and in MPI_Finalize)
      // can crash after a failed write, so every rank ends here without them, together.
      print_error(e.what());
      std::fflush(stderr);
      MPI_Barrier(MPI_COMM_WORLD);
      std::_Exit(2);
    } catch (const kmpi::CollectiveError& e) {  // raised on every rank alike
      print_error(kfa_apps::message_of(e));
    } catch (const kfa::Error& e) {
      // Any other kfa::Error (a kernel launch refused) may be on this rank only.
      std::fprintf(stderr, "kfa-seqpar: error on rank %d: %s\n", comm_rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    } catch (const InputError& e) {  // raised on every rank alike (see collectively)
      print_error(e.what());
    } catch (const std::bad_alloc&) {
      // Past the memory check (memory taken by something else meanwhile), maybe on this rank
      // only: end the job with a sentence rather than a bare std::bad_alloc.
      std::fprintf(stderr,
                   "kfa-seqpar: error on rank %d: out of memory (the node's memory is short of "
                   "what this rank's rows need)\n",
                   comm_rank());
      MPI_Abort(MPI_COMM_WORLD, 2);
    } catch (const std::exception& e) {
      // Unexpected, maybe on this rank only: end the whole job rather than leave ranks waiting.
      std::fprintf(stderr, "kfa-seqpar: error on rank %d: %s\n", comm_rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Finalize();
  return status;
}
