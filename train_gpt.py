"""
A DeepSpeed ZeRO benchmark: train a GPT for a few steps and report, per rank, what ZeRO partitions,
how much memory the model states take against the ZeRO paper's prediction, the losses and the speed.

    deepspeed --num_gpus 4 train_gpt.py --stage 3        # or torchrun, or plain python for one rank

Rank 0 prints each rank's human lines and one `RESULT {json}` line per rank; report.py reads those back.
Exit status: 0 done, 1 failed, 2 bad input, 3 out of memory, 4 the loss is not finite.
"""
import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import warnings
from pathlib import Path

import deepspeed
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
from deepspeed.runtime.zero.utils import is_zero_param
from torch._subclasses.fake_tensor import FakeTensor

import report

START = time.perf_counter()
HERE = Path(__file__).resolve().parent
# DeepSpeed calls torch.distributed functions that torch has deprecated; the warnings say nothing to a user
warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+.* is deprecated")

# -----------------------------------------------------------------------------
# configuration

# name: (layers, heads, d_model, vocab, context, default learning rate); the GPT-3 paper's shapes, plus two
# byte-level models for CPUs: tiny, and small, sized for the memory-cap demo. The benchmark runs 3 steps
# with no warm-up, and Adam's first steps move every weight by about lr: on an H200, 1.3b's loss at stage 0
# rose at step 2 with lr 1.5e-5 and above, and fell at every step with 1e-5 (benchmarks/h200/). The other
# GPT-3 rates keep the paper's ratios to 1.3b's and are not measured.
PRESETS = {
    "tiny": (2, 4, 128, 256, 256, 3e-3),
    "small": (8, 8, 1024, 256, 256, 1e-5),
    "125m": (12, 12, 768, 50257, 1024, 3e-5),
    "350m": (24, 16, 1024, 50257, 1024, 1.5e-5),
    "760m": (24, 16, 1536, 50257, 1024, 1.25e-5),
    "1.3b": (24, 16, 2048, 50257, 1024, 1e-5),
    "2.7b": (32, 32, 2560, 50257, 1024, 8e-6),
    "6.7b": (32, 32, 4096, 50257, 1024, 6e-6),
}

# Dense bf16 peak TFLOP/s by device name, for MFU; the first key found as a whole word wins, so the
# specific names come first.
PEAK_TFLOPS = {
    "H100 PCIe": 756, "H100 NVL": 835, "H200 NVL": 835, "H100": 989, "H200": 989, "H800": 989,
    "GB200": 2500, "B200": 2250, "A100": 312, "A800": 312, "L40S": 362, "L40": 181, "A10G": 70, "A10": 125,
    "L4": 121, "MI300X": 1307, "MI250X": 383,
}

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_OOM, EXIT_NONFINITE = 1, 2, 3, 4


def fail(msg):
    """Bad input: one line on stderr, exit status 2, no traceback."""
    if os.environ.get("RANK", "0") == "0":
        print(f"train_gpt.py: error: {msg}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DeepSpeed ZeRO benchmark on a GPT-style model.")
    p.add_argument("--stage", type=int, choices=[0, 1, 2, 3],
                   help="ZeRO stage; loads ds_config_stage<N>.json beside this script (default 3)")
    p.add_argument("--config", type=Path, help="a DeepSpeed config file instead of ds_config_stage<N>.json")
    p.add_argument("--model", choices=PRESETS, help="model preset (default 1.3b on GPUs, tiny without)")
    p.add_argument("--micro-batch", type=int, help="rows per GPU per step (default: the config's, 2)")
    p.add_argument("--seq", type=int, help="tokens per row (default: the model's context)")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--lr", type=float, help="AdamW's peak learning rate, after the warm-up (default: the preset's)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps over which the learning rate rises linearly to --lr (default 2; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed for the weights and the data (default 0)")
    p.add_argument("--dtype", choices=DTYPES, help="bf16, fp16 or fp32 (default bf16 where supported)")
    p.add_argument("--data", type=Path, help="flat uint16 token file (nanoGPT .bin); default: Python's sources")
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="activation checkpointing: recompute each block in backward (default on; --no-checkpoint)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model through DeepSpeed's engine.compile")
    p.add_argument("--max-mem-gib", type=float,
                   help="cap each rank's memory: the GPU allocator's share, or on a CPU the data the process adds")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # appended by the deepspeed launcher
    p.error = fail
    return p.parse_args(argv)


def learning_rate(step, args):
    """A linear warm-up to --lr over --warmup steps, then --lr. Adam's first step moves every weight by about
    the learning rate, whatever its gradient: at 1.3b a full-size first step made the loss rise at step 2.
    Step 0, where the optimizer is built, has rate 0."""
    return args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr


def load_ds_config(args):
    path = args.config or HERE / f"ds_config_stage{3 if args.stage is None else args.stage}.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"config not found: {path}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        fail(f"config {path} is not valid JSON: {e}")
    if not isinstance(config, dict):
        fail(f"config {path} is not a JSON object")
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if args.stage is not None and stage != args.stage:
        fail(f"config {path} has zero_optimization.stage {stage}, but --stage is {args.stage}")
    if stage not in (0, 1, 2, 3):
        fail(f"config {path}: zero_optimization.stage must be 0, 1, 2 or 3, not {stage}")
    if config.get("gradient_accumulation_steps", 1) != 1:
        fail(f"config {path}: the benchmark times one micro batch per step; set gradient_accumulation_steps to 1")
    return path, stage, config


