#!/usr/bin/env bash
# Runs the benchmark at stage 0, then stage 3, keeps each run's log under results/<timestamp>/, and prints
# the comparison and the verdict (exit 0 on PASS, 1 on FAIL, 3 when one rank can't show sharding);
# report.py also writes summary.json, summary.md and memory.png there.
#   bash run.sh [--ranks "N ..."] [--stages "0 1 2 3 3_offload 3_infinity"] [train_gpt.py options ...]
# N defaults to every visible GPU, or 2 CPU processes on a machine without GPUs; RANKS=N works too.
# Several N run each stage at each; more ranks than GPUs share them (a rehearsal: memory per rank is
# real, speed is not). HOSTFILE=path runs on the nodes of a deepspeed hostfile; RESULTS=dir keeps the
# logs elsewhere.
set -uo pipefail
results=$(realpath -m "${RESULTS:-$(dirname "$0")/results}")
command="bash run.sh"; [ $# -eq 0 ] || command+=$(printf ' %q' "$@")
cd "$(dirname "$0")"
ranks=${RANKS:-} stages="0 3" args=()  # run.sh's options anywhere on the line; the rest go to train_gpt.py
while [ $# -gt 0 ]; do
  case $1 in
    --ranks | --stages) [ $# -ge 2 ] || { echo "run.sh: error: $1 needs a value" >&2; exit 2; } ;;&
    --ranks) ranks=$2; shift 2 ;;
    --ranks=*) ranks=${1#*=}; shift ;;
    --stages) stages=$2; shift 2 ;;
    --stages=*) stages=${1#*=}; shift ;;
    --stage | --stage=* | --config*) echo "run.sh: error: $1 is run.sh's to set; use --stages \"0 3\"" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
read -r gpus port < <(python3 -c 'import socket, torch; s = socket.socket(); s.bind(("", 0))
print(torch.cuda.device_count() or 2, s.getsockname()[1])') || exit 1
if [ -n "${HOSTFILE:-}" ] && [ -n "$ranks" ]; then
  echo "run.sh: error: with HOSTFILE the hostfile's slots set the ranks; drop --ranks" >&2; exit 2
fi
mkdir -p "$results"
out=$(mktemp -d "$results/$(date +%Y%m%d-%H%M%S)-XXXX") || exit 1
for n in ${ranks:-$gpus}; do
  if [ -n "${HOSTFILE:-}" ]; then
    launcher=(deepspeed --hostfile "$HOSTFILE")
  else
    launcher=(deepspeed --num_gpus "$n" --master_port "$port")
  fi
  for stage in $stages; do  # a number, or the rest of a config's name: 3_offload is ds_config_stage3_offload.json
    select=(--stage "$stage")
    [[ $stage =~ ^[0-9]+$ ]] || select=(--config "ds_config_stage$stage.json")
    log=$out/stage$stage$([ "$n" = "${ranks:-$gpus}" ] || echo "_${n}ranks").log
    echo "COMMAND ${launcher[*]} train_gpt.py ${select[*]} ${args[*]}" | tee "$log"
    "${launcher[@]}" train_gpt.py "${select[@]}" "${args[@]}" 2>&1 | tee -a "$log"
  done
done
RUN_COMMAND=$command python3 report.py "$out" | tee "$out/report.txt"
exit "${PIPESTATUS[0]}"
