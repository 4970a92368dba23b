#!/usr/bin/env bash
# Stops the engines that tests/launchers/start.sh started in FOLDER, and removes the folder: every process that
# holds a file open in it (munged, slurmctld, slurmd and each job's slurmstepd, sshd and each of its sessions:
# all keep their log there), with SIGTERM, then SIGKILL after 10 s. It touches no other session's engines, and no
# folder that start.sh did not make (one without its owner file). Without FOLDER: the engines of every session
# that has ended (its process gone) without stopping its own, among the temp folder's zero3-launchers-*.
# Usage: stop.sh [FOLDER]. Exit status 0 when none of the processes is left; else 1, with one line on stderr.
set -uo pipefail

holders() {  # the processes with a file open under $1, but for this script and those that called it
  local mine=" $$ " pid=$$
  while [ "$pid" -gt 1 ] 2> /dev/null; do pid=$(ps -o ppid= -p "$pid" | tr -d ' ') && mine+="$pid "; done
  find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/*" 2> /dev/null | cut -d/ -f3 | sort -u |
    while read -r held; do [[ $mine == *" $held "* ]] || echo "$held"; done
}

stop() {
  local state pids
  state=$(cd "$1" 2> /dev/null && pwd) && [ -f "$state/owner" ] || return 0
  pids=$(holders "$state")
  [ -z "$pids" ] || kill -TERM $pids 2> /dev/null
  for _ in {1..50}; do
    pids=$(holders "$state")
    [ -z "$pids" ] && break
    sleep 0.2
  done
  [ -z "$pids" ] || { kill -KILL $pids 2> /dev/null; sleep 0.5; }
  pids=$(holders "$state")
  rm -rf "$state"
  [ -z "$pids" ] || { echo "launchers: stop: still running after SIGKILL: $pids" >&2; return 1; }
}

ended() {  # whether the session that started the engines of folder $1 has ended
  local pid started
  read -r pid started < "$1/owner" || return 1
  [ "$(sed 's/.*) //' "/proc/$pid/stat" 2> /dev/null | cut -d' ' -f20)" != "$started" ]
}

if [ $# -gt 0 ]; then
  stop "$1"
  exit
fi
status=0
for state in "${TMPDIR:-/tmp}"/zero3-launchers-*/; do
  [ -f "$state/owner" ] && [ -O "$state" ] && ended "$state" && { stop "$state" || status=1; }
done
exit $status
