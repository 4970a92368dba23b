#!/usr/bin/env bash
# What `bash run.sh` leaves on the machine outside its results folder (issue 58), as root: run.sh, with its
# results in a folder of the temp folder, and HOME and TMPDIR empty folders of their own (so that its caches show
# as a first run makes them, and what it leaves in the temp folder is its own), inside benchmarks/machine.sh;
# then what it left in that home and that temp folder (left.txt). Logs under benchmarks/logs/cpu/machine/run-sh/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/logs/cpu/machine/run-sh
home=$(mktemp -d)
temp=$(mktemp -d)
results=$(mktemp -d)
rm -rf "$out" && mkdir -p "$out"
bash benchmarks/machine.sh "$out" env HOME="$home" TMPDIR="$temp" RESULTS="$results" bash run.sh 2>&1 |
  tee "$out/output.txt"
for folder in "$home" "$temp"; do
  echo "## $folder, empty before: type, bytes, path"
  (cd "$folder" && find . -printf '%y %s %p\n' | sort -k3)
done | sed "s|$home|HOME|; s|$temp|TMPDIR|" > "$out/left.txt"
rm -rf "$home" "$temp" "$results"
