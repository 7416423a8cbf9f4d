#!/usr/bin/env bash
# The GPU checks of a CUDA build of kfa in one go, each step held to a share of a time budget.
#
#   perf/gpu_check.sh BUILD RESULTS [SECONDS [COMPARE]]
#
# BUILD: a CUDA build of kfa (tests and benchmarks on, KFA_TEST_SPACES=CUDA), either the build
# folder itself or the same layout made elsewhere (tests/test_*, perf/bench_gpu, CMakeCache.txt,
# and lib/ with the CUDA runtime when the GPU machine's is not on its library path). The build
# can come from a machine without a GPU: nvcc compiles for the GPU's architecture
# (Kokkos_ARCH_HOPPER90 / AMPERE80) without one. SECONDS (default 540) bounds the whole run;
# each step gets its own share and is cut at it, so one slow step leaves the others their time.
# COMPARE: "all" (default), "forward" (step 5's forward comparison only), "narrow" (bf16 and
# half only: the forward, then the backward and forward + backward), "dropout" (bf16 with
# dropout p = 0.1 on both sides: the register kernels' dropout forms against SDPA's) or
# "float" (the float forward alone: the 3xTF32 register kernel against the FP32 peak) or
# "workspace" (bench_gpu's bf16 backward, one binary, alternately with KFA_WORKSPACE_CACHE=0 and
# 1, three rounds: what the pool of temporaries saves per call, kfa/workspace.hpp).
#
# Steps, each writing under RESULTS (logs/ and results/, then tarred as logs.tar.gz and
# results.tar.gz after every step, so a run cut short still leaves what it finished):
# 1. the GPU and its driver (nvidia-smi);
# 2. every test suite on the device, 8 at a time (the float64 oracle runs on the host), with
#    a pass/fail line each in summary.txt;
# 3. compute-sanitizer racecheck and memcheck on one 16-bit forward suite case and two backward
#    ones (the register kernels' shapes, then head dims that take the tile kernels too),
#    racecheck on the dropout case (the register kernels' dropout forms) and on a float forward
#    case (the 3xTF32 kernel at D = 64), each run cut at its share;
# 4. the kernels' resources (cuobjdump --dump-resource-usage) and the SASS instruction mix per
#    kernel (HMMA, LDSM, LDGSTS, LDS, STS, BAR, MUFU, all);
# 5. perf/compare_gpu.py against PyTorch's SDPA: the forward (bf16, half, float) first, then
#    the backward and forward + backward (bf16, float), N = 1024, 4096, 16384, D = 64, 128,
#    causal and not, 16k tokens x 16 heads.
# With KFA_GPU_CHECK_ARCHIVES_ONLY=1 the run ends by removing logs/ and results/, leaving
# summary.txt, logs.tar.gz and results.tar.gz (for a way back from the GPU machine that carries
# only a few files).
# Exit status: 0 when every suite passed and no step failed or was cut, 1 otherwise, 2 on bad
# arguments.
set -u
usage() {
  echo "usage: $0 BUILD RESULTS [SECONDS [all|forward|narrow|dropout|float|workspace]]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "gpu_check: no folder $1" >&2; exit 2; }
OUT=$2
BUDGET=${3:-540}
COMPARE=${4:-all}
case $BUDGET in '' | *[!0-9]*) usage ;; esac
case $COMPARE in all | forward | narrow | dropout | float | workspace) ;; *) usage ;; esac
[ -x "$BUILD/perf/bench_gpu" ] || { echo "gpu_check: no $BUILD/perf/bench_gpu" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/logs" "$OUT/results" || exit 2
SUMMARY=$OUT/summary.txt
status=0
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
# A step's limit in seconds, at least 1 (timeout 0 would mean no limit).
cap() { local c=$1; [ "$c" -ge 1 ] && echo "$c" || echo 1; }
say() { echo "$*" | tee -a "$SUMMARY"; }
pack() {  # fails when either archive could not be written
  tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs 2>/dev/null &&
    tar -C "$OUT" -czf "$OUT/results.tar.gz" results 2>/dev/null
}
export LD_LIBRARY_PATH=$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1

say "== GPU ($(date -u +%FT%TZ))"
timeout 30 nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
  2>&1 | tee -a "$SUMMARY"
# Which kernels the build holds (KFA_CUDA_WARP_TILES, KFA_CUDA_TF32X3, KFA_CUDA_WARP_BACKWARD,
# KFA_CUDA_TF32).
say "build options: $(grep -E '^KFA_CUDA_[A-Z0-9_]+:' "$BUILD/CMakeCache.txt" 2>/dev/null |
  tr '\n' ' ')"

