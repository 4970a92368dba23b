#!/usr/bin/env bash
# The one-GPU runs behind the verdict's evidence (issue 21) and the interruption check (issue 22), in groups
# that fit one device call each:   bash benchmarks/h200_verdict.sh OUT_DIR GROUP ...
# GROUP: before (the old code's `bash run.sh`, from .before/), timing (the default, --ranks 1), interrupt,
# seeds1 (20 seeds at 1 rank, 5 at a time), seeds4 (the 4-rank rehearsal of 5 seeds, two at a time). Runs that
# share the GPU share its time too: their speeds mean nothing, their memory per rank and losses are real.
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"; shift
for group in "$@"; do
  case $group in
    before) (cd .before && RESULTS=$out/results-before timed before_default bash run.sh) ;;
    timing) timed default bash run.sh; timed ranks1 bash run.sh --ranks 1 ;;
    interrupt)
      timeout 120 python3 benchmarks/interrupt_gpu.py "$out/interrupt_ranks1.txt" --ranks 1; echo "interrupt 1: $?"
      timeout 200 python3 benchmarks/interrupt_gpu.py "$out/interrupt_default.txt"; echo "interrupt 4: $?" ;;
    seeds1)
      for wave in "0 1 2 3 4" "5 6 7 8 9" "10 11 12 13 14" "15 16 17 18 19"; do
        for seed in $wave; do timed "seed${seed}_ranks1" bash run.sh --ranks 1 --seed "$seed" & done; wait
      done ;;
    seeds4)  # each starts once the one before is at stage 3: one stage 0 (4 x 24.5 GiB) on the GPU at a time
      for seed in 2 5 13 14 15; do
        timed "seed${seed}_ranks4" bash run.sh --seed "$seed" &
        until grep -qs "== stage3" "$out/seed${seed}_ranks4.txt" || ! kill -0 $! 2> /dev/null; do sleep 1; done
      done; wait ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
