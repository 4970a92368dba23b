"""
Where a step's time goes (issue 13): train_gpt.py as it is, run under the deepspeed launcher, with what its
profiled last step saw written out per rank: the top operators by GPU time and by CPU time, and rank 0's
trace. PY_PROFILE=1 also profiles rank 0's training loop in Python (cProfile), slowing it. MEMORY=1 records the
device memory of the step before the last and writes, per rank, what was live at its peak, by the code that
allocated it.
  PROFILE_OUT=dir PROFILE_TAG=name deepspeed --num_gpus 2 benchmarks/profile_step.py [train_gpt.py options]
"""
import cProfile
import collections
import gzip
import os
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt  # noqa: E402
from accounting import comms  # noqa: E402

OUT = Path(os.environ.get("PROFILE_OUT", "profile"))
TAG = os.environ.get("PROFILE_TAG", "run")
RANK = os.environ.get("RANK", "0")
kernel_seconds, train, get_batch = comms.kernel_seconds, train_gpt.train, train_gpt.get_batch
STEPS = {}
# the innermost frame in this code, not torch's plumbing, names an allocation
OWNERS = ("site-packages/deepspeed/", "train_gpt.py", "fsdp2.py", "torch/distributed/fsdp/", "torch/optim/",
          "torch/utils/checkpoint.py")


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


def owner(frames):
    for f in frames:
        if any(o in f["filename"] for o in OWNERS):
            return f"{f['filename'].split('site-packages/')[-1].split('/work/')[-1]}:{f['line']} {f['name']}"
    return "(no Python frame: autograd's own thread)" if not frames else f"{frames[0]['filename']}:{frames[0]['name']}"


def live_at_peak(trace):
    """Replay the step's allocations: the bytes live at the highest point, by owner, of those allocated within
    the step (tensors older than the step and freed in it count against their owner)."""
    live, total, peak, at_peak, last, peak_alloc = {}, 0, 0, {}, None, None
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], owner(e["frames"]))
            total += e["size"]
            last = live[e["addr"]][1]
        elif e["action"] == "free_completed":
            size, who = live.pop(e["addr"], (e["size"], "(older than the step) " + owner(e["frames"])))
            total -= size
            if who.startswith("(older"):
                live[("older", len(live), e["addr"])] = (-size, who)
        if total > peak:
            peak, at_peak, peak_alloc = total, dict(live), last
    by_owner = collections.Counter()
    for size, who in at_peak.values():
        by_owner[who] += size
    return peak, peak_alloc, by_owner


def recording_get_batch(tokens, seed, step, *args):
    """Record the step before the last: the last runs under torch's profiler, which recording disturbed
    (cross_entropy returned NULL on an H200)."""
    if os.environ.get("MEMORY") and step in (STEPS["last"] - 1, STEPS["last"]):
        import torch
        torch.cuda.synchronize()
        if step == STEPS["last"]:
            write_live_at_peak(torch.cuda.memory._snapshot())
            torch.cuda.memory._record_memory_history(enabled=None)
        else:
            STEPS["before"] = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    return get_batch(tokens, seed, step, *args)


def write_live_at_peak(snapshot):
    import torch
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    peak, peak_alloc, by_owner = live_at_peak(trace)
    OUT.mkdir(parents=True, exist_ok=True)
    gib = 2 ** 30
    lines = [f"allocated when the step began: {STEPS['before'] / gib:.3f} GiB; the step's highest point "
             f"{peak / gib:.3f} GiB above it ({(STEPS['before'] + peak) / gib:.3f} GiB), reached allocating in "
             f"{peak_alloc}; {len(trace)} events", "", "GiB live at that point, by the code that allocated it:"]
    lines += [f"{size / gib:9.3f}  {who}" for who, size in by_owner.most_common() if abs(size) >= 2 ** 20]
    (OUT / f"{TAG}_memory_rank{RANK}.txt").write_text("\n".join(lines) + "\n")


def counted_train(engine, args, *rest):
    STEPS["last"] = args.steps
    profiled_train(engine, args, *rest)


comms.kernel_seconds, train_gpt.train = tables_and_kernel_seconds, counted_train
train_gpt.get_batch = recording_get_batch
train_gpt.main()
