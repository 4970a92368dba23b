#!/usr/bin/env bash
# One H200, one device call (about 300 s of runs): (c)'s comparison of the trained weights' squares on a GPU,
# where it was changed on CPU ranks alone (benchmarks/logs/cpu/verdict/weights-squared): the default run (4
# rehearsed ranks, bf16), fp16 on 2 (its loss scaler skips the first steps) and fp32 on 2.
# Results folders as results.tgz.   bash benchmarks/h200_weights.sh OUT_DIR
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"
LIMIT_S=160 timed default_r4 bash run.sh
LIMIT_S=120 timed fp16_r2 bash run.sh --ranks 2 --dtype fp16
LIMIT_S=120 timed fp32_r2 bash run.sh --ranks 2 --dtype fp32
tar czf "$out/results.tgz" -C "$out" results
