#!/usr/bin/python3
"""kfa::nn's multi-head attention block against PyTorch autograd of the block written as a
module: a linear QKV projection (nn.Linear, weight W_qkv^T), the columns split into q, k and v
heads and reshaped to (B, H, L, hd), K and V repeated over each group of query heads (GQA),
softmax(Q K^T / sqrt(hd)) V written out (causal: the upper triangle masked), the heads moved
back to (B, L, Hq hd), a linear output projection, and, with the layer norm, nn.LayerNorm of
the output plus x. With dropout, the attention weights are multiplied by keep / (1 - p), keep
the mask `kfa dropout-mask` writes for the same --dropout and --seed, and torch differentiates
that formula itself. Gradients of sum(y * dy) by y.backward(dy): dx and every parameter's.
Drives `kfa mha forward` (/y) and `kfa mha backward` (the gradients) through HDF5 files, as a
user would. float64: y and every gradient within 1e-12 * max(1, max|ref|), the project's
float64 rule; float32 files: within the project's rule with torch's float32 run as the naive
computation, 2 * |torch32 - torch64| + 8 eps max(1, |ref|).

Shapes: a covering subset of B in {1, 2}, L in {1, 17, 128, 1000}, d_model in {64, 256, 512},
H in {1, 4, 8}, GQA, causal on and off, the residual layer norm on and off, the biases on and
off, dropout on (not their full product, which would take minutes).

Usage: torch_mha.py PATH/TO/kfa [WORK_DIR]. Exit 0 on success, 1 on a mismatch.
"""
import math
import os
import sys

import h5py
import numpy as np
import torch

import harness
from harness import check
from harness import run_or_exit as run


class Block(torch.nn.Module):
    """The attention block: QKV linear, heads, softmax attention, output linear, residual and
    LayerNorm (optional)."""

    def __init__(self, d, hq, hkv, causal, qkv_bias, out_bias, ln, keep, p_drop, dtype):
        super().__init__()
        self.hq, self.hkv, self.hd, self.causal = hq, hkv, d // hq, causal
        self.keep, self.p_drop = keep, p_drop
        width = (hq + 2 * hkv) * self.hd
        self.qkv = torch.nn.Linear(d, width, bias=qkv_bias, dtype=dtype)
        self.out = torch.nn.Linear(hq * self.hd, d, bias=out_bias, dtype=dtype)
        self.ln = torch.nn.LayerNorm(d, eps=1e-5, dtype=dtype) if ln else None

    def forward(self, x):
        B, L, _ = x.shape
        hq, hkv, hd = self.hq, self.hkv, self.hd
        qkv = self.qkv(x)
        q = qkv[..., : hq * hd].reshape(B, L, hq, hd).transpose(1, 2)
        k = qkv[..., hq * hd : (hq + hkv) * hd].reshape(B, L, hkv, hd).transpose(1, 2)
        v = qkv[..., (hq + hkv) * hd :].reshape(B, L, hkv, hd).transpose(1, 2)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if self.causal:
            mask = torch.ones(L, L, dtype=torch.bool).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if self.keep is not None:
            p = p * self.keep.to(p.dtype) / (1 - self.p_drop)
        o = p @ v
        z = self.out(o.transpose(1, 2).reshape(B, L, hq * hd))
        return self.ln(z + x) if self.ln is not None else z


def torch_block(params, x, dy, case, keep, p_drop, dtype):
    """y and the gradients of sum(y * dy), in dtype; params hold float64 values."""
    d, hq, hkv, causal, qkv_bias, out_bias, ln = case
    m = Block(d, hq, hkv, causal, qkv_bias, out_bias, ln, keep, p_drop, dtype)
    with torch.no_grad():
        m.qkv.weight.copy_(params["w_qkv"].T)
        m.out.weight.copy_(params["w_o"].T)
        if qkv_bias:
            m.qkv.bias.copy_(params["b_qkv"])
        if out_bias:
            m.out.bias.copy_(params["b_o"])
        if ln:
            m.ln.weight.copy_(params["gamma"])
            m.ln.bias.copy_(params["beta"])
    x = x.to(dtype).clone().requires_grad_(True)
    y = m(x)
    y.backward(dy.to(dtype))
    out = {"y": y.detach(), "dx": x.grad, "dw_qkv": m.qkv.weight.grad.T, "dw_o": m.out.weight.grad.T}
    if qkv_bias:
        out["db_qkv"] = m.qkv.bias.grad
    if out_bias:
        out["db_o"] = m.out.bias.grad
    if ln:
        out["dgamma"], out["dbeta"] = m.ln.weight.grad, m.ln.bias.grad
    return out


