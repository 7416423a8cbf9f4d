#!/usr/bin/env python3
"""kfa against PyTorch's scaled_dot_product_attention on one GPU, in one run, with the targets.

  python3 perf/compare_gpu.py --build DIR [--out-dir DIR] [--date YYYY-MM-DD] [--name NAME]
      [--passes fwd,bwd,fwd_bwd] [--types float,bf16,half] [--n 1024,...,16384] [--d 64,128]
      [--causal 0,1] [--tokens 16384] [--heads 16] [--dropout P] [--min-time 0.2] [--repeats 10]
      [--bench-args ARGS] [--fp32-peak-tflops X] [--sgemm-n 8192] [--reuse]
      [--kfa-json FILE] [--torch-json FILE] [--dry-run [--run-kfa]]
  (the same as python3 perf/compare_attention.py --gpu ...)

Runs, on the GPU the CUDA build of kfa and PyTorch both see (CUDA_VISIBLE_DEVICES):
1. perf/torch_attention.py info: the GPU's name, which names the files: DATE-gpu-SLUG;
2. DIR/perf/bench_gpu (kfa: forward, backward, forward + backward; B = tokens / N, H heads;
   Google Benchmark JSON, DATE-gpu-SLUG-kfa.json);
3. perf/torch_attention.py time --device cuda on the same cases: SDPA with the flash backend
   for bf16 and half, the efficient backend (else math) for float, TF32 off, and the float32
   torch.matmul rate (DATE-gpu-SLUG-torch.json);
and writes DATE-gpu-SLUG.md (the tables and the targets), DATE-gpu-SLUG.json (the same
figures, for scripts) and DATE-gpu-SLUG.png into --out-dir (default perf/results), and prints
PASS or MISS for each target:
- float forward >= 40% of the GPU's FP32 FMA peak (--fp32-peak-tflops, else the built-in
  table of FP32_PEAK_TFLOPS by GPU name, else SMs x FP32 lanes x 2 x max SM clock);
- bf16 and half forward >= 70% of SDPA's flash backend, bf16 forward + backward >= 50%.
A target passes when every measured case of it passes; the worst and the median are printed.
--dropout P runs both sides with dropout p = P (kfa's bench_gpu --dropout=P, seed 1; SDPA's
dropout_p): the same FLOP count, so the ratios compare the passes with their masks drawn.

--reuse: a step whose JSON file is already in --out-dir is read, not run again (to finish a run
that was cut short). --kfa-json / --torch-json: report from those files instead of running that
side. --dry-run: no GPU needed: the GPU and both sides are synthetic (a made-up model of the
figures, labelled as such), and the files go to a temporary folder unless --out-dir is given;
with --run-kfa, kfa's side is DIR/perf/bench_gpu run for real on whatever backend it was built
for (make it small: --tokens 1024 --heads 2 --n 1024 ...). Checks the script, not the speed.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import tables  # noqa: E402  (the Google Benchmark JSON loader)

PASSES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}
TYPES = ("float", "bf16", "half")

# FP32 (non-tensor) FMA peak in TFLOP/s by GPU name (lower case, first match wins, so the more
# specific names come first): SMs x 128 FP32 lanes x 2 x boost clock on Hopper (132 SMs at
# 1.98 GHz on the SXM parts; 114 at 1.755 GHz on the H100 PCIe), 108 SMs x 64 x 2 x 1.41 GHz on
# the A100; NVIDIA's datasheets round them to 67, 51 and 19.5. The H200 NVL's datasheet says 60.
FP32_PEAK_TFLOPS = (
    ("h200 nvl", 60.0),
    ("gh200", 66.9),
    ("h200", 66.9),
    ("h100 pcie", 51.2),
    ("h100 80gb hbm3", 66.9),
    ("h100 sxm", 66.9),
    ("a100", 19.5),
)
# FP32 lanes per SM by compute capability, for the estimate when the name is not in the table.
FP32_LANES = {"7.0": 64, "7.5": 64, "8.0": 64, "8.6": 128, "8.7": 128, "8.9": 128, "9.0": 128}

# The targets: (key, pass, type, what, threshold). what: "peak" is kfa over the FP32 peak,
# "sdpa" is kfa over SDPA with the flash backend.
TARGETS = (
    ("float-forward-peak", "fwd", "float", "peak", 0.40),
    ("bf16-forward-sdpa", "fwd", "bf16", "sdpa", 0.70),
    ("half-forward-sdpa", "fwd", "half", "sdpa", 0.70),
    ("bf16-forward-backward-sdpa", "fwd_bwd", "bf16", "sdpa", 0.50),
)


def csv(text, conv=str):
    return [conv(x) for x in text.split(",") if x]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--out-dir", default=None, help="default perf/results (dry run: a temp dir)")
    ap.add_argument("--name", default=None, help="file stem after the date (default gpu-SLUG)")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--passes", default="fwd,bwd,fwd_bwd")
    ap.add_argument("--types", default="float,bf16,half")
    ap.add_argument("--n", default="1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tokens", type=int, default=16384, help="batch = max(1, tokens / N)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout probability of every case, both sides (default 0)")
    ap.add_argument("--min-time", type=float, default=0.2,
                    help="seconds per case, kfa (Google Benchmark's min time) and SDPA")
    ap.add_argument("--repeats", type=int, default=10, help="least timed SDPA calls per case")
    ap.add_argument("--bench-args", default="",
                    help="more Google Benchmark flags, e.g. '--benchmark_repetitions=3'")
    ap.add_argument("--torch-args", default="", help="more torch_attention.py time flags")
    ap.add_argument("--fp32-peak-tflops", type=float, default=None)
    ap.add_argument("--sgemm-n", type=int, default=8192)
    ap.add_argument("--reuse", action="store_true",
                    help="read a side's JSON from --out-dir when it is there (same --date)")
    ap.add_argument("--kfa-json", default=None)
    ap.add_argument("--torch-json", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--run-kfa", action="store_true", help="dry run: run bench_gpu for real")
    a = ap.parse_args(argv)
    a.passes, a.types, a.causal = csv(a.passes), csv(a.types), csv(a.causal, int)
    a.n, a.d = csv(a.n, int), csv(a.d, int)
    for bad in set(a.passes) - set(PASSES) | set(a.types) - set(TYPES):
        ap.error(f"unknown value {bad!r}")
    if a.run_kfa and not a.dry_run:
        ap.error("--run-kfa goes with --dry-run")
    return a


def slug(name):
    s = re.sub(r"^nvidia\s+", "", name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "unknown"


def fp32_peak(name, ctx, override=None, max_sm_clock_mhz=None):
    """(TFLOP/s, where the figure comes from) of the FP32 FMA peak, or (None, why not)."""
    if override:
        return override, "given (--fp32-peak-tflops)"
    low = name.lower()
    for key, tflops in FP32_PEAK_TFLOPS:
        if key in low:
            return tflops, f"built-in table ({key!r})"
    lanes = FP32_LANES.get(ctx.get("capability", ""))
    sms = ctx.get("multi_processor_count")
    if lanes and sms and max_sm_clock_mhz:
        return (sms * lanes * 2 * max_sm_clock_mhz * 1e6 / 1e12,
                f"estimated: {sms} SMs x {lanes} FP32 lanes x 2 x {max_sm_clock_mhz:g} MHz")
    return None, "unknown GPU: give --fp32-peak-tflops"


def max_sm_clock():
    """The GPU's maximum SM clock in MHz from nvidia-smi, when it is there."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm,driver_version",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout
        clock, driver = [x.strip() for x in out.splitlines()[0].split(",")]
        return float(clock), driver
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None, None


