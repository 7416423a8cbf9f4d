#!/usr/bin/env python3
"""Markdown tables from Google Benchmark JSON files written by the kfa benchmarks.

  perf/tables.py decode   RESULT.json [RESULT2.json ...] [--plot OUT.png]
  perf/tables.py backward RESULT.json [RESULT2.json ...] [--plot OUT.png]
  perf/tables.py dropout  RESULT.json [RESULT2.json ...]
  perf/tables.py ab       BEFORE.json[,BEFORE2.json ...] AFTER.json[,AFTER2.json ...]

decode: the split-KV decode table (BM_decode); backward: dQ strategies and forward+backward
(BM_backward, BM_forward_backward); dropout: each pass with p = 0.1 against p = 0 (BM_dropout);
ab: two builds of one benchmark run alternately (comma-separated JSON files of each, in the
order they ran), the median time of each case over the runs of each build, their ratio, and
the GFLOP/s as a fraction of the FMA peak of the runs of the same build.
With --benchmark_repetitions the median of the repetitions is used. Each table quotes the times
side by side from one run and the GFLOP/s as a fraction of the core's FMA peak (BM_fma_peak,
perf/fma_peak.hpp) and of the sgemm rate, both measured in the same run (docs/performance.md);
`-` where the run has no such case. --plot draws the same figures (needs matplotlib), one panel
per JSON file.
"""
import json
import re
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    sgemm = None
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        # Repetitions share a name; their median aggregate comes last and wins.
        name = b["run_name"] if "run_name" in b else b["name"]
        name = name.replace("/manual_time", "").replace("/real_time", "")
        if name.startswith("BM_sgemm"):
            sgemm = b["FLOP/s"]
            continue
        fields = dict(re.findall(r"(\w+):(\d+)", name))
        if name.startswith("BM_decode"):
            fields.setdefault("H", "32")  # runs before H became an argument
        rows[(name.split("/")[0], tuple(sorted((k, int(v)) for k, v in fields.items())))] = b
    ctx = data["context"]
    return rows, sgemm, ctx


def fma_peaks(rows):
    """The FMA peak of each type measured in the run, in FLOP/s: {"float": ..., "double": ...},
    empty for runs made before BM_fma_peak existed."""
    return {name[len("BM_fma_peak<"):-1]: b["FLOP/s"] for (name, _), b in rows.items()
            if name.startswith("BM_fma_peak<") and not b.get("error_occurred")}


def of(rate, ceiling):
    """rate as a fraction of ceiling, or `-` without a ceiling."""
    return f"{rate / ceiling:.2f}" if ceiling else "-"


def ms(b):
    scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale


def header(path, rows, sgemm, ctx):
    space = ctx.get("kokkos_execution_space", "?")
    peaks = ", ".join(f"{t} {r / 1e9:.1f}" for t, r in fma_peaks(rows).items())
    rates = [f"FMA peak {peaks} GFLOP/s"] if peaks else []
    if sgemm:
        rates.append(f"sgemm 2048^3 {sgemm / 1e9:.1f} GFLOP/s")
    print(f"\n`{path}`: {space}, Kokkos {ctx.get('kokkos_version', '?')}, "
          f"revision {ctx.get('kfa_git_revision', '?')}"
          + (f"; in the same run: {', '.join(rates)}" if rates else "") + "\n")


