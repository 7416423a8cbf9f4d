#include "h5io.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace kfa_apps {

namespace {

// HDF5 prints its error stack on stderr by default; the programs report one line instead.
void silence_hdf5() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// Closes an HDF5 handle with the right call when the scope ends.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

}  // namespace

void check_input_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError("input '" + path + "' is a directory, not an HDF5 file");
  if (!std::ifstream(path).good())
    throw InputError("cannot open input file '" + path + "': " + std::strerror(errno));
}

namespace {

// The folder OUT is written in, as the user named it ("." for a bare name).
std::filesystem::path folder_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

}  // namespace

void check_output_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError("--out '" + path + "' is a directory; give a file name");
  const std::filesystem::path dir = folder_of(path);
  if (!std::filesystem::exists(dir, ec))
    throw InputError("cannot write '" + path + "': folder '" + dir.string() + "' does not exist");
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError("cannot write '" + path + "': '" + dir.string() + "' is not a folder");
  // The output is written beside OUT under a temporary name, then renamed over it.
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError("cannot write '" + path + "': folder '" + dir.string() +
                     "': " + std::strerror(errno));
}

void check_free_space(const std::string& path, double bytes) {
  const std::filesystem::path dir = folder_of(path);
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) != 0) return;  // unknown: the write itself will tell
  const double free = double(fs.f_bavail) * double(fs.f_frsize);
  // HDF5's own metadata: a few KiB a dataset; 1 MiB covers it.
  const double need = bytes + double(1 << 20);
  if (need > free) {
    std::ostringstream os;
    os << "not enough free space to write '" << path << "': it needs about "
       << static_cast<unsigned long long>(need) << " bytes, and the file system of '"
       << dir.string() << "' has " << static_cast<unsigned long long>(free) << " free";
    throw InputError(os.str());
  }
}

std::string shape_of(const std::vector<hsize_t>& dims) {
  std::string out = "(";
  for (std::size_t i = 0; i < dims.size(); ++i)
    out += (i ? "," : "") + std::to_string(dims[i]);
  return out + ")";
}

NonFinite find_non_finite(const Dataset& d) {
  NonFinite nf;
  std::size_t first = 0;
  for (std::size_t e = 0; e < d.data.size(); ++e)
    if (!std::isfinite(d.data[e]) && nf.count++ == 0) first = e;
  if (nf.count == 0) return nf;
  nf.first.resize(d.dims.size());
  for (std::size_t r = d.dims.size(); r-- > 0;) {
    nf.first[r] = first % d.dims[r];
    first /= d.dims[r];
  }
  return nf;
}

void refuse_non_finite(const Dataset& d, const std::string& where) {
  const NonFinite nf = find_non_finite(d);
  if (nf.count > 0)
    throw InputError(where + " holds " + std::to_string(nf.count) + " non-finite value" +
                     (nf.count == 1 ? "" : "s") + ", the first at " + shape_of(nf.first) +
                     "; pass --allow-nonfinite to run anyway");
}

void check_known_datasets(const std::vector<std::string>& names, const std::string& path,
                          bool multiscale, bool terms, bool varlen, const char* program) {
  static const char* const known[] = {"/q",  "/k",    "/v",  "/o",  "/lse",
                                      "/do", "/dlse", "/dq", "/dk", "/dv"};
  static const char* const known_varlen[] = {"/cu_seqlens_q", "/cu_seqlens_k"};
  static const char* const known_msa[] = {"/mask", "/rsum"};  // --multiscale's own
  static const char* const known_terms[] = {"/alibi_slopes", "/bias",
                                            "/key_lengths"};  // kfa's score terms
  const auto in = [](const auto& list, const std::string& n) {
    return std::find(std::begin(list), std::end(list), n) != std::end(list);
  };
  // --multiscale reads neither the softmax statistic nor its gradient.
  const auto softmax_only = [&](const std::string& n) { return n == "/lse" || n == "/dlse"; };
  for (const std::string& n : names)
    if ((!in(known, n) || (multiscale && softmax_only(n))) && !(multiscale && in(known_msa, n)) &&
        !(terms && (in(known_terms, n) || n == "/mask")) && !(varlen && in(known_varlen, n))) {
      std::string msg = "'";
      msg += path;
      msg += "' holds ";
      msg += n;
      msg += ", which ";
      msg += program;
      msg +=
          " does not read (forward reads /q /k /v; backward also /o /lse /do and /dlse; "
          "--multiscale also /mask (float), and /rsum instead of /lse and no /dlse; without "
          "--multiscale also /alibi_slopes, /bias, /mask (uint8) or /key_lengths";
      if (varlen) msg += "; varlen (rank-3 /q /k /v) /cu_seqlens_q and /cu_seqlens_k";
      msg += "): remove it, or it would be silently ignored";
      throw InputError(msg);
    }
}

