#!/usr/bin/env bash
# The one-GPU runs behind the peak predictions and the layout's re-run, in groups that fit one device call
# each:   bash benchmarks/h200_peaks.sh OUT_DIR GROUP ...
# GROUP: default (bash run.sh: the 4-rank rehearsal that the layout's re-run must reproduce), mb2 and mb16 (one
# rank: stages 0 and 3 and FSDP2 at that micro batch, checkpointing on and off), ranks8 (8 rehearsed ranks).
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"; shift
LIMIT_S=300
for group in "$@"; do
  case $group in
    default) timed default bash run.sh ;;
    mb*)
      for ck in "" --no-checkpoint; do
        timed "ranks1_${group}${ck:--checkpoint}" bash run.sh --ranks 1 --peer fsdp2 --micro-batch "${group#mb}" $ck
      done ;;
    ranks8) timed ranks8 bash run.sh --ranks 8 ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