def resolve(args):
    """Check the arguments and fill in the defaults that depend on the machine and the config."""
    on_gpu = torch.cuda.is_available()
    args.config, args.stage, config = load_ds_config(args)
    args.model = args.model or ("1.3b" if on_gpu else "tiny")
    *_, vocab, context, lr = PRESETS[args.model]
    args.lr = lr if args.lr is None else args.lr
    args.seq = context if args.seq is None else args.seq
    if args.micro_batch is None:
        args.micro_batch = config.get("train_micro_batch_size_per_gpu", 2)
    args.dtype = args.dtype or ("bf16" if not on_gpu or torch.cuda.is_bf16_supported() else "fp16")
    if args.dtype == "fp16" and not on_gpu:
        fail("fp16 needs a GPU, and this machine has none: use --dtype bf16 or fp32")
    if args.seq < 1 or args.seq > context:
        fail(f"--seq {args.seq} is outside the {args.model} model's context of 1..{context} tokens")
    if args.micro_batch < 1:
        fail(f"--micro-batch must be at least 1, not {args.micro_batch}")
    if args.steps < 1:
        fail(f"--steps must be at least 1, not {args.steps}")
    if args.lr <= 0:
        fail(f"--lr must be positive, not {args.lr}")
    if args.warmup < 0:
        fail(f"--warmup must be 0 or more, not {args.warmup}")
    if args.max_mem_gib is not None and args.max_mem_gib <= 0:
        fail(f"--max-mem-gib must be positive, not {args.max_mem_gib}")
    config.update(train_micro_batch_size_per_gpu=args.micro_batch, gradient_accumulation_steps=1,
                  steps_per_print=10**9)
    config["bf16"] = {**config.get("bf16", {}), "enabled": args.dtype == "bf16"}
    config["fp16"] = {**config.get("fp16", {}), "enabled": args.dtype == "fp16"}
    if "optimizer" in config and "scheduler" not in config:
        config["optimizer"].setdefault("params", {})["lr"] = learning_rate(0, args)
    args.tokens = load_tokens(args.data, vocab, args.seq)
    return config


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


class GPT(nn.Module):
    def __init__(self, layers, heads, d_model, vocab, context, checkpoint=False):
        super().__init__()
        self.checkpoint = checkpoint
        proj_std = 0.02 / math.sqrt(2 * layers)  # GPT-2: scale the residual projections by depth
        # the embedding has a multiple of 64 rows: the output layer's matmul with 50257 rows ran 5.6x slower
        # on an H200 than with 50304 (benchmarks/h200/1-first-look/env.txt); extra rows are tokens never seen
        self.wte = Embedding(64 * math.ceil(vocab / 64), d_model)
        self.wpe = Embedding(context, d_model)
        # each block is built explicitly: zero.Init cannot follow modules that deep-copy a layer
        self.blocks = nn.ModuleList(Block(d_model, heads, proj_std) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, self.wte.num_embeddings, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        logits = self.lm_head(self.ln_f(x)).flatten(0, 1)
        # the loss in fp32, a chunk of rows at a time and recomputed in backward: whole, the fp32 logits, their
        # log-softmax and its gradient would hold 12 bytes per logit, which no ZeRO stage partitions
        rows = zip(logits.split(LOSS_CHUNK), targets.flatten().split(LOSS_CHUNK))
        total = sum(torch.utils.checkpoint.checkpoint(summed_cross_entropy, *pair, use_reentrant=False) for pair in rows)
        return total / targets.numel()


LOSS_CHUNK = 256  # rows of logits per chunk of the loss


def summed_cross_entropy(logits, targets):
    return F.cross_entropy(logits.float(), targets, reduction="sum")


# -----------------------------------------------------------------------------
# data: deterministic for a seed and a step, the same at every stage


def load_tokens(path, vocab, seq):
    """The token stream: a nanoGPT .bin file, or else the bytes of Python's own sources, real text that
    every Python installation ships."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in sorted(stdlib.glob("*.py"))), dtype=np.uint8)
    else:
        if not path.is_file():
            fail(f"--data {path}: no such file")
        if path.stat().st_size % 2:
            fail(f"--data {path}: not a flat uint16 token file (odd size)")
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
    if len(tokens) < seq + 1:
        fail(f"the data has {len(tokens)} tokens, fewer than one row of {seq} + 1")
    # the first 16M tokens only: a corpus can be many GB; a stray id further on fails in the embedding
    if path is not None and int(tokens[: 1 << 24].max()) >= vocab:
        fail(f"--data {path}: token ids reach {int(tokens[: 1 << 24].max())}, outside the vocabulary of {vocab}")
    return tokens


def get_batch(tokens, seed, step, rank, micro_batch, world, seq, device):
    """This rank's rows of the global batch for this step: random windows, the same for any stage."""
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - seq, size=world * micro_batch)
    rows = np.stack([tokens[s: s + seq + 1] for s in starts[rank * micro_batch: (rank + 1) * micro_batch]])
    rows = torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True)
    return rows[:, :-1], rows[:, 1:]


# -----------------------------------------------------------------------------
# setup: processes, device, model, engine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def normalise_cuda_arch_list():
    """DeepSpeed's JIT op builder reads TORCH_CUDA_ARCH_LIST as numbers and fails on suffixed entries such
    as Hopper's '9.0a' (images set it so); its ops need no arch-specific instructions, so build for '9.0'."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", archs)


def init_distributed():
    """Join the process group under the deepspeed launcher, torchrun, or plain python (one rank).
    With more ranks on a host than GPUs, the ranks share the GPUs over gloo: a rehearsal, in which each
    rank's memory is real but speed is not. Returns the device, the ranks per node and per GPU, and the
    GPUs in the job."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
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
    deepspeed.init_distributed(dist_backend=backend)
    return device, local_size, ranks_per_gpu, gpus