def torch_info():
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_attention.py"), "info"],
                         capture_output=True, text=True)
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.exit("compare_gpu: torch_attention.py info failed:\n" + out.stderr[-2000:])
    if out.returncode != 0:
        sys.exit(f"compare_gpu: no CUDA GPU for PyTorch ({info.get('error')}); "
                 "--dry-run checks this script without one")
    return info


def bench_filter(a):
    return (f"^BM_kfa_({'|'.join(a.passes)})<({'|'.join(a.types)})>/B:[0-9]+/H:{a.heads}"
            f"/N:({'|'.join(map(str, a.n))})/D:({'|'.join(map(str, a.d))})"
            f"/causal:({'|'.join(map(str, a.causal))})/")


def run_kfa(a, path):
    binary = os.path.join(a.build, "perf", "bench_gpu")
    if not os.path.exists(binary):
        sys.exit(f"compare_gpu: {binary} not found (build kfa with KFA_ENABLE_BENCHMARKS, "
                 "which needs Google Benchmark, then `cmake --build DIR --target bench_gpu`)")
    cmd = [binary, f"--tokens={a.tokens}", f"--heads={a.heads}",
           f"--n={','.join(map(str, a.n))}", f"--d={','.join(map(str, a.d))}",
           f"--benchmark_filter={bench_filter(a)}", f"--benchmark_min_time={a.min_time}",
           f"--benchmark_out={path}", "--benchmark_out_format=json"] + shlex.split(a.bench_args)
    if a.dropout:
        cmd.append(f"--dropout={a.dropout}")
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    status = subprocess.run(cmd).returncode
    if status != 0:
        # Google Benchmark writes its JSON as it goes: keep what the cases before the failure
        # measured, and say so in the report.
        print(f"compare_gpu: bench_gpu ended with status {status}; reporting the cases it "
              "finished", file=sys.stderr)
        repair_json(path)
    return status


