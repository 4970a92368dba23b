#!/usr/bin/env bash
# One H200: today's default run.sh (4 rehearsed ranks), then issue 47's step-time calibration at world 1: stages 0-3,
# 3_offload and 3_infinity, 12 steps (steady from step 4), at each micro batch given, checkpointing on (the default)
# or off (a micro batch written "16nock"). Results folders as results.tgz beside the logs.
#   bash benchmarks/h200_step_time.sh OUT_DIR [default] [MB | MBnock] ...
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"; shift
for what in "$@"; do
  case $what in
    default) timed default bash run.sh ;;
    *nock) LIMIT_S=400 timed "mb$what" bash run.sh --ranks 1 --steps 12 --micro-batch "${what%nock}" --no-checkpoint \
             --stages "0 1 2 3 3_offload 3_infinity" ;;
    *) LIMIT_S=400 timed "mb$what" bash run.sh --ranks 1 --steps 12 --micro-batch "$what" \
         --stages "0 1 2 3 3_offload 3_infinity" ;;
  esac
done
tar czf "$out/results.tgz" -C "$out" results