H5File::H5File(const std::string& path) : path_(path) {
  silence_hdf5();
  check_input_path(path);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw InputError("input file '" + path + "' is not a readable HDF5 file (corrupted?)");
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id_ < 0) throw InputError("cannot open '" + path + "' as HDF5 (corrupted?)");
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

bool H5File::has(const std::string& dataset) const {
  return H5Lexists(id_, dataset.c_str(), H5P_DEFAULT) > 0;
}

namespace {

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
  return 0;
}

std::vector<std::string> names_in(hid_t file) {
  std::vector<std::string> out;
  hsize_t at = 0;
  H5Literate(file, H5_INDEX_NAME, H5_ITER_NATIVE, &at, collect_name, &out);
  return out;
}

}  // namespace

std::vector<std::string> H5File::names() const {
  return names_in(id_);
}

namespace {

// The fields of a 16-bit float type (h5io.hpp): sign, exponent and mantissa positions and
// sizes, exponent bias.
struct Fields {
  size_t spos, epos, esize, mpos, msize, ebias;
};
Fields fields_of(DType t) {
  return t == DType::f16 ? Fields{15, 10, 5, 0, 10, 15} : Fields{15, 7, 8, 0, 7, 127};
}

// Whether the 2-byte float type `type` has the fields of t (bfloat16 or float16).
bool same_fields(hid_t type, DType t) {
  Fields got{};
  if (H5Tget_fields(type, &got.spos, &got.epos, &got.esize, &got.mpos, &got.msize) < 0)
    return false;
  got.ebias = H5Tget_ebias(type);
  const Fields want = fields_of(t);
  return got.spos == want.spos && got.epos == want.epos && got.esize == want.esize &&
         got.mpos == want.mpos && got.msize == want.msize && got.ebias == want.ebias;
}

void read_dims(hid_t space, const std::string& where, int rank, Dataset& out);

// Type and global dims of a float dataset of the given rank (its data is left unread).
Dataset read_header(hid_t ds, const std::string& where, int rank) {
  Handle type{H5Dget_type(ds), H5Tclose};
  Handle space{H5Dget_space(ds), H5Sclose};
  if (type.id < 0 || space.id < 0) throw InputError("cannot read the header of " + where);
  Dataset out;
  const char* expected = "; expected float32, float64, bfloat16 or float16";
  if (H5Tget_class(type.id) != H5T_FLOAT)
    throw InputError(where + " has a non-floating-point type" + expected);
  const size_t bytes = H5Tget_size(type.id);
  if (bytes == 4)
    out.dtype = DType::f32;
  else if (bytes == 8)
    out.dtype = DType::f64;
  else if (bytes == 2 && same_fields(type.id, DType::f16))
    out.dtype = DType::f16;
  else if (bytes == 2 && same_fields(type.id, DType::bf16))
    out.dtype = DType::bf16;
  else if (bytes == 2)
    throw InputError(where + " has a 16-bit float type that is neither IEEE binary16 nor " +
                     "bfloat16 (h5io.hpp gives their fields)" + expected);
  else
    throw InputError(where + " has a " + std::to_string(8 * bytes) + "-bit float type" + expected);
  read_dims(space.id, where, rank, out);
  return out;
}

// The rank and global dims of a dataset whose dataspace is `space`, checked against `rank` and
// against what the programs can index and hold, into out.dims.
void read_dims(hid_t space, const std::string& where, int rank, Dataset& out) {
  const int got = H5Sget_simple_extent_ndims(space);
  if (got != rank)
    throw InputError(where + " has rank " + std::to_string(got) + ", expected " +
                     std::to_string(rank));
  out.dims.resize(rank);
  H5Sget_simple_extent_dims(space, out.dims.data(), nullptr);
  // The programs index each extent with int and hold the elements in memory: a header
  // declaring more is refused here, before anything is allocated.
  double elements = 1;
  for (int i = 0; i < rank; ++i) {
    if (out.dims[i] > hsize_t(INT_MAX))
      throw InputError(where + " declares shape " + shape_of(out.dims) + ": extent " +
                       std::to_string(out.dims[i]) + " (dimension " + std::to_string(i) +
                       ") is more than the kernels' int indices hold (" + std::to_string(INT_MAX) +
                       ")");
    elements *= double(out.dims[i]);
  }
  if (elements * 8 > double(SIZE_MAX) / 2)
    throw InputError(where + " declares shape " + shape_of(out.dims) +
                     ": its element count overflows this machine's sizes");
}

// The type a dataset of t is stored in, as a handle of its own (closed with it); id -1 when
// HDF5 refuses it, which fails the dataset's creation and so the write.
Handle file_type(DType t) {
  if (!is_16bit(t))
    return Handle{H5Tcopy(t == DType::u8    ? H5T_STD_U8LE
                          : t == DType::f32 ? H5T_IEEE_F32LE
                                            : H5T_IEEE_F64LE),
                  H5Tclose};
  // float32's type with the fields of the 16-bit format, then cut to two bytes (the order in
  // which HDF5 accepts them: fields inside the size at every step).
  Handle type{H5Tcopy(H5T_IEEE_F32LE), H5Tclose};
  const Fields f = fields_of(t);
  if (H5Tset_fields(type.id, f.spos, f.epos, f.esize, f.mpos, f.msize) < 0 ||
      H5Tset_size(type.id, 2) < 0 || H5Tset_ebias(type.id, f.ebias) < 0)
    return Handle{-1, H5Tclose};
  return Handle{std::exchange(type.id, -1), H5Tclose};
}

}  // namespace

