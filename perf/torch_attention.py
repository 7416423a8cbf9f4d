#!/usr/bin/env python3
"""PyTorch's attention for the comparisons of perf/compare_attention.py (docs/performance.md: kfa against
PyTorch on the same machine): on the CPU, the unfused attention on one thread, written as a user
writes it; on a CUDA GPU, torch.nn.functional.scaled_dot_product_attention (perf/compare_gpu.py).

  torch_attention.py time --out FILE.json [--device cpu|cuda] [--passes fwd,bwd,fwd_bwd]
                          [--types float,double,bf16,half] [--n 512,1024] [--d 64,128]
                          [--causal 0,1] [--batch 1 | --tokens T] [--heads 4] [--min-time 0.5]
                          [--repeats 10] [--warmup 3] [--budget-gib 12] [--sgemm-n 8192]
                          [--sdpa-backend NAME[,NAME...]] [--sdpa-backend-float NAME[,...]]
  torch_attention.py info
  torch_attention.py peak --shape B,H,N,D [--causal] [--dtype float|double]

time, --device cpu (default): softmax(scale Q K^T [masked]) V, forward under no_grad, backward
alone (after one forward, through autograd) and forward + backward; each case is run once to
warm up, then until min-time seconds have passed, and the mean time is kept (as Google
Benchmark does). Cases whose N x N tensors would pass the budget are recorded as skipped.

time, --device cuda: the same three passes through SDPA on (B, H, N, D) tensors (is_causal for
the causal cases: top-left aligned, the same mask as kfa's default for N x N). Each case runs
--warmup times, then at least --repeats times and until min-time seconds have passed, each
timed with CUDA events; the median is kept. Backends: --sdpa-backend (default flash) for bf16
and half, --sdpa-backend-float (default efficient,math; flash takes no float32) for float; the
first of the list that accepts the case is used and recorded per case, with a note when the
first one was refused. TF32 is switched off (matmul and cuDNN) so float is float32; note that
the efficient backend's float32 kernel runs on tensor cores in 3xTF32 on sm_80 and newer,
whatever those switches say (PyTorch's mem_eff_attention: OpMultiplyAddFastF32). The context
records the GPU, the versions, and the float32 matmul rate (torch.matmul, n = --sgemm-n, TF32
off): the machine's sgemm rate. --tokens T: batch = max(1, T / N) per case, as in the
FlashAttention papers' benchmarks (16k tokens).

FLOPs in flash-attn's convention, as the kfa benchmarks count them, so the GFLOP/s compare.
info: the GPU and the versions as JSON (no timing). peak: one forward and exit, for the caller
to read this process's peak memory.
"""
import argparse
import json
import statistics
import sys
import time

import torch

# Live B*H*N*N tensors at the peak of each pass: the scores and their softmax in the forward;
# the saved probabilities, their gradient, the softmax gradient and a masked or scaled copy in
# the backward.
MATRICES = {"fwd": 2, "bwd": 4, "fwd_bwd": 4}
DTYPES = {"float": torch.float32, "double": torch.float64, "bf16": torch.bfloat16,
          "half": torch.float16}
# SDPA backends by the names this script records.
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


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


def sdpa_context(name):
    """A context in which SDPA may use only the backend `name`, on PyTorch 2.0 and newer."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # PyTorch 2.3 and newer
        member = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                  "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[name]
        if not hasattr(SDPBackend, member):
            raise RuntimeError(f"this PyTorch has no SDPA backend {member}")
        return sdpa_kernel([getattr(SDPBackend, member)])
    except ImportError:
        pass
    if name == "cudnn":
        raise RuntimeError("the cuDNN SDPA backend needs PyTorch 2.3 or newer")
    return torch.backends.cuda.sdp_kernel(enable_flash=name == "flash",
                                          enable_mem_efficient=name == "efficient",
                                          enable_math=name == "math")


def sdpa(q, k, v, causal, dropout=0.0):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            dropout_p=dropout)


def cuda_inputs(b, h, n, d, dtype, grad):
    g = torch.Generator(device="cuda").manual_seed(n * 131 + d)
    return [(torch.rand(b, h, n, d, generator=g, device="cuda", dtype=torch.float32) * 2 - 1)
            .to(dtype).requires_grad_(grad) for _ in range(4)]


def timed_cuda(call, warmup, repeats, min_time):
    """Median of CUDA-event times: `warmup` untimed calls, then at least `repeats` timed ones
    and at least min_time seconds of them (at most 1000)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    while len(times) < repeats or (sum(times) < min_time and len(times) < 1000):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), len(times), min(times)