def repair_json(path):
    """Closes a Google Benchmark JSON file cut short after a complete case (a crash)."""
    try:
        with open(path) as f:
            text = f.read()
        json.loads(text)
        return
    except FileNotFoundError:
        return
    except ValueError:
        pass
    end = text.rfind("}")
    if end < 0 or '"benchmarks"' not in text:
        return
    fixed = text[:end + 1] + "\n  ]\n}\n"
    try:
        json.loads(fixed)
    except ValueError:
        return
    with open(path, "w") as f:
        f.write(fixed)


def run_torch(a, path):
    cmd = [sys.executable, os.path.join(HERE, "torch_attention.py"), "time", "--device", "cuda",
           "--out", path, "--passes", ",".join(a.passes), "--types", ",".join(a.types),
           "--n", ",".join(map(str, a.n)), "--d", ",".join(map(str, a.d)),
           "--causal", ",".join(map(str, a.causal)), "--tokens", str(a.tokens),
           "--heads", str(a.heads), "--min-time", str(a.min_time), "--repeats", str(a.repeats),
           "--sgemm-n", str(a.sgemm_n)] + shlex.split(a.torch_args)
    if a.dropout:
        cmd += ["--dropout", str(a.dropout)]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    status = subprocess.run(cmd).returncode
    if status != 0:  # torch_attention.py rewrites its JSON after every case
        print(f"compare_gpu: torch_attention.py ended with status {status}; reporting the "
              "cases it finished", file=sys.stderr)
    return status


