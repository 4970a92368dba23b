#!/usr/bin/env bash
# One GPU (an H100 of 80 GB or an H200), one device call of at most 9 minutes: Hugging Face families whose peak is
# predicted from what their forward was counted to keep (issue 56), none of them fitted on, at real size where one
# rank holds them (1.4B to 2.6B), and two cut to their first layers (Phi-3 mini's 8 of 32, Qwen1.5-MoE's 2 of 24),
# as Mistral 7B's 4 layers were (h200/39-hf): at stages 0 and 3 on 1 rank, with checkpointing and without, stage 3
# on 4 rehearsed ranks, and 3_offload. Run by run, most wanted first; each within its own limit, and none started
# that could not end before BUDGET_S (default 480 s) from the start, so that a call with the install stays under
# 9 minutes; one failure stops none of the others.     bash benchmarks/h200_families.sh OUT_DIR
# Its times, estimated from h200/39-hf (50 s for Llama 3.2 1B at stages 0 and 3 on 1 rank, 2 min on 4 rehearsed
# ranks): 7 runs, about 430 s on an H200. Each run's output in OUT_DIR/NAME.txt, run.sh's results folders in
# OUT_DIR/results.
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"
budget=$((SECONDS + ${BUDGET_S:-480}))
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
run() {  # run NAME LIMIT_S ARGS...: run.sh with ARGS, unless it could not end within the budget
  local name=$1 limit=$2; shift 2
  if (( SECONDS + limit > budget )); then echo "$name: skipped, ${limit} s would pass the budget"; return; fi
  LIMIT_S=$limit timed "$name" bash run.sh "$@"
}
run gemma2_r1 110 --model gemma-2-2b --ranks 1                               # softcaps, eager attention, window
run gpt2_r1_nock 80 --model gpt2-xl --ranks 1 --no-checkpoint              # Conv1D, learned positions, dropout
run neox_r1 70 --model pythia-1.4b --ranks 1                                # a parallel block, partial rotary
run olmo2_r4 110 --model olmo-2-1b --ranks 4 --stages 3                    # 4 rehearsed ranks, QK norms
run granite_r1_nock 90 --model granite-3.0-2b --ranks 1 --no-checkpoint    # attention dropout 0.1, multipliers
run phi3_r1_offload 80 --model benchmarks/models/phi-3-mini-4k-8layers.json --ranks 1 --stages "0 3_offload"
run qwenmoe_r1 80 --model benchmarks/models/qwen1.5-moe-a2.7b-2layers.json --ranks 1   # 60 experts, top 4
[ -d "$out/results" ] && tar czf "$out/results.tgz" -C "$out" results
