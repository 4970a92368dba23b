#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md, in groups that fit one device call each:
#   bash benchmarks/h200_suite.sh OUT_DIR GROUP ...
# GROUP: tests env verdicts rehearsal checkpoint lr stage3 mfu fusedadam compile baselines
# On the device machine: bash benchmarks/h200_suite.sh "$OUT" tests (one call: the suite must end within 10 minutes)
# Every run's log lands under OUT_DIR; report.py reads the RESULT lines (grep reads only PASSED_IN's PASSED ones).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
mkdir -p "$out"
export RESULTS=$out/results PYTHONUNBUFFERED=1
ds() { local name=$1; shift; timeout 300 deepspeed --num_gpus 1 train_gpt.py "$@" > "$out/$name.log" 2>&1; echo "$name: exit $?"; }
for group in "$@"; do
  case $group in
    tests)  # the README's test command, read from it and run as a new user runs it (no RESULTS), the GPUs it saw at
            # the top; interrupted short of the device call's 10 minutes (SIGINT: pytest prints its counts, not
            # always its names), so that what ran stays in the log; then the results folders of the GPU launches
            # (tests/test_gpu.py). Under ZERO3BENCH_REQUIRE_GPU=1 a GPU that torch does not see fails the tests
            # marked gpu, not skips them. Each test's outcome on its own line (-vv over the command's -q), since a
            # cut suite prints no summary of names. PASSED_IN=LOG (a cut run's tests.txt of the same tree, which its
            # digest of the code and tests shows): the tests that passed there are deselected (their nodeids without
            # the @group that -vv adds under loadgroup), so that two calls run the whole suite on a host too slow for
            # one, the second launching only its tests' runs
      command=$(grep -m 1 -x 'python3 -m pip install .* tests' README.md)
      digest=$(find ./*.py ./*.sh ./*.json ./*.txt zero3bench tests configs -type f -not -path '*/__pycache__/*' -print0 |
               sort -z | xargs -0 sha1sum | sha1sum | cut -c1-16)
      if [ -n "${PASSED_IN:-}" ]; then
        grep -qx "tree digest: $digest" "$PASSED_IN" ||
          { echo "PASSED_IN=$PASSED_IN ran on another tree (not its 'tree digest: $digest'): run the whole suite"; exit 2; }
        grep -oP '(?<= PASSED )tests/.*?(?= *$)' "$PASSED_IN" | sed -E 's/@[A-Za-z0-9_-]+$//; s/^/--deselect=/' > /tmp/passed_before.txt
        [ -s /tmp/passed_before.txt ] || { echo "PASSED_IN=$PASSED_IN names no passed test (a log of -vv)"; exit 2; }
        echo "tests: $(wc -l < /tmp/passed_before.txt) that passed in $PASSED_IN deselected"
        command="$command @/tmp/passed_before.txt"
      fi
      export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -vv --durations=30"
      { nvidia-smi -L; echo "tree digest: $digest"
        echo "PYTEST_ADDOPTS=$PYTEST_ADDOPTS ZERO3BENCH_REQUIRE_GPU=1 PASSED_IN=${PASSED_IN:-}"; echo "\$ $command"
        time env -u RESULTS ZERO3BENCH_REQUIRE_GPU=1 timeout -s INT -k 20 "${SUITE_S:-575}" bash -c "$command"; } > "$out/tests.txt" 2>&1
      echo "tests: exit $?"
      # a cut suite prints no counts: those of -vv's lines, at the log's end
      echo "outcomes printed: $(for o in PASSED FAILED ERROR SKIPPED; do echo -n "$(grep -c " $o tests/" "$out/tests.txt") $o "; done)" \
        >> "$out/tests.txt"
      launched=/tmp/pytest-of-$(id -un)/pytest-current
      tar czf "$out/gpu_launches.tgz" -C "$launched" $(cd "$launched" && find . -maxdepth 2 -type d -name 'gpu_*') ;;
    env)
      { nvidia-smi; python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__)"
        echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-}"; nproc; free -g; } > "$out/env.txt" 2>&1
      python3 benchmarks/vocab_probe.py >> "$out/env.txt" 2>&1 ;;
    verdicts)  # run.sh on one GPU, and rehearsing 4 ranks on it, timed
      { time timeout 280 bash run.sh; } > "$out/run_1gpu.txt" 2>&1; echo "run.sh: exit $?"
      { time timeout 280 bash run.sh --ranks 4; } > "$out/run_4ranks.txt" 2>&1; echo "run.sh --ranks 4: exit $?" ;;
    rehearsal)  # N ranks sharing the one GPU
      for n in 2 8; do { time timeout 280 bash run.sh --ranks $n; } > "$out/run_${n}ranks.txt" 2>&1; echo "run.sh --ranks $n: exit $?"; done ;;
    lr)  # the learning rate that makes the loss fall at each of the first 3 steps
      for lr in 1e-5 1.5e-5 2e-5; do ds "lr${lr}_s0_mb2" --stage 0 --lr $lr; done
      for lr in 1e-5 2e-5; do ds "lr${lr}_s0_mb8" --stage 0 --lr $lr --micro-batch 8; done ;;
    stage3)  # ZeRO-3 on one rank (commit 144abf2 also ran each with and without --gather-per-block,
             # since made the default and removed)
      for mb in 2 16; do ds "s3_mb${mb}" --stage 3 --micro-batch $mb --steps 6; done ;;
    mfu)  # micro batch sweep, one rank
      for mb in 16 32; do ds "mfu_s0_mb${mb}" --stage 0 --micro-batch $mb --steps 6; done
      ds "mfu_s3_mb32" --stage 3 --micro-batch 32 --steps 6 ;;
    checkpoint)  # the 4-rank rehearsal with activation checkpointing, and fp32 trajectories at both stages
      { time timeout 200 bash run.sh --ranks 4 --checkpoint; } > "$out/run_4ranks_checkpoint.txt" 2>&1; echo "run.sh --ranks 4 --checkpoint: exit $?"
      for st in 0 3; do ds "fp32_s$st" --stage $st --dtype fp32; done ;;
    fusedadam)  # stage 0 with DeepSpeed's JIT-built FusedAdam instead of torch's fused AdamW
      python3 -c "import json; c = json.load(open('ds_config_stage0.json')); c['optimizer'] = {'type': 'AdamW', 'params': {'lr': 3e-5, 'betas': [0.9, 0.95], 'weight_decay': 0.1}}; json.dump(c, open('$out/ds_config_stage0_fusedadam.json', 'w'))"
      for mb in 2 16; do ds "fusedadam_s0_mb${mb}" --config "$out/ds_config_stage0_fusedadam.json" --micro-batch $mb --steps 8; done ;;
    compile)
      for mb in 2 16; do for st in 0 3; do ds "compile_s${st}_mb${mb}" --stage $st --micro-batch $mb --steps 8 --compile; done; done ;;
    baselines)
      for mb in 2 8 16; do
        timeout 300 python3 benchmarks/baselines.py --mode plain --micro-batch $mb > "$out/baseline_plain_mb$mb.log" 2>&1; echo "plain mb$mb: exit $?"
        timeout 300 torchrun --nproc_per_node 1 benchmarks/baselines.py --mode fsdp2 --micro-batch $mb > "$out/baseline_fsdp2_mb$mb.log" 2>&1; echo "fsdp2 mb$mb: exit $?"
      done ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