Dataset H5File::header(const std::string& name, int rank) const {
  const std::string where = "dataset " + name + " in '" + path_ + "'";
  if (!has(name)) throw InputError("missing " + where);
  Handle ds{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  return read_header(ds.id, where, rank);
}

namespace {

// A whole float dataset of `file` (path: its name in errors), as H5File::read.
Dataset read_whole(hid_t file, const std::string& path, const std::string& name, int rank) {
  const std::string where = "dataset " + name + " in '" + path + "'";
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) throw InputError("missing " + where);
  Handle ds{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  Dataset out = read_header(ds.id, where, rank);
  out.data.resize(out.size());
  if (!out.data.empty() &&
      H5Dread(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data.data()) < 0)
    throw InputError("cannot read the data of " + where + " (corrupted?)");
  return out;
}

// A whole integer dataset of `file`, as H5File::read_integers.
Dataset read_whole_integers(hid_t file, const std::string& path, const std::string& name, int rank,
                            bool bytes) {
  const std::string where = "dataset " + name + " in '" + path + "'";
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) throw InputError("missing " + where);
  Handle ds{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  Handle type{H5Dget_type(ds.id), H5Tclose};
  Handle space{H5Dget_space(ds.id), H5Sclose};
  if (type.id < 0 || space.id < 0) throw InputError("cannot read the header of " + where);
  if (H5Tget_class(type.id) != H5T_INTEGER ||
      (bytes && (H5Tget_size(type.id) != 1 || H5Tget_sign(type.id) != H5T_SGN_NONE)))
    throw InputError(where + (bytes ? " must be uint8" : " must have an integer type"));
  Dataset out;
  read_dims(space.id, where, rank, out);
  if (bytes) {
    out.dtype = DType::u8;
    out.bytes.resize(out.size());
  } else {
    out.dtype = DType::f64;  // integers held as doubles: exact up to 2^53
    out.data.resize(out.size());
  }
  void* buf = bytes ? static_cast<void*>(out.bytes.data()) : out.data.data();
  if (out.size() > 0 && H5Dread(ds.id, bytes ? H5T_NATIVE_UINT8 : H5T_NATIVE_DOUBLE, H5S_ALL,
                                H5S_ALL, H5P_DEFAULT, buf) < 0)
    throw InputError("cannot read the data of " + where + " (corrupted?)");
  return out;
}

}  // namespace

Dataset H5File::read(const std::string& name, int rank) const {
  return read_whole(id_, path_, name, rank);
}

Dataset H5File::read_integers(const std::string& name, int rank, bool bytes) const {
  return read_whole_integers(id_, path_, name, rank, bytes);
}

void write_atomic(const std::string& path,
                  const std::vector<std::pair<std::string, const Dataset*>>& datasets) {
  silence_hdf5();
  double bytes = 0;
  for (const auto& [name, d] : datasets)
    bytes += double(d->size()) * double(element_bytes(d->dtype));
  check_free_space(path, bytes);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  bool ok = false;
  errno = 0;  // what the system said of a failed write, if anything
  {
    Handle file{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file.id < 0)
      throw WriteError("cannot create output file '" + path + "' (as '" + tmp + "')");
    ok = true;
    for (const auto& [name, d] : datasets) {
      Handle space{H5Screate_simple(int(d->dims.size()), d->dims.data(), nullptr), H5Sclose};
      const bool u8 = d->dtype == DType::u8;
      const Handle ftype = file_type(d->dtype);
      const hid_t mtype = u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_DOUBLE;
      const void* buf = u8 ? static_cast<const void*>(d->bytes.data()) : d->data.data();
      const bool empty = u8 ? d->bytes.empty() : d->data.empty();
      Handle ds{H5Dcreate2(file.id, name.c_str(), ftype.id, space.id, H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose};
      if (ds.id < 0 || (!empty && H5Dwrite(ds.id, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)) {
        ok = false;
        break;
      }
    }
    if (ok && H5Fflush(file.id, H5F_SCOPE_GLOBAL) < 0) ok = false;
    // The close writes what the flush left (a failure there is a failed write too).
    if (H5Fclose(std::exchange(file.id, -1)) < 0) ok = false;
  }
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : "";
    std::remove(tmp.c_str());
    throw WriteError("cannot write output file '" + path + "'" + why +
                     "; nothing was written, an existing file is left as it was");
  }
}

#ifdef H5_HAVE_PARALLEL
namespace {

// Selects this rank's rows (along dimension 2) of a dataset of global dims in `space`.
void select_rows(hid_t space, const std::vector<hsize_t>& dims, const std::vector<RowRange>& rows) {
  H5Sselect_none(space);
  for (const RowRange& r : rows) {
    if (r.size == 0) continue;
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[2] = r.begin;
    count[2] = r.size;
    H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr);
  }
}

// The local extents of `rows` of a dataset of global dims.
std::vector<hsize_t> local_dims(std::vector<hsize_t> dims, const std::vector<RowRange>& rows) {
  dims[2] = 0;
  for (const RowRange& r : rows)
    dims[2] += r.size;
  return dims;
}

// A file-access list for MPI-IO on comm, and a transfer list for collective reads and writes.
Handle mpio_access(MPI_Comm comm) {
  Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_fapl_mpio(fapl.id, comm, MPI_INFO_NULL);
  return Handle{std::exchange(fapl.id, -1), H5Pclose};
}
Handle collective_transfer() {
  Handle dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
  H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
  return Handle{std::exchange(dxpl.id, -1), H5Pclose};
}

// Whether every rank of comm is ok (a collective step: none goes on alone into HDF5's
// collective calls when another has failed).
bool all_ok(bool ok, MPI_Comm comm) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, comm);
  return v == 1;
}

