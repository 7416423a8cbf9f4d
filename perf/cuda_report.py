#!/usr/bin/env python3
"""Compile-only resource and instruction report of kfa's CUDA kernels (no GPU needed).

Given the Kokkos 4.6.01 release archive (and, for CUDA 13, its patch) in ARCHIVE_DIR, this
unpacks and patches Kokkos into a cache folder, *configures* it for CUDA once per architecture
(about 10 s; nothing of Kokkos is built), compiles kfa::forward and kfa::backward for bfloat16,
half and float on Kokkos::Cuda with `-Xptxas -v` (keeping the PTX), and prints one table per
architecture:

- registers, spill bytes and stack of every kfa kernel (ptxas);
- team scratch bytes by head dim, from the kernels' own scratch_bytes(head_dim), printed by a
  small host program compiled against the same headers (it needs no Kokkos library and no GPU);
- teams per SM from registers and from shared memory (scratch plus Kokkos' own team space),
  with the SM limits of the architecture;
- in each kernel's PTX the counts of mma.sync, ldmatrix, cp.async, 16-byte loads and all
  instructions, the static instructions per mma.sync, and the instructions per mma.sync in the
  loop that spends the fewest per mma.sync (the key-tile loop once a tile step is unrolled).

Usage: perf/cuda_report.py ARCHIVE_DIR [--arch 80,90] [--out FILE.md] [--fail-on-spill]
Exit 3 with a reason when nvcc or the archive is missing (CI skips then); 1 with
--fail-on-spill when a kfa kernel spills; 2 when a kernel no longer compiles.
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KOKKOS = "kokkos-4.6.01"
TYPES = {"bf16": "kfa::bf16", "half": "kfa::half", "float": "float"}
HEAD_DIMS = [32, 64, 96, 128, 256]
# SM limits (CUDA programming guide, compute capabilities 8.0 and 9.0): registers, threads,
# resident blocks, shared memory per SM, and the shared memory the hardware reserves per block.
SM = {
    "80": dict(name="A100 (sm_80)", regs=65536, threads=2048, blocks=32, smem=167936),
    "90": dict(name="H100 (sm_90)", regs=65536, threads=2048, blocks=32, smem=233472),
}
SMEM_RESERVED_PER_BLOCK = 1024
# Threads of a kfa team on CUDA: TileTraits<Kokkos::Cuda>::team_size warps of 32 lanes.
TEAM_THREADS = 4 * 32


def fail(code, msg):
    print(f"cuda_report: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd, **kw):
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kw)


def find_nvcc():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return nvcc if os.access(nvcc, os.X_OK) else None


def kokkos_source(archive_dir, cache):
    """The unpacked, patched Kokkos tree in the cache (reused while the archive's sum holds)."""
    archive = archive_dir / f"{KOKKOS}.tar.xz"
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    src = cache / f"{KOKKOS}-cuda-src-{digest}"
    if (src / ".complete").exists():
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    subprocess.run(["tar", "-xf", str(archive), "-C", str(src), "--strip-components=1"],
                   check=True)
    patch = archive_dir / f"{KOKKOS}-cuda13.patch"
    if patch.exists():  # CUDA 13 changed three runtime calls Kokkos 4.6.01 makes
        subprocess.run(["patch", "-s", "-p1", "-i", str(patch)], cwd=src, check=True)
    wrapper = src / "bin" / "nvcc_wrapper"  # its default sm_70 no longer exists in CUDA 13
    wrapper.write_text(wrapper.read_text().replace('default_arch="sm_70"',
                                                   'default_arch="sm_80"'))
    (src / ".complete").touch()
    return src


def kokkos_configure(src, cache, arch):
    build = cache / f"{src.name}-build-sm{arch}"
    if (build / ".complete").exists():
        return build
    shutil.rmtree(build, ignore_errors=True)
    flag = {"80": "AMPERE80", "90": "HOPPER90"}[arch]
    r = run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
             f"-DCMAKE_CXX_COMPILER={src}/bin/nvcc_wrapper", "-DCMAKE_CXX_STANDARD=17",
             "-DKokkos_ENABLE_CUDA=ON", "-DKokkos_ENABLE_SERIAL=ON", f"-DKokkos_ARCH_{flag}=ON"])
    if r.returncode != 0:
        fail(2, f"configuring Kokkos for sm_{arch} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    (build / ".complete").touch()
    return build


def config_header(inc, warp_tiles):
    """kfa's <kfa/config.hpp> for this report (no MPI, no tf32 tile products; the register
    kernels, KFA_CUDA_WARP_TILES, KFA_CUDA_TF32X3 and KFA_CUDA_WARP_BACKWARD, as asked), from
    cmake/config.hpp.in."""
    text = (ROOT / "cmake" / "config.hpp.in").read_text()
    text = re.sub(r"#cmakedefine (\w+)", r"/* #undef \1 */", text)
    if warp_tiles:
        text = text.replace("/* #undef KFA_CUDA_WARP_TILES */", "#define KFA_CUDA_WARP_TILES")
        text = text.replace("/* #undef KFA_CUDA_WARP_BACKWARD */",
                            "#define KFA_CUDA_WARP_BACKWARD")
        text = text.replace("/* #undef KFA_CUDA_TF32X3 */", "#define KFA_CUDA_TF32X3")
    version = re.search(r"project\(kfa VERSION (\d+)\.(\d+)\.(\d+)",
                        (ROOT / "CMakeLists.txt").read_text())
    major, minor, patch = version.groups() if version else ("0", "0", "0")
    for key, val in {"PROJECT_VERSION_MAJOR": major, "PROJECT_VERSION_MINOR": minor,
                     "PROJECT_VERSION_PATCH": patch,
                     "PROJECT_VERSION": f"{major}.{minor}.{patch}",
                     "Kokkos_VERSION": "4.6.01", "Kokkos_DEVICES": "CUDA;SERIAL"}.items():
        text = text.replace(f"@{key}@", val)
    (inc / "kfa").mkdir(parents=True, exist_ok=True)
    (inc / "kfa" / "config.hpp").write_text(text)


VIEWS = """
template <class T>
using V4 = Kokkos::View<T****, Kokkos::LayoutRight, Kokkos::CudaSpace>;
using L3 = Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::CudaSpace>;
"""


def kernels_source(tname, ctype):
    return f"""// Generated by perf/cuda_report.py: the forward and backward of {tname} on CUDA.
#include <kfa/kfa.hpp>
{VIEWS}
using T = {ctype};
template void kfa::forward(const Kokkos::Cuda&, const V4<T>&, const V4<T>&, const V4<T>&,
                           const V4<T>&, const L3&, const kfa::Params&);
template void kfa::backward(const Kokkos::Cuda&, const V4<T>&, const V4<T>&, const V4<T>&,
                            const V4<T>&, const L3&, const V4<T>&, const V4<T>&, const V4<T>&,
                            const V4<T>&, const kfa::Params&);
"""


def probe_source():
    shows = "".join(f'  show<{c}>("{n}");\n' for n, c in TYPES.items())
    dims = ", ".join(str(d) for d in HEAD_DIMS)
    return f"""// Generated by perf/cuda_report.py: prints the kernels' team scratch by head dim.
#include <kfa/kfa.hpp>
#include <cstdio>
#include <cstdlib>
{VIEWS}
template <class T>
void show(const char* name) {{
  using F = kfa::impl::ForwardKernel<Kokkos::Cuda, V4<T>, V4<T>, V4<T>, V4<T>, L3>;
  using B = kfa::impl::BackwardCommon<
      Kokkos::Cuda, T, kfa::impl::BackwardViews<V4<T>, V4<T>, V4<T>, V4<T>, L3, V4<T>, V4<T>, V4<T>>>;
  using Ops = kfa::backends::TileOps<Kokkos::Cuda, T>;
  for (int d : {{{dims}}}) {{
    std::size_t warp = 0;  // the register-resident forward where it runs (WarpKernel<d>)
    if constexpr (F::warp_type)
      if (Ops::warp_head_dim(d)) warp = Ops::warp_scratch_bytes(d);
    std::size_t warp_bwd = 0, warp_bwd_dropout = 0;  // and backward (WarpKeyValueKernel<d>)
    if constexpr (kfa::backends::TileTraits<Kokkos::Cuda, T>::warp_backward)
      if (Ops::warp_head_dim(d)) {{
        warp_bwd = Ops::warp_backward_scratch_bytes(d);
        warp_bwd_dropout = Ops::warp_backward_scratch_bytes(d, true);
      }}
    std::printf("%s %d %zu %zu %zu %zu %zu %zu\\n", name, d, F::scratch_bytes(d), warp,
                B::scratch_bytes(d, true), B::scratch_bytes(d, false), warp_bwd, warp_bwd_dropout);
  }}
}}
int main() {{
{shows}}}
// The one Kokkos library function the code above references (never called): the probe runs
// without a Kokkos build and without a GPU.
namespace Kokkos::Impl {{
[[noreturn]] void host_abort(const char* m) {{
  std::fputs(m, stderr);
  std::abort();
}}
}}  // namespace Kokkos::Impl
"""


def include_flags(src, build, inc):
    return [f"-I{build}", f"-I{build}/core/src", f"-I{src}/core/src",
            f"-I{src}/tpls/desul/include", f"-I{src}/tpls/mdspan/include", f"-I{inc}",
            f"-I{ROOT}/core/include", f"-I{ROOT}/backends/include"]


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    r = subprocess.run(["c++filt"], input="\n".join(names), text=True, capture_output=True)
    return dict(zip(names, r.stdout.splitlines()))


KERNEL_RE = re.compile(r"kfa::impl::(\w+)<Kokkos::Cuda,")


def template_args(text, start):
    """The top-level template arguments of the template whose '<' is at text[start]."""
    args, depth, cur = [], 0, ""
    for ch in text[start:]:
        if ch == "<":
            depth += 1
            if depth == 1:
                continue
        elif ch == ">":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
        elif ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return args


def warp_suffix(match):
    """'64' or '64, dropout' from a register-resident kernel's template arguments."""
    return match.group(1) + (", dropout" if match.group(2) == "true" else "")


def short_name(demangled):
    """kfa's kernel class (ForwardKernel, KeyValueKernel...), or None for Kokkos' own; a
    backward kernel is named with the value type of its dQ view (the atomic path of a 16-bit
    type accumulates dQ in float, the query pass writes it in the input type)."""
    m = KERNEL_RE.search(demangled)
    if not m:
        return None
    # The register-resident kernels, one per head dim and dropout (its own kernel, so that the
    # common one holds no Philox): WarpKernel<64>, WarpKernel<64, dropout>, ...
    warp = re.search(r"::WarpKernel<(\d+), (true|false)>", demangled)
    if warp:  # ForwardKernel's register-resident kernel
        return f"WarpKernel<{warp_suffix(warp)}>"
    warp = re.search(r"::Kernel<(\d+), (true|false)>", demangled)
    if m.group(1) == "WarpKeyValueKernel" and warp:  # the register-resident backward
        return f"WarpKeyValueKernel<{warp_suffix(warp)}>"
    at = demangled.find("kfa::impl::BackwardViews<")
    if at >= 0:
        views = template_args(demangled, at + len("kfa::impl::BackwardViews"))
        dq = re.search(r"View<([\w:]+)\*", views[5]) if len(views) > 5 else None
        if dq:
            return f"{m.group(1)} (dQ {dq.group(1).split('::')[-1]})"
    return m.group(1)


def parse_ptxas(text):
    """{mangled entry: dict(regs, stack, spill_st, spill_ld, smem)} from -Xptxas -v output."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = out.setdefault(m.group(1), dict(regs=0, stack=0, spill_st=0, spill_ld=0,
                                                  smem=0))
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


SIXTEEN_BYTE = re.compile(r"\bld\.(global|shared)[.\w]*\.(v4\.[bfsu]32|v2\.[bfsu]64)\b|"
                          r"\bcp\.async\.c[ag]\.shared\.global(\.\w+)* \[[^]]+\], \[[^]]+\], 16")


def instructions(body):
    """The PTX statements of a function body (labels, directives and braces left out), with
    the line index of each label."""
    stmts, labels = [], {}
    for line in body:
        s = line.split("//")[0].strip()
        if not s or s in ("{", "}"):
            continue
        if s.endswith(":"):
            labels[s[:-1]] = len(stmts)
            continue
        if s.startswith("."):
            continue
        stmts.append(s)
    return stmts, labels


def parse_ptx(text):
    """{mangled entry: counts} for every .entry in a PTX file."""
    out, lines, i = {}, text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"\s*(?:\.\w+\s+)*\.entry\s+(\w+)", lines[i])
        if not m:
            i += 1
            continue
        name, depth, body, started = m.group(1), 0, [], False
        while i < len(lines):
            line = lines[i]
            depth += line.count("{") - line.count("}")
            started = started or "{" in line
            body.append(line)
            i += 1
            if started and depth == 0:
                break
        stmts, labels = instructions(body)
        is_mma = [s.startswith("mma.sync") or " mma.sync" in s for s in stmts]
        # Loops: a branch to a label at or before it closes a loop [label, branch].
        loops = []
        for at, s in enumerate(stmts):
            b = re.search(r"\bbra(?:\.uni)?\s+(\$?\w+);", s)
            if b and b.group(1) in labels and labels[b.group(1)] <= at:
                lo = labels[b.group(1)]
                loops.append((at - lo + 1, sum(is_mma[lo:at + 1])))
        # The loop that spends the fewest instructions per mma.sync: the innermost product
        # loop of a design that builds fragments in loops, the key-tile loop of one whose
        # tile step is unrolled.
        with_mma = sorted((l for l in loops if l[1] > 0), key=lambda l: l[0] / l[1])
        out[name] = dict(
            instructions=len(stmts), mma=sum(is_mma),
            ldmatrix=sum(s.startswith("ldmatrix") for s in stmts),
            cp_async=sum(bool(re.match(r"cp\.async\.c[ag]", s)) for s in stmts),
            ld16=sum(bool(SIXTEEN_BYTE.search(s)) for s in stmts),
            loop=with_mma[0] if with_mma else None)
    return out


def teams_per_sm(arch, regs, scratch, static_smem):
    sm = SM[arch]
    warps = TEAM_THREADS // 32
    regs_per_warp = -(-regs * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = sm["regs"] // (regs_per_warp * warps) if regs else sm["blocks"]
    # Kokkos 4.6's team launch adds (team_size + 2) doubles of its own to the team scratch.
    shared = scratch + 8 * (TEAM_THREADS // 32 + 2) + static_smem + SMEM_RESERVED_PER_BLOCK
    by_smem = sm["smem"] // shared
    by_threads = sm["threads"] // TEAM_THREADS
    return by_regs, by_smem, min(by_regs, by_smem, by_threads, sm["blocks"])


def report_arch(arch, nvcc, src, cache, work, jobs, warp_tiles):
    build = kokkos_configure(src, cache, arch)
    inc = work / "include"
    config_header(inc, warp_tiles)
    flags = [nvcc, "-x", "cu", "-std=c++17", "-extended-lambda", "-expt-relaxed-constexpr",
             f"-arch=sm_{arch}", *include_flags(src, build, inc)]
    procs = {}
    for tname, ctype in TYPES.items():
        d = work / f"sm{arch}-{tname}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "kernels.cu").write_text(kernels_source(tname, ctype))
        cmd = flags + ["-O3", "-DNDEBUG", "-Xptxas", "-v", "-keep", "-keep-dir", str(d), "-c",
                       str(d / "kernels.cu"), "-o", str(d / "kernels.o")]
        procs[tname] = (d, subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT))
        if len([p for _, p in procs.values() if p.poll() is None]) >= jobs:
            procs[tname][1].wait()
    (work / "probe.cu").write_text(probe_source())
    probe = run(flags + ["-O1", str(work / "probe.cu"), "-o", str(work / f"probe{arch}")])
    if probe.returncode != 0:
        fail(2, f"the scratch probe did not compile for sm_{arch}:\n{probe.stdout}{probe.stderr}")
    scratch = {}
    for line in run([str(work / f"probe{arch}")]).stdout.splitlines():
        t, d, f, warp, kv, q, warp_bwd, warp_bwd_dropout = line.split()
        scratch[(t, int(d))] = dict(ForwardKernel=int(f), KeyValueKernel=int(kv),
                                    QueryKernel=int(q))
        if int(warp):  # the forward's scratch is the same with dropout
            for suffix in (f"{d}", f"{d}, dropout"):
                scratch[(t, int(d))][f"WarpKernel<{suffix}>"] = int(warp)
        if int(warp_bwd):
            scratch[(t, int(d))][f"WarpKeyValueKernel<{d}>"] = int(warp_bwd)
            scratch[(t, int(d))][f"WarpKeyValueKernel<{d}, dropout>"] = int(warp_bwd_dropout)
    rows = []
    for tname, (d, p) in procs.items():
        log = p.communicate()[0]
        if p.returncode != 0:
            fail(2, f"kfa's {tname} kernels no longer compile for sm_{arch}:\n{log[-6000:]}")
        res = parse_ptxas(log)
        ptx = {}
        for f in d.glob("*.ptx"):
            ptx.update(parse_ptx(f.read_text()))
        names = demangle(sorted(res))
        for mangled, r in res.items():
            kernel = short_name(names[mangled])
            if kernel is None:
                continue
            row = dict(type=tname, kernel=kernel, **r, **ptx.get(mangled, {}))
            if row not in rows:  # the same kernel instantiated twice (identical figures)
                rows.append(row)
    return rows, scratch


def markdown(arch, rows, scratch):
    out = [f"### {SM[arch]['name']}", "",
           "| type | kernel | regs | spill B (st/ld) | stack B | PTX instr | mma.sync | "
           "ldmatrix | cp.async | 16-B loads | instr per mma (kernel) | "
           "instr per mma (best mma loop) |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (list(TYPES).index(r["type"]), r["kernel"])):
        mma = r.get("mma", 0)
        per = f"{r['instructions'] / mma:.0f}" if mma else "-"
        loop = r.get("loop")
        inner = f"{loop[0] / loop[1]:.0f} ({loop[0]} / {loop[1]})" if loop else "-"
        out.append(f"| {r['type']} | {r['kernel']} | {r['regs']} | {r['spill_st']}/"
                   f"{r['spill_ld']} | {r['stack']} | {r.get('instructions', '-')} | {mma} | "
                   f"{r.get('ldmatrix', '-')} | {r.get('cp_async', '-')} | {r.get('ld16', '-')} | "
                   f"{per} | {inner} |")
    out += ["", "Team scratch (bytes) and teams per SM (from registers / shared memory / both "
            "with the thread and block limits):", "",
            "| type | kernel | " + " | ".join(f"d={d}" for d in HEAD_DIMS) + " |",
            "| --- | --- | " + " | ".join("---:" for _ in HEAD_DIMS) + " |"]
    for r in sorted(rows, key=lambda r: (list(TYPES).index(r["type"]), r["kernel"])):
        kernel = r["kernel"].split(" (")[0]
        if not any(kernel in scratch.get((r["type"], d), {}) for d in HEAD_DIMS):
            continue
        cells = []
        for d in HEAD_DIMS:
            s = scratch[(r["type"], d)].get(kernel)
            if s is None:  # a kernel of one head dim
                cells.append("-")
                continue
            by_regs, by_smem, teams = teams_per_sm(arch, r["regs"], s, r["smem"])
            cells.append(f"{s} ({by_regs}/{by_smem}/{teams})")
        out.append(f"| {r['type']} | {r['kernel']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive_dir", type=Path)
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fail-on-spill", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-warp-tiles", action="store_true",
                    help="compile without KFA_CUDA_WARP_TILES, KFA_CUDA_TF32X3 and "
                         "KFA_CUDA_WARP_BACKWARD (the "
                         "tile path alone, as -DKFA_CUDA_WARP_TILES=OFF builds it)")
    a = ap.parse_args()
    # Absolute: the patch is applied from inside the unpacked tree, where a relative archive
    # folder names nothing.
    a.archive_dir = a.archive_dir.resolve()
    nvcc = find_nvcc()
    if nvcc is None:
        fail(3, "no nvcc on PATH or in /usr/local/cuda/bin")
    if not (a.archive_dir / f"{KOKKOS}.tar.xz").exists():
        fail(3, f"no {a.archive_dir / (KOKKOS + '.tar.xz')}")
    os.environ["PATH"] = f"{Path(nvcc).parent}:{os.environ['PATH']}"
    cache = Path(os.environ.get("KFA_CI_CACHE",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                / "kfa-ci"))
    cache.mkdir(parents=True, exist_ok=True)
    src = kokkos_source(a.archive_dir, cache)
    version = run([nvcc, "--version"]).stdout.strip().splitlines()[-1]
    text = [f"nvcc: {version}; Kokkos 4.6.01 configured for CUDA + Serial (not built); "
            "KFA_CUDA_WARP_TILES, KFA_CUDA_TF32X3 and KFA_CUDA_WARP_BACKWARD "
            f"{'off' if a.no_warp_tiles else 'on'}.",
            ""]
    spills = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in a.arch.split(","):
            rows, scratch = report_arch(arch, nvcc, src, cache, Path(tmp), a.jobs,
                                        not a.no_warp_tiles)
            text.append(markdown(arch, rows, scratch))
            spills += [f"sm_{arch} {r['type']} {r['kernel']}: {r['spill_st']} B"
                       for r in rows if r["spill_st"] or r["spill_ld"]]
    report = "\n".join(text)
    print(report)
    if a.out:
        a.out.write_text(report)
    if spills and a.fail_on_spill:
        fail(1, "kernels spill registers: " + "; ".join(spills))


if __name__ == "__main__":
    main()
