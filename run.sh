#!/usr/bin/env bash
# Runs the benchmark at stage 0, then stage 3, keeps each run's log under results/<timestamp>/, and prints
# the progress, the comparison and the verdict; report.py --write also writes summary.json, summary.md and memory.png.
# `bash run.sh --help` says how to use it. Exit status (zero3bench/exits.py): 0 PASS, 1 FAIL, 2 bad input, 5 NOT
# OBSERVABLE, 6 a file not written, and 128 plus the signal (130 for Ctrl-C) when interrupted, after a report of
# what finished.
set -uo pipefail
started=$(date +%s.%N)
usage() {
  # train_gpt.py's options, less those run.sh sets: each one whole, with the lines its help wraps onto
  local help; help=$(python3 train_gpt.py --help 2>&1) || {
    echo "run.sh: error: python3 train_gpt.py --help failed: ${help##*$'\n'}" >&2; exit 1; }
  cat <<'EOF'
usage: bash run.sh [-h | --help] [--ranks "N ..."] [--stages "0 3 ..."] [--peer fsdp2] [train_gpt.py options ...]

Trains the GPT at each stage in turn (stage 0, then stage 3, by default), on each number of ranks, and
compares them: what stage 3 partitions, memory per rank, losses, speed; then gives the verdict.

  --ranks "N ..."   ranks per run (default: every GPU; 4 rehearsed on one GPU; 2 CPU processes without GPUs);
                    more ranks than GPUs share them over gloo: memory per rank is real, speed is not
  --stages "..."    stages to run: 0 1 2 3, or the rest of a config's name (3_offload, 3_infinity, 3_deepcompile)
  --peer fsdp2      also train the same model through PyTorch's FSDP2, on stage 3's config
  RANKS=N           the same as --ranks; HOSTFILE=path runs on the nodes of a deepspeed hostfile;
  RESULTS=dir       keeps the results folders there instead of results/

Every other option goes to train_gpt.py; they are:
EOF
  awk '/^options:/ { on = 1; next } on && /^  -/ { keep = !/^  (-h, --help|--stage |--config |--engine |--check )/ }
    on && keep' <<< "$help"
}
bad() { echo "run.sh: error: $*" >&2; exit 2; }
results=$(realpath -m -- "${RESULTS:-$(dirname "$0")/results}")
command="bash run.sh"; [ $# -eq 0 ] || command+=$(printf ' %q' "$@")
cd "$(dirname "$0")"
# run.sh is its runs' launcher: a caller's own (a Slurm step, a PyTorchJob pod) would make its checks and its
# one-rank runs another rank of another world, whose errors print nowhere (zero3bench/launchers.py names them)
inherited=$(python3 -m zero3bench.launchers) || exit
unset $inherited
ranks=${RANKS:-} stages="0 3" peer="" args=()  # run.sh's options anywhere on the line; the rest go to train_gpt.py
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --ranks | --stages | --peer) [ $# -ge 2 ] || bad "$1 needs a value" ;;&
    --ranks) ranks=$2 asked_ranks=1; shift 2 ;;
    --ranks=*) ranks=${1#*=} asked_ranks=1; shift ;;
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
[ -z "${asked_ranks:-}" ] || [ -n "${ranks// }" ] || bad "--ranks is empty"
[ -z "${asked_peer:-}" ] || [ "$peer" = fsdp2 ] || bad "--peer takes fsdp2, not '$peer'"
mkdir -p -- "$results" 2> /dev/null && [ -w "$results" ] || bad "RESULTS $results is not a folder that can be written"
if [ -n "${HOSTFILE:-}" ]; then
  [ -z "$ranks" ] || bad "with HOSTFILE the hostfile's slots set the ranks; drop --ranks"
  [ -f "$HOSTFILE" ] && [ -r "$HOSTFILE" ] || bad "HOSTFILE $HOSTFILE is not a readable file"
  ranks=$(awk '!/^ *#/ && match($0, /slots=[0-9]+/) { n += substr($0, RSTART + 6, RLENGTH - 6) } END { print n + 0 }' \
    "$HOSTFILE")  # the ranks that the hostfile's slots give, for train_gpt.py's check
  [ "$ranks" -gt 0 ] || bad "HOSTFILE $HOSTFILE names no host with slots=N"
fi
plan=$(python3 -m zero3bench.launches "$ranks" "$stages" "$peer" "${args[@]}") || exit
unwritable() { echo "run.sh: error: cannot $1: ${2##*: }" >&2; exit 6; }  # a full disk, say: exit 6
out=$(mktemp -d "$results/$(date +%Y%m%d-%H%M%S)-XXXX" 2>&1) || unwritable "make a folder in $results" "$out"
to_log() { local why; why=$( { echo "$*" >> "$log"; } 2>&1 ) || unwritable "write the log $log" "$why"; }
# A closed terminal (`bash run.sh | head`) stops nothing: the runs go on, and report.txt keeps the report
trap '' PIPE
say() { echo "$@" 2> /dev/null; }
# machine.free_port, without the 2 s of torch's imports
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
say "results: $out"
signal="" pid="" skipped=""
trap 'on_signal 1' HUP  # a closed terminal: the runs sit in sessions of their own, which it would not reach
# Every process of a run carries ZERO3_BENCH_RUN in its environment, whatever session its launcher puts it in
# (torchrun gives each rank a session of its own): so a signal reaches all of them, and none outlives its run.
run_processes() { grep -lszxF "ZERO3_BENCH_RUN=$out" /proc/[0-9]*/environ | cut -d/ -f3; }
on_signal() { signal=$1; { run_processes; echo "$pid"; } | xargs -r kill -TERM 2> /dev/null; }
trap 'on_signal 2' INT
trap 'on_signal 15' TERM
# run.sh killed outright (SIGKILL to its group) passes nothing on: a watchdog in a session of its own ends what
# its runs left within 10 s, as a signal would, and removes their ranks' /dev/shm buffers, which a rank killed
# before it unlinks them leaves; after a clean end it finds nothing. It is no child of run.sh's, which waits for
# its children, and it takes a run.sh that its parent has not yet reaped (a zombie) as ended
export -f run_processes
( setsid bash -c 'out=$1; while grep -qs "^State:.[^Z]" "/proc/$0/status"; do sleep 0.5; done; left=$(run_processes)
  [ -z "$left" ] || { ports=$(for p in $left; do tr "\0" "\n" < "/proc/$p/environ"; done | sed -n "s/^MASTER_PORT=//p")
    kill -TERM $left; sleep 5; run_processes | xargs -r kill -KILL
    for port in $(sort -u <<< "$ports"); do rm -f /dev/shm/deepspeed_allreduce_buffer_"$(id -u)"_*_"$port"_*; done; }
  ' "$$" "$out" &
) > /dev/null 2>&1 < /dev/null
launch() {  # one run, its output in its log and its progress on the terminal; a signal ends it within 10 s
  to_log "LAUNCHED $(date +%s.%N)"
  ZERO3_BENCH_RUN=$out setsid "$@" >> "$log" 2>&1 < /dev/null &
  pid=$!
  [ -z "$signal" ] || kill -TERM "$pid"  # a signal that came as it started
  tail -s 0.2 -n +1 --pid="$pid" -f "$log" 2> /dev/null | grep --line-buffered -E '^([^ ]+: )?\[ *[0-9.]+s\] ' \
    2> /dev/null &
  wait "$pid"
  for _ in {1..40}; do [ -n "$signal" ] && [ -n "$(run_processes)" ] || break; sleep 0.2; done  # 8 s to stop
  run_processes | xargs -r kill -KILL 2> /dev/null
  wait "$pid"; status=$?
  wait  # the progress view ends with the launcher
  # DeepSpeed's CPU all-reduce names a shared-memory buffer per rank after the port: a killed rank's stays behind
  rm -f /dev/shm/deepspeed_allreduce_buffer_"$(id -u)"_*_"${port}"_*
  to_log "ENDED $(date +%s.%N) $status"
}
while IFS=$'\t' read -r kind n name argv; do
  case $kind in
    NOTE) say "$n" ;;
    ENV) export "$n=$name" ;;
    RUN)
      [ -z "$signal" ] || { skipped+=" $name"; continue; }
      eval "train=($argv)"
      port=$(free_port)  # each run's own, free as it launches: a listener may have taken the last run's
      if [ -n "${HOSTFILE:-}" ]; then
        launcher=(deepspeed --hostfile "$HOSTFILE" --master_port "$port" train_gpt.py)
      elif [ "$n" = 1 ]; then  # one rank needs no launcher, which would cost seconds of start-up
        launcher=(env MASTER_PORT="$port" python3 train_gpt.py)
      else
        # torchrun's log folder, empty without its --redirects: its default is a new one in the temp folder per run,
        # which it never removes
        launcher=(python3 -m torch.distributed.run --nnodes 1 --nproc_per_node "$n" --master_port "$port"
                  --log-dir "$out/.torchrun" train_gpt.py)
      fi
      log=$out/$name.log
      say "== $name: ${train[*]} on $n rank(s); log $log"
      to_log "COMMAND ${launcher[*]} ${train[*]}"
      [ -z "${RUN_SIZED_FOR:-}" ] || to_log "SIZED $RUN_SIZED_FOR"  # the memory a rehearsal was sized for
      launch "${launcher[@]}" "${train[@]}"
      rm -rf "$out/.torchrun" ;;
  esac
done <<< "$plan"
interrupted=$signal  # a signal during the report stops nothing: every run has ended, and it is the result
( trap '' HUP INT TERM
  RUN_COMMAND=$command RUN_STARTED=$started RUN_SIGNAL=$interrupted RUN_SKIPPED=$skipped \
    python3 report.py --write "$out" )
status=$?
exit $((interrupted ? 128 + interrupted : status))
