#!/usr/bin/env bash
# Runs the benchmark at stage 0, then stage 3, keeps each run's log under results/<timestamp>/, and prints
# the comparison and the verdict; report.py also writes summary.json, summary.md and memory.png there.
#   bash run.sh [--ranks "N ..."] [--stages "0 1 2 3 3_offload 3_infinity"] [--peer fsdp2] [train_gpt.py options ...]
# --peer fsdp2 also trains the same model through PyTorch's FSDP2 (stage 3's config), for the same table.
# N defaults to every visible GPU, or 2 CPU processes on a machine without GPUs; RANKS=N works too.
# Several N run each stage at each; more ranks than GPUs share them (a rehearsal: memory per rank is
# real, speed is not). HOSTFILE=path runs on the nodes of a deepspeed hostfile; RESULTS=dir keeps the
# logs elsewhere. Every input is checked before anything is launched. Exit status: 0 PASS, 1 FAIL,
# 2 bad input, 5 NOT OBSERVABLE.
set -uo pipefail
results=$(realpath -m "${RESULTS:-$(dirname "$0")/results}")
command="bash run.sh"; [ $# -eq 0 ] || command+=$(printf ' %q' "$@")
cd "$(dirname "$0")"
bad() { echo "run.sh: error: $*" >&2; exit 2; }
ranks=${RANKS:-} stages="0 3" peer="" args=()  # run.sh's options anywhere on the line; the rest go to train_gpt.py
while [ $# -gt 0 ]; do
  case $1 in
    --ranks | --stages | --peer) [ $# -ge 2 ] || bad "$1 needs a value" ;;&
    --ranks) ranks=$2; shift 2 ;;
    --ranks=*) ranks=${1#*=}; shift ;;
    --stages) stages=$2; shift 2 ;;
    --stages=*) stages=${1#*=}; shift ;;
    --peer) peer=$2 asked_peer=1; shift 2 ;;
    --peer=*) peer=${1#*=} asked_peer=1; shift ;;
    --stage | --stage=* | --config*) bad "$1 is run.sh's to set; use --stages \"0 3\"" ;;
    --engine*) bad "$1 is run.sh's to set; use --peer fsdp2" ;;
    --check*) bad "run.sh checks every input before it launches; $1 is not needed" ;;
    *) args+=("$1"); shift ;;
  esac
done
for n in $ranks; do [[ $n =~ ^[1-9][0-9]*$ ]] || bad "--ranks takes positive whole numbers, not '$n'"; done
[ -n "${stages// }" ] || bad "--stages is empty"
[ -z "${asked_peer:-}" ] || [ "$peer" = fsdp2 ] || bad "--peer takes fsdp2, not '$peer'"
for stage in $stages; do  # a number, or the rest of a config's name: 3_offload is ds_config_stage3_offload.json
  [ -f "ds_config_stage$stage.json" ] || bad "no config for stage '$stage'; there are: $(ls ds_config_stage*.json |
    sed 's/ds_config_stage\(.*\)\.json/\1/' | paste -sd ' ')"
done
if [ -n "${HOSTFILE:-}" ]; then
  [ -z "$ranks" ] || bad "with HOSTFILE the hostfile's slots set the ranks; drop --ranks"
  [ -f "$HOSTFILE" ] && [ -r "$HOSTFILE" ] || bad "HOSTFILE $HOSTFILE is not a readable file"
  ranks=$(awk '!/^ *#/ && match($0, /slots=[0-9]+/) { n += substr($0, RSTART + 6, RLENGTH - 6) } END { print n + 0 }' \
    "$HOSTFILE")  # the ranks that the hostfile's slots give, for train_gpt.py's check
  [ "$ranks" -gt 0 ] || bad "HOSTFILE $HOSTFILE names no host with slots=N"
fi
read -r gpus port fsdp2_missing < <(python3 -c 'import socket, torch, fsdp2; s = socket.socket(); s.bind(("", 0))
print(torch.cuda.device_count() or 2, s.getsockname()[1], fsdp2.missing() or "")') || exit 1
ranks=${ranks:-$gpus}
if [ -n "$peer" ] && [ -n "$fsdp2_missing" ]; then  # the rest of the run goes on without its peer
  echo "run.sh: --peer fsdp2 skipped: $fsdp2_missing"
  peer=""
fi
[ -z "$peer" ] || stages+=" $peer"  # the peer runs last, on stage 3's config
config_of() {
  case $1 in
    [0-9]) echo "--stage $1" ;;
    fsdp2) echo "--stage 3 --engine fsdp2" ;;
    *) echo "--config ds_config_stage$1.json" ;;
  esac
}
for n in $ranks; do for stage in $stages; do  # train_gpt.py checks its own arguments, launching nothing
  python3 train_gpt.py $(config_of "$stage") "${args[@]}" --check "$n" > /dev/null || exit 2
done; done
mkdir -p "$results"
out=$(mktemp -d "$results/$(date +%Y%m%d-%H%M%S)-XXXX") || exit 1
for n in $ranks; do
  if [ -n "${HOSTFILE:-}" ]; then
    launcher=(deepspeed --hostfile "$HOSTFILE")
  else
    launcher=(deepspeed --num_gpus "$n" --master_port "$port")
  fi
  for stage in $stages; do
    log=$out/$([ "$stage" = "$peer" ] || echo stage)$stage$([ "$n" = "$ranks" ] || echo "_${n}ranks").log
    echo "COMMAND ${launcher[*]} train_gpt.py $(config_of "$stage") ${args[*]}" | tee "$log"
    "${launcher[@]}" train_gpt.py $(config_of "$stage") "${args[@]}" 2>&1 | tee -a "$log"
  done
done
RUN_COMMAND=$command python3 report.py "$out" | tee "$out/report.txt"
exit "${PIPESTATUS[0]}"
