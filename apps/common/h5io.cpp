#include "h5io.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

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

H5File::H5File(const std::string& path) : path_(path) {
  silence_hdf5();
  if (!std::ifstream(path).good())
    throw InputError("cannot open input file '" + path + "': " + std::strerror(errno));
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

Dataset H5File::read(const std::string& name, int rank) const {
  const std::string where = "dataset " + name + " in '" + path_ + "'";
  if (!has(name)) throw InputError("missing " + where);
  Handle ds{H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw InputError("cannot open " + where);
  Handle type{H5Dget_type(ds.id), H5Tclose};
  Handle space{H5Dget_space(ds.id), H5Sclose};
  if (type.id < 0 || space.id < 0) throw InputError("cannot read the header of " + where);
  Dataset out;
  if (H5Tget_class(type.id) != H5T_FLOAT)
    throw InputError(where + " has a non-floating-point type; expected float32 or float64");
  const size_t bytes = H5Tget_size(type.id);
  if (bytes == 4)
    out.dtype = DType::f32;
  else if (bytes == 8)
    out.dtype = DType::f64;
  else
    throw InputError(where + " has a " + std::to_string(8 * bytes) +
                     "-bit float type; expected float32 or float64");
  const int got = H5Sget_simple_extent_ndims(space.id);
  if (got != rank)
    throw InputError(where + " has rank " + std::to_string(got) + ", expected " +
                     std::to_string(rank));
  out.dims.resize(rank);
  H5Sget_simple_extent_dims(space.id, out.dims.data(), nullptr);
  out.data.resize(out.size());
  if (!out.data.empty() &&
      H5Dread(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data.data()) < 0)
    throw InputError("cannot read the data of " + where + " (corrupted?)");
  return out;
}

void write_atomic(const std::string& path,
                  const std::vector<std::pair<std::string, const Dataset*>>& datasets) {
  silence_hdf5();
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  bool ok = false;
  {
    Handle file{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) throw InputError("cannot create output file '" + tmp + "'");
    ok = true;
    for (const auto& [name, d] : datasets) {
      Handle space{H5Screate_simple(int(d->dims.size()), d->dims.data(), nullptr), H5Sclose};
      const bool u8 = d->dtype == DType::u8;
      const hid_t ftype = u8                       ? H5T_STD_U8LE
                          : d->dtype == DType::f32 ? H5T_IEEE_F32LE
                                                   : H5T_IEEE_F64LE;
      const hid_t mtype = u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_DOUBLE;
      const void* buf = u8 ? static_cast<const void*>(d->bytes.data()) : d->data.data();
      const bool empty = u8 ? d->bytes.empty() : d->data.empty();
      Handle ds{
          H5Dcreate2(file.id, name.c_str(), ftype, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose};
      if (ds.id < 0 || (!empty && H5Dwrite(ds.id, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)) {
        ok = false;
        break;
      }
    }
    if (ok && H5Fflush(file.id, H5F_SCOPE_GLOBAL) < 0) ok = false;
  }
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError("cannot write output file '" + path + "'");
  }
}

}  // namespace kfa_apps
