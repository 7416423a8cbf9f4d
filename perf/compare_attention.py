#!/usr/bin/python3
"""kfa against the unfused baseline and PyTorch on one core: speed and peak memory.

  /usr/bin/python3 perf/compare_attention.py [--build DIR] [--out-dir DIR] [--name NAME]
      [--passes fwd,bwd,fwd_bwd] [--types float,double] [--n 512,...,16384] [--d 64,128]
      [--causal 0,1] [--impls kfa,unfused,torch] [--min-time S] [--bench-args ARGS]
      [--budget-gib 12]
      [--mem-n 1024,...,32768] [--mem-shape B,H,D] [--mem-dtype float] [--cpu C] [--quick]
      [--reuse]

Runs, one thread each (OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1, pinned with taskset to CPU
C, default the last one; --cpu -1 does not pin):
1. build/perf/bench_attention on the chosen cases, kfa and the unfused baseline side by side,
   with BM_sgemm in the same run (Google Benchmark JSON: DATE-NAME.json);
2. when `import torch` works, perf/torch_attention.py on the same cases (DATE-NAME-torch.json);
3. the peak resident memory of one forward of each against N (DATE-NAME-memory.json): the kfa
   program (build/apps/kfa forward --random), build/perf/unfused_attention and PyTorch, each
   its own process, read from wait4's rusage;
and writes DATE-NAME.md (the tables), DATE-NAME.png (GFLOP/s against N) and
DATE-NAME-memory.png (peak memory against N) into --out-dir (default perf/results).

The baseline and PyTorch cases whose N x N buffers would pass --budget-gib are skipped and
marked so. --quick: float, D = 64, N = 512 ... 4096. --reuse: a step whose JSON file is already
in --out-dir is read, not run again (to finish an interrupted run or redo the report).

--gpu: the GPU comparison instead, kfa against PyTorch's scaled_dot_product_attention on one
GPU (perf/compare_gpu.py, whose flags follow: --build DIR of a CUDA build, --dry-run, ...):
  /usr/bin/python3 perf/compare_attention.py --gpu --build DIR [compare_gpu.py flags]
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import tables  # noqa: E402  (the Google Benchmark JSON loader shared with the older tables)

PASSES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}
IMPLS = {"kfa": "kfa", "unfused": "unfused", "torch": "PyTorch"}
SIZE = {"float": 4, "double": 8}


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
    ap.add_argument("--types", default="float,double")
    ap.add_argument("--n", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--impls", default="kfa,unfused,torch")
    ap.add_argument("--min-time", type=float, default=None,
                    help="Google Benchmark's --benchmark_min_time and the PyTorch minimum (s)")
    ap.add_argument("--bench-args", default="",
                    help="more Google Benchmark flags, e.g. '--benchmark_repetitions=3'")
    ap.add_argument("--budget-gib", type=float, default=12.0)
    ap.add_argument("--mem-n", default="1024,2048,4096,8192,16384,32768",
                    help="N of the peak-memory runs; empty: none")
    ap.add_argument("--mem-shape", default="1,1,64", help="B,H,D of the peak-memory runs")
    ap.add_argument("--mem-dtype", default="float", choices=SIZE)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.types, a.d, a.n = "float", "64", "512,1024,2048,4096"
    a.passes, a.types, a.causal = csv(a.passes), csv(a.types), csv(a.causal, int)
    a.n, a.d, a.impls, a.mem_n = csv(a.n, int), csv(a.d, int), csv(a.impls), csv(a.mem_n, int)
    for bad in set(a.passes) - set(PASSES) | set(a.types) - set(SIZE) | set(a.impls) - set(IMPLS):
        ap.error(f"unknown value {bad!r}")
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


def run_bench(a, env, pin, path):
    impls = [i for i in a.impls if i in ("kfa", "unfused")]
    cases = (f"BM_({'|'.join(impls)})_({'|'.join(a.passes)})<({'|'.join(a.types)})>"
             f"/N:({'|'.join(map(str, a.n))})/D:({'|'.join(map(str, a.d))})"
             f"/causal:({'|'.join(map(str, a.causal))})/")
    only = f"^(BM_sgemm|{cases})" if impls else "^BM_sgemm"
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
    15 MiB, shared with it until exec), which then floors the figure wait4 reports."""
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


def run_memory(a, env, pin, path, with_torch):
    b, h, d = csv(a.mem_shape, int)
    size = SIZE[a.mem_dtype]
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
        need = {"kfa": 0, "unfused": matrix, "torch": 2 * matrix}  # N x N buffers held at once
        row = {"B": b, "H": h, "N": n, "D": d, "dtype": a.mem_dtype, "matrix_bytes": matrix}
        for impl in a.impls:
            if impl == "torch" and not with_torch:
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


