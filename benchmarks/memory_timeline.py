"""
Where the peak of a step goes (issue 13), without recording the allocator's history (which broke the step on
the H200s): train_gpt.py as it is, with the device memory allocated, the running peak, and (ZeRO-3) the
elements of the gathered non-persistent parameters written at each gather and release of parameters, at the
forward of each top-level module and around backward and the optimizer step, and the host's resident set, now
and its peak so far. One CSV per rank; rank 0 prints the last step's largest moments and where its peak was reached.
train_gpt.py --timeline (zero3bench/timeline.py) now records these points in any run, into its record, and the report
draws them; this script adds ZeRO's own internal moments, every step, the live tensors, and resets the peak at each
row (so its run's RESULT peaks are not the step's).
  TIMELINE_OUT=dir TIMELINE_TAG=name deepspeed --num_gpus 2 benchmarks/memory_timeline.py [train_gpt.py options]
"""
import collections
import csv
import gc
import os
import re
import resource
import sys
from pathlib import Path

import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt  # noqa: E402

OUT = Path(os.environ.get("TIMELINE_OUT", "timeline"))
TAG = os.environ.get("TIMELINE_TAG", "run")
RANK = os.environ.get("RANK", "0")
TOP_LEVEL = re.compile(r"^(wte|wpe|blocks\.\d+|ln_f|lm_head)$")
GiB = 2 ** 30
# on CPU ranks (a dry run of the wiring) only the gathered elements mean anything
allocated, peak = ((torch.cuda.memory_allocated, torch.cuda.max_memory_allocated) if torch.cuda.is_available()
                   else (lambda: 0, lambda: 0))
rows, state = [], {"step": 1, "params": [], "names": {}}
# TIMELINE_LIVE=N: in step N, at each bucket's reduction, the CUDA tensors that Python holds and the allocator's
# live blocks, by size, into TAG_live_rankR.txt: what piles up where the allocated memory climbs
LIVE_STEP = int(os.environ.get("TIMELINE_LIVE", "0"))
live_lines = []


def rss_gib():
    """The process's resident set now, and its peak so far: the host memory that offload costs."""
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return now / GiB, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB


def live_census(event):
    """Python's CUDA tensors by (dtype, elements) and the allocator's active blocks by MiB, most bytes first."""
    held = collections.Counter()
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda and o.numel() > (1 << 20):
            held[(str(o.dtype), o.numel(), o.untyped_storage().data_ptr())] += 1
    by_size = collections.Counter((dtype, n) for dtype, n, _ in held)
    blocks = collections.Counter(round(b["size"] / 2 ** 20) for seg in torch.cuda.memory._snapshot()["segments"]
                                 for b in seg["blocks"] if b["state"] == "active_allocated" and b["size"] >= 2 ** 20)
    live_lines.append(f"{event} allocated {allocated() / GiB:.3f} GiB; tensors {sorted(by_size.items())}; "
                      f"blocks MiB {sorted(blocks.items())}")


def gathered_elements():
    """Elements of the ZeRO-3 parameters that are whole on this rank now, persistent ones and those still in
    flight (prefetched, not yet waited for) left out."""
    return sum(p.ds_numel for p in state["params"]
               if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE and not p.ds_persist)


