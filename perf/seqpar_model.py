#!/usr/bin/env python3
"""Strong scaling of kfa::mpi: the measured table and a latency-bandwidth cost model.

  perf/seqpar_model.py RESULTS.jsonl [--plot OUT.png] [--rate-gpu TFLOPS]
                       [--link NAME:BYTES_PER_S:LATENCY_S ...]

RESULTS.jsonl holds kfa-seqpar --json lines at 1 and 2 ranks (perf/seqpar_scaling.sh). Prints
Markdown: the measured table (time, efficiency T1 / (P T_P), MPI share of the slowest rank),
the model's prediction for the same 2-rank runs next to the measurement, and the model's
efficiency at 8..1024 ranks; --plot draws those predictions (needs matplotlib).

The model, per rank, for a pass of F flops over P ranks at the kernel rate R measured at one
rank (the same pass, mask and N), with messages costing alpha + bytes / beta (w bytes a value,
S = B Hk (N / P) D w the bytes of one K or V shard):
  ring forward:  P steps of F / (P^2 R); the next K/V shard (2 S) travels during a step, so a
                 step takes max(compute, alpha + 2 S / beta); the first step has no message.
  ring backward: as the forward with K, V and the dK/dV accumulators (4 S) a step, plus the
                 last hop of the accumulators home (alpha + 2 S / beta), not hidden.
  tree forward:  F / (P R), then MPI_Allgatherv of all queries and MPI_Reduce_scatter of the
                 partials [lse, O], each (P - 1) alpha + (P - 1) / P * bytes / beta (ring
                 algorithms), nothing hidden.
  tree backward: F / (P R), allgather of [Q, dO, lse, delta] rows, reduce-scatter of dQ.
Causal runs use the zigzag layout, whose work per rank and step is balanced; the model takes it
as exactly balanced. It leaves out the O(N D) local passes (merges, packing).
"""
import argparse
import json
import math
import sys


def load(path):
    runs = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["command"], r["seqlen_q"], r["causal"], r["mode"], r["ranks"])
            runs[key] = r
    return runs


def flops(r):
    """The useful flops kfa counts (docs/performance.md): 4 N^2 D B H for the forward (half when causal),
    2.5 times that for the backward."""
    n, d, b, h = r["seqlen_q"], r["head_dim"], r["batch"], r["heads_q"]
    f = 4.0 * n * n * d * b * h
    if r["causal"]:
        f *= (n + 1) / (2.0 * n)
    return f * (2.5 if r["command"] == "backward" else 1.0)


def allgather(total_bytes, p, alpha, beta):
    return (p - 1) * alpha + (p - 1) / p * total_bytes / beta


def model_time(pass_, mode, p, f, rate, n, b, h, hk, d, w, alpha, beta):
    """Predicted wall time of one pass at p ranks."""
    if p == 1:
        return f / rate
    shard = b * hk * (n / p) * d * w
    if mode == "ring":
        step = f / (p * p * rate)
        per_step = 4 * shard if pass_ == "backward" else 2 * shard
        t = step + (p - 1) * max(step, alpha + per_step / beta)
        if pass_ == "backward":
            t += alpha + 2 * shard / beta
        return t
    t = f / (p * rate)
    rows = b * h * n * w
    if pass_ == "forward":
        return t + allgather(rows * d, p, alpha, beta) + allgather(rows * (d + 1), p, alpha, beta)
    return t + allgather(rows * (2 * d + 2), p, alpha, beta) + allgather(rows * d, p, alpha, beta)


