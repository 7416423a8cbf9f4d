// The kfa-seqpar program under mpiexec, through its contract: --random --check passes for each
// mode and layout (forward and backward); HDF5 round trips, each rank writing only its rows,
// checked against the reference; --multiscale likewise; the score terms (--alibi, /bias with
// /dbias, /mask, /key_lengths) likewise; bad input, or options that differ
// between ranks, exits 2 with one line, on every rank, and leaves no output file.
#include <gtest/gtest.h>

#include <kfa/config.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include "h5io.hpp"
#include "problem.hpp"
#include "program.hpp"

#if !defined(KFA_SEQPAR_PATH) || !defined(KFA_MPIEXEC)
#error "KFA_SEQPAR_PATH and KFA_MPIEXEC must name the program and mpiexec"
#endif

namespace {

namespace fs = std::filesystem;
using namespace kfa_test;
using kfa_apps::Dataset;
using kfa_apps::DType;

// Open MPI's permission to run as root and to oversubscribe comes from the environment ctest
// sets for this test.
ProgramRun seqpar(int ranks, const std::string& args) {
  return run_program(std::string(KFA_MPIEXEC) + " -n " + std::to_string(ranks) + " " +
                     KFA_SEQPAR_PATH + " " + args);
}

// Rank 1 given `rank1_args` and every other rank `args`, through a shell per rank that reads
// its rank from the launcher's environment; `timeout` turns a hang into a failure (status
// 124) rather than the whole test's time running out.
ProgramRun seqpar_rank1_differs(int ranks, const std::string& args, const std::string& rank1_args) {
  const std::string program = KFA_SEQPAR_PATH;
  return run_program("timeout 60 " + std::string(KFA_MPIEXEC) + " -n " + std::to_string(ranks) +
                     " sh -c 'if [ \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" = 1 ]; then exec " +
                     program + " " + rank1_args + "; else exec " + program + " " + args + "; fi'");
}

TEST(SeqParCli, RandomCheckPassesInEveryModeAndLayout) {
  struct Run {
    int ranks;
    std::string args;
  };
  const Run runs[] = {
      {2, "forward --random 1,2,301,32 --mode ring --layout zigzag --causal"},
      {3, "forward --random 2,4,160,64 --heads-kv 2 --mode tree --layout contiguous --window 20,5"},
      {4, "forward --random 1,2,130,16 --seqlen-k 97 --mode tree --layout zigzag --softcap 5"},
      {2,
       "backward --random 1,2,203,32 --mode ring --layout contiguous --causal --dropout 0.2 "
       "--seed 9"},
      {3,
       "backward --random 1,4,150,64 --heads-kv 1 --mode tree --layout zigzag --causal "
       "--deterministic"},
      {4, "backward --random 1,1,3,16 --mode ring --layout zigzag --dtype double"},
      // v's head dim of its own: the exchanged K|V shards and the tree's O and dO rows.
      {3, "forward --random 1,2,90,32 --head-dim-v 48 --mode ring --layout zigzag --causal"},
      {2, "backward --random 1,4,70,16 --heads-kv 2 --head-dim-v 40 --mode tree --causal"},
      {2, "backward --random 1,2,60,32 --head-dim-v 8 --mode ring --deterministic"},
  };
  for (const Run& run : runs) {
    SCOPED_TRACE(run.args + " on " + std::to_string(run.ranks) + " ranks");
    const ProgramRun r = seqpar(run.ranks, run.args + " --check --json --repeat 2");
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("GFLOP/s (all " + std::to_string(run.ranks) + " ranks together)"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("align="), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"ranks\":" + std::to_string(run.ranks)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"comm_s\":["), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank " + std::to_string(run.ranks - 1) + ":"), std::string::npos);
  }
}

