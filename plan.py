"""
Plan a cluster: per GPU, the memory and the step time of ZeRO stages 0 to 3 and FSDP2 on 8 to 1024 GPUs, from
the theory in zero3bench/accounting/predict.py alone: no torch, no deepspeed, no GPU, no launch; a second to run.

    python3 plan.py                                       # the 1.3b preset on 8, 64, 512 and 1024 GPUs
    python3 plan.py --params 8.03e9 --layers 32 --d-model 4096 --heads 32 --vocab 128256 --seq 8192 --gpus 8 128
    python3 plan.py --from results/<timestamp> --json     # the GPU, its MFU and its link as a run measured them

A run to plan from has steady steps (step 4 on, not the profiled last): bash run.sh --ranks 1 --steps 30.

Every default is an assumption, stated with its source in --help and in the plan's header. Exit status 0; 2 on
bad input, 6 where the plan cannot be written (one line on stderr each).
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple, NoReturn

from zero3bench.accounting.shapes import DEFAULT_MODEL, PRESETS, ModelShape
from zero3bench.exits import EXIT
from zero3bench.formatting import quiet_when_closed
from zero3bench.options import DEFAULT_SEQ, BadInput, check_seq
from zero3bench.planning import cluster, folders, output, steptime
from zero3bench.planning.cluster import SETUPS, Inputs, Model
from zero3bench.accounting.timing import hfu_per_mfu
from zero3bench.planning.folders import Folder
from zero3bench.planning.inputs import ASSUMED, SPANS, between, number

# The ranges of the numbers: what the arithmetic holds and what is physically meaningful.
MAX_PARAMS = 1e14  # 50x the largest dense model trained
TOO_MANY = {"gpus": (cluster.MAX_GPUS, "where the search for the fewest that fit ends"), "layers": (10**5, "layers"),
            "d_model": (2**20, "d_model"), "heads": (2**16, "heads"), "vocab": (2**26, "tokens in a vocabulary"),
            "seq": (2**26, "tokens in a row"), "micro_batch": (2**20, "rows"),
            "gpus_per_node": (2**10, "GPUs in a node"), "host_cores": (2**14, "host cores")}
SHAPE_FLAGS = ("layers", "d_model", "heads", "vocab")


# -----------------------------------------------------------------------------
# the command line


class Parser(argparse.ArgumentParser):
    def __init__(self, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description)
        # argparse takes -1e5, -inf and -nan for options, and says "expected one argument": as no option of
        # plan.py looks like a number, each is read as the number it is, for its range to refuse
        self._negative_number_matcher = re.compile(r"^-((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf(inity)?|nan)$", re.I)

    def error(self, message: str) -> NoReturn:  # one line and exit 2, as for every other bad input
        raise BadInput(message)


def assumed(key: str) -> str:
    value, why = ASSUMED[key]
    return f"(default {value:g}: {why}; an assumption)"


def whole(key: str) -> Callable[[str], float]:
    high, what = TOO_MANY[key]
    return between(int, 1, high, what if key == "gpus" else f"the most {what} plan.py plans")


def amount(key: str) -> Callable[[str], float]:
    span = SPANS[key]
    return between(float, span.low, span.high, span.why)


MACHINE_FLAGS = [("gpu_mem_gib", "--gpu-mem-gib", "one GPU's memory in GiB"),
                 ("peak_tflops", "--peak-tflops", "one GPU's dense 16-bit peak"),
                 ("mfu", "--mfu", "the model FLOPs utilization, PaLM's: the model's FLOPs over the peak, without "
                                  "checkpointing's recomputation (at most 0.75 with it, as the hardware then does 4/3 "
                                  "of them)"),
                 ("intra_busbw_gbs", "--intra-busbw-gbs", "bus bandwidth within a node in GB/s"),
                 ("inter_busbw_gbs", "--inter-busbw-gbs", "bus bandwidth across nodes, per GPU, in GB/s"),
                 ("host_gbs", "--host-gbs", "host copies, per GPU, in GB/s"),
                 ("reserve_gib", "--reserve-gib", "the allocator's reserve in GiB"),
                 ("context_gib", "--context-gib", "the CUDA context in GiB")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="plan.py", description="Plan a cluster: memory and step time per GPU, ZeRO stages 0-3 and "
                                           "FSDP2, from zero3bench/accounting/predict.py alone (no torch).")
    p.add_argument("--preset", choices=PRESETS, help=f"one of train_gpt.py's models (default {DEFAULT_MODEL})")
    p.add_argument("--model", help="a Hugging Face config, as train_gpt.py's --model takes it (configs/models/NAME, a "
                                   "config.json or its folder): counted on the meta device, without weights")
    for flag in SHAPE_FLAGS:
        p.add_argument(f"--{flag.replace('_', '-')}", type=whole(flag), help="a shape of your own, with the others")
    p.add_argument("--seq", type=whole("seq"), help="tokens per row (default: the preset's context; 1024 with "
                                                     "--params alone)")
    p.add_argument("--params", type=between(float, 1, MAX_PARAMS, "50x the largest dense model"),
                   help="the parameter count, where the GPT's own count (from the shape) is not it, e.g. a SwiGLU "
                        "MLP; alone, no activations or attention FLOPs are planned")
    p.add_argument("--stages", nargs="+", choices=SETUPS, default=list(SETUPS), help="setups to plan (default all)")
    p.add_argument("--offload", action="store_true", help="the optimizer on the CPU, at DeepSpeed's stages 1-3")
    p.add_argument("--offload-param", action="store_true", help="the parameters on the CPU too (ZeRO-Infinity's "
                   "offload_param), at DeepSpeed's stage 3; implies --offload")
    p.add_argument("--micro-batch", type=whole("micro_batch"),
                   help="rows per GPU per step (default: the --from run's, at which its MFU was measured; else 2)")
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="activation checkpointing (default on, as train_gpt.py)")
    p.add_argument("--gpus", type=whole("gpus"), nargs="+", default=[8, 64, 512, 1024],
                   help="the totals to plan (default 8 64 512 1024)")
    p.add_argument("--gpus-per-node", type=whole("gpus_per_node"), help="GPUs per node " + assumed("gpus_per_node"))
    for key, flag, what in MACHINE_FLAGS:
        p.add_argument(flag, type=amount(key), help=f"{what} " + assumed(key))
    p.add_argument("--from", dest="results", type=Path, help="a results folder of GPU runs: its summary.json's GPU "
                   "memory, peak, MFU (over its steady steps, of runs whose ranks had a GPU each) and all-gather bus "
                   "bandwidth replace the assumptions; flags given still win")
    p.add_argument("--host-cores", type=whole("host_cores"),
                   help=f"a node's host cores, which its ranks share for offload's host pass (CPU Adam and the copies "
                        f"around it) (default: those the --from runs timed it on; else {steptime.HOST_CORES}, the "
                        f"H200 machine's, whose host pass is then assumed)")
    p.add_argument("--json", action="store_true", help="the plan as JSON, instead of the tables")
    p.add_argument("--plot", type=Path, help="memory and tokens/s per GPU against G, as a PNG (needs matplotlib)")
    return p.parse_args(argv)


def hf_shape(model: str, seq: int | None, checkpoint: bool = True) -> ModelShape:
    """A Hugging Face config's shape (zero3bench/hf.py), at seq, else its context up to train_gpt.py's default,
    with what it keeps for backward counted there on the meta device, for a GPU in cluster.DTYPE; refused where
    train_gpt.py would refuse its run."""
    from zero3bench import hf
    from zero3bench.accounting.memory import missing
    path = hf.config_path(model)
    if path is None:
        raise BadInput(f"--model {model} is a preset: give it as --preset")
    config = hf.transformers_config(hf.read_config(path), path)
    hf.check_checkpointing(config, checkpoint, model)
    shape = hf.shape_of(config)
    seq = seq or min(shape.context, DEFAULT_SEQ)
    check_seq(seq, model, shape.context)
    shape = hf.counted_at(config, replace(shape, context=seq), seq, cluster.DTYPE, on_gpu=True)
    absent = missing(shape, cluster.DTYPE, shape.context, True)
    if absent:  # a plan's rows are its peaks
        raise BadInput(f"--model {model}: its activations are not predicted, so no peak can be planned: {absent}")
    return shape


def resolve_model(args: argparse.Namespace) -> Model:
    """The model from a preset, a shape of its own, or a parameter count alone (with a shape, --params replaces
    the GPT's count: the activations and the attention still follow the shape)."""
    given = [f for f in SHAPE_FLAGS if getattr(args, f) is not None]
    if given and args.preset:
        raise BadInput("give --preset or a shape (--layers --d-model --heads --vocab --seq), not both")
    if given:
        missing = [f"--{f.replace('_', '-')}" for f in (*SHAPE_FLAGS, "seq") if getattr(args, f) is None]
        if missing:
            raise BadInput(f"a shape needs {', '.join(missing)} too")
        if args.d_model % args.heads:
            raise BadInput(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
        shape, name = ModelShape(args.layers, args.heads, args.d_model, args.vocab, args.seq, lr=None), "custom"
        if shape.params > MAX_PARAMS and not args.params:
            raise BadInput(f"--layers {args.layers}, --d-model {args.d_model} and --vocab {args.vocab} make "
                           f"{shape.params:.3g} parameters: at most {number(MAX_PARAMS)} (50x the largest dense "
                           f"model), as --params")
    elif args.model:
        if args.preset or args.params:
            raise BadInput("give --model, --preset or --params, one of them")
        shape, name = hf_shape(args.model, args.seq, args.checkpoint), args.model
    elif args.params and not args.preset:
        return Model("params", round(args.params))
    else:
        name = args.preset or DEFAULT_MODEL
        shape = replace(PRESETS[name], context=args.seq or PRESETS[name].context)
    params = round(args.params) if args.params else shape.params
    if params <= shape.root_params:
        raise BadInput(f"--params {params:,} leaves nothing for the blocks beside the embeddings "
                       f"({shape.root_params:,})")
    return Model(name, params, shape, shape.root_params, (params - shape.root_params) / shape.layers,
                 shape.padded_vocab * shape.d_model)


class Settled(NamedTuple):
    """What the plan is made at, where each machine input comes from, the results folder it read, offload's host pass
    and the world-1 steps it builds on."""
    inputs: Inputs
    sources: dict[str, str]
    folder: Folder | None
    host: steptime.HostPass
    world_one: steptime.WorldOne | None


def machine_inputs(args: argparse.Namespace, folder: Folder | None) -> tuple[dict[str, float], dict[str, str]]:
    """Each machine input from its flag, else the results folder, else the assumption, and where it came from.
    A folder's MFU carries its run's hardware rate (HFU) to the checkpointing planned."""
    values, sources = {}, {}
    for key, (value, why) in ASSUMED.items():
        if getattr(args, key) is not None:
            values[key], sources[key] = getattr(args, key), "given"
        elif folder and key in folder.measured:
            values[key], sources[key] = folder.measured[key]  # each checked within its flag's range as it was read
        else:
            values[key], sources[key] = value, f"assumed: {why}"
    c = folder.calibration if folder else None
    if c and sources["mfu"] != "given":
        values["mfu"] = c.hfu / hfu_per_mfu(args.checkpoint)
        if c.checkpoint != args.checkpoint:
            sources["mfu"] += (f"; its HFU {c.hfu:.3g} carried to steps {'with' if args.checkpoint else 'without'} "
                               f"checkpointing")
    return values, sources


def host_pass(args: argparse.Namespace, folder: Folder | None) -> steptime.HostPass:
    """Offload's host pass per element: the folder's ranks' probes', else assumed. A plan of more cores than the
    probes' host had, or of offload from a folder whose runs could not time it, is refused."""
    host = steptime.host_pass(folder.probes, str(folder.path)) if folder else steptime.host_pass([])
    if folder and folder.unprobed and not folder.probes and (args.offload or args.offload_param) and not any(
            s in folder.at_world_one for s in steptime.OFFLOADS):
        raise BadInput(f"--from {folder.path}: its runs could not time offload's host pass ({folder.unprobed[0]}), "
                       f"and it ran no offload at world 1: plan offload from a run that timed it")
    if args.host_cores and host.host_cores and args.host_cores > host.host_cores:
        raise BadInput(f"--host-cores {args.host_cores} is more than the {host.host_cores} cores of the host that "
                       f"--from {folder.path if folder else ''} timed offload's host pass on: plan at most "
                       f"{host.host_cores}, or from a run on the larger host")
    return host


def settle(args: argparse.Namespace, model: Model) -> Settled:
    """The plan's inputs, each checked, from the flags, the results folder and the assumptions."""
    folder = folders.read_folder(args.results) if args.results else None
    values, sources = machine_inputs(args, folder)
    if values["reserve_gib"] + values["context_gib"] >= values["gpu_mem_gib"]:
        raise BadInput(f"--context-gib {values['context_gib']:g} and --reserve-gib {values['reserve_gib']:g} must "
                       f"together be less than the GPU's memory, --gpu-mem-gib {values['gpu_mem_gib']:g}: here "
                       f"--context-gib below {values['gpu_mem_gib'] - values['reserve_gib']:g}")
    most = 1 / hfu_per_mfu(args.checkpoint)
    if values["mfu"] > most:
        raise BadInput(f"--mfu must be at most {most:.3g} with checkpointing, whose recomputed forward makes the "
                       f"hardware's FLOPs {hfu_per_mfu(True):.3g}x the model's, not {values['mfu']:g}")
    c = folder.calibration if folder and sources["mfu"] != "given" else None
    micro_batch: int = args.micro_batch or (c.micro_batch if c and c.micro_batch else 2)
    if args.plot and not args.plot.parent.is_dir():
        raise BadInput(f"--plot {args.plot}: no folder {args.plot.parent}")
    if args.plot and args.plot.is_dir():  # matplotlib would write <folder>.png beside it
        raise BadInput(f"--plot {args.plot} is a folder: name the PNG file, such as {args.plot / 'plan.png'}")
    link_curve = folder.curve if folder and args.intra_busbw_gbs is None else None  # a bandwidth given: every size
    host = host_pass(args, folder)
    i = Inputs(micro_batch, model.shape.context if model.shape else args.seq or 1024, args.checkpoint,
               sorted(set(args.gpus)), int(values.pop("gpus_per_node")), args.offload, args.offload_param,
               list(dict.fromkeys(args.stages)), folder.device if folder else None, link_curve, **values,
               host_cores=args.host_cores or host.cores)
    world_one = steptime.world_one(folder.path, folder.at_world_one, model.name, i.micro_batch, i.checkpoint,
                                   i.host_cores, i.host_gbs, host) if folder else None
    return Settled(i, sources, folder, world_one.host if world_one else host, world_one)


def write(text: str) -> None:
    """The plan on standard output; one line and exit status 6 where it cannot be written (a full disk)."""
    try:
        print(text)
        sys.stdout.flush()
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is buffered goes there at exit
        print(f"plan.py: error: cannot write the plan to standard output: {e.strerror}", file=sys.stderr)
        sys.exit(EXIT["not written"])


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(argv)
        model = resolve_model(args)
        i, sources, folder, host, world_one = settle(args, model)
    except BadInput as e:
        print(f"plan.py: error: {e}", file=sys.stderr)
        sys.exit(EXIT["bad input"])
    if folder:
        planned = folders.Planned(model.name, i.seq, i.micro_batch, sources["mfu"] == "given")
        for warning in folders.folder_warnings(folder, planned):
            print(f"plan.py: warning: {warning}", file=sys.stderr)
    p = cluster.plan(model, i, sources, folder.calibration if folder else None, host, world_one)
    write(json.dumps(p.as_dict(), indent=1) if args.json else output.text(p))
    if args.plot:
        try:
            output.plot(p, args.plot)
        except OSError as e:
            print(f"plan.py: error: cannot write --plot {args.plot}: {e.strerror}", file=sys.stderr)
            sys.exit(EXIT["not written"])


if __name__ == "__main__":
    quiet_when_closed()
    main()
