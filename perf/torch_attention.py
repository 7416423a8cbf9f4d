#!/usr/bin/env python3
"""PyTorch's unfused attention on one thread, written as a user writes it, for the comparison
made by perf/compare_attention.py (PERF.md: kfa against PyTorch on the same machine).

  torch_attention.py time --out FILE.json [--passes fwd,bwd,fwd_bwd] [--types float,double]
                          [--n 512,1024] [--d 64,128] [--causal 0,1] [--batch 1] [--heads 4]
                          [--min-time 0.5] [--budget-gib 12]
  torch_attention.py peak --shape B,H,N,D [--causal] [--dtype float|double]

time: softmax(scale Q K^T [masked]) V, forward under no_grad, backward alone (after one
forward, through autograd) and forward + backward; each case is run once to warm up, then
until min-time seconds have passed, and the mean time is kept (as Google Benchmark does).
FLOPs in flash-attn's convention, as the kfa benchmarks count them, so the GFLOP/s compare.
Cases whose N x N tensors would pass the budget are recorded as skipped.
peak: one forward and exit, for the caller to read this process's peak memory.
"""
import argparse
import json
import sys
import time

import torch

# Live B*H*N*N tensors at the peak of each pass: the scores and their softmax in the forward;
# the saved probabilities, their gradient, the softmax gradient and a masked or scaled copy in
# the backward.
MATRICES = {"fwd": 2, "bwd": 4, "fwd_bwd": 4}
DTYPES = {"float": torch.float32, "double": torch.float64}


def attention(q, k, v, causal):
    scale = q.shape[-1] ** -0.5
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:  # bottom-right aligned, as kfa's default: key j visible to query i iff j <= i
        nq, nk = s.shape[-2:]
        mask = torch.ones(nq, nk, dtype=torch.bool).triu(nk - nq + 1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def flops(b, h, n, d, causal, pass_):
    pairs = n * (n + 1) / 2 if causal else n * n
    return {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[pass_] * 4.0 * b * h * pairs * d


def inputs(b, h, n, d, dtype, grad):
    g = torch.Generator().manual_seed(n * 131 + d)
    return [(torch.rand(b, h, n, d, generator=g, dtype=dtype) * 2 - 1).requires_grad_(grad)
            for _ in range(4)]


def timed(call, min_time):
    call()  # warm-up
    times = []
    while not times or sum(times) < min_time:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times), len(times)


def time_case(pass_, dtype, b, h, n, d, causal, min_time):
    q, k, v, do = inputs(b, h, n, d, dtype, pass_ != "fwd")
    if pass_ == "fwd":
        def call():
            with torch.no_grad():
                attention(q, k, v, causal)
    elif pass_ == "bwd":
        o = attention(q, k, v, causal)

        def call():
            q.grad = k.grad = v.grad = None
            o.backward(do, retain_graph=True)
    else:
        def call():
            q.grad = k.grad = v.grad = None
            attention(q, k, v, causal).backward(do)
    return timed(call, min_time)


def cmd_time(a):
    torch.set_num_threads(1)
    results = []
    for pass_ in a.passes.split(","):
        for tname in a.types.split(","):
            dtype = DTYPES[tname]
            size = torch.tensor([], dtype=dtype).element_size()
            for causal in (int(c) for c in a.causal.split(",")):
                for d in (int(x) for x in a.d.split(",")):
                    for n in (int(x) for x in a.n.split(",")):
                        r = {"pass": pass_, "type": tname, "B": a.batch, "H": a.heads, "N": n,
                             "D": d, "causal": causal}
                        need = MATRICES[pass_] * a.batch * a.heads * n * n * size
                        if need > a.budget_gib * 2**30:
                            r["skipped"] = f"N x N tensors need {need / 2**30:.1f} GiB"
                        else:
                            sec, iters = time_case(pass_, dtype, a.batch, a.heads, n, d,
                                                   bool(causal), a.min_time)
                            r.update(seconds=sec, iterations=iters,
                                     flops_per_s=flops(a.batch, a.heads, n, d, causal,
                                                       pass_) / sec)
                        print(json.dumps(r), file=sys.stderr)
                        results.append(r)
    out = {"context": {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
                       "parallel_info": torch.__config__.parallel_info()},
           "results": results}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


def cmd_peak(a):
    torch.set_num_threads(1)
    b, h, n, d = (int(x) for x in a.shape.split(","))
    q, k, v, _ = inputs(b, h, n, d, DTYPES[a.dtype], False)
    t0 = time.perf_counter()
    with torch.no_grad():
        attention(q, k, v, a.causal)
    print(f"torch forward B={b} H={h} N={n} D={d}{' causal' if a.causal else ''}: "
          f"{time.perf_counter() - t0:.3f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--out", required=True)
    t.add_argument("--passes", default="fwd,bwd,fwd_bwd")
    t.add_argument("--types", default="float,double")
    t.add_argument("--n", default="512,1024,2048,4096,8192,16384")
    t.add_argument("--d", default="64,128")
    t.add_argument("--causal", default="0,1")
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--min-time", type=float, default=0.5)
    t.add_argument("--budget-gib", type=float, default=12)
    p = sub.add_parser("peak")
    p.add_argument("--shape", required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="float", choices=DTYPES)
    a = ap.parse_args()
    {"time": cmd_time, "peak": cmd_peak}[a.cmd](a)


if __name__ == "__main__":
    main()
