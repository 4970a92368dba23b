"""
A DeepSpeed ZeRO benchmark: train a GPT for a few steps and report, per rank, what ZeRO partitions, how
much memory the model states take against the ZeRO paper's prediction, the losses and the speed.

    deepspeed --num_gpus 4 train_gpt.py --stage 3     # or torchrun, srun, mpirun, or plain python for one rank
    python train_gpt.py --check --stage 3             # check the inputs and say how they are read; no training

It reads top to bottom as data, training, build and report. Rank 0 prints each rank's lines and one
`RESULT {json}` line per rank (result.RankResult), which report.py reads back. Exit status (the same meanings
in run.sh and report.py): 0 done, 1 failed, 2 bad input, 3 out of memory, 4 the loss diverged.
"""
import math
import os
import signal
import time
import traceback
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

import deepspeed
import numpy as np
import psutil
import torch
from deepspeed import comm as dist

from zero3bench import compat, exits, finishing, fsdp2, hf, machine, options, parts, rank_lines, result, stages
from zero3bench import timeline
from zero3bench.inputs import chosen, prediction_line, resolve, shape_for
from zero3bench.accounting import comms, hostpass, measure
from zero3bench.accounting.shapes import PRESETS, as_record
from zero3bench.formatting import START, log, phase, size
from model import DTYPES, GPT, HuggingFace

IMPORTED = time.time()  # where the run's timing (summary.json) puts the end of the imports

# -----------------------------------------------------------------------------
# data: deterministic for a seed and a step, the same at every stage (the token stream: zero3bench/inputs.py)


def get_batch(tokens, seed, step, rank, micro_batch, world, seq, device):
    """This rank's rows of the global batch for this step: random windows, the same for any stage. The first
    options.SAME_ROWS_STEPS steps train on step 1's rows, so that the loss the verdict judges there follows one
    batch as it trains: with fresh rows, a batch's difficulty moved 1.3b's loss more than a step did."""
    draw = 1 if step <= options.SAME_ROWS_STEPS else step
    starts = np.random.default_rng([seed, draw]).integers(0, len(tokens) - seq, size=world * micro_batch)
    rows = np.stack([tokens[s: s + seq + 1] for s in starts[rank * micro_batch: (rank + 1) * micro_batch]])
    rows = torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True)
    return rows[:, :-1], rows[:, 1:]


def learning_rate(step, run):
    """A linear warm-up to --lr over --warmup steps (none by default), then --lr. Step 0, where the
    optimizer is built, has rate 0."""
    return run.lr * min(1.0, step / max(run.warmup, 1))


# -----------------------------------------------------------------------------
# training


class Stop:
    """Why training ends before its last step, agreed by every rank: a signal (SIGINT, SIGTERM) that any rank
    received, or a loss that diverged. A signal before training interrupts at once; during training, at the
    end of the step, once every rank knows (the flag travels with the loss); after it, nothing."""
    phase, signal, signalled, reason = "starting", None, False, None

    @classmethod
    def on_signal(cls, signum, frame):
        cls.signal = signum
        if cls.phase == "starting":
            cls.phase = "done"  # a second signal must not interrupt the report of the first
            raise Interrupted(f"interrupted by {signal.Signals(signum).name} before training")

    @classmethod
    def interrupted_by(cls, signalled):
        """The signal's name; a rank that a peer's flag stopped did not see which."""
        return signal.Signals(cls.signal).name if cls.signal else "a peer's signal" if signalled else None


class Interrupted(Exception):
    pass


def diverged(loss, first):
    """Why a loss ends the run: not finite, or past options.DIVERGED_FACTOR times the first step's."""
    if not math.isfinite(loss):
        return "the loss is not finite"
    if loss > options.DIVERGED_FACTOR * first:
        return f"the loss {loss:.4g} is over {options.DIVERGED_FACTOR}x the first step's {first:.4g}"
    return None


def all_reduced_loss(loss, device):
    """The global batch's loss, summed over the ranks with each rank's stop flag: every rank sees the same."""
    both = torch.stack([loss.detach().float(), torch.tensor(float(Stop.signal is not None), device=device)])
    dist.all_reduce(both)
    return both[0].item(), both[1].item() > 0


