// The kfa program through its contract: HDF5 round trips checked against the reference, the
// --random/--json/--check mode, and every bad-input class exiting 2 with one clear line and
// no output file.
#include <gtest/gtest.h>

#include <kfa/config.hpp>
#include <kfa/masks.hpp>
#ifdef KFA_CLI_NN
#include <kfa/mha_reference.hpp>
#endif
#include <kfa/params.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "h5io.hpp"
#include "problem.hpp"
#include "program.hpp"

#ifndef KFA_CLI_PATH
#error "KFA_CLI_PATH must name the kfa executable"
#endif

namespace {

namespace fs = std::filesystem;
using namespace kfa_test;
using kfa_apps::Dataset;
using kfa_apps::DType;

using CliRun = ProgramRun;

CliRun run_cli(const std::string& args) {
  return run_program(std::string(KFA_CLI_PATH) + " " + args);
}

fs::path write_inputs(const std::string& name, const Dataset& q, const Dataset& k,
                      const Dataset& v) {
  fs::path p = work_dir() / name;
  kfa_apps::write_atomic(p.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  return p;
}

// The /keep mask `kfa dropout-mask` writes for `params` (its dropout flags) and a shape, read
// back with the HDF5 API; empty without dropout.
Keep4 cli_mask(const Shape& s, const kfa::Params& params) {
  if (!(params.dropout > 0)) return {};
  const fs::path path = work_dir() / "mask.h5";
  const std::string shape = std::to_string(s.batch) + "," + std::to_string(s.heads_q) + "," +
                            std::to_string(s.seqlen_q) + "," + std::to_string(s.seqlen_k);
  std::ostringstream flags;
  flags.precision(17);
  flags << "--dropout " << params.dropout << " --seed " << params.seed << " --offset "
        << params.offset;
  const CliRun r =
      run_cli("dropout-mask --shape " + shape + " " + flags.str() + " --out " + path.string());
  EXPECT_EQ(r.status, 0) << r.err;
  Keep4 keep("keep", s.batch, s.heads_q, s.seqlen_q, s.seqlen_k);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, "/keep", H5P_DEFAULT);
  const hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  EXPECT_EQ(H5Tget_class(t), H5T_INTEGER);
  EXPECT_EQ(H5Tget_size(t), 1u);
  EXPECT_EQ(H5Tget_sign(t), H5T_SGN_NONE);
  hsize_t dims[4] = {0, 0, 0, 0};
  EXPECT_EQ(H5Sget_simple_extent_dims(sp, dims, nullptr), 4);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(dims[i], keep.extent(i));
  EXPECT_GE(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, keep.data()), 0);
  H5Sclose(sp);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return keep;
}

// The type the programs write a pass's LSE in for tensors of type t: float32 for 16-bit ones.
DType lse_type(DType t) {
  return kfa_apps::is_16bit(t) ? DType::f32 : t;
}

// Whether every value of d is a value of its type (16-bit outputs are written exactly).
bool holds_its_type(const Dataset& d) {
  for (double x : d.data)
    if (!(kfa_apps::rounded(d.dtype, x) == x)) return false;
  return true;
}

void round_trip(DType dtype, const std::string& flags, const kfa::Params& params,
                const Shape& shape = {2, 4, 2, 37, 91, 40}) {
  SCOPED_TRACE(::testing::Message() << flags << " " << kfa_apps::name(dtype) << " " << shape);
  Problem pb(shape, 2024);
  const Dataset q = from_tensor(pb.q, dtype), k = from_tensor(pb.k, dtype),
                v = from_tensor(pb.v, dtype);
  const fs::path in = write_inputs("in.h5", q, k, v), out = work_dir() / "out.h5";
  fs::remove(out);
  const CliRun r = run_cli("forward --in " + in.string() + " --out " + out.string() + " " + flags);
  ASSERT_EQ(r.status, 0) << r.err;
  kfa_apps::H5File f(out.string());
  const Dataset o = f.read("/o", 4), lse = f.read("/lse", 3);
  EXPECT_EQ(o.dtype, dtype);
  EXPECT_EQ(lse.dtype, lse_type(dtype));
  EXPECT_EQ(o.dims, (std::vector<hsize_t>{q.dims[0], q.dims[1], q.dims[2], v.dims[3]}));
  EXPECT_TRUE(holds_its_type(o));
  Tensor3 lse_t("lse", lse.dims[0], lse.dims[1], lse.dims[2]);
  std::copy(lse.data.begin(), lse.data.end(), lse_t.data());
  const Tensor4 qt = to_tensor(q), kt = to_tensor(k), vt = to_tensor(v);
  // With dropout the reference is fed the mask file of kfa dropout-mask: the check passes only
  // if that file holds the mask the forward applied.
  const Keep4 keep = cli_mask(shape, params);
  const auto c = kfa_apps::with_value_type(dtype, [&](auto t) {
    return kfa::reference::check_forward<decltype(t)>(qt, kt, vt, params, to_tensor(o), lse_t,
                                                      keep);
  });
  EXPECT_TRUE(c.ok()) << "O err " << c.o.err << " (bound " << c.o.bound << "), LSE err "
                      << c.lse.err << " (bound " << c.lse.bound << ")";
}

TEST(Cli, RoundTripThroughHdf5) {
  round_trip(DType::f32, "", kfa::Params{});
  round_trip(DType::f64, "", kfa::Params{});
  kfa::Params p;
  p.causal = true;
  p.align = kfa::Align::top_left;
  p.window_left = 20;
  p.scale = 0.3;
  p.softcap = 4;
  round_trip(DType::f32, "--causal --align top-left --window 20,-1 --scale 0.3 --softcap 4", p);
  round_trip(DType::f64, "--causal --align top-left --window 20,-1 --scale 0.3 --softcap 4", p);
  kfa::Params d;
  d.dropout = 0.3;
  d.seed = 11;
  d.offset = 5;
  round_trip(DType::f32, "--dropout 0.3 --seed 11 --offset 5", d);
  d.causal = true;
  round_trip(DType::f64, "--dropout 0.3 --seed 11 --offset 5 --causal", d);
}

// kfa dropout-mask writes exactly kfa::dropout_mask's mask, with the kept fraction it reports.
TEST(Cli, DropoutMaskFile) {
  kfa::Params p;
  p.dropout = 0.25;
  p.seed = 1ULL << 40;
  p.offset = 3;
  const Shape s{2, 3, 1, 50, 77, 16};
  const Keep4 file = cli_mask(s, p);
  const Keep4 lib = keep_mask(s, p);
  for (std::size_t e = 0; e < lib.span(); ++e)
    ASSERT_EQ(file.data()[e], lib.data()[e]) << "element " << e;
  const CliRun r = run_cli("dropout-mask --shape 1,1,200,200 --dropout 0.5 --seed 1 --json --out " +
                           (work_dir() / "m2.h5").string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('{'));
  for (const char* key : {"\"command\":\"dropout-mask\"", "\"dropout\":0.5,", "\"seed\":1,"})
    EXPECT_NE(last.find(key), std::string::npos) << key << " missing in " << last;
  const auto at = last.find("\"kept_fraction\":");
  ASSERT_NE(at, std::string::npos) << last;
  EXPECT_NEAR(std::stod(last.substr(at + 16)), 0.5, 0.01);
}

TEST(Cli, RandomWithJsonAndCheck) {
  const CliRun r = run_cli(
      "forward --random 2,4,150,64 --heads-kv 2 --seqlen-k 222 --causal "
      "--repeat 3 --json --check");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('{'));
  for (const char* key : {"\"median_s\":", "\"min_s\":", "\"gflops\":", "\"seqlen_k\":222",
                          "\"heads_kv\":2", "\"check\":\"pass\""})
    EXPECT_NE(last.find(key), std::string::npos) << key << " missing in " << last;
  EXPECT_EQ(last.back(), '\n');
  EXPECT_TRUE(r.err.empty()) << r.err;
  const CliRun d = run_cli("forward --random 1,2,64,32 --dtype double --check --json");
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_NE(d.out.find("\"dtype\":\"float64\""), std::string::npos);
}

// A check that cannot judge fails: scale 3e38 (float holds it) makes scores overflow float (kfa's
// result is NaN, the float64 reference stays finite), so the error is infinite and the verdict is
// FAIL, exit 1, with the infinite figures written as JSON null.
TEST(Cli, CheckWithNonFiniteErrorFails) {
  for (const char* pass : {"forward", "backward"}) {
    const CliRun r = run_cli(std::string(pass) + " --random 1,2,32,16 --scale 3e38 --check --json");
    EXPECT_EQ(r.status, 1) << pass << ": " << r.out << r.err;
    EXPECT_NE(r.out.find(": FAIL"), std::string::npos) << r.out;
    const std::string last = r.out.substr(r.out.rfind('{'));
    EXPECT_NE(last.find("\"check\":\"fail\""), std::string::npos) << last;
    EXPECT_NE(last.find(":null"), std::string::npos) << last;
    EXPECT_EQ(last.find("inf"), std::string::npos) << last;
  }
}

// kfa backward from a file with /o, /lse from kfa forward, random /do and /dlse: the written
// gradients pass the tolerance rule against the reference; --deterministic gives the same
// within rounding; --random --check passes.
void backward_round_trip(DType dtype, const std::string& flags, const kfa::Params& params,
                         const Shape& shape = {1, 4, 2, 45, 70, 32}) {
  SCOPED_TRACE(::testing::Message() << flags << " " << kfa_apps::name(dtype) << " " << shape);
  Problem pb(shape, 2025);
  const Dataset q = from_tensor(pb.q, dtype), k = from_tensor(pb.k, dtype),
                v = from_tensor(pb.v, dtype);
  const fs::path in = write_inputs("bin.h5", q, k, v), fwd = work_dir() / "bfwd.h5",
                 bin = work_dir() / "bwd_in.h5", out = work_dir() / "bout.h5";
  const CliRun f = run_cli("forward --in " + in.string() + " --out " + fwd.string() + " " + flags);
  ASSERT_EQ(f.status, 0) << f.err;
  kfa_apps::H5File fo(fwd.string());
  const Dataset o = fo.read("/o", 4), lse = fo.read("/lse", 3);
  std::mt19937_64 gen(9);
  const Dataset dout = from_tensor(
      random_tensor("do", shape.batch, shape.heads_q, shape.seqlen_q, shape.dv(), gen), dtype);
  Dataset dlse = lse;
  EXPECT_EQ(dlse.dtype, lse_type(dtype));
  for (auto& x : dlse.data)
    x = kfa_apps::rounded(dlse.dtype, 0.25 * std::sin(x));
  kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/o", &o},
                                        {"/lse", &lse},
                                        {"/do", &dout},
                                        {"/dlse", &dlse}});
  fs::remove(out);
  const CliRun r =
      run_cli("backward --in " + bin.string() + " --out " + out.string() + " " + flags);
  ASSERT_EQ(r.status, 0) << r.err;
  kfa_apps::H5File fb(out.string());
  const Dataset dq = fb.read("/dq", 4), dk = fb.read("/dk", 4), dv = fb.read("/dv", 4);
  EXPECT_EQ(dq.dtype, dtype);
  EXPECT_EQ(dv.dtype, dtype);
  EXPECT_EQ(dq.dims, q.dims);
  EXPECT_TRUE(holds_its_type(dq) && holds_its_type(dk) && holds_its_type(dv));
  EXPECT_EQ(dk.dims, k.dims);
  EXPECT_EQ(dv.dims, v.dims);
  Tensor3 dlse_t("dlse", shape.batch, shape.heads_q, shape.seqlen_q);
  std::copy(dlse.data.begin(), dlse.data.end(), dlse_t.data());
  const Tensor4 qt = to_tensor(q), kt = to_tensor(k), vt = to_tensor(v), dot = to_tensor(dout);
  const Keep4 keep = cli_mask(shape, params);
  const auto c = kfa_apps::with_value_type(dtype, [&](auto t) {
    return kfa::reference::check_backward<decltype(t)>(
        qt, kt, vt, params, dot, dlse_t, to_tensor(dq), to_tensor(dk), to_tensor(dv), keep);
  });
  EXPECT_TRUE(c.ok()) << "dQ err " << c.dq.err << " (bound " << c.dq.bound << "), dK err "
                      << c.dk.err << " (bound " << c.dk.bound << "), dV err " << c.dv.err
                      << " (bound " << c.dv.bound << ")";
}

