"""
train_gpt.py's inputs: the command line and the DeepSpeed config, checked and resolved before any process
group starts. Bad input stops with one line on stderr and exit status 2, never a traceback, so that run.sh
can check a whole run up front (`train_gpt.py --check`) and launch nothing.
"""
import argparse
import difflib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field as dataclass_field, fields as dataclass_fields
from pathlib import Path
from typing import Any, NoReturn

from zero3bench import stages
from zero3bench.exits import EXIT

PRECISIONS = ("bf16", "fp16", "fp32")
ENGINES = ("deepspeed", "fsdp2")
TIMELINES = ("memory", "snapshot")
STAGES = tuple(stages.PARTITIONS)
# The ranges of the numbers, each at what the code can hold or what is physically meaningful:
SEED_LIMIT = 2**63  # numpy's and torch's seeds are 64-bit
MAX_STEPS = 10**6  # each step is ~320 bytes of its rank's RESULT line (benchmarks/logs/cpu/fast-sharding): 320 MB
MAX_TOKENS = 2**31  # a rank's tokens per step (micro batch x seq): CUDA kernels index many tensors in 32 bits
MAX_RANKS = 2**20  # ten times the largest cluster yet (~100,000 GPUs)
MAX_LR = 3.4e38  # float32's and bf16's largest: the optimizers apply the rate in the weights' dtype
MAX_MEM_GIB = 2**20  # a PiB: beyond any device's or host's memory; RLIMIT_DATA holds bytes up to 2**63
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week; torch's gloo group takes 1e9 s, and 1e15 overflows its C int
RUN_SH_OPTIONS = ("--ranks", "--stages", "--peer")  # run.sh's own; it passes every other option on to train_gpt.py
SUGGEST_CUTOFF = 0.8  # how alike a mistyped option and a suggestion must be: difflib's 0.6 offers --seed for --peer
# DeepCompile's default schedule compiles again after deepspeed.compile.init_z3.WARMUP (5) steps: at step 6 here
DEEPCOMPILE_RECOMPILE_STEP = 6
# The first steps train on the same rows (train_gpt.get_batch), and verdict (c) judges that the loss falls at
# each of them: training on one batch must lower its loss, whatever the batch ("overfit one batch"). Training
# draws its batches by it, so it stays here and train_gpt.py imports nothing of reporting/.
SAME_ROWS_STEPS = 3
# fp16's dynamic loss scaler skips a step whose gradients overflow: a run trains until --steps steps have been
# applied, skipping at most this many besides. DeepSpeed's scale starts at 2^16 and halves from the second
# overflow on (hysteresis 2) down to 1: 17 overflows in a row, after which it raises.
MAX_SKIPPED_STEPS = 17
# A loss above this multiple of the first step's has diverged: the run stops there, as for a loss that is not finite.
DIVERGED_FACTOR = 10
# A row's tokens by default, where the model's context is longer: the GPT presets' context, beside which a Hugging
# Face config's (131,072 for Llama 3) would hold a row's activations many times over
DEFAULT_SEQ = 1024


@dataclass(frozen=True)
class Run:
    """What one run trains and how, resolved once from the command line, the config and the machine
    (train_gpt.resolve); every rank's RESULT begins with these fields (result.RankResult). A run read back from a
    log that lacks a field (one from an older version, or none: reading.NOTHING) holds None there."""
    stage: int | None
    engine: str  # "deepspeed", or "fsdp2": PyTorch's fully_shard as ZeRO-3's peer
    model: str | None
    config: str | None
    dtype: str | None
    micro_batch: int | None
    seq: int | None
    steps_planned: int | None  # --steps; fewer run where a signal or a diverged loss stops the run
    lr: float | None
    warmup: int | None
    seed: int | None
    checkpoint: bool | None
    compile: bool | None
    deepcompile: bool  # DeepSpeed's compiler, whose collectives run in its graph, unseen by accounting.comms
    max_mem_gib: float | None  # --max-mem-gib, or None: no cap
    timeout_s: float | None
    offload: dict = dataclass_field(default_factory=dict)  # offload_devices(config)
    data: str | None = None  # --data, or None for Python's own sources
    fused_adamw: bool | None = None  # whether torch's fused AdamW steps on this device (compat.degrade)
    leaf_modules: bool | None = None  # whether ZeRO-3 gathers a whole block at once (compat.degrade)
    timeline: str | None = None  # --timeline: "memory" traces the last step's memory, "snapshot" the allocator's too


