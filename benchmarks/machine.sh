#!/usr/bin/env bash
# Whether a command leaves this machine as it found it (issue 58): tests/machine_state.sh before it
# (state-before.txt) and after it (state-after.txt: the comparison); PID 1's children and the listening sockets
# before and after, each with its process's folder and command line (processes.txt), so that another user's can
# be told from what the command left; and the files written while it ran, anywhere but /proc, /sys and /work (the
# checkouts), counted by their folder three deep (written.txt: /tmp, /dev/shm and ~ among them). Usage:
# benchmarks/machine.sh OUT COMMAND..., as root: COMMAND's output passes through, then one line on its exit and
# time; the exit status is COMMAND's.
set -uo pipefail
out=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"

owned() {  # each line of stdin, with the folder and command line of the process its first number names
  while read -r line; do
    pid=$(grep -oE '[0-9]+' <<< "${line#*pid=}" | head -1)
    echo "$line: $(readlink "/proc/$pid/cwd") $(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-160)"
  done 2> /dev/null
}

processes() {
  echo "## PID 1's children $1"
  ps -eo ppid=,stat=,pid= | awk '$1 == 1 && $2 !~ /^Z/ { print $3 }' | owned
  echo "## listening sockets $1"
  ss -Hltunp | awk '{ print $1, $5, $7 }' | owned
}

bash "$here/tests/machine_state.sh" > "$out/state-before.txt"
processes before > "$out/processes.txt"
stamp=$(mktemp)
started=$(date +%s.%N)
"$@"
status=$?
echo "machine.sh: $* exited $status after $(echo "$(date +%s.%N) - $started" | bc) s; at the end: $(uptime)"
bash "$here/tests/machine_state.sh" "$out/state-before.txt" > "$out/state-after.txt"
processes after >> "$out/processes.txt"
find / /tmp /dev/shm /run -xdev \( -path /proc -o -path /sys -o -path /work \) -prune -o -newer "$stamp" -print \
  2> /dev/null | sort -u | awk -F/ '{ print "/" $2 "/" $3 "/" $4 }' | sort | uniq -c > "$out/written.txt"
rm -f "$stamp"
exit $status