TEST(Cli, BackwardRoundTripThroughHdf5) {
  backward_round_trip(DType::f32, "", kfa::Params{});
  backward_round_trip(DType::f64, "", kfa::Params{});
  kfa::Params p;
  p.causal = true;
  p.window_left = 20;
  p.softcap = 4;
  backward_round_trip(DType::f32, "--causal --window 20,-1 --softcap 4", p);
  p.dropout = 0.4;
  p.seed = 77;
  backward_round_trip(DType::f32, "--causal --window 20,-1 --softcap 4 --dropout 0.4 --seed 77", p);
  backward_round_trip(DType::f64, "--causal --window 20,-1 --softcap 4 --dropout 0.4 --seed 77", p);
  const CliRun r = run_cli(
      "backward --random 1,4,120,64 --heads-kv 1 --causal --deterministic --repeat 2 --json "
      "--check");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('{'));
  for (const char* key : {"\"command\":\"backward\"", "\"deterministic\":true",
                          "\"check\":\"pass\"", "\"err_dq\":", "\"gflops\":"})
    EXPECT_NE(last.find(key), std::string::npos) << key << " missing in " << last;
  // --random with dropout: forward and backward each pass --check against the reference fed
  // with the mask of the same flags.
  for (const char* cmd : {"forward", "backward"}) {
    const CliRun d = run_cli(std::string(cmd) +
                             " --random 2,2,90,32 --causal --dropout 0.2 --seed 3 --offset 9 "
                             "--data-seed 4 --json --check");
    ASSERT_EQ(d.status, 0) << cmd << ": " << d.err;
    const std::string line = d.out.substr(d.out.rfind('{'));
    for (const char* key :
         {"\"dropout\":0.2,", "\"seed\":3,", "\"offset\":9,", "\"check\":\"pass\""})
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
  }
}