// "" on every rank when `err` is empty on every rank; otherwise the lowest failing rank's
// message, naming that rank, on every rank (its path may differ from rank 0's: another
// working folder, another node's file system).
std::string first_error(const std::string& err, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = err.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return "";
  std::string msg = err;
  int len = static_cast<int>(msg.size());
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  msg.resize(static_cast<std::size_t>(len));
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, comm);
  return size > 1 ? "rank " + std::to_string(first) + ": " + msg : msg;
}

}  // namespace

ParallelH5File::ParallelH5File(const std::string& path, MPI_Comm comm) : path_(path) {
  silence_hdf5();
  std::string err;
  try {
    check_input_path(path);
    if (H5Fis_hdf5(path.c_str()) <= 0)
      err = "input file '" + path + "' is not a readable HDF5 file (corrupted?)";
  } catch (const InputError& e) {
    err = e.what();
  }
  err = first_error(err, comm);
  if (!err.empty()) throw SameOnEveryRank(err);
  const Handle fapl = mpio_access(comm);
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id);
  if (id_ < 0) throw InputError("cannot open '" + path + "' as HDF5 (corrupted?)");
}

ParallelH5File::~ParallelH5File() {
  if (id_ >= 0) H5Fclose(id_);
}

bool ParallelH5File::has(const std::string& dataset) const {
  return H5Lexists(id_, dataset.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> ParallelH5File::names() const {
  return names_in(id_);
}

Dataset ParallelH5File::header(const std::string& name, int rank) const {
  const std::string where = "dataset " + name + " in '" + path_ + "'";
  if (!has(name)) throw InputError("missing " + where);
  Handle ds{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  return read_header(ds.id, where, rank);
}

Dataset ParallelH5File::read(const std::string& name, int rank) const {
  return read_whole(id_, path_, name, rank);
}

Dataset ParallelH5File::read_integers(const std::string& name, int rank, bool bytes) const {
  return read_whole_integers(id_, path_, name, rank, bytes);
}

Dataset ParallelH5File::read_rows(const std::string& name, int rank,
                                  const std::vector<RowRange>& rows) const {
  const std::string where = "dataset " + name + " in '" + path_ + "'";
  if (!has(name)) throw InputError("missing " + where);
  Handle ds{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  const Dataset global = read_header(ds.id, where, rank);
  // HDF5 fills a selection in file order, so the rows must come ascending and disjoint.
  hsize_t end = 0;
  for (const RowRange& r : rows) {
    if (r.size > 0 && r.begin < end)
      throw InputError("read_rows of " + where + ": row ranges must be ascending and disjoint");
    if (r.size > 0) end = r.begin + r.size;
  }
  if (end > global.dims[2])
    throw InputError(where + " has seqlen " + std::to_string(global.dims[2]) +
                     ", fewer than the rows asked for");
  Handle fspace{H5Dget_space(ds.id), H5Sclose};
  select_rows(fspace.id, global.dims, rows);
  Dataset out;
  out.dtype = global.dtype;
  out.dims = local_dims(global.dims, rows);
  out.data.resize(out.size());
  Handle mspace{H5Screate_simple(int(out.dims.size()), out.dims.data(), nullptr), H5Sclose};
  if (out.data.empty()) H5Sselect_none(mspace.id);
  const Handle dxpl = collective_transfer();
  // Every rank takes part in the collective read, also with nothing to read.
  double dummy = 0;
  if (H5Dread(ds.id, H5T_NATIVE_DOUBLE, mspace.id, fspace.id, dxpl.id,
              out.data.empty() ? &dummy : out.data.data()) < 0)
    throw InputError("cannot read the data of " + where + " (corrupted?)");
  return out;
}

void write_rows_atomic(const std::string& path, const std::vector<RowSlab>& slabs, MPI_Comm comm) {
  silence_hdf5();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // One temporary name for all ranks: rank 0's process id.
  long long pid = getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm);
  const std::string tmp = path + ".tmp." + std::to_string(pid);
  // The whole file's size, on rank 0, which renames it.
  std::string space_err;
  if (rank == 0) try {
      double bytes = 0;
      for (const RowSlab& s : slabs) {
        double n = 1;
        for (hsize_t d : s.global_dims)
          n *= double(d);
        bytes += n * double(element_bytes(s.local->dtype));
      }
      check_free_space(path, bytes);
    } catch (const InputError& e) {
      space_err = e.what();
    }
  space_err = first_error(space_err, comm);
  if (!space_err.empty()) throw InputError(space_err);
  int ok = 1;
  {
    const Handle fapl = mpio_access(comm);
    Handle file{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose};
    if (!all_ok(file.id >= 0, comm)) {
      if (rank == 0) std::remove(tmp.c_str());
      throw WriteError("cannot create output file '" + path + "' (as '" + tmp + "')");
    }
    const Handle dxpl = collective_transfer();
    for (const RowSlab& s : slabs) {
      Handle fspace{H5Screate_simple(int(s.global_dims.size()), s.global_dims.data(), nullptr),
                    H5Sclose};
      // Created by every rank alike (collective), then each writes its rows.
      const Handle ftype = file_type(s.local->dtype);
      Handle ds{H5Dcreate2(file.id, s.name.c_str(), ftype.id, fspace.id, H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose};
      if (!all_ok(ds.id >= 0, comm)) {  // then no rank enters the collective write
        ok = 0;
        break;
      }
      select_rows(fspace.id, s.global_dims, s.rows);
      const std::vector<hsize_t> mine = local_dims(s.global_dims, s.rows);
      Handle mspace{H5Screate_simple(int(mine.size()), mine.data(), nullptr), H5Sclose};
      if (s.local->data.empty()) H5Sselect_none(mspace.id);
      const double dummy = 0;
      const herr_t written = H5Dwrite(ds.id, H5T_NATIVE_DOUBLE, mspace.id, fspace.id, dxpl.id,
                                      s.local->data.empty() ? &dummy : s.local->data.data());
      if (!all_ok(written >= 0, comm)) {
        ok = 0;
        break;
      }
    }
  }  // closed (collectively) before anyone renames
  if (rank == 0 && (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)) {
    ok = 0;
    std::remove(tmp.c_str());
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  if (!ok)
    throw WriteError("cannot write output file '" + path +
                     "'; nothing was written, an existing file is left as it was");
}
#endif

}  // namespace kfa_apps
