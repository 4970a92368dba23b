"""
A DeepSpeed ZeRO benchmark: train a GPT for a few steps and report, per rank, what ZeRO partitions, how
much memory the model states take against the ZeRO paper's prediction, the losses and the speed.

    deepspeed --num_gpus 4 train_gpt.py --stage 3     # or torchrun, srun, mpirun, or plain python for one rank
    python train_gpt.py --check --stage 3             # check the inputs and say how they are read; no training

Rank 0 prints each rank's lines and one `RESULT {json}` line per rank, which report.py reads back.
Exit status (the same meanings in run.sh and report.py): 0 done, 1 failed, 2 bad input, 3 out of memory,
4 the loss is not finite.
"""
import math
import os
import signal
import sys
import sysconfig
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import deepspeed
import numpy as np
import psutil
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from deepspeed import comm as dist
from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

import compat
import config_checks
import fsdp2
import machine
import options
import record
from accounting import comms, measure, predict
from accounting.shapes import LOSS_CHUNK, PRESETS  # torch-free, so that plan.py reads the same shapes
from formatting import START, log, phase, rank_table

IMPORTED = time.time()  # where the run's timing (summary.json) puts the end of the imports
HERE = Path(__file__).resolve().parent
# DeepSpeed calls torch.distributed functions that torch has deprecated; the warnings say nothing to a user
warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+.* is deprecated")

# -----------------------------------------------------------------------------
# configuration: the model's shapes (PRESETS) and the loss's chunk are in accounting/shapes.py

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# -----------------------------------------------------------------------------
# model: GPT-2/3 style, pre-LayerNorm, learned positions, tied input and output embedding


class Linear(nn.Linear):
    """nn.Linear with GPT-2's initialisation. nn.Linear's constructor calls reset_parameters, so the init
    happens while the tensor is still whole: under zero.Init it is partitioned as the constructor returns."""

    def __init__(self, d_in, d_out, bias=True, std=0.02):
        self.std = std
        super().__init__(d_in, d_out, bias)

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    def reset_parameters(self):
        nn.init.normal_(self.weight, std=0.02)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads, proj_std):
        super().__init__()
        self.heads = heads
        self.qkv = Linear(d_model, 3 * d_model)
        self.proj = Linear(d_model, d_model, std=proj_std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model, proj_std):
        super().__init__()
        self.fc = Linear(d_model, 4 * d_model)
        self.proj = Linear(4 * d_model, d_model, std=proj_std)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, heads, proj_std):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, proj_std)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def summed_cross_entropy(logits, targets):
    return F.cross_entropy(logits.float(), targets, reduction="sum")


class GPT(nn.Module):
    def __init__(self, shape, checkpoint=False):
        super().__init__()
        self.shape, self.checkpoint = shape, checkpoint
        proj_std = 0.02 / math.sqrt(2 * shape.layers)  # GPT-2: scale the residual projections by depth
        self.wte = Embedding(shape.padded_vocab, shape.d_model)
        self.wpe = Embedding(shape.context, shape.d_model)
        # each block is built explicitly: zero.Init cannot follow modules that deep-copy a layer
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads, proj_std) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.padded_vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        logits = self.lm_head(self.ln_f(x)).flatten(0, 1)
        # the loss in fp32, a chunk of rows at a time and recomputed in backward: whole, the fp32 logits, their
        # log-softmax and its gradient would hold 12 bytes per logit, which no ZeRO stage partitions
        rows = zip(logits.split(LOSS_CHUNK), targets.flatten().split(LOSS_CHUNK))
        total = sum(torch.utils.checkpoint.checkpoint(summed_cross_entropy, *pair, use_reentrant=False)
                    for pair in rows)
        return total / targets.numel()

    def flops_per_token(self, params, seq):
        return predict.flops_per_token(params, self.shape.layers, self.shape.d_model, seq)


# -----------------------------------------------------------------------------
# data: deterministic for a seed and a step, the same at every stage


