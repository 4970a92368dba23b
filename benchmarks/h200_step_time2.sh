#!/usr/bin/env bash
# One H200, one device call (<= 560 s with setup): what issue 47's step-time calibration still lacks at world 1,
# 8 steps (steady from step 4). Stages 1 and 2 run as stage 0 at world 1 (36-step-time: within 12% at mb2, 1% at
# mb16), and 3_offload's step hardly moves with the micro batch (1.590 s at mb2, 1.616 s at mb16), so to fit they
# run once each where they are least known. Dropped: mb8 3_offload; mb2 --no-checkpoint 1, 2, 3_offload;
# mb8 --no-checkpoint 1, 2, 3_infinity, 3_offload; mb16 --no-checkpoint 1, 2. Results folders as results.tgz.
#   bash benchmarks/h200_step_time2.sh OUT_DIR
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"
run() { LIMIT_S=$1 timed "$2" bash run.sh --ranks 1 --steps 8 "${@:3}"; }
run 200 mb8 --micro-batch 8 --stages "0 1 2 3 3_infinity"
run 230 mb16nock --micro-batch 16 --no-checkpoint --stages "0 3 3_infinity 3_offload"
run 110 mb2nock --micro-batch 2 --no-checkpoint --stages "0 3 3_infinity"
run 60 mb8nock --micro-batch 8 --no-checkpoint --stages "0 3"
tar czf "$out/results.tgz" -C "$out" results
