#!/usr/bin/env bash
# The link and the planner on two GPUs: nccl-tests' all_gather_perf and reduce_scatter_perf, built from source
# against the NCCL that torch ships, beside the probe's curve (RESULT's link_busbw) in the same call; the 2-GPU
# runs the plan is held to; and the plan made from a 1-GPU run.
#   bash benchmarks/h200x2_link.sh OUT_DIR [build]   # build: only build nccl-tests (any GPU machine)
# It needs nccl-tests' source in .nccl-tests/ (2.19.6: git archive of github.com/NVIDIA/nccl-tests, carried).
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"
LIMIT_S=300
# torch's NCCL, as a folder that nccl-tests' Makefile reads: include/nccl.h and lib/libnccl.so
nccl=$(mktemp -d)
python3 - "$nccl" <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + os.environ.get("PYTHONPATH", "").split(":")
def find(pattern):
    return next(p for root in roots if root for p in glob.glob(os.path.join(root, "nvidia", "**", pattern), recursive=True))
os.makedirs(f"{sys.argv[1]}/lib")
os.symlink(os.path.dirname(find("nccl.h")), f"{sys.argv[1]}/include")
os.symlink(find("libnccl.so.2"), f"{sys.argv[1]}/lib/libnccl.so")
PY
export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$nccl/lib/libnccl.so")"):${LD_LIBRARY_PATH:-}
make -C .nccl-tests -j "$(nproc)" MPI=0 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" NCCL_HOME="$nccl" \
  > "$out/nccl-tests-build.txt" 2>&1 || { echo "nccl-tests did not build: $out/nccl-tests-build.txt"; exit 1; }
gpus=$(nvidia-smi -L | wc -l)
for test in all_gather reduce_scatter; do  # out of place and in place, 1 MiB to 1 GiB, as the probe
  .nccl-tests/build/${test}_perf -b 1M -e 1G -f 2 -g "$gpus" > "$out/${test}_perf.txt" 2>&1
  echo "$test: exit $?"
done
[ "${2:-}" = build ] && exit 0
timed gpus2_mb2 bash run.sh --peer fsdp2
timed gpus2_mb16 bash run.sh --peer fsdp2 --micro-batch 16
timed gpus2_mb2_no_checkpoint bash run.sh --peer fsdp2 --no-checkpoint
timed gpus1_mb2 bash run.sh --ranks 1
one=$(ls -d "$RESULTS"/* | tail -1)
python3 plan.py --from "$one" --gpus 2 --gpus-per-node 2 --json > "$out/plan_from_1gpu.json" 2>&1
echo "plan: exit $?"