def fit_local_link(runs):
    """This machine's MPI bandwidth, from the tree forward's MPI time at 2 ranks and the
    largest N without a mask (its messages are known; the ring's are hidden): the one figure
    of the model that is fitted rather than measured directly."""
    best = None
    for (pass_, n, causal, mode, p), r in runs.items():
        if pass_ == "forward" and mode == "tree" and p == 2 and not causal:
            if best is None or n > best["seqlen_q"]:
                best = r
    if best is None:
        return 1e-6, 5e9
    n, d, b, h = best["seqlen_q"], best["head_dim"], best["batch"], best["heads_q"]
    w = 4 if best["dtype"] == "float32" else 8
    moved = 0.5 * b * h * n * w * (2 * d + 1)  # (P - 1) / P of the gathered Q and the partials
    comm = min(best["comm_s"])  # the rank that waited least: its time is the messages'
    alpha = 1e-6
    return alpha, moved / max(comm - 2 * alpha, 1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--plot")
    ap.add_argument("--rate-gpu", type=float, default=150.0,
                    help="a GPU-class kernel rate for the second panel row, TFLOP/s")
    ap.add_argument("--link", action="append",
                    help="NAME:BYTES_PER_S:LATENCY_S (default: HDR InfiniBand 25e9:2e-6)")
    args = ap.parse_args()
    links = [tuple(l.split(":")) for l in (args.link or ["HDR-IB-200Gb/s:25e9:2e-6"])]
    links = [(name, float(bw), float(lat)) for name, bw, lat in links]
    runs = load(args.results)
    alpha, beta = fit_local_link(runs)

    print("### Measured: 1 and 2 ranks (one core each)\n")
    print("| pass | N | causal | mode | 1 rank s | 2 ranks s | efficiency | MPI share (slowest rank) "
          "| model 2 ranks s | model / measured |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(runs):
        pass_, n, causal, mode, p = key
        if p != 2 or (pass_, n, causal, mode, 1) not in runs:
            continue
        r1, r2 = runs[(pass_, n, causal, mode, 1)], runs[key]
        t1, t2 = r1["median_s"], r2["median_s"]
        eff = t1 / (2 * t2)
        share = max(c / (c + k) for c, k in zip(r2["comm_s"], r2["compute_s"]))
        f = flops(r1)
        rate = f / t1
        w = 4 if r1["dtype"] == "float32" else 8
        pred = model_time(pass_, mode, 2, f, rate, n, r1["batch"], r1["heads_q"], r1["heads_kv"],
                          r1["head_dim"], w, alpha, beta)
        print(f"| {pass_} | {n} | {'yes' if causal else 'no'} | {mode} | {t1:.3f} | {t2:.3f} | "
              f"{100 * eff:.1f}% | {100 * share:.2f}% | {pred:.3f} | {pred / t2:.3f} |")
    print(f"\nKernel rate R per (pass, mask, N) from the 1-rank runs; link fitted from the tree "
          f"forward: alpha = {alpha:.1e} s, beta = {beta / 1e9:.2f} GB/s.\n")

    # The kernel rates at scale: the ring's 1-rank rate at the largest N measured for the pass.
    rates = {}
    for k, r in sorted(runs.items(), key=lambda kv: kv[0][1]):
        if k[3] == "ring" and k[4] == 1:
            rates[(k[0], k[2])] = flops(r) / r["median_s"]
    bwd_ratio = rates.get(("backward", False), 1.0) / rates.get(("forward", False), 1.0)
    # Predictions at scale: B=1, H=1, D=64, float, no mask; the rate measured here and a GPU one.
    ps = [2 ** i for i in range(3, 11)]
    ns = [32768, 262144, 1048576]
    panels = []
    for rate_name, rate_of in [("this core", lambda pass_: rates.get((pass_, False), 1e10)),
                               (f"GPU-class {args.rate_gpu:g} TFLOP/s",
                                lambda pass_: args.rate_gpu * 1e12 * (bwd_ratio if pass_ == "backward" else 1))]:
        for link_name, bw, lat in links:
            print(f"### Model: efficiency at P ranks, rate {rate_name}, link {link_name} "
                  f"({bw / 1e9:g} GB/s, {lat * 1e6:g} us), B=1 H=1 D=64 float, no mask\n")
            print("| pass | mode | N | " + " | ".join(f"P={p}" for p in ps) + " |")
            print("|---|---|---|" + "---|" * len(ps))
            curves = []
            for pass_ in ("forward", "backward"):
                for mode in ("ring", "tree"):
                    for n in ns:
                        f = 4.0 * n * n * 64 * (2.5 if pass_ == "backward" else 1.0)
                        rate = rate_of(pass_)
                        t1 = f / rate
                        eff = [t1 / (p * model_time(pass_, mode, p, f, rate, n, 1, 1, 1, 64, 4, lat, bw))
                               for p in ps]
                        curves.append((pass_, mode, n, eff))
                        print(f"| {pass_} | {mode} | {n} | " + " | ".join(f"{100 * e:.0f}%" for e in eff) + " |")
            print()
            panels.append((f"{rate_name}, {link_name}", curves))

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(len(panels), 2, figsize=(12, 4.5 * len(panels)), squeeze=False)
        for row, (title, curves) in enumerate(panels):
            for col, pass_ in enumerate(("forward", "backward")):
                ax = axes[row][col]
                for p_, mode, n, eff in curves:
                    if p_ != pass_:
                        continue
                    ax.plot(ps, [100 * e for e in eff], marker="o" if mode == "ring" else "s",
                            linestyle="-" if mode == "ring" else "--", label=f"{mode}, N={n}")
                ax.set_xscale("log", base=2)
                ax.set_ylim(0, 105)
                ax.axhline(90, color="grey", linewidth=0.5)
                ax.set_xlabel("ranks")
                ax.set_ylabel("predicted parallel efficiency (%)")
                ax.set_title(f"{pass_}: {title}", fontsize=9)
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