// Score terms: --alibi on --random passes --check; /alibi_slopes and /bias in files, the
// forward against the reference, the backward's /dbias against the reference's gradient of the
// bias; shape mismatches and conflicting terms exit 2 naming both sides.
TEST(Cli, ScoreTerms) {
  for (const char* cmd : {"forward", "backward"}) {
    const CliRun r = run_cli(std::string(cmd) +
                             " --random 2,4,60,32 --heads-kv 2 --causal --alibi --json --check");
    ASSERT_EQ(r.status, 0) << cmd << ": " << r.err;
    EXPECT_NE(r.out.substr(r.out.rfind('{')).find("\"check\":\"pass\""), std::string::npos)
        << r.out;
  }
  const Shape shape{2, 4, 2, 37, 51, 16};
  Problem pb(shape, 2026);
  const DType dtype = DType::f64;
  const Dataset q = from_tensor(pb.q, dtype), k = from_tensor(pb.k, dtype),
                v = from_tensor(pb.v, dtype);
  std::mt19937_64 gen(12);
  const Dataset bias = from_tensor(random_tensor("bias", 1, 4, 37, 51, gen, 2.0), dtype);
  Dataset slopes;
  slopes.dims = {4};
  slopes.dtype = dtype;
  slopes.data = {0.5, 0.25, 0.125, 0.0625};
  kfa::reference::Terms terms;
  terms.bias = to_tensor(bias);
  const fs::path in = work_dir() / "tin.h5", fwd = work_dir() / "tfwd.h5",
                 bin = work_dir() / "tbin.h5", out = work_dir() / "tout.h5",
                 ain = work_dir() / "tain.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/bias", &bias}});
  const CliRun f = run_cli("forward --causal --in " + in.string() + " --out " + fwd.string());
  ASSERT_EQ(f.status, 0) << f.err;
  kfa::Params p;
  p.causal = true;
  kfa_apps::H5File fo(fwd.string());
  const Dataset o = fo.read("/o", 4), lse = fo.read("/lse", 3);
  Tensor3 lse_t("lse", 2, 4, 37);
  std::copy(lse.data.begin(), lse.data.end(), lse_t.data());
  const Tensor4 qt = to_tensor(q), kt = to_tensor(k), vt = to_tensor(v);
  const auto c =
      kfa::reference::check_forward<double>(qt, kt, vt, p, to_tensor(o), lse_t, {}, terms);
  EXPECT_TRUE(c.ok()) << "O err " << c.o.err << ", LSE err " << c.lse.err;
  const Dataset dout = from_tensor(random_tensor("do", 2, 4, 37, 16, gen), dtype);
  kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/o", &o},
                                        {"/lse", &lse},
                                        {"/do", &dout},
                                        {"/bias", &bias}});
  fs::remove(out);
  const CliRun b =
      run_cli("backward --causal --check --in " + bin.string() + " --out " + out.string());
  ASSERT_EQ(b.status, 0) << b.err;
  kfa_apps::H5File fb(out.string());
  const Dataset dbias = fb.read("/dbias", 4);
  EXPECT_EQ(dbias.dims, bias.dims);
  const auto cb = kfa::reference::check_dbias<double>(qt, kt, vt, p, to_tensor(dout), {},
                                                      to_tensor(dbias), {}, terms);
  EXPECT_TRUE(cb.ok()) << "dbias err " << cb.err << " (bound " << cb.bound << ")";
  // ALiBi from a file, top-left: the reference with the same slopes.
  kfa_apps::write_atomic(ain.string(),
                         {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/alibi_slopes", &slopes}});
  fs::remove(fwd);
  const CliRun a =
      run_cli("forward --align top-left --check --in " + ain.string() + " --out " + fwd.string());
  ASSERT_EQ(a.status, 0) << a.err;
  {
    kfa_apps::H5File fa(fwd.string());
    const Dataset oa = fa.read("/o", 4), la = fa.read("/lse", 3);
    std::copy(la.data.begin(), la.data.end(), lse_t.data());
    kfa::reference::Terms at;
    at.alibi = slopes.data;
    kfa::Params tl;
    tl.align = kfa::Align::top_left;
    EXPECT_TRUE(
        kfa::reference::check_forward<double>(qt, kt, vt, tl, to_tensor(oa), lse_t, {}, at).ok());
  }
  // Errors, each naming both shapes or both sources.
  Dataset bad_slopes = slopes;
  bad_slopes.dims = {3};
  bad_slopes.data.pop_back();
  const Dataset bad_bias = from_tensor(random_tensor("bias", 1, 3, 37, 51, gen), dtype);
  const fs::path e1 = work_dir() / "te1.h5", e2 = work_dir() / "te2.h5", e3 = work_dir() / "te3.h5";
  kfa_apps::write_atomic(e1.string(),
                         {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/alibi_slopes", &bad_slopes}});
  kfa_apps::write_atomic(e2.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/bias", &bad_bias}});
  kfa_apps::write_atomic(
      e3.string(),
      {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/bias", &bias}, {"/alibi_slopes", &slopes}});
  const std::pair<std::string, std::string> bad[] = {
      {"forward --in " + e1.string(), "/alibi_slopes has shape (3) but /q has shape (2,4,37,16)"},
      {"forward --in " + e2.string(), "/bias has shape (1,3,37,51) but /q has shape (2,4,37,16)"},
      {"forward --in " + e3.string(), "both given"},
      {"forward --alibi --in " + ain.string(), "--alibi and dataset /alibi_slopes"},
      {"forward --multiscale --alibi --in " + ain.string(),
       "--alibi does not apply to --multiscale"},
  };
  for (const auto& [args, want] : bad) {
    const CliRun r = run_cli(args + " --out " + (work_dir() / "never.h5").string());
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
    EXPECT_FALSE(fs::exists(work_dir() / "never.h5"));
  }
}

// --dtype bf16 and half: kfa::bf16 and kfa::half tensors on every build, through files
// (bfloat16 and float16 datasets, LSE in float32) and --random, each passing the check.
TEST(Cli, SixteenBitTensors) {
  for (DType t : {DType::bf16, DType::f16}) {
    round_trip(t, "", kfa::Params{});
    kfa::Params p;
    p.causal = true;
    p.window_left = 20;
    p.softcap = 4;
    round_trip(t, "--causal --window 20,-1 --softcap 4", p);
    backward_round_trip(t, "--causal --window 20,-1 --softcap 4", p);
  }
  for (const char* dtype : {"bf16", "half"})
    for (const char* cmd : {"forward", "backward"}) {
      const CliRun r = run_cli(std::string(cmd) + " --random 2,4,97,64 --heads-kv 2 --causal " +
                               "--dtype " + dtype + " --json --check");
      ASSERT_EQ(r.status, 0) << cmd << " " << dtype << ": " << r.err;
      const std::string last = r.out.substr(r.out.rfind('{'));
      const std::string name = std::string(dtype) == "bf16" ? "bfloat16" : "float16";
      for (const std::string& key :
           {"\"dtype\":\"" + name + "\"", std::string("\"check\":\"pass\"")})
        EXPECT_NE(last.find(key), std::string::npos) << key << " missing in " << last;
      EXPECT_NE(r.out.find(" " + name + " "), std::string::npos) << r.out;  // the description
    }
  // The other spellings of --dtype name the same types.
  const CliRun r = run_cli("forward --random 1,1,16,16 --dtype bfloat16 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"dtype\":\"bfloat16\""), std::string::npos) << r.out;
  const CliRun h = run_cli("forward --random 1,1,16,16 --dtype float16 --json");
  ASSERT_EQ(h.status, 0) << h.err;
  EXPECT_NE(h.out.find("\"dtype\":\"float16\""), std::string::npos) << h.out;
}

// Every encoding of each 16-bit format, written and read back through HDF5's own conversions
// (from and to double): each value comes back as it was, zeros with their sign, infinities and
// NaN included; the file's type has the format's fields.
TEST(Cli, SixteenBitDatasetsHoldEveryValue) {
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(kfa_apps::name(t));
    Dataset d;
    d.dtype = t;
    d.dims = {1, 1, 256, 256};
    for (std::uint32_t b = 0; b < 0x10000u; ++b)
      d.data.push_back(t == DType::bf16
                           ? static_cast<double>(kfa::bf16::from_bits(std::uint16_t(b)))
                           : static_cast<double>(kfa::half::from_bits(std::uint16_t(b))));
    const fs::path p = work_dir() / "every16.h5";
    kfa_apps::write_atomic(p.string(), {{"/x", &d}});
    const Dataset back = kfa_apps::H5File(p.string()).read("/x", 4);
    EXPECT_EQ(back.dtype, t);
    ASSERT_EQ(back.data.size(), d.data.size());
    for (std::size_t e = 0; e < d.data.size(); ++e) {
      if (std::isnan(d.data[e])) {
        EXPECT_TRUE(std::isnan(back.data[e])) << std::hex << e;
        continue;
      }
      ASSERT_EQ(back.data[e], d.data[e]) << std::hex << "encoding 0x" << e;
      ASSERT_EQ(std::signbit(back.data[e]), std::signbit(d.data[e])) << std::hex << e;
    }
    // The stored type, as other HDF5 readers see it.
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t ds = H5Dopen2(f, "/x", H5P_DEFAULT);
    const hid_t type = H5Dget_type(ds);
    size_t spos, epos, esize, mpos, msize;
    EXPECT_EQ(H5Tget_class(type), H5T_FLOAT);
    EXPECT_EQ(H5Tget_size(type), 2u);
    EXPECT_GE(H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize), 0);
    EXPECT_EQ(spos, 15u);
    EXPECT_EQ(mpos, 0u);
    EXPECT_EQ(esize, t == DType::bf16 ? 8u : 5u);
    EXPECT_EQ(msize, t == DType::bf16 ? 7u : 10u);
    EXPECT_EQ(H5Tget_ebias(type), t == DType::bf16 ? 127u : 15u);
    H5Tclose(type);
    H5Dclose(ds);
    H5Fclose(f);
  }
}

// Bad input: exit 2, exactly one line "kfa: error: ..." containing `expect`, no output file.
void expect_bad(const std::string& args, const std::string& expect) {
  SCOPED_TRACE(args);
  const fs::path out = work_dir() / "bad_out.h5";
  fs::remove(out);
  // File-mode cases also name an output, which must not appear.
  const bool file_mode = args.find("--in ") != std::string::npos;
  const CliRun r = run_cli(file_mode ? args + " --out " + out.string() : args);
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("kfa: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(expect), std::string::npos) << "stderr: " << r.err;
  EXPECT_FALSE(fs::exists(out)) << "output written despite the error";
  for (const auto& e : fs::directory_iterator(work_dir()))
    EXPECT_EQ(e.path().filename().string().find("bad_out.h5.tmp"), std::string::npos);
}

TEST(Cli, BadFiles) {
  Problem pb({1, 2, 2, 10, 12, 16}, 1);
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32),
                v = from_tensor(pb.v, DType::f32);
  const std::string good = write_inputs("good.h5", q, k, v).string();
  expect_bad("forward --in " + (work_dir() / "missing.h5").string(), "cannot open input file");
  {  // --out naming the input, by another path too: refused, the input left as it was
    const auto before = fs::file_size(good);
    const std::string other_path = (work_dir() / "." / "good.h5").string();
    for (const std::string& out : {good, other_path}) {
      std::string args = "forward --in " + good;
      args += " --out " + out;
      const CliRun r = run_cli(args);
      EXPECT_EQ(r.status, 2) << r.out << r.err;
      EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
    }
    EXPECT_EQ(fs::file_size(good), before);
    EXPECT_EQ(
        run_cli("forward --in " + good + " --out " + (work_dir() / "good_out.h5").string()).status,
        0);
  }
  expect_bad("forward --in " + work_dir().string(), "is a directory, not an HDF5 file");

  {  // corrupted: garbage, and a real file cut in half
    std::ofstream(work_dir() / "garbage.h5") << "this is not HDF5 at all";
    expect_bad("forward --in " + (work_dir() / "garbage.h5").string(), "HDF5");
    const auto size = fs::file_size(good);
    fs::copy_file(good, work_dir() / "cut.h5", fs::copy_options::overwrite_existing);
    fs::resize_file(work_dir() / "cut.h5", size / 2);
    expect_bad("forward --in " + (work_dir() / "cut.h5").string(), "corrupted");
  }
  {
    const fs::path p = work_dir() / "nov.h5";
    kfa_apps::write_atomic(p.string(), {{"/q", &q}, {"/k", &k}});
    expect_bad("forward --in " + p.string(), "missing dataset /v");
  }
  {
    Dataset q3 = q;
    q3.dims = {2, 10, 16};
    expect_bad("forward --in " + write_inputs("rank.h5", q3, k, v).string(),
               "dataset /q in '" + (work_dir() / "rank.h5").string() + "' has rank 3, expected 4");
  }
  {
    Dataset k64 = k;
    k64.dtype = DType::f64;
    expect_bad("forward --in " + write_inputs("mixed.h5", q, k64, v).string(),
               "/k is float64 but /q is float32");
  }
  {  // an integer dataset, written with the HDF5 API directly
    const fs::path p = work_dir() / "int.h5";
    const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[4] = {1, 1, 2, 2};
    const int data[4] = {1, 2, 3, 4};
    for (const char* name : {"/q", "/k", "/v"}) {
      const hid_t s = H5Screate_simple(4, dims, nullptr);
      const hid_t d = H5Dcreate2(f, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
      H5Dclose(d);
      H5Sclose(s);
    }
    H5Fclose(f);
    expect_bad("forward --in " + p.string(),
               "non-floating-point type; expected float32, float64, bfloat16 or float16");
  }
  {  // a 16-bit float type of neither format (6 exponent bits, 9 mantissa bits)
    const fs::path p = work_dir() / "f16odd.h5";
    const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 9, 6, 0, 9);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 31);
    const hsize_t dims[4] = {1, 1, 2, 2};
    const double data[4] = {1, 2, 3, 4};
    for (const char* name : {"/q", "/k", "/v"}) {
      const hid_t sp = H5Screate_simple(4, dims, nullptr);
      const hid_t d = H5Dcreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
      H5Dclose(d);
      H5Sclose(sp);
    }
    H5Tclose(t);
    H5Fclose(f);
    expect_bad("forward --in " + p.string(),
               "has a 16-bit float type that is neither IEEE binary16 nor bfloat16");
  }
  {
    const Dataset qh = from_tensor(pb.q, DType::f16), kb = from_tensor(pb.k, DType::bf16),
                  vh = from_tensor(pb.v, DType::f16);
    expect_bad("forward --in " + write_inputs("mixed16.h5", qh, kb, vh).string(),
               "/k is bfloat16 but /q is float16");
  }
  {
    Dataset kb = k, vb = v;
    kb.dims[0] = vb.dims[0] = 2;
    kb.data.resize(kb.size());
    vb.data.resize(vb.size());
    expect_bad("forward --in " + write_inputs("shape.h5", q, kb, vb).string(),
               "k has batch = 2 (k.extent(0)) but q has batch = 1");
  }
  {
    Dataset q0 = q, k0 = k, v0 = v;
    q0.dims[3] = k0.dims[3] = v0.dims[3] = 0;
    q0.data.clear();
    k0.data.clear();
    v0.data.clear();
    expect_bad("forward --in " + write_inputs("d0.h5", q0, k0, v0).string(), "head_dim 0");
  }
  {
    Dataset q0 = q;
    q0.dims[2] = 0;
    q0.data.clear();
    expect_bad("forward --in " + write_inputs("n0.h5", q0, k, v).string(), "/q has seqlen 0");
  }
  {
    Problem big({1, 1, 1, 3, 3, 300}, 3);
    expect_bad("forward --in " + write_inputs("d300.h5", from_tensor(big.q, DType::f32),
                                              from_tensor(big.k, DType::f32),
                                              from_tensor(big.v, DType::f32))
                                     .string(),
               "head_dim = 300");
  }
}

// Adds an int32 dataset `name` of the given values to the HDF5 file at path (the programs'
// writer has no integer type other than uint8).
void add_int32(const fs::path& path, const char* name, const std::vector<std::int32_t>& values) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hsize_t n = values.size();
  const hid_t sp = H5Screate_simple(1, &n, nullptr);
  const hid_t d = H5Dcreate2(f, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);
}

// Visibility terms: /mask (uint8) and /key_lengths (int32) in files, forward against the
// reference given the same mask or lengths, the backward through --check; shape, range, type
// and combination errors exit 2 naming both sides; --multiscale does not read /key_lengths.
TEST(Cli, VisibilityTerms) {
  const Shape shape{2, 4, 2, 37, 51, 16};
  Problem pb(shape, 2027);
  const DType dtype = DType::f64;
  const Dataset q = from_tensor(pb.q, dtype), k = from_tensor(pb.k, dtype),
                v = from_tensor(pb.v, dtype);
  std::mt19937_64 gen(13);
  Dataset mask;
  mask.dtype = DType::u8;
  mask.dims = {1, 4, 37, 51};
  std::bernoulli_distribution coin(0.5);
  for (hsize_t e = 0; e < hsize_t(4) * 37 * 51; ++e)
    mask.bytes.push_back(e / 51 % 37 != 3 && coin(gen) ? 1 : 0);  // row 3 hidden in every head
  const Dataset dout = from_tensor(random_tensor("do", 2, 4, 37, 16, gen), dtype);
  const Tensor4 qt = to_tensor(q), kt = to_tensor(k), vt = to_tensor(v);
  kfa::Params p;
  p.causal = true;
  const fs::path min = work_dir() / "vmin.h5", lin = work_dir() / "vlin.h5",
                 fwd = work_dir() / "vfwd.h5";
  kfa_apps::write_atomic(min.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &mask}});
  kfa_apps::write_atomic(lin.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(lin, "/key_lengths", {29, 0});
  kfa::reference::Terms by_mask, by_length;
  by_mask.mask = Keep4("mask", 1, 4, 37, 51);
  std::copy(mask.bytes.begin(), mask.bytes.end(), by_mask.mask.data());
  by_length.key_lengths = {29, 0};
  for (const auto& [in, terms] : {std::pair{min, by_mask}, {lin, by_length}}) {
    SCOPED_TRACE(in.string());
    fs::remove(fwd);
    const CliRun f = run_cli("forward --causal --in " + in.string() + " --out " + fwd.string());
    ASSERT_EQ(f.status, 0) << f.err;
    kfa_apps::H5File fo(fwd.string());
    const Dataset o = fo.read("/o", 4), lse = fo.read("/lse", 3);
    Tensor3 lse_t("lse", 2, 4, 37);
    std::copy(lse.data.begin(), lse.data.end(), lse_t.data());
    EXPECT_EQ(lse_t(1, 1, 3), -std::numeric_limits<double>::infinity());  // hidden, or length 0
    const auto c =
        kfa::reference::check_forward<double>(qt, kt, vt, p, to_tensor(o), lse_t, {}, terms);
    EXPECT_TRUE(c.ok()) << "O err " << c.o.err << ", LSE err " << c.lse.err;
    // The backward from the forward's /o and /lse, against the reference's gradients.
    const fs::path bin = work_dir() / "vbin.h5", bout = work_dir() / "vbout.h5";
    const bool masked = terms.mask.span() > 0;
    if (masked)
      kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                            {"/k", &k},
                                            {"/v", &v},
                                            {"/o", &o},
                                            {"/lse", &lse},
                                            {"/do", &dout},
                                            {"/mask", &mask}});
    else
      kfa_apps::write_atomic(
          bin.string(),
          {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &o}, {"/lse", &lse}, {"/do", &dout}});
    if (!masked) add_int32(bin, "/key_lengths", {29, 0});
    fs::remove(bout);
    const CliRun b =
        run_cli("backward --causal --check --in " + bin.string() + " --out " + bout.string());
    ASSERT_EQ(b.status, 0) << b.err;
    kfa_apps::H5File fb(bout.string());
    const auto g = kfa::reference::check_backward<double>(
        qt, kt, vt, p, to_tensor(dout), {}, to_tensor(fb.read("/dq", 4)),
        to_tensor(fb.read("/dk", 4)), to_tensor(fb.read("/dv", 4)), {}, terms);
    EXPECT_TRUE(g.ok()) << "dQ err " << g.dq.err << ", dK err " << g.dk.err << ", dV err "
                        << g.dv.err;
  }
  // Errors, each naming both shapes or both sources.
  Dataset bad_mask = mask;
  bad_mask.dims = {1, 3, 37, 51};
  bad_mask.bytes.resize(std::size_t(3) * 37 * 51);
  const Dataset bias = from_tensor(random_tensor("bias", 1, 4, 37, 51, gen), dtype);
  const Dataset float_mask = from_tensor(random_tensor("mask", 1, 4, 37, 51, gen), dtype);
  const fs::path e1 = work_dir() / "ve1.h5", e2 = work_dir() / "ve2.h5", e3 = work_dir() / "ve3.h5",
                 e4 = work_dir() / "ve4.h5", e5 = work_dir() / "ve5.h5";
  kfa_apps::write_atomic(e1.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &bad_mask}});
  kfa_apps::write_atomic(e2.string(),
                         {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &mask}, {"/bias", &bias}});
  kfa_apps::write_atomic(e3.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(e3, "/key_lengths", {52, 1});
  kfa_apps::write_atomic(e4.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(e4, "/key_lengths", {1, 2, 3});
  kfa_apps::write_atomic(e5.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &float_mask}});
  expect_bad("forward --in " + e1.string(),
             "/mask has shape (1,3,37,51) but /q has shape (2,4,37,16) and /k (2,2,51,16)");
  expect_bad("forward --in " + e2.string(), "/bias and /mask were both given");
  expect_bad("forward --alibi --in " + min.string(), "ALiBi slopes and /mask were both given");
  expect_bad("forward --in " + e3.string(), "/key_lengths holds 52 at (0), outside [0, seqlen");
  expect_bad("forward --in " + e4.string(), "/key_lengths has shape (3) but /q has shape");
  expect_bad("forward --in " + e5.string(), "/mask in '" + e5.string() + "' must be uint8");
  expect_bad("forward --multiscale --in " + lin.string(), "/key_lengths, which kfa does not read");
}

