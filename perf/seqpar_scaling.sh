#!/usr/bin/env bash
# Strong scaling of kfa-seqpar at 1 and 2 ranks: forward and backward, ring and tree, causal
# and not, B=1 H=1 D=64 float, N = 8192, 16384, 32768 (zigzag layout, so causal work is
# balanced). One JSON line per run on stdout; perf/seqpar_model.py turns them into the table
# and the model's plot.
#   usage: perf/seqpar_scaling.sh BUILD_DIR > results.jsonl
# Needs the machine to itself: the two ranks take one core each.
set -euo pipefail
build=${1:?usage: seqpar_scaling.sh BUILD_DIR}
run() { mpiexec --allow-run-as-root --oversubscribe -n "$@" | grep '^{'; }
for pass in forward backward; do
  for n in 8192 16384 32768; do
    repeat=$([ "$n" -ge 32768 ] && echo 2 || echo 3)
    for causal in "" "--causal"; do
      for mode in ring tree; do
        for p in 1 2; do
          run "$p" "$build/apps/kfa-seqpar" "$pass" --random "1,1,$n,64" --mode "$mode" \
            --layout zigzag $causal --repeat "$repeat" --json
        done
      done
    done
  done
done