def note(event, where=""):
    """A row; its interval_peak_gib is the most allocated since the row before (the peak is reset at each row)."""
    interval = peak() / GiB
    state["peak"] = max(state.get("peak", 0.0), interval)
    rss, peak_rss = rss_gib()
    rows.append({"step": state["step"], "event": event, "where": where,
                 "allocated_gib": allocated() / GiB,
                 "peak_gib": state["peak"], "interval_peak_gib": interval,
                 "gathered_elements": gathered_elements(), "rss_gib": rss, "peak_rss_gib": peak_rss})
    if state["step"] == LIVE_STEP and event.endswith("ipg_grads done") and torch.cuda.is_available():
        live_census(event)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def around(owner, name):
    """A row before and after each call of owner.name, where the installed DeepSpeed has it: its optimizers'
    own moments (the reduction of a bucket, the overflow check, the step's fp32 gradients)."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def wrapped(*args, **kwargs):
        note(name)
        result = original(*args, **kwargs)
        note(f"{name} done")
        return result
    setattr(owner, name, wrapped)


def watch_zero_internals():
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Stage12
    for name in ("reduce_ipg_grads", "average_tensor", "allreduce_and_scatter", "get_flat_partition",
                 "_optimizer_step", "unscale_and_clip_grads"):
        around(Stage12, name)
    for name in ("_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", "partition_grads",
                 "has_overflow", "_prepare_fp32_grad_for_sub_group", "_optimizer_step", "unscale_and_clip_grads",
                 "_reassign_or_swap_out_partitioned_parameters"):
        around(Stage3, name)
    for name in ("step", "unscale_and_clip_grads"):
        around(FP16_Optimizer, name)


def after(owner, name, event, where_of):
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        note(event, where_of(*args, **kwargs))
        return result
    setattr(owner, name, wrapped)


def watch_zero3():
    def where(self, module, forward=False):
        return f"{state['names'].get(module, type(module).__name__)} {'fwd' if forward else 'bwd'}"
    after(PartitionedParameterCoordinator, "fetch_sub_module", "gathered", where)
    after(PartitionedParameterCoordinator, "release_sub_module", "released", where)


def watch_fsdp2():
    def where(self, *args, **kwargs):
        return str(self._module_fqn)
    for name in ("wait_for_unshard", "reshard", "post_backward"):
        after(FSDPParamGroup, name, name, where)


def watch(engine):
    model = engine.module
    state["params"] = list(model.parameters())
    state["names"] = {m: n or "model" for n, m in model.named_modules()}
    for module, name in state["names"].items():
        if TOP_LEVEL.match(name):
            module.register_forward_pre_hook(lambda m, a, name=name: note("forward", name))
            module.register_forward_hook(lambda m, a, o, name=name: note("forward done", name))
    for method, event in (("backward", "backward"), ("step", "optimizer step")):
        original = getattr(engine, method)

        def wrapped(*args, original=original, event=event, **kwargs):
            note(event)
            result = original(*args, **kwargs)
            note(f"{event} done")
            state["step"] += event == "optimizer step"
            return result
        setattr(engine, method, wrapped)


def summary(steps):
    last = [r for r in rows if r["step"] == steps]
    peak = max(r["interval_peak_gib"] for r in last)
    reached = next(i for i, r in enumerate(last) if r["interval_peak_gib"] >= peak - 1e-6)
    lines = [f"step {steps}: peak {peak:.2f} GiB, first seen at event {reached} of {len(last)}: "
             f"between {last[reached - 1]['event']} {last[reached - 1]['where']} and "
             f"{last[reached]['event']} {last[reached]['where']}" if reached else f"step {steps}: peak {peak:.2f} GiB"]
    lines.append(f"most gathered: {max(r['gathered_elements'] for r in last):,} elements")
    for i, r in sorted(enumerate(last), key=lambda ir: -ir[1]["interval_peak_gib"])[:12]:
        before = last[i - 1] if i else {"event": "the step's start", "where": ""}
        lines.append(f"  {r['interval_peak_gib']:6.2f} GiB at most between {before['event']} {before['where']} and "
                     f"{r['event']} {r['where']} ({r['allocated_gib']:.2f} allocated after, "
                     f"{r['gathered_elements']:,} gathered)")
    return "\n".join(lines)


build_engine, train = train_gpt.build_engine, train_gpt.train


def watched_engine(model, run, config):
    engine = build_engine(model, run, config)
    note("engine ready")
    (watch_fsdp2 if run.engine == "fsdp2" else watch_zero3)()
    if run.engine != "fsdp2":
        watch_zero_internals()
    watch(engine)
    return engine


def watched_train(engine, run, *rest):
    try:
        train(engine, run, *rest)
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        with open(OUT / f"{TAG}_rank{RANK}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        if live_lines:
            (OUT / f"{TAG}_live_rank{RANK}.txt").write_text("\n".join(live_lines) + "\n")
        if RANK == "0":
            text = summary(run.steps_planned)
            (OUT / f"{TAG}_summary.txt").write_text(text + "\n")
            print(text, flush=True)


train_gpt.build_engine, train_gpt.train = watched_engine, watched_train
train_gpt.main()