def decode(path):
    rows, sgemm, ctx = load(path)
    header(path, rows, sgemm, ctx)
    print("| H | Nq | Nk | unsplit ms | auto ms | 8 splits ms | 32 splits ms | "
          "auto/unsplit | 8/unsplit | 32/unsplit | unsplit K+V GB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for h, nq, nk in [(32, nq, nk) for nq in (1, 16) for nk in (4096, 16384, 65536, 262144)] + \
            [(1, 1, nk) for nk in (65536, 262144)]:
        if True:
            t = {}
            for s in (1, 0, 8, 32):
                key = ("BM_decode", tuple(sorted({"H": h, "Nq": nq, "Nk": nk,
                                                  "splits": s}.items())))
                if key in rows:
                    t[s] = rows[key]
            if 1 not in t:
                continue
            base = ms(t[1])
            cells = [f"{ms(t[s]):.1f}" if s in t else "-" for s in (1, 0, 8, 32)]
            ratios = [f"{ms(t[s]) / base:.2f}" if s in t else "-" for s in (0, 8, 32)]
            bw = t[1]["KV_B/s"] / 1e9  # the JSON holds bytes/s
            print(f"| {h} | {nq} | {nk} | " + " | ".join(cells + ratios) + f" | {bw:.2f} |")


def backward(path):
    rows, sgemm, ctx = load(path)
    header(path, rows, sgemm, ctx)
    peak = fma_peaks(rows).get("float")  # the backward suite is float
    print("| N | D | causal | atomic dQ ms | query pass ms | symmetric ms | query/atomic | "
          "symmetric/atomic | atomic GFLOP/s | of FMA peak | of sgemm | fwd+bwd ms (atomic) | "
          "fwd+bwd GFLOP/s |")
    print("|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for causal in (0, 1):
        for d in (64, 128):
            for n in (1024, 2048, 4096, 8192):
                def get(bench, dq):
                    key = (bench, tuple(sorted({"N": n, "D": d, "causal": causal,
                                                "dq": dq}.items())))
                    return rows.get(key)
                a, qp, sym, fb = get("BM_backward", 0), get("BM_backward", 1), \
                    get("BM_backward", 2), get("BM_forward_backward", 0)
                if not a or not qp:
                    continue
                g = a["FLOP/s"] / 1e9
                fbc = f"{ms(fb):.0f} | {fb['FLOP/s'] / 1e9:.1f}" if fb else "- | -"
                symc = f"{ms(sym):.1f}" if sym else "-"
                symr = f"{ms(sym) / ms(a):.2f}" if sym else "-"
                print(f"| {n} | {d} | {'yes' if causal else 'no'} | {ms(a):.1f} | "
                      f"{ms(qp):.1f} | {symc} | {ms(qp) / ms(a):.2f} | {symr} | {g:.1f} | "
                      f"{of(a['FLOP/s'], peak)} | {of(a['FLOP/s'], sgemm)} | {fbc} |")


def dropout(path):
    rows, sgemm, ctx = load(path)
    header(path, rows, sgemm, ctx)
    peak = fma_peaks(rows).get("float")  # the dropout cases are float
    print("| pass | N | D | p = 0 ms | p = 0.1 ms | ratio | p = 0 GFLOP/s | of FMA peak | "
          "of sgemm |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for bwd in (0, 1):
        for d in (64, 128):
            for n in (2048, 4096):
                def get(pct):
                    return rows.get(("BM_dropout", tuple(sorted(
                        {"N": n, "D": d, "backward": bwd, "percent": pct}.items()))))
                off, on = get(0), get(10)
                if not off or not on:
                    continue
                print(f"| {'backward' if bwd else 'forward'} | {n} | {d} | {ms(off):.0f} | "
                      f"{ms(on):.0f} | {ms(on) / ms(off):.2f} | {off['FLOP/s'] / 1e9:.1f} | "
                      f"{of(off['FLOP/s'], peak)} | {of(off['FLOP/s'], sgemm)} |")


def ab(before, after):
    """Before and after, each a list of JSON files of alternated runs of the same benchmark."""
    def runs(paths):
        times, rates, peaks, ctx = {}, {}, [], None
        for path in paths:
            rows, _, ctx = load(path)
            peak = fma_peaks(rows).get("float")
            if peak:
                peaks.append(peak)
            for (name, fields), b in rows.items():
                if name.startswith("BM_fma_peak") or b.get("error_occurred"):
                    continue
                key = name + "/" + "/".join(f"{k}:{v}" for k, v in fields)
                times.setdefault(key, []).append(ms(b))
                if "FLOP/s" in b:
                    rates.setdefault(key, []).append(b["FLOP/s"])
        return times, rates, peaks, ctx

    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    tb, rb, pb, cb = runs(before)
    ta, ra, pa, ca = runs(after)
    for label, paths, peaks, ctx in (("before", before, pb, cb), ("after", after, pa, ca)):
        print(f"- {label}: {', '.join(f'`{p}`' for p in paths)} (revision "
              f"{ctx.get('kfa_git_revision', '?')}; float FMA peak "
              + (f"{median(peaks) / 1e9:.1f} GFLOP/s, median of {len(peaks)} runs)"
                 if peaks else "not measured)"))
    print()
    print("| benchmark | before ms | after ms | after/before | before GFLOP/s (of peak) | "
          "after GFLOP/s (of peak) |")
    print("|:---|---:|---:|---:|---:|---:|")
    for key in sorted(set(tb) & set(ta)):
        b_ms, a_ms = median(tb[key]), median(ta[key])

        def rate(r, peaks):
            if key not in r:
                return "-"
            g = median(r[key])
            return f"{g / 1e9:.1f} ({of(g, median(peaks) if peaks else None)})"
        print(f"| {key} | {b_ms:.2f} | {a_ms:.2f} | {a_ms / b_ms:.3f} | {rate(rb, pb)} | "
              f"{rate(ra, pa)} |")


def plot(kind, paths, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paths), figsize=(6 * len(paths), 4.2), squeeze=False)
    for ax, path in zip(axes[0], paths):
        rows, sgemm, ctx = load(path)
        title = f"{ctx.get('kokkos_execution_space', '?')} (Kokkos {ctx.get('kokkos_version')})"
        if kind == "decode":
            for nq, style in ((1, "-"), (16, "--")):
                for s, label in ((1, "unsplit"), (0, "auto"), (8, "8 splits"), (32, "32 splits")):
                    xs, ys = [], []
                    for nk in (4096, 16384, 65536, 262144):
                        key = ("BM_decode", tuple(sorted({"H": 32, "Nq": nq, "Nk": nk,
                                                          "splits": s}.items())))
                        if key in rows:
                            xs.append(nk)
                            ys.append(rows[key]["KV_B/s"] / 1e9)
                    ax.plot(xs, ys, style, marker="o", label=f"Nq={nq} {label}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("Nk (B=1, H=32, D=128, float)")
            ax.set_ylabel("K+V read rate (GB/s)")
        else:
            for d in (64, 128):
                for causal in (0, 1):
                    for det, style in ((0, "-"), (1, "--"), (2, ":")):
                        xs, ys = [], []
                        for n in (1024, 2048, 4096, 8192):
                            key = ("BM_backward", tuple(sorted({"N": n, "D": d, "causal": causal,
                                                                "dq": det}.items())))
                            if key in rows:
                                xs.append(n)
                                ys.append(rows[key]["FLOP/s"] / (sgemm or 1e9))
                        ax.plot(xs, ys, style, marker="o",
                                label=f"D={d} {'causal' if causal else 'full'} "
                                      f"{('atomic dQ', 'query pass', 'symmetric')[det]}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (B=1, H=2, float)")
            ax.set_ylabel("backward FLOP/s / sgemm FLOP/s" if sgemm else "GFLOP/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    args = sys.argv[1:]
    out = None
    if "--plot" in args:
        i = args.index("--plot")
        out = args[i + 1]
        del args[i:i + 2]
    if args and args[0] == "ab" and len(args) == 3 and not out:
        ab(args[1].split(","), args[2].split(","))
        sys.exit(0)
    if len(args) < 2 or args[0] not in ("decode", "backward", "dropout") or \
            (out and args[0] == "dropout"):
        sys.exit(__doc__)
    for p in args[1:]:
        {"decode": decode, "backward": backward, "dropout": dropout}[args[0]](p)
    if out:
        plot(args[0], args[1:], out)
