"""kill -KILL of run.sh's process group during stage 3, as no trap can see it: prints, every 0.5 s, the run's
processes still alive (pid, state, parent) until none is (benchmarks/logs/cpu/faults/sigkill-group.txt).

    python3 benchmarks/sigkill_group.py
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import run_processes  # noqa: E402

results = tempfile.mkdtemp()
out = open(results + "/out.txt", "w")
p = subprocess.Popen(["bash", "run.sh", "--stages", "3", "--steps", "3000"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                     env={**os.environ, "RESULTS": results}, start_new_session=True)
while "step 5/3000" not in open(results + "/out.txt").read():
    time.sleep(0.2)
os.killpg(p.pid, signal.SIGKILL)
t = time.monotonic()
for _ in range(60):
    procs = run_processes(results)
    print(round(time.monotonic() - t, 1), [(q.pid, q.status(), q.ppid()) for q in procs], flush=True)
    if not procs:
        break
    time.sleep(0.5)
p.wait()
shutil.rmtree(results)