RUN_KEYS = {f.name for f in dataclass_fields(Run)}


def run_from(d: dict[str, Any]) -> Run:
    """The run that a record's keys name (a RESULT line's first), or a plan's. A log from before a field was recorded
    lacks it: that run was DeepSpeed's, without DeepCompile or offload, its other settings unknown (None)."""
    absent: dict[str, Any] = {**dict.fromkeys(RUN_KEYS), "engine": "deepspeed", "deepcompile": False, "offload": {}}
    return Run(**{name: d.get(name, value) for name, value in absent.items()})


class BadInput(Exception):
    """Input that no run can use: its message is the one line the user sees."""


def fail(msg: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2. Every rank says it, whatever its number: a peer may have found what
    rank 0 did not (a file missing on its node), and a RANK inherited from a pod must not silence it."""
    rank = os.environ.get("RANK", "0")
    print(f"train_gpt.py: error: {f'rank {rank}: ' if rank.isdecimal() and rank != '0' else ''}{msg}", file=sys.stderr)
    sys.exit(EXIT["bad input"])


def positive(kind: type[float], high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite number above 0, and at most high."""
    def parse(text: str) -> float:
        value = kind(text)
        if not (math.isfinite(value) and 0 < value <= high):
            up_to = "" if high == math.inf else f" up to {high:.10g}"
            raise argparse.ArgumentTypeError(f"must be a positive number{up_to}, not {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def at_least(low: int, high: float = math.inf) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {text}" if high == math.inf else
                                             f"must be a whole number from {low} to {high}, not {text}")
        return value
    parse.__name__ = "int"
    return parse


MODEL_HELP = ("a preset ({}; default 1.3b on GPUs, tiny without), a Hugging Face config.json, its folder, or NAME for "
              "configs/models/NAME.json")
SEQ_HELP = f"tokens per row (default: the model's context, at most {DEFAULT_SEQ})"
TIMELINE_HELP = ("trace each rank's memory through its first and last steps, at each module's forward and backward, "
                 "each gather and release, backward and the optimizer step (report.py draws timeline.png); =snapshot "
                 "also writes the CUDA allocator's snapshot per rank, for PyTorch's memory viewer. A traced step is "
                 "not timed")
DATA_HELP = ("token file: flat uint16 (nanoGPT .bin) or a 1-D .npy of unsigned integers (uint32 for ids of 65,536 on); "
             "default: Python's sources")


def parse_args(argv: Sequence[str] | None, presets: Iterable[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train_gpt.py", description="DeepSpeed ZeRO benchmark on a GPT-style model.")
    p.add_argument("--stage", type=int, choices=STAGES,
                   help=f"ZeRO stage; loads {stages.CONFIG_NAME.format('<N>')} (default {stages.ZERO3})")
    p.add_argument("--config", type=Path, help=f"a DeepSpeed config file instead of {stages.CONFIG_NAME.format('<N>')}")
    p.add_argument("--model", metavar="MODEL", help=MODEL_HELP.format(", ".join(presets)))
    p.add_argument("--micro-batch", type=at_least(1),
                   help="rows per rank per step (default: the config's, or its train_batch_size over the ranks, or 2)")
    p.add_argument("--seq", type=at_least(1), help=SEQ_HELP)
    p.add_argument("--steps", type=at_least(1, MAX_STEPS), default=3, help="training steps (default 3)")
    p.add_argument("--lr", type=positive(float, MAX_LR),
                   help="AdamW's peak learning rate, after the warm-up (default: the config's, else the preset's)")
    p.add_argument("--warmup", type=at_least(0, MAX_STEPS), default=0,
                   help="steps over which the learning rate rises linearly to --lr (default 0: none)")
    p.add_argument("--seed", type=at_least(0, SEED_LIMIT - 1), default=0, help="weights' and data's seed (default 0)")
    p.add_argument("--dtype", choices=PRECISIONS, help="bf16, fp16 or fp32 (default: the config's precision)")
    p.add_argument("--data", type=Path, help=DATA_HELP)
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="activation checkpointing: recompute each block in backward (default on; --no-checkpoint)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model through DeepSpeed's engine.compile (FSDP2: each block); a config "
                        "that turns DeepCompile on implies it")
    p.add_argument("--engine", choices=ENGINES, default="deepspeed",
                   help="fsdp2: train through PyTorch's fully_shard instead, ZeRO-3's peer, with the stage-3 config's "
                        "micro batch, precision and clipping (default deepspeed)")
    p.add_argument("--max-mem-gib", type=positive(float, MAX_MEM_GIB),
                   help="cap each rank's memory: the GPU allocator's share, or on a CPU the data the process adds")
    p.add_argument("--timeout-s", type=positive(float, MAX_TIMEOUT_S), default=120.0,
                   help="seconds a collective may wait for a rank before the run fails (default 120)")
    p.add_argument("--timeline", nargs="?", const="memory", choices=TIMELINES, help=TIMELINE_HELP)
    p.add_argument("--check", nargs="?", const=0, type=at_least(1, MAX_RANKS), metavar="RANKS",
                   help="check the arguments and the config for this many ranks (default: the launcher's), print "
                        "how they are read, and exit without training")
    p.add_argument("--local_rank", type=at_least(0), help=argparse.SUPPRESS)  # appended by the deepspeed launcher
    p.error = fail
    args, unknown = p.parse_known_args(argv)
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}{nearest_option(unknown, option_names(p))}")
    args.config = args.config or stages.config_path(stages.ZERO3 if args.stage is None else args.stage)
    return args


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """The options a user may give (argparse keeps them in _actions: it has no public list)."""
    return [name for action in parser._actions if action.help != argparse.SUPPRESS for name in action.option_strings]


def nearest_option(unknown: list[str], ours: list[str]) -> str:
    """' (did you mean ...?)' for the first unrecognized option, or ''. run.sh's options are candidates too: it
    passes on to train_gpt.py what it does not know, so `run.sh --rank 2` reaches train_gpt.py."""
    name = next((arg.split("=")[0] for arg in unknown if arg.startswith("-")), None)
    if name in RUN_SH_OPTIONS:
        near = difflib.get_close_matches(name, ours, n=1, cutoff=SUGGEST_CUTOFF)
        return f" ({name} is an option of run.sh" + (f"; did you mean {near[0]}?)" if near else ")")
    near = difflib.get_close_matches(name, [*ours, *RUN_SH_OPTIONS], n=1, cutoff=SUGGEST_CUTOFF) if name else []
    if not near:
        return ""
    return f" (did you mean {near[0]}{', an option of run.sh' if near[0] in RUN_SH_OPTIONS else ''}?)"


def field(config: dict[str, Any], path: str, kinds: tuple[type, ...], default: Any = None, where: str = "") -> Any:
    """config[a][b]... checked against kinds, or default when absent."""
    value = config
    for key in path.split("."):
        if not isinstance(value, dict):
            raise BadInput(f"config{where}: {path} needs {key!r} inside an object")
        if key not in value:
            return default
        value = value[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(dict.fromkeys("a number" if k in (int, float) else {str: "a string", bool: "true or false",
                                                                                  dict: "an object"}[k] for k in kinds))
        raise BadInput(f"config{where}: {path} must be {names}, not {json.dumps(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"config{where}: {path} must be finite, not {value}")
    return value


def whole(value: float | None, name: str, where: str) -> int | None:
    """A count given as a JSON number: DeepSpeed configs often write 5e8 for 500000000."""
    if value is None:
        return None
    if value != int(value) or value < 1:
        raise BadInput(f"config{where}: {name} must be a positive whole number, not {value}")
    return int(value)


def config_stage(config: dict[str, Any], args: argparse.Namespace, where: str) -> int:
    stage = field(config, "zero_optimization.stage", (int,), 0, where)
    if stage not in STAGES:
        raise BadInput(f"config{where}: zero_optimization.stage must be 0, 1, 2 or 3, not {stage}")
    if args.stage is not None and stage != args.stage:
        raise BadInput(f"config{where} has zero_optimization.stage {stage}, but --stage is {args.stage}")
    return stage


def micro_batch(config: dict[str, Any], args: argparse.Namespace, world: int, where: str) -> tuple[str, int]:
    """The rows per rank: --micro-batch, else the config's train_micro_batch_size_per_gpu, else its
    train_batch_size over the ranks, else 2. A train_batch_size must agree with whichever is used, and the rows'
    tokens must fit MAX_TOKENS."""
    accumulation = whole(field(config, "gradient_accumulation_steps", (int, float), 1, where),
                         "gradient_accumulation_steps", where)
    if accumulation != 1:
        raise BadInput(f"config{where}: the benchmark times one micro batch per step; set gradient_accumulation_steps "
                       f"to 1, not {accumulation}")
    per_rank = whole(field(config, "train_micro_batch_size_per_gpu", (int, float), None, where),
                     "train_micro_batch_size_per_gpu", where)
    total = whole(field(config, "train_batch_size", (int, float), None, where), "train_batch_size", where)
    if total is not None and total % world:
        raise BadInput(f"config{where}: train_batch_size {total} does not divide over {world} rank(s)")
    chosen = next(((name, value) for name, value in (("--micro-batch", args.micro_batch),
                                                     ("train_micro_batch_size_per_gpu", per_rank),
                                                     ("train_batch_size", total and total // world)) if value),
                  ("the default", 2))
    if total is not None and chosen[1] * world != total:
        raise BadInput(f"{chosen[0]} {chosen[1]} x {world} rank(s) contradicts train_batch_size {total} "
                       f"in config{where}")
    if chosen[1] * args.seq > MAX_TOKENS:
        raise BadInput(f"micro batch {chosen[1]} (from {chosen[0]}) x seq {args.seq} is over {MAX_TOKENS:,} tokens "
                       "per rank per step, more than the kernels can index")
    return chosen


def precision(config: dict[str, Any], args: argparse.Namespace, on_gpu: bool, bf16_ok: bool,
              where: str) -> tuple[str, str]:
    """--dtype, else the config's fp16 or bf16 section, else fp32, as DeepSpeed reads it."""
    enabled = [name for name in ("fp16", "bf16") if field(config, f"{name}.enabled", (bool,), False, where)]
    if len(enabled) == 2:
        raise BadInput(f"config{where} enables both fp16 and bf16")
    dtype, source = (args.dtype, "--dtype") if args.dtype else ((enabled or ["fp32"])[0], "the config")
    if dtype == "fp16" and not on_gpu:
        raise BadInput(f"fp16 needs a GPU, and this machine has none: use --dtype bf16 or fp32 "
                       f"({source} asks for fp16)")
    if dtype == "bf16" and on_gpu and not bf16_ok:
        raise BadInput(f"this GPU has no bf16: use --dtype fp16 or fp32 ({source} asks for bf16)")
    return dtype, source


def optimizer(config: dict[str, Any], where: str, known: Callable[[str], bool]) -> dict[str, Any] | None:
    """The config's optimizer section, if any: its type must be one that DeepSpeed builds."""
    section = field(config, "optimizer", (dict,), None, where)
    if section is None:
        return None
    kind = field({"optimizer": section}, "optimizer.type", (str,), None, where)
    if kind is None or not known(kind):
        raise BadInput(f"config{where}: optimizer.type {json.dumps(kind)} is not an optimizer that DeepSpeed builds")
    field(config, "optimizer.params", (dict,), {}, where)
    return section


def check_seq(seq: int, model: str, context: int) -> None:
    """A sequence past the model's context, refused: on the meta device its count would succeed all the same."""
    if seq > context:
        raise BadInput(f"--seq {seq} is outside the {model} model's context of 1..{context} tokens")


def resolve(args: argparse.Namespace, config: dict[str, Any], model: str, preset: tuple[int, float], world: int,
            host: dict[str, Any]) -> tuple[dict[str, Any], Run, str]:
    """Fill in what depends on the config, the machine and the number of ranks, and check every input.
    model: the preset's name, preset: its (context, default lr); host: on_gpu, bf16_ok and known_optimizer.
    Returns the config to hand to DeepSpeed, the run (Run) and one line that says how the inputs were read.
    The settings are worked out on a copy of args, which stays as the user gave it."""
    args = argparse.Namespace(**{**vars(args), "model": model})
    where = f" {args.config}"
    args.stage = config_stage(config, args, where)
    context, default_lr = preset
    args.seq = min(context, DEFAULT_SEQ) if args.seq is None else args.seq
    check_seq(args.seq, args.model, context)
    batch_source, args.micro_batch = micro_batch(config, args, world, where)
    args.dtype, dtype_source = precision(config, args, host["on_gpu"], host["bf16_ok"], where)
    section = optimizer(config, where, host["known_optimizer"])
    if args.engine == "fsdp2":
        fsdp2_can_run(config, args, section, where, host)
    deepcompile(config, args, host["on_gpu"], where)
    config_lr = field(config, "optimizer.params.lr", (int, float), None, where)
    if config_lr is not None and not 0 < config_lr <= MAX_LR:
        raise BadInput(f"config{where}: optimizer.params.lr must be a positive number up to {MAX_LR:g}, "
                       f"not {config_lr}")
    lr_source = "--lr" if args.lr else ("the config" if config_lr else "the preset")
    args.lr = args.lr or config_lr or default_lr
    scheduler = field(config, "scheduler", (dict,), None, where)
    config = {**config, "train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1,
              "train_batch_size": args.micro_batch * world, "steps_per_print": 10**9,
              "bf16": {**config.get("bf16", {}), "enabled": args.dtype == "bf16"},
              "fp16": {**config.get("fp16", {}), "enabled": args.dtype == "fp16"}}
    if section and not scheduler:
        # the training loop sets each step's rate; at step 0, where DeepSpeed builds the optimizer, it is 0
        config["optimizer"] = {**section, "params": {**section.get("params", {}), "lr": 0.0}}
    line = how_read(args, world, section, scheduler, {"dtype": dtype_source, "batch": batch_source, "lr": lr_source})
    run = Run(**{name: getattr(args, name) for name in ("stage", "engine", "model", "dtype", "micro_batch", "seq", "lr",
                                                        "warmup", "seed", "checkpoint", "compile", "deepcompile",
                                                        "max_mem_gib", "timeout_s", "timeline")},
              config=str(args.config), steps_planned=args.steps, offload=offload_devices(config),
              data=args.data and str(args.data))
    return config, run, line


def how_read(args: argparse.Namespace, world: int, section: dict[str, Any] | None, scheduler: dict[str, Any] | None,
             sources: dict[str, str]) -> str:
    """One line that says how the inputs were read, and where each setting came from."""
    rate = ("set by the config's scheduler" if scheduler else f"{args.lr:g} (from {sources['lr']}; "
            + (f"warm-up over {args.warmup} steps)" if args.warmup else "constant)"))
    engine = "FSDP2 as " if args.engine == "fsdp2" else ""
    compiled = ", DeepCompile (from the config)" if args.deepcompile else ", compiled" if args.compile else ""
    return (f"{engine}stage {args.stage}, {args.dtype} (from {sources['dtype']}), micro batch {args.micro_batch} per "
            f"rank (from {sources['batch']}) x {world} rank(s), lr {rate}, optimizer "
            f"{section['type'] + ' (DeepSpeed builds it)' if section else 'torch AdamW'}{compiled}, "
            f"config {args.config}")


def first_timed_step(deepcompile: bool, stage: int | None) -> int:
    """Step 1 pays for allocations, kernel selection and ZeRO-3's first trace. DeepCompile at stage 3 compiles at
    step 1 and again at DEEPCOMPILE_RECOMPILE_STEP, once it has profiled the first steps. The options check --steps
    against it and RankResult times from it; the verdict does not ask it, so it is the options', not reporting's."""
    return DEEPCOMPILE_RECOMPILE_STEP + 1 if deepcompile and stages.shards_params(stage) else 2


def deepcompile(config: dict[str, Any], args: argparse.Namespace, on_gpu: bool, where: str) -> None:
    """DeepCompile works through engine.compile, so it implies --compile; only the steps after it compiles count."""
    args.deepcompile = field(config, "compile.deepcompile", (bool,), False, where)
    if not args.deepcompile:
        return
    if not on_gpu:
        raise BadInput(f"config{where} turns DeepCompile on, which needs GPUs: DeepSpeed builds its ops against CUDA")
    if stages.shards_nothing(args.stage):  # DeepSpeed would fall back to plain torch.compile without a word
        raise BadInput(f"config{where} turns DeepCompile on at stage 0; DeepCompile compiles ZeRO stages 1 to 3")
    timed_from = first_timed_step(args.deepcompile, args.stage)
    if stages.shards_params(args.stage) and args.steps <= timed_from:
        raise BadInput(f"config{where} turns DeepCompile on, which compiles at step 1 and again at step "
                       f"{DEEPCOMPILE_RECOMPILE_STEP}: give --steps {timed_from + 1} or more, to time a step "
                       f"after that besides the profiled last one (--steps is {args.steps})")
    args.compile = True


def fsdp2_can_run(config: dict[str, Any], args: argparse.Namespace, section: dict[str, Any] | None, where: str,
                  host: dict[str, Any]) -> None:
    """FSDP2 stands beside ZeRO-3 as it runs on the device: torch's AdamW, bf16 or fp32, no offload."""
    if host["fsdp2_missing"]:
        raise BadInput(f"--engine fsdp2: {host['fsdp2_missing']}")
    if not stages.shards_params(args.stage):
        raise BadInput(f"--engine fsdp2 is ZeRO-3's peer and reads a stage-{stages.ZERO3} config, "
                       f"not stage {args.stage}")
    found = {"an optimizer section": section, "offload": any(offload_devices(config).values()),
             "a scheduler": "scheduler" in config,
             "DeepCompile": field(config, "compile.deepcompile", (bool,), False, where)}
    extra = [name for name, there in found.items() if there]
    if extra:
        raise BadInput(f"--engine fsdp2 trains with torch's AdamW on the device, at the benchmark's rate; "
                       f"config{where} has {' and '.join(extra)}")
    if args.dtype == "fp16":
        raise BadInput("--engine fsdp2 runs bf16 or fp32: fp16 would need a loss scaler that ZeRO's is not")


def offload_devices(config: dict[str, Any]) -> dict[str, str | None]:
    """{"optimizer": device or None, "param": device or None} from a config's zero_optimization."""
    zero = config.get("zero_optimization") or {}
    devices = {kind: (zero.get(f"offload_{kind}") or {}).get("device") for kind in ("optimizer", "param")}
    return {kind: None if device in (None, "none") else device for kind, device in devices.items()}