def cuda_case(pass_, dtype, b, h, n, d, causal, backends, a):
    """Times one case with the first backend of `backends` that takes it: (result fields)."""
    q, k, v, do = cuda_inputs(b, h, n, d, dtype, pass_ != "fwd")
    drop = a.dropout  # SDPA's dropout_p (0: none)
    out = {}

    if pass_ == "fwd":
        def call():
            with torch.no_grad():
                sdpa(q, k, v, causal, drop)
    elif pass_ == "bwd":
        holder = {}

        def call():
            q.grad = k.grad = v.grad = None
            holder["o"].backward(do, retain_graph=True)
    else:
        def call():
            q.grad = k.grad = v.grad = None
            sdpa(q, k, v, causal, drop).backward(do)

    refused = []
    size = torch.tensor([], dtype=dtype).element_size()
    for name in backends:
        need = MATRICES[pass_] * b * h * n * n * size
        if name == "math" and need > a.budget_gib * 2**30:  # the only one holding N x N
            refused.append(f"math: N x N tensors need {need / 2**30:.1f} GiB > budget")
            continue
        try:
            with sdpa_context(name):
                if pass_ == "bwd":
                    holder["o"] = sdpa(q, k, v, causal, drop)  # the graph the timed backwards reuse
                sec, iters, best = timed_cuda(call, a.warmup, a.repeats, a.min_time)
        except RuntimeError as e:  # no kernel for this case, or out of memory
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            refused.append(f"{name}: {first[:200]}")
            if pass_ == "bwd":
                holder.pop("o", None)
            torch.cuda.empty_cache()
            continue
        out.update(seconds=sec, iterations=iters, min_seconds=best, backend=name,
                   flops_per_s=flops(b, h, n, d, causal, pass_) / sec)
        break
    else:
        out["skipped"] = "no SDPA backend took it: " + "; ".join(refused)
    if refused and "backend" in out:
        out["note"] = "refused first: " + "; ".join(refused)
    return out


def sgemm_rate(n, warmup=3, repeats=10):
    """torch.matmul in float32 (TF32 off) on n x n matrices: seconds (median) and FLOP/s."""
    a = torch.rand(n, n, device="cuda", dtype=torch.float32)
    b = torch.rand(n, n, device="cuda", dtype=torch.float32)
    c = torch.empty(n, n, device="cuda", dtype=torch.float32)
    sec, iters, _ = timed_cuda(lambda: torch.matmul(a, b, out=c), warmup, repeats, 0.5)
    return {"n": n, "seconds": sec, "iterations": iters, "flops_per_s": 2.0 * n**3 / sec}


