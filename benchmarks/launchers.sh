#!/usr/bin/env bash
# The evidence for the README's "Several GPUs and nodes" (issue 34), and what the launchers' engines add to
# CI: tests/launchers/start.sh from nothing (its daemons stopped by their pid files and its packages removed
# first, with --cold), then every real launch of tests/test_launchers.py (all but the hung rank, which needs
# no engine), each launch's folder kept under benchmarks/logs/cpu/launchers/. As root.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/logs/cpu/launchers
state=/var/lib/zero3-launchers
mkdir -p "$out"
if [ "${1:-}" = --cold ]; then
  for pidfile in "$state/slurmd.pid" "$state/slurmctld.pid" /run/munge/munged.pid /run/sshd.pid; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2> /dev/null || true
  done
  sleep 2
  rm -rf "$state"
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq slurm-wlm slurmctld slurmd slurm-client munge openmpi-bin \
    pdsh openssh-server > /dev/null
fi
{ date -u; echo "cores: $(nproc)"; uptime; } | tee "$out/machine.txt"
started=$(date +%s.%N)
bash tests/launchers/start.sh 2>&1 | tee "$out/start.txt"
echo "start.sh: $(echo "$(date +%s.%N) - $started" | bc) s${1:+ ($1)}" | tee -a "$out/start.txt"
base=$(mktemp -d)
python3 -m pytest -q -p no:cacheprovider tests/test_launchers.py -k "not hung" --durations=0 --basetemp="$base" \
  2>&1 | tee "$out/pytest.txt"
echo "start.sh and the launches: $(echo "$(date +%s.%N) - $started" | bc) s; at the end: $(uptime)" |
  tee -a "$out/pytest.txt"
for folder in "$base"/{stage3-,killed-,sbatch,hostfile}*/; do  # each launch's logs, as the tests read them
  [ -L "${folder%/}" ] && continue  # pytest's "current" link to the newest of a name
  name=$(basename "$folder" | sed 's/[0-9]*$//')
  mkdir -p "$out/$name" && cp -r "$folder". "$out/$name/"
done
find "$out" \( -name deepspeed_env -o -name '*.png' \) -delete
rm -rf "$base"
