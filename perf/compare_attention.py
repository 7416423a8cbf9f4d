#!/usr/bin/python3
"""kfa against the unfused baseline, PyTorch and ONNX Runtime on one core: speed and peak memory.

  /usr/bin/python3 perf/compare_attention.py [--build DIR] [--out-dir DIR] [--name NAME]
      [--passes fwd,bwd,fwd_bwd] [--types float,double] [--n 512,...,16384] [--d 64,128]
      [--causal 0,1] [--impls kfa,unfused,torch,ort,ort-unfused] [--min-time S]
      [--bench-args ARGS] [--budget-gib 12] [--ort-prefix DIR]
      [--mem-n 1024,...,32768] [--mem-shape B,H,D] [--mem-dtype float] [--cpu C] [--quick]
      [--rounds R] [--reuse]

Runs, one thread each (OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1, ONNX Runtime's intra- and
inter-op threads 1), pinned with taskset to CPU C (default the last one; --cpu -1 does not pin):
1. build/perf/bench_attention on the chosen cases, kfa and the unfused baseline side by side,
   with BM_fma_peak (the core's FMA peak, perf/fma_peak.hpp) and BM_sgemm in the same run
   (Google Benchmark JSON: DATE-NAME.json);
2. when `import torch` works, perf/torch_attention.py on the same cases (DATE-NAME-torch.json);
3. when onnxruntime-node is installed under --ort-prefix (default $ORT_PREFIX, else
   ~/.cache/kfa-peers/onnxruntime), perf/ort_attention.mjs on the same cases, one process each:
   `ort` is ONNX Runtime's flash path (com.microsoft MultiHeadAttention, GroupQueryAttention
   when causal), `ort-unfused` its MatMul + Softmax + MatMul graph; forward and float only, as
   ONNX Runtime has no backward and its attention kernels take float32 (DATE-NAME-ort.json);
4. the peak resident memory of one forward of each against N (DATE-NAME-memory.json): the kfa
   program (build/apps/kfa forward --random), build/perf/unfused_attention, PyTorch and ONNX
   Runtime, each its own process, read from wait4's rusage;
and writes DATE-NAME.md (the tables: GFLOP/s of each and its fraction of the FMA peak, and
kfa's speed-up over each peer), DATE-NAME.png (GFLOP/s against N) and DATE-NAME-memory.png
(peak memory against N) into --out-dir (default perf/results).

--rounds R (R > 1): steps 1 and 3 interleaved, for ratios between programs measured seconds
apart rather than minutes (a virtual machine's core drifts by 10-25 % within minutes): in each of
R rounds, every (D, causal, N) case runs bench_attention on that case alone (kfa's and the
unfused baseline's types and passes, with BM_fma_peak) and ONNX Runtime's runs on it right after
(before it in odd rounds). The tables give each figure's median over the rounds, each ratio to
ONNX Runtime the median of the rounds' own ratios with their range, and a table of bf16 over
float when both are asked (paired the same way); every round's figures are in
DATE-NAME-rounds.json. BM_sgemm runs once, before the rounds; PyTorch (step 2) in one pass of
its own, not interleaved.

The peer cases whose N x N buffers would pass --budget-gib are skipped and marked so. --quick:
float, D = 64, N = 512 ... 4096 (each unless given). --reuse: a step whose JSON file is already
in --out-dir is read, not run again (to finish an interrupted run or redo the report).
Install ONNX Runtime (outside the repository; --ignore-scripts: its postinstall step fetches
CUDA libraries, the CPU ones ship in the package):
  npm install --prefix ~/.cache/kfa-peers/onnxruntime --ignore-scripts --no-audit --no-fund \\
      onnxruntime-node@1.30.0

--gpu: the GPU comparison instead, kfa against PyTorch's scaled_dot_product_attention on one
GPU (perf/compare_gpu.py, whose flags follow: --build DIR of a CUDA build, --dry-run, ...):
  /usr/bin/python3 perf/compare_attention.py --gpu --build DIR [compare_gpu.py flags]
"""
import argparse
import datetime
import itertools
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import tables  # noqa: E402  (the Google Benchmark JSON loader the older tables use too)

PASSES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}
IMPLS = {"kfa": "kfa", "unfused": "unfused", "torch": "PyTorch", "ort": "ORT flash",
         "ort-unfused": "ORT unfused"}
SIZE = {"float": 4, "double": 8, "bf16": 2}
# The ONNX Runtime impls: perf/ort_attention.mjs --variant of each. Forward and float32 only.
ORT = {"ort": "flash", "ort-unfused": "unfused"}
ORT_PASSES, ORT_TYPES = ("fwd",), ("float",)
ORT_PACKAGE = "onnxruntime-node@1.30.0"
ORT_DEFAULT_PREFIX = os.path.join("~", ".cache", "kfa-peers", "onnxruntime")
# The quick run's cases, and the full run's, where --types, --d or --n are not given.
QUICK = {"types": "float", "d": "64", "n": "512,1024,2048,4096"}
FULL = {"types": "float,double", "d": "64,128", "n": "512,1024,2048,4096,8192,16384"}


