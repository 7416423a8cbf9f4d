"""What the torch cross-checks share: running the kfa program, HDF5 files, the masks'
visibility, and the project's tolerance rule.

The cross-checks drive the kfa program through HDF5 files, as a user would, and compare its
outputs with PyTorch float64 (autograd for the gradients), an oracle that shares no code with
kfa. The rule: float64 within 1e-12 * max(1, max|ref|); a narrower type within
2 * |naive - ref| + 8 eps(float32) * max(1, max|ref|), naive being torch's own computation in
that type.
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch


def run(kfa, args):
    """Runs `kfa ARGS` (the kfa program, or a test driver); raises RuntimeError naming the
    command when it fails."""
    r = subprocess.run([kfa] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        name = os.path.basename(kfa)
        raise RuntimeError(f"{name} {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def write(path, **datasets):
    """A new HDF5 file holding the given arrays as /NAME."""
    with h5py.File(path, "w") as f:
        for name, x in datasets.items():
            f[name] = x


def read(path, *names):
    """The datasets /NAME of an HDF5 file, as numpy arrays."""
    with h5py.File(path, "r") as f:
        return [np.array(f[n]) for n in names]


def visible(nq, nk, causal, align, left, right):
    """The causal/window mask of kfa::Params as an (nq, nk) bool tensor: key j is visible to
    query i when d = j - i - shift (shift = nk - nq bottom-right, 0 top-left) satisfies d <= 0
    (causal), d >= -left and d <= right (windows; -1 = unbounded)."""
    i = torch.arange(nq).unsqueeze(1)
    j = torch.arange(nk).unsqueeze(0)
    d = j - i - ((nk - nq) if align == "bottom-right" else 0)
    ok = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        ok &= d <= 0
    if left >= 0:
        ok &= d >= -left
    if right >= 0:
        ok &= d <= right
    return ok


def compare(name, got, ref, naive=None):
    """The rule above (naive None: float64). Non-finite entries must match exactly.
    Returns a line to print and whether it passed."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref.detach() if torch.is_tensor(ref) else ref, np.float64)
    finite = np.isfinite(ref)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(got[~finite],
                                                                           ref[~finite]):
        return f"{name}: non-finite entries differ", False
    err = float(np.max(np.abs(got[finite] - ref[finite]), initial=0))
    scale = max(1.0, float(np.max(np.abs(ref[finite]), initial=0)))
    if naive is None:
        bound = 1e-12 * scale
    else:
        naive = np.asarray(naive.detach() if torch.is_tensor(naive) else naive, np.float64)
        naive_err = float(np.max(np.abs(naive[finite] - ref[finite]), initial=0))
        bound = 2 * naive_err + 8 * float(np.finfo(np.float32).eps) * scale
    ok = err <= bound
    return f"{name}: err {err:.3g} (bound {bound:.3g}) {'ok' if ok else 'FAIL'}", ok


def check(name, got, ref, naive, case):
    """compare(name, got, ref, naive), printed as one line under `case`; returns whether it
    passed."""
    line, ok = compare(name, got, ref, naive)
    print(f"{'ok  ' if ok else 'FAIL'} {case}: {line}")
    return ok


def run_or_exit(cmd):
    """run(cmd[0], cmd[1:]), ending the script with FAIL and the reason when it fails."""
    try:
        return run(cmd[0], cmd[1:])
    except RuntimeError as e:
        sys.exit(f"FAIL: {e}")


def program_and_workdir(prefix):
    """The command line `SCRIPT PATH/TO/kfa [WORK_DIR]`: the program and a folder for the
    files (a new temporary one named PREFIX... without WORK_DIR)."""
    kfa = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix=prefix)
    os.makedirs(work, exist_ok=True)
    return kfa, work
