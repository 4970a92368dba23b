"""
A rank's memory through its first and last steps (--timeline; the record keeps the last, or the one that failed), at
each hook: a point as each watched module's forward starts and
ends and as its output's gradient is made, as ZeRO-3 gathers and releases a module's weights (DeepSpeed's parameter
coordinator) or FSDP2 unshards and reshards a group, and around backward and the optimizer step. A point holds what is
allocated, the peak so far in the step, the host's resident set and the weights held whole (parts.Point). On a CPU
rank the resident set stands for what is allocated, sampled at the hooks alone.

The hooks are installed for a traced step and removed after it, so that the other steps run as without them; a traced
step is marked (parts.Step.traced) and not timed. --timeline=snapshot also records the CUDA allocator's history
through the step and dumps it, per rank, for PyTorch's memory viewer (https://pytorch.org/memory_viz).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
from deepspeed.runtime.zero.utils import is_zero_param

from zero3bench import parts, stages
from zero3bench.options import Run

MAX_POINTS = 600  # a record's points at most: 1.3b's stage-3 step makes about 400 (24 blocks)
SNAPSHOT_ENTRIES = 200_000  # the allocator's history at most: its snapshot grows with each entry
# torch.cuda.memory._record_memory_history with Python stacks made cross_entropy_loss return NULL ("SystemError ...
# returned NULL without setting an exception") in a checkpoint's recompute in stage 3's backward on the H200s, with
# the profiler and without (benchmarks/logs/h200x2/13-fsdp2/12-memory); on an H100 the same, in torch's own
# checkpointed GPT without DeepSpeed too, with Python stacks or all (benchmarks/snapshot_repro.py says whether a
# version still breaks). Keyed by torch's major.minor: the defect is torch's.
SNAPSHOT_BREAKS = {"2.11": "cross_entropy_loss returned NULL in a checkpoint's recompute in backward, without "
                           "DeepSpeed too (benchmarks/logs/h100/3-timeline/snapshot_repro.txt)"}


def refusal(run: Run, on_gpu: bool, torch_version: str) -> str | None:
    """Why this run cannot record its timeline as asked, in one line, or None."""
    if run.timeline and run.deepcompile:
        return ("--timeline cannot trace DeepCompile, which gathers and releases the weights in its own graph, "
                "unseen by the hooks")
    if run.timeline != "snapshot":
        return None
    if not on_gpu:
        return ("--timeline=snapshot records the CUDA allocator's history, which a CPU rank has not: --timeline traces "
                "the resident set instead")
    defect = SNAPSHOT_BREAKS.get(".".join(torch_version.split(".")[:2]))
    if defect:
        return (f"--timeline=snapshot: recording the allocator's history breaks the step with torch {torch_version}: "
                f"{defect}; --timeline traces the memory without it")
    return None


class MallInfo2(ctypes.Structure):
    """glibc's mallinfo2 (2.33 on): what malloc holds, in its arenas and in blocks of their own (mmap)."""
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def mallinfo2() -> Callable[[], MallInfo2] | None:
    """glibc's mallinfo2, or None where the C library has none (musl, macOS, glibc before 2.33)."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = MallInfo2
    return function


def host_allocated(rss: int) -> tuple[str, int]:
    """What a CPU rank has allocated now: the bytes that malloc has handed out and not had back (torch's CPU tensors
    among them: the resident set keeps what malloc frees, and so hides a step's rise and fall), or where the C
    library cannot say, the resident set."""
    info = mallinfo2()
    return ("malloc", info().uordblks + info().hblkhd) if info else ("rss", rss)


def places(model: torch.nn.Module) -> dict[torch.nn.Module, tuple[str, int | None]]:
    """Every module of the model by its name and the number of the block that holds it (model.block_class), if any."""
    blocks = [m for m in model.modules() if isinstance(m, model.block_class)]
    where: dict[torch.nn.Module, tuple[str, int | None]] = {
        module: (name or "model", None) for name, module in model.named_modules()}
    for number, block in enumerate(blocks):
        for module in block.modules():
            where[module] = (where[module][0], number)
    return where


def watched_modules(model: torch.nn.Module, where: dict[torch.nn.Module, tuple[str, int | None]]) -> list[Any]:
    """The modules whose forward and backward the timeline marks: the whole model, each of its blocks and each module
    outside the blocks that holds weights of its own (the embeddings, the final norm, the output layer)."""
    return [m for m, (_, block) in where.items() if m is model or isinstance(m, model.block_class)
            or block is None and any(True for _ in m.parameters(recurse=False))]


def first_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of a module's output (a tensor, or a tuple or dict of them) that autograd will differentiate."""
    flat, _ = torch.utils._pytree.tree_flatten(output)
    return next((t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad), None)


class Recorder:
    """The timeline of one rank: step(traced) traces the step within it, and record() gives what it saw."""

    def __init__(self, engine: Any, run: Run, device: torch.device, rank: int, world: int) -> None:
        self.engine, self.run, self.device, self.rank, self.world = engine, run, device, rank, world
        self.where = places(engine.module)
        self.watched = watched_modules(engine.module, self.where)
        self.params = list(engine.module.parameters())
        self.fsdp_groups = fsdp_groups(engine.module) if run.engine == "fsdp2" else []
        self.process = psutil.Process()
        self.points: list[parts.Point] = []
        self.phase, self.hooks_s, self.sampled_peak = "forward", 0.0, 0
        self.traced_step: int | None = None
        self.traced_steps: set[int] = set()
        self.undo: list[Callable[[], None]] = []
        self.snapshot: str | None = None
        self.memory = "cuda"  # what a point's allocated counts (parts.Timeline.memory)
        self.still_gathered: list[str] = []

    @contextlib.contextmanager
    def step(self, number: int, traced: bool) -> Iterator[None]:
        """Trace step number where traced; the points of an earlier traced step are dropped."""
        if not traced:
            yield
            return
        self.points, self.phase, self.hooks_s, self.sampled_peak, self.still_gathered = [], "forward", 0.0, 0, []
        self.traced_step = number
        self.traced_steps.add(number)
        self.install()
        try:
            yield
        finally:
            for undo in reversed(self.undo):
                undo()
            self.undo = []

    def marks(self, number: int) -> dict[str, bool]:
        """Step number's Step record's keys that say it was traced: {"traced": True}, or none."""
        return {"traced": True} if number in self.traced_steps else {}

    def install(self) -> None:
        for module in self.watched:
            name, block = self.where[module]
            self.undo += [module.register_forward_pre_hook(self.before_forward(name, block)).remove,
                          module.register_forward_hook(self.after_forward(name, block)).remove]
        self.wrap(self.engine, "backward", "backward", then=self.after_backward)
        self.wrap(self.engine, "step", "optimizer")
        if self.run.engine == "fsdp2":
            self.watch_fsdp2()
        elif stages.shards_params(self.run.stage):
            self.watch_zero3()
        if self.run.timeline == "snapshot":
            self.record_history()

    def note(self, event: str, module: str = "", block: int | None = None) -> None:
        """A point, and its own seconds in hooks_s."""
        started = time.perf_counter()
        rss = self.process.memory_info().rss
        if self.device.type == "cuda":
            allocated, peak = torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device)
        else:
            self.memory, allocated = host_allocated(rss)
            self.sampled_peak = peak = max(self.sampled_peak, allocated)
        gathered = self.fsdp2_gathered() if self.fsdp_groups else self.gathered_bytes(self.params)
        self.points.append(parts.Point(self.phase, event, module, block, allocated, peak, rss, gathered))
        self.hooks_s += time.perf_counter() - started

    def gathered_bytes(self, params: Any) -> int:
        """The bytes of ZeRO-3's partitioned weights among params that are whole on this rank now (as
        measure.gathered_tensors counts them: a partitioned one holds no elements), persistent ones aside; those
        whose gather is in flight among them, as their buffer is."""
        return sum(p.numel() * p.element_size() for p in params if is_zero_param(p) and not p.ds_persist)

    def fsdp2_gathered(self) -> int:
        return sum(fsdp_param._orig_size.numel() * (fsdp_param.param_dtype or fsdp_param.orig_dtype).itemsize
                   for group in self.fsdp_groups if group.is_unsharded for fsdp_param in group.fsdp_params)

    def gathered_modules(self) -> list[str]:
        """The watched modules (the whole model aside) whose partitioned weights are whole now: FSDP2's unsharded
        groups, or those of ZeRO-3's weights that a module holds (a block's, its own)."""
        if self.fsdp_groups:
            return [group._module_fqn or "model" for group in self.fsdp_groups if group.is_unsharded]
        return [self.where[m][0] for m in self.watched if m is not self.engine.module
                and self.gathered_bytes(m.parameters(recurse=self.where[m][1] is not None))]

    def before_forward(self, name: str, block: int | None) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.note("forward", name, block)
        return hook

    def after_forward(self, name: str, block: int | None) -> Callable[..., None]:
        """A point as forward ends, and a hook on the output, whose gradient marks the module's backward."""
        def at_backward(grad: torch.Tensor) -> None:
            self.note("backward", name, block)

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.note("forward done", name, block)
            tensor = first_tensor(output)
            if tensor is not None and torch.is_grad_enabled():
                tensor.register_hook(at_backward)
        return hook

    def after_backward(self) -> None:
        """What stays gathered once backward has returned: ZeRO-3 and FSDP2 release every weight by then."""
        self.still_gathered = self.gathered_modules()

    def wrap(self, owner: Any, method: str, phase: str, then: Callable[[], None] | None = None) -> None:
        """owner.method as a phase of the step: a point as it starts and as it ends, and then what then does. The
        attribute is set on owner itself and put back as it was after the step (a planted fault's wrapper among
        them)."""
        original, own = getattr(owner, method), owner.__dict__.get(method)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.phase = phase
            self.note(method)
            result = original(*args, **kwargs)
            self.note(f"{method} done")
            if then:
                then()
            return result
        setattr(owner, method, wrapped)
        self.undo.append(lambda: setattr(owner, method, own) if own is not None else delattr(owner, method))

    def after(self, owner: type, method: str, event: str, module_of: Callable[..., torch.nn.Module | None]) -> None:
        """A point after each call of a class's method (a library's own), named by the module it handles."""
        original = owner.__dict__[method]

        def wrapped(this: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(this, *args, **kwargs)
            self.note(event, *self.where.get(module_of(this, *args, **kwargs), ("", None)))
            return result
        setattr(owner, method, wrapped)
        self.undo.append(lambda: setattr(owner, method, original))

    def watch_zero3(self) -> None:
        def module(this: Any, submodule: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
            return submodule
        self.after(PartitionedParameterCoordinator, "fetch_sub_module", "gathered", module)
        self.after(PartitionedParameterCoordinator, "release_sub_module", "released", module)

    def watch_fsdp2(self) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        by_fqn = {name if m is not self.engine.module else "": m for m, (name, _) in self.where.items()}

        def module(this: Any, *args: Any, **kwargs: Any) -> torch.nn.Module | None:
            return by_fqn.get(this._module_fqn or "")
        self.after(FSDPParamGroup, "wait_for_unshard", "gathered", module)
        self.after(FSDPParamGroup, "reshard", "released", module)

    def record_history(self) -> None:
        """The CUDA allocator's history through the step, dumped as it ends (SNAPSHOT_BREAKS: where it breaks)."""
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
        path = snapshot_path(self.run, self.rank, self.world)

        def dump() -> None:
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.snapshot = str(path)
        self.undo.append(dump)

    def record(self) -> parts.Timeline | None:
        """What the traced step saw, at most MAX_POINTS points; None where no step was traced."""
        if self.traced_step is None:
            return None
        kept = thinned(self.points, MAX_POINTS)
        return parts.Timeline.made(step=self.traced_step, memory=self.memory,
                                   rows=[p.row() for p in kept], left_out=len(self.points) - len(kept),
                                   hooks_s=self.hooks_s, still_gathered=self.still_gathered, snapshot=self.snapshot)


class Untraced:
    """A run without --timeline: no step is traced."""

    @contextlib.contextmanager
    def step(self, number: int, traced: bool) -> Iterator[None]:
        yield

    def marks(self, number: int) -> dict[str, bool]:
        return {}

    def record(self) -> None:
        return None


def attach(engine: Any, run: Run, device: torch.device, rank: int, world: int) -> Recorder | Untraced:
    return Recorder(engine, run, device, rank, world) if run.timeline else Untraced()


def fsdp_groups(model: torch.nn.Module) -> list[Any]:
    """FSDP2's parameter groups, one per module that fully_shard wrapped (torch's private state: 2.6 to 2.11 keep one
    group a module, later versions a list)."""
    groups = []
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        if state is not None:
            groups += getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
    return [g for g in groups if g is not None]


def snapshot_path(run: Run, rank: int, world: int) -> Path:
    """Where a rank's snapshot goes: beside run.sh's logs (the folder that its runs carry in ZERO3_BENCH_RUN), else
    the current folder; named after the run as run.sh names its log."""
    name = "fsdp2" if run.engine == "fsdp2" else Path(run.config or "").stem.replace("ds_config_", "")
    return Path(os.environ.get("ZERO3_BENCH_RUN", ".")) / f"{name}_{world}ranks_memory_snapshot_rank{rank}.pickle"


def thinned(points: list[parts.Point], most: int) -> list[parts.Point]:
    """At most `most` of the points, in order: the first and last of each phase, the one where the peak was reached
    and the one before it, and others evenly spaced."""
    if len(points) <= most:
        return points
    reached = next(i for i, p in enumerate(points) if p.peak == max(q.peak for q in points))
    ends = {i for i in range(1, len(points)) if points[i].phase != points[i - 1].phase}
    must = {0, len(points) - 1, reached, max(reached - 1, 0)} | ends | {i - 1 for i in ends}
    others = [i for i in range(len(points)) if i not in must]
    room = max(most - len(must), 0)
    return [points[i] for i in sorted(must | {others[k * len(others) // room] for k in range(room)})]