def release_shared_memory(rank):
    """DeepSpeed's CPU all-reduce maps a 66 MB buffer per rank from /dev/shm, named after the master's
    address and port, and never unlinks it: each run on CPUs would leave its buffers behind until the
    host's memory runs out. Unlinked after this rank's last collective, it goes when every rank has exited."""
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR')}_"
            f"{os.environ.get('MASTER_PORT')}_{rank}")
    Path("/dev/shm", name).unlink(missing_ok=True)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def cap_memory(device, gib):
    """--max-mem-gib makes an out-of-memory reproducible on any machine. On a GPU it caps PyTorch's caching
    allocator (its per-process memory fraction). On a CPU it caps the process's data segment (RLIMIT_DATA)
    at what it holds now plus the cap, so that the Python runtime and DeepSpeed do not count."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)
    else:
        torch.ones(1 << 22).sum()  # start torch's thread pool now: its threads' stacks count as data too
        # glibc keeps freed blocks below a moving threshold in its heap; a fixed threshold hands every block
        # over 64 KiB back when freed, so the data segment follows the live tensors
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 64 * 1024)
        data_kib = int(re.search(r"VmData:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
        resource.setrlimit(resource.RLIMIT_DATA, (data_kib * 1024 + int(gib * 2**30), resource.RLIM_INFINITY))


def build_model(args, config, device):
    """Build the model on the device in the training dtype. At stage 3 inside zero.Init, so that each
    parameter is partitioned as soon as its module exists and no rank ever holds the whole model."""
    torch.manual_seed(args.seed)
    torch.set_default_dtype(DTYPES[args.dtype])  # zero.Init creates this dtype too: the same init values
    place = deepspeed.zero.Init(config_dict_or_path=config) if args.stage == 3 else torch.device(device)
    with place:
        model = GPT(*PRESETS[args.model][:5], checkpoint=args.checkpoint)
    torch.set_default_dtype(torch.float32)
    return model


def adamw(model, lr):
    """AdamW as in GPT-3, with no weight decay on biases and LayerNorms. torch's fused kernel needs no
    JIT build: DeepSpeed's FusedAdam took 42 s to build on an H200, held 4.9 GiB more at stage 0 and was
    7% faster at micro batch 2 (benchmarks/h200/1-first-look)."""
    params = list(model.parameters())
    decay = [p for p in params if len(getattr(p, "ds_shape", p.shape)) >= 2]
    rest = [p for p in params if len(getattr(p, "ds_shape", p.shape)) < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)


def forget_priming_step(optimizer):
    """Without ZeRO, DeepSpeed's 16-bit optimizers (FP16_UnfusedOptimizer for bf16, FP16_Optimizer) create
    Adam's state with one step on zero gradients, and ZeRO's do not. Adam then counts that step: the first
    real update took the bias correction of a second one, 0.73 of its size with betas (0.9, 0.95), and
    stage 0 trained on another schedule than stages 1 to 3. Built at learning rate 0, the step moved no
    weight; its state is dropped so that Adam starts afresh."""
    optimizer.state.clear()
    for group in optimizer.param_groups:
        group.pop("step", None)  # DeepSpeed's FusedAdam counts per group


def build_engine(model, args, config):
    """The config's optimizer if it names one (DeepSpeed builds it), else torch's fused AdamW."""
    optimizer = None if "optimizer" in config else adamw(model, learning_rate(0, args))
    # ZeRO-3 gathers a whole block's parameters at once, rather than each Linear's: fewer hooks and
    # collectives, 1.3x faster on one H200 at micro batch 2, at the cost of one block (~100 MB) in flight
    if args.stage == 3:
        deepspeed.utils.set_z3_leaf_modules(model, [Block])
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=model.parameters(),
                                      config=config)
    if not engine.zero_optimization() and args.dtype != "fp32":
        forget_priming_step(engine.basic_optimizer)
    if args.compile:
        engine.compile()
    return engine


def environment(device):
    """What the run ran on, for the record of each run."""
    env = {"host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
           "deepspeed": deepspeed.__version__, "cuda": torch.version.cuda, "gpus_on_host": torch.cuda.device_count(),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"}
    if device.type == "cuda":
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env["driver"] = None
    return env


def optimizer_name(engine):
    opt = engine.basic_optimizer
    fused = " (fused)" if opt.defaults.get("fused") else ""
    return f"{type(opt).__module__.split('.')[0]}.{type(opt).__name__}{fused}"


# -----------------------------------------------------------------------------
# measurement: what is partitioned, what is resident, how fast


def shard_report(model, world):
    """Count what ZeRO-3 partitioned, from DeepSpeed's own attributes on each parameter: a partitioned
    parameter has numel() 0, ds_numel (its full size) and ds_tensor (this rank's shard); a persistent one
    (ds_persist) also stays whole on every rank."""
    params = list(model.parameters())
    zero = [p for p in params if is_zero_param(p)]
    return {
        "param_tensors": len(params),
        "partitioned_tensors": len(zero),
        "persistent_tensors": sum(bool(p.ds_persist) for p in zero),
        "params_total": sum(p.ds_numel if is_zero_param(p) else p.numel() for p in params),
        "local_param_elems": sum(p.ds_tensor.numel() if is_zero_param(p) else p.numel() for p in params),
        "persistent_elems": sum(p.ds_numel for p in zero if p.ds_persist),
        "largest_param_elems": max(p.ds_numel if is_zero_param(p) else p.numel() for p in params),
        "shard_check_ok": all(p.ds_tensor.numel() == math.ceil(p.ds_numel / world) for p in zero),
    }


def owned_values(p, rank):
    """The elements of p that this rank owns, and the place of the first in the whole tensor: all of an
    unpartitioned tensor, or this rank's shard without its padding."""
    if not is_zero_param(p):
        return p.data.flatten(), 0
    shard = p.ds_tensor.numel()
    return p.ds_tensor.flatten()[: max(0, min(shard, p.ds_numel - rank * shard))], rank * shard


def weights_checksum(model, rank):
    """A sum of every weight of the model, each multiplied by a factor that depends on its tensor and its
    place in it, from the elements each rank owns. It matches stage 0's only if the shards of all ranks
    hold stage 0's weights, each in its place."""
    chunk = 1 << 24  # bounds the fp64 temporaries
    total = torch.zeros((), dtype=torch.float64, device=get_accelerator().current_device_name())
    for t, p in enumerate(model.parameters(), 1):
        values, first = owned_values(p, rank)
        for i in range(0, values.numel(), chunk):
            part = values[i: i + chunk].double()
            place = torch.arange(first + i, first + i + part.numel(), dtype=torch.float64, device=part.device)
            total += t * (part * (place % 997 + 1)).sum()
    if any(is_zero_param(p) for p in model.parameters()):
        dist.all_reduce(total)
    return total.item()


def storages(tensors, device):
    """{storage address: bytes} for the distinct storages behind these tensors on the device."""
    found = {}
    for t in tensors:
        # torch.compile leaves fake tensors behind, which hold no memory
        if torch.is_tensor(t) and t.device.type == device.type and not isinstance(t, FakeTensor):
            try:
                storage = t.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                pass  # other tensor subclasses without storage
    found.pop(0, None)  # empty storages
    return found


def partitioned_gradients(optimizer):
    """The gradient partitions that ZeRO keeps off the parameters: stage 3 reduces into one flat buffer of
    this rank's partitions, stage 2 into grads_in_partition, and both list them in averaged_gradients."""
    found = [getattr(optimizer, name, None) for name in ("grad_partitions_flat_buffer", "grads_in_partition")]
    averaged = getattr(optimizer, "averaged_gradients", None) or {}
    for group in (averaged.values() if isinstance(averaged, dict) else averaged):
        found += group or []
    return found


def model_state_census(engine, device):
    """Bytes of every live tensor on a device, counted from the tensors themselves and sorted into
    the model states (parameters, gradients, fp32 master weights, optimizer moments) and the rest
    (communication buckets, buffers). Taken after backward, when gradients and optimizer states coexist."""
    params = list(engine.module.parameters())
    opt = engine.basic_optimizer
    owners = {
        "params": [t for p in params for t in (p.data, getattr(p, "ds_tensor", None))],
        "grads": [p.grad for p in params] + partitioned_gradients(engine.optimizer),
        # the optimizer's own parameters; ZeRO-3 lends them to its param_groups only during step()
        "master": [p for group in opt.param_groups for p in group["params"]] + list(opt.state),
        "moments": [t for state in opt.state.values() for t in state.values()],
    }
    gc.collect()
    with warnings.catch_warnings():  # looking at every object touches deprecated torch attributes
        warnings.simplefilter("ignore")
        live = storages([o for o in gc.get_objects() if torch.is_tensor(o)], device)
    claimed, census = {}, {}
    for name, tensors in owners.items():
        mine = {k: v for k, v in storages(tensors, device).items() if k not in claimed}
        claimed.update(mine)
        census[name] = sum(mine.values())
    census["other"] = sum(v for k, v in live.items() if k not in claimed)
    return census


def gathered_tensors(model):
    """Partitioned, not persistent, and yet whole on this rank right now."""
    return sum(1 for p in model.parameters() if is_zero_param(p) and not p.ds_persist and p.numel() > 0)


# -----------------------------------------------------------------------------
# theory: what the ZeRO paper, DeepSpeed's estimator and a count of activations predict


def shard_elems(stage, shards, world):
    """The elements of this rank's partition: its shards at stage 3, 1/G of the one flat buffer that stages
    1 and 2 split, and every element at stage 0."""
    if stage == 3:
        return shards["local_param_elems"]
    return shards["params_total"] / world if stage else shards["params_total"]


def predicted_states(stage, dtype, full, shard, persistent):
    """The ZeRO paper's model states of one rank, by kind, for mixed-precision Adam: 16-bit weights and
    gradients (2 + 2 bytes per parameter) and K = 12 for fp32 master weights, momentum and variance.
    Stage 1 partitions the K bytes over the ranks, stage 2 the gradients too, stage 3 the weights too,
    which also keeps whole 16-bit copies of its persistent parameters. full: the model's parameters;
    shard: this rank's partition; persistent: the elements kept whole besides. In fp32, stage 0 steps the
    weights themselves, but ZeRO's optimizers keep an fp32 copy anyway (at stage 3, stage3.py compares a
    tensor's device with a string, so it never reuses the weights): 4 more bytes per partition element."""
    width = DTYPES[dtype].itemsize
    master = 4 if width < 4 or stage > 0 else 0
    return {
        "params": width * (shard + persistent if stage == 3 else full),
        "grads": width * (shard if stage >= 2 else full),
        "master": master * (shard if stage >= 1 else full),
        "moments": 8 * (shard if stage >= 1 else full),
    }


def offload_devices(zero):
    """{"optimizer": device or None, "param": device or None} from a config's zero_optimization."""
    devices = {kind: (zero.get(f"offload_{kind}") or {}).get("device") for kind in ("optimizer", "param")}
    return {kind: None if device in (None, "none") else device for kind, device in devices.items()}


def host_kinds(offload):
    """The kinds of model state in host memory: with the optimizer offloaded (ZeRO-Offload), the gradient
    partitions it steps on besides its fp32 weights and moments; with the parameters too (ZeRO-Infinity),
    the 16-bit weights."""
    return (["grads", "master", "moments"] if offload["optimizer"] else []) + (["params"] if offload["param"] else [])


def deepspeed_estimate(stage, shards, ranks_per_node, nodes, offload):
    """DeepSpeed's own estimator of model states, per GPU and per node, called on the counts (a partitioned
    model reports numel 0). It has none for stage 0; stage 1 borrows stage 2's, which partitions gradients."""
    if stage == 0:
        return None
    total, optimizer_off = shards["params_total"], bool(offload["optimizer"])
    if stage == 3:
        host, device, _ = estimate_zero3_model_states_mem_needs(
            total, shards["largest_param_elems"], num_gpus_per_node=ranks_per_node, num_nodes=nodes,
            cpu_offload=optimizer_off, cpu_offload_params=bool(offload["param"]))
    else:
        host, device = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=ranks_per_node, num_nodes=nodes,
                                                             cpu_offload=optimizer_off)
    return {"device": device, "host_per_node": host}