def load_tokens(path, vocab, seq):
    """The token stream: a nanoGPT .bin file (flat uint16), or else the bytes of Python's own sources, real
    text that every Python installation ships."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in sorted(stdlib.glob("*.py"))), dtype=np.uint8)
    else:
        options.check_token_file(path)
        tokens = np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, np.uint16)
    if len(tokens) < seq + 1:
        raise options.BadInput(f"the data has {len(tokens)} tokens, fewer than one row of {seq} + 1")
    # the first 16M tokens only: a corpus can be many GB; a stray id further on fails in the embedding
    if path is not None and int(tokens[: 1 << 24].max()) >= vocab:
        raise options.BadInput(f"--data {path}: token ids reach {int(tokens[: 1 << 24].max())}, outside the "
                               f"vocabulary of {vocab}")
    return tokens


def get_batch(tokens, seed, step, rank, micro_batch, world, seq, device):
    """This rank's rows of the global batch for this step: random windows, the same for any stage. The first
    options.SAME_ROWS_STEPS steps train on step 1's rows, so that the loss the verdict judges there follows one
    batch as it trains: with fresh rows, a batch's difficulty moved 1.3b's loss more than a step did."""
    draw = 1 if step <= options.SAME_ROWS_STEPS else step
    starts = np.random.default_rng([seed, draw]).integers(0, len(tokens) - seq, size=world * micro_batch)
    rows = np.stack([tokens[s: s + seq + 1] for s in starts[rank * micro_batch: (rank + 1) * micro_batch]])
    rows = torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True)
    return rows[:, :-1], rows[:, 1:]


def learning_rate(step, args):
    """A linear warm-up to --lr over --warmup steps (none by default), then --lr. Step 0, where the
    optimizer is built, has rate 0."""
    return args.lr * min(1.0, step / max(args.warmup, 1))


# -----------------------------------------------------------------------------
# build: inputs, processes, model, engine


def known_optimizer(name):
    """DeepSpeed builds its own optimizers by name and, for any other name, torch.optim's class of that name."""
    return name.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, name, None), type)


def resolve(args):
    """Check every input and fill in what depends on the machine, the config and the number of ranks;
    returns the DeepSpeed config and one line that says how the inputs were read."""
    on_gpu = torch.cuda.is_available()
    args.model = args.model or ("1.3b" if on_gpu else "tiny")
    shape = PRESETS[args.model]
    host = {"on_gpu": on_gpu, "bf16_ok": on_gpu and torch.cuda.is_bf16_supported(), "known_optimizer": known_optimizer,
            "fsdp2_missing": fsdp2.missing()}
    world = args.check or int(os.environ["WORLD_SIZE"])
    config, where = options.read_config(args.config), f" {args.config}"
    config_checks.refuse_unknown_keys(config, where)
    config, how = options.resolve(args, config, (shape.context, shape.lr), world, host)
    config_checks.refuse_what_the_build_would(config_checks.deepspeed_config(config, args.micro_batch, where), where)
    args.tokens = load_tokens(args.data, shape.vocab, args.seq)
    return config, how


