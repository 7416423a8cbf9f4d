#!/usr/bin/env python3
"""kfa against PyTorch: an oracle that shares no code with kfa.

Drives the kfa program through HDF5 files (as a user would) and compares its forward (O, LSE)
and backward (dQ, dK, dV) with softmax attention written out in torch float64 and its autograd:
no mask, causal in both alignments, sliding windows, GQA, softcap, a dLSE term, score terms
(an additive bias, broadcast over batch or heads, with its gradient dbias; ALiBi from --alibi,
-slope_h |i + shift - j| with slopes 2^(-8 (h + 1) / Hq); a boolean /mask and per-batch
/key_lengths as -inf, rows that see no key included: O = 0, LSE = -inf, zero gradients), and dropout
through the mask `kfa dropout-mask` writes (O = (softmax(S) * Z) V, Z = keep / (1 - p): torch
differentiates that formula itself, so the backward's dropout terms are checked against
something that does not share them). The first case is the seed problem, (4, 4096, 32) with
one head, also against numpy's explicit formula at the seed's rtol = 1e-7.

Bounds: float64, |err| <= 1e-12 * max(1, max|ref|) (the project's rule); float32 inputs, the
rule of core/include/kfa/reference.hpp: err <= 2 * err(torch float32) + 8 * eps * max(1, max|ref|).

usage: torch_crosscheck.py KFA [--quick]   (exit 0 when every case passes)
"""
import os
import sys
import tempfile

import numpy as np
import torch

from harness import compare, read, run, visible, write

torch.set_num_threads(1)


