"""
Plan a cluster: per GPU, the memory and the step time of ZeRO stages 0 to 3 and FSDP2 on 8 to 1024 GPUs, from
the theory in zero3bench/accounting/predict.py alone: no torch, no deepspeed, no GPU, no launch; a second to run.

    python3 plan.py                                       # the 1.3b preset on 8, 64, 512 and 1024 GPUs
    python3 plan.py --params 8.03e9 --layers 32 --d-model 4096 --heads 32 --vocab 128256 --seq 8192 --gpus 8 128
    python3 plan.py --from results/<timestamp> --json     # the GPU, its MFU and its link as a run measured them

A run to plan from has steady steps (step 4 on, not the profiled last): bash run.sh --ranks 1 --steps 30.

Every default is an assumption, stated with its source in --help and in the plan's header. Exit status 0, or
2 on bad input (one line on stderr).
"""
import argparse
import bisect
import dataclasses
import json
import math
import sys
from pathlib import Path

from zero3bench import stages
from zero3bench.accounting import host, predict, timing, traffic
from zero3bench.accounting.shapes import DEFAULT_MODEL, LOSS_CHUNK, PRESETS, GPTConfig
from zero3bench.exits import EXIT
from zero3bench.formatting import quiet_when_closed
from zero3bench.options import BadInput
from zero3bench.planning import inputs, output
from zero3bench.planning.inputs import between
from zero3bench.reporting import reading

HERE = Path(__file__).resolve().parent
DTYPE = "bf16"  # the plan is of 16-bit training, the precision the peak FLOP/s below are for
WIDTH = predict.WIDTH[DTYPE]
MAX_GPUS = 2**20  # the search for the smallest G that fits stops here

# The defaults: each an assumption, with where it comes from.
ASSUMED = {
    "gpu_mem_gib": (139.8, "an H200 as torch sees it (150,109,880,320 bytes here; NVIDIA's datasheet: 141 GB)"),
    "peak_tflops": (989.0, "H100/H200 SXM dense BF16, NVIDIA's datasheets (1,979 with sparsity)"),
    "mfu": (0.4, "a typical figure for a dense transformer, not a measurement of yours"),
    "gpus_per_node": (8, "an HGX/DGX H100 or H200 node"),
    "intra_busbw_gbs": (360.0, "NVLink 4 within a node: about the ring bus bandwidth of NCCL's published "
                               "all-reduce figures on 8 H100 SXM, without NVLink SHARP"),
    "inter_busbw_gbs": (45.0, "400 Gb/s InfiniBand per GPU = 50 GB/s, at about 0.9 efficiency"),
    "host_gbs": (50.0, "PCIe 5.0 x16: 64 GB/s each way, about 0.8 of it achieved (offload's copies only)"),
    "reserve_gib": (5.5, "the allocator's reserve beyond the reserved bytes predicted: at most 5.07 GiB in any "
                         "committed H200 run of the project's configs that records its config (2.7b at stage 2 on 4 "
                         "rehearsed ranks, 32-s12, which the 5.0 GiB assumed before did not cover; 4.73 for stage 0 "
                         "at micro batch 8 without checkpointing on 2, 28-suite-matrix); stages 1 and 2, in older "
                         "runs, up to 4.62 GiB (h200/5-stages-offload-cap); the original design's config, whose "
                         "5e8-element buckets it does not plan, up to 9.22 GiB (28-suite-matrix)"),
    "context_gib": (0.5, "the CUDA context, NCCL's and cuBLAS's own memory outside torch's allocator: not measured "
                         "here, as torch does not see it"),
}
# The ranges of the numbers: what the arithmetic holds and what is physically meaningful.
MAX_PARAMS = 1e14  # 50x the largest dense model trained
TOO_MANY = {"gpus": (MAX_GPUS, "where the search for the fewest that fit ends"), "layers": (10**5, "layers"),
            "d_model": (2**20, "d_model"), "heads": (2**16, "heads"), "vocab": (2**26, "tokens in a vocabulary"),
            "seq": (2**26, "tokens in a row"), "micro_batch": (2**20, "rows"),
            "gpus_per_node": (2**10, "GPUs in a node")}
