#!/usr/bin/env bash
# What timing offload's host pass adds to run.sh's default (2 CPU ranks of the tiny model, stages 0 and 3): two
# checkouts, before and after, alternately N times (default 3). Per run: its wall seconds and the load average at its
# start, and from each stage's log its seconds from the end of training to its end and from the end of its process
# group's start to that of building the model less the build itself, where the rank loads CPU Adam (its own line
# before it went quiet under 30 s; before the host pass, nothing). On a shared machine the wall times swing with
# the load; the logs' own times less.
#   bash benchmarks/host_pass_cost.sh BEFORE_CHECKOUT AFTER_CHECKOUT [N]    (e.g. git archive REV | tar -x -C DIR)
results=$(mktemp -d)
phases() {  # LOG: its seconds from the end of training to its end, and CPU Adam's load
  python3 - "$1" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
end = float(re.search(r"ENDED (\S+)", t).group(1))
trained = max(json.loads(m)["timing"]["trained"] for m in re.findall(r"RESULT (\{.*\})", t))
group = float(re.search(r"^\[ *([\d.]+)s\] starting the process group: done", t, re.M)[1])
built, building = map(float, re.search(r"^\[ *([\d.]+)s\] building the model: done in ([\d.]+) s", t, re.M).groups())
load = f"{built - building - group:.1f}"
print(f"{sys.argv[1].split('/')[-1][:-4]}: trained to end {end - trained:.1f} s, CPU Adam loaded in {load} s")
PY
}
for i in $(seq "${3:-3}"); do
  for which in before after; do
    dir=$1; [ "$which" = after ] && dir=$2
    load=$(cut -d' ' -f1 /proc/loadavg) start=$(date +%s.%N)
    out=$(cd "$dir" && RESULTS=$results bash run.sh 2>&1)
    wall=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
    folder=$(grep -m1 -o "^results: [^ ]*" <<< "$out" | cut -d' ' -f2)
    echo "$which $i: $wall s wall (load $load at its start), $(grep -m1 -o "VERDICT: [A-Z ]*" <<< "$out");" \
      "$(phases "$folder/stage0.log"); $(phases "$folder/stage3.log")"
  done
done
rm -rf "$results"
