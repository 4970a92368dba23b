#!/usr/bin/env bash
# Issue 59 on one GPU: whether recording the allocator's history breaks the step with this torch and DeepSpeed
# (benchmarks/snapshot_repro.py, about 30 s), then the default run with each rank's memory traced (bash run.sh
# --timeline, sized as run.sh sizes it), its results folder and the repro's logs packed into OUT_DIR/timeline.tgz:
#   bash benchmarks/gpu_timeline.sh OUT_DIR
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$1"
mkdir -p "$out/snapshot_repro"
timed snapshot_repro python3 benchmarks/snapshot_repro.py "$out/snapshot_repro"
timed default bash run.sh --timeline
tar czf "$out/timeline.tgz" -C "$out" results snapshot_repro && rm -rf "$out/results" "$out/snapshot_repro"