UNITS = {"gpu_mem_gib": 2**20, "peak_tflops": 1e6, "mfu": 1, "intra_busbw_gbs": 1e5, "inter_busbw_gbs": 1e5,
         "host_gbs": 1e5, "reserve_gib": 2**20, "context_gib": 2**20}
# What each setup is: a ZeRO stage and the engine that runs it.
SETUPS = {**{str(stage): (stage, "deepspeed") for stage in stages.PARTITIONS}, "fsdp2": (stages.ZERO3, "fsdp2")}
MODES = output.MODES
INPUTS = ("micro_batch", "seq", "checkpoint", "gpus", "gpus_per_node", "offload", "offload_param", "stages", "device",
          "link_curve", *ASSUMED)
SHAPE_FLAGS = ("layers", "d_model", "heads", "vocab")


@dataclasses.dataclass(frozen=True)
class Model:
    """What the plan needs of a model: its parameters and, where known, its shape (for the activations, the
    attention's FLOPs and the layer that no overlap hides), and the elements of its root module (embeddings,
    final norm), of one block and of its embedding, its largest tensor."""
    name: str
    params: int
    shape: GPTConfig | None = None
    root: int = 0
    block: float = 0
    embedding: int = 0


# -----------------------------------------------------------------------------
# one setup on G GPUs


def offloads(setup, offload):
    """DeepSpeed offloads the optimizer at ZeRO stages 1 to 3 only; FSDP2's CPU offload is not planned."""
    stage, engine = SETUPS[setup]
    return bool(offload) and engine == "deepspeed" and not stages.shards_nothing(stage)


def offloads_params(setup, args):
    """ZeRO-Infinity's offload_param: the parameters on the host too, at DeepSpeed's stage 3 only."""
    return args.offload_param and offloads(setup, True) and stages.shards_params(SETUPS[setup][0])


def label(setup, args):
    return setup + ("+offload-param" if offloads_params(setup, args)
                    else "+offload" if offloads(setup, args.offload or args.offload_param) else "")


def memory(setup, model, args, world, zero):
    """One rank's bytes by term and its peak: predict.rank_memory, as for a RESULT, with the parameters
    partitioned evenly and no persistent ones."""
    stage, engine = SETUPS[setup]
    offload = {"optimizer": "cpu" if offloads(setup, args.offload or args.offload_param) else None,
               "param": "cpu" if offloads_params(setup, args) else None}
    m = predict.rank_memory(stage, engine, DTYPE, world, model.params, zero, model.shape, block=model.block,
                            root=model.root, largest=model.embedding, micro_batch=args.micro_batch, seq=args.seq,
                            checkpoint=args.checkpoint, loss_chunk=LOSS_CHUNK, offload=offload)
    return {k: v for k, v in m.items() if k != "breakdown"}


def host_per_rank(setup, model, args, world, zero, m):
    """What one rank holds on the host: with stage 3's optimizer offloaded, its process's peak resident set
    (host.host_peak_bytes, with the offload config's offload_optimizer section: 2.7b on one H200, 57.19 GB
    predicted, 57.22 measured); else what it offloads, its states and the CPU optimizer's fp32 gradients."""
    stage, _ = SETUPS[setup]
    if offloads(setup, args.offload) and not offloads_params(setup, args) and stages.shards_params(stage):
        offload = json.loads(stages.config_path("3_offload").read_text())["zero_optimization"]["offload_optimizer"]
        section = {**zero, "offload_optimizer": offload}
        return host.host_peak_bytes(stage, WIDTH, world, math.ceil(model.params / world), section,
                                    model.shape, model.params, False)
    return m["host_states"] + m["host_buffers"]


def bus_bandwidth(args, link, kind, stage, engine, model, zero):
    """The bus bandwidth a collective gets: within a node, the measured link's curve (--from) read at the size
    of one of its calls, else the flag or the assumption; across nodes, the network's."""
    if link == "intra" and args.link_curve:
        return traffic.read_curve(args.link_curve, timing.message_bytes(kind, stage, engine, WIDTH, model.block, zero))
    return 1e9 * (args.inter_busbw_gbs if link == "inter" else args.intra_busbw_gbs)