def float32_strict():
    """TF32 off for matmuls and cuDNN, so float runs are float32 (where the kernel obeys)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")


def cuda_context():
    """The GPU and the software versions."""
    props = torch.cuda.get_device_properties(0)
    ctx = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
           else None,
           "device": "cuda", "device_name": torch.cuda.get_device_name(0),
           "capability": f"{props.major}.{props.minor}",
           "multi_processor_count": props.multi_processor_count,
           "total_memory_bytes": props.total_memory,
           "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
           "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
           "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention")}
    return ctx


def cmd_info(a):
    if not torch.cuda.is_available():
        print(json.dumps({"torch_version": torch.__version__, "device": "cpu",
                          "error": "torch.cuda.is_available() is False"}))
        sys.exit(1)
    float32_strict()
    print(json.dumps(cuda_context()))


def cases(a):
    for pass_ in a.passes.split(","):
        for tname in a.types.split(","):
            for causal in (int(c) for c in a.causal.split(",")):
                for d in (int(x) for x in a.d.split(",")):
                    for n in (int(x) for x in a.n.split(",")):
                        b = max(1, a.tokens // n) if a.tokens else a.batch
                        yield pass_, tname, b, n, d, causal


def cmd_time_cuda(a):
    if not torch.cuda.is_available():
        sys.exit("torch_attention: --device cuda, but torch.cuda.is_available() is False")
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"torch_attention: PyTorch {torch.__version__} has no "
                 "scaled_dot_product_attention (needs 2.0 or newer)")
    float32_strict()
    if a.budget_gib is None:
        a.budget_gib = 0.6 * torch.cuda.get_device_properties(0).total_memory / 2**30
    narrow_backends = [x for x in a.sdpa_backend.split(",") if x]
    float_backends = [x for x in a.sdpa_backend_float.split(",") if x]
    for bad in set(narrow_backends + float_backends) - set(SDPA_BACKENDS):
        sys.exit(f"torch_attention: unknown SDPA backend {bad!r} (one of {SDPA_BACKENDS})")
    ctx = cuda_context()
    ctx["budget_gib"] = a.budget_gib
    ctx["dropout"] = a.dropout
    ctx["sgemm"] = sgemm_rate(a.sgemm_n) if a.sgemm_n > 0 else None
    print(json.dumps({"sgemm": ctx["sgemm"]}), file=sys.stderr)
    results = []
    for pass_, tname, b, n, d, causal in cases(a):
        r = {"pass": pass_, "type": tname, "B": b, "H": a.heads, "N": n, "D": d,
             "causal": causal}
        backends = float_backends if tname in ("float", "double") else narrow_backends
        r.update(cuda_case(pass_, DTYPES[tname], b, a.heads, n, d, bool(causal), backends, a))
        torch.cuda.empty_cache()
        print(json.dumps(r), file=sys.stderr)
        results.append(r)
        with open(a.out, "w") as f:  # after every case, so a run cut short keeps its cases
            json.dump({"context": ctx, "results": results}, f, indent=1)


def cmd_time(a):
    if not 0.0 <= a.dropout < 1.0:
        sys.exit(f"torch_attention: --dropout must lie in [0, 1), got {a.dropout}")
    if a.device == "cuda":
        cmd_time_cuda(a)
        return
    if a.dropout:
        sys.exit("torch_attention: --dropout is for --device cuda (SDPA's dropout_p)")
    if a.budget_gib is None:
        a.budget_gib = 12.0
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
    t.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    t.add_argument("--passes", default="fwd,bwd,fwd_bwd")
    t.add_argument("--types", default="float,double")
    t.add_argument("--n", default="512,1024,2048,4096,8192,16384")
    t.add_argument("--d", default="64,128")
    t.add_argument("--causal", default="0,1")
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--tokens", type=int, default=0,
                   help="cuda: batch = max(1, tokens / N) per case (0: use --batch)")
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--min-time", type=float, default=0.5)
    t.add_argument("--repeats", type=int, default=10, help="cuda: least timed calls per case")
    t.add_argument("--warmup", type=int, default=3, help="cuda: untimed calls per case")
    t.add_argument("--budget-gib", type=float, default=None,
                   help="N x N memory allowed (cpu: 12; cuda: 60%% of the GPU's, math only)")
    t.add_argument("--sgemm-n", type=int, default=8192, help="cuda: n of the sgemm rate (0: none)")
    t.add_argument("--dropout", type=float, default=0.0,
                   help="cuda: SDPA's dropout_p for every case (kfa's bench_gpu --dropout=)")
    t.add_argument("--sdpa-backend", default="flash",
                   help="cuda, bf16 and half: SDPA backends to try in order "
                        f"({', '.join(SDPA_BACKENDS)})")
    t.add_argument("--sdpa-backend-float", default="efficient,math",
                   help="cuda, float: SDPA backends to try in order")
    sub.add_parser("info")
    p = sub.add_parser("peak")
    p.add_argument("--shape", required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="float", choices=DTYPES)
    a = ap.parse_args()
    {"time": cmd_time, "info": cmd_info, "peak": cmd_peak}[a.cmd](a)


if __name__ == "__main__":
    main()
