#pragma once
// Running the kfa programs from a test: command line in, exit status and both streams out,
// and HDF5 datasets to and from the reference's host tensors.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "h5io.hpp"
#include "problem.hpp"
#include "views.hpp"

namespace kfa_test {

struct ProgramRun {
  int status = -1;
  std::string out, err;
};

/// A scratch folder of this test process.
inline std::filesystem::path work_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("kfa_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Runs `command` through the shell, capturing stdout and stderr.
inline ProgramRun run_program(const std::string& command) {
  const auto out = work_dir() / "stdout.txt", err = work_dir() / "stderr.txt";
  const std::string cmd = command + " >" + out.string() + " 2>" + err.string();
  const int raw = std::system(cmd.c_str());
  ProgramRun r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline kfa_apps::Dataset from_tensor(const Tensor4& t, kfa_apps::DType dtype) {
  kfa_apps::Dataset d;
  d.dtype = dtype;
  for (int r = 0; r < 4; ++r)
    d.dims.push_back(t.extent(r));
  d.data.assign(t.data(), t.data() + t.span());
  for (auto& x : d.data)
    x = kfa_apps::rounded(dtype, x);
  return d;
}

inline Tensor4 to_tensor(const kfa_apps::Dataset& d) {
  Tensor4 t("t", d.dims[0], d.dims[1], d.dims[2], d.dims[3]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

inline Tensor3 to_tensor3(const kfa_apps::Dataset& d) {
  Tensor3 t("t", d.dims[0], d.dims[1], d.dims[2]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

}  // namespace kfa_test