say "== tests on the device ($(left) s left)"
# Each suite its own process (a crash ends one suite, not the step), 8 at a time on one GPU;
# the whole step is cut at its share, each suite at the same limit.
find "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -name 'test_*' | sort >"$OUT/logs/suites.txt"
tests_cap=$(cap $(( BUDGET * 25 / 100 )))
run_suite() {  # SUITE LOGDIR CAP
  local s t0 rc
  s=$(basename "$1")
  t0=$(date +%s)
  timeout -k 5 "$3" "$1" --gtest_brief=1 >"$2/$s.log" 2>&1
  rc=$?
  echo "$s rc=$rc $(( $(date +%s) - t0 ))s $(grep -E '^\[  (PASSED|FAILED)  \]' "$2/$s.log" | tr '\n' ' ')"
  return $rc
}
export -f run_suite
timeout -k 5 "$tests_cap" xargs -P 8 -I{} bash -c 'run_suite "$1" "$2" "$3"' _ {} "$OUT/logs" \
  "$tests_cap" <"$OUT/logs/suites.txt" | sort | tee -a "$SUMMARY"
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; say "the test step failed or was cut"; }
grep -h '^\[  FAILED  \]' "$OUT"/logs/test_*.log 2>/dev/null | sort -u | head -40 | tee -a "$SUMMARY"
pack

say "== compute-sanitizer ($(left) s left)"
# 30 % of the budget over eight runs, each given an equal share of what the earlier ones left;
# the register kernels first (SplitsAndDropout: their dropout kernels; Forward.LargeLogits: the
# float kernel), the tile path's slower backward case last. A run is TOOL:SUITE:FILTER.
san_end=$(( $(date +%s) + BUDGET * 30 / 100 ))
narrow=test_narrow_cuda:NarrowTest/0
runs=(racecheck:$narrow.BackwardRegisterShapes racecheck:$narrow.ForwardHeadDimsAndSeqlens
  memcheck:$narrow.BackwardRegisterShapes memcheck:$narrow.ForwardHeadDimsAndSeqlens
  racecheck:$narrow.SplitsAndDropout racecheck:test_forward_cuda:Forward.LargeLogits
  racecheck:$narrow.BackwardHeadDims memcheck:$narrow.BackwardHeadDims)
