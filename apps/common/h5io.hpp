#pragma once
// HDF5 I/O for the kfa programs: tensors of float32, float64, bfloat16 or float16, read into
// double (exact for all four) and written back in their own type; masks of uint8 (written
// only). Whole datasets for kfa; with a parallel HDF5, slabs of rows for kfa-seqpar, each rank
// reading and writing only its own rows through MPI-IO. Files are written under a temporary
// name and renamed, so an output file exists only when everything was written.
//
// HDF5 has no predefined 16-bit float types; the 16-bit tensors are HDF5 float types built
// from IEEE F32LE with the fields of each format, and read back by those fields:
//   float16  (IEEE binary16) 2 bytes, little-endian: sign bit 15, exponent bits 10-14 (bias
//            15), mantissa bits 0-9, as h5py writes numpy.float16;
//   bfloat16 2 bytes, little-endian: sign bit 15, exponent bits 7-14 (bias 127), mantissa bits
//            0-6, the upper half of a float32.
// HDF5 converts both to and from float and double itself (H5Dread into H5T_NATIVE_FLOAT).
// Values written as 16-bit must already be values of that type (the programs write kfa::bf16
// and kfa::half tensors), so that HDF5's conversion from double is exact.

#include <hdf5.h>
#ifdef H5_HAVE_PARALLEL
#include <mpi.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kfa_apps {

/// A failure the user can fix (bad file, bad flag); main prints it as one line and exits 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An InputError that a collective step raised alike on every rank, its message already
/// naming the rank it concerns: kfa-seqpar reports it as it is.
struct SameOnEveryRank : InputError {
  using InputError::InputError;
};

/// A failure to write the output (a full disk, a file-size limit): the temporary file is
/// already removed. The programs end at once on it (std::_Exit), skipping HDF5's exit handlers,
/// which HDF5 1.10 can crash in after a failed write.
struct WriteError : InputError {
  using InputError::InputError;
};