// A packed (total, heads, head_dim) reference tensor as a dataset of type t.
Dataset from_packed(const kfa::reference::Packed3& x, DType t) {
  Dataset d;
  d.dtype = t;
  d.dims = {x.extent(0), x.extent(1), x.extent(2)};
  d.data.assign(x.data(), x.data() + x.span());
  return d;
}

kfa::reference::Packed3 to_packed(const Dataset& d) {
  kfa::reference::Packed3 t("packed", d.dims[0], d.dims[1], d.dims[2]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

// Varlen: rank-3 /q /k /v with /cu_seqlens_q and /cu_seqlens_k (int32), forward and backward
// against the reference run sequence by sequence (dropout: the padded batch's mask from kfa
// dropout-mask), lengths 0 and 1 included, with ALiBi too; bad offsets and shapes, and the
// terms varlen has no packed meaning for, exit 2 naming them.
TEST(Cli, Varlen) {
  const std::vector<std::int32_t> cq{0, 3, 3, 4, 44, 49}, ck{0, 5, 9, 10, 43, 43};
  const int H = 4, Hk = 2, D = 16, Nq = 49, Nk = 43;
  std::mt19937_64 gen(2031);
  auto packed = [&](const char* label, int n, int h) {
    const Tensor4 t = random_tensor(label, 1, n, h, D, gen);  // (n, h, D) in row-major order
    kfa::reference::Packed3 x(std::string(label), n, h, D);
    std::copy(t.data(), t.data() + t.span(), x.data());
    return x;
  };
  const auto qp = packed("q", Nq, H), kp = packed("k", Nk, Hk), vp = packed("v", Nk, Hk),
             dop = packed("do", Nq, H);
  const DType dtype = DType::f64;
  const Dataset q = from_packed(qp, dtype), k = from_packed(kp, dtype), v = from_packed(vp, dtype),
                dout = from_packed(dop, dtype);
  kfa::Params p;
  p.causal = true;
  p.align = kfa::Align::top_left;
  p.dropout = 0.25;
  p.seed = 8;
  const std::string flags = " --causal --align top-left --dropout 0.25 --seed 8";
  const std::vector<int> cqi(cq.begin(), cq.end()), cki(ck.begin(), ck.end());
  const Keep4 keep = cli_mask({5, H, Hk, 40, 33, D}, p);  // the padded batch: longest lengths
  const fs::path in = work_dir() / "vl_in.h5", fwd = work_dir() / "vl_fwd.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(in, "/cu_seqlens_q", cq);
  add_int32(in, "/cu_seqlens_k", ck);
  fs::remove(fwd);
  const CliRun f = run_cli("forward --in " + in.string() + " --out " + fwd.string() + flags);
  ASSERT_EQ(f.status, 0) << f.err;
  kfa_apps::H5File fo(fwd.string());
  const Dataset o = fo.read("/o", 3), lse = fo.read("/lse", 2);
  ASSERT_EQ(lse.dims, (std::vector<hsize_t>{hsize_t(H), hsize_t(Nq)}));
  kfa::reference::Tensor2 lse_t("lse", H, Nq);
  std::copy(lse.data.begin(), lse.data.end(), lse_t.data());
  EXPECT_EQ(lse_t(0, 44), -std::numeric_limits<double>::infinity());  // sequence 4 has no key
  const auto c = kfa::reference::varlen::check_forward<double>(qp, kp, vp, cqi, cki, p,
                                                               to_packed(o), lse_t, keep);
  EXPECT_TRUE(c.ok()) << "O err " << c.o.err << ", LSE err " << c.lse.err;

  const fs::path bin = work_dir() / "vl_bin.h5", bout = work_dir() / "vl_bout.h5";
  kfa_apps::write_atomic(
      bin.string(),
      {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &o}, {"/lse", &lse}, {"/do", &dout}});
  add_int32(bin, "/cu_seqlens_q", cq);
  add_int32(bin, "/cu_seqlens_k", ck);
  fs::remove(bout);
  const CliRun b =
      run_cli("backward --check --in " + bin.string() + " --out " + bout.string() + flags);
  ASSERT_EQ(b.status, 0) << b.err;
  kfa_apps::H5File fb(bout.string());
  const auto g = kfa::reference::varlen::check_backward<double>(
      qp, kp, vp, cqi, cki, p, dop, {}, to_packed(fb.read("/dq", 3)), to_packed(fb.read("/dk", 3)),
      to_packed(fb.read("/dv", 3)), keep);
  EXPECT_TRUE(g.ok()) << "dQ err " << g.dq.err << ", dK err " << g.dk.err << ", dV err "
                      << g.dv.err;

  // Errors.
  const fs::path e1 = work_dir() / "vl_e1.h5", e2 = work_dir() / "vl_e2.h5",
                 e3 = work_dir() / "vl_e3.h5";
  kfa_apps::write_atomic(e1.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(e1, "/cu_seqlens_q", {0, 3, 2, 44, 49});
  add_int32(e1, "/cu_seqlens_k", {0, 5, 9, 10, 43});
  expect_bad("forward --in " + e1.string(), "cu_seqlens_q[2] = 2 is less than cu_seqlens_q[1]");
  kfa_apps::write_atomic(e2.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  add_int32(e2, "/cu_seqlens_q", cq);
  expect_bad("forward --in " + e2.string(), "/cu_seqlens_k is missing");
  add_int32(e2, "/cu_seqlens_k", {0, 5, 9, 10, 43, 44});
  expect_bad("forward --in " + e2.string(), "cu_seqlens_k[5] = 44 (the last entry) must equal");

  // ALiBi within each sequence: --alibi (the standard slopes) forward, /alibi_slopes backward,
  // against the reference with those slopes.
  const auto standard = kfa::masks::alibi_slopes(H);
  const fs::path af = work_dir() / "vl_alibi_fwd.h5";
  fs::remove(af);
  const CliRun fa =
      run_cli("forward --alibi --in " + in.string() + " --out " + af.string() + flags);
  ASSERT_EQ(fa.status, 0) << fa.err;
  kfa_apps::H5File fao(af.string());
  const Dataset oa = fao.read("/o", 3), lsea = fao.read("/lse", 2);
  kfa::reference::Tensor2 lsea_t("lse", H, Nq);
  std::copy(lsea.data.begin(), lsea.data.end(), lsea_t.data());
  const auto ca = kfa::reference::varlen::check_forward<double>(
      qp, kp, vp, cqi, cki, p, to_packed(oa), lsea_t, keep, standard);
  EXPECT_TRUE(ca.ok()) << "ALiBi O err " << ca.o.err << ", LSE err " << ca.lse.err;
  Dataset slopes;
  slopes.dims = {hsize_t(H)};
  slopes.dtype = DType::f64;
  slopes.data = standard;
  const fs::path abin = work_dir() / "vl_alibi_bin.h5", about = work_dir() / "vl_alibi_bout.h5";
  kfa_apps::write_atomic(abin.string(), {{"/q", &q},
                                         {"/k", &k},
                                         {"/v", &v},
                                         {"/o", &oa},
                                         {"/lse", &lsea},
                                         {"/do", &dout},
                                         {"/alibi_slopes", &slopes}});
  add_int32(abin, "/cu_seqlens_q", cq);
  add_int32(abin, "/cu_seqlens_k", ck);
  fs::remove(about);
  const CliRun ba =
      run_cli("backward --check --in " + abin.string() + " --out " + about.string() + flags);
  ASSERT_EQ(ba.status, 0) << ba.err;
  kfa_apps::H5File fba(about.string());
  const auto ga = kfa::reference::varlen::check_backward<double>(
      qp, kp, vp, cqi, cki, p, dop, {}, to_packed(fba.read("/dq", 3)),
      to_packed(fba.read("/dk", 3)), to_packed(fba.read("/dv", 3)), keep, standard);
  EXPECT_TRUE(ga.ok()) << "ALiBi dQ err " << ga.dq.err << ", dK err " << ga.dk.err << ", dV err "
                       << ga.dv.err;
  expect_bad("backward --alibi --in " + abin.string(), "--alibi and dataset /alibi_slopes");
  const fs::path e4 = work_dir() / "vl_e4.h5", e5 = work_dir() / "vl_e5.h5";
  Dataset slopes3 = slopes;
  slopes3.dims = {3};
  slopes3.data.resize(3);
  kfa_apps::write_atomic(e4.string(),
                         {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/alibi_slopes", &slopes3}});
  add_int32(e4, "/cu_seqlens_q", cq);
  add_int32(e4, "/cu_seqlens_k", ck);
  expect_bad("forward --in " + e4.string(), "/alibi_slopes has shape (3)");
  Dataset bias;
  bias.dims = {1, hsize_t(H), hsize_t(Nq), hsize_t(Nk)};
  bias.dtype = DType::f64;
  bias.data.assign(std::size_t(H) * Nq * Nk, 0.0);
  kfa_apps::write_atomic(e5.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/bias", &bias}});
  add_int32(e5, "/cu_seqlens_q", cq);
  add_int32(e5, "/cu_seqlens_k", ck);
  expect_bad("forward --in " + e5.string(), "takes no /bias");
  kfa_apps::write_atomic(
      e3.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &o}, {"/lse", &o}, {"/do", &dout}});
  add_int32(e3, "/cu_seqlens_q", cq);
  add_int32(e3, "/cu_seqlens_k", ck);
  expect_bad("backward --in " + e3.string(), "/lse");
}

TEST(Cli, BadBackwardFiles) {
  Problem pb({1, 2, 2, 10, 12, 16}, 1);
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32),
                v = from_tensor(pb.v, DType::f32);
  Dataset lse;
  lse.dims = {1, 2, 10};
  lse.data.assign(20, 0.5);
  {
    const fs::path p = work_dir() / "nodo.h5";
    kfa_apps::write_atomic(p.string(),
                           {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &q}, {"/lse", &lse}});
    expect_bad("backward --in " + p.string(), "missing dataset /do");
  }
  {
    const fs::path p = work_dir() / "dok.h5";  // /do shaped like /k
    kfa_apps::write_atomic(
        p.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &q}, {"/lse", &lse}, {"/do", &k}});
    expect_bad("backward --in " + p.string(), "dataset /do has seqlen 12 but /q has 10");
  }
  {
    Dataset lse_bad = lse;
    lse_bad.dims = {1, 1, 20};
    const fs::path p = work_dir() / "lse.h5";
    kfa_apps::write_atomic(
        p.string(),
        {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &q}, {"/lse", &lse_bad}, {"/do", &q}});
    expect_bad("backward --in " + p.string(), "dataset /lse has heads 1 but /q has 2");
  }
}

