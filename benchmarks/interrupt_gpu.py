"""Ctrl-C during stage 3 on a GPU: how long until run.sh has ended and the GPU's memory is free again.

    python3 benchmarks/interrupt_gpu.py LOG [run.sh options ...]

Starts `bash run.sh --stages 3 --steps 3000 OPTIONS` in a session of its own, sends SIGINT to that session's
process group (as a terminal's Ctrl-C does) once step 3 is logged, and samples nvidia-smi's memory.used every
0.25 s until it is back to what it was before the run. Writes run.sh's output and the samples to LOG."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split())


def main(log, *options):
    idle = gpu_mib()
    out = Path(log)
    with open(out, "w") as sink:
        proc = subprocess.Popen(["bash", "run.sh", "--stages", "3", "--steps", "3000", *options], cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    while "step 3/3000" not in out.read_text():
        if proc.poll() is not None:
            sys.exit(f"run.sh ended before step 3: {proc.returncode}")
        time.sleep(0.2)
    busy, start = gpu_mib(), time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    samples, ended = [], None
    while time.monotonic() - start < 60:
        now = time.monotonic() - start
        if ended is None and proc.poll() is not None:
            ended = now
        samples.append((round(now, 2), gpu_mib()))
        if ended is not None and samples[-1][1] <= idle + 64:
            break
        time.sleep(0.25)
    left = subprocess.run("grep -lszxF ZERO3_BENCH_RUN= /proc/[0-9]*/environ; pgrep -af train_gpt",
                          shell=True, capture_output=True, text=True).stdout
    with open(out, "a") as sink:
        print(f"\nINTERRUPT SIGINT at step 3: GPU memory {idle} MiB idle, {busy} MiB busy; run.sh ended after "
              f"{ended} s with status {proc.returncode}; GPU back to {samples[-1][1]} MiB after {samples[-1][0]} s",
              f"samples (s, MiB): {samples}", f"processes left: {left.strip() or 'none'}", sep="\n", file=sink)


if __name__ == "__main__":
    main(*sys.argv[1:])
