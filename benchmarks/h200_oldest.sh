#!/usr/bin/env bash
# Issue 25, item 5: the oldest DeepSpeed that runs the default `bash run.sh` with the GPU machine's own torch.
#   source .whl/device-setup.sh && bash benchmarks/h200_oldest.sh OUT_DIR     (carry .whl and .whl-oldest)
#   bash benchmarks/h200_oldest.sh --wheels VERSION ...   builds the candidates' wheels into .whl-oldest/ (here)
# Each candidate in .whl-oldest/ goes to a folder of its own, ahead of device-setup's DeepSpeed on PYTHONPATH,
# with a JIT cache of its own. All at once: each imports; each that imports runs the quick check (run.sh on 2
# ranks of the tiny model: stages 0 and 3 and the verdict; the runs share the GPU, so their speeds mean
# nothing). Then the oldest whose check passed runs the default `bash run.sh`, the next one if it fails and
# time is left. All within BUDGET_S seconds (default 540: one device call with a fresh machine's start); QUICK_S
# (default 240) bounds each quick check, for a test on CPU ranks, where one takes minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --wheels ]; then  # as make_wheels.sh builds .whl/: from the sdist, with no compiled ops
  shift; mkdir -p .whl-oldest; tmp=$(mktemp -d)
  for v in "$@"; do
    python3 -m pip download -q --no-deps --no-binary=:all: "deepspeed==$v" -d "$tmp" &&
      python3 -m pip wheel -q --no-deps "$tmp/deepspeed-$v.tar.gz" -w .whl-oldest || echo "deepspeed $v: no wheel"
  done
  rm -rf "$tmp"; ls -l .whl-oldest; exit
fi
out=$(realpath -m "${1:?usage: bash benchmarks/h200_oldest.sh OUT_DIR}")
budget=${BUDGET_S:-540} start=$SECONDS
mkdir -p "$out"
left() { echo $((budget - (SECONDS - start))); }
say() { echo "$*" | tee -a "$out/oldest.txt"; }
export PYTHONUNBUFFERED=1
mapfile -t versions < <(ls .whl-oldest/deepspeed-*.whl 2> /dev/null | sed 's/.*deepspeed-\([^-]*\)-.*/\1/' | sort -V)
[ ${#versions[@]} -gt 0 ] || { echo "no wheels in .whl-oldest/: bash benchmarks/h200_oldest.sh --wheels VERSION ..."; exit 2; }
say "candidates: ${versions[*]}; $(python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"
with() {  # with VERSION COMMAND ...: run it with that DeepSpeed ahead of device-setup's
  local v=$1 dir=/tmp/ds-oldest/$1; shift
  PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} PATH=$dir/bin:$PATH TORCH_EXTENSIONS_DIR=$dir/ext "$@"
}
check_import() {
  local v=$1 dir=/tmp/ds-oldest/$1
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$dir" .whl-oldest/deepspeed-"$v"-*.whl &&
    with "$v" timeout 120 python3 -c "
import deepspeed, torch, compat
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
assert deepspeed.__version__.startswith('$v'), f'{deepspeed.__version__} from {deepspeed.__file__}, not $v'
print('deepspeed', deepspeed.__version__, 'from', deepspeed.__file__, 'with torch', torch.__version__)"
}
for v in "${versions[@]}"; do check_import "$v" > "$out/import-$v.txt" 2>&1 & done; wait
imports=()
for v in "${versions[@]}"; do
  if grep -q "^deepspeed $v" "$out/import-$v.txt"; then imports+=("$v"); say "$v imports"
  else say "$v does not import: $(grep -v '^\s' "$out/import-$v.txt" | grep -iE 'error|exception' | tail -1)"; fi
done
quick=${QUICK_S:-240}  # each quick check's limit; the full run keeps its 150 s
quick=$(( $(left) - 150 < quick ? $(left) - 150 : quick ))
for v in "${imports[@]}"; do
  with "$v" env RESULTS="$out/quick-$v" timeout "$quick" bash run.sh --ranks 2 --model tiny > "$out/quick-$v.txt" 2>&1 &
done; wait
passed=()
for v in "${imports[@]}"; do
  verdict=$(grep -E '^VERDICT' "$out/quick-$v.txt" | tail -1)
  failed=$(grep -E '^ +(FAIL|NOT OBSERVABLE) ' "$out/quick-$v.txt" | sed -E 's/^ *([A-Z ]+[A-Z]) +(\([a-e]\)).*/\1 \2/' | paste -sd ',')
  say "$v quick check (run.sh --ranks 2 --model tiny): ${verdict:-no verdict (see quick-$v.txt)}${failed:+ ($failed)}"
  # the tiny model's peak on a GPU is mostly stage 3's 100 MB gradient bucket, so (b) says nothing there: the
  # quick check passes where every other criterion does
  [ -n "$verdict" ] && ! grep -qE '^ +FAIL +\([acde]\)' "$out/quick-$v.txt" && passed+=("$v")
done
for v in "${passed[@]}"; do
  [ "$(left)" -ge 130 ] || { say "no time left for the default run.sh with $v ($(left) s)"; break; }
  say "default bash run.sh with DeepSpeed $v, within $(( $(left) - 10 )) s"
  { time with "$v" env RESULTS="$out/full-$v" timeout $(( $(left) - 10 )) bash run.sh; } > "$out/full-$v.txt" 2>&1
  status=$?
  say "$v default run.sh: exit $status, $(grep -E '^VERDICT' "$out/full-$v.txt" | tail -1) ($(grep -E '^real' "$out/full-$v.txt"))"
  [ $status -ne 0 ] || break
done
say "done in $((SECONDS - start)) s"