// v with a head dim of its own: files whose /v (and so /o, /do, /dv) differ from /q's and /k's
// head dim, forward and backward against the reference; --random with --head-dim-v passes
// --check and reports it; mismatched shapes exit 2 naming both; --head-dim-v on a file or in
// kfa mha is refused.
TEST(Cli, ValueHeadDim) {
  round_trip(DType::f32, "--causal",
             [] {
               kfa::Params p;
               p.causal = true;
               return p;
             }(),
             {1, 4, 2, 37, 50, 16, 40});
  round_trip(DType::f64, "", kfa::Params{}, {2, 2, 1, 30, 30, 48, 24});
  backward_round_trip(DType::f32, "", kfa::Params{}, {1, 4, 2, 45, 70, 24, 72});
  backward_round_trip(DType::f64, "--causal",
                      [] {
                        kfa::Params p;
                        p.causal = true;
                        return p;
                      }(),
                      {1, 2, 2, 40, 40, 32, 16});
  for (const char* cmd : {"forward", "backward"}) {
    const CliRun r = run_cli(std::string(cmd) +
                             " --random 1,4,70,32 --heads-kv 2 --head-dim-v 48 --causal "
                             "--check --json");
    ASSERT_EQ(r.status, 0) << cmd << ": " << r.err;
    const std::string last = r.out.substr(r.out.rfind('{'));
    for (const char* key : {"\"head_dim\":32", "\"head_dim_v\":48", "\"check\":\"pass\""})
      EXPECT_NE(last.find(key), std::string::npos) << key << " missing in " << last;
    EXPECT_NE(r.out.find(" D=32 Dv=48 "), std::string::npos) << r.out;
  }
  // Shapes that disagree.
  Problem pb({1, 2, 2, 10, 12, 16, 40}, 1);
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32),
                v = from_tensor(pb.v, DType::f32);
  Dataset lse;
  lse.dims = {1, 2, 10};
  lse.data.assign(20, 0.5);
  {
    const fs::path p = work_dir() / "dvo.h5";  // /o and /do with /q's head dim, not /v's
    kfa_apps::write_atomic(
        p.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/o", &q}, {"/lse", &lse}, {"/do", &q}});
    expect_bad("backward --in " + p.string(),
               "dataset /o is (1,2,10,16) but /v is (1,2,12,40): its head_dim 16 must be /v's 40");
  }
  {
    Problem other({1, 2, 2, 10, 12, 24}, 2);  // /k with head dim 24 against /q's 16
    expect_bad(
        "forward --in " + write_inputs("dk.h5", q, from_tensor(other.k, DType::f32), v).string(),
        "k is (1, 2, 12, 24) but q is (1, 2, 10, 16)");
  }
  expect_bad("forward --in " + write_inputs("dv.h5", q, k, v).string() + " --head-dim-v 40",
             "--head-dim-v applies to --random only");
  expect_bad("forward --random 1,2,64,32 --head-dim-v 300", "head_dim = 300 (v.extent(3), Dv)");
  expect_bad("forward --random 1,2,64,32 --head-dim-v 0", "--head-dim-v must be >= 1, got 0");
  expect_bad("forward --random 1,2,64,32 --head-dim-v 16 --multiscale",
             "v is (1, 2, 64, 16) but q is (1, 2, 64, 32)");
}

TEST(Cli, BadFlags) {
  Problem pb({1, 1, 1, 4, 4, 16}, 1);
  const std::string in =
      "forward --in " + write_inputs("flags.h5", from_tensor(pb.q, DType::f32),
                                     from_tensor(pb.k, DType::f32), from_tensor(pb.v, DType::f32))
                            .string();
  expect_bad(in + " --window -2,3", "--window LEFT must be >= -1, got -2");
  expect_bad(in + " --window 3,-7", "--window RIGHT must be >= -1, got -7");
  expect_bad(in + " --window 3", "--window expects LEFT,RIGHT");
  expect_bad(in + " --scale abc", "--scale expects a finite number, got 'abc'");
  expect_bad(in + " --scale -1", "--scale must be > 0");
  expect_bad(in + " --softcap -3", "--softcap must be >= 0");
  expect_bad(in + " --repeat 0", "--repeat must be >= 1, got 0");
  expect_bad(in + " --repeat x1", "--repeat expects an integer, got 'x1'");
  expect_bad(in + " --align middle", "--align expects bottom-right or top-left");
  expect_bad(in + " --frobnicate", "unknown option '--frobnicate'");
  expect_bad("forward --random 1,2,64,16 --dtype int8",
             "--dtype expects float, double, bf16 or half, got 'int8'");
  expect_bad("forward --random 1,2,0,64", "--random seqlen must be >= 1, got 0");
  expect_bad("forward --random 1,2,-5,64", "--random seqlen must be >= 1, got -5");
  expect_bad("forward --random 1,2,64", "--random expects B,H,N,D");
  expect_bad("forward --random 1,2,64,0", "--random head_dim must be >= 1, got 0");
  expect_bad("forward --random 1,2,64,512", "head_dim = 512");
  expect_bad("forward --random 1,4,64,64 --heads-kv 3", "--heads-kv 3 must divide");
  expect_bad("forward --random 1000,1000,100000,256", "GiB but this machine has");
  expect_bad("backprop", "unknown command 'backprop'");
  expect_bad("forward --random 1,2,64,16 --deterministic", "--deterministic applies to backward");
  expect_bad("backward --random 1,2,64,16 --splits 2", "--splits applies to forward");
  expect_bad("forward --random 1,2,64,16 --splits -1", "--splits must be >= 0, got -1");
  // Beyond int: refused, never wrapped into range (-2^32 + 1 would wrap to 1, -2^32 to 0).
  expect_bad("forward --random 1,2,64,16 --splits -4294967295",
             "--splits must be in [-2147483648, 2147483647], got -4294967295");
  expect_bad(in + " --window -4294967290,0", "--window LEFT must be in [-2147483648, 2147483647]");
  expect_bad("forward --in", "--in expects a value");
  expect_bad(in + " --dropout 1", "--dropout must be in [0, 1), got 1");
  expect_bad(in + " --dropout -0.1", "--dropout must be in [0, 1), got -0.1");
  expect_bad(in + " --dropout nan", "--dropout expects a finite number, got 'nan'");
  expect_bad(in + " --dropout 0.1 --seed -3", "--seed must be >= 0, got -3");
  expect_bad(in + " --dropout 0.1 --offset x", "--offset expects an integer, got 'x'");
  expect_bad(in + " --shape 1,1,4,4", "--shape applies to dropout-mask only");
  const std::string bad_out = " --out " + (work_dir() / "bad_out.h5").string();
  expect_bad("dropout-mask --shape 1,1,4,4 --dropout 0.1" + bad_out + " --causal",
             "'--causal' does not apply to dropout-mask");
  expect_bad("dropout-mask --shape 1,1,4 --dropout 0.1" + bad_out, "--shape expects B,H,NQ,NK");
  expect_bad("dropout-mask --shape 1,1,0,4 --dropout 0.1" + bad_out,
             "--shape seqlen_q must be >= 1, got 0");
  expect_bad("dropout-mask --shape 1,1,4,4 --dropout 1" + bad_out, "--dropout must be in [0, 1)");
  expect_bad("dropout-mask --dropout 0.1" + bad_out, "dropout-mask needs --shape");
  expect_bad("dropout-mask --shape 1,1,4,4 --dropout 0.1", "dropout-mask needs --out");
  expect_bad("dropout-mask --shape 100000,1000,1000,1000 --dropout 0.1 --seed 1" + bad_out,
             "GiB but this machine has");
  // A 20-digit size or count is out of range, not "not an integer".
  expect_bad(in + " --repeat 123456789012345678901", "--repeat is out of range, got 1234");
  expect_bad("forward --random 1,2,123456789012345678901,16", "--random seqlen is out of range");
  expect_bad(in + " --seed 123456789012345678901", "--seed must be < 2^64");
  // --seed takes the whole uint64 range.
  EXPECT_EQ(run_cli("forward --random 1,1,8,8 --dropout 0.5 --seed 18446744073709551615").status,
            0);
  // Dropout without a seed: an error, not a silent seed 0.
  expect_bad(in + " --dropout 0.1", "--dropout needs --seed");
  expect_bad("dropout-mask --shape 1,1,4,4 --dropout 0.1" + bad_out, "--dropout needs --seed");
  const CliRun none = run_cli("");
  EXPECT_EQ(none.status, 2);
  EXPECT_EQ(none.err.rfind("kfa: error: missing command", 0), 0u) << none.err;
}