def csv(text, conv=str):
    return [conv(x) for x in text.split(",") if x]


def source_revision():
    """git describe of the source tree now: the benchmark binary records its revision only at
    configure time, so a rebuild without reconfiguring would otherwise go unnoticed."""
    try:
        return subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="attention")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--passes", default="fwd,bwd,fwd_bwd")
    ap.add_argument("--types", help=f"default {FULL['types']} ({QUICK['types']} with --quick)")
    ap.add_argument("--n", help=f"default {FULL['n']} ({QUICK['n']} with --quick)")
    ap.add_argument("--d", help=f"default {FULL['d']} ({QUICK['d']} with --quick)")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--min-time", type=float, default=None,
                    help="Google Benchmark's --benchmark_min_time, and the PyTorch and ONNX "
                         "Runtime minimum (s)")
    ap.add_argument("--bench-args", default="",
                    help="more Google Benchmark flags, e.g. '--benchmark_repetitions=3'")
    ap.add_argument("--budget-gib", type=float, default=12.0)
    ap.add_argument("--ort-prefix", default=os.environ.get("ORT_PREFIX") or ORT_DEFAULT_PREFIX,
                    help="the npm --prefix onnxruntime-node is installed under (default "
                         "$ORT_PREFIX, else %(default)s)")
    ap.add_argument("--mem-n", default="1024,2048,4096,8192,16384,32768",
                    help="N of the peak-memory runs; empty: none")
    ap.add_argument("--mem-shape", default="1,1,64", help="B,H,D of the peak-memory runs")
    ap.add_argument("--mem-dtype", default="float", choices=SIZE)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="R > 1: kfa and ONNX Runtime interleaved per case, R rounds (above)")
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    for key, value in (QUICK if a.quick else FULL).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    a.ort_prefix = os.path.abspath(os.path.expanduser(a.ort_prefix))
    a.passes, a.types, a.causal = csv(a.passes), csv(a.types), csv(a.causal, int)
    a.n, a.d, a.impls, a.mem_n = csv(a.n, int), csv(a.d, int), csv(a.impls), csv(a.mem_n, int)
    for bad in set(a.passes) - set(PASSES) | set(a.types) - set(SIZE) | set(a.impls) - set(IMPLS):
        ap.error(f"unknown value {bad!r}")
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    return a


def environment(a):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               KFA_BENCH_MEMORY_GIB=str(a.budget_gib))
    pin = ["taskset", "-c", str(a.cpu)] if a.cpu >= 0 and shutil.which("taskset") else []
    if pin:
        pin[0] = shutil.which("taskset")
    return env, pin


def bench_binary(a):
    return os.path.join(a.build, "perf", "bench_attention")


def bench_cases(a, n, d, c):
    """The filter of kfa's and the unfused baseline's benchmarks on these N, D and causal
    lists (the types and passes asked), or None where neither is asked."""
    impls = [i for i in a.impls if i in ("kfa", "unfused")]
    if not impls:
        return None
    return (f"BM_({'|'.join(impls)})_({'|'.join(a.passes)})<({'|'.join(a.types)})>"
            f"/N:({'|'.join(map(str, n))})/D:({'|'.join(map(str, d))})"
            f"/causal:({'|'.join(map(str, c))})/")


def run_bench(a, env, pin, path, cases=None, fixed="BM_fma_peak|BM_sgemm"):
    """bench_attention on `cases` (a filter; default every case asked) with the `fixed` ones."""
    if cases is None:
        cases = bench_cases(a, a.n, a.d, a.causal)
    # The FMA peak and sgemm always: the ceiling and the BLAS rate every table is read against.
    only = f"^({fixed}|{cases})" if cases else f"^({fixed})"
    cmd = pin + [bench_binary(a), f"--benchmark_filter={only}",
                 f"--benchmark_out={path}", "--benchmark_out_format=json"]
    if a.min_time is not None:
        cmd.append(f"--benchmark_min_time={a.min_time}")
    cmd += shlex.split(a.bench_args)
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"],
                          capture_output=True).returncode == 0


def run_torch(a, env, pin, path):
    cmd = pin + [sys.executable, os.path.join(HERE, "torch_attention.py"), "time", "--out", path,
                 "--passes", ",".join(a.passes), "--types", ",".join(a.types),
                 "--n", ",".join(map(str, a.n)), "--d", ",".join(map(str, a.d)),
                 "--causal", ",".join(map(str, a.causal)), "--batch", "1", "--heads", "4",
                 "--budget-gib", str(a.budget_gib)]
    if a.min_time is not None:
        cmd += ["--min-time", str(a.min_time)]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)


def ort_unavailable(a):
    """Why the ONNX Runtime peer cannot run (with the command that installs it), or None."""
    if not shutil.which("node"):
        return "node (Node.js 18 or newer) is not installed"
    if not os.path.exists(ort_package_json(a)):
        return (f"onnxruntime-node is not installed under {a.ort_prefix}; install it with: "
                f"npm install --prefix {shlex.quote(a.ort_prefix)} --ignore-scripts --no-audit "
                f"--no-fund {ORT_PACKAGE}")
    return None


