#!/usr/bin/env bash
# Issue 13 on 2 H200s: ZeRO-3 against FSDP2 (run.sh --peer fsdp2) and the stage-3 levers: 8 steps in peer
# and sweep, 12 in levers and final.
#   bash benchmarks/h200x2_fsdp2.sh OUT_DIR peer|sweep|levers|final
# sweep: one stage-3 setting changed at a time from ds_config_stage3.json, at micro batch 16 without
# checkpointing (the issue's setting), written as ds_config_stage3_<name>.json beside it for the run only.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
export PYTHONUNBUFFERED=1
timed() { local name=$1; shift; { time timeout "${LIMIT:-300}" "$@"; } > "$out/$name.txt" 2>&1; echo "$name: exit $?"; }
variant() {  # variant NAME KEY=VALUE ...: the stage-3 config with these zero_optimization settings
  python3 - "$@" <<'PY'
import json, sys
config = json.load(open("ds_config_stage3.json"))
for setting in sys.argv[2:]:  # a dotted key from the top, else one of zero_optimization
    key, value = setting.split("=")
    *outer, key = key.split(".") if "." in key else ["zero_optimization", key]
    place = config
    for name in outer:
        place = place.setdefault(name, {})
    place[key] = json.loads(value)
json.dump(config, open(f"ds_config_stage3_{sys.argv[1]}.json", "w"), indent=1)
PY
}
case $2 in
  peer) nvidia-smi topo -m > "$out/env.txt" 2>&1
     RESULTS=$out/mb2 timed mb2 bash run.sh --peer fsdp2 --steps 8
     RESULTS=$out/mb16 timed mb16_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 8 --micro-batch 16 \
       --no-checkpoint ;;
  sweep)
     variant prefetch2e8 stage3_prefetch_bucket_size=2e8
     variant reduce2e8 reduce_bucket_size=2e8
     variant persist1e6 stage3_param_persistence_threshold=1e6
     variant live1e8 stage3_max_live_parameters=1e8
     variant reuse1e9 stage3_max_reuse_distance=1e9
     variant nooverlap overlap_comm=false
     variant subgroup1e8 sub_group_size=1e8
     RESULTS=$out/sweep LIMIT=540 timed sweep bash run.sh --stages "3_prefetch2e8 3_reduce2e8 3_persist1e6 3_live1e8 \
       3_reuse1e9 3_nooverlap 3_subgroup1e8" --steps 8 --micro-batch 16 --no-checkpoint ;;
  final)  # stage 3 against FSDP2 with the final code, 12 steps: both micro batches, checkpointing on and off
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     RESULTS=$out/r LIMIT=150 timed mb2 bash run.sh --peer fsdp2 --steps 12
     RESULTS=$out/r LIMIT=100 timed mb2_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 12 --no-checkpoint
     RESULTS=$out/r LIMIT=100 timed mb16_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 12 --micro-batch 16 \
       --no-checkpoint
     RESULTS=$out/r LIMIT=100 timed mb16 bash run.sh --stages 3 --peer fsdp2 --steps 12 --micro-batch 16 ;;
  levers)  # micro batch 16 without checkpointing, 12 steps: DeepCompile, engine.compile, the rest of the sweep
     variant deepcompile compile.deepcompile=true
     variant subgroup1e8 sub_group_size=1e8
     variant nooverlap overlap_comm=false
     variant reuse1e9 stage3_max_reuse_distance=1e9
     args=(--steps 12 --micro-batch 16 --no-checkpoint)
     TORCH_LOGS=graph_breaks,recompiles RESULTS=$out/r LIMIT=200 timed deepcompile bash run.sh --stages 3_deepcompile \
       --compile "${args[@]}"
     RESULTS=$out/r LIMIT=150 timed compile bash run.sh --stages 3 --compile "${args[@]}"
     RESULTS=$out/r LIMIT=170 timed sweep2 bash run.sh --stages "3_subgroup1e8 3_nooverlap 3_reuse1e9" "${args[@]}" ;;
esac