def step_time(setup, model, args, world, zero):
    """One rank's step: compute at the MFU, each collective over the slowest link it crosses (the network
    once the ranks span nodes), offload's copies over PCIe, and the step serial and overlapped."""
    stage, engine = SETUPS[setup]
    link = "inter" if world > args.gpus_per_node else "intra"
    comm = [{"kind": kind, "phase": phase, "bytes": nbytes,
             "s": timing.ring_seconds(kind, nbytes, world, bus_bandwidth(args, link, kind, stage, engine, model, zero))}
            for kind, phase, nbytes in timing.collectives(stage, engine, WIDTH, model.params, model.root)]
    offloaded = offloads(setup, args.offload or args.offload_param)
    copies = timing.host_copies(WIDTH, model.params / world) if offloaded else []
    copies += timing.param_fetches(WIDTH, model.params / world) if offloads_params(setup, args) else []
    comm += [{"kind": "host_copy", "phase": phase, "bytes": nbytes, "s": nbytes / (1e9 * args.host_gbs)}
             for phase, nbytes in copies]
    layers, d_model = (model.shape.layers, model.shape.d_model) if model.shape else (None, 0)
    per_token = timing.flops_per_token(model.params, layers or 0, d_model, args.seq)
    flops = timing.pass_flops(args.micro_batch * args.seq * per_token, args.checkpoint)
    compute = {p: f / (args.mfu * args.peak_tflops * 1e12) for p, f in flops.items()}
    step = timing.step_seconds(compute, [(c["phase"], c["s"]) for c in comm], layers)
    return {"link": link if world > 1 else "none", "compute_s": sum(compute.values()), "comm": comm,
            "comm_s": sum(c["s"] for c in comm), "step_s": step}


def headroom_left(m, args):
    """The GPU's memory less what the rank needs: the bytes the allocator reserves (predict.reserved_bytes) and
    the headroom, its reserve beyond them and the CUDA context."""
    return (args.gpu_mem_gib - args.reserve_gib - args.context_gib) * 2**30 - predict.reserved_bytes(m)


