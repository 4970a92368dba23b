#!/usr/bin/env bash
# Issue 13 on 2 H200s: ZeRO-3 against FSDP2 (run.sh --peer fsdp2) and the stage-3 levers. Each case names its
# steps (4, 6, 8, 10, 12, 14 or 20).
#   bash benchmarks/h200x2_fsdp2.sh OUT_DIR peer|sweep|levers|final|profile|levers2|levers3|final2|final3|final4|
#     deepcompile|deepcompile_mb2|live|final5|deepcompile_peer|
#     timeline_mb16|repeat_mb16|repeat_mb2|deepcompile_sub1e9
# A variant changes settings of ds_config_stage3.json as it stands, written as ds_config_stage3_<name>.json
# beside it for the run only. ds_config_stage3.json changed between cases: peer to levers3 ran with the config of
# commit 84766b7, final2 with 8d38ab2's plus "stage3_module_granularity_threshold": 1 (fast sharding), final3
# with 8d38ab2's, final4 to deepcompile_mb2 with 39a945c's. final4
# also ran, and a case "memory" ran again, profile_step.py recording the device memory of a step
# (torch.cuda.memory._record_memory_history, commit 24efe87): on the H200s cross_entropy then returned NULL, with
# the profiler and without (13-fsdp2/9-final4/profile_*.txt, 12-memory/), and that mode was removed.
# 13-fsdp2/13-deepcompile-cut ran run.sh directly with the code of ee76544, which times DeepCompile from step 7:
#   RESULTS=$OUT/r timeout 480 bash run.sh --stages "3 3_deepcompile" --peer fsdp2 --steps 10
# deepcompile and deepcompile_mb2 wrote ds_config_stage3_deepcompile.json with variant; it is committed since, the
# same, and they pass --compile, which it now implies.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
export PYTHONUNBUFFERED=1
timed() { local name=$1; shift; { time timeout "${LIMIT:-300}" "$@"; } > "$out/$name.txt" 2>&1; echo "$name: exit $?"; }
variant() {  # variant NAME KEY=VALUE ...: the stage-3 config with these zero_optimization settings; a committed
  # config of that name (ds_config_stage3_deepcompile.json since the deepcompile case) is used as it is
  git ls-files --error-unmatch "ds_config_stage3_$1.json" > /dev/null 2>&1 && return
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
profile() {  # profile NAME [train_gpt.py options]: the last step's profile per rank, under $out/profile
  local name=$1; shift
  PROFILE_OUT=$out/profile PROFILE_TAG=$name timed "profile_$name" \
    deepspeed --num_gpus 2 benchmarks/profile_step.py "$@"
}
timeline() {  # timeline NAME [train_gpt.py options]: memory at each gather and release, under $out/timeline
  local name=$1; shift
  TIMELINE_OUT=$out/timeline TIMELINE_TAG=$name timed "timeline_$name" \
    deepspeed --num_gpus 2 benchmarks/memory_timeline.py "$@"
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
  profile)  # where the time of a step at micro batch 2 goes: stage 3 against FSDP2, 6 steps
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     variant plainlinear memory_efficient_linear=false
     profile stage3 --stage 3 --steps 6
     profile fsdp2 --stage 3 --engine fsdp2 --steps 6
     PY_PROFILE=1 profile stage3_python --stage 3 --steps 6
     profile stage3_plainlinear --config ds_config_stage3_plainlinear.json --steps 6
     profile stage0 --stage 0 --steps 6 ;;
  levers2)  # what the profile pointed at, cumulatively, 10 steps: DeepSpeed's own linear off, no persistent
     # parameters (each is all-gathered alone after every optimizer step), smaller optimizer sub-groups
     variant plain memory_efficient_linear=false
     variant p0 memory_efficient_linear=false stage3_param_persistence_threshold=0
     variant p0sg memory_efficient_linear=false stage3_param_persistence_threshold=0 sub_group_size=1e8
     variant p0sgreuse memory_efficient_linear=false stage3_param_persistence_threshold=0 sub_group_size=1e8 \
       stage3_max_reuse_distance=1e9
     variant p0sgpf memory_efficient_linear=false stage3_param_persistence_threshold=0 sub_group_size=1e8 \
       stage3_prefetch_bucket_size=2e8
     RESULTS=$out/r LIMIT=280 timed mb2 bash run.sh --stages "3_plain 3_p0 3_p0sg" --peer fsdp2 --steps 10
     RESULTS=$out/r LIMIT=280 timed mb16_no_checkpoint bash run.sh --stages "3_p0sg 3_p0sgreuse 3_p0sgpf" --peer fsdp2 \
       --steps 10 --micro-batch 16 --no-checkpoint ;;
  levers3)  # DeepSpeed's fast sharding for leaf modules, which a granularity threshold turns on (at 1 it makes no
     # module a leaf itself: train_gpt.py already makes each block one), with and without DeepSpeed's linear
     variant plain memory_efficient_linear=false
     variant fs stage3_module_granularity_threshold=1
     variant plainfs memory_efficient_linear=false stage3_module_granularity_threshold=1
     variant plainfssg memory_efficient_linear=false stage3_module_granularity_threshold=1 sub_group_size=1e8
     RESULTS=$out/r LIMIT=280 timed mb2 bash run.sh --stages "3_plain 3_fs 3_plainfs 3_plainfssg" --peer fsdp2 \
       --steps 10
     RESULTS=$out/r LIMIT=280 timed mb16_no_checkpoint bash run.sh --stages "3 3_fs 3_plainfs" --peer fsdp2 \
       --steps 10 --micro-batch 16 --no-checkpoint ;;
  final2)  # the new stage-3 config against FSDP2, 10 steps: run.sh's default (with stage 0), then the other three
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     RESULTS=$out/r LIMIT=200 timed mb2 bash run.sh --peer fsdp2 --steps 10
     RESULTS=$out/r LIMIT=130 timed mb16_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 10 --micro-batch 16 \
       --no-checkpoint
     RESULTS=$out/r LIMIT=130 timed mb2_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 10 --no-checkpoint
     RESULTS=$out/r LIMIT=130 timed mb16 bash run.sh --stages 3 --peer fsdp2 --steps 10 --micro-batch 16 ;;
  final4)  # the committed config against FSDP2 in the three settings that final3 left out, 10 steps
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     RESULTS=$out/r LIMIT=130 timed mb16_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 10 --micro-batch 16 \
       --no-checkpoint
     RESULTS=$out/r LIMIT=130 timed mb2_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 10 --no-checkpoint
     RESULTS=$out/r LIMIT=130 timed mb16 bash run.sh --stages 3 --peer fsdp2 --steps 10 --micro-batch 16 ;;
  deepcompile)  # DeepCompile past the steps at which it compiles (its first, and its sixth after 5 warm-up steps):
     # 14 steps at micro batch 16 without checkpointing, each step's time in the log
     TORCH_LOGS=graph_breaks,recompiles RESULTS=$out/r LIMIT=${DC_LIMIT:-560} timed deepcompile bash run.sh \
       --stages 3_deepcompile --compile --steps 14 --micro-batch 16 --no-checkpoint ;;
  deepcompile_mb2)  # DeepCompile at run.sh's default (micro batch 2, checkpointing), 14 steps; then stage 3 and
     # FSDP2 in the same call, 10 steps
     RESULTS=$out/r LIMIT=${DC_LIMIT:-430} timed deepcompile bash run.sh --stages 3_deepcompile --compile --steps 14
     RESULTS=$out/r LIMIT=130 timed mb2 bash run.sh --stages 3 --peer fsdp2 --steps 10 ;;
  live)  # the peak at micro batch 2 with checkpointing: where each engine's step peaks (4 steps), then a lower
     # stage3_max_live_parameters, which caps the parameters that DeepSpeed's prefetcher gathers ahead (8 steps)
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     variant live1e8 stage3_max_live_parameters=1e8
     variant live5e7 stage3_max_live_parameters=5e7
     variant live1e8rb2e7 stage3_max_live_parameters=1e8 reduce_bucket_size=2e7
     variant live1e8sg3e7 stage3_max_live_parameters=1e8 sub_group_size=3e7
     timeline stage3 --stage 3 --steps 4
     timeline fsdp2 --stage 3 --engine fsdp2 --steps 4
     timeline stage3_live1e8 --config ds_config_stage3_live1e8.json --steps 4
     RESULTS=$out/r LIMIT=300 timed mb2 bash run.sh --stages "3 3_live1e8 3_live5e7 3_live1e8rb2e7 3_live1e8sg3e7" \
       --peer fsdp2 --steps 8
     RESULTS=$out/r LIMIT=150 timed mb16 bash run.sh --stages "3 3_live1e8" --peer fsdp2 --steps 8 --micro-batch 16 ;;
  final5)  # stage3_max_live_parameters 1e8 committed: run.sh's default, then the other three settings against FSDP2,
     # and at micro batch 16 without checkpointing (the speed goal's setting) the former 1e9 beside it; 10 steps
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     variant live1e9 stage3_max_live_parameters=1e9
     RESULTS=$out/r LIMIT=150 timed mb2 bash run.sh --peer fsdp2 --steps 10
     RESULTS=$out/r LIMIT=160 timed mb16_no_checkpoint bash run.sh --stages "3 3_live1e9" --peer fsdp2 --steps 10 \
       --micro-batch 16 --no-checkpoint
     RESULTS=$out/r LIMIT=100 timed mb16 bash run.sh --stages 3 --peer fsdp2 --steps 10 --micro-batch 16
     RESULTS=$out/r LIMIT=100 timed mb2_no_checkpoint bash run.sh --stages 3 --peer fsdp2 --steps 10 --no-checkpoint ;;
  deepcompile_peer)  # run.sh's own DeepCompile run and FSDP2 in one call, at micro batch 16 without checkpointing,
     # 14 steps (DeepCompile is timed from step 7)
     RESULTS=$out/r LIMIT=540 timed mb16_no_checkpoint bash run.sh --stages 3_deepcompile --peer fsdp2 --steps 14 \
       --micro-batch 16 --no-checkpoint ;;
  repeat_mb16 | repeat_mb2)  # DeepCompile and FSDP2 again in one call, 20 steps (DeepCompile timed from step 7): the
     # speed goals' two settings, micro batch 16 without checkpointing and run.sh's default
     nvidia-smi topo -m > "$out/env.txt" 2>&1
     settings=(--micro-batch 16 --no-checkpoint); [ "$2" = repeat_mb16 ] || settings=()
     RESULTS=$out/r LIMIT=${LIMIT:-520} timed "$2" bash run.sh --stages 3_deepcompile --peer fsdp2 --steps 20 \
       "${settings[@]}" ;;
  deepcompile_sub1e9)  # DeepCompile at micro batch 16 without checkpointing, with optimizer sub-groups of 1e9
     # elements (DeepSpeed's default) instead of 1e8: a faster step for more memory? 12 steps, FSDP2 beside it
     variant deepcompile_sub1e9 sub_group_size=1e9 compile.deepcompile=true
     RESULTS=$out/r LIMIT=${LIMIT:-520} timed "$2" bash run.sh --stages 3_deepcompile_sub1e9 --peer fsdp2 --steps 12 \
       --micro-batch 16 --no-checkpoint ;;
  timeline_mb16)  # where each engine's step peaks at micro batch 16 without checkpointing, 4 steps
     timeline stage3_mb16_no_checkpoint --stage 3 --steps 4 --micro-batch 16 --no-checkpoint
     timeline fsdp2_mb16_no_checkpoint --stage 3 --engine fsdp2 --steps 4 --micro-batch 16 --no-checkpoint ;;
  final3)  # final2's first run again, without fast sharding (it gave wrong losses in final2 and levers3)
     RESULTS=$out/r LIMIT=200 timed mb2 bash run.sh --peer fsdp2 --steps 10 ;;
esac