def activation_bytes(args, layers, heads, d_model, vocab, flash):
    """Activations saved for backward, after Korthikanti et al. (2022): 34 bytes per token and model
    dimension per layer in 16 bits, plus 5 per attention score unless flash attention keeps none; with
    checkpointing, each layer's input only, plus one layer recomputed. Then the logits during
    backward: the logits kept for the loss's recomputation, their gradient in chunks and as one tensor, and
    one chunk's fp32 copy, log-softmax and their gradients."""
    width, tokens = DTYPES[args.dtype].itemsize, args.micro_batch * args.seq
    layer = width / 2 * (34 * tokens * d_model + (0 if flash else 5 * heads * args.seq * tokens))
    blocks = layers * width * tokens * d_model + layer if args.checkpoint else layers * layer
    return blocks + (3 * width * tokens + 16 * min(LOSS_CHUNK, tokens)) * 64 * math.ceil(vocab / 64)


def predict_memory(r, args, device, zero):
    """What theory says this rank holds: the paper's model states by kind and by where they live, DeepSpeed's
    estimate, the activations, the fp32 gradients that the optimizer step makes on the device, and the peak:
    model states, the measured other tensors (buckets), the parameters that stage 3 gathers ahead, and the
    larger of the activations and the step's gradients."""
    stage, width = args.stage, DTYPES[args.dtype].itemsize
    flash = device.type == "cuda" and width == 2  # SDPA's flash kernels take 16-bit inputs only
    shard = shard_elems(stage, r, r["world_size"])
    predicted = predicted_states(stage, args.dtype, r["params_total"], shard, r["persistent_elems"])
    on_host = host_kinds(r["offload"]) if device.type != "cpu" else []  # without GPUs it is all one memory
    kept = width * r["persistent_elems"] if "params" in on_host else 0  # persistent parameters stay on the GPU
    layers, heads, d_model, vocab = PRESETS[args.model][:4]
    figures = {
        "predicted_breakdown": predicted,
        "predicted_model_state_bytes": sum(v for k, v in predicted.items() if k not in on_host) + kept,
        "predicted_host_state_bytes": sum(v for k, v in predicted.items() if k in on_host) - kept,
        "deepspeed_estimate": deepspeed_estimate(stage, r, r["ranks_per_node"], r["world_size"] // r["ranks_per_node"],
                                                 r["offload"]),
        "activation_estimate_bytes": activation_bytes(args, layers, heads, d_model, vocab, flash),
        "step_transient_bytes": 0 if r["offload"]["optimizer"] else 4 * shard,
    }
    prefetch = width * zero.get("stage3_prefetch_bucket_size", 5e7) if stage == 3 else 0
    busiest = max(figures["activation_estimate_bytes"], figures["step_transient_bytes"])
    figures["predicted_peak_bytes"] = (figures["predicted_model_state_bytes"] + r["model_state_breakdown"]["other"]
                                       + prefetch + busiest)
    return figures


