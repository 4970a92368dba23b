#!/usr/bin/env bash
# One GPU (an H100 of 80 GB or an H200), one device call of at most 9 minutes: Hugging Face families whose peak is
# predicted from what their forward was counted to keep (issue 56), none of them fitted on: at real size where one
# rank holds them (Gemma 2 2B, GPT-2 XL, Pythia 1.4B, OLMo 2 1B, Granite 3.0 2B: 1.4B to 2.6B), and two cut to
# their first layers (Phi-3 mini's 8 of 32, Qwen1.5-MoE-A2.7B's 2 of 24), as Mistral 7B's 4 layers were
# (h200/39-hf): stages 0, 3 and 3_offload, checkpointing on and off, 1 rank and 4 rehearsed. Run by run, those that
# h100/7-families did not run or finish first; each within its own limit, set from h200/46-families' host, the
# slower of the two that ran them (phi3's holds the 53 s in which a fresh machine builds CPU Adam: olmo2's, a
# rehearsal, builds none since 7ba7e64), and none started that could not end within BUDGET_S (default 480 s) of the
# start, so that a call with its setup (15 s in 41-hf-rest) stays under 9 minutes; one failure stops no other.
# SKIP="NAME ..." leaves out runs that an earlier call finished.
# The limits add up to 980 s: two calls, the second with SKIP naming what the first finished.
# Each run's output in OUT_DIR/NAME.txt, run.sh's results folders in OUT_DIR/results and results.tgz. Its wheels,
# with these families' transformers code: bash benchmarks/device_wheels.sh, then in one call (carry .whl):
#   source .whl/device-setup.sh && bash benchmarks/h200_families.sh $OUT; rm -rf $OUT/results
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"
budget=$((SECONDS + ${BUDGET_S:-480}))
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
run() {  # run NAME LIMIT_S ARGS...: run.sh with ARGS, unless SKIP names it or it could not end within the budget
  local name=$1 limit=$2; shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then echo "$name: skipped (SKIP)"; return; fi
  if (( SECONDS + limit > budget )); then echo "$name: skipped, ${limit} s would pass the budget"; return; fi
  LIMIT_S=$limit timed "$name" bash run.sh "$@"
}
run olmo2_r4 240 --model olmo-2-1b --ranks 4 --stages 3                    # 4 rehearsed ranks, QK norms
run phi3_r1_offload 160 --model benchmarks/models/phi-3-mini-4k-8layers.json --ranks 1 --stages 3_offload
run gpt2_r1_nock 130 --model gpt2-xl --ranks 1 --no-checkpoint              # Conv1D, learned positions, dropout
run gemma2_r1 160 --model gemma-2-2b --ranks 1                               # soft-caps: eager attention
run qwenmoe_r1 110 --model benchmarks/models/qwen1.5-moe-a2.7b-2layers.json --ranks 1     # 60 experts, top 4
run neox_r1 90 --model pythia-1.4b --ranks 1 --stages 3                    # a parallel block, partial rotary
run granite_r1_nock 90 --model granite-3.0-2b --ranks 1 --stages 0 --no-checkpoint  # attention dropout 0.1
[ -d "$out/results" ] && tar czf "$out/results.tgz" -C "$out" results