def gflops(b):
    return None if b is None or b.get("error_occurred") else b["FLOP/s"] / 1e9


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def ratio(x, y):
    return None if x is None or y is None else x / y


def report(a, bench_path, torch_path, mem_path, md_path, command):
    rows, sgemm, ctx = tables.load(bench_path) if os.path.exists(bench_path) else ({}, None, {})
    torch_ctx, torch_rows = {}, {}
    if torch_path and os.path.exists(torch_path):
        with open(torch_path) as f:
            data = json.load(f)
        torch_ctx = data["context"]
        for r in data["results"]:
            torch_rows[(r["pass"], r["type"], r["N"], r["D"], r["causal"])] = r
    mem, method = [], None
    if mem_path and os.path.exists(mem_path):
        with open(mem_path) as f:
            data = json.load(f)
        mem, method = data["runs"], data.get("method")

    def bench(impl, pass_, t, n, d, c):
        key = (f"BM_{impl}_{pass_}<{t}>", tuple(sorted({"N": n, "D": d, "causal": c}.items())))
        return rows.get(key)

    def torch_g(pass_, t, n, d, c):
        r = torch_rows.get((pass_, t, n, d, c))
        return None if r is None or "skipped" in r else r["flops_per_s"] / 1e9

    lines = [f"# kfa against the unfused baseline and PyTorch, one core ({a.date})", ""]
    space = ctx.get("kokkos_execution_space", "?")
    lines += [
        f"- Machine: {machine()}, one core"
        + (f" (taskset -c {a.cpu})" if a.cpu >= 0 else ""),
        f"- kfa revision {ctx.get('kfa_git_revision', '?')} (the benchmark's, fixed when it was "
        f"configured; source tree at report time: {source_revision()}); Kokkos "
        f"{ctx.get('kokkos_version', '?')}, execution space {space}; compiler {compiler(a.build)}",
        f"- BLAS behind Kokkos Kernels' gemm: {blas(bench_binary(a))}"
        + (f"; sgemm 2048^3 in the same run: {sgemm / 1e9:.1f} GFLOP/s" if sgemm else ""),
        "- PyTorch: " + (f"{torch_ctx.get('torch_version')}, {torch_ctx.get('threads')} thread"
                         if torch_ctx else "not measured (import torch failed or not asked)"),
        f"- Command: `{command}`",
        "",
        "Shapes: B = 1, H = 4 (N = seqlen of queries and keys, D = head_dim). FLOPs in "
        "flash-attn's convention (docs/performance.md: visible pairs only; backward 2.5 x and forward + "
        "backward 3.5 x the forward), the same count for all three, so GFLOP/s ratios are speed "
        "ratios. The unfused baseline (perf/unfused.hpp) is Kokkos Kernels gemm, a Kokkos "
        "softmax, gemm, with P kept for the backward; PyTorch's is softmax(Q K^T * scale "
        "[masked]) V through autograd (perf/torch_attention.py). Both compute every score under "
        "the causal mask. Backward: the backward alone after an untimed forward. kfa/sgemm: "
        "kfa's GFLOP/s over the sgemm rate (float only). `skipped`: the N x N buffers would pass "
        f"{a.budget_gib:g} GiB.",
        "",
    ]
    for pass_ in a.passes:
        lines += [f"## {PASSES[pass_]}", "",
                  "| type | D | causal | N | kfa ms | kfa GFLOP/s | unfused GFLOP/s | "
                  "PyTorch GFLOP/s | kfa/unfused | kfa/PyTorch | kfa/sgemm |",
                  "|:---|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for t in a.types:
            for d in a.d:
                for c in a.causal:
                    for n in a.n:
                        k = bench("kfa", pass_, t, n, d, c)
                        u = bench("unfused", pass_, t, n, d, c)
                        if k is None and u is None:
                            continue
                        kg, ug, tg = gflops(k), gflops(u), torch_g(pass_, t, n, d, c)
                        tr = torch_rows.get((pass_, t, n, d, c))
                        ucell = "skipped" if u and u.get("error_occurred") else fmt(ug)
                        tcell = "skipped" if tr and "skipped" in tr else fmt(tg)
                        frac = ratio(kg, sgemm / 1e9) if sgemm and t == "float" else None
                        lines.append(
                            f"| {t} | {d} | {'yes' if c else 'no'} | {n} | "
                            f"{fmt(tables.ms(k) if kg else None)} | {fmt(kg)} | {ucell} | "
                            f"{tcell} | {fmt(ratio(kg, ug), '.2f')} | {fmt(ratio(kg, tg), '.2f')}"
                            f" | {fmt(frac, '.2f')} |")
        lines.append("")
    if mem:
        r0 = mem[0]
        lines += [f"## Peak memory of one forward (B = {r0['B']}, H = {r0['H']}, D = {r0['D']}, "
                  f"{r0['dtype']}, not causal)", "",
                  f"Peak resident set of each process ({method}), so it includes each "
                  "program's fixed cost (libraries, and PyTorch's interpreter); the N x N column "
                  "is one B x H x N x N matrix of the type.", "",
                  "| N | N x N matrix MiB | kfa MiB | unfused MiB | PyTorch MiB | unfused/kfa | "
                  "PyTorch/kfa |", "|---:|---:|---:|---:|---:|---:|---:|"]
        mib = 2.0**20
        for r in mem:
            def cell(impl):
                if impl not in r:
                    return "-", None
                if r[impl] is None:
                    return "skipped", None
                return f"{r[impl] / mib:.0f}", r[impl] / mib
            kc, kv = cell("kfa")
            uc, uv = cell("unfused")
            tc, tv = cell("torch")
            lines.append(f"| {r['N']} | {r['matrix_bytes'] / mib:.0f} | {kc} | {uc} | {tc} | "
                         f"{fmt(ratio(uv, kv), '.1f')} | {fmt(ratio(tv, kv), '.1f')} |")
        lines.append("")
    base = os.path.splitext(os.path.basename(md_path))[0]
    lines += [f"Plots: `{base}.png` (GFLOP/s against N), `{base}-memory.png` "
              "(peak memory against N).", ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    return rows, sgemm, torch_rows, mem, bench, torch_g


def plot(a, data, png, mem_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, sgemm, torch_rows, mem, bench, torch_g = data
    panels = [(p, t, d) for p in a.passes for t in a.types for d in a.d]
    cols = len(a.types) * len(a.d)
    fig, axes = plt.subplots(len(a.passes), cols, figsize=(4.6 * cols, 3.6 * len(a.passes)),
                             squeeze=False)
    colors = {"kfa": "C0", "unfused": "C1", "torch": "C2"}
    for ax, (pass_, t, d) in zip(axes.flat, panels):
        for impl in a.impls:
            for c in a.causal:
                xs, ys = [], []
                for n in a.n:
                    g = torch_g(pass_, t, n, d, c) if impl == "torch" else \
                        gflops(bench(impl, pass_, t, n, d, c))
                    if g is not None:
                        xs.append(n)
                        ys.append(g)
                if xs:
                    ax.plot(xs, ys, "--" if c else "-", marker="o", color=colors[impl],
                            label=f"{IMPLS[impl]}{' causal' if c else ''}")
        if sgemm and t == "float":
            ax.axhline(sgemm / 1e9, color="gray", linestyle=":", label="sgemm")
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
    if not mem:
        return
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ns = [r["N"] for r in mem]
    ax.plot(ns, [r["matrix_bytes"] / 2**20 for r in mem], ":", color="gray",
            label="one B x H x N x N matrix")
    for impl in a.impls:
        pts = [(r["N"], r[impl] / 2**20) for r in mem if r.get(impl)]
        if pts:
            ax.plot(*zip(*pts), marker="o", color=colors[impl], label=IMPLS[impl])
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


def main():
    if "--gpu" in sys.argv[1:]:
        import compare_gpu
        rest = [x for x in sys.argv[1:] if x != "--gpu"]
        compare_gpu.main(rest, " ".join(shlex.quote(x) for x in ["python3"] + sys.argv))
        return
    a = parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, f"{a.date}-{a.name}")
    bench_path, torch_path, mem_path = stem + ".json", stem + "-torch.json", stem + "-memory.json"
    env, pin = environment(a)
    command = " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv)

    if not (a.reuse and os.path.exists(bench_path)):
        run_bench(a, env, pin, bench_path)
    with_torch = "torch" in a.impls and torch_available()
    if "torch" in a.impls and not with_torch:
        print("compare_attention: `import torch` failed; no PyTorch figures", file=sys.stderr)
    if with_torch and not (a.reuse and os.path.exists(torch_path)):
        run_torch(a, env, pin, torch_path)
    if a.mem_n and not (a.reuse and os.path.exists(mem_path)):
        run_memory(a, env, pin, mem_path, with_torch)

    data = report(a, bench_path, torch_path if with_torch else None,
                  mem_path if a.mem_n else None, stem + ".md", command)
    plot(a, data, stem + ".png", stem + "-memory.png")
    print(f"wrote {stem}.md, {stem}.png" + (f", {stem}-memory.png" if a.mem_n else ""))


if __name__ == "__main__":
    main()