# -----------------------------------------------------------------------------
# checks: what each rank holds against what its stage promises

# A rank's share of each kind of model state may differ from its stage's promise by this fraction, and a
# measurement may differ from the paper by EXPLAIN_BEYOND before the output says where the difference goes.
PARTITION_TOLERANCE = 0.10
EXPLAIN_BEYOND = 0.10
STATE_KINDS = {"params": ["params"], "grads": ["grads"], "optimizer": ["master", "moments"]}


def held_bytes(r):
    """This rank's model states by kind, on the device and in host memory together."""
    host = r.get("host_state_breakdown", {})
    return {k: r["model_state_breakdown"][k] + host.get(k, 0) for k in ("params", "grads", "master", "moments")}


def shares(states, whole):
    """Each kind of model state as a share of what one rank would hold alone."""
    return {kind: sum(states[p] for p in parts) / sum(whole[p] for p in parts) for kind, parts in STATE_KINDS.items()}


def partition_check(held, promised, stage, shards):
    """Each kind that the stage partitions is held at its promised share, and no kind above it, give or
    take PARTITION_TOLERANCE; at stages 1 and 2, DeepSpeed also keeps whole the gradients of the (at most
    two) tensors that straddle this rank's partition boundaries."""
    partitioned = {"optimizer": stage >= 1, "grads": stage >= 2, "params": stage >= 3}
    straddling = 2 * shards["largest_param_elems"] / shards["params_total"] if stage in (1, 2) else 0
    slack = {k: PARTITION_TOLERANCE * promised[k] + (straddling if k == "grads" else 0) for k in held}
    return all(held[k] <= promised[k] + slack[k] and (not partitioned[k] or held[k] >= promised[k] - slack[k])
               for k in held)