def ort_package_json(a):
    return os.path.join(a.ort_prefix, "node_modules", "onnxruntime-node", "package.json")


def ort_command(a, impl, b, h, n, d, causal):
    """perf/ort_attention.mjs on one case; node by its full path, as posix_spawn needs."""
    return [shutil.which("node"), os.path.join(HERE, "ort_attention.mjs"),
            "--ort-prefix", a.ort_prefix, "--variant", ORT[impl], "--B", str(b), "--H", str(h),
            "--N", str(n), "--D", str(d), "--causal", str(causal)]


def ort_matrix_bytes(impl, b, h, n, causal):
    """The N x N float32 buffers ONNX Runtime holds at once, from its peak RSS (B = 1, H = 4,
    N = 4096): none on the flash path; in the unfused graph two B x H x N x N ones, four when
    causal, and then the N x N mask twice (ConstantOfShape's and Trilu's outputs)."""
    if impl == "ort":
        return 0
    return (4 if causal else 2) * b * h * n * n * 4 + (2 * n * n * 4 if causal else 0)


def ort_cases_of(a, n, d, c):
    """ONNX Runtime's (impl, pass, type, causal, D, N) cases on these N, D and causal lists."""
    return list(itertools.product([i for i in a.impls if i in ORT],
                                  [p for p in a.passes if p in ORT_PASSES],
                                  [t for t in a.types if t in ORT_TYPES], c, d, n))


def run_ort_case(a, env, pin, impl, pass_, t, c, d, n):
    """One case in a node process of its own, as the model is built for its shape; B = 1,
    H = 4 like the other timings. A case whose output fails the script's check against its
    float64 reference (exit status 1) is recorded as failed; any other failure stops the run."""
    min_time = 0.5 if a.min_time is None else a.min_time  # Google Benchmark's default
    r = {"impl": impl, "pass": pass_, "type": t, "B": 1, "H": 4, "N": n, "D": d, "causal": c}
    need = ort_matrix_bytes(impl, 1, 4, n, c)
    if need > a.budget_gib * 2**30:
        r["skipped"] = f"N x N buffers need {need / 2**30:.1f} GiB"
        return r
    cmd = pin + ort_command(a, impl, 1, 4, n, d, c) + [
        "--warmup", "1", "--repeat", "3", "--min-time", str(min_time)]
    print("+", " ".join(shlex.quote(x) for x in cmd), flush=True)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    lines = run.stdout.strip().splitlines()
    if run.returncode not in (0, 1) or not lines:
        sys.exit(f"compare_attention: {cmd[len(pin)]} failed with status {run.returncode}")
    print(lines[-1], flush=True)
    r.update(json.loads(lines[-1]))
    r["flops_per_s"] = r["flops"] / r["mean_s"]  # the mean, as Google Benchmark reports
    if run.returncode == 1:
        r["failed"] = f"max abs error {r['max_abs_err']:.3g}"
        print(f"compare_attention: {IMPLS[impl]} N={n} D={d} causal={c}: output check "
              f"failed ({r['failed']})", file=sys.stderr)
    return r


def run_ort(a, env, pin, path):
    """Every ONNX Runtime case asked, one after the other (run_ort_case)."""
    write_ort(a, path, [run_ort_case(a, env, pin, *case)
                        for case in ort_cases_of(a, a.n, a.d, a.causal)])


def write_ort(a, path, results):
    """ONNX Runtime's results with their context, as Results reads them."""
    with open(ort_package_json(a)) as f:
        version = json.load(f)["version"]
    node = subprocess.run([shutil.which("node"), "--version"], capture_output=True,
                          text=True).stdout.strip()
    context = {"ort_version": version, "node_version": node, "threads": 1,
               "ops": sorted({r["op"] for r in results if "op" in r})}
    with open(path, "w") as f:
        json.dump({"context": context, "results": results}, f, indent=1)