// Kokkos' own flags: checked before Kokkos reads them (Kokkos 3.4 aborted on
// --kokkos-threads=abc and ignored flags it did not know).
TEST(Cli, KokkosFlags) {
  // The thread-count flag of this Kokkos (renamed in 3.7; 4.x reads only the new name).
#if KOKKOS_VERSION >= 40000
  const std::string threads = "--kokkos-num-threads";
#else
  const std::string threads = "--kokkos-threads";
#endif
  const std::string run = "forward --random 1,1,8,8 ";
  expect_bad(run + threads + "=abc", threads + " expects an integer, got 'abc'");
  expect_bad(run + "--kokkos-frobnicate=1", "unknown option '--kokkos-frobnicate=1' (this Kokkos");
  expect_bad(run + threads, threads + " expects a value");
  EXPECT_EQ(run_cli(run + threads + "=1").status, 0);
#if defined(KOKKOS_ENABLE_OPENMP) || defined(KOKKOS_ENABLE_THREADS) || \
    defined(KOKKOS_ENABLE_PTHREAD) || defined(KOKKOS_ENABLE_HPX)
  EXPECT_EQ(run_cli(run + threads + "=2").status, 0);
#else
  expect_bad(run + threads + "=2", "no threaded host backend");
#endif
}

// A file whose headers declare the given dims for /q /k /v, with no data written (HDF5
// allocates a dataset's storage at its first write).
fs::path header_only(const std::string& name, std::vector<hsize_t> dims) {
  fs::path p = work_dir() / name;
  const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t space = H5Screate_simple(4, dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk(4, 1);
  chunk[3] = dims[3];
  H5Pset_chunk(dcpl, 4, chunk.data());
  for (const char* n : {"/q", "/k", "/v"})
    H5Dclose(H5Dcreate2(f, n, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  return p;
}

// Inputs the programs cannot take, found from the file's headers, before anything is allocated:
// a problem beyond this machine's memory (named with the dataset, bytes needed and bytes
// there; it once gave "out of memory" with no size), extents beyond int.
TEST(Cli, FileHeadersBeyondLimits) {
  expect_bad("forward --in " + header_only("huge.h5", {1, 64, 1000000, 128}).string(),
             "dataset /q (1,64,1000000,128) with /k (1,64,1000000,128) (float32) in '");
  expect_bad("forward --in " + header_only("huge2.h5", {1, 64, 1000000, 128}).string(),
             "bytes needed");
  expect_bad("forward --in " + header_only("wide.h5", {1, 1, 2147483648ULL, 16}).string(),
             "declares shape (1,1,2147483648,16): extent 2147483648 (dimension 2)");
}

// NaN or Inf in the inputs: refused with the count and the first position, or run with
// --allow-nonfinite; datasets the passes do not read: refused rather than ignored.
TEST(Cli, NonFiniteAndUnknownInputs) {
  Problem pb({1, 2, 2, 10, 12, 16}, 3);
  const Dataset q = from_tensor(pb.q, DType::f32), v = from_tensor(pb.v, DType::f32);
  Dataset k = from_tensor(pb.k, DType::f32);
  k.data[((0 * 2 + 1) * 12 + 5) * 16 + 3] = std::nan("");
  k.data[((0 * 2 + 1) * 12 + 7) * 16 + 0] = INFINITY;
  const std::string nan_in = write_inputs("nan_in.h5", q, k, v).string();
  expect_bad("forward --in " + nan_in,
             "dataset /k in '" + nan_in + "' holds 2 non-finite values, the first at (0,1,5,3)");
  const fs::path out = work_dir() / "nan_out.h5";
  EXPECT_EQ(
      run_cli("forward --in " + nan_in + " --out " + out.string() + " --allow-nonfinite").status,
      0);
  EXPECT_TRUE(fs::exists(out));
  const fs::path masked = work_dir() / "masked.h5";
  const Dataset good_k = from_tensor(pb.k, DType::f32);
  kfa_apps::write_atomic(masked.string(),
                         {{"/q", &q}, {"/k", &good_k}, {"/v", &v}, {"/weights", &q}});
  expect_bad("forward --in " + masked.string(), "holds /weights, which kfa does not read");
}

// The output's folder and name, checked before any compute with the OS's reason and the path
// as given; a write that fails (here a file-size limit) removes its temporary file, keeps an
// existing OUT and exits 2 with one line (HDF5 1.10 crashed with SIGSEGV in its exit handler).
TEST(Cli, OutputPaths) {
  Problem pb({1, 2, 2, 64, 64, 64}, 4);
  const std::string in = write_inputs("out_in.h5", from_tensor(pb.q, DType::f32),
                                      from_tensor(pb.k, DType::f32), from_tensor(pb.v, DType::f32))
                             .string();
  const auto bad = [&](const std::string& out, const std::string& expect) {
    SCOPED_TRACE(out);
    const CliRun r = run_cli("forward --in " + in + " --out " + out);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("kfa: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << "computed before the check: " << r.out;
  };
  bad(work_dir().string(), "--out '" + work_dir().string() + "' is a directory");
  bad((work_dir() / "no_such_dir" / "o.h5").string(),
      "folder '" + (work_dir() / "no_such_dir").string() + "' does not exist");
  bad(in + "/o.h5", "'" + in + "' is not a folder");
  const CliRun m =
      run_cli("dropout-mask --shape 1,1,4,4 --dropout 0.1 --seed 1 --out " + work_dir().string());
  EXPECT_EQ(m.status, 2);
  EXPECT_NE(m.err.find("is a directory"), std::string::npos) << m.err;

  const fs::path out = work_dir() / "kept.h5";
  std::ofstream(out) << "an older output";
  // 64 KiB at most per file, and SIGXFSZ ignored so that the write fails with EFBIG.
  const CliRun r = run_program("(ulimit -f 64; trap '' XFSZ; " + std::string(KFA_CLI_PATH) +
                               " forward --in " + in + " --out " + out.string() + ")");
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("kfa: error: cannot write output file '" + out.string() + "'"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(slurp(out), "an older output");
  for (const auto& e : fs::directory_iterator(work_dir()))
    EXPECT_EQ(e.path().filename().string().find("kept.h5.tmp"), std::string::npos);
}

// What a newcomer reads: --help explains the problem's letters, --check, --json, the exit
// status and Kokkos' flags; the description says "none" for an unbounded window and counts
// runs in the singular when there is one.
TEST(Cli, Wording) {
  const CliRun h = run_cli("--help");
  ASSERT_EQ(h.status, 0) << h.err;
  for (const char* s : {"batch B, H query heads, sequence length N", "--check:", "--json:",
                        "exit status: 0 success, 1 --check failed, 2 bad input",
                        "--kokkos-FLAG=VALUE", "--allow-nonfinite"})
    EXPECT_NE(h.out.find(s), std::string::npos) << s << " missing from:\n" << h.out;
  const CliRun r = run_cli("forward --random 1,1,8,8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("window_left=none window_right=none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over 1 run;"), std::string::npos) << r.out;
  const CliRun w = run_cli("forward --random 1,1,8,8 --window 3,-1 --repeat 2");
  EXPECT_NE(w.out.find("window_left=3 window_right=none"), std::string::npos) << w.out;
  EXPECT_NE(w.out.find("over 2 runs;"), std::string::npos) << w.out;
}

// --version: kfa's version from <kfa/config.hpp>, and a line on the Kokkos it was compiled
// with (the version of KOKKOS_VERSION, the default execution space); usage text mentions it.
TEST(Cli, Version) {
  const CliRun r = run_cli("--version");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_EQ(r.out.rfind(std::string("kfa ") + KFA_VERSION_STRING + "\n", 0), 0u) << r.out;
  const std::string kokkos = "\nKokkos " + std::to_string(KOKKOS_VERSION / 10000) + "." +
                             std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                             std::to_string(KOKKOS_VERSION % 100) + ": execution spaces ";
  const auto at = r.out.find(kokkos);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  EXPECT_NE(line.find(std::string("default ") + Kokkos::DefaultExecutionSpace::name()),
            std::string::npos)
      << line;
  EXPECT_NE(r.out.find(std::string("Kokkos ") + KFA_CONFIGURED_KOKKOS_VERSION), std::string::npos)
      << r.out;
  EXPECT_EQ(run_cli("forward --random 1,1,4,4 --version").out, r.out);
  EXPECT_NE(run_cli("--help").out.find("--version"), std::string::npos);
}

// Every field of the list whose pass is one only is refused, with a line naming the flag and
// its pass, by the other pass; every enum field names its values when given another.
TEST(Cli, PassFlagsFollowTheFieldList) {
  const kfa::Params p;
  kfa::for_each_field(p, [](const kfa::Field& f, const auto& member) {
    using T = std::decay_t<decltype(member)>;
    const std::string value = std::is_same_v<T, bool> ? "" : " 1";
    if (f.passes != kfa::Passes::both) {
      const bool fwd = f.passes == kfa::Passes::forward;
      expect_bad(
          std::string(fwd ? "backward" : "forward") + " --random 1,2,64,16 " + f.flag + value,
          std::string(f.flag) + " applies to " + (fwd ? "forward" : "backward") + " only");
    }
    if constexpr (std::is_enum_v<T>)  // on a pass that reads it
      expect_bad(std::string(f.passes == kfa::Passes::backward ? "backward" : "forward") +
                     " --random 1,2,64,16 " + f.flag + " sideways",
                 std::string(f.flag) + " expects " + kfa::names_of<T>() + ", got 'sideways'");
  });
  expect_bad("forward --random 1,2,64,16 --align middle",
             "--align expects bottom-right or top-left, got 'middle'");
  expect_bad("forward --random 1,2,64,16 --window-left -2", "--window-left must be >= -1, got -2");
  expect_bad("forward --random 1,2,64,16 --window-right 3000000000",
             "--window-right must be in [-2147483648, 2147483647], got 3000000000");
  expect_bad("forward --random 1,2,64,16 --seed 18446744073709551616", "--seed must be < 2^64");
  // The usage lists every flag of the list.
  const std::string usage = run_cli("--help").out;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto&) {
    EXPECT_NE(usage.find(std::string("  ") + f.flag), std::string::npos) << f.flag;
  });
}

// The JSON line carries every field of the list under its name, with the value given; the
// description names every field the pass reads.
TEST(Cli, JsonAndDescriptionCarryEveryField) {
  const CliRun r = run_cli(
      "forward --random 1,2,40,16 --seqlen-k 50 --align top-left --window-left 7 "
      "--window-right 3 --scale 0.5 --softcap 2.5 --dropout 0.125 --seed 18446744073709551615 "
      "--offset 4 --splits 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('{'));
  const kfa::Params p;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto&) {
    EXPECT_NE(last.find("\"" + std::string(f.name) + "\":"), std::string::npos)
        << f.name << " missing in " << last;
    const bool read = f.passes != kfa::Passes::backward;
    EXPECT_EQ(r.out.find(" " + std::string(f.name) + "=") < r.out.find('\n'), read)
        << f.name << " in " << r.out;
  });
  for (const char* kv :
       {"\"align\":\"top-left\"", "\"window_left\":7,", "\"window_right\":3,", "\"scale\":0.5,",
        "\"softcap\":2.5,", "\"dropout\":0.125,", "\"seed\":18446744073709551615,", "\"offset\":4,",
        "\"num_splits\":2,", "\"deterministic\":false,", "\"causal\":false,", "\"seqlen_k\":50,",
        "\"repeat\":1,"})
    EXPECT_NE(last.find(kv), std::string::npos) << kv << " missing in " << last;
  // The --window shorthand sets both fields.
  const CliRun w = run_cli("forward --random 1,2,40,16 --window 5,-1 --json");
  ASSERT_EQ(w.status, 0) << w.err;
  EXPECT_NE(w.out.find("\"window_left\":5,\"window_right\":-1,"), std::string::npos) << w.out;
}

}  // namespace

namespace {

// kfa forward|backward --multiscale through files: /mask in, /o /rsum out, then the backward
// from those, each against kfa::reference's multi-scale passes; --random with its decay mask
// and --check; and the bad inputs particular to it.
TEST(Cli, MultiScale) {
  const Shape shape{1, 4, 2, 37, 53, 24};
  Problem pb(shape, 77);
  kfa::reference::Mask3 mask(std::string("mask"), 4, 37, 53);
  std::mt19937_64 gen(78);
  std::uniform_real_distribution<double> u(0, 0.2);
  for (std::size_t e = 0; e < mask.span(); ++e)
    mask.data()[e] = u(gen);
  Dataset m;
  m.dtype = DType::f64;
  m.dims = {4, 37, 53};
  m.data.assign(mask.data(), mask.data() + mask.span());
  const Dataset q = from_tensor(pb.q, DType::f64), k = from_tensor(pb.k, DType::f64),
                v = from_tensor(pb.v, DType::f64), dout = from_tensor(pb.q, DType::f64);
  const fs::path in = work_dir() / "msa_in.h5", out = work_dir() / "msa_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &m}});
  fs::remove(out);
  const CliRun r = run_cli("forward --multiscale --causal --scale 0.5 --in " + in.string() +
                           " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  kfa::msa::Params p;
  p.causal = true;
  p.scale = 0.5;
  Dataset o, rsum;
  {
    kfa_apps::H5File f(out.string());
    o = f.read("/o", 4);
    rsum = f.read("/rsum", 3);
  }
  const auto fc = kfa::reference::msa_check_forward<double>(
      to_tensor(q), to_tensor(k), to_tensor(v), mask, p, to_tensor(o), to_tensor3(rsum));
  EXPECT_TRUE(fc.ok()) << "O err " << fc.o.err << ", rsum err " << fc.lse.err;

  const fs::path bin = work_dir() / "msa_bwd.h5", bout = work_dir() / "msa_grads.h5";
  kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/mask", &m},
                                        {"/o", &o},
                                        {"/rsum", &rsum},
                                        {"/do", &dout}});
  const CliRun b = run_cli("backward --multiscale --causal --scale 0.5 --deterministic --in " +
                           bin.string() + " --out " + bout.string());
  ASSERT_EQ(b.status, 0) << b.err;
  kfa_apps::H5File g(bout.string());
  const auto bc = kfa::reference::msa_check_backward<double>(
      to_tensor(q), to_tensor(k), to_tensor(v), mask, p, to_tensor(dout),
      to_tensor(g.read("/dq", 4)), to_tensor(g.read("/dk", 4)), to_tensor(g.read("/dv", 4)));
  EXPECT_TRUE(bc.ok()) << "dQ err " << bc.dq.err << ", dK err " << bc.dk.err << ", dV err "
                       << bc.dv.err;

  // --random: the decay mask, checked against the reference in both passes.
  for (const char* cmd : {"forward", "backward"})
    for (const char* dtype : {"float", "double"}) {
      const CliRun c = run_cli(std::string(cmd) + " --multiscale --random 1,3,70,32 --heads-kv 1 " +
                               "--causal --dtype " + dtype + " --json --check");
      ASSERT_EQ(c.status, 0) << cmd << " " << dtype << ": " << c.err;
      const std::string line = c.out.substr(c.out.rfind('{'));
      for (const char* key : {"\"multiscale\":true", "\"check\":\"pass\"", "\"scale\":1,"})
        EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    }

  // A mask of the wrong shape: the error names both shapes.
  Dataset bad = m;
  bad.dims = {4, 37, 52};
  bad.data.resize(std::size_t(4) * 37 * 52);
  const fs::path badp = work_dir() / "msa_bad.h5";
  kfa_apps::write_atomic(badp.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &bad}});
  expect_bad("forward --multiscale --in " + badp.string(),
             "mask has shape (4, 37, 52) but must be (heads_q, seqlen_q, seqlen_k) = (4, 37, 53)");
  Dataset badtype = m;
  badtype.dtype = DType::f32;
  kfa_apps::write_atomic(badp.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &badtype}});
  expect_bad("forward --multiscale --in " + badp.string(),
             "dataset /mask is float32 but /q is float64");
  expect_bad("backward --multiscale --in " + in.string(), "missing dataset /o");
  expect_bad("forward --multiscale --random 1,1,8,8 --softcap 2",
             "--softcap does not apply to --multiscale");
  expect_bad("dropout-mask --multiscale --shape 1,1,2,2 --dropout 0.1 --seed 1",
             "does not apply to dropout-mask");
}

