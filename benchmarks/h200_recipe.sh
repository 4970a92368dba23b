#!/usr/bin/env bash
# Issue 10 on one H200: the default run on 1 GPU, the learning-rate recipe in bf16 and fp32, and the 4- and
# 8-rank rehearsals. Every log lands under OUT_DIR; report.py reads the RESULT lines.
#   bash benchmarks/h200_recipe.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
export RESULTS=$out/results PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"; } > "$out/env.txt" 2>&1
one() { local name=$1; shift; timeout 240 python3 train_gpt.py "$@" > "$out/$name.log" 2>&1; echo "$name: exit $?"; }
{ time timeout 200 bash run.sh; } > "$out/run_1gpu.txt" 2>&1; echo "run.sh (1 GPU): exit $?"
# several single-rank runs share the GPU at once: their losses and memory are real, their speed is not
one fp32_s0 --stage 0 --dtype fp32 & one fp32_s3 --stage 3 --dtype fp32 &
one lr1.6e-5_s3 --stage 3 --lr 1.6e-5 & one lr6e-6_s3 --stage 3 --lr 6e-6 & wait
for n in 4 8; do
  { time timeout 240 bash run.sh --ranks $n; } > "$out/run_${n}ranks.txt" 2>&1; echo "run.sh --ranks $n: exit $?"
done