// Forward then backward through files at 3 ranks: the output files hold the whole tensors
// (each rank wrote its rows) and pass the tolerance rule against the reference.
TEST(SeqParCli, RoundTripThroughParallelHdf5) {
  const Shape s{1, 4, 2, 131, 131, 32};
  Problem pb(s, 77);
  kfa::Params p;
  p.causal = true;
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32),
                v = from_tensor(pb.v, DType::f32);
  const fs::path in = work_dir() / "sp_in.h5", out = work_dir() / "sp_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  fs::remove(out);
  ProgramRun r = seqpar(3, "forward --in " + in.string() + " --out " + out.string() +
                               " --mode ring --layout zigzag --causal");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const Tensor4 qt = to_tensor(q), kt = to_tensor(k), vt = to_tensor(v);
  Dataset o, lse;
  {
    kfa_apps::H5File f(out.string());
    o = f.read("/o", 4);
    lse = f.read("/lse", 3);
  }
  EXPECT_EQ(o.dtype, DType::f32);
  EXPECT_EQ(o.dims, q.dims);
  const auto cf =
      kfa::reference::check_forward<float>(qt, kt, vt, p, to_tensor(o), to_tensor3(lse));
  EXPECT_TRUE(cf.ok()) << "O err " << cf.o.err << " (bound " << cf.o.bound << "), LSE err "
                       << cf.lse.err << " (bound " << cf.lse.bound << ")";

  // The backward reads the forward's /o and /lse, with /do and /dlse.
  std::mt19937_64 gen(78);
  const Tensor4 dout = random_tensor("do", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  const Dataset dod = from_tensor(dout, DType::f32);
  Dataset dlse;
  dlse.dtype = DType::f32;
  dlse.dims = lse.dims;
  for (std::size_t e = 0; e < lse.size(); ++e)
    dlse.data.push_back(double(float(0.25 * std::sin(double(e)))));
  const fs::path bin = work_dir() / "sp_bin.h5", bout = work_dir() / "sp_bout.h5";
  kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/o", &o},
                                        {"/lse", &lse},
                                        {"/do", &dod},
                                        {"/dlse", &dlse}});
  fs::remove(bout);
  r = seqpar(3, "backward --in " + bin.string() + " --out " + bout.string() +
                    " --mode tree --layout contiguous --causal --deterministic");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  kfa_apps::H5File f(bout.string());
  const Tensor4 dq = to_tensor(f.read("/dq", 4)), dk = to_tensor(f.read("/dk", 4)),
                dv = to_tensor(f.read("/dv", 4));
  const auto cb =
      kfa::reference::check_backward<float>(qt, kt, vt, p, dout, to_tensor3(dlse), dq, dk, dv);
  for (const auto& [name, c] : {std::pair{"dQ", cb.dq}, {"dK", cb.dk}, {"dV", cb.dv}})
    EXPECT_TRUE(c.ok()) << name << ": err " << c.err << " > bound " << c.bound;
}

// Fewer rows than ranks, from a file with /dlse: ranks that own no rows still take the
// dlse path with the others (the choice must not depend on a rank's own rows).
TEST(SeqParCli, TinySequenceFromFileWithDlse) {
  const Shape s{1, 2, 1, 2, 2, 16};
  Problem pb(s, 90);
  kfa::Params p;
  const Dataset q = from_tensor(pb.q, DType::f64), k = from_tensor(pb.k, DType::f64),
                v = from_tensor(pb.v, DType::f64);
  // The forward's outputs from the reference (double), and random dO and dLSE.
  Tensor4 o("o", 1, 2, 2, 16);
  Tensor3 lse("lse", 1, 2, 2), dl("dl", 1, 2, 2);
  kfa::reference::forward<double>(pb.q, pb.k, pb.v, p, o, lse);
  std::mt19937_64 gen(91);
  const Tensor4 dout = random_tensor("do", 1, 2, 2, 16, gen);
  for (std::size_t e = 0; e < dl.span(); ++e)
    dl.data()[e] = 0.5 - 0.25 * double(e);
  auto d3 = [](const Tensor3& t) {
    Dataset d;
    d.dtype = DType::f64;
    d.dims = {t.extent(0), t.extent(1), t.extent(2)};
    d.data.assign(t.data(), t.data() + t.span());
    return d;
  };
  const Dataset od = from_tensor(o, DType::f64), ld = d3(lse), dod = from_tensor(dout, DType::f64),
                dld = d3(dl);
  const fs::path in = work_dir() / "sp_tiny.h5", out = work_dir() / "sp_tiny_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q},
                                       {"/k", &k},
                                       {"/v", &v},
                                       {"/o", &od},
                                       {"/lse", &ld},
                                       {"/do", &dod},
                                       {"/dlse", &dld}});
  fs::remove(out);
  const ProgramRun r = seqpar(3, "backward --in " + in.string() + " --out " + out.string() +
                                     " --mode ring --layout zigzag");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  kfa_apps::H5File f(out.string());
  const auto c = kfa::reference::check_backward<double>(
      pb.q, pb.k, pb.v, p, dout, dl, to_tensor(f.read("/dq", 4)), to_tensor(f.read("/dk", 4)),
      to_tensor(f.read("/dv", 4)));
  for (const auto& [name, cr] : {std::pair{"dQ", c.dq}, {"dK", c.dk}, {"dV", c.dv}})
    EXPECT_TRUE(cr.ok()) << name << ": err " << cr.err << " > bound " << cr.bound;
}