// kfa layernorm: a float64 round trip through HDF5 (with a residual) against the reference,
// --random with --json and --check in both passes and types, and bad input naming both shapes.
Dataset ln_dataset(std::vector<hsize_t> dims, std::mt19937_64& gen, double centre, double amp) {
  Dataset d;
  d.dtype = DType::f64;
  d.dims = std::move(dims);
  std::uniform_real_distribution<double> u(centre - amp, centre + amp);
  d.data.resize(d.size());
  for (auto& x : d.data)
    x = u(gen);
  return d;
}

kfa::reference::Tensor2 ln_tensor2(const Dataset& d) {
  kfa::reference::Tensor2 t("t", d.dims[0], d.dims[1]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

kfa::reference::Tensor1 ln_tensor1(const Dataset& d) {
  kfa::reference::Tensor1 t("t", d.dims[0]);
  std::copy(d.data.begin(), d.data.end(), t.data());
  return t;
}

TEST(Cli, LayerNorm) {
  const hsize_t rows = 6, D = 40;
  std::mt19937_64 gen(91);
  const Dataset x = ln_dataset({rows, D}, gen, 100, 1), res = ln_dataset({rows, D}, gen, 0, 1),
                gamma = ln_dataset({D}, gen, 1, 0.5), beta = ln_dataset({D}, gen, 0, 0.5),
                dy = ln_dataset({rows, D}, gen, 0, 1);
  const fs::path in = work_dir() / "ln_in.h5", out = work_dir() / "ln_out.h5";
  kfa_apps::write_atomic(in.string(),
                         {{"/x", &x}, {"/residual", &res}, {"/gamma", &gamma}, {"/beta", &beta}});
  fs::remove(out);
  const CliRun r = run_cli("layernorm forward --unbiased --eps 1e-3 --in " + in.string() +
                           " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  using kfa::reference::Tensor1;
  using kfa::reference::Tensor2;
  Tensor2 y("y", rows, D), dx("dx", rows, D);
  Tensor1 mean("mean", rows), rstd("rstd", rows), dgamma("dgamma", D), dbeta("dbeta", D);
  kfa::reference::layer_norm<double>(ln_tensor2(x), ln_tensor2(res), ln_tensor1(gamma),
                                     ln_tensor1(beta), 1e-3, true, y, mean, rstd);
  {
    kfa_apps::H5File f(out.string());
    EXPECT_TRUE(kfa::reference::apply_rule<double>(ln_tensor2(f.read("/y", 2)), y, y).ok());
    EXPECT_TRUE(
        kfa::reference::apply_rule<double>(ln_tensor1(f.read("/mean", 1)), mean, mean).ok());
    EXPECT_TRUE(
        kfa::reference::apply_rule<double>(ln_tensor1(f.read("/rstd", 1)), rstd, rstd).ok());
  }
  const fs::path bin = work_dir() / "ln_bwd.h5";
  kfa_apps::write_atomic(
      bin.string(),
      {{"/x", &x}, {"/residual", &res}, {"/gamma", &gamma}, {"/beta", &beta}, {"/dy", &dy}});
  const CliRun b = run_cli("layernorm backward --unbiased --eps 1e-3 --in " + bin.string() +
                           " --out " + out.string());
  ASSERT_EQ(b.status, 0) << b.err;
  kfa::reference::layer_norm_backward<double>(ln_tensor2(x), ln_tensor2(res), ln_tensor1(gamma),
                                              1e-3, true, ln_tensor2(dy), dx, dgamma, dbeta);
  {
    kfa_apps::H5File f(out.string());
    EXPECT_TRUE(kfa::reference::apply_rule<double>(ln_tensor2(f.read("/dx", 2)), dx, dx).ok());
    EXPECT_TRUE(
        kfa::reference::apply_rule<double>(ln_tensor1(f.read("/dgamma", 1)), dgamma, dgamma).ok());
    EXPECT_TRUE(
        kfa::reference::apply_rule<double>(ln_tensor1(f.read("/dbeta", 1)), dbeta, dbeta).ok());
  }

  for (const char* pass : {"forward", "backward"})
    for (const char* dtype : {"float", "double", "bf16"}) {
      const CliRun c = run_cli(std::string("layernorm ") + pass + " --random 33,300 --dtype " +
                               dtype + " --repeat 2 --json --check");
      ASSERT_EQ(c.status, 0) << pass << " " << dtype << ": " << c.err;
      const std::string line = c.out.substr(c.out.rfind('{'));
      for (const char* key : {"\"command\":\"layernorm\"", "\"check\":\"pass\"", "\"d\":300"})
        EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    }

  // Bad input: shapes named on both sides, datasets the pass does not read, flags it does not
  // take.
  const Dataset short_gamma = ln_dataset({D - 1}, gen, 1, 0.5),
                wide = ln_dataset({rows, D + 1}, gen, 0, 1);
  const fs::path bad = work_dir() / "ln_bad.h5";
  kfa_apps::write_atomic(bad.string(), {{"/x", &x}, {"/gamma", &short_gamma}, {"/beta", &beta}});
  expect_bad("layernorm forward --in " + bad.string(), "/gamma has shape (39) but must be (40)");
  expect_bad("layernorm forward --in " + bad.string(), "/x of shape (6,40)");
  kfa_apps::write_atomic(bad.string(),
                         {{"/x", &x}, {"/residual", &wide}, {"/gamma", &gamma}, {"/beta", &beta}});
  expect_bad("layernorm forward --in " + bad.string(),
             "/residual has shape (6,41) but /x has shape (6,40)");
  expect_bad("layernorm forward --in " + bin.string(), "/dy, which kfa layernorm forward");
  kfa_apps::write_atomic(bad.string(), {{"/x", &x}, {"/gamma", &gamma}, {"/beta", &beta}});
  expect_bad("layernorm backward --in " + bad.string(), "missing");
  expect_bad("layernorm forward --random 4,8 --causal",
             "'--causal' does not apply to kfa layernorm");
  expect_bad("layernorm forward --random 4,8 --eps -1", "--eps must be >= 0");
  expect_bad("layernorm forward --random 4,1 --unbiased", "needs D >= 2");
  expect_bad("layernorm forward --random 4", "--random expects ROWS,D");
  expect_bad("layernorm sideways --random 4,8", "unknown command 'sideways'");
  expect_bad("layernorm forward", "give --in IN.h5 --out OUT.h5 or --random ROWS,D");
}

}  // namespace

// kfa mha: --random --check in both passes and types (with GQA, the layer norm, causal and
// dropout), a float64 round trip through HDF5 against the block reference of
// kfa/mha_reference.hpp, and each bad input exiting 2 with one line naming it, writing nothing.
#ifdef KFA_CLI_NN
TEST(Cli, Mha) {
  for (const char* pass : {"forward", "backward"})
    for (const char* dtype : {"float", "double"})
      for (const std::string flags :
           {"--heads 4 --heads-kv 2 --residual-layernorm --causal",
            "--heads 2 --dropout 0.2 --seed 7 --window 3,0 --softcap 5"}) {
        const CliRun c = run_cli(std::string("mha ") + pass + " --random 2,19,32 --dtype " + dtype +
                                 " " + flags + " --repeat 2 --json --check");
        ASSERT_EQ(c.status, 0) << pass << " " << dtype << " " << flags << ": " << c.err << c.out;
        const std::string line = c.out.substr(c.out.rfind('{'));
        for (const char* key : {"\"command\":\"mha\"", "\"check\":\"pass\"", "\"d_model\":32"})
          EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
        // Every output is checked: y, or dx and the gradient of every weight.
        const std::string sum = c.out;
        for (const char* name : std::string(pass) == "forward"
                                    ? std::vector<const char*>{"y err"}
                                    : std::vector<const char*>{"dx err", "dw_qkv err", "db_o err"})
          EXPECT_NE(sum.find(name), std::string::npos) << name << " missing in " << sum;
      }

  // A file round trip in float64: B 2, L 5, d_model 12, 3 query heads over 1 kv head, the
  // residual layer norm, no output bias.
  const hsize_t B = 2, L = 5, d = 12, hq = 3, hkv = 1, hd = d / hq, width = (hq + 2 * hkv) * hd;
  std::mt19937_64 gen(23);
  const Dataset x = ln_dataset({B, L, d}, gen, 0, 1), dy = ln_dataset({B, L, d}, gen, 0, 1),
                w_qkv = ln_dataset({d, width}, gen, 0, 0.5),
                b_qkv = ln_dataset({width}, gen, 0, 0.5),
                w_o = ln_dataset({hq * hd, d}, gen, 0, 0.5), gamma = ln_dataset({d}, gen, 1, 0.5),
                beta = ln_dataset({d}, gen, 0, 0.5);
  const fs::path in = work_dir() / "mha_in.h5", out = work_dir() / "mha_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/x", &x},
                                       {"/w_qkv", &w_qkv},
                                       {"/b_qkv", &b_qkv},
                                       {"/w_o", &w_o},
                                       {"/gamma", &gamma},
                                       {"/beta", &beta},
                                       {"/dy", &dy}});
  namespace ref = kfa::reference;
  ref::MhaSpec spec;
  spec.batch = B;
  spec.seqlen = L;
  spec.heads_q = hq;
  spec.heads_kv = hkv;
  spec.attention.causal = true;
  spec.residual_layer_norm = true;
  spec.eps = 1e-3;
  const auto t2 = [](const Dataset& ds) {
    ref::Tensor2 t("t", ds.data.size() / ds.dims.back(), ds.dims.back());
    std::copy(ds.data.begin(), ds.data.end(), t.data());
    return t;
  };
  const ref::MhaTensors tin{
      t2(x),           t2(dy), t2(w_qkv), t2(w_o), ln_tensor1(b_qkv), {}, ln_tensor1(gamma),
      ln_tensor1(beta)};
  const ref::MhaResult want = ref::mha<double>(spec, tin, {}, true);
  const std::string flags = "--heads 3 --heads-kv 1 --causal --residual-layernorm --eps 1e-3";
  fs::remove(out);
  const CliRun b =
      run_cli("mha backward " + flags + " --in " + in.string() + " --out " + out.string());
  ASSERT_EQ(b.status, 0) << b.err;
  {
    kfa_apps::H5File f(out.string());
    std::vector<std::string> names = f.names();
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"/db_qkv", "/dbeta", "/dgamma", "/dw_o", "/dw_qkv",
                                               "/dx"}));
    const auto rule = [&](const char* name, int rank, const auto& r) {
      const Dataset g = f.read(name, rank);
      ref::Check c;
      if constexpr (std::decay_t<decltype(r)>::rank == 1)
        c = ref::apply_rule<double>(ln_tensor1(g), r, r);
      else
        c = ref::apply_rule<double>(t2(g), r, r);
      EXPECT_TRUE(c.ok()) << name << ": err " << c.err << " bound " << c.bound;
    };
    rule("/dx", 3, want.dx);
    rule("/dw_qkv", 2, want.dw_qkv);
    rule("/dw_o", 2, want.dw_o);
    rule("/db_qkv", 1, want.db_qkv);
    rule("/dgamma", 1, want.dgamma);
    rule("/dbeta", 1, want.dbeta);
  }
  const fs::path fin = work_dir() / "mha_fwd.h5";
  kfa_apps::write_atomic(fin.string(), {{"/x", &x},
                                        {"/w_qkv", &w_qkv},
                                        {"/b_qkv", &b_qkv},
                                        {"/w_o", &w_o},
                                        {"/gamma", &gamma},
                                        {"/beta", &beta}});
  const CliRun r = run_cli("mha forward " + flags + " --in " + fin.string() + " --out " +
                           out.string() + " --check");
  ASSERT_EQ(r.status, 0) << r.err;
  {
    kfa_apps::H5File f(out.string());
    EXPECT_EQ(f.names(), std::vector<std::string>{"/y"});
    const ref::Check c = ref::apply_rule<double>(t2(f.read("/y", 3)), want.y, want.y);
    EXPECT_TRUE(c.ok()) << "y: err " << c.err << " bound " << c.bound;
  }

  // Bad input: each names what is wrong (both shapes for a weight), exits 2, writes nothing.
  const Dataset wide_qkv = ln_dataset({d, width + 1}, gen, 0, 0.5),
                short_o = ln_dataset({hq * hd - 1, d}, gen, 0, 0.5);
  const fs::path bad = work_dir() / "mha_bad.h5";
  kfa_apps::write_atomic(bad.string(), {{"/x", &x}, {"/w_qkv", &wide_qkv}, {"/w_o", &w_o}});
  expect_bad("mha forward --heads 3 --heads-kv 1 --in " + bad.string(),
             "/w_qkv has shape (12,21) but must be (12,20)");
  expect_bad("mha forward --heads 3 --heads-kv 1 --in " + bad.string(), "/x of shape (2,5,12)");
  kfa_apps::write_atomic(bad.string(), {{"/x", &x}, {"/w_qkv", &w_qkv}, {"/w_o", &short_o}});
  expect_bad("mha forward --heads 3 --heads-kv 1 --in " + bad.string(),
             "/w_o has shape (11,12) but must be (12,12)");
  // The same file under other head counts: the weights no longer fit (both shapes named).
  expect_bad("mha forward --heads 3 --in " + fin.string() + " --residual-layernorm",
             "/w_qkv has shape (12,20) but must be (12,36)");
  expect_bad("mha forward --heads 5 --in " + fin.string() + " --residual-layernorm",
             "d_model = 12 (/x of shape (2,5,12)) is not divisible by --heads 5");
  expect_bad("mha forward --heads 3 --heads-kv 1 --in " + fin.string(),
             "holds /beta, which kfa mha reads only with --residual-layernorm");
  expect_bad("mha forward --heads 3 --heads-kv 1 --residual-layernorm --in " + in.string(),
             "holds /dy, which kfa mha forward does not read");
  expect_bad("mha backward --heads 3 --heads-kv 1 --residual-layernorm --in " + fin.string(),
             "missing dataset /dy");
  kfa_apps::write_atomic(bad.string(),
                         {{"/x", &x}, {"/w_qkv", &w_qkv}, {"/w_o", &w_o}, {"/b_o", &b_qkv}});
  expect_bad("mha forward --heads 3 --heads-kv 1 --in " + bad.string(),
             "/b_o has shape (20) but must be (12)");
  expect_bad("mha forward --random 1,4,16", "kfa mha needs --heads H");
  expect_bad("mha forward --random 1,4,18 --heads 4", "--random DMODEL 18 is not divisible");
  expect_bad("mha forward --random 1,4,16 --heads 4 --heads-kv 3",
             "--heads-kv 3 must divide --heads 4");
  expect_bad("mha forward --random 1,4,16 --heads 4 --dtype bf16",
             "kfa mha computes in float or double");
  expect_bad("mha forward --random 1,4,16 --heads 4 --eps 1e-3",
             "--eps is the layer norm's: it needs --residual-layernorm");
  expect_bad("mha forward --random 1,4,16 --heads 4 --seqlen-k 3",
             "'--seqlen-k' does not apply to kfa mha");
  expect_bad("mha forward --random 1,4,16 --heads 4 --head-dim-v 8",
             "'--head-dim-v' does not apply to kfa mha");
  expect_bad("mha forward --random 1,4,16 --heads 4 --deterministic",
             "--deterministic applies to backward only");
  expect_bad("mha forward --random 1,4,16 --heads 4 --dropout 0.1", "--dropout needs --seed");
  expect_bad("mha forward --random 1,4", "--random expects B,L,DMODEL");
  expect_bad("mha forward --random 1,4,1024 --heads 2", "head_dim = d_model / heads_q = 1024");
  expect_bad("mha backward --random 1,4,16 --heads 4 --heads-kv 2 --dq-mode symmetric",
             "dq_mode symmetric needs heads_q == heads_kv");
  expect_bad("mha sideways --random 1,4,16 --heads 4", "unknown command 'sideways'");
  expect_bad("mha forward --heads 4", "give --in IN.h5 --out OUT.h5 or --random B,L,DMODEL");
}
#else
TEST(Cli, MhaNotBuilt) {
  expect_bad("mha forward --random 1,4,16 --heads 4", "kfa mha is not built");
}
#endif