def main():
    kfa, work = harness.program_and_workdir("kfa_torch_mha_")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(2026)
    f64, f32 = torch.float64, torch.float32
    cases = [
        # (B, L, d_model, Hq, Hkv, causal, qkv_bias, out_bias, layer norm, dropout, dtypes)
        (1, 1, 64, 1, 1, False, True, True, False, 0.0, (f64, f32)),
        (2, 17, 64, 4, 4, True, True, True, True, 0.0, (f64, f32)),
        (2, 17, 256, 1, 1, True, True, True, False, 0.0, (f64,)),
        (1, 128, 256, 8, 2, True, True, False, True, 0.0, (f64, f32)),
        (2, 128, 64, 4, 1, False, False, True, False, 0.0, (f64,)),
        (1, 128, 512, 8, 8, False, True, True, True, 0.0, (f64, f32)),
        (2, 33, 256, 4, 2, True, True, True, False, 0.0, (f32,)),
        (1, 1000, 512, 8, 2, True, True, True, True, 0.0, (f64,)),
        (2, 1000, 64, 4, 4, False, True, True, False, 0.0, (f32,)),
        (2, 128, 256, 4, 2, True, True, True, True, 0.2, (f64, f32)),
        (1, 17, 64, 1, 1, False, True, False, False, 0.5, (f64,)),
    ]
    all_ok = True
    fin, bin_, fout = (os.path.join(work, n) for n in ("fwd.h5", "bwd.h5", "out.h5"))
    for (B, L, d, hq, hkv, causal, qkv_bias, out_bias, ln, p_drop, dtypes) in cases:
        flags = ["--heads", str(hq), "--heads-kv", str(hkv)]
        flags += ["--causal"] if causal else []
        flags += ["--residual-layernorm"] if ln else []
        keep = None
        if p_drop > 0:
            seed = 1000 + B * L + d
            flags += ["--dropout", repr(p_drop), "--seed", str(seed)]
            mask = os.path.join(work, "keep.h5")
            run([kfa, "dropout-mask", "--shape", f"{B},{hq},{L},{L}", "--dropout", repr(p_drop),
                 "--seed", str(seed), "--out", mask])
            keep = torch.from_numpy(harness.read(mask, "/keep")[0].astype(bool))
        for dtype in dtypes:
            name = (f"B={B} L={L} d_model={d} Hq={hq} Hkv={hkv} causal={causal} "
                    f"qkv_bias={qkv_bias} out_bias={out_bias} ln={ln} dropout={p_drop} "
                    f"{str(dtype).replace('torch.', '')}")
            hd = d // hq
            width = (hq + 2 * hkv) * hd

            def draw(*shape, centre=0.0, amp=1.0):
                t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * amp + centre
                return t.to(dtype).to(torch.float64)  # the values the file holds, exactly

            amp = 2 / math.sqrt(d)
            x, dy = draw(B, L, d), draw(B, L, d)
            params = {"w_qkv": draw(d, width, amp=amp), "w_o": draw(hq * hd, d, amp=amp)}
            if qkv_bias:
                params["b_qkv"] = draw(width, amp=0.5)
            if out_bias:
                params["b_o"] = draw(d, amp=0.5)
            if ln:
                params["gamma"], params["beta"] = draw(d, centre=1.0, amp=0.5), draw(d, amp=0.5)
            spec = (d, hq, hkv, causal, qkv_bias, out_bias, ln)
            ref64 = torch_block(params, x, dy, spec, keep, p_drop, f64)
            ref32 = torch_block(params, x, dy, spec, keep, p_drop, f32) if dtype == f32 else None
            npd = np.float64 if dtype == f64 else np.float32
            inputs = {"/x": x.numpy().astype(npd)}
            for k, v in params.items():
                inputs["/" + k] = v.numpy().astype(npd)
            harness.write(fin, **inputs)
            harness.write(bin_, **inputs, **{"/dy": dy.numpy().astype(npd)})
            for pass_, path in (("forward", fin), ("backward", bin_)):
                run([kfa, "mha", pass_, "--in", path, "--out", fout] + flags)
                with h5py.File(fout, "r") as f:
                    want = ["y"] if pass_ == "forward" else sorted(k for k in ref64 if k != "y")
                    if sorted(f.keys()) != want:
                        print(f"FAIL {name} {pass_}: outputs {sorted(f.keys())}, expected {want}")
                        all_ok = False
                        continue
                    for k in want:
                        all_ok &= check(k, f["/" + k][...], ref64[k],
                                        None if ref32 is None else ref32[k], name)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
