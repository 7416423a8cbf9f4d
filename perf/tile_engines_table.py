#!/usr/bin/env python3
"""Markdown tables from bench_tile_products JSON output (docs/performance.md).

    tile_engines_table.py RUN.json [RUN2.json:SUFFIX ...]

Each cell is the median GFLOP/s over the repetitions and, in parentheses, its fraction of the
FMA peak of the same type measured in the same file (fma_peak/float or fma_peak/double). A
file given as FILE:SUFFIX adds its engines as extra columns named ENGINE-SUFFIX (a second run
of some engines under other settings, with its own peak probe). One table per type and
placement; the last column is the best engine other than kfa's over kfa (TileOps::gemm as its
own function), or, in the bf16 tables (no float gemm), over kfa_amx (TileOps::gemm_bf16x2 on
AMX tiles); types without a peak probe (bf16) show GFLOP/s alone. A Bc column appears where a
table has more than one Bc. Rates are Google Benchmark's, per CPU time; the lines under the
tables give the largest coefficient of variation over the repetitions and the median wall/CPU
time ratio, which is 1.00 when nothing else ran on the core.
"""
import json
import statistics
import sys

ENGINE_ORDER = ["kfa", "kfa_inline", "libxsmm", "dnnl_sgemm", "dnnl_matmul", "openblas",
                "kfa_amx", "kfa_dpbf16", "dnnl_matmul_bf16", "dnnl_matmul_bf16_packed"]
BASE_ENGINES = ["kfa", "kfa_amx"]  # the first one a row has is the ratio's denominator


def load(path, suffix):
    """(rows, peaks, cvs, walls) of one file.

    rows[(type, placement, product, D, Br, Bc)][engine]."""
    with open(path) as f:
        data = json.load(f)
    runs = data["benchmarks"]
    repeated = any(b.get("run_type") == "aggregate" for b in runs)
    rows, peaks, cvs, walls = {}, {}, [], []
    for b in runs:
        parts = b["run_name"].split("/")
        # product/type/Br:x/Bc:y/D:z/placement/engine, or fma_peak/type; the softmax step's
        # cases (softmax/type/Br:x/Bc:y) are no products and not tabled here.
        if parts[0] == "softmax":
            continue
        key = None
        if parts[0] != "fma_peak":
            key = (parts[1], parts[5], parts[0], int(parts[4][2:]), int(parts[2][3:]),
                   int(parts[3][3:]))
        if b.get("error_occurred"):
            if key:
                rows.setdefault(key, {})[parts[6] + suffix] = "error"
            continue
        agg = b.get("aggregate_name")
        if agg == "cv":
            cvs.append((b["FLOP/s"], b["run_name"]))
        if agg != ("median" if repeated else None):
            continue
        walls.append(b["real_time"] / b["cpu_time"])
        gflops = b["FLOP/s"] / 1e9
        if key is None:
            peaks[parts[1]] = gflops
        else:
            rows.setdefault(key, {})[parts[6] + suffix] = gflops
    return rows, peaks, cvs, walls


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows, peaks, engines, cvs, walls = {}, {}, [], [], []
    for arg in argv[1:]:
        path, _, suffix = arg.partition(":")
        suffix = "-" + suffix if suffix else ""
        r, p, c, w = load(path, suffix)
        cvs += c
        walls += w
        for key, cells in r.items():
            for engine, value in cells.items():
                rows.setdefault(key, {})[engine] = (value, p.get(key[0]))
                if engine not in engines:
                    engines.append(engine)
        for t, g in p.items():
            peaks.setdefault(t, []).append(f"{g:.1f}" + (f" ({suffix[1:]} run)" if suffix else ""))
    base = [e for e in ENGINE_ORDER if e in engines]
    engines = base + [e for e in engines if e not in base]

    order = {"scores": 0, "output": 1}
    tables = sorted({k[:2] for k in rows}, key=lambda t: (t[0] != "float", t[1] != "page"))
    for dtype, placement in tables:
        keys = sorted((k for k in rows if k[:2] == (dtype, placement)),
                      key=lambda k: (order.get(k[2], 9), k[3], k[4], k[5]))
        used = [e for e in engines if any(e in rows[k] for k in keys)]
        base_engine = next((e for e in BASE_ENGINES if e in used), "kfa")
        with_bc = len({k[5] for k in keys}) > 1
        peak = ("FMA peak GFLOP/s " + ", ".join(peaks[dtype]) if dtype in peaks else
                "GFLOP/s (no peak probe of this type)")
        print(f"\n**{dtype}, {placement} placement**; {peak}\n")
        print("| product | D | Br | " + ("Bc | " if with_bc else "") + " | ".join(used) +
              f" | best other / {base_engine} |")
        print("|---|---:|---:|" + ("---:|" if with_bc else "") + "---:|" * len(used) + "---|")
        for key in keys:
            cells, best = [], None
            for e in used:
                value, peak = rows[key].get(e, (None, None))
                if value is None:
                    cells.append("")
                elif value == "error":
                    cells.append("error")
                else:
                    cells.append(f"{value:.0f} ({value / peak:.2f})" if peak else f"{value:.0f}")
                    if not e.startswith("kfa") and (best is None or value > best[0]):
                        best = (value, e)
            kfa = rows[key].get(base_engine, (None,))[0]
            ratio = f"{best[1]} {best[0] / kfa:.2f}x" if best and isinstance(kfa, float) else ""
            bc = f"{key[5]} | " if with_bc else ""
            print(f"| {key[2]} | {key[3]} | {key[4]} | {bc}" + " | ".join(cells) + f" | {ratio} |")
    if cvs:
        worst = max(cvs)
        print(f"\nLargest coefficient of variation of FLOP/s over the repetitions: "
              f"{worst[0]:.3f} ({worst[1]}).")
    if walls:
        print(f"Median wall/CPU time ratio: {statistics.median(walls):.2f} "
              f"(max {max(walls):.2f}).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
