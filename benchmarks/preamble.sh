# The start of each benchmarks/h200*.sh script, sourced with its arguments: from the project's root, OUT_DIR
# made, run.sh's results under it, and `timed NAME COMMAND ...`, which keeps the command's output and time in
# OUT_DIR/NAME.txt (within LIMIT_S seconds) and says its exit status.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
out=$1
mkdir -p "$out"
export RESULTS=$out/results PYTHONUNBUFFERED=1
timed() { local name=$1; shift; { time timeout "${LIMIT_S:-280}" "$@"; } > "$out/$name.txt" 2>&1; echo "$name: exit $?"; }