def cases(a):
    for pass_ in a.passes:
        for t in a.types:
            for d in a.d:
                for c in a.causal:
                    for n in a.n:
                        yield pass_, t, max(1, a.tokens // n), n, d, c


def flops(b, h, n, d, causal, pass_):
    pairs = n * (n + 1) / 2 if causal else n * n
    return {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[pass_] * 4.0 * b * h * pairs * d


# A made-up model of the figures for --dry-run, in TFLOP/s: chosen so that the report shows
# targets both met and missed. It says nothing about kfa's speed.
SYNTH_SDPA = {"float": 22.0, "bf16": 420.0, "half": 430.0}
SYNTH_KFA = {"float": 30.0, "bf16": 320.0, "half": 325.0}


def synth_rate(table, pass_, t, n, d, c, backward_scale):
    ramp = n / (n + 1024.0)  # small N fills the GPU less
    rate = table[t] * ramp * (0.9 if c else 1.0) * (1.0 if d == 128 else 0.85)
    return rate * (backward_scale if pass_ != "fwd" else 1.0) * 1e12


def synth_kfa(a, path, gpu):
    rows = []
    for pass_, t, b, n, d, c in cases(a):
        rate = synth_rate(SYNTH_KFA, pass_, t, n, d, c, 0.45)
        sec = flops(b, a.heads, n, d, c, pass_) / rate
        name = f"BM_kfa_{pass_}<{t}>/B:{b}/H:{a.heads}/N:{n}/D:{d}/causal:{c}/manual_time"
        rows.append({"name": name, "run_name": name, "run_type": "iteration", "iterations": 10,
                     "real_time": sec * 1e3, "cpu_time": sec * 1e3, "time_unit": "ms",
                     "FLOP/s": rate})
    ctx = {"date": "synthetic", "kfa_git_revision": "dry-run", "kokkos_version": "dry-run",
           "kokkos_execution_space": "Cuda", "kokkos_configuration": f"dry run on {gpu}",
           "gpu_suite_dropout": str(a.dropout)}
    with open(path, "w") as f:
        json.dump({"context": ctx, "benchmarks": rows}, f, indent=1)


def synth_torch(a, path, ctx):
    results = []
    for pass_, t, b, n, d, c in cases(a):
        rate = synth_rate(SYNTH_SDPA, pass_, t, n, d, c, 0.75)
        r = {"pass": pass_, "type": t, "B": b, "H": a.heads, "N": n, "D": d, "causal": c,
             "seconds": flops(b, a.heads, n, d, c, pass_) / rate, "iterations": a.repeats,
             "flops_per_s": rate, "backend": "efficient" if t == "float" else "flash"}
        if t == "half" and n == 16384 and pass_ == "bwd":  # show how a fallback reads
            r["backend"], r["note"] = "efficient", "refused first: flash: (synthetic refusal)"
        results.append(r)
    ctx = dict(ctx, dropout=a.dropout, sgemm={"n": a.sgemm_n, "seconds": 0.0, "iterations": 10,
                                             "flops_per_s": 51e12})
    with open(path, "w") as f:
        json.dump({"context": ctx, "results": results}, f, indent=1)


def synth_info():
    return {"torch_version": "dry-run", "cuda_version": "dry-run", "cudnn_version": None,
            "device": "cuda", "device_name": "NVIDIA H200 (dry run: synthetic data)",
            "capability": "9.0", "multi_processor_count": 132,
            "total_memory_bytes": 150 * 2**30, "allow_tf32_matmul": False,
            "allow_tf32_cudnn": False, "sdpa": True}


def compiler(build):
    """The C++ compiler of the build and its version (nvcc's release line for nvcc_wrapper)."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            cache = f.read()
        cxx = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", cache, re.M).group(1)
        kind = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", cache, re.M).group(1)
        lines = subprocess.run([cxx, "--version"], capture_output=True,
                               text=True).stdout.splitlines()
        release = [x for x in lines if "release" in x] or lines[:1]
        return f"{os.path.basename(cxx)}: {release[0].strip()} ({kind or 'no build type'})"
    except (OSError, AttributeError, IndexError):
        return "unknown"


def source_revision():
    try:
        return subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def kokkos_device(cfg):
    """The device line of Kokkos' configuration (Kokkos::Cuda[ 0 ] NAME ...), if any."""
    m = re.search(r"Kokkos::Cuda\[ *\d+ *\][^\n]*", cfg or "")
    return m.group(0).strip() if m else None


def ratio(x, y):
    return None if x is None or y is None or y == 0 else x / y


def tf(gflops):
    return None if gflops is None else gflops / 1e3


def pct(x):
    return None if x is None else 100 * x


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def build_rows(a, kfa_path, torch_path, peak_tflops):
    """One dict per case: kfa and SDPA figures side by side, and the ratios."""
    kfa_rows, kfa_sgemm, kfa_ctx = tables.load(kfa_path)
    with open(torch_path) as f:
        tdata = json.load(f)
    tctx = tdata["context"]
    trows = {(r["pass"], r["type"], r["N"], r["D"], r["causal"]): r for r in tdata["results"]}
    sgemm = (tctx.get("sgemm") or {}).get("flops_per_s")
    rows = []
    for pass_, t, b, n, d, c in cases(a):
        key = (f"BM_kfa_{pass_}<{t}>",
               tuple(sorted({"B": b, "H": a.heads, "N": n, "D": d, "causal": c}.items())))
        k = kfa_rows.get(key)
        tr = trows.get((pass_, t, n, d, c))
        if k is None and tr is None:
            continue
        kg = None if k is None or k.get("error_occurred") else k["FLOP/s"] / 1e9
        sg = None if tr is None or "skipped" in tr else tr["flops_per_s"] / 1e9
        row = {"pass": pass_, "type": t, "B": b, "H": a.heads, "N": n, "D": d, "causal": c,
               "kfa_ms": tables.ms(k) if kg is not None else None, "kfa_gflops": kg,
               "sdpa_ms": tr["seconds"] * 1e3 if sg is not None else None, "sdpa_gflops": sg,
               "sdpa_backend": tr.get("backend") if tr else None,
               "sdpa_note": (tr.get("note") or tr.get("skipped")) if tr else "not measured",
               "kfa_over_sdpa": ratio(kg, sg),
               "kfa_over_fp32_peak": ratio(kg, peak_tflops * 1e3) if peak_tflops and
               t == "float" else None,
               "kfa_over_sgemm": ratio(kg, sgemm / 1e9) if sgemm and t == "float" else None}
        rows.append(row)
    return rows, kfa_ctx, tctx, sgemm


def check_targets(rows, peak_tflops):
    """Each target: PASS when every measured case meets it, MISS when one does not, NOT
    MEASURED when no case could be (no float forward, no flash figure, no peak)."""
    out = []
    for key, pass_, t, what, threshold in TARGETS:
        vals = []
        for r in rows:
            if r["pass"] != pass_ or r["type"] != t:
                continue
            if what == "peak":
                v = r["kfa_over_fp32_peak"]
            else:
                v = r["kfa_over_sdpa"] if r["sdpa_backend"] == "flash" else None
            if v is not None:
                vals.append((v, r))
        if what == "peak":
            text = f"{t} {PASSES[pass_]} >= {threshold:.0%} of the FP32 FMA peak"
        else:
            text = f"{t} {PASSES[pass_]} >= {threshold:.0%} of SDPA's flash backend"
        res = {"target": key, "text": text, "threshold": threshold, "cases": len(vals)}
        if not vals:
            why = "no FP32 peak" if what == "peak" and not peak_tflops else \
                "no case measured on both sides" + ("" if what == "peak" else " with flash")
            res.update(verdict="NOT MEASURED", why=why)
        else:
            worst_v, worst = min(vals, key=lambda x: x[0])
            res.update(verdict="PASS" if worst_v >= threshold else "MISS",
                       passing=sum(v >= threshold for v, _ in vals),
                       worst=worst_v, median=statistics.median(v for v, _ in vals),
                       best=max(v for v, _ in vals),
                       worst_case={k: worst[k] for k in ("B", "H", "N", "D", "causal")})
        out.append(res)
    return out


MISSING_WHY = ("bench_gpu registers bf16 and half only where Kokkos makes them 16-bit types "
               "(kfa::backends::is_narrow_float: Kokkos built with CUDA, HIP or SYCL)")


def missing_types(a, rows):
    """The types asked for of which bench_gpu ran no case."""
    return [t for t in a.types if not any(r["type"] == t and r["kfa_gflops"] is not None
                                          for r in rows)]


def target_line(r):
    if r["verdict"] == "NOT MEASURED":
        return f"NOT MEASURED  {r['text']}: {r['why']}"
    w = r["worst_case"]
    return (f"{r['verdict']:<12}  {r['text']}: {r['passing']}/{r['cases']} cases; worst "
            f"{r['worst']:.2f} (N={w['N']}, D={w['D']}, {'causal' if w['causal'] else 'full'}),"
            f" median {r['median']:.2f}, best {r['best']:.2f}")


def dropout_line(a, kfa_ctx, tctx):
    """What each side's JSON says its dropout was, against --dropout (a mismatch is named: a
    side reused or passed in from another run)."""
    kfa_p = float(kfa_ctx.get("gpu_suite_dropout", 0.0))
    torch_p = float(tctx.get("dropout", 0.0))
    line = (f"- Dropout: p = {a.dropout}" + (" on both sides (kfa seed 1, SDPA dropout_p)"
                                              if a.dropout else " (none)"))
    if kfa_p != a.dropout or torch_p != a.dropout:
        line += (f"; **the results say otherwise: kfa ran p = {kfa_p}, SDPA p = {torch_p}: the "
                 "ratios compare different passes**")
    return line


def write_report(a, stem, command, gpu, peak, rows, kfa_ctx, tctx, sgemm, targets, extra):
    peak_tflops, peak_source = peak
    space = kfa_ctx.get("kokkos_execution_space", "?")
    on_host = space not in ("Cuda", "HIP", "SYCL")
    lines = [f"# kfa against PyTorch SDPA on {gpu} ({a.date})", ""]
    if a.dry_run:
        lines += ["**Dry run: synthetic figures, not a measurement.**", ""]
    if on_host:
        lines += [f"**kfa ran on the {space} execution space (a host build), not on the GPU.**",
                  ""]
    for who, key in (("bench_gpu", "kfa_status"), ("torch_attention.py", "torch_status")):
        if extra[key]:
            lines += [f"**{who} ended with status {extra[key]}: its cases after the last one "
                      "in the table were not measured.**", ""]
    kdev = kokkos_device(kfa_ctx.get("kokkos_configuration"))
    lines += [
        f"- GPU: {gpu} (compute capability {tctx.get('capability', '?')}, "
        f"{tctx.get('multi_processor_count', '?')} SMs"
        + (f", driver {extra['driver']}" if extra.get("driver") else "") + ")"
        + (f"; Kokkos sees `{kdev}`" if kdev else ""),
        f"- kfa revision {kfa_ctx.get('kfa_git_revision', '?')} (the benchmark's, fixed when it "
        f"was configured; source tree at report time: {extra['source']}); Kokkos "
        f"{kfa_ctx.get('kokkos_version', '?')}, execution space {space}; compiler "
        f"{extra['compiler']}",
        f"- PyTorch {tctx.get('torch_version', '?')}, CUDA {tctx.get('cuda_version', '?')}, "
        f"cuDNN {tctx.get('cudnn_version', '?')}; TF32 off (matmul "
        f"{tctx.get('allow_tf32_matmul')}, cuDNN {tctx.get('allow_tf32_cudnn')})",
        "- FP32 FMA peak: " + (f"{peak_tflops:.1f} TFLOP/s ({peak_source})" if peak_tflops
                               else peak_source),
        "- float32 torch.matmul (TF32 off): " +
        (f"{sgemm / 1e12:.1f} TFLOP/s at n = {tctx['sgemm']['n']}" if sgemm else "not measured"),
        f"- Command: `{command}`",
        dropout_line(a, kfa_ctx, tctx),
        "",
        f"Shapes: B = {a.tokens} / N (at least 1), H = {a.heads}, N = seqlen of queries and keys, "
        "D = head_dim, as in the FlashAttention papers' benchmarks. FLOPs in flash-attn's "
        "convention for both (docs/performance.md: 4 N^2 D per head forward, half that when causal; "
        "backward 2.5 x, forward + backward 3.5 x), so the ratio kfa/SDPA is a speed ratio. "
        "Backward: the backward alone after an untimed forward. kfa: Google Benchmark, the mean "
        "of the iterations between fences; SDPA: the median of CUDA-event times. Causal: "
        "SDPA's is_causal (top-left), which is kfa's mask for N x N. SDPA backend: the one "
        "timed (flash for bf16 and half; for float, flash takes no float32 and the efficient "
        "backend runs 3xTF32 on tensor cores on sm_80 and newer, so float SDPA is not an FMA "
        "figure). % peak and % sgemm: kfa's float TFLOP/s over the FP32 FMA peak and over the "
        "float32 torch.matmul rate.",
        "",
        "## Targets", "",
        "A target passes when every case measured for it passes.", "",
    ]
    lines += [f"- {target_line(r)}" for r in targets]
    lines.append("")
    for t in missing_types(a, rows):
        lines += [f"kfa has no {t} cases: {MISSING_WHY}", ""]
    for pass_ in a.passes:
        lines += [f"## {PASSES[pass_]}", "",
                  "| type | D | causal | N | B | kfa ms | kfa TFLOP/s | SDPA TFLOP/s | SDPA "
                  "backend | kfa/SDPA | % FP32 peak | % sgemm |",
                  "|:---|---:|:---:|---:|---:|---:|---:|---:|:---|---:|---:|---:|"]
        notes = []
        for r in rows:
            if r["pass"] != pass_:
                continue
            backend = r["sdpa_backend"] or "-"
            if r["sdpa_note"]:
                notes.append(f"{r['type']}, D = {r['D']}, "
                             f"{'causal' if r['causal'] else 'full'}, N = {r['N']}: "
                             f"{r['sdpa_note']}")
                backend += f" [{len(notes)}]"
            lines.append(
                f"| {r['type']} | {r['D']} | {'yes' if r['causal'] else 'no'} | {r['N']} | "
                f"{r['B']} | {fmt(r['kfa_ms'], '.2f')} | {fmt(tf(r['kfa_gflops']))} | "
                f"{fmt(tf(r['sdpa_gflops']))} | {backend} | {fmt(r['kfa_over_sdpa'], '.2f')} | "
                f"{fmt(pct(r['kfa_over_fp32_peak']), '.0f')} | "
                f"{fmt(pct(r['kfa_over_sgemm']), '.0f')} |")
        lines.append("")
        lines += [f"[{i}] {text}" + "  " for i, text in enumerate(notes, 1)]
        if notes:
            lines.append("")
    base = os.path.basename(stem)
    lines += [f"Files: `{os.path.basename(extra['kfa_path'])}` (kfa, Google Benchmark), "
              f"`{os.path.basename(extra['torch_path'])}` (SDPA), `{base}.json` (this table), "
              f"`{base}.png` (TFLOP/s against N).", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))
    summary = {"date": a.date, "gpu": gpu, "command": command, "dry_run": a.dry_run,
               "dropout": a.dropout,
               "fp32_peak_tflops": peak_tflops, "fp32_peak_source": peak_source,
               "sgemm_flops_per_s": sgemm, "kfa_context": {k: v for k, v in kfa_ctx.items()
                                                           if k != "kokkos_configuration"},
               "torch_context": tctx, "compiler": extra["compiler"], "targets": targets,
               "cases": rows}
    with open(stem + ".json", "w") as f:
        json.dump(summary, f, indent=1)


def plot(a, rows, peak_tflops, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare_gpu: no matplotlib; no plot", file=sys.stderr)
        return False
    fig, axes = plt.subplots(len(a.passes), len(a.types),
                             figsize=(4.8 * len(a.types), 3.6 * len(a.passes)), squeeze=False)
    for i, pass_ in enumerate(a.passes):
        for j, t in enumerate(a.types):
            ax = axes[i][j]
            for ci, (d, c) in enumerate((d, c) for d in a.d for c in a.causal):
                sel = [r for r in rows if r["pass"] == pass_ and r["type"] == t and
                       r["D"] == d and r["causal"] == c]
                for field, style, who in (("kfa_gflops", "-", "kfa"), ("sdpa_gflops", "--",
                                                                       "SDPA")):
                    pts = [(r["N"], r[field] / 1e3) for r in sel if r[field] is not None]
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", color=f"C{ci}",
                                label=f"{who} D={d}{' causal' if c else ''}")
            if t == "float" and peak_tflops:
                ax.axhline(peak_tflops, color="gray", linestyle=":", label="FP32 FMA peak")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{PASSES[pass_]}, {t}", fontsize=9)
            ax.set_xlabel(f"N (B = {a.tokens}/N, H = {a.heads})")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main(argv=None, command=None):
    """argv: the flags (default sys.argv[1:]); command: the command line to record."""
    a = parse_args(argv)
    if command is None:
        command = " ".join(shlex.quote(x) for x in ["python3"] + sys.argv)
    if a.dry_run:
        info = synth_info()
        if a.out_dir is None:
            a.out_dir = tempfile.mkdtemp(prefix="kfa-gpu-dry-run-")
    elif a.torch_json:
        with open(a.torch_json) as f:
            info = json.load(f)["context"]
    else:
        info = torch_info()
    if a.out_dir is None:
        a.out_dir = os.path.join(HERE, "results")
    os.makedirs(a.out_dir, exist_ok=True)
    gpu = info.get("device_name", "unknown GPU")
    stem = os.path.join(a.out_dir, f"{a.date}-{a.name or 'gpu-' + slug(gpu)}")
    kfa_path = a.kfa_json or stem + "-kfa.json"
    torch_path = a.torch_json or stem + "-torch.json"

    kfa_status = torch_status = 0
    if not a.kfa_json and not (a.reuse and os.path.exists(kfa_path)):
        if a.dry_run and not a.run_kfa:
            synth_kfa(a, kfa_path, gpu)
        else:
            kfa_status = run_kfa(a, kfa_path)
    if not a.torch_json and not (a.reuse and os.path.exists(torch_path)):
        if a.dry_run:
            synth_torch(a, torch_path, info)
        else:
            torch_status = run_torch(a, torch_path)

    for path, who in ((kfa_path, "kfa"), (torch_path, "SDPA")):
        if not os.path.exists(path):
            sys.exit(f"compare_gpu: no {who} results: {path} was not written")
    clock, driver = (None, None) if a.dry_run else max_sm_clock()
    with open(torch_path) as f:
        tctx = json.load(f)["context"]
    peak = fp32_peak(gpu, tctx, a.fp32_peak_tflops, clock)
    rows, kfa_ctx, tctx, sgemm = build_rows(a, kfa_path, torch_path, peak[0])
    targets = check_targets(rows, peak[0])
    extra = {"driver": driver, "source": source_revision(), "compiler": compiler(a.build),
             "kfa_path": kfa_path, "torch_path": torch_path, "kfa_status": kfa_status,
             "torch_status": torch_status}
    write_report(a, stem, command, gpu, peak, rows, kfa_ctx, tctx, sgemm, targets, extra)
    plotted = plot(a, rows, peak[0], stem + ".png")

    print(f"\n{gpu}: FP32 FMA peak " + (f"{peak[0]:.1f} TFLOP/s ({peak[1]})" if peak[0]
                                      else peak[1]))
    for r in targets:
        print(target_line(r))
    for t in missing_types(a, rows):
        print(f"kfa has no {t} cases: {MISSING_WHY}")
    print(f"wrote {stem}.md, {stem}.json" + (f", {stem}.png" if plotted else ""))
    return targets


if __name__ == "__main__":
    main()