enum class DType { f32, f64, u8, bf16, f16 };
inline const char* name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    case DType::u8:
      break;
  }
  return "uint8";
}
/// Whether t is one of the 16-bit float types (kfa::bf16, kfa::half in the programs).
inline bool is_16bit(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

struct Dataset {
  std::vector<hsize_t> dims;
  DType dtype = DType::f32;
  std::vector<double> data;         // row-major, for the float types
  std::vector<std::uint8_t> bytes;  // row-major, for u8 (a mask need not take 8 bytes a flag)
  std::size_t size() const {
    std::size_t n = 1;
    for (auto d : dims)
      n *= d;
    return n;
  }
};

class H5File {
 public:
  /// Opens an existing file read-only; throws InputError if missing, unreadable or not HDF5.
  explicit H5File(const std::string& path);
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  bool has(const std::string& dataset) const;
  /// Global dims and type of a float dataset of the given rank (no data), as read checks them.
  Dataset header(const std::string& dataset, int rank) const;
  /// Reads a float32, float64, bfloat16 or float16 dataset of the given rank; throws
  /// InputError otherwise.
  Dataset read(const std::string& dataset, int rank) const;
  /// Reads an integer dataset of the given rank: with `bytes`, a uint8 one into Dataset::bytes;
  /// else one of any integer type into Dataset::data as doubles (dtype f64). Throws InputError
  /// for another type.
  Dataset read_integers(const std::string& dataset, int rank, bool bytes) const;
  /// The names of the file's top-level objects ("/q", ...).
  std::vector<std::string> names() const;

 private:
  std::string path_;
  hid_t id_ = -1;
};

/// Bytes of one element of a dataset of type t.
inline std::size_t element_bytes(DType t) {
  return t == DType::u8 ? 1 : is_16bit(t) ? 2 : t == DType::f32 ? 4 : 8;
}

/// Throws InputError, naming `path` as the user gave it and the OS's reason, unless the input
/// file is something other than a directory that can be opened.
void check_input_path(const std::string& path);

/// Throws InputError, naming `path` and the OS's reason, unless OUT can be created: its folder
/// exists and is writable and OUT is not a folder. Checked before any compute.
void check_output_path(const std::string& path);

/// Throws InputError when the file system of OUT's folder has less than `bytes` free.
void check_free_space(const std::string& path, double bytes);

/// The elements of the dataset that are NaN or infinite: their count and the first one's
/// index (row-major, in the dataset's dims).
struct NonFinite {
  std::size_t count = 0;
  std::vector<hsize_t> first;
};
NonFinite find_non_finite(const Dataset& d);

/// Throws InputError when d holds NaN or Inf (they would come out as a wrong answer that --check
/// blames on the kernel), naming `where`, the count and the first index, and the flag that
/// allows them (--allow-nonfinite).
void refuse_non_finite(const Dataset& d, const std::string& where);

/// "(1,2,3)".
std::string shape_of(const std::vector<hsize_t>& dims);

/// Throws InputError for a top-level object of the file that no kfa pass reads or writes
/// (a /mask the passes would silently not apply). `multiscale`: --multiscale's /mask and
/// /rsum are read, /lse and /dlse are not; `terms`: the score terms /alibi_slopes, /bias,
/// /mask (uint8) and /key_lengths are read; `varlen`: /cu_seqlens_q and /cu_seqlens_k are read
/// (the kfa program; kfa-seqpar has no varlen). `program` names the reader in the message.
void check_known_datasets(const std::vector<std::string>& names, const std::string& path,
                          bool multiscale = false, bool terms = false, bool varlen = false,
                          const char* program = "kfa");

/// Writes the datasets to path atomically (temporary file, then rename). Throws WriteError
/// (temporary file removed) when writing fails, InputError when the disk has too little free
/// space for them.
void write_atomic(const std::string& path,
                  const std::vector<std::pair<std::string, const Dataset*>>& datasets);

#ifdef H5_HAVE_PARALLEL
/// Global rows [begin, begin + size) along dimension 2 (seqlen) of a tensor file.
struct RowRange {
  hsize_t begin = 0, size = 0;
};

/// A file opened read-only by every rank of a communicator (MPI-IO). Every call is collective
/// and fails alike on every rank (all read the same header).
class ParallelH5File {
 public:
  ParallelH5File(const std::string& path, MPI_Comm comm);
  ~ParallelH5File();
  ParallelH5File(const ParallelH5File&) = delete;
  ParallelH5File& operator=(const ParallelH5File&) = delete;

  bool has(const std::string& dataset) const;
  /// Global dims and type of a float dataset of the given rank (no data), as H5File::read.
  Dataset header(const std::string& dataset, int rank) const;
  /// The names of the file's top-level objects ("/q", ...).
  std::vector<std::string> names() const;
  /// The whole dataset on every rank, as H5File::read and H5File::read_integers (for what
  /// every rank holds whole: the score terms).
  Dataset read(const std::string& dataset, int rank) const;
  Dataset read_integers(const std::string& dataset, int rank, bool bytes) const;
  /// This rank's rows of the dataset, in the order given: dims are (B, H, rows[, D]).
  Dataset read_rows(const std::string& dataset, int rank, const std::vector<RowRange>& rows) const;

 private:
  std::string path_;
  hid_t id_ = -1;
};

/// One dataset of a parallel write: its global dims, and this rank's rows of it (local).
struct RowSlab {
  std::string name;
  std::vector<hsize_t> global_dims;
  const Dataset* local = nullptr;
  std::vector<RowRange> rows;
};

/// Collective: every rank writes its rows of each dataset into path through MPI-IO, under a
/// temporary name that rank 0 renames once every rank has written. Throws InputError on every
/// rank when any rank failed (and removes the temporary file).
void write_rows_atomic(const std::string& path, const std::vector<RowSlab>& slabs, MPI_Comm comm);
#endif

}  // namespace kfa_apps
