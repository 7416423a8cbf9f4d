#!/usr/bin/python3
"""kfa layernorm forward|backward against PyTorch autograd:

    z = x + residual;  y = torch.nn.functional.layer_norm(z, (D,), gamma, beta, eps)

(the population variance, kfa's default), and with --unbiased the formula written out with
z.var(-1, unbiased=True); gradients of sum(y * dy) by y.backward(dy): dx (also dresidual),
dgamma, dbeta. Drives the kfa program through HDF5 files. float64: every output within
1e-12 * max(1, max|ref|), the project's float64 rule; float32 files: within the project's rule
with torch's float32 computation as the naive one, 2 * |torch32 - torch64| + 8 eps max(1, |ref|).
Inputs have means up to 1e3, with and without a residual.

Usage: torch_layer_norm.py PATH/TO/kfa [WORK_DIR]. Exit 0 on success, 1 on a mismatch.
"""
import os
import sys

import h5py
import numpy as np
import torch

import harness
from harness import check
from harness import run_or_exit as run


def torch_ln(x, res, gamma, beta, dy, eps, unbiased):
    """y, mean, rstd and the gradients of sum(y * dy) by autograd, in the inputs' precision."""
    x = x.clone().requires_grad_(True)
    res = None if res is None else res.clone().requires_grad_(True)
    gamma = gamma.clone().requires_grad_(True)
    beta = beta.clone().requires_grad_(True)
    z = x if res is None else x + res
    D = z.shape[-1]
    if unbiased:
        mean = z.mean(-1, keepdim=True)
        var = z.var(-1, unbiased=True, keepdim=True)
        y = (z - mean) / torch.sqrt(var + eps) * gamma + beta
    else:
        y = torch.nn.functional.layer_norm(z, (D,), gamma, beta, eps)
    y.backward(dy)
    with torch.no_grad():
        mean = z.mean(-1)
        rstd = 1 / torch.sqrt(z.var(-1, unbiased=unbiased) + eps)
    dres = None if res is None else res.grad
    return y.detach(), mean, rstd, x.grad, dres, gamma.grad, beta.grad


def main():
    kfa, work = harness.program_and_workdir("kfa_torch_ln_")
    gen = torch.Generator().manual_seed(2026)
    cases = [
        # (rows, D, mean of x, residual, unbiased, eps)
        (37, 2, 0.0, False, False, 1e-5),
        (64, 64, 1e3, True, False, 1e-5),
        (16, 512, 1e3, False, True, 1e-5),
        (9, 768, 0.0, True, True, 1e-6),
        (5, 1000, 10.0, True, False, 0.0),
        (3, 4096, 1e3, False, False, 1e-5),
    ]
    all_ok = True
    fin, fout = os.path.join(work, "in.h5"), os.path.join(work, "out.h5")
    for (rows, D, mu, with_res, unbiased, eps) in cases:
        for dtype in (torch.float64, torch.float32):
            case = (f"rows={rows} D={D} mean={mu:g} residual={with_res} unbiased={unbiased} "
                    f"eps={eps:g} {str(dtype).replace('torch.', '')}")

            def draw(*shape, centre=0.0, amp=1.0):
                t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * amp + centre
                return t.to(dtype).to(torch.float64)  # the values the file holds, exactly

            x = draw(rows, D, centre=mu)
            res = draw(rows, D) if with_res else None
            gamma, beta = draw(D, centre=1.0, amp=0.5), draw(D, amp=0.5)
            dy = draw(rows, D)
            ref64 = torch_ln(x, res, gamma, beta, dy, eps, unbiased)
            ref32 = None
            if dtype == torch.float32:
                f32 = lambda t: None if t is None else t.to(torch.float32)
                ref32 = torch_ln(f32(x), f32(res), f32(gamma), f32(beta), f32(dy), eps, unbiased)
            flags = ["--eps", repr(eps)] + (["--unbiased"] if unbiased else [])
            npd = np.float64 if dtype == torch.float64 else np.float32
            with h5py.File(fin, "w") as f:
                f["/x"], f["/gamma"], f["/beta"] = (x.numpy().astype(npd),
                                                    gamma.numpy().astype(npd),
                                                    beta.numpy().astype(npd))
                if res is not None:
                    f["/residual"] = res.numpy().astype(npd)
            run([kfa, "layernorm", "forward", "--in", fin, "--out", fout] + flags)
            r32 = (lambda i: None) if ref32 is None else (lambda i: ref32[i])
            with h5py.File(fout, "r") as f:
                all_ok &= check("y", f["/y"][...], ref64[0], r32(0), case)
                all_ok &= check("mean", f["/mean"][...], ref64[1], r32(1), case)
                all_ok &= check("rstd", f["/rstd"][...], ref64[2], r32(2), case)
            with h5py.File(fin, "a") as f:
                f["/dy"] = dy.numpy().astype(npd)
            run([kfa, "layernorm", "backward", "--in", fin, "--out", fout] + flags)
            with h5py.File(fout, "r") as f:
                dx = f["/dx"][...]
                all_ok &= check("dx", dx, ref64[3], r32(3), case)
                if res is not None:  # dL/dresidual is dx, computed by torch separately
                    all_ok &= check("dresidual", dx, ref64[4], r32(4), case)
                all_ok &= check("dgamma", f["/dgamma"][...], ref64[5], r32(5), case)
                all_ok &= check("dbeta", f["/dbeta"][...], ref64[6], r32(6), case)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
