#!/usr/bin/env bash
# Issues 10 to 12 on 2 H200s: the default run on 2 GPUs over NCCL and on 1 GPU, 4 and 8 ranks rehearsed on
# the 2 GPUs (2 and 4 ranks a GPU), fp32 on 2 GPUs, and the original design's config as it is (fp16,
# DeepSpeed's AdamW, train_batch_size 8).
#   bash benchmarks/h200x2_evidence.sh OUT_DIR 1|2|recipe
# (recipe made benchmarks/logs/h200x2/8-recipe-2gpus, when the default was a 2-step warm-up to 1e-5.)
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
export RESULTS=$out/results PYTHONUNBUFFERED=1
timed() { local name=$1; shift; { time timeout 280 "$@"; } > "$out/$name.txt" 2>&1; echo "$name: exit $?"; }
case $2 in
  1) nvidia-smi > "$out/env.txt" 2>&1; nvidia-smi topo -m >> "$out/env.txt" 2>&1
     timed run_2gpus bash run.sh
     CUDA_VISIBLE_DEVICES=0 timed run_1gpu bash run.sh
     timed run_4ranks bash run.sh --ranks 4 ;;
  2) timed run_8ranks bash run.sh --ranks 8
     timed run_2gpus_fp32 bash run.sh --dtype fp32
     timed original_design deepspeed --num_gpus 2 train_gpt.py --config benchmarks/original_design.json ;;
  recipe) nvidia-smi topo -m > "$out/env.txt" 2>&1
     timed run_2gpus bash run.sh
     timed run_2gpus_no_checkpoint bash run.sh --no-checkpoint
     timed run_2gpus_fp32 bash run.sh --dtype fp32 ;;
esac