def train(engine, run, tokens, device, r, trace):
    """Run the steps into r.steps (result.RankResult.steps) until --steps have been applied: rows and rate follow
    the applied steps, so a skipped one is tried again. With NCCL between ranks, from 3 steps on, the last runs
    under the profiler, which times NCCL's kernels. With --timeline, trace (timeline.Recorder) traces the first step,
    where an out-of-memory most often comes, and the last. A signal or a diverged loss ends the steps on every rank."""
    nccl = device.type == "cuda" and r.world_size > 1 and not r.rehearsal
    # a model's dropout draws from here: every stage's training starts from one state, whatever zero.Init and the
    # engine drew before (GPT-2's dropout of 0.1 had put stage 3's weights 0.37% from stage 0's after 3 steps)
    torch.manual_seed(run.seed + r.rank)
    Stop.phase = "training"
    for step in range(1, run.steps_planned + options.MAX_SKIPPED_STEPS + 1):
        trained = r.applied_steps  # the step counts as the next one trained: its rows, its rate
        x, y = get_batch(tokens, run.seed, trained + 1, r.rank, run.micro_batch, r.world_size, run.seq, device)
        last = trained + 1 == run.steps_planned
        with comms.step(device, profiled=last and trained >= 2 and nccl) as comm, trace.step(step, last or step == 1):
            loss, signalled, elapsed = timed_step(engine, run, trained + 1, x, y, device, r if last else None)
        s = parts.Step.made(  # its RESULT record carries the keys of this device's memory snapshot alone
            step=step, loss=loss / r.world_size, lr=engine.get_lr()[0], applied=engine.was_step_applied(),
            loss_scale=machine.loss_scale(engine) if run.dtype == "fp16" else None,
            time_s=elapsed, memory=measure.memory_snapshot(device), **comm, **trace.marks(step))
        r.steps.append(s)
        if s.applied and r.applied_steps == min(options.SAME_ROWS_STEPS, run.steps_planned):
            r.trained_checksum = measure.weights_checksum(engine.module, r.rank, device, squared=True)  # for (c)
        log(r.rank, rank_lines.step_line(r, s))
        Stop.signalled = signalled
        Stop.reason = f"interrupted by {Stop.interrupted_by(True)}" if signalled else diverged(s.loss, r.first_loss)
        if Stop.reason or r.applied_steps == run.steps_planned:
            break
    if Stop.reason:
        log(r.rank, f"stopped after step {step} of {run.steps_planned}: {Stop.reason}")
    Stop.phase = "done"


def timed_step(engine, run, step, x, y, device, counts_into):
    """One step, timed apart from the census: where counts_into is the rank's result, its model states are
    counted after backward and after the optimizer step, outside the timed region. Returns the summed loss, whether
    any rank was signalled, and the seconds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync()
    t0 = time.perf_counter()
    loss = engine(x, y)
    engine.backward(machine.loss_for_backward(engine, loss))
    sync()
    elapsed = time.perf_counter() - t0
    counted = measure.model_states_now(engine, device, run.offload) if counts_into else None
    if engine.lr_scheduler is None:  # a config's own scheduler sets the rate instead
        for group in engine.optimizer.param_groups:
            group["lr"] = learning_rate(step, run)
    sync()
    t0 = time.perf_counter()
    engine.step()
    loss, signalled = all_reduced_loss(loss, device)
    sync()
    if counts_into:
        counts_into.model_state_breakdown, counts_into.host_state_breakdown = (
            measure.combined(a, b) if a else None
            for a, b in zip(counted, measure.model_states_now(engine, device, run.offload)))
        counts_into.gathered_tensors = measure.gathered_tensors(engine.module)
    return loss, signalled, elapsed + time.perf_counter() - t0


# -----------------------------------------------------------------------------
# build: processes, model, engine (the inputs, checked and resolved: zero3bench/inputs.py)


@dataclass(frozen=True)
class Placement:
    """How the ranks sit on the GPUs (init_distributed), under the names of RankResult's fields."""
    ranks_per_node: int
    ranks_per_gpu: int
    gpus: int
    rehearsal: bool