def estimate(setup, model, args, world):
    """DeepSpeed's own estimator's bytes per GPU, as a user would compute it; None for stage 0 and FSDP2."""
    stage, engine = SETUPS[setup]
    per_node = min(world, args.gpus_per_node)
    offload = {"optimizer": offloads(setup, args.offload or args.offload_param), "param": offloads_params(setup, args)}
    e = predict.deepspeed_estimate(stage, model.params, model.embedding, per_node, world // per_node, offload)
    return e["device"] if e and engine == "deepspeed" else None


def row(setup, model, args, world, zero):
    m, t = memory(setup, model, args, world, zero), step_time(setup, model, args, world, zero)
    tokens = args.micro_batch * args.seq
    left = headroom_left(m, args)
    return {"setup": setup, "gpus": world, "nodes": -(-world // args.gpus_per_node), **m,
            "deepspeed_estimate": estimate(setup, model, args, world),
            "host_per_node": host_per_rank(setup, model, args, world, zero, m) * min(world, args.gpus_per_node),
            "headroom_left": left,
            "fits": left >= 0, **t, "tokens_per_s_per_gpu": {mode: tokens / t["step_s"][mode] for mode in MODES}}


def smallest_fitting(setup, model, args, zero):
    """The fewest GPUs on which the rank fits with its headroom, or None up to MAX_GPUS: what it needs never
    grows with G, so a binary search finds it."""
    def fits(world):
        return headroom_left(memory(setup, model, args, world, zero), args) >= 0
    first = bisect.bisect_left(range(1, MAX_GPUS + 1), True, key=fits) + 1
    return first if first <= MAX_GPUS else None


def zero_section(setup):
    """The zero_optimization section of this project's config for the setup's stage (its sub-group and
    prefetch sizes), or DeepSpeed's defaults where there is none."""
    path = stages.config_path(SETUPS[setup][0])
    return json.loads(path.read_text()).get("zero_optimization", {}) if path.exists() else {}


def plan(model, args):
    rows = [row(s, model, args, g, zero_section(s)) for s in args.stages for g in args.gpus]
    for r in rows:  # scaling efficiency: tokens/s per GPU against the setup's smallest G
        base = next(b for b in rows if b["setup"] == r["setup"])
        r["efficiency"] = {m: r["tokens_per_s_per_gpu"][m] / base["tokens_per_s_per_gpu"][m] for m in MODES}
    return {"model": {"name": model.name, "params": model.params,
                      "shape": dataclasses.asdict(model.shape) if model.shape else None},
            "dtype": DTYPE, "max_gpus": MAX_GPUS, "labels": {s: label(s, args) for s in args.stages},
            "inputs": {k: getattr(args, k) for k in INPUTS}, "sources": args.sources,
            "calibration": args.calibration, "rows": rows,
            "smallest_fitting_gpus": {s: smallest_fitting(s, model, args, zero_section(s)) for s in args.stages}}


# -----------------------------------------------------------------------------
# inputs


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as for every other bad input, not argparse's usage block
        raise BadInput(message)


def assumed(key):
    value, why = ASSUMED[key]
    return f"(default {value:g}: {why}; an assumption)"


def whole(key):
    high, what = TOO_MANY[key]
    return between(int, 1, high, what if key == "gpus" else f"the most {what} plan.py plans")


def amount(key):
    return between(float, 0, UNITS[key], "the most plan.py plans", low_allowed=key in ("reserve_gib", "context_gib"))


def parse_args(argv):
    p = Parser(prog="plan.py", description="Plan a cluster: memory and step time per GPU, ZeRO stages 0-3 and "
                                           "FSDP2, from zero3bench/accounting/predict.py alone (no torch).")
    p.add_argument("--preset", choices=PRESETS, help=f"one of train_gpt.py's models (default {DEFAULT_MODEL})")
    for flag in SHAPE_FLAGS:
        p.add_argument(f"--{flag.replace('_', '-')}", type=whole(flag), help="a shape of your own, with the others")
    p.add_argument("--seq", type=whole("seq"), help="tokens per row (default: the preset's context; 1024 with "
                                                     "--params alone)")
    p.add_argument("--params", type=between(float, 0, MAX_PARAMS, "50x the largest dense model", low_allowed=False),
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
    p.add_argument("--from", dest="results", type=Path, help="a results folder: its summary.json's GPU memory, "
                   "peak, MFU (over its steady steps) and all-gather bus bandwidth replace the assumptions; flags "
                   "given still win")
    p.add_argument("--json", action="store_true", help="the plan as JSON, instead of the tables")
    p.add_argument("--plot", type=Path, help="memory and tokens/s per GPU against G, as a PNG (needs matplotlib)")
    return p.parse_args(argv)


MACHINE_FLAGS = [("gpu_mem_gib", "--gpu-mem-gib", "one GPU's memory in GiB"),
                 ("peak_tflops", "--peak-tflops", "one GPU's dense 16-bit peak"),
                 ("mfu", "--mfu", "the fraction of the peak reached on the FLOPs run, recomputation included"),
                 ("intra_busbw_gbs", "--intra-busbw-gbs", "bus bandwidth within a node in GB/s"),
                 ("inter_busbw_gbs", "--inter-busbw-gbs", "bus bandwidth across nodes, per GPU, in GB/s"),
                 ("host_gbs", "--host-gbs", "host copies, per GPU, in GB/s"),
                 ("reserve_gib", "--reserve-gib", "the allocator's reserve in GiB"),
                 ("context_gib", "--context-gib", "the CUDA context in GiB")]


def resolve_model(args):
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
        shape, name = GPTConfig(args.layers, args.heads, args.d_model, args.vocab, args.seq, lr=None), "custom"
    elif args.params and not args.preset:
        shape, name = None, "params"
    else:
        name = args.preset or DEFAULT_MODEL
        shape = dataclasses.replace(PRESETS[name], context=args.seq or PRESETS[name].context)
    args.seq = shape.context if shape else args.seq or 1024
    params = round(args.params) if args.params else shape.params
    if not shape:
        return Model(name, params)
    if params <= shape.root_params:
        raise BadInput(f"--params {params:,} leaves nothing for the blocks beside the embeddings "
                       f"({shape.root_params:,})")
    return Model(name, params, shape, shape.root_params, (params - shape.root_params) / shape.layers,
                 shape.padded_vocab * shape.d_model)


def measured(args):
    """What a results folder says of the machine (reading.machine_of), its records' types checked first, with
    the MFU of its steady steps (planning.inputs.calibration) in place of machine_of's; and the calibration."""
    if not args.results:
        return {}, None, None, None
    runs = inputs.read_checked(args.results)
    found, device, curve = reading.machine_of(args.results)
    found.pop("mfu", None)
    c = inputs.calibration(runs)
    if c:
        few = f"; UNCERTAIN: fewer than {inputs.MIN_STEADY}" if c["uncertain"] else ""
        found["mfu"] = (c["mfu"], f"measured in {args.results} ({c['run']}, micro batch {c['micro_batch']}, over "
                                  f"{c['steady_steps']} steady steps{few})")
    return found, device, curve, c


MAKE_RUN = (f"bash run.sh --ranks 1 --steps 30 --micro-batch {inputs.PLAN_FROM_MICRO_BATCH} makes a run to plan "
            "from, at a micro batch that keeps the GPU busy")


def calibration_warnings(args):
    """What the user should know of the MFU taken from a results folder: too few steady steps, or none."""
    c = args.calibration
    if not args.results or args.sources["mfu"] == "given":
        return []
    if not c:
        return [f"--from {args.results}: no run has a steady step (step {inputs.STEADY_FROM} or later, not the "
                f"profiled last): the MFU is assumed; {MAKE_RUN}"]
    warnings = []
    if args.micro_batch != c["micro_batch"]:
        warnings.append(f"--from {args.results}: MFU {c['mfu']:.3g} measured at micro batch {c['micro_batch']}, "
                        f"planned at {args.micro_batch}: a step of another size reaches another MFU")
    if c["uncertain"]:
        warnings.append(f"--from {args.results}: MFU {c['mfu']:.3g} from {c['steady_steps']} steady step(s) of "
                        f"{c['run']}, fewer than {inputs.MIN_STEADY}: uncertain; {MAKE_RUN}")
    return warnings


def settle(args):
    """Each machine input from its flag, else the results folder, else the assumption, and where it came from."""
    found, args.device, curve, args.calibration = measured(args)
    args.link_curve = curve if args.intra_busbw_gbs is None else None  # a bandwidth given stands for every size
    args.sources = {}
    for key, (value, why) in ASSUMED.items():
        if getattr(args, key) is not None:
            args.sources[key] = "given"
        elif key in found:
            setattr(args, key, found[key][0])
            args.sources[key] = found[key][1]
        else:
            setattr(args, key, value)
            args.sources[key] = f"assumed: {why}"
    if args.micro_batch is None:  # the MFU holds at the micro batch it was measured at
        calibrated = args.calibration and args.sources["mfu"] != "given"
        args.micro_batch = args.calibration["micro_batch"] if calibrated else 2
    if args.plot and not args.plot.parent.is_dir():
        raise BadInput(f"--plot {args.plot}: no folder {args.plot.parent}")
    if args.plot and args.plot.is_dir():  # matplotlib would write <folder>.png beside it
        raise BadInput(f"--plot {args.plot} is a folder: name the PNG file, such as {args.plot / 'plan.png'}")
    args.gpus = sorted(set(args.gpus))
    args.stages = list(dict.fromkeys(args.stages))


def main(argv=None):
    try:
        args = parse_args(argv)
        model = resolve_model(args)
        settle(args)
    except BadInput as e:
        print(f"plan.py: error: {e}", file=sys.stderr)
        sys.exit(EXIT["bad input"])
    for warning in calibration_warnings(args):
        print(f"plan.py: warning: {warning}", file=sys.stderr)
    p = plan(model, args)
    print(json.dumps(p, indent=1) if args.json else output.text(p))
    if args.plot:
        output.plot(p, args.plot)


if __name__ == "__main__":
    quiet_when_closed()
    main()
