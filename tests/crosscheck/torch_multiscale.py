#!/usr/bin/python3
"""kfa forward|backward --multiscale against PyTorch float64 autograd of the formula written out:

    t = (Q @ K^T) * M * scale;  d = t.abs().sum(-1, keepdim=True).clamp(min=1);  O = (t / d) @ V

with hidden keys (causal/window) zeroed in t and K, V repeated over each GQA group; gradients
by O.backward(dO). Drives the kfa program through HDF5 files (float64 throughout), so that the
library's output is compared with something it did not compute. Every output (O, rsum, dQ, dK,
dV) must agree within 1e-12 * max(1, max|ref|), the project's float64 rule.

Usage: torch_multiscale.py PATH/TO/kfa [WORK_DIR]. Exit 0 on success, 1 on a mismatch.
"""
import os
import sys

import h5py
import torch

import harness
from harness import check
from harness import run_or_exit as run

torch.set_default_dtype(torch.float64)


def visible(nq, nk, causal, align, wl, wr):
    """The causal/window visibility of kfa::Params, as a (nq, nk) float 0/1 matrix."""
    return harness.visible(nq, nk, causal, align, wl, wr).to(torch.float64)


def torch_msa(q, k, v, m, scale, vis, dout):
    """O, rsum and the gradients of sum(O * dout) by autograd of the formula as written."""
    q = q.clone().requires_grad_(True)
    k = k.clone().requires_grad_(True)
    v = v.clone().requires_grad_(True)
    group = q.shape[1] // k.shape[1]
    kr = k.repeat_interleave(group, dim=1)
    vr = v.repeat_interleave(group, dim=1)
    t = (q @ kr.transpose(-1, -2)) * m * scale * vis
    d = t.abs().sum(dim=-1, keepdim=True).clamp(min=1)
    o = (t / d) @ vr
    o.backward(dout)
    rsum = t.abs().sum(dim=-1)
    return o.detach(), rsum.detach(), q.grad, k.grad, v.grad


def main():
    kfa, work = harness.program_and_workdir("kfa_torch_msa_")
    gen = torch.Generator().manual_seed(2026)
    cases = [
        # (B, Hq, Hk, Nq, Nk, D, mask kind, causal, align, window left, right, scale)
        (2, 4, 2, 37, 53, 24, "dense", False, "bottom-right", -1, -1, 1.0),
        (1, 4, 1, 64, 64, 17, "decay", True, "bottom-right", -1, -1, 1.0),
        (1, 2, 2, 70, 45, 64, "dense", True, "top-left", -1, -1, 0.5),
        (1, 2, 1, 45, 70, 32, "dense", False, "bottom-right", 10, 3, 1.0),
        (1, 2, 1, 30, 30, 16, "none", True, "bottom-right", -1, -1, 0.05),
    ]
    all_ok = True
    for (B, Hq, Hk, Nq, Nk, D, kind, causal, align, wl, wr, scale) in cases:
        case = f"B={B} Hq={Hq} Hk={Hk} Nq={Nq} Nk={Nk} D={D} {kind} causal={causal} {align} window=({wl},{wr}) scale={scale}"
        q = torch.rand(B, Hq, Nq, D, generator=gen) * 2 - 1
        k = torch.rand(B, Hk, Nk, D, generator=gen) * 2 - 1
        v = torch.rand(B, Hk, Nk, D, generator=gen) * 2 - 1
        dout = torch.rand(B, Hq, Nq, D, generator=gen) * 2 - 1
        vis = visible(Nq, Nk, causal, align, wl, wr)
        if kind == "decay":
            gam = torch.tensor([0.5, 0.9, 0.99, 0.7][:Hq]).view(Hq, 1, 1)
            i = torch.arange(Nq).view(1, Nq, 1)
            j = torch.arange(Nk).view(1, 1, Nk)
            m = torch.where(j <= i, gam ** (i - j).clamp(min=0), torch.zeros(()))
        elif kind == "dense":
            # Rows spread over a factor 16, scaled so the median row has r = 1.07: both regimes
            # of the clamp, none at its kink.
            m = torch.rand(Hq, Nq, Nk, generator=gen) * 4.0 ** (torch.rand(Hq, Nq, 1, generator=gen) * 2 - 1)
            r0 = torch_msa(q, k, v, m, scale, vis, dout)[1]
            m = m * (1.07 / float(r0.median()))
        else:
            m = torch.ones(Hq, Nq, Nk)
        o_ref, r_ref, dq_ref, dk_ref, dv_ref = torch_msa(q, k, v, m, scale, vis, dout)
        if kind == "dense":
            frac_below = float((r_ref < 1).to(torch.float64).mean())
            if not (0.2 <= frac_below <= 0.8):
                print(f"FAIL {case}: {frac_below:.2f} of the rows have r < 1 (need 20..80 %)")
                all_ok = False
        flags = ["--scale", repr(scale), "--align", align, "--window", f"{wl},{wr}"]
        if causal:
            flags.append("--causal")
        fin, fout = os.path.join(work, "in.h5"), os.path.join(work, "out.h5")
        with h5py.File(fin, "w") as f:
            f["/q"], f["/k"], f["/v"] = q.numpy(), k.numpy(), v.numpy()
            if kind != "none":  # without /mask kfa takes M = 1
                f["/mask"] = m.numpy()
        run([kfa, "forward", "--multiscale", "--in", fin, "--out", fout] + flags)
        with h5py.File(fout, "r") as f:
            o, rsum = f["/o"][...], f["/rsum"][...]
        all_ok &= check("O", o, o_ref, None, case)
        all_ok &= check("rsum", rsum, r_ref, None, case)
        for det in ([], ["--deterministic"]):
            with h5py.File(fin, "a") as f:
                for name, x in (("/o", o), ("/rsum", rsum), ("/do", dout.numpy())):
                    if name in f:
                        del f[name]
                    f[name] = x
            run([kfa, "backward", "--multiscale", "--in", fin, "--out", fout] + flags + det)
            with h5py.File(fout, "r") as f:
                mode = "deterministic" if det else "atomic"
                all_ok &= check(f"dQ ({mode})", f["/dq"][...], dq_ref, None, case)
                all_ok &= check(f"dK ({mode})", f["/dk"][...], dk_ref, None, case)
                all_ok &= check(f"dV ({mode})", f["/dv"][...], dv_ref, None, case)
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