def init_distributed(timeout_s):
    """Join the process group. With more ranks on a host than GPUs, the ranks share the GPUs over gloo: a
    rehearsal, in which each rank's memory is real but speed is not. Returns the device, how the ranks sit on
    the GPUs (Placement), and a gloo group of its own in which a timed-out rank asks which peer stopped answering."""
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    local_size = machine.local_ranks(world)
    if torch.cuda.is_available():
        gpus_here = torch.cuda.device_count()
        device = machine.use_gpu(local_rank % gpus_here)
        ranks_per_gpu = math.ceil(local_size / gpus_here)
        gpus = world // local_size * min(local_size, gpus_here)
        backend = "gloo" if ranks_per_gpu > 1 else "nccl"  # NCCL refuses two ranks on one GPU
    else:
        device, ranks_per_gpu, gpus, backend = torch.device("cpu"), 1, world, "gloo"
        torch.set_num_threads(max(1, hostpass.host_cores() // local_size))  # a cpuset's or taskset's cores
    comms.count_collectives()
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    watch = torch.distributed.new_group(backend="gloo")  # a timed-out group has closed its links to the silent rank
    return device, Placement(ranks_per_node=local_size, ranks_per_gpu=ranks_per_gpu, gpus=gpus,
                             rehearsal=ranks_per_gpu > 1), watch


def build_model(run, config, device):
    """Build the model on the device in the training dtype: at stage 3 inside zero.Init, which partitions each
    parameter as its module is built, so no rank ever holds the whole model; FSDP2 shards it once it is whole.
    A Hugging Face model is built by transformers (hf.build), which enters zero.Init itself. Returns the model and
    how it was built (parts.Built)."""
    torch.manual_seed(run.seed)
    torch.set_default_dtype(DTYPES[run.dtype])  # zero.Init creates this dtype too: the same init values
    zero3 = stages.shards_params(run.stage) and run.engine == "deepspeed"
    shape, hf_config = chosen(run.model)
    if hf_config is None:
        with deepspeed.zero.Init(config_dict_or_path=config) if zero3 else torch.device(device):
            model = GPT(shape, checkpoint=run.checkpoint)
        by, attention, record = "model.py", hf.ATTENTION, None
    else:
        record = as_record(shape_for(run))  # counted on the meta device, before transformers enters zero.Init
        inner, kept = hf.build(hf_config, DTYPES[run.dtype], config if zero3 else None, device, run.checkpoint)
        model = HuggingFace(inner, shape, hf.layer_class(inner), kept)
        by, attention = hf.built_by(), inner.config._attn_implementation
    torch.set_default_dtype(torch.float32)
    built = parts.Built(by=by, architecture=type(getattr(model, "hf", model)).__name__,
                        partitioned="zero.Init" if zero3 else None, attention=attention,
                        peak_bytes=measure.memory_snapshot(device).peak_mem_bytes, shape=record)
    return model, built


def decay_groups(model):
    """GPT-3's decay: 0.1 on matrices, none on biases and LayerNorms; DeepSpeed's CPU Adam (offload) gets them too."""
    matrix = {p: len(getattr(p, "ds_shape", p.shape)) >= 2 for p in model.parameters()}
    return [{"params": [p for p, m in matrix.items() if m], "weight_decay": 0.1},
            {"params": [p for p, m in matrix.items() if not m], "weight_decay": 0.0}]


def adamw(model, lr, fused):
    """AdamW as in GPT-3. torch's fused kernel needs no JIT build: DeepSpeed's FusedAdam took 42 s to build on
    an H200, held 4.9 GiB more at stage 0 and was 7% faster at micro batch 2 (benchmarks/logs/h200/1-first-look).
    Where this torch has no fused kernel for the device (compat.fused_adamw), its default kernel steps."""
    return torch.optim.AdamW(decay_groups(model), lr=lr, betas=(0.9, 0.95), fused=fused)


def build_engine(model, run, config):
    """The config's optimizer if it names one (DeepSpeed builds it), else torch's fused AdamW; or FSDP2."""
    if run.compile:  # inductor draws its own random numbers unless told: a model's dropout then as the eager run's
        from torch._inductor import config as inductor
        inductor.fallback_random = True
    if run.engine == "fsdp2":
        model = fsdp2.shard(model, DTYPES[run.dtype], run.compile)
        return fsdp2.Engine(model, adamw(model, learning_rate(0, run), run.fused_adamw),
                            config.get("gradient_clipping", 0))
    optimizer = None if "optimizer" in config else adamw(model, learning_rate(0, run), run.fused_adamw)
    # ZeRO-3 gathers a whole block at once, not each Linear: 1.3x faster on one H200 at micro batch 2, for one
    # block (~100 MB) in flight. DeepCompile gathers in its own graph, which a leaf module's hooks would break.
    if stages.shards_params(run.stage) and not run.deepcompile and run.leaf_modules:  # else compat.degrade said why not
        deepspeed.utils.set_z3_leaf_modules(model, [model.block_class])
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=decay_groups(model),
                                      config=config)
    if not engine.zero_optimization() and run.dtype != "fp32":
        machine.forget_priming_step(engine.basic_optimizer)
    if run.compile:
        engine.compile()
    return engine


# -----------------------------------------------------------------------------
# measure and report


def fill(r: result.RankResult, part: Any) -> None:
    """r's fields from a dataclass of some of them (Placement). A name that is no field of r fails here: set as a
    new attribute, it would leave the RESULT line without a word."""
    for f in fields(part):
        if f.name not in {own.name for own in fields(r)}:
            raise AttributeError(f"{type(part).__name__}.{f.name} is no field of RankResult")
        setattr(r, f.name, getattr(part, f.name))


def start(run, config, tokens, r):
    """Join the process group, then build and train, filling r as it goes; a collective that times out names
    the ranks that stopped answering."""
    with phase(r.rank, "starting the process group"):
        device, placement, watch = init_distributed(run.timeout_s)
    fill(r, placement)
    r.env = machine.environment(device)
    r.link_bytes_per_s = machine.link_bandwidth(device, r.world_size, placement.rehearsal, placement.ranks_per_node)
    # said where it JIT-builds, not in the second or two it takes to load after that: one screen of run.sh's output
    if hostpass.timed_here(device, placement.rehearsal):
        with phase(r.rank, "loading DeepSpeed's CPU Adam, to time offload's host step later", quiet_under_s=30):
            r.host_pass = hostpass.load_cpu_adam()
    try:
        build_and_train(run, config, tokens, r, device)
    except RuntimeError as e:
        if any(word in str(e).lower() for word in ("timed out", "timeout")):
            raise RuntimeError(f"a collective waited {run.timeout_s:g} s: {machine.silent_ranks(watch)}") from e
        raise


def built_line(b):
    how = f"partitioned as it was built ({b.partitioned})" if b.partitioned else "whole on this rank"
    return (f"built {b.architecture} with {b.by}, {b.attention} attention, {how}; "
            f"peak while building {size(b.peak_bytes)}")


def build_and_train(run, config, tokens, r, device):
    if r.rehearsal:
        log(r.rank, f"REHEARSAL: {r.world_size} ranks share {r.gpus} GPU(s) over gloo: each rank's memory is real, "
                    "its speed is not")
    if run.max_mem_gib:
        machine.cap_memory(device, run.max_mem_gib)
        log(r.rank, f"memory capped at {run.max_mem_gib} GiB per rank"
                    + ("" if device.type == "cuda" else " of data added from now on"))
    with phase(r.rank, "building the model"):
        model, r.built = build_model(run, config, device)
    log(r.rank, built_line(r.built))
    with phase(r.rank, "starting the DeepSpeed engine"):
        engine = build_engine(model, run, config)
    r.optimizer, r.ready_s = measure.optimizer_name(engine), time.perf_counter() - START
    r.deepcompile_active = compat.deepcompile_active(engine) if run.deepcompile else False
    r.zero_config = compat.zero_config(engine)
    r.memory_at_start = measure.memory_snapshot(device)
    log(r.rank, f"ready to train; optimizer {r.optimizer}{machine.unscaled_fp16_backward(engine)}")
    r.shards = measure.shard_report(engine.module, r.world_size)
    r.weights_checksum = measure.weights_checksum(engine.module, r.rank, device)
    log(r.rank, f"{r.shards.params_total:,} parameters in {r.shards.param_tensors} tensors")
    r.flops_per_token = engine.module.flops_per_token(r.shards.params_total, run.seq)
    r.peak_tflops = machine.peak_tflops(device, run.dtype)
    r.timing["engine_ready"] = time.time()
    trace = timeline.attach(engine, run, device, r.rank, r.world_size)
    try:
        train(engine, run, tokens, device, r, trace)
    finally:  # a step that failed keeps what its trace saw up to the failure
        r.memory_timeline = trace.record()
    r.timing["trained"] = time.time()
    if not Stop.reason:
        # after the last step's memory is recorded
        r.link_busbw = comms.link_curve(device, bool(r.rehearsal or r.run.max_mem_gib))
    r.timing["probed"] = time.time()


def end_as(r, e):
    """What ended the run, in r: a failure (an exception, out of memory among them), a signal, a diverged loss."""
    if e is not None:
        r.oom = machine.out_of_memory(e)
        if not (r.oom or isinstance(e, Interrupted)):
            traceback.print_exc()  # end_as is called in the handler, where the exception is the current one
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]
    r.interrupted_by = Stop.interrupted_by(Stop.signalled)
    r.diverged = Stop.reason if Stop.reason and not Stop.signalled else None