def alibi(hq, nq, nk, align):
    """-slope_h |i + shift - j| as an (hq, nq, nk) tensor; shift aligns as the masks do."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], dtype=torch.float64)
    shift = nk - nq if align == "bottom-right" else 0
    i = torch.arange(nq, dtype=torch.float64).view(nq, 1)
    j = torch.arange(nk, dtype=torch.float64).view(1, nk)
    return -slopes.view(hq, 1, 1) * (i + shift - j).abs()


def attention(q, k, v, case, keep=None, bias=None, hidden=None):
    """O and LSE of softmax attention, written out (torch 1.13 has no fused SDPA); `bias`
    (broadcastable to the scores) is added after the softcap; `hidden` (a bool tensor
    broadcastable to the scores) hides pairs besides the interval mask. A row that sees no key
    has O = 0 and LSE = -inf, and passes no gradient (kfa's convention; plain softmax would
    give NaN there)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = case.get("scale", 1 / np.sqrt(q.shape[-1]))
    s = scale * (q @ k.transpose(-1, -2))
    cap = case.get("softcap", 0)
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if bias is not None:
        s = s + bias
    if case.get("alibi"):
        align = case.get("align", "bottom-right")
        s = s + alibi(q.shape[1], q.shape[2], k.shape[2], align).to(s.dtype)
    vis = visible(q.shape[2], k.shape[2], case.get("causal", False),
                  case.get("align", "bottom-right"), *case.get("window", (-1, -1)))
    hide = ~vis if hidden is None else (~vis) | hidden
    s = s.masked_fill(hide, float("-inf"))
    empty = hide.all(dim=-1, keepdim=True).expand(s.shape)
    s = s.masked_fill(empty, 0.0)  # finite, so that no NaN reaches autograd; zeroed below
    lse = torch.logsumexp(s, dim=-1).masked_fill(empty[..., 0], float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    if keep is not None:
        p = p * keep / (1 - case["dropout"])
    return p @ v, lse


def flags(case):
    out = []
    if case.get("causal"):
        out.append("--causal")
    if "align" in case:
        out += ["--align", case["align"]]
    if "window" in case:
        out += ["--window", "%d,%d" % case["window"]]
    if "softcap" in case:
        out += ["--softcap", repr(case["softcap"])]
    if "scale" in case:
        out += ["--scale", repr(case["scale"])]
    if case.get("alibi"):
        out.append("--alibi")
    if "dropout" in case:
        out += ["--dropout", repr(case["dropout"]), "--seed", str(case["seed"]),
                "--offset", str(case.get("offset", 0))]
    return out


def check_case(kfa, work, case):
    # (B, Hq, Hk, Nq, Nk, D) and optionally v's head dim Dv (v, o, dout, dv), D by default.
    B, Hq, Hk, Nq, Nk, D = case["shape"][:6]
    Dv = case["shape"][6] if len(case["shape"]) > 6 else D
    dtype = case.get("dtype", np.float64)
    rng = np.random.default_rng(case.get("data_seed", 0))
    # U[0, 1) as the seed draws them; in the file's type, so that kfa and torch see one input.
    q = rng.random((B, Hq, Nq, D)).astype(dtype)
    k = rng.random((B, Hk, Nk, D)).astype(dtype)
    v = rng.random((B, Hk, Nk, Dv)).astype(dtype)
    dout = (rng.random((B, Hq, Nq, Dv)) - 0.5).astype(dtype)
    dlse = (rng.random((B, Hq, Nq)) - 0.5).astype(dtype) if case.get("dlse") else None
    terms = {}  # datasets of the score terms, in both passes' input files
    if "bias" in case:  # (B or 1, Hq or 1, Nq, Nk), values of the scores' size
        bb, bh = case["bias"]
        shape = (B if bb else 1, Hq if bh else 1, Nq, Nk)
        terms["bias"] = (2 * rng.random(shape) - 1).astype(dtype)
    hidden = None  # the visibility terms, as pairs hidden from torch's softmax
    if "mask" in case:  # uint8 (B or 1, Hq or 1, Nq, Nk), 0 = hidden, ~30 % hidden
        bb, bh = case["mask"]
        mask = (rng.random((B if bb else 1, Hq if bh else 1, Nq, Nk)) > 0.3).astype(np.uint8)
        mask[0, 0, Nq // 3, :] = 0  # a row that sees no key
        terms["mask"] = mask
        hidden = torch.from_numpy(mask == 0)
    if "key_lengths" in case:  # keys j >= length[b] hidden in batch b
        lengths = np.array(case["key_lengths"], dtype=np.int32)
        terms["key_lengths"] = lengths
        hidden = torch.arange(Nk).view(1, 1, 1, Nk) >= torch.from_numpy(lengths).view(B, 1, 1, 1)
    inp, out, bwd_in, bwd_out = (os.path.join(work, f) for f in
                                 ("in.h5", "out.h5", "bwd_in.h5", "bwd_out.h5"))
    write(inp, q=q, k=k, v=v, **terms)
    run(kfa, ["forward", "--in", inp, "--out", out] + flags(case))
    o_kfa, lse_kfa = read(out, "o", "lse")

    keep = None
    if "dropout" in case:
        mask = os.path.join(work, "mask.h5")
        run(kfa, ["dropout-mask", "--shape", f"{B},{Hq},{Nq},{Nk}", "--dropout",
                  repr(case["dropout"]), "--seed", str(case["seed"]), "--offset",
                  str(case.get("offset", 0)), "--out", mask])
        keep = torch.from_numpy(read(mask, "keep")[0].astype(np.float64))

    leaves = [("q", q), ("k", k), ("v", v)] + [(n, terms[n]) for n in ("bias",) if n in terms]
    t = {n: torch.tensor(x.astype(np.float64), requires_grad=True) for n, x in leaves}
    o_ref, lse_ref = attention(t["q"], t["k"], t["v"], case, keep, t.get("bias"), hidden)
    loss = (o_ref * torch.from_numpy(dout.astype(np.float64))).sum()
    if dlse is not None:
        loss = loss + (lse_ref * torch.from_numpy(dlse.astype(np.float64))).sum()
    loss.backward()
    naive = {}
    if dtype != np.float64:  # the same formula in float32: what the rule allows float to miss
        t32 = {n: torch.tensor(x, requires_grad=True) for n, x in leaves}
        o32, lse32 = attention(t32["q"], t32["k"], t32["v"], case,
                               None if keep is None else keep.float(), t32.get("bias"), hidden)
        l32 = (o32 * torch.from_numpy(dout)).sum()
        if dlse is not None:
            l32 = l32 + (lse32 * torch.from_numpy(dlse)).sum()
        l32.backward()
        naive = {"O": o32.detach(), "LSE": lse32.detach(), "dQ": t32["q"].grad,
                 "dK": t32["k"].grad, "dV": t32["v"].grad}
        if "bias" in t32:
            naive["dbias"] = t32["bias"].grad

    lines, ok = [], True
    for name, got, ref in (("O", o_kfa, o_ref.detach()), ("LSE", lse_kfa, lse_ref.detach())):
        line, good = compare(name, got, ref, naive.get(name) if dtype != np.float64 else None)
        lines.append(line)
        ok &= good
    if case.get("seed_formula"):
        # The seed's ref_attention_1: exp without max subtraction (scores <= 32 / sqrt(32)).
        qq, kk, vv = (x.astype(np.float64) for x in (q, k, v))
        w = np.exp(qq @ kk.transpose(0, 1, 3, 2) / np.sqrt(D))
        o_seed = (w / w.sum(-1, keepdims=True)) @ vv
        try:
            np.testing.assert_allclose(o_kfa, o_seed, rtol=1e-7)
            lines.append("O vs numpy ref_attention_1: rtol 1e-7 ok")
        except AssertionError as e:
            lines.append("O vs numpy ref_attention_1: FAIL " + str(e).splitlines()[0])
            ok = False

    if case.get("backward", True):
        files = dict(q=q, k=k, v=v, o=o_kfa, lse=lse_kfa, do=dout, **terms)
        if dlse is not None:
            files["dlse"] = dlse.astype(lse_kfa.dtype)
        write(bwd_in, **files)
        run(kfa, ["backward", "--in", bwd_in, "--out", bwd_out] + flags(case))
        dq, dk, dv = read(bwd_out, "dq", "dk", "dv")
        grads = [("dQ", dq, t["q"].grad), ("dK", dk, t["k"].grad), ("dV", dv, t["v"].grad)]
        if "bias" in t:  # summed over the broadcast dimensions by autograd and by kfa
            grads.append(("dbias", read(bwd_out, "dbias")[0], t["bias"].grad))
        for name, got, ref in grads:
            line, good = compare(name, got, ref, naive.get(name) if dtype != np.float64 else None)
            lines.append(line)
            ok &= good
    return ok, lines


CASES = [
    # The seed problem: (4, 4096, 32) as (4, 1, 4096, 32), forward only at this size.
    dict(name="seed (4,1,4096,32)", shape=(4, 1, 1, 4096, 4096, 32), backward=False,
         seed_formula=True, quick_shape=(2, 1, 1, 512, 512, 32)),
    dict(name="no mask, backward", shape=(2, 1, 1, 1024, 1024, 32), seed_formula=True,
         quick_shape=(1, 1, 1, 256, 256, 32)),
    dict(name="causal bottom-right, Nq < Nk", shape=(1, 2, 2, 100, 160, 32), causal=True),
    dict(name="causal top-left, Nq > Nk", shape=(1, 2, 2, 160, 100, 32), causal=True,
         align="top-left"),
    dict(name="window (17, 5)", shape=(1, 2, 2, 130, 130, 16), window=(17, 5)),
    dict(name="causal window top-left", shape=(1, 2, 1, 90, 120, 16), causal=True,
         window=(20, 3), align="top-left"),
    dict(name="GQA 8 q heads on 2 kv heads, dLSE", shape=(2, 8, 2, 70, 90, 64), dlse=True),
    dict(name="MQA, scale 0.3", shape=(1, 4, 1, 64, 64, 32), scale=0.3),
    dict(name="softcap 2", shape=(1, 2, 2, 80, 80, 32), softcap=2.0, scale=1.5),
    dict(name="dropout 0.2 (kfa dropout-mask)", shape=(1, 2, 1, 96, 112, 32), dropout=0.2,
         seed=11, offset=3, causal=True),
    dict(name="dropout 0.5, GQA, dLSE", shape=(2, 4, 2, 50, 70, 16), dropout=0.5, seed=7,
         dlse=True),
    dict(name="float32: causal, GQA, softcap", shape=(1, 4, 2, 120, 150, 32), causal=True,
         softcap=3.0, dtype=np.float32),
    dict(name="float32: dropout, window", shape=(1, 2, 2, 100, 100, 32), window=(30, 0),
         dropout=0.1, seed=3, dtype=np.float32),
    dict(name="bias (B, H), causal, dLSE", shape=(2, 2, 2, 70, 90, 32), bias=(True, True),
         causal=True, dlse=True),
    dict(name="bias broadcast over batch, GQA, softcap", shape=(2, 4, 2, 60, 60, 16),
         bias=(False, True), softcap=2.0),
    dict(name="bias broadcast over heads, dropout, window", shape=(2, 2, 1, 50, 80, 32),
         bias=(True, False), window=(25, 10), dropout=0.2, seed=5),
    dict(name="ALiBi, causal top-left, GQA", shape=(1, 4, 2, 90, 70, 32), alibi=True,
         causal=True, align="top-left"),
    dict(name="ALiBi bottom-right, dLSE", shape=(2, 2, 2, 40, 100, 16), alibi=True, dlse=True),
    dict(name="float32: bias (1, 1), causal", shape=(1, 2, 2, 80, 80, 32), bias=(False, False),
         causal=True, dtype=np.float32),
    dict(name="float32: ALiBi, window", shape=(1, 4, 4, 100, 100, 32), alibi=True,
         window=(40, 40), dtype=np.float32),
    dict(name="mask (B, H), causal, dLSE", shape=(2, 2, 2, 70, 90, 32), mask=(True, True),
         causal=True, dlse=True),
    dict(name="mask broadcast over batch, GQA, dropout", shape=(2, 4, 2, 60, 80, 16),
         mask=(False, True), dropout=0.2, seed=9),
    dict(name="mask broadcast over heads, window top-left", shape=(2, 2, 1, 80, 60, 32),
         mask=(True, False), window=(20, 10), align="top-left"),
    dict(name="key lengths 90, 0, 1, 61, causal top-left", shape=(4, 2, 2, 50, 90, 32),
         key_lengths=(90, 0, 1, 61), causal=True, align="top-left", dlse=True),
    dict(name="key lengths, GQA, softcap, dropout", shape=(2, 4, 2, 64, 100, 16),
         key_lengths=(37, 100), softcap=2.0, dropout=0.3, seed=4),
    dict(name="float32: mask (1, 1)", shape=(1, 2, 2, 100, 120, 32),
         mask=(False, False), dtype=np.float32),
    dict(name="float32: key lengths 0 and 77", shape=(2, 2, 2, 90, 90, 32),
         key_lengths=(0, 77), causal=True, dtype=np.float32),
    # v with a head dim of its own (shape's 7th entry: Dv).
    dict(name="Dv 72 != D 24, GQA, causal, dLSE", shape=(2, 4, 2, 70, 90, 24, 72), causal=True,
         dlse=True),
    dict(name="Dv 40 != D 64, window, dropout", shape=(1, 2, 2, 80, 80, 64, 40),
         window=(20, 5), dropout=0.2, seed=13),
    dict(name="float32: Dv 16 != D 32, softcap", shape=(1, 2, 1, 90, 110, 32, 16), softcap=2.0,
         dtype=np.float32),
]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    kfa, quick = sys.argv[1], "--quick" in sys.argv[2:]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="kfa_torch_") as work:
        for case in CASES:
            if quick and "quick_shape" in case:
                case = dict(case, shape=case["quick_shape"])
            try:
                ok, lines = check_case(kfa, work, case)
            except Exception as e:  # a kfa failure or a harness error: the case fails
                ok, lines = False, [f"error: {e}"]
            print(f"{'PASS' if ok else 'FAIL'} {case['name']} {case['shape']}: "
                  + "; ".join(lines), flush=True)
            failed += not ok
    print(f"{len(CASES) - failed} of {len(CASES)} cases pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
