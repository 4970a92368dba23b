#!/usr/bin/env bash
# The verdict off the default path (issue 31) on one H200: each row a stage-0/stage-3 pair at the same ranks,
# in groups that each fit one device call (540 s):   bash benchmarks/h200_verdict_matrix.sh OUT_DIR GROUP ...
# GROUP: fp16 (the 4-rank rehearsal and 2 ranks), fp32 (350m at 2 ranks), models (350m and 2.7b at 2 ranks),
# mb8 (micro batch 8 without checkpointing), offload (stage 3 with the optimizer offloaded, beside stages 0 and
# 3), ranks (2 and 4 rehearsed ranks in one folder), original (benchmarks/original_design.json at stages 0 and
# 3). Each run.sh's output, with its verdict and the causes of failed runs, is OUT_DIR/NAME.txt; its results
# folder is under OUT_DIR/results.
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"; shift
export LIMIT_S=${LIMIT_S:-260}
original_configs() {  # the original design's config as a stage-0 and a stage-3 config of run.sh's
  for stage in 0 3; do
    python3 - "$stage" <<'PY'
import json, sys
config = json.load(open("benchmarks/original_design.json"))
config.setdefault("zero_optimization", {})["stage"] = int(sys.argv[1])
json.dump(config, open(f"ds_config_stage{sys.argv[1]}_original.json", "w"), indent=2)
PY
  done
}
for group in "$@"; do
  case $group in
    fp16) timed fp16_rehearsal bash run.sh --dtype fp16; timed fp16_ranks2 bash run.sh --ranks 2 --dtype fp16 ;;
    fp32) timed fp32_350m_ranks2 bash run.sh --ranks 2 --dtype fp32 --model 350m ;;
    models) timed model_350m bash run.sh --ranks 2 --model 350m; timed model_2.7b bash run.sh --ranks 2 --model 2.7b ;;
    mb8) timed mb8_no_checkpoint bash run.sh --ranks 2 --micro-batch 8 --no-checkpoint ;;
    offload) timed offload bash run.sh --ranks 2 --stages "0 3 3_offload" ;;
    ranks) LIMIT_S=500 timed ranks_2_4 bash run.sh --ranks "2 4" ;;
    original)
      original_configs
      timed original_design bash run.sh --ranks 2 --stages "0_original 3_original"
      rm -f ds_config_stage0_original.json ds_config_stage3_original.json ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
grep -h "^VERDICT" "$out"/*.txt 2>/dev/null | sort | uniq -c
