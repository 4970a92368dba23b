#!/usr/bin/env bash
# Issue 10: the warm-up's first two rates on 2 H200s over NCCL, stage 3, in bf16 and fp32. The runs share
# the two GPUs at once: their losses are real, their speed is not.
#   bash benchmarks/h200x2_lr_sweep.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; mkdir -p "$out"; export PYTHONUNBUFFERED=1
port=29600
for dtype in bf16 fp32; do
  for recipe in "--lr 8e-6 --warmup 2" "--lr 1e-5 --warmup 2" "--lr 1.2e-5 --warmup 2" "--lr 5e-6 --warmup 0"; do
    name=$(echo "$dtype ${recipe% --warmup 2}" | tr -d ' -' ); port=$((port + 1))
    timeout 240 deepspeed --num_gpus 2 --master_port $port train_gpt.py --stage 3 --dtype $dtype $recipe --steps 4 \
      > "$out/$name.log" 2>&1 &
  done
done
wait
grep -H "first-step loss" "$out"/*.log