def init_distributed(timeout_s):
    """Join the process group. With more ranks on a host than GPUs, the ranks share the GPUs over gloo: a
    rehearsal, in which each rank's memory is real but speed is not. Returns the device and how the ranks
    sit on the GPUs, and a gloo group of its own in which a timed-out rank asks which peer stopped answering."""
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or world)
    if torch.cuda.is_available():
        gpus_here = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % gpus_here)
        torch.cuda.set_device(device)
        os.environ["LOCAL_RANK"] = str(device.index)  # zero.Init and the engine place tensors on LOCAL_RANK
        ranks_per_gpu = math.ceil(local_size / gpus_here)
        gpus = world // local_size * min(local_size, gpus_here)
        backend = "gloo" if ranks_per_gpu > 1 else "nccl"  # NCCL refuses two ranks on one GPU
    else:
        device, ranks_per_gpu, gpus, backend = torch.device("cpu"), 1, world, "gloo"
        torch.set_num_threads(max(1, os.cpu_count() // local_size))
    comms.count_collectives()
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    watch = torch.distributed.new_group(backend="gloo")  # a timed-out group has closed its links to the silent rank
    return device, {"ranks_per_node": local_size, "ranks_per_gpu": ranks_per_gpu, "gpus": gpus,
                    "rehearsal": ranks_per_gpu > 1}, watch


def build_model(args, config, device):
    """Build the model on the device in the training dtype: at stage 3 inside zero.Init, which partitions each
    parameter as its module is built, so no rank ever holds the whole model; FSDP2 shards it once it is whole."""
    torch.manual_seed(args.seed)
    torch.set_default_dtype(DTYPES[args.dtype])  # zero.Init creates this dtype too: the same init values
    zero3 = args.stage == 3 and args.engine == "deepspeed"
    with deepspeed.zero.Init(config_dict_or_path=config) if zero3 else torch.device(device):
        model = GPT(PRESETS[args.model], checkpoint=args.checkpoint)
    torch.set_default_dtype(torch.float32)
    return model


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


def forget_priming_step(optimizer):
    """Without ZeRO, DeepSpeed's 16-bit optimizers create Adam's state with one step on zero gradients, which
    Adam counts: the first real update took a second step's bias correction (0.73 of its size), unlike
    stages 1 to 3. Built at rate 0, that step moved no weight; its state is dropped so that Adam starts afresh."""
    optimizer.state.clear()
    for group in optimizer.param_groups:
        group.pop("step", None)  # DeepSpeed's FusedAdam counts per group


def build_engine(model, args, config):
    """The config's optimizer if it names one (DeepSpeed builds it), else torch's fused AdamW; or FSDP2."""
    if args.engine == "fsdp2":
        model = fsdp2.shard(model, DTYPES[args.dtype], args.compile)
        return fsdp2.Engine(model, adamw(model, learning_rate(0, args), args.fused_adamw),
                            config.get("gradient_clipping", 0))
    optimizer = None if "optimizer" in config else adamw(model, learning_rate(0, args), args.fused_adamw)
    # ZeRO-3 gathers a whole block at once, not each Linear: 1.3x faster on one H200 at micro batch 2, for one
    # block (~100 MB) in flight. DeepCompile gathers in its own graph, which a leaf module's hooks would break.
    if args.stage == 3 and not args.deepcompile and args.leaf_modules:  # else compat.degrade said why not
        deepspeed.utils.set_z3_leaf_modules(model, [Block])
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=decay_groups(model),
                                      config=config)
    if not engine.zero_optimization() and args.dtype != "fp32":
        forget_priming_step(engine.basic_optimizer)
    if args.compile:
        engine.compile()
    return engine


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


def train(engine, args, device, rank, facts, m):
    """Run the steps, recording loss, rate, time, peak memory and the bytes of each kind of collective of each
    into m.steps, and count the model states in the last step: after backward, and after the optimizer step
    (outside the timed region). With NCCL between ranks, from 3 steps on, the last runs under the profiler,
    which times NCCL's kernels. A signal or a diverged loss ends the steps early, on every rank at once."""
    world = facts["world_size"]
    tokens_per_step = world * args.micro_batch * args.seq
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    nccl = device.type == "cuda" and world > 1 and not facts["rehearsal"]
    Stop.phase = "training"
    for step in range(1, args.steps + 1):
        x, y = get_batch(args.tokens, args.seed, step, rank, args.micro_batch, world, args.seq, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        last = step == args.steps
        with comms.step(device, profiled=last and step >= 3 and nccl) as comm:
            sync()
            t0 = time.perf_counter()
            loss = engine(x, y)
            engine.backward(loss)
            sync()
            elapsed = time.perf_counter() - t0
            counted = measure.model_states_now(engine, device, args.offload) if last else None
            if engine.lr_scheduler is None:  # a config's own scheduler sets the rate instead
                for group in engine.optimizer.param_groups:
                    group["lr"] = learning_rate(step, args)
            sync()
            t0 = time.perf_counter()
            engine.step()
            loss, signalled = all_reduced_loss(loss, device)
            sync()
            elapsed += time.perf_counter() - t0
        if last:
            m.census, m.host_census = (measure.combined(a, b) if a else None
                                       for a, b in zip(counted, measure.model_states_now(engine, device, args.offload)))
            m.gathered_tensors = measure.gathered_tensors(engine.module)
        s = {"step": step, "loss": loss / world, "lr": engine.get_lr()[0], "time_s": elapsed,
             **measure.memory_snapshot(device), **comm}
        m.steps.append(s)
        if step == min(options.SAME_ROWS_STEPS, args.steps):  # the weights that the verdict's (c) compares
            m.trained_checksum = measure.weights_checksum(engine.module, rank, device)
        tflops = m.flops_per_token * tokens_per_step / elapsed / facts["gpus"] / 1e12
        log(rank, record.step_line(s, args.steps, tokens_per_step, tflops, m.peak_tflops))
        Stop.signalled = signalled
        Stop.reason = (f"interrupted by {Stop.interrupted_by(True)}" if signalled
                       else diverged(s["loss"], m.steps[0]["loss"]))
        if Stop.reason:
            log(rank, f"stopped after step {step} of {args.steps}: {Stop.reason}")
            break
    Stop.phase = "done"


# -----------------------------------------------------------------------------
# main


def run(args, config, facts, m):
    """Join the process group, then build and train, filling facts (the run's) and m (what this rank
    measured) as it goes; a collective that times out names the ranks that stopped answering."""
    with phase(facts["rank"], "starting the process group"):
        device, placement, watch = init_distributed(args.timeout_s)
    facts.update(placement, env=machine.environment(device),
                 link_bytes_per_s=machine.link_bandwidth(device, placement, facts["world_size"]))
    try:
        build_and_train(args, config, facts, m, device)
    except RuntimeError as e:
        if any(word in str(e).lower() for word in ("timed out", "timeout")):
            raise RuntimeError(f"a collective waited {args.timeout_s:g} s: {machine.silent_ranks(watch)}") from e
        raise


def build_and_train(args, config, facts, m, device):
    rank = facts["rank"]
    if facts["rehearsal"]:
        log(rank, f"REHEARSAL: {facts['world_size']} ranks share {facts['gpus']} GPU(s) over gloo: each rank's "
                  "memory is real, its speed is not")
    if args.max_mem_gib:
        machine.cap_memory(device, args.max_mem_gib)
        log(rank, f"memory capped at {args.max_mem_gib} GiB per rank"
                  + ("" if device.type == "cuda" else " of data added from now on"))
    with phase(rank, "building the model"):
        model = build_model(args, config, device)
    with phase(rank, "starting the DeepSpeed engine"):
        engine = build_engine(model, args, config)
    m.optimizer, m.ready_s = measure.optimizer_name(engine), time.perf_counter() - START
    m.deepcompile_active = compat.deepcompile_active(engine) if args.deepcompile else False
    m.memory_at_start = measure.memory_snapshot(device)
    log(rank, f"ready to train; optimizer {m.optimizer}")
    m.shards = measure.shard_report(engine.module, facts["world_size"])
    m.weights_checksum = measure.weights_checksum(engine.module, rank, device)
    log(rank, f"{m.shards['params_total']:,} parameters in {m.shards['param_tensors']} tensors")
    m.flops_per_token = engine.module.flops_per_token(m.shards["params_total"], args.seq)
    m.peak_tflops = machine.peak_tflops(device, args.dtype)
    m.timing["engine_ready"] = time.time()
    train(engine, args, device, rank, facts, m)
    m.timing["trained"] = time.time()
    if not Stop.reason:
        m.link_busbw = comms.link_alone(device, facts)  # after the last step's memory is recorded
    m.timing["probed"] = time.time()


def main(argv=None):
    try:
        launcher = machine.adopt_launcher_env()
        args = options.parse_args(argv, PRESETS, HERE)
        config, how = resolve(args)
    except options.BadInput as e:
        options.fail(str(e))
    if args.check is not None:
        print(how)
        return
    machine.normalise_cuda_arch_list()
    machine.keep_extensions_apart()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log(rank, how)
    for line in compat.degrade(args, config, torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        log(rank, line)
    args.offload = options.offload_devices(config)
    facts = {"rank": rank, "world_size": world, "config": str(args.config), "launcher": launcher,
             "steps_planned": args.steps,
             "mem_kind": "cuda" if torch.cuda.is_available() else "cpu_rss", **{k: getattr(args, k) for k in (
                 "stage", "model", "engine", "dtype", "micro_batch", "seq", "lr", "warmup", "seed", "checkpoint",
                 "compile", "deepcompile", "max_mem_gib", "timeout_s", "offload")}}
    m, failure = record.Measured(timing={"started": psutil.Process().create_time(), "imported": IMPORTED}), {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, Stop.on_signal)
    try:
        run(args, config, facts, m)
    except Exception as e:  # noqa: BLE001 -- any failure is reported as a result, with its traceback in the log
        oom = machine.out_of_memory(e)
        if not (oom or isinstance(e, Interrupted)):
            traceback.print_exc()
        failure = {"oom": oom, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    Stop.phase = "done"
    failure["interrupted_by"] = Stop.interrupted_by(Stop.signalled)
    if Stop.reason and not Stop.signalled:
        failure["diverged"] = Stop.reason
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    r = record.assemble({**facts, **failure}, m, PRESETS[args.model], LOSS_CHUNK, config.get("zero_optimization", {}),
                        measure.memory_snapshot(device))
    if r.error:  # a rank that failed reports alone: its peers may be blocked in a collective
        record.emit([record.as_dict(r)])
    else:
        everyone = [None] * world
        torch.distributed.all_gather_object(everyone, record.as_dict(r))  # deepspeed.comm has it from 0.17.0 on
        if rank == 0:
            record.emit(everyone)
            print(rank_table(everyone), flush=True)
        dist.barrier()  # rank 0 has printed everything before any rank leaves
    # Leave without the interpreter's teardown: after ZeRO-3 on gloo it sometimes aborts the process
    # ("terminate called without an active exception") after all work is done. A failed rank's peers may
    # be blocked in a collective; the launcher ends them when it sees the failure's exit status.
    machine.release_shared_memory(world)
    sys.stderr.flush()
    os._exit(record.exit_status(r))


if __name__ == "__main__":
    main()