# why a kind of model state can differ from the paper: (kind, sign of the difference, stages) -> cause
CAUSES = {
    ("grads", 1, (1, 2)): "DeepSpeed keeps whole the gradients of tensors that straddle this rank's partition",
    ("grads", -1, (1,)): "DeepSpeed's stage 1 also reduces the gradients into this rank's partition during backward",
    ("params", 1, (3,)): "partitioned parameters still gathered after backward (gathered layers)",
}


def estimator_gap(r):
    """Why DeepSpeed's estimate of the device's model states departs from the measurement, if by more than
    EXPLAIN_BEYOND: what its formulas add. Without GPUs, offload's device and host are one memory: no gap."""
    estimate = r["deepspeed_estimate"]
    if not estimate or (r["mem_kind"] != "cuda" and any(r["offload"].values())):
        return []
    if abs(r["model_state_bytes"] / estimate["device"] - 1) <= EXPLAIN_BEYOND:
        return []
    adds = []
    if not r["offload"]["optimizer"]:
        paper = 16 if r["stage"] == 3 else 14
        why = "" if r["stage"] == 3 else (": fp32 gradients, by its own comment, which exist here only in the "
                                          "optimizer step (the peak estimate has them)")
        adds.append(f"{18 - paper} bytes per partition element (18 where the paper counts {paper}){why}")
    if r["stage"] == 3:
        adds.append(f"4 bytes per element of the largest layer ({r['largest_param_elems']:,} elements)")
    return [f"DeepSpeed's estimator: {report.size(estimate['device'])} against {report.size(r['model_state_bytes'])} "
            f"measured: " + ("it adds " + " and ".join(adds) if adds else "no known cause")]


def differences(r):
    """Where the measured memory departs from theory by more than EXPLAIN_BEYOND, in words."""
    found, measured, predicted = estimator_gap(r), held_bytes(r), r["predicted_breakdown"]
    total = sum(predicted.values())
    if abs(sum(measured.values()) / total - 1) > EXPLAIN_BEYOND:
        for kind in predicted:
            diff = measured[kind] - predicted[kind]
            if abs(diff) > 0.02 * total:  # the kinds that make the difference
                cause = next((c for (k, sign, stages), c in CAUSES.items()
                              if k == kind and sign * diff > 0 and r["stage"] in stages), "no known cause")
                found.append(f"model states: {kind} {'+' if diff > 0 else '-'}{report.size(abs(diff))}: {cause}")
    if r["mem_kind"] == "cuda" and abs(r["peak_mem_bytes"] / r["predicted_peak_bytes"] - 1) > EXPLAIN_BEYOND:
        size = report.size
        found.append(f"peak: {size(r['peak_mem_bytes'])} measured against {size(r['predicted_peak_bytes'])} "
                     f"estimated from model states, other tensors {size(r['model_state_breakdown']['other'])}, "
                     f"parameters gathered ahead, and the larger of activations "
                     f"{size(r['activation_estimate_bytes'])} and the step's fp32 gradients "
                     f"{size(r['step_transient_bytes'])}")
    return found


def peak_tflops(device, dtype):
    """The device's dense 16-bit peak; none for a CPU, an unknown device, or fp32, which runs slower."""
    if device.type != "cuda" or dtype == "fp32":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if re.search(rf"\b{re.escape(k)}\b", name)), None)


def tflops_per_gpu(flops_per_token, tokens_per_s, gpus):
    return flops_per_token * tokens_per_s / gpus / 1e12


def memory_snapshot(device):
    """Peak memory since the last reset: allocated and reserved on a GPU, and the process's peak resident set
    size, which is the host memory that offload costs (on a CPU, the only memory)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device.type == "cuda":
        return {"peak_mem_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "host_peak_rss_bytes": rss}
    return {"peak_mem_bytes": rss}


# -----------------------------------------------------------------------------
# training


def train(engine, args, device, rank, world, flops_per_token, peak, result):
    """Run the steps, recording loss, time and peak memory of each, and take the model-state census
    in the last step, between backward and the optimizer step (outside the timed region)."""
    tokens_per_step = world * args.micro_batch * args.seq
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in range(1, args.steps + 1):
        x, y = get_batch(args.tokens, args.seed, step, rank, args.micro_batch, world, args.seq, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        sync()
        elapsed = time.perf_counter() - t0
        if step == args.steps:
            result["model_state_breakdown"] = model_state_census(engine, device)
            if device.type != "cpu" and host_kinds(result["offload"]):
                result["host_state_breakdown"] = model_state_census(engine, torch.device("cpu"))
            result["gathered_tensors"] = gathered_tensors(engine.module)
        sync()
        t0 = time.perf_counter()
        if engine.lr_scheduler is None:  # a config's own scheduler sets the rate instead
            for group in engine.optimizer.param_groups:
                group["lr"] = learning_rate(step, args)
        engine.step()
        dist.all_reduce(loss := loss.detach().float())  # the loss of the global batch
        sync()
        elapsed += time.perf_counter() - t0
        record = {"step": step, "loss": loss.item() / world, "lr": engine.get_lr()[0], "time_s": elapsed,
                  **memory_snapshot(device)}
        result["steps"].append(record)
        tflops = tflops_per_gpu(flops_per_token, tokens_per_step / elapsed, result["gpus"])
        log(rank, f"step {step}/{args.steps}  loss {record['loss']:.4f}  time {elapsed:.3f}s  "
                  f"mem {report.gib(record['peak_mem_bytes']):.2f} GiB  tok/s {tokens_per_step / elapsed:,.0f}  "
                  f"mfu {report.pct(tflops / peak if peak else None)}")


def model_states(breakdown):
    return sum(v for k, v in breakdown.items() if k != "other")


def summarize(result, args, flops_per_token, peak):
    """Whole-run figures from the per-step records. Speed is the median over steps 2..N: step 1 pays
    for allocations, kernel selection and ZeRO-3's first trace."""
    steps = result["steps"]
    step_time = statistics.median([s["time_s"] for s in steps[1:]] or [steps[0]["time_s"]])
    tokens_per_s = result["world_size"] * args.micro_batch * args.seq / step_time
    tflops = tflops_per_gpu(flops_per_token, tokens_per_s, result["gpus"])
    losses = [s["loss"] for s in steps]
    result.update(
        losses=losses, first_loss=losses[0], nonfinite_loss=not all(map(math.isfinite, losses)),
        step_time_s=step_time, tokens_per_s=tokens_per_s, tflops_per_gpu=tflops,
        mfu=tflops / peak if peak else None,
        model_state_bytes=model_states(result["model_state_breakdown"]),
        host_state_bytes=model_states(result.get("host_state_breakdown", {})),
    )
    for key in ("peak_mem_bytes", "peak_reserved_bytes", "host_peak_rss_bytes"):
        if key in result:
            result[key] = max(result[key], *(s[key] for s in steps))