// --multiscale: forward and backward through files (the whole /mask read by every rank, /rsum
// written and read back), each against kfa::reference's multi-scale passes; --random --check
// with the decay mask; the bad inputs particular to it.
TEST(SeqParCli, MultiScale) {
  const Shape s{1, 4, 2, 37, 53, 24};
  Problem pb(s, 79);
  kfa::reference::Mask3 mask(std::string("mask"), 4, 37, 53);
  std::mt19937_64 gen(80);
  std::uniform_real_distribution<double> u(0, 0.2);
  for (std::size_t e = 0; e < mask.span(); ++e)
    mask.data()[e] = u(gen);
  Dataset m;
  m.dtype = DType::f64;
  m.dims = {4, 37, 53};
  m.data.assign(mask.data(), mask.data() + mask.span());
  const Dataset q = from_tensor(pb.q, DType::f64), k = from_tensor(pb.k, DType::f64),
                v = from_tensor(pb.v, DType::f64), dout = from_tensor(pb.q, DType::f64);
  const fs::path in = work_dir() / "sp_msa_in.h5", out = work_dir() / "sp_msa_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &m}});
  fs::remove(out);
  ProgramRun r = seqpar(3,
                        "forward --multiscale --causal --scale 0.5 --mode tree --layout zigzag "
                        "--in " +
                            in.string() + " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("wrote /o /rsum"), std::string::npos) << r.out;
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

  const fs::path bin = work_dir() / "sp_msa_bwd.h5", bout = work_dir() / "sp_msa_grads.h5";
  kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/mask", &m},
                                        {"/o", &o},
                                        {"/rsum", &rsum},
                                        {"/do", &dout}});
  fs::remove(bout);
  r = seqpar(2, "backward --multiscale --causal --scale 0.5 --deterministic --mode ring --in " +
                    bin.string() + " --out " + bout.string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  {
    kfa_apps::H5File g(bout.string());
    const auto bc = kfa::reference::msa_check_backward<double>(
        to_tensor(q), to_tensor(k), to_tensor(v), mask, p, to_tensor(dout),
        to_tensor(g.read("/dq", 4)), to_tensor(g.read("/dk", 4)), to_tensor(g.read("/dv", 4)));
    EXPECT_TRUE(bc.ok()) << "dQ err " << bc.dq.err << ", dK err " << bc.dk.err << ", dV err "
                         << bc.dv.err;
  }

  // --random: the decay mask, each rank's gradients against the single-rank passes (the files
  // above checked the forward).
  r = seqpar(3,
             "backward --multiscale --random 1,3,70,32 --heads-kv 1 --causal --layout zigzag "
             "--mode tree --check --json");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  for (const char* key : {"\"multiscale\":true", "\"check\":\"pass\"", "\"scale\":1,"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;

  // A mask of another shape; a softmax statistic in a multi-scale file; --softcap.
  Dataset m2 = m;
  m2.dims = {4, 53, 37};
  const fs::path bad = work_dir() / "sp_msa_bad.h5", lse = work_dir() / "sp_msa_lse.h5";
  kfa_apps::write_atomic(bad.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &m2}});
  kfa_apps::write_atomic(lse.string(), {{"/q", &q},
                                        {"/k", &k},
                                        {"/v", &v},
                                        {"/o", &o},
                                        {"/rsum", &rsum},
                                        {"/lse", &rsum},
                                        {"/do", &dout}});
  Dataset cu = q;  // any values: the name alone is refused
  cu.dims = {2};
  cu.data = {0, 37};
  const fs::path varlen = work_dir() / "sp_varlen.h5";
  kfa_apps::write_atomic(varlen.string(),
                         {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/cu_seqlens_q", &cu}});
  struct Case {
    std::string args, want;
  };
  const Case cases[] = {
      {"forward --multiscale --in " + bad.string() + " --out " + out.string(),
       "dataset /mask has shape (4,53,37) but (heads, seqlen) of /q and /k gives (4,37,53)"},
      {"backward --multiscale --in " + lse.string() + " --out " + out.string(),
       "'" + lse.string() + "' holds /lse, which kfa-seqpar does not read"},
      {"forward --multiscale --random 1,1,8,8 --softcap 2",
       "--softcap does not apply to --multiscale"},
      // kfa reads varlen offsets; kfa-seqpar has no varlen and must not ignore them.
      {"forward --in " + varlen.string() + " --out " + out.string(),
       "'" + varlen.string() + "' holds /cu_seqlens_q, which kfa-seqpar does not read"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    fs::remove(out);
    r = seqpar(2, c.args);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("kfa-seqpar: error: rank 0: " + c.want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kfa-seqpar: error: "), r.err.rfind("kfa-seqpar: error: ")) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// Each failure: exit 2 on every rank, one line from rank 0, no output file.
// The score terms through the program: --alibi with --check in both modes; a file's /bias
// (forward, then the backward writing /dbias), /mask (uint8, a row hidden everywhere) and
// /key_lengths (0 and 1 among them), each rank's rows assembled in the output file and
// checked against the reference with the same term.
TEST(SeqParCli, ScoreTerms) {
  for (const std::string a :
       {"forward --random 2,4,90,32 --heads-kv 2 --causal --mode ring --alibi",
        "backward --random 1,2,77,16 --mode tree --layout zigzag --alibi --dtype double "
        "--deterministic"}) {
    const ProgramRun r = seqpar(3, a + " --check --json");
    EXPECT_EQ(r.status, 0) << a << r.out << r.err;
    EXPECT_NE(r.out.find("\"check\":\"pass\""), std::string::npos) << a << r.out;
    EXPECT_NE(r.out.find(" term=alibi"), std::string::npos) << a << r.out;
  }

  const Shape s{3, 2, 1, 45, 38, 16};
  Problem pb(s, 81);
  std::mt19937_64 gen(82);
  const Tensor4 dout = random_tensor("do", s.batch, s.heads_q, s.seqlen_q, s.head_dim, gen);
  const Dataset q = from_tensor(pb.q, DType::f64), k = from_tensor(pb.k, DType::f64),
                v = from_tensor(pb.v, DType::f64), dod = from_tensor(dout, DType::f64);
  kfa::Params p;
  p.causal = true;  // bottom_right with seqlen_q > seqlen_k: the first 7 rows see no key
  kfa::reference::Terms bias, mask, lengths;
  bias.bias = Tensor4("bias", 1, 2, 45, 38);
  std::uniform_real_distribution<double> u(-2, 2);
  for (std::size_t e = 0; e < bias.bias.span(); ++e)
    bias.bias.data()[e] = u(gen);
  Dataset bias_ds = from_tensor(bias.bias, DType::f64), mask_ds, len_ds;
  mask.mask = Keep4("mask", 3, 1, 45, 38);
  std::bernoulli_distribution coin(0.6);
  mask_ds.dtype = len_ds.dtype = DType::u8;
  mask_ds.dims = {3, 1, 45, 38};
  for (std::size_t e = 0; e < mask.mask.span(); ++e) {
    mask.mask.data()[e] = e / 38 % 45 != 20 && coin(gen) ? 1 : 0;  // row 20 hidden everywhere
    mask_ds.bytes.push_back(mask.mask.data()[e]);
  }
  lengths.key_lengths = {0, 1, 30};
  len_ds.dims = {3};
  len_ds.bytes = {0, 1, 30};
  struct Case {
    const char* name;
    const Dataset* ds;
    const kfa::reference::Terms* terms;
    const char* mode;
  };
  for (const Case& c :
       {Case{"/bias", &bias_ds, &bias, "ring"}, Case{"/mask", &mask_ds, &mask, "tree"},
        Case{"/key_lengths", &len_ds, &lengths, "ring"}}) {
    SCOPED_TRACE(c.name);
    const fs::path in = work_dir() / "sp_term_in.h5", out = work_dir() / "sp_term_out.h5";
    kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {c.name, c.ds}});
    fs::remove(out);
    ProgramRun r = seqpar(3, std::string("forward --causal --layout zigzag --mode ") + c.mode +
                                 " --in " + in.string() + " --out " + out.string());
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string(" term=") + (c.name + 1)), std::string::npos) << r.out;
    Dataset o, lse;
    {
      kfa_apps::H5File f(out.string());
      o = f.read("/o", 4);
      lse = f.read("/lse", 3);
    }
    const auto fc = kfa::reference::check_forward<double>(pb.q, pb.k, pb.v, p, to_tensor(o),
                                                          to_tensor3(lse), {}, *c.terms);
    EXPECT_TRUE(fc.ok()) << "O err " << fc.o.err << ", LSE err " << fc.lse.err;

    const fs::path bin = work_dir() / "sp_term_bwd.h5", bout = work_dir() / "sp_term_grads.h5";
    kfa_apps::write_atomic(bin.string(), {{"/q", &q},
                                          {"/k", &k},
                                          {"/v", &v},
                                          {c.name, c.ds},
                                          {"/o", &o},
                                          {"/lse", &lse},
                                          {"/do", &dod}});
    fs::remove(bout);
    r = seqpar(2, std::string("backward --causal --mode ") + c.mode + " --in " + bin.string() +
                      " --out " + bout.string());
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    kfa_apps::H5File g(bout.string());
    const auto bc = kfa::reference::check_backward<double>(
        pb.q, pb.k, pb.v, p, dout, {}, to_tensor(g.read("/dq", 4)), to_tensor(g.read("/dk", 4)),
        to_tensor(g.read("/dv", 4)), {}, *c.terms);
    EXPECT_TRUE(bc.ok()) << "dQ err " << bc.dq.err << ", dK err " << bc.dk.err << ", dV err "
                         << bc.dv.err;
    EXPECT_EQ(g.has("/dbias"), c.terms == &bias);
    if (c.terms == &bias) {
      EXPECT_NE(r.out.find("wrote /dq /dk /dv /dbias"), std::string::npos) << r.out;
      const auto db = kfa::reference::check_dbias<double>(pb.q, pb.k, pb.v, p, dout, {},
                                                          to_tensor(g.read("/dbias", 4)), {}, bias);
      EXPECT_TRUE(db.ok()) << "dbias err " << db.err << " > bound " << db.bound;
    }
  }
  // --alibi does not apply to multi-scale attention.
  const ProgramRun r = seqpar(2, "forward --random 1,2,20,16 --multiscale --alibi");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--alibi does not apply to --multiscale"), std::string::npos) << r.err;
}

TEST(SeqParCli, BadInputEndsEveryRankWithOneLine) {
  const Shape s{1, 2, 2, 40, 40, 16};
  Problem pb(s, 5);
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32);
  // /v with 3 heads where /k has 2 (its head dim may differ from /k's, its heads may not).
  Problem other({1, 3, 3, 40, 40, 16}, 6);
  const Dataset v3h = from_tensor(other.v, DType::f32);
  const fs::path bad = work_dir() / "sp_bad.h5", out = work_dir() / "sp_never.h5";
  kfa_apps::write_atomic(bad.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v3h}});
  // /v shorter than /k: the ranks owning the missing rows must not fail alone.
  Problem shorter({1, 2, 2, 40, 25, 16}, 7);
  const Dataset v25 = from_tensor(shorter.v, DType::f32);
  const fs::path short_v = work_dir() / "sp_short.h5";
  kfa_apps::write_atomic(short_v.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v25}});
  // 3 kv heads for 2 query heads: the library's collective check refuses it on every rank.
  Problem three({1, 3, 3, 40, 40, 16}, 8);
  const Dataset k3 = from_tensor(three.k, DType::f32), v3 = from_tensor(three.v, DType::f32);
  const fs::path heads = work_dir() / "sp_heads.h5";
  kfa_apps::write_atomic(heads.string(), {{"/q", &q}, {"/k", &k3}, {"/v", &v3}});
  const Dataset v = from_tensor(pb.v, DType::f32);
  const fs::path good = work_dir() / "sp_good.h5";
  kfa_apps::write_atomic(good.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  // 16-bit tensors are kfa's only: kfa::mpi takes float and double.
  const Dataset qh = from_tensor(pb.q, DType::f16), kh = from_tensor(pb.k, DType::f16),
                vh = from_tensor(pb.v, DType::f16);
  const fs::path half = work_dir() / "sp_half.h5";
  kfa_apps::write_atomic(half.string(), {{"/q", &qh}, {"/k", &kh}, {"/v", &vh}});
  // NaN in /k, an unknown dataset, a header beyond memory.
  Dataset k_nan = k;
  k_nan.data[((0 * 2 + 1) * 40 + 33) * 16 + 2] = std::nan("");
  const fs::path nan = work_dir() / "sp_nan.h5", mask = work_dir() / "sp_mask.h5",
                 huge = work_dir() / "sp_huge.h5";
  kfa_apps::write_atomic(nan.string(), {{"/q", &q}, {"/k", &k_nan}, {"/v", &v}});
  kfa_apps::write_atomic(mask.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}, {"/mask", &v}});
  {
    const hid_t f = H5Fcreate(huge.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[4] = {1, 64, 1000000, 128}, chunk[4] = {1, 1, 1, 128};
    const hid_t space = H5Screate_simple(4, dims, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 4, chunk);
    for (const char* n : {"/q", "/k", "/v"})
      H5Dclose(H5Dcreate2(f, n, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  struct Case {
    std::string args, want;
  };
  const Case cases[] = {
      {"forward --in " + nan.string() + " --out " + out.string(),
       "holds 1 non-finite value in rank 2's rows, the first at (0,1,33,2)"},
      // A float /mask without --multiscale: the softmax boolean mask must be uint8.
      {"forward --in " + mask.string() + " --out " + out.string(),
       "/mask in '" + mask.string() + "' must be uint8 (a float /mask is the weight tensor of " +
           "--multiscale)"},
      {"forward --in " + work_dir().string() + " --out " + out.string(), "is a directory"},
      {"forward --in " + huge.string() + " --out " + out.string(),
       "dataset /q (1,64,1000000,128) with /k (1,64,1000000,128) (float32) in"},
      {"forward --in " + good.string() + " --out " + work_dir().string(), "is a directory"},
      {"forward --in " + (work_dir() / "missing.h5").string() + " --out " + out.string(),
       "cannot open input file"},
      {"forward --in " + bad.string() + " --out " + out.string(), "dataset /v has shape"},
      {"forward --in " + short_v.string() + " --out " + out.string(), "dataset /v has shape"},
      {"forward --in " + heads.string() + " --out " + out.string(), "rank 0: mpi::forward: "},
      {"backward --in " + good.string() + " --out " + out.string(), "missing dataset /o"},
      {"forward --in " + bad.string() + " --out " + out.string() + " --mode sideways",
       "--mode expects ring or tree"},
      {"forward --random 1,2,64,16 --check --dropout 1", "--dropout must be in [0, 1)"},
      {"forward --in " + bad.string() + " --out " + out.string() + " --check",
       "--check applies to --random only"},
      {"forward --random 1,2,64,16 --dtype bf16",
       "--dtype bfloat16 is kfa's only: kfa-seqpar takes float and double"},
      {"forward --in " + half.string() + " --out " + out.string(),
       "is float16: kfa-seqpar takes float32 and float64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    fs::remove(out);
    const ProgramRun r = seqpar(3, c.args);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("kfa-seqpar: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    // Only rank 0 reports (mpiexec adds its own note about the exit status).
    EXPECT_EQ(r.err.find("kfa-seqpar: error: "), r.err.rfind("kfa-seqpar: error: ")) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  // An output folder that does not exist: every rank fails, nothing is left behind.
  const ProgramRun r = seqpar(2, "forward --in " + good.string() + " --out " +
                                     (work_dir() / "no" / "such" / "dir.h5").string());
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;

  // A write that fails on every rank (a file-size limit on each): one line, the existing OUT
  // kept, no temporary file, exit 2 (HDF5's exit handlers skipped).
  Problem big({1, 2, 2, 256, 256, 64}, 9);
  const Dataset bq = from_tensor(big.q, DType::f32), bk = from_tensor(big.k, DType::f32),
                bv = from_tensor(big.v, DType::f32);
  const fs::path big_in = work_dir() / "sp_big.h5", kept = work_dir() / "sp_kept.h5";
  kfa_apps::write_atomic(big_in.string(), {{"/q", &bq}, {"/k", &bk}, {"/v", &bv}});
  std::ofstream(kept) << "an older output";
  const ProgramRun w = run_program(
      "timeout 60 " + std::string(KFA_MPIEXEC) + " -n 2 sh -c \"ulimit -f 64; trap '' XFSZ; exec " +
      KFA_SEQPAR_PATH + " forward --in " + big_in.string() + " --out " + kept.string() + "\"");
  EXPECT_EQ(w.status, 2) << w.out << w.err;
  EXPECT_NE(w.err.find("kfa-seqpar: error: cannot write output file '" + kept.string() + "'"),
            std::string::npos)
      << w.err;
  EXPECT_EQ(w.err.find("kfa-seqpar: error: "), w.err.rfind("kfa-seqpar: error: ")) << w.err;
  EXPECT_EQ(slurp(kept), "an older output");
  for (const auto& e : fs::directory_iterator(work_dir()))
    EXPECT_EQ(e.path().filename().string().find("sp_kept.h5.tmp"), std::string::npos);

  // An input missing on rank 1 alone (its own relative path, from another folder): named with
  // that rank's path.
  fs::create_directories(work_dir() / "r1");
  const ProgramRun m = run_program(
      "cd " + work_dir().string() + " && timeout 60 " + std::string(KFA_MPIEXEC) +
      " -n 2 sh -c 'if [ \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" = 1 ]; then cd r1; fi; exec " +
      KFA_SEQPAR_PATH + " forward --in sp_good.h5 --out " + out.string() + "'");
  EXPECT_EQ(m.status, 2) << m.out << m.err;
  EXPECT_NE(m.err.find("kfa-seqpar: error: rank 1: cannot open input file 'sp_good.h5'"),
            std::string::npos)
      << m.err;
}

// Options that differ between ranks, which left ranks waiting in different collectives (or
// aborted inside MPI) before: every rank ends with exit 2 and one line from rank 0 naming the
// option, before any file is opened or written.
TEST(SeqParCli, OptionsThatDifferBetweenRanksEndEveryRank) {
  const fs::path out = work_dir() / "sp_differs.h5", in = work_dir() / "sp_differs_in.h5";
  const std::string random = "forward --random 1,2,64,16 ";
  const std::string files = "forward --in " + in.string() + " --out " + out.string() + " ";
  struct Case {
    int ranks;
    std::string args, rank1_args, want;
  };
  const Case cases[] = {
      {2, random + "--repeat 2", random + "--repeat 3",
       "--repeat differs between ranks (2 on rank 0 vs 3 on rank 1)"},
      {3, random + "--repeat 2", random + "--repeat 2 --no-such-flag",
       "rank 1: unknown option '--no-such-flag'"},
      {2, random + "--dtype float", random + "--dtype double",
       "--dtype differs between ranks (float32 on rank 0 vs float64 on rank 1)"},
      {3, random + "--check", random, "--check differs between ranks"},
      {2, random + "--causal", random + "--window 3,0", "--causal differs between ranks"},
      {2, random, "backward --random 1,2,64,16", "the command differs between ranks"},
      // The input file does not exist: the difference is found before any rank opens it.
      {2, files + "--mode ring", files + "--mode tree",
       "--mode differs between ranks (ring on rank 0 vs tree on rank 1)"},
      {2, files, "forward --in " + in.string() + " --out " + out.string() + "2",
       "--out differs between ranks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args + " | rank 1: " + c.rank1_args);
    fs::remove(out);
    const ProgramRun r = seqpar_rank1_differs(c.ranks, c.args, c.rank1_args);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("kfa-seqpar: error: " + c.want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kfa-seqpar: error: "), r.err.rfind("kfa-seqpar: error: ")) << r.err;
    EXPECT_EQ(r.err.find("cannot open"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out.string() + "2"));
  }
  // The same options on every rank, through the same per-rank launch, still run.
  const ProgramRun same = seqpar_rank1_differs(2, random + "--repeat 2", random + "--repeat 2");
  EXPECT_EQ(same.status, 0) << same.out << same.err;
}

// Every field of kfa::Params appears in the JSON line, and the fields the pass reads in the
// description, as in kfa's; align among them. --version prints kfa's version.
TEST(SeqParCli, ReportsEveryPassField) {
  const ProgramRun r =
      seqpar(2, "forward --random 1,2,40,16 --causal --align top-left --splits 2 --json");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::string description = r.out.substr(0, r.out.find('\n'));
  const std::string last = r.out.substr(r.out.rfind('{'));
  EXPECT_NE(description.find(" align=top-left "), std::string::npos) << description;
  EXPECT_NE(description.find(" num_splits=2 "), std::string::npos) << description;
  EXPECT_NE(last.find("\"align\":\"top-left\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"mode\":\"ring\",\"layout\":\"contiguous\""), std::string::npos) << last;
  const kfa::Params p;
  kfa::for_each_field(p, [&](const kfa::Field& f, const auto&) {
    EXPECT_NE(last.find("\"" + std::string(f.name) + "\":"), std::string::npos)
        << f.name << " missing in " << last;
  });
  const ProgramRun b = seqpar(2, "forward --random 1,2,40,16 --deterministic");
  EXPECT_EQ(b.status, 2) << b.out << b.err;
  EXPECT_NE(b.err.find("--deterministic applies to backward only"), std::string::npos) << b.err;
  const ProgramRun v = seqpar(1, "--version");
  EXPECT_EQ(v.status, 0) << v.out << v.err;
  EXPECT_EQ(v.out.rfind(std::string("kfa-seqpar ") + KFA_VERSION_STRING + "\n", 0), 0u) << v.out;
}

// A rank killed mid-run (SIGKILL, as a node failure would): the whole job ends within 10 s with
// a non-zero status, and no output file appears.
TEST(SeqParCli, KilledRankEndsTheJob) {
  Problem pb({1, 2, 2, 512, 512, 64}, 12);
  const Dataset q = from_tensor(pb.q, DType::f32), k = from_tensor(pb.k, DType::f32),
                v = from_tensor(pb.v, DType::f32);
  const fs::path in = work_dir() / "sp_kill_in.h5", out = work_dir() / "sp_kill_out.h5";
  kfa_apps::write_atomic(in.string(), {{"/q", &q}, {"/k", &k}, {"/v", &v}});
  fs::remove(out);
  // Rank 1 runs the program in the background and kills it after a second; the others run it
  // for far longer than the test waits (--repeat).
  const std::string run = std::string(KFA_SEQPAR_PATH) + " forward --in " + in.string() +
                          " --out " + out.string() + " --repeat 1000000";
  const auto t0 = std::chrono::steady_clock::now();
  const ProgramRun r = run_program(
      "timeout 60 " + std::string(KFA_MPIEXEC) +
      " -n 2 sh -c 'if [ \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" = 1 ]; then " + run +
      " & pid=$!; sleep 1; kill -9 $pid; wait $pid; exit 137; else exec " + run + "; fi'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.status, 124) << "the job outlived the kill by a minute: " << r.err;
  EXPECT_LT(seconds, 1 + 10) << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(work_dir()))
    EXPECT_EQ(e.path().filename().string().find("sp_kill_out.h5.tmp"), std::string::npos);
}

}  // namespace
