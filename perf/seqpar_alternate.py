#!/usr/bin/env python3
"""Two or more builds of kfa-seqpar alternated at 1 and 2 ranks: strong-scaling efficiency side
by side.

  perf/seqpar_alternate.py [--rounds R] [--n 8192,16384] [--out RUNS.jsonl] NAME=PATH NAME=PATH...
  perf/seqpar_alternate.py --reuse RUNS.jsonl

For each round, pass (forward, backward), N, mask (none, causal) and mode (ring, tree), every
binary runs the problem at 1 rank and then at 2 (B = 1, H = 1, D = 64, float, zigzag layout,
--repeat 3), so that a binary's two runs and the binaries' runs of a case are seconds apart (this
machine's speed moves 5-25 % within minutes; perf/seqpar_scaling.sh runs one build's cases one
after another). Prints a Markdown table: each binary's median 1-rank and 2-rank time over the
rounds, its efficiency T1 / (2 T2) as the median of the rounds' own ratios (and their range),
the larger of the two ranks' MPI shares at 2 ranks (time inside MPI over the call's time,
SeqPar::timings), and the second binary's 2-rank time over the first's. Needs the machine to
itself: each rank takes a core.
"""
import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict


def run_rounds(binaries, rounds, sizes, out):
    lines = []
    for r in range(1, rounds + 1):
        for pas in ("forward", "backward"):
            for n in sizes:
                for causal in (False, True):
                    for mode in ("ring", "tree"):
                        for name, path in binaries:
                            for p in (1, 2):
                                cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n",
                                       str(p), path, pas, "--random", f"1,1,{n},64", "--mode",
                                       mode, "--layout", "zigzag", "--repeat", "3", "--json"]
                                if causal:
                                    cmd.append("--causal")
                                res = subprocess.run(cmd, capture_output=True, text=True,
                                                     check=True)
                                for line in res.stdout.splitlines():
                                    if line.startswith("{"):
                                        row = json.loads(line)
                                        row.update(bin=name, round=r)
                                        lines.append(row)
                                        out.write(json.dumps(row) + "\n")
                                        out.flush()
        print(f"round {r} done", file=sys.stderr)
    return lines


def table(rows):
    bins = list(dict.fromkeys(r["bin"] for r in rows))
    times = defaultdict(list)  # (bin, case, ranks) -> median_s of each round
    shares = defaultdict(list)
    by_round = defaultdict(dict)
    for r in rows:
        case = (r["command"], r["seqlen_q"], r["causal"], r["mode"])
        times[(r["bin"], case, r["ranks"])].append(r["median_s"])
        shares[(r["bin"], case, r["ranks"])].append(
            max(m / (c + m) if c + m > 0 else 0.0 for c, m in zip(r["compute_s"], r["comm_s"])))
        by_round[(r["bin"], case, r["round"])][r["ranks"]] = r["median_s"]
    eff = defaultdict(list)
    for (b, case, _), t in by_round.items():
        if 1 in t and 2 in t:
            eff[(b, case)].append(t[1] / (2 * t[2]))
    cases = sorted({c for (_, c, _) in times})
    med = statistics.median
    head = "| pass | N | causal | mode |"
    for b in bins:
        head += f" {b} 1 rank s | {b} 2 ranks s | {b} efficiency | {b} MPI share |"
    if len(bins) > 1:
        head += f" {bins[1]}/{bins[0]} 2 ranks |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for c in cases:
        line = f"| {c[0]} | {c[1]} | {'yes' if c[2] else 'no'} | {c[3]} |"
        for b in bins:
            e = eff[(b, c)]
            line += (f" {med(times[(b, c, 1)]):.3f} | {med(times[(b, c, 2)]):.3f} |"
                     f" {100 * med(e):.1f}% ({100 * min(e):.0f}-{100 * max(e):.0f}) |"
                     f" {100 * med(shares[(b, c, 2)]):.1f}% |")
        if len(bins) > 1:
            line += f" {med(times[(bins[1], c, 2)]) / med(times[(bins[0], c, 2)]):.3f} |"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="*", help="NAME=PATH of kfa-seqpar, the first the reference")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", default="8192,16384", help="sequence lengths")
    ap.add_argument("--out", default="seqpar-alternate.jsonl", help="every run, one JSON line")
    ap.add_argument("--reuse", help="tabulate an earlier --out file instead of running")
    a = ap.parse_args()
    if a.reuse:
        with open(a.reuse) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        if not a.binaries:
            ap.error("give NAME=PATH binaries, or --reuse")
        binaries = [tuple(b.split("=", 1)) for b in a.binaries]
        if any(len(b) != 2 for b in binaries):
            ap.error("binaries are NAME=PATH")
        sizes = [int(x) for x in a.n.split(",")]
        with open(a.out, "w") as out:
            rows = run_rounds(binaries, a.rounds, sizes, out)
    table(rows)


if __name__ == "__main__":
    main()