def median_of(entries, rate):
    """The entry of median rate (the lower middle one of an even count)."""
    ranked = sorted(entries, key=rate)
    return ranked[(len(ranked) - 1) // 2]


def run_rounds(a, env, pin, bench_path, ort_path, rounds_path, with_ort):
    """--rounds: kfa's (and the unfused baseline's) benchmarks and ONNX Runtime's runs
    interleaved per (D, causal, N) case, a.rounds times (ONNX Runtime first in odd rounds).
    Writes the medians over the rounds as run_bench and run_ort write theirs, and every round's
    rates, by round, to rounds_path."""
    # {"round", "key": [impl, pass, type, N, D, causal], "flops_per_s"}; the FMA probe run
    # with each case as impl "fma", pass "peak" (BM_fma_peak<type> read by the same pattern).
    per_round = []
    benches, orts = {}, {}  # name -> Google Benchmark entries; ORT case -> results
    context = None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sgemm.json")
        run_bench(a, env, pin, path, cases="", fixed="BM_sgemm")
        with open(path) as f:
            data = json.load(f)
        sgemm = data["benchmarks"]
        for r in range(a.rounds):
            for d, c, n in itertools.product(a.d, a.causal, a.n):
                def kfa_side():
                    nonlocal context
                    cases = bench_cases(a, [n], [d], [c])
                    path = os.path.join(tmp, f"r{r}-{d}-{c}-{n}.json")
                    run_bench(a, env, pin, path, cases=cases, fixed="BM_fma_peak")
                    with open(path) as f:
                        data = json.load(f)
                    context = context or data["context"]
                    for b in data["benchmarks"]:
                        benches.setdefault(b["name"], []).append(b)
                        m = re.match(r"BM_(\w+?)_(\w+)<(\w+)>/", b["name"])
                        if m and "FLOP/s" in b:
                            per_round.append({"round": r, "key": [m[1], m[2], m[3], n, d, c],
                                              "flops_per_s": b["FLOP/s"]})

                def ort_side():
                    for case in ort_cases_of(a, [n], [d], [c]):
                        res = run_ort_case(a, env, pin, *case)
                        impl, pass_, t = case[:3]
                        orts.setdefault((impl, pass_, t, n, d, c), []).append(res)
                        if "flops_per_s" in res and "failed" not in res:
                            per_round.append({"round": r, "key": [impl, pass_, t, n, d, c],
                                              "flops_per_s": res["flops_per_s"]})

                sides = [kfa_side] + ([ort_side] if with_ort else [])
                for side in (sides[::-1] if r % 2 else sides):
                    side()
    rate = lambda b: b.get("FLOP/s", 0.0)  # noqa: E731
    with open(bench_path, "w") as f:
        json.dump({"context": context, "rounds": a.rounds,
                   "benchmarks": sgemm + [median_of(v, rate) for v in benches.values()]},
                  f, indent=1)
    if with_ort and orts:  # a case whose output failed its check in any round is reported so
        write_ort(a, ort_path, [next((x for x in v if "failed" in x), None)
                                or median_of(v, lambda x: x.get("flops_per_s", 0.0))
                                for v in orts.values()])
    with open(rounds_path, "w") as f:
        json.dump({"rounds": a.rounds, "runs": per_round}, f, indent=1)


def gnu_time():
    """GNU time's path, when it is installed."""
    path = shutil.which("time") or "/usr/bin/time"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True)
        return path if "GNU" in out.stdout + out.stderr else None
    except OSError:
        return None


def peak_rss(cmd, env):
    """Runs cmd as a child and returns (exit status, peak RSS in bytes, its output).

    Through GNU time where it is installed: its child is forked from a small process, whereas a
    child spawned from this script starts with the script's own peak resident size (about
    15 MiB, the parent's pages until exec), which then floors the figure wait4 reports."""
    timer = gnu_time()
    if timer:
        cmd = [timer, "-f", "peak-rss-kib %M"] + cmd
    with tempfile.TemporaryFile() as log:
        fd = log.fileno()
        pid = os.posix_spawn(cmd[0], cmd, env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, fd, 1),
                                           (os.POSIX_SPAWN_DUP2, fd, 2)])
        _, status, usage = os.wait4(pid, 0)  # this child's own rusage, not all children's
        log.seek(0)
        out = log.read().decode()
    kib = usage.ru_maxrss
    if timer:
        found = re.findall(r"^peak-rss-kib (\d+)$", out, re.M)
        kib = int(found[-1]) if found else kib
        out = re.sub(r"^peak-rss-kib \d+\n?", "", out, flags=re.M)
    return os.waitstatus_to_exitcode(status), kib * 1024, out


def run_memory(a, env, pin, path, peers):
    """peers: the impls other than kfa and the unfused baseline that can run here."""
    b, h, d = csv(a.mem_shape, int)
    size = SIZE[a.mem_dtype]
    if a.mem_dtype not in ORT_TYPES and any(i in ORT for i in peers):
        print(f"compare_attention: ONNX Runtime has no {a.mem_dtype} attention; no ORT memory "
              "figures", file=sys.stderr)
    rows = []
    for n in a.mem_n:
        shape = f"{b},{h},{n},{d}"
        matrix = b * h * n * n * size
        cmds = {
            "kfa": [os.path.join(a.build, "apps", "kfa"), "forward", "--random", shape,
                    "--dtype", a.mem_dtype],
            "unfused": [os.path.join(a.build, "perf", "unfused_attention"), "forward",
                        "--random", shape, "--dtype", a.mem_dtype],
            "torch": [sys.executable, os.path.join(HERE, "torch_attention.py"), "peak",
                      "--shape", shape, "--dtype", a.mem_dtype],
        }
        # One untimed run, one row checked: the peak is the forward's, not the timing loop's.
        for impl in (i for i in ORT if i in peers):
            cmds[impl] = ort_command(a, impl, b, h, n, d, 0) + [
                "--warmup", "0", "--repeat", "1", "--check-rows", "1"]
        need = {"kfa": 0, "unfused": matrix, "torch": 2 * matrix}  # N x N buffers held at once
        need.update({impl: ort_matrix_bytes(impl, b, h, n, 0) for impl in ORT})
        row = {"B": b, "H": h, "N": n, "D": d, "dtype": a.mem_dtype, "matrix_bytes": matrix}
        for impl in a.impls:
            if impl not in ("kfa", "unfused") and impl not in peers:
                continue
            if impl in ORT and a.mem_dtype not in ORT_TYPES:
                continue
            if need[impl] > a.budget_gib * 2**30:
                row[impl] = None
                continue
            cmd = pin + cmds[impl]
            print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
            status, rss, out = peak_rss(cmd, env)
            print(out.strip())
            if status != 0:
                sys.exit(f"compare_attention: {cmds[impl][0]} failed with status {status}")
            row[impl] = rss
        rows.append(row)
    method = "GNU time's %M" if gnu_time() else "wait4's ru_maxrss"
    with open(path, "w") as f:
        json.dump({"method": method, "runs": rows}, f, indent=1)