# -----------------------------------------------------------------------------
# report


def log(rank, msg):
    if rank == 0:
        print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def phase(rank, name):
    """Log a phase's start and end, and a line every 30 s while it runs: a first JIT build of DeepSpeed's
    ops can take minutes, and a long start should never sit silent."""
    start, done = time.perf_counter(), threading.Event()

    def heartbeat():
        while not done.wait(30):
            log(rank, f"{name}: still running after {time.perf_counter() - start:.0f} s")

    log(rank, f"{name} ...")
    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        yield
    finally:
        done.set()
    log(rank, f"{name}: done in {time.perf_counter() - start:.1f} s")


def kinds_text(breakdown):
    return ", ".join(f"{kind} {report.size(breakdown[kind])}" for kind in ("params", "grads", "master", "moments"))


def human_lines(r):
    """What one rank holds, in words; a rank that failed early has fewer figures."""
    tag, rank, gib = f"[Stage {r['stage']}]", f"Rank {r['rank']}", report.gib
    lines = []
    if "param_tensors" in r:
        lines.append(f"{tag} {rank} - total param tensors: {r['param_tensors']}, sharded param tensors: "
                     f"{r['partitioned_tensors']}, persistent: {r['persistent_tensors']}, local elements: "
                     f"{r['local_param_elems']:,} of {r['params_total']:,}, shard sizes: "
                     f"{'ok' if r['shard_check_ok'] else 'WRONG'}")
    if "model_state_bytes" in r:
        size = report.size
        error = report.fmt(report.error(r["model_state_bytes"], r["predicted_model_state_bytes"]), "+.1%")
        lines.append(f"{tag} {rank} model states: {size(r['model_state_bytes'])} "
                     f"({kinds_text(r['model_state_breakdown'])}) vs ZeRO prediction "
                     f"{size(r['predicted_model_state_bytes'])} ({error}); other "
                     f"tensors {size(r['model_state_breakdown']['other'])}; partitioned parameters still gathered "
                     f"after backward: {r['gathered_tensors']}")
        if "host_state_breakdown" in r:
            lines.append(f"{tag} {rank} host (CPU) model states: {size(r['host_state_bytes'])} "
                         f"({kinds_text(r['host_state_breakdown'])}) vs prediction "
                         f"{size(r['predicted_host_state_bytes'])}; other host tensors "
                         f"{size(r['host_state_breakdown']['other'])}")
        held, promised = r["held_fraction"], r["promised_fraction"]
        lines.append(f"{tag} {rank} holds of the whole model's states: " + ", ".join(
            f"{kind} {held[kind]:.1%} (promised {promised[kind]:.1%})" for kind in held) +
            f": {'as' if r['partition_check_ok'] else 'NOT as'} stage {r['stage']} promises")
        estimate = r["deepspeed_estimate"]
        if estimate:
            lines.append(f"{tag} {rank} DeepSpeed's estimator: {size(estimate['device'])} per device, "
                         f"{size(estimate['host_per_node'])} per node")
        peak = f"; the peak at {size(r['predicted_peak_bytes'])}" if r["mem_kind"] == "cuda" else ""
        lines.append(f"{tag} {rank} estimated: activations {size(r['activation_estimate_bytes'])}, the optimizer "
                     f"step's fp32 gradients {size(r['step_transient_bytes'])}{peak}")
        lines += [f"{tag} {rank} difference: {d}" for d in r["differences"]]
    if r["rank"] == 0 and r.get("losses"):
        losses = ", ".join(f"{x:.4f}" for x in r["losses"])
        lines.append(f"{tag} first-step loss: {r['first_loss']:.4f}; losses: {losses}")
    if r["mem_kind"] == "cuda":
        extra = (f"peak allocated; reserved {gib(r.get('peak_reserved_bytes', 0)):.2f}, after init "
                 f"{gib(r.get('mem_after_init_bytes', 0)):.2f}, device {gib(r.get('device_total_bytes', 0)):.1f} GiB")
    else:
        extra = "peak RSS of the process"
    lines.append(f"{tag} {rank} peak memory: {gib(r['peak_mem_bytes']):.2f} GiB ({extra})")
    if r["oom"]:
        lines.append(f"{tag} {rank} OUT OF MEMORY: {r['error']}")
    elif r["error"]:
        lines.append(f"{tag} {rank} FAILED: {r['error']}")
    if r.get("nonfinite_loss"):
        lines.append(f"{tag} {rank} WARNING: the loss is not finite: {r['losses']}")
    return lines


