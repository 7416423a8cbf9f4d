#!/usr/bin/python3
"""PyTorch's multi-head attention block, the baseline of bench_mha (perf/results/
2026-11-25-mha.md): the block as a module, a linear QKV projection, the heads reshaped to
(B, H, L, hd), softmax(Q K^T / sqrt(hd)) V written out (causal: the upper triangle masked),
the heads moved back, a linear output projection and nn.LayerNorm of the output plus x; in
float32 on one thread (torch.set_num_threads(1)), forward and forward + backward (autograd of
sum(y * dy) for x and every parameter). Prints one line per case: median wall and process CPU ms and the peak memory
the process had allocated so far.

Usage: taskset -c 1 torch_mha.py [--l 4096] [--d 512] [--heads 8] [--repeat 3]
"""
import argparse
import math

import torch

from torch_timing import median_times, peak_rss_mib


class Block(torch.nn.Module):
    def __init__(self, d, h, causal):
        super().__init__()
        self.h, self.hd, self.causal = h, d // h, causal
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        B, L, d = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        if self.causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, L, d)
        return self.ln(self.out(o) + x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--l", type=int, default=4096)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x = torch.rand(1, a.l, a.d) * 2 - 1
    dy = torch.rand(1, a.l, a.d) * 2 - 1
    print(f"torch {torch.__version__}, 1 thread, B=1 L={a.l} d_model={a.d} H={a.heads} float32")
    for bwd in (False, True):
        for causal in (False, True):
            m = Block(a.d, a.heads, causal)

            def setup():
                m.zero_grad()
                return (x.clone().requires_grad_(bwd),)

            def run(xx):
                if bwd:
                    m(xx).backward(dy)
                else:
                    with torch.no_grad():
                        m(xx)

            med, med_cpu = median_times(run, a.repeat, setup)
            rss = peak_rss_mib()
            print(f"{'fwd+bwd' if bwd else 'forward'} causal={int(causal)} ln=1: median "
                  f"{med * 1e3:.1f} ms wall, {med_cpu * 1e3:.1f} ms CPU (user + system), "
                  f"peak RSS so far {rss:.0f} MiB")


if __name__ == "__main__":
    main()
