#!/usr/bin/env bash
# The evidence for the README's "Several GPUs and nodes" (issue 34), and what asking for the real launchers adds
# and leaves (issue 58), as root: tests/launchers/start.sh on its own, timed (with --cold, from nothing: their
# Debian packages removed first, for install.sh to install again), and stopped; then
# tests/test_launchers_real.py with ZERO3BENCH_LAUNCHERS=1, every real launch and the engines' containment,
# inside benchmarks/machine.sh (the machine's state before and after, in the folder machine/), each launch's folder
# kept under benchmarks/logs/cpu/launchers/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/logs/cpu/launchers
mkdir -p "$out"
if [ "${1:-}" = --cold ]; then
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq slurm-wlm slurmctld slurmd slurm-client munge openmpi-bin \
    pdsh openssh-server > /dev/null
fi
{ date -u; echo "cores: $(nproc)"; uptime; } | tee "$out/machine.txt"
started=$(date +%s.%N)
state=$(mktemp -d)
bash tests/launchers/start.sh "$state" 2>&1 | tee "$out/start.txt"
echo "start.sh: $(echo "$(date +%s.%N) - $started" | bc) s${1:+ ($1)}" | tee -a "$out/start.txt"
bash tests/launchers/stop.sh "$state"
base=$(mktemp -d)
ZERO3BENCH_LAUNCHERS=1 bash benchmarks/machine.sh "$out/machine" python3 -m pytest -q -p no:cacheprovider \
  tests/test_launchers_real.py --durations=0 --basetemp="$base" 2>&1 | tee "$out/pytest.txt"
echo "start.sh and the launches: $(echo "$(date +%s.%N) - $started" | bc) s; at the end: $(uptime)" |
  tee -a "$out/pytest.txt"
for folder in "$base"/{stage3-,killed-,sbatch,hostfile}*/; do  # each launch's logs, as the tests read them
  [ -L "${folder%/}" ] && continue  # pytest's "current" link to the newest of a name
  name=$(basename "$folder" | sed 's/[0-9]*$//')
  mkdir -p "$out/$name" && cp -r "$folder". "$out/$name/"
done
find "$out" \( -name deepspeed_env -o -name '*.png' \) -delete
rm -rf "$base"
