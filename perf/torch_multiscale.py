#!/usr/bin/python3
"""PyTorch's unfused multi-scale attention, the baseline of bench_multiscale (perf/results/
2026-11-25-multiscale.md): the formula written out,

    t = (Q @ K^T) * M * scale;  d = t.abs().sum(-1, keepdim=True).clamp(min=1);  O = (t / d) @ V

in float32 on one thread (torch.set_num_threads(1)), forward and forward + backward (autograd of
sum(O * dO)), with M = 1 (no mask tensor; causal then multiplies by the 0/1 visibility) or the
decay mask gamma_h^|i-j| of bench_multiscale. Prints one line per case: median ms and GFLOP/s
in kfa's convention (4 * D per visible pair forward, 2.5 times that backward, the causal count
(N^2 + N) / 2 pairs) and the peak memory the case allocated.

Usage: taskset -c 1 torch_multiscale.py [--n 4096] [--heads 4] [--dim 64] [--repeat 5]
"""
import argparse

import torch

from torch_timing import median_times, peak_rss_mib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    B, H, N, D = 1, a.heads, a.n, a.dim
    g = torch.Generator().manual_seed(1)
    q = torch.rand(B, H, N, D, generator=g) * 2 - 1
    k = torch.rand(B, H, N, D, generator=g) * 2 - 1
    v = torch.rand(B, H, N, D, generator=g) * 2 - 1
    dout = torch.rand(B, H, N, D, generator=g) * 2 - 1
    i = torch.arange(N).view(N, 1)
    j = torch.arange(N).view(1, N)
    gam = torch.tensor([0.5 + 0.499 * (h + 1) / (H + 1) for h in range(H)]).view(H, 1, 1)
    decay = gam ** (i - j).abs().float()
    scale = D ** -0.5
    print(f"torch {torch.__version__}, 1 thread, B={B} H={H} N={N} D={D} float32")
    for bwd in (False, True):
        for causal in (False, True):
            vis = (j <= i).float() if causal else None
            for masked in (False, True):
                m = decay if masked else None
                if causal:
                    m = vis if m is None else m * vis
                pairs = (N * N + N) / 2 if causal else N * N
                flops = 4.0 * B * H * pairs * D * (3.5 if bwd else 1.0)

                def setup():
                    return tuple(x.clone().requires_grad_(bwd) for x in (q, k, v))

                def run(qq, kk, vv):
                    t = qq @ kk.transpose(-1, -2)
                    if m is not None:
                        t = t * m
                    t = t * scale
                    d = t.abs().sum(-1, keepdim=True).clamp(min=1)
                    o = (t / d) @ vv
                    if bwd:
                        o.backward(dout)

                med, _ = median_times(run, a.repeat, setup)
                rss = peak_rss_mib()
                print(f"{'fwd+bwd' if bwd else 'forward'} causal={int(causal)} "
                      f"mask={'decay' if masked else 'none'}: median {med * 1e3:.1f} ms, "
                      f"{flops / med * 1e-9:.2f} GFLOP/s, peak RSS so far {rss:.0f} MiB")


if __name__ == "__main__":
    main()
