#!/usr/bin/env bash
# One GPU (H200 or H100, 16 cores), one device call of about 7 minutes (BUDGET_S=420 of runs): offload's step at
# world 1 planned from the README's calibrating command alone, against offload runs measured on the same machine
# (issue 57, item 2). Each run on a GPU of its own times its host pass after training
# (zero3bench/accounting/hostpass.py), and the plan takes it from the calibrating runs. In the order of what they tell, each started while 60 s of the budget
# are left, and stopped at the end of it (run.sh keeps what finished):
# 1. 1.3b: the README's command (stages 0 and 3, micro batch 16, 30 steps); its first run JIT-builds CPU Adam
# 2. the host pass alone (benchmarks/host_pass_rate.py): linear in the elements from 2^22 to 2^27? by threads
# 3. 1.3b: 3_offload and 3_infinity at micro batch 8, 3_offload at 2 (issue 57's rows), 7 steps (steady: 4 to 6)
# 4. 2.7b: the README's command at 12 steps (8 steady), then 3_offload and 3_infinity at micro batch 8, 7 steps
# Left out to fit: the offload runs at micro batch 16 (their passes are stage 3's, which the plan holds within 11%
# at world 1), 3_infinity at micro batch 2, and 2.7b at 2 and 16. Then benchmarks/plan_offload_check.py per model:
# planned against measured, in check_MODEL.txt. Results folders as results.tgz.
#   bash benchmarks/h200_offload_step.sh OUT_DIR        (MODELS=tiny BUDGET_S=300: the plumbing on a CPU rank)
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"
end=$((SECONDS + ${BUDGET_S:-420}))
step() {  # NAME LIMIT_S COMMAND ...: within the budget left, and only where 60 s of it are
  local name=$1 left=$((end - SECONDS)); shift
  [ "$left" -ge 60 ] || { echo "$name: skipped, $left s of the budget left"; return; }
  LIMIT_S=$((left < $1 ? left : $1)) timed "$name" "${@:2}"
}
read -r small large <<< "${MODELS:-1.3b 2.7b}"
step "cal_$small" 200 bash run.sh --ranks 1 --steps 30 --micro-batch 16 --model "$small"
step host_pass_rate 60 python3 benchmarks/host_pass_rate.py --log2-sizes 22 27
step "off_${small}_mb8" 130 bash run.sh --ranks 1 --steps 7 --micro-batch 8 --model "$small" \
  --stages "3_offload 3_infinity"
step "off_${small}_mb2" 70 bash run.sh --ranks 1 --steps 7 --micro-batch 2 --model "$small" --stages 3_offload
if [ -n "$large" ]; then
  step "cal_$large" 110 bash run.sh --ranks 1 --steps 12 --micro-batch 16 --model "$large"
  step "off_${large}_mb8" 200 bash run.sh --ranks 1 --steps 7 --micro-batch 8 --model "$large" \
    --stages "3_offload 3_infinity"
fi
for model in $small $large; do
  cal=$(grep -m1 -o "^results: [^ ]*" "$out/cal_$model.txt" 2> /dev/null | cut -d' ' -f2)
  [ -n "$cal" ] || { echo "check_$model: no calibrating folder"; continue; }
  python3 benchmarks/plan_offload_check.py "$cal" "$out/results" > "$out/check_$model.txt" 2>&1
  echo "check_$model: exit $?"
  cat "$out/check_$model.txt"
done
tar czf "$out/results.tgz" -C "$out" results
