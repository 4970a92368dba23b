"""
Where a step's time goes (issue 13): train_gpt.py as it is, run under the deepspeed launcher, with what its
profiled last step saw written out per rank: the top operators by GPU time and by CPU time, and rank 0's
trace. PY_PROFILE=1 also profiles rank 0's training loop in Python (cProfile), slowing it.
  PROFILE_OUT=dir PROFILE_TAG=name deepspeed --num_gpus 2 benchmarks/profile_step.py [train_gpt.py options]
"""
import cProfile
import gzip
import os
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt  # noqa: E402
from zero3bench.accounting import comms  # noqa: E402

OUT = Path(os.environ.get("PROFILE_OUT", "profile"))
TAG = os.environ.get("PROFILE_TAG", "run")
RANK = os.environ.get("RANK", "0")
kernel_seconds, train = comms.kernel_seconds, train_gpt.train


def tables_and_kernel_seconds(prof):
    OUT.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    tables = [averages.table(sort_by=key, row_limit=45) for key in ("self_device_time_total", "self_cpu_time_total")]
    (OUT / f"{TAG}_rank{RANK}.txt").write_text("\n\n".join(tables))
    if RANK == "0":
        prof.export_chrome_trace(str(OUT / f"{TAG}_trace.json"))
        with open(OUT / f"{TAG}_trace.json", "rb") as f, gzip.open(OUT / f"{TAG}_trace.json.gz", "wb") as g:
            g.write(f.read())
        os.remove(OUT / f"{TAG}_trace.json")
    return kernel_seconds(prof)


def profiled_train(*args):
    if RANK != "0" or not os.environ.get("PY_PROFILE"):
        return train(*args)
    profile = cProfile.Profile()
    profile.runcall(train, *args)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{TAG}_python.txt", "w") as f:
        for key in ("tottime", "cumulative"):
            pstats.Stats(profile, stream=f).sort_stats(key).print_stats(60)


comms.kernel_seconds, train_gpt.train = tables_and_kernel_seconds, profiled_train
train_gpt.main()