def publish(r):
    """Rank 0 prints every rank's result; a rank that failed reports alone: its peers may be blocked in a
    collective."""
    if r.error:
        rank_lines.emit([r])
        return
    everyone = [None] * r.world_size
    torch.distributed.all_gather_object(everyone, result.as_dict(r))  # deepspeed.comm has it from 0.17.0 on
    if r.rank == 0:
        ranks = [result.RankResult.from_dict(d) for d in everyone]
        rank_lines.emit(ranks)
        print(rank_lines.rank_table(ranks), flush=True)
    dist.barrier()  # rank 0 has printed everything before any rank leaves


def main(argv=None):
    try:
        args = options.parse_args(argv, PRESETS)  # first: --help needs no launcher
        launcher = machine.checked_launcher_env()
        config, run, tokens, how = resolve(args)
    except options.BadInput as e:
        options.fail(str(e))
    if args.check is not None:
        print(how)
        print(prediction_line(run, config, args.check or int(os.environ["WORLD_SIZE"])))
        return
    machine.prepare_process(launcher)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log(rank, how)
    run, config, lines = compat.degrade(run, config, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    for line in lines:
        log(rank, line)
    r = result.RankResult(run, rank=rank, world_size=world, launcher=launcher, node=machine.launcher_node(launcher),
                          mem_kind="cuda" if torch.cuda.is_available() else "cpu_rss",
                          timing={"started": psutil.Process().create_time(), "imported": IMPORTED})
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, Stop.on_signal)
    try:
        start(run, config, tokens, r)
        end_as(r, None)
    except Exception as e:  # noqa: BLE001 -- any failure is reported as a result, with its traceback in the log
        end_as(r, e)
    Stop.phase = "done"
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    finishing.finish(r, shape_for(run), measure.memory_snapshot(device))
    # after training, so that its host memory is no part of the run's peaks
    if r.host_pass is None and hostpass.timed_here(device, bool(r.rehearsal)) and not (r.error or r.interrupted_by):
        r.host_pass = hostpass.probe(device, DTYPES[run.dtype], hostpass.partition_of(r.shards.params_total, world))
    publish(r)
    machine.leave(world, exits.rank_status(r.oom, r.error, r.interrupted_by, bool(r.diverged or r.nonfinite_loss)))


if __name__ == "__main__":
    main()
