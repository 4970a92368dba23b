#!/usr/bin/env bash
# The first run on the GPU a user has (issue 62): where the default's time goes, in groups that fit one device call:
#   bash benchmarks/gpu_first_run.sh OUT_DIR GROUP ...
# GROUP: env (the card, the imports' time), default (bash run.sh, timed, with the GPU's processes sampled each second),
# ranks3 (bash run.sh --ranks 3, timed),
# before (bash run.sh at BEFORE, a checkout of the code before issue 62, as its default ran on an H200 and, on an H100,
# with --ranks 3, the most that fit), card40 and card24 (bash run.sh beside benchmarks/hold_gpu.py, which leaves 40 GB
# and 24 GB cards' memory: 39.5 and 22.0 GiB),
# gloo (benchmarks/gloo_probe.py at RANKS_N (3) ranks on the GPU and on CPU tensors)
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$1"
shift
for group in "$@"; do
  case $group in
    env)
      { nvidia-smi; nproc; free -g; python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__); print('free, total', torch.cuda.mem_get_info())"
        TIMEFORMAT="%R s"
        for m in torch deepspeed zero3bench.inputs; do echo "import $m:"; time python3 -c "import $m"; done
        echo "zero3bench.launches 3:"; time python3 -m zero3bench.launches 3 "0 3" ""
        echo "zero3bench.launches (default):"; time python3 -m zero3bench.launches "" "0 3" ""; } > "$out/env.txt" 2>&1 ;;
    default)
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv -l 1 > "$out/default_gpu_processes.txt" 2>&1 &
      smi=$!
      timed default bash run.sh
      kill $smi ;;
    before)
      if nvidia-smi -L | grep -q H100; then before=(--ranks 3); else before=(); fi
      (cd "$BEFORE" && RESULTS=$out/before timed before bash run.sh "${before[@]}") ;;
    card40 | card24)
      leave=$([ "$group" = card40 ] && echo 39.5 || echo 22.0)
      python3 benchmarks/hold_gpu.py "$leave" > "$out/${group}_hold.txt" 2>&1 &
      hold=$!
      until grep -q holding "$out/${group}_hold.txt" || ! kill -0 $hold 2> /dev/null; do sleep 0.5; done
      timed "$group" bash run.sh
      kill $hold; wait $hold ;;
    ranks3) timed ranks3 bash run.sh --ranks 3 ;;
    gloo)
      for d in cuda cpu; do timed "gloo_$d" python3 -m torch.distributed.run --nproc_per_node "${RANKS_N:-3}" benchmarks/gloo_probe.py $d; done ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
