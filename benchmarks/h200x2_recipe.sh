#!/usr/bin/env bash
# Issues 10 and 11 on 2 H200s: the default run over NCCL, its cost of checkpointing, fp32, the original
# design's config as it is (fp16, DeepSpeed's AdamW), FSDP2 beside it, and 8 ranks rehearsed on the 2 GPUs.
#   bash benchmarks/h200x2_recipe.sh OUT_DIR a|b
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
export RESULTS=$out/results PYTHONUNBUFFERED=1
timed() { local name=$1; shift; { time timeout 250 "$@"; } > "$out/$name.txt" 2>&1; echo "$name: exit $?"; }
case $2 in
  a) nvidia-smi topo -m > "$out/env.txt" 2>&1
     timed run_2gpus bash run.sh
     timed run_2gpus_no_checkpoint bash run.sh --no-checkpoint
     timed run_2gpus_fp32 bash run.sh --dtype fp32 ;;
  b) timed original_design deepspeed --num_gpus 2 train_gpt.py --config benchmarks/original_design.json
     timed fsdp2_mb2 torchrun --nproc_per_node 2 benchmarks/baselines.py --mode fsdp2 --micro-batch 2 --steps 6
     timed run_8ranks bash run.sh --ranks 8 ;;
esac