def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, AttributeError):
        return "unknown"


def compiler(build):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            cache = f.read()
        cxx = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", cache, re.M).group(1)
        kind = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", cache, re.M).group(1)
        version = subprocess.run([cxx, "--version"], capture_output=True,
                                 text=True).stdout.splitlines()[0]
        return f"{version} ({kind or 'no build type'})"
    except (OSError, AttributeError, IndexError):
        return "unknown"


def blas(binary):
    """The BLAS library Kokkos Kernels' gemm reaches from this binary, if any is linked."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    for line in out.splitlines():
        m = re.match(r"\s*(\S*(blas|mkl)\S*) => (\S+)", line)
        if m:
            return f"{m.group(1)} -> {os.path.realpath(m.group(3))}"
    return "none linked (Kokkos Kernels' own gemm)"


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def ratio(x, y):
    return None if x is None or y is None else x / y


class Results:
    """The figures of one comparison, read back from its JSON files (absent files: none)."""

    def __init__(self, bench_path, torch_path, ort_path, mem_path, rounds_path=None):
        self.rows, self.sgemm, self.ctx = \
            tables.load(bench_path) if os.path.exists(bench_path) else ({}, None, {})
        # --rounds: each round's rate by (impl, pass, type, N, D, causal) and round.
        self.rounds, self.by_round = 0, {}
        if rounds_path and os.path.exists(rounds_path):
            with open(rounds_path) as f:
                data = json.load(f)
            self.rounds = data["rounds"]
            for run in data["runs"]:
                self.by_round[tuple(run["key"]) + (run["round"],)] = run["flops_per_s"]
        self.peak = tables.fma_peaks(self.rows)  # FLOP/s by type
        # The peers' cases by (impl, pass, type, N, D, causal).
        self.torch_ctx, torch = self._cases(torch_path, lambda r: "torch")
        self.ort_ctx, ort = self._cases(ort_path, lambda r: r["impl"])
        self.peers = {**torch, **ort}
        self.mem, self.mem_method = [], None
        if mem_path and os.path.exists(mem_path):
            with open(mem_path) as f:
                data = json.load(f)
            self.mem, self.mem_method = data["runs"], data.get("method")

    @staticmethod
    def _cases(path, impl):
        if not path or not os.path.exists(path):
            return {}, {}
        with open(path) as f:
            data = json.load(f)
        return data["context"], {(impl(r), r["pass"], r["type"], r["N"], r["D"], r["causal"]): r
                                 for r in data["results"]}

    def bench(self, impl, pass_, t, n, d, c):
        """The Google Benchmark entry of kfa or the unfused baseline."""
        key = (f"BM_{impl}_{pass_}<{t}>", tuple(sorted({"N": n, "D": d, "causal": c}.items())))
        return self.rows.get(key)

    def case(self, impl, pass_, t, n, d, c):
        """(GFLOP/s, None), or (None, why there is no figure: `skipped` (the N x N buffers
        would pass the budget), `n/a` (ONNX Runtime has no such pass or type), `failed` (the
        output failed its check)), or (None, None) where the case was not run."""
        if impl in ("kfa", "unfused"):
            b = self.bench(impl, pass_, t, n, d, c)
            if b is None:
                return None, None
            return (None, "skipped") if b.get("error_occurred") else (b["FLOP/s"] / 1e9, None)
        if impl in ORT and (pass_ not in ORT_PASSES or t not in ORT_TYPES):
            return None, "n/a"
        r = self.peers.get((impl, pass_, t, n, d, c))
        if r is None:
            return None, None
        if "skipped" in r:
            return None, "skipped"
        if "failed" in r:
            return None, "failed"
        return r["flops_per_s"] / 1e9, None

    def gflops(self, impl, pass_, t, n, d, c):
        return self.case(impl, pass_, t, n, d, c)[0]

    def paired(self, x, y):
        """--rounds: the median, lowest and highest over the rounds of x's rate over y's in
        the same round, for x and y keys (impl, pass, type, N, D, causal); None where a round
        lacks either."""
        rs = []
        for r in range(self.rounds):
            u, v = self.by_round.get(x + (r,)), self.by_round.get(y + (r,))
            if u is None or v is None:
                return None
            rs.append(u / v)
        if not rs:
            return None
        return statistics.median(rs), min(rs), max(rs)


def report(a, res, md_path, command, ort_why, plotted):
    ort_impls = [i for i in a.impls if i in ORT]
    peak = ", ".join(f"{t} {r / 1e9:.1f} GFLOP/s" for t, r in res.peak.items())
    if not ort_impls:
        ort_line = "not asked (--impls)"
    elif res.ort_ctx:
        c = res.ort_ctx
        ort_line = (f"onnxruntime-node {c['ort_version']} (Node.js {c['node_version']}), CPU "
                    f"execution provider, {c['threads']} thread; ops: {', '.join(c['ops'])}")
    else:
        ort_line = f"not measured ({ort_why or 'no float forward case asked'})"
    lines = [f"# kfa against the unfused baseline, PyTorch and ONNX Runtime, one core ({a.date})",
             ""]
    space = res.ctx.get("kokkos_execution_space", "?")
    lines += [
        f"- Machine: {machine()}, one core"
        + (f" (taskset -c {a.cpu})" if a.cpu >= 0 else ""),
        f"- kfa revision {res.ctx.get('kfa_git_revision', '?')} (the benchmark's, fixed when it "
        f"was configured; source tree at report time: {source_revision()}); Kokkos "
        f"{res.ctx.get('kokkos_version', '?')}, execution space {space}; compiler "
        f"{compiler(a.build)}",
        "- FMA peak of the core in the same run (BM_fma_peak, perf/fma_peak.hpp): "
        + (peak or "not measured (a benchmark binary without BM_fma_peak)"),
        f"- BLAS behind Kokkos Kernels' gemm: {blas(bench_binary(a))}"
        + (f"; sgemm 2048^3 in the same run: {res.sgemm / 1e9:.1f} GFLOP/s" if res.sgemm else ""),
        "- PyTorch: " + (f"{res.torch_ctx.get('torch_version')}, "
                         f"{res.torch_ctx.get('threads')} thread" if res.torch_ctx
                         else "not measured (import torch failed or not asked)"),
        f"- ONNX Runtime: {ort_line}",
        f"- Command: `{command}`",
        "",
    ]
    if res.rounds:
        lines += [
            f"Interleaved in {res.rounds} rounds (--rounds): in each round every (D, causal, N) "
            "case ran bench_attention on that case alone, with the FMA probe, and ONNX Runtime "
            "right after it (before it in odd rounds), so each ratio's two sides are seconds "
            "apart. Every GFLOP/s below is the median over the rounds, the peak the probe's "
            "median; `kfa/ORT flash` is the median of the rounds' own ratios, followed by their "
            "lowest and highest; every round's figures: "
            f"`{os.path.splitext(os.path.basename(md_path))[0]}-rounds.json`.",
            ""]
    lines += [
        "Shapes: B = 1, H = 4 (N = seqlen of queries and keys, D = head_dim). FLOPs in "
        "flash-attn's convention (docs/performance.md: visible pairs only; backward 2.5 x and "
        "forward + backward 3.5 x the forward), the same count for all, so GFLOP/s ratios are "
        "speed ratios. Each GFLOP/s is followed by its fraction of the FMA peak of its type "
        "measured in the same run, the figure kfa is judged by. The unfused baseline "
        "(perf/unfused.hpp) is Kokkos Kernels gemm, a Kokkos softmax, gemm, with P kept for the "
        "backward; PyTorch's is softmax(Q K^T * scale [masked]) V through autograd "
        "(perf/torch_attention.py). ONNX Runtime (perf/ort_attention.mjs, through "
        "onnxruntime-node): `ORT flash` is its fused flash-attention kernel, com.microsoft "
        "MultiHeadAttention (GroupQueryAttention with kv_num_heads = num_heads when causal); "
        "`ORT unfused` is the graph MatMul, Softmax, MatMul; both forward only (ONNX Runtime has "
        "no backward) and float only (its attention kernels take float32), `n/a` elsewhere; "
        "their times are the mean of session.run calls, onnxruntime-node's call overhead "
        "included. The unfused baseline, PyTorch and ORT unfused compute every score under the "
        "causal mask. Backward: the backward alone after an untimed forward. kfa/sgemm: kfa's "
        "GFLOP/s over the sgemm rate (float only). `skipped`: the N x N buffers would pass "
        f"{a.budget_gib:g} GiB.",
        "",
    ]

    def cell(impl, pass_, t, n, d, c):
        g, why = res.case(impl, pass_, t, n, d, c)
        if g is None:
            return why or "-"
        p = res.peak.get(t)
        return f"{g:.1f} ({g * 1e9 / p:.2f})" if p else f"{g:.1f}"

    def measured(impl, pass_, t, n, d, c):
        """Whether the case was run, or skipped for its size."""
        g, why = res.case(impl, pass_, t, n, d, c)
        return g is not None or why in ("skipped", "failed")

    has_kfa = "kfa" in a.impls
    for pass_ in a.passes:
        impls = [i for i in a.impls if i not in ORT or pass_ in ORT_PASSES]
        # kfa's speed-up over each peer; ORT's over its flash path, the peer to beat on a CPU.
        peers = [i for i in impls if i != "kfa" and i != "ort-unfused"] if has_kfa else []
        head = ["type", "D", "causal", "N"] + (["kfa ms"] if has_kfa else []) + \
            [f"{IMPLS[i]} GFLOP/s (of peak)" for i in impls] + \
            [f"kfa/{IMPLS[i]}" for i in peers] + (["kfa/sgemm"] if has_kfa else [])
        align = [":---", "---:", ":---:", "---:"] + ["---:"] * (len(head) - 4)
        lines += [f"## {PASSES[pass_]}", "", "| " + " | ".join(head) + " |",
                  "|" + "|".join(align) + "|"]
        for t in a.types:
            for d in a.d:
                for c in a.causal:
                    for n in a.n:
                        if not any(measured(i, pass_, t, n, d, c) for i in impls):
                            continue
                        kg = res.gflops("kfa", pass_, t, n, d, c)
                        k = res.bench("kfa", pass_, t, n, d, c)
                        row = [t, str(d), "yes" if c else "no", str(n)]
                        if has_kfa:
                            row.append(fmt(tables.ms(k) if kg else None))
                        row += [cell(i, pass_, t, n, d, c) for i in impls]
                        for i in peers:
                            pr = res.paired(("kfa", pass_, t, n, d, c), (i, pass_, t, n, d, c))
                            row.append(f"{pr[0]:.2f} ({pr[1]:.2f}-{pr[2]:.2f})" if pr else
                                       fmt(ratio(kg, res.gflops(i, pass_, t, n, d, c)), ".2f"))
                        if has_kfa:
                            frac = ratio(kg, res.sgemm / 1e9) if res.sgemm and t == "float" \
                                else None
                            row.append(fmt(frac, ".2f"))
                        lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if has_kfa and "bf16" in a.types and "float" in a.types:
        lines += bf16_table(a, res)
    if res.mem:
        r0 = res.mem[0]
        impls = [i for i in a.impls if any(i in r for r in res.mem)]
        over = [i for i in impls if i != "kfa"] if "kfa" in impls else []
        lines += [f"## Peak memory of one forward (B = {r0['B']}, H = {r0['H']}, D = {r0['D']}, "
                  f"{r0['dtype']}, not causal)", "",
                  f"Peak resident set of each process ({res.mem_method}), so it includes each "
                  "program's fixed cost (libraries, and PyTorch's interpreter, ONNX Runtime's "
                  "Node.js); the N x N column is one B x H x N x N matrix of the type.", "",
                  "| N | N x N matrix MiB | " + " | ".join(f"{IMPLS[i]} MiB" for i in impls)
                  + "".join(f" | {IMPLS[i]}/kfa" for i in over) + " |",
                  "|" + "|".join(["---:"] * (2 + len(impls) + len(over))) + "|"]
        mib = 2.0**20
        for r in res.mem:
            def mem_cell(impl):
                if impl not in r:
                    return "-", None
                if r[impl] is None:
                    return "skipped", None
                return f"{r[impl] / mib:.0f}", r[impl] / mib
            cells = {i: mem_cell(i) for i in impls}
            lines.append(f"| {r['N']} | {r['matrix_bytes'] / mib:.0f} | "
                         + " | ".join(cells[i][0] for i in impls)
                         + "".join(f" | {fmt(ratio(cells[i][1], cells['kfa'][1]), '.1f')}"
                                   for i in over) + " |")
        lines.append("")
    base = os.path.splitext(os.path.basename(md_path))[0]
    memory_plot = f", `{base}-memory.png` (peak memory against N)" if res.mem else ""
    if plotted:
        lines += [f"Plots: `{base}.png` (GFLOP/s against N){memory_plot}.", ""]
    else:
        lines += ["No plots: matplotlib was not importable.", ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))


def bf16_table(a, res):
    """kfa's bf16 GFLOP/s over its float GFLOP/s per case: paired per round under --rounds."""
    lines = ["## kfa: bf16 over float", "",
             "kfa's bf16 GFLOP/s over its float GFLOP/s on the same case"
             + (" (the median of the rounds' own ratios, and their range)"
                if res.rounds else "") + ".", "",
             "| pass | D | causal | N | bf16/float |", "|:---|---:|:---:|---:|---:|"]
    for pass_ in a.passes:
        for d, c, n in itertools.product(a.d, a.causal, a.n):
            pr = res.paired(("kfa", pass_, "bf16", n, d, c), ("kfa", pass_, "float", n, d, c))
            q = ratio(res.gflops("kfa", pass_, "bf16", n, d, c),
                      res.gflops("kfa", pass_, "float", n, d, c))
            if pr is None and q is None:
                continue
            cell = f"{pr[0]:.2f} ({pr[1]:.2f}-{pr[2]:.2f})" if pr else fmt(q, ".2f")
            lines.append(f"| {PASSES[pass_]} | {d} | {'yes' if c else 'no'} | {n} | {cell} |")
    return lines + [""]


