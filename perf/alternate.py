#!/usr/bin/env python3
"""Two or more builds of a Google Benchmark binary, alternated one benchmark at a time.

    perf/alternate.py --rounds 5 --min-time 0.2 --cpu 1 --out runs.json \\
        --bench 'BM_kfa_fwd<float>/N:1024/D:128/causal:1' --bench '...' \\
        before=build-a/perf/bench_attention after=build-b/perf/bench_attention

On a shared virtual machine a core's speed drifts by 10-25 % within minutes, so whole-suite
runs of one binary after the other compare different machines. Here each round runs every
benchmark once per binary, back to back (the binaries' order rotated each round), so that the
two sides of a ratio are seconds apart. Prints per benchmark the median GFLOP/s of each
binary, the medians' ratios to the first binary and the last binary's ratio in each round
(their spread is the noise), and writes {benchmark: {name: [GFLOP/s per round]}} as JSON.
The benchmarks must report a FLOP/s counter (perf/common.hpp).
"""
import argparse
import json
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="+", help="NAME=PATH, the first is the reference")
    ap.add_argument("--bench", action="append", required=True,
                    help="a benchmark's name without its /manual_time or /real_time suffix")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", default="0.2", help="--benchmark_min_time of each run")
    ap.add_argument("--cpu", default="1", help="the core taskset pins the runs to ('' for none)")
    ap.add_argument("--out", help="JSON file of every round's GFLOP/s")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.binaries]
    if any(len(b) != 2 for b in bins):
        sys.exit("alternate.py: binaries are NAME=PATH")
    names = [n for n, _ in bins]
    res = {b: {n: [] for n in names} for b in a.bench}
    for r in range(a.rounds):
        order = bins[r % len(bins):] + bins[:r % len(bins)]
        for b in a.bench:
            for name, exe in order:
                cmd = (["taskset", "-c", a.cpu] if a.cpu else []) + [
                    exe, f"--benchmark_filter=^{b}(/manual_time|/real_time)?$",
                    f"--benchmark_min_time={a.min_time}", "--benchmark_format=json"]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                runs = [x for x in json.loads(out)["benchmarks"] if "FLOP/s" in x]
                if len(runs) != 1:
                    sys.exit(f"alternate.py: {name} ran {len(runs)} benchmarks for {b}")
                res[b][name].append(runs[0]["FLOP/s"] / 1e9)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    head = "".join(f"{n:>10}" for n in names) + "".join(f"{'/' + names[0]:>9}" for n in names[1:])
    print(f"{'benchmark (median GFLOP/s)':<44}{head}  {names[-1]}/{names[0]} per round")
    for b, v in res.items():
        med = {n: statistics.median(v[n]) for n in names}
        row = "".join(f"{med[n]:10.1f}" for n in names)
        row += "".join(f"{med[n] / med[names[0]]:9.3f}" for n in names[1:])
        per = " ".join(f"{x / y:.3f}" for x, y in zip(v[names[-1]], v[names[0]]))
        print(f"{b:<44}{row}  {per}")


if __name__ == "__main__":
    main()