if command -v compute-sanitizer >/dev/null && [ -x "$BUILD/tests/test_narrow_cuda" ]; then
  for i in "${!runs[@]}"; do
    tool=${runs[$i]%%:*}
    rest=${runs[$i]#*:}
    suite=${rest%%:*}
    f=${rest#*:}
    san_cap=$(cap $(( (san_end - $(date +%s)) / (${#runs[@]} - i) )))
    log=$OUT/logs/sanitizer-$tool-${f//[^A-Za-z0-9]/_}.log
    if [ ! -x "$BUILD/tests/$suite" ]; then
      status=1
      say "$tool $f: no $suite in the build"
      continue
    fi
    timeout -k 5 "$san_cap" compute-sanitizer --tool "$tool" --print-limit 20 \
      "$BUILD/tests/$suite" --gtest_filter="$f" >"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    say "$tool $f rc=$rc (${san_cap} s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$log" | tr '\n' ' ')"
  done
else
  say "no compute-sanitizer or no test_narrow_cuda: skipped"
fi
pack

say "== resources and SASS mix ($(left) s left)"
if command -v cuobjdump >/dev/null; then
  timeout -k 5 60 cuobjdump --dump-resource-usage "$BUILD/perf/bench_gpu" >"$OUT/logs/resources.txt" 2>&1
  timeout -k 5 60 cuobjdump --dump-sass "$BUILD/perf/bench_gpu" 2>/dev/null | awk '
    /Function :/ { fn = $3 }
    fn != "" && /\/\*[0-9a-f]+\*\// {
      n[fn]++
      for (i = 1; i <= NF; i++) if ($i ~ /^[A-Z][A-Z0-9_.]+$/ && $i !~ /^R[0-9]/) { op = $i; break }
      split(op, p, "."); c[fn, p[1]]++
    }
    END { for (f in n) printf "%s all=%d HMMA=%d LDSM=%d LDGSTS=%d LDS=%d STS=%d BAR=%d MUFU=%d\n",
            f, n[f], c[f,"HMMA"], c[f,"LDSM"], c[f,"LDGSTS"], c[f,"LDS"], c[f,"STS"], c[f,"BAR"], c[f,"MUFU"] }
  ' | sort >"$OUT/results/sass-mix.txt"
  say "$(grep -c . "$OUT/results/sass-mix.txt") kernels in results/sass-mix.txt"
else
  say "no cuobjdump on this machine"
fi
pack

compare() {  # NAME CAP compare_gpu.py args...
  local name=$1 limit rc
  limit=$(cap "$2")
  shift 2
  say "== compare $name ($(left) s left, $limit s for it)"
  timeout -k 10 "$limit" python3 "$HERE/compare_gpu.py" --build "$BUILD" --out-dir "$OUT/results" \
    --name "$name" --n 1024,4096,16384 --d 64,128 --causal 0,1 "$@" \
    >"$OUT/logs/compare-$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  say "rc=$rc $(grep -E 'PASS|MISS' "$OUT/logs/compare-$name.log" | tr '\n' ' ')"
  pack
}
if [ "$COMPARE" = forward ]; then
  compare gpu-forward $(( $(left) - 10 )) --passes fwd --types bf16,half,float
elif [ "$COMPARE" = narrow ]; then
  compare gpu-forward $(( $(left) * 35 / 100 )) --passes fwd --types bf16,half
  compare gpu-backward $(( $(left) - 10 )) --passes bwd,fwd_bwd --types bf16,half
elif [ "$COMPARE" = float ]; then
  compare gpu-float-forward $(( $(left) - 10 )) --passes fwd --types float
elif [ "$COMPARE" = workspace ]; then
  # The pool off (0) and on (1), alternating in one session; the same binary and cases.
  ws_cap=$(cap $(( ($(left) - 10) / 6 )))
  for round in 1 2 3; do
    for cache in 0 1; do
      log=$OUT/results/workspace-cache$cache-round$round.json
      KFA_WORKSPACE_CACHE=$cache timeout -k 5 "$ws_cap" "$BUILD/perf/bench_gpu" --n=1024,4096 \
        --d=64,128 '--benchmark_filter=BM_kfa_bwd<bf16>' --benchmark_min_time=0.2 \
        --benchmark_out="$log" --benchmark_out_format=json >"$OUT/logs/workspace-$cache-$round.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || status=1
      say "workspace cache=$cache round $round rc=$rc ($ws_cap s)"
    done
    pack
  done
elif [ "$COMPARE" = dropout ]; then
  compare gpu-dropout-forward $(( $(left) * 35 / 100 )) --passes fwd --types bf16 --dropout 0.1
  compare gpu-dropout-backward $(( $(left) - 10 )) --passes bwd,fwd_bwd --types bf16 --dropout 0.1
else
  compare gpu-forward $(( $(left) * 40 / 100 )) --passes fwd --types bf16,half,float
  compare gpu-backward $(( $(left) - 10 )) --passes bwd,fwd_bwd --types bf16,float
fi
say "== done ($(left) s left, status $status)"
if pack; then
  [ "${KFA_GPU_CHECK_ARCHIVES_ONLY:-0}" = 1 ] && rm -rf "$OUT/logs" "$OUT/results"
else
  say "the archives could not be written: logs/ and results/ kept"
  status=1
fi
exit $status