def emit(result):
    """A rank's human lines and its RESULT line, in one write so that ranks sharing a log don't interleave."""
    sys.stdout.write("\n".join([*human_lines(result), "RESULT " + json.dumps(result)]) + "\n")
    sys.stdout.flush()


# -----------------------------------------------------------------------------
# main


def run(args, config, result):
    normalise_cuda_arch_list()
    rank = int(os.environ.get("RANK", 0))
    with phase(rank, "starting the process group"):
        device, ranks_per_node, ranks_per_gpu, gpus = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    result.update(rank=rank, world_size=world, rehearsal=ranks_per_gpu > 1, ranks_per_gpu=ranks_per_gpu,
                  ranks_per_node=ranks_per_node, gpus=gpus, env=environment(device),
                  offload=offload_devices(config.get("zero_optimization", {})))
    if ranks_per_gpu > 1:
        log(rank, f"REHEARSAL: {world} ranks share {gpus} GPU(s) over gloo: each rank's memory is real, "
                  "its speed is not")
    log(rank, f"stage {args.stage}, {world} rank(s), {args.model} model, {args.dtype}, micro batch "
              f"{args.micro_batch} x {args.seq} tokens, config {args.config}")
    if args.max_mem_gib:
        cap_memory(device, args.max_mem_gib)
        where = "" if device.type == "cuda" else " of data added from now on"
        log(rank, f"memory capped at {args.max_mem_gib} GiB per rank{where}")
    with phase(rank, "building the model"):
        model = build_model(args, config, device)
    with phase(rank, "starting the DeepSpeed engine"):
        engine = build_engine(model, args, config)
    result["optimizer"] = optimizer_name(engine)
    result["ready_s"] = time.perf_counter() - START
    log(rank, f"ready to train; optimizer {result['optimizer']}")
    result.update(memory_snapshot(device))
    if device.type == "cuda":
        result["mem_after_init_bytes"] = torch.cuda.memory_allocated(device)
        result["device_total_bytes"] = torch.cuda.get_device_properties(device).total_memory
    result.update(shard_report(engine.module, world))
    result["weights_checksum"] = weights_checksum(engine.module, rank)
    log(rank, f"{result['params_total']:,} parameters in {result['param_tensors']} tensors")
    layers, _, d_model = PRESETS[args.model][:3]
    flops_per_token = 6 * result["params_total"] + 12 * layers * d_model * args.seq
    peak = peak_tflops(device, args.dtype)
    train(engine, args, device, rank, world, flops_per_token, peak, result)
    summarize(result, args, flops_per_token, peak)
    result.update(predict_memory(result, args, device, config.get("zero_optimization", {})))
    whole = predicted_states(args.stage, args.dtype, result["params_total"], result["params_total"], 0)
    held, promised = shares(held_bytes(result), whole), shares(result["predicted_breakdown"], whole)
    result.update(held_fraction=held, promised_fraction=promised,
                  partition_check_ok=partition_check(held, promised, args.stage, result))
    result["differences"] = differences(result)


def out_of_memory(e):
    """A GPU's out-of-memory (from PyTorch's allocator, or a CUDA call such as a pinned host buffer's), or a
    CPU allocation refused (as under --max-mem-gib)."""
    text = str(e)
    return (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower()
            or "DefaultCPUAllocator: can't allocate memory" in text)


def main(argv=None):
    args = parse_args(argv)
    config = resolve(args)
    result = {"stage": args.stage, "rank": int(os.environ.get("RANK", 0)),
              "world_size": int(os.environ.get("WORLD_SIZE", 1)),
              "model": args.model, "config": str(args.config), "dtype": args.dtype, "micro_batch": args.micro_batch,
              "seq": args.seq, "lr": args.lr, "seed": args.seed, "checkpoint": args.checkpoint,
              "compile": args.compile, "max_mem_gib": args.max_mem_gib, "steps": [], "oom": False, "error": None,
              "peak_mem_bytes": 0,
              "mem_kind": "cuda" if torch.cuda.is_available() else "cpu_rss"}
    status = 0
    try:
        run(args, config, result)
    except Exception as e:  # noqa: BLE001 -- any failure is reported as a result, with its traceback in the log
        oom = out_of_memory(e)
        if not oom:
            traceback.print_exc()
        result.update(oom=oom, error=(f"{type(e).__name__}: {e}").splitlines()[0])
        status = EXIT_OOM if oom else EXIT_FAILED
    if status:
        # a rank that failed reports alone: its peers may be blocked in a collective
        here = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        result.update(memory_snapshot(here))
        emit(result)
    else:
        everyone = [None] * result["world_size"]
        dist.all_gather_object(everyone, result)
        if result["rank"] == 0:
            for record in everyone:
                emit(record)
            print(report.rank_table(everyone), flush=True)
        dist.barrier()  # rank 0 has printed everything before any rank leaves
        status = EXIT_NONFINITE if result["nonfinite_loss"] else 0
    # Leave without the interpreter's teardown: after ZeRO-3 on gloo it sometimes aborts the process
    # ("terminate called without an active exception") after all work is done. A failed rank's peers may
    # be blocked in a collective; the launcher ends them when it sees the failure's exit status.
    release_shared_memory(result["rank"])
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