COLORS = {"kfa": "C0", "unfused": "C1", "torch": "C2", "ort": "C3", "ort-unfused": "C4"}


def plot(a, res, png, mem_png):
    try:
        import matplotlib
    except ImportError:
        print("compare_attention: matplotlib is not importable; no plots", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(p, t, d) for p in a.passes for t in a.types for d in a.d]
    cols = len(a.types) * len(a.d)
    fig, axes = plt.subplots(len(a.passes), cols, figsize=(4.6 * cols, 3.6 * len(a.passes)),
                             squeeze=False)
    for ax, (pass_, t, d) in zip(axes.flat, panels):
        for impl in a.impls:
            for c in a.causal:
                pts = [(n, res.gflops(impl, pass_, t, n, d, c)) for n in a.n]
                pts = [(n, g) for n, g in pts if g is not None]
                if pts:
                    ax.plot(*zip(*pts), "--" if c else "-", marker="o", color=COLORS[impl],
                            label=f"{IMPLS[impl]}{' causal' if c else ''}")
        if t in res.peak:
            ax.axhline(res.peak[t] / 1e9, color="black", linestyle="-.", label="FMA peak")
        if res.sgemm and t == "float":
            ax.axhline(res.sgemm / 1e9, color="gray", linestyle=":", label="sgemm")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{PASSES[pass_]}, {t}, D={d}", fontsize=9)
        ax.set_xlabel("N (B=1, H=4)")
        ax.set_ylabel("GFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    if not res.mem:
        return True
    fig, ax = plt.subplots(figsize=(6, 4.2))
    mem = res.mem
    ns = [r["N"] for r in mem]
    ax.plot(ns, [r["matrix_bytes"] / 2**20 for r in mem], ":", color="gray",
            label="one B x H x N x N matrix")
    for impl in a.impls:
        pts = [(r["N"], r[impl] / 2**20) for r in mem if r.get(impl)]
        if pts:
            ax.plot(*zip(*pts), marker="o", color=COLORS[impl], label=IMPLS[impl])
    r0 = mem[0]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"N (B={r0['B']}, H={r0['H']}, D={r0['D']}, {r0['dtype']}, forward)")
    ax.set_ylabel("peak resident memory (MiB)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(mem_png, dpi=110)
    plt.close(fig)
    return True


def main():
    if "--gpu" in sys.argv[1:]:
        import compare_gpu
        rest = [x for x in sys.argv[1:] if x != "--gpu"]
        compare_gpu.main(rest, " ".join(shlex.quote(x) for x in ["python3"] + sys.argv))
        return
    a = parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, f"{a.date}-{a.name}")
    bench_path, torch_path = stem + ".json", stem + "-torch.json"
    ort_path, mem_path = stem + "-ort.json", stem + "-memory.json"
    rounds_path = stem + "-rounds.json"
    env, pin = environment(a)
    command = " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv)

    if a.rounds == 1 and not (a.reuse and os.path.exists(bench_path)):
        run_bench(a, env, pin, bench_path)
    with_torch = "torch" in a.impls and torch_available()
    if "torch" in a.impls and not with_torch:
        print("compare_attention: `import torch` failed; no PyTorch figures", file=sys.stderr)
    if with_torch and not (a.reuse and os.path.exists(torch_path)):
        run_torch(a, env, pin, torch_path)
    ort_why = ort_unavailable(a) if any(i in ORT for i in a.impls) else None
    with_ort = any(i in ORT for i in a.impls) and ort_why is None
    if ort_why:
        print(f"compare_attention: {ort_why}; no ONNX Runtime figures", file=sys.stderr)
    ort_cases = any(p in ORT_PASSES for p in a.passes) and any(t in ORT_TYPES for t in a.types)
    if with_ort and not ort_cases:
        print("compare_attention: ONNX Runtime runs the float forward only; no such cases asked",
              file=sys.stderr)
    if a.rounds > 1 and not (a.reuse and os.path.exists(rounds_path)):
        run_rounds(a, env, pin, bench_path, ort_path, rounds_path, with_ort and ort_cases)
    elif a.rounds == 1 and with_ort and ort_cases and not (a.reuse and os.path.exists(ort_path)):
        run_ort(a, env, pin, ort_path)
    peers = [i for i in a.impls if (i == "torch" and with_torch) or (i in ORT and with_ort)]
    if a.mem_n and not (a.reuse and os.path.exists(mem_path)):
        run_memory(a, env, pin, mem_path, peers)

    # A reused ORT file is read even where onnxruntime-node is no longer installed.
    res = Results(bench_path, torch_path if with_torch else None,
                  ort_path if (with_ort and ort_cases) or a.reuse else None,
                  mem_path if a.mem_n else None, rounds_path if a.rounds > 1 else None)
    plotted = plot(a, res, stem + ".png", stem + "-memory.png")
    report(a, res, stem + ".md", command, ort_why, plotted)
    print(f"wrote {stem}.md" + (f", {stem}.png" if plotted else "")
          + (f", {stem}-memory.png" if plotted and a.mem_n else ""))


if __name__ == "__main__":
    main()
