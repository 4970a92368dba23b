"""
Plan a cluster: per GPU, the memory and the step time of ZeRO stages 0 to 3 and FSDP2 on 8 to 1024 GPUs, from
the theory in accounting/predict.py alone: no torch, no deepspeed, no GPU, no launch; a second to run.

    python3 plan.py                                       # the 1.3b preset on 8, 64, 512 and 1024 GPUs
    python3 plan.py --params 8.03e9 --layers 32 --d-model 4096 --heads 32 --vocab 128256 --seq 8192 --gpus 8 128
    python3 plan.py --from results/<timestamp> --json     # the GPU, its MFU and its link as a run measured them

Every default is an assumption, stated with its source in --help and in the plan's header. Exit status 0, or
2 on bad input (one line on stderr).
"""
import argparse
import bisect
import dataclasses
import json
import sys
from pathlib import Path

import stages
from accounting import predict, timing
from accounting.shapes import LOSS_CHUNK, PRESETS, GPTConfig
from formatting import EXIT, format_table, gib
from options import BadInput, at_least, positive  # the same checks as train_gpt.py's inputs
from reporting import reading

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
}
# What each setup is: a ZeRO stage and the engine that runs it.
SETUPS = {**{str(stage): (stage, "deepspeed") for stage in stages.PARTITIONS}, "fsdp2": (stages.ZERO3, "fsdp2")}
MODES = ("overlapped", "serial")
INPUTS = ("micro_batch", "seq", "checkpoint", "gpus", "gpus_per_node", "offload", "stages", "device", "link_curve",
          *ASSUMED)
SHAPE_FLAGS = ("layers", "d_model", "heads", "vocab")


@dataclasses.dataclass(frozen=True)
class Model:
    """What the plan needs of a model: its parameters and, where known, its shape (for the activations, the
    attention's FLOPs and the layer that no overlap hides), and the elements of its root module (embeddings,
    final norm), of one block and of its embedding, its largest tensor."""
    name: str
    params: int
    shape: GPTConfig = None
    root: int = 0
    block: float = 0
    embedding: int = 0


# -----------------------------------------------------------------------------
# one setup on G GPUs


def offloads(setup, offload):
    """DeepSpeed offloads the optimizer at ZeRO stages 1 to 3 only; FSDP2's CPU offload is not planned."""
    stage, engine = SETUPS[setup]
    return bool(offload) and engine == "deepspeed" and not stages.shards_nothing(stage)


def memory(setup, model, args, world, zero):
    """One rank's bytes by term and its peak: predict.rank_memory, as for a RESULT, with the parameters
    partitioned evenly and no persistent ones."""
    stage, engine = SETUPS[setup]
    offload = {"optimizer": "cpu" if offloads(setup, args.offload) else None, "param": None}
    m = predict.rank_memory(stage, engine, DTYPE, world, model.params, zero, model.shape, block=model.block,
                            root=model.root, largest=model.embedding, micro_batch=args.micro_batch, seq=args.seq,
                            checkpoint=args.checkpoint, loss_chunk=LOSS_CHUNK, offload=offload)
    return {k: v for k, v in m.items() if k != "breakdown"}


def bus_bandwidth(args, link, kind, stage, engine, model, zero):
    """The bus bandwidth a collective gets: within a node, the measured link's curve (--from) read at the size
    of one of its calls, else the flag or the assumption; across nodes, the network's."""
    if link == "intra" and args.link_curve:
        return predict.read_curve(args.link_curve, timing.message_bytes(kind, stage, engine, WIDTH, model.block, zero))
    return 1e9 * (args.inter_busbw_gbs if link == "inter" else args.intra_busbw_gbs)


def step_time(setup, model, args, world, zero):
    """One rank's step: compute at the MFU, each collective over the slowest link it crosses (the network
    once the ranks span nodes), offload's copies over PCIe, and the step serial and overlapped."""
    stage, engine = SETUPS[setup]
    link = "inter" if world > args.gpus_per_node else "intra"
    comm = [{"kind": kind, "phase": phase, "bytes": nbytes,
             "s": timing.ring_seconds(kind, nbytes, world, bus_bandwidth(args, link, kind, stage, engine, model, zero))}
            for kind, phase, nbytes in timing.collectives(stage, engine, WIDTH, model.params, model.root)]
    if offloads(setup, args.offload):
        comm += [{"kind": "host_copy", "phase": phase, "bytes": nbytes, "s": nbytes / (1e9 * args.host_gbs)}
                 for phase, nbytes in timing.host_copies(WIDTH, model.params / world)]
    layers, d_model = (model.shape.layers, model.shape.d_model) if model.shape else (None, 0)
    per_token = predict.flops_per_token(model.params, layers or 0, d_model, args.seq)
    flops = timing.pass_flops(args.micro_batch * args.seq * per_token, args.checkpoint)
    compute = {p: f / (args.mfu * args.peak_tflops * 1e12) for p, f in flops.items()}
    step = timing.step_seconds(compute, [(c["phase"], c["s"]) for c in comm], layers)
    return {"link": link if world > 1 else "none", "compute_s": sum(compute.values()), "comm": comm,
            "comm_s": sum(c["s"] for c in comm), "step_s": step}


def row(setup, model, args, world, zero):
    m, t = memory(setup, model, args, world, zero), step_time(setup, model, args, world, zero)
    tokens = args.micro_batch * args.seq
    return {"setup": setup, "gpus": world, "nodes": -(-world // args.gpus_per_node), **m,
            "fits": m["peak"] <= args.gpu_mem_gib * 2**30, **t,
            "tokens_per_s_per_gpu": {mode: tokens / t["step_s"][mode] for mode in MODES}}


def smallest_fitting(setup, model, args, zero):
    """The fewest GPUs on which the predicted peak fits, or None up to MAX_GPUS: the peak never grows with G,
    so a binary search finds it."""
    def fits(world):
        return memory(setup, model, args, world, zero)["peak"] <= args.gpu_mem_gib * 2**30
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
            "inputs": {k: getattr(args, k) for k in INPUTS}, "sources": args.sources, "rows": rows,
            "smallest_fitting_gpus": {s: smallest_fitting(s, model, args, zero_section(s)) for s in args.stages}}


# -----------------------------------------------------------------------------
# inputs


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as for every other bad input, not argparse's usage block
        raise BadInput(message)


def assumed(key, unit=""):
    value, why = ASSUMED[key]
    return f"(default {value:g}{unit}: {why}; an assumption)"


def parse_args(argv):
    p = Parser(prog="plan.py", description="Plan a cluster: memory and step time per GPU, ZeRO stages 0-3 and "
                                           "FSDP2, from accounting/predict.py alone (no torch).")
    p.add_argument("--preset", choices=PRESETS, help="one of train_gpt.py's models (default 1.3b)")
    for flag in SHAPE_FLAGS:
        p.add_argument(f"--{flag.replace('_', '-')}", type=at_least(1), help="a shape of your own, with the others")
    p.add_argument("--seq", type=at_least(1), help="tokens per row (default: the preset's context; 1024 with "
                                                    "--params alone)")
    p.add_argument("--params", type=positive(float), help="the parameter count, where the GPT's own count (from "
                   "the shape) is not it, e.g. a SwiGLU MLP; alone, no activations or attention FLOPs are planned")
    p.add_argument("--stages", nargs="+", choices=SETUPS, default=list(SETUPS), help="setups to plan (default all)")
    p.add_argument("--offload", action="store_true", help="the optimizer on the CPU, at DeepSpeed's stages 1-3")
    p.add_argument("--micro-batch", type=at_least(1), default=2, help="rows per GPU per step (default 2)")
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="activation checkpointing (default on, as train_gpt.py)")
    p.add_argument("--gpus", type=at_least(1), nargs="+", default=[8, 64, 512, 1024],
                   help="the totals to plan (default 8 64 512 1024)")
    p.add_argument("--gpus-per-node", type=at_least(1), help="GPUs per node " + assumed("gpus_per_node"))
    p.add_argument("--gpu-mem-gib", type=positive(float), help="one GPU's memory " + assumed("gpu_mem_gib", " GiB"))
    p.add_argument("--peak-tflops", type=positive(float), help="one GPU's dense 16-bit peak " + assumed("peak_tflops"))
    p.add_argument("--mfu", type=positive(float), help="the fraction of the peak reached on the FLOPs run, "
                                                       "recomputation included " + assumed("mfu"))
    p.add_argument("--intra-busbw-gbs", type=positive(float),
                   help="bus bandwidth within a node " + assumed("intra_busbw_gbs", " GB/s"))
    p.add_argument("--inter-busbw-gbs", type=positive(float),
                   help="bus bandwidth across nodes, per GPU " + assumed("inter_busbw_gbs", " GB/s"))
    p.add_argument("--host-gbs", type=positive(float), help="host copies, per GPU " + assumed("host_gbs", " GB/s"))
    p.add_argument("--from", dest="results", type=Path, help="a results folder: its summary.json's GPU memory, "
                   "peak, MFU and all-gather bus bandwidth replace the assumptions; flags given still win")
    p.add_argument("--json", action="store_true", help="the plan as JSON, instead of the tables")
    p.add_argument("--plot", type=Path, help="memory and tokens/s per GPU against G, as a PNG (needs matplotlib)")
    return p.parse_args(argv)


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
        name = args.preset or "1.3b"
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


def settle(args):
    """Each machine input from its flag, else the results folder, else the assumption, and where it came from."""
    found, args.device, curve = reading.machine_of(args.results) if args.results else ({}, None, None)
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
    if args.mfu > 1:
        raise BadInput(f"--mfu {args.mfu:g} is above 1: a fraction of the peak")
    if args.plot and not args.plot.parent.is_dir():
        raise BadInput(f"--plot {args.plot}: no folder {args.plot.parent}")
    args.gpus = sorted(set(args.gpus))
    args.stages = list(dict.fromkeys(args.stages))


# -----------------------------------------------------------------------------
# output


def label(setup, inputs):
    return setup + ("+offload" if offloads(setup, inputs["offload"]) else "")


def within(inputs):
    curve = inputs["link_curve"]
    if not curve:
        return f"{inputs['intra_busbw_gbs']:g} GB/s"
    return (f"the measured link's curve ({min(curve.values()) / 1e9:.0f} to {max(curve.values()) / 1e9:.0f} GB/s "
            f"over {min(curve) / 2**20:g} MiB to {max(curve) / 2**20:g} MiB), read at each collective's call size")


def header(p):
    i, m = p["inputs"], p["model"]
    s = m["shape"]
    shape = (f"{s['layers']} layers, d_model {s['d_model']}, {s['heads']} heads, vocab {s['vocab']}, "
             if s else "no shape: activations and attention FLOPs not counted, ")
    lines = [f"model {m['name']}: {shape}seq {i['seq']}; {m['params']:,} parameters; micro batch {i['micro_batch']} "
             f"per GPU, checkpointing {'on' if i['checkpoint'] else 'off'}, {DTYPE}",
             f"GPU{' (' + i['device'] + ')' if i['device'] else ''}: {i['gpu_mem_gib']:.1f} GiB, "
             f"{i['peak_tflops']:g} TFLOP/s peak at MFU {i['mfu']:.3g}; {i['gpus_per_node']} GPUs per node; bus "
             f"bandwidth {within(i)} within a node, {i['inter_busbw_gbs']:g} GB/s across nodes"]
    return lines + [f"  {key} {i[key]:g}: {why}" for key, why in p["sources"].items()]


def both(figures, spec):
    return " / ".join(format(figures[mode], spec) for mode in MODES)


def main_table(p):
    rows = [("setup", "GPUs", "link", "states", "activations", "peak", "fits", "compute s", "comm s",
             "step s (overlap / serial)", "tok/s/GPU", "efficiency")]
    for r in p["rows"]:
        rows.append((label(r["setup"], p["inputs"]), r["gpus"], r["link"], f"{gib(r['states']):.2f}",
                     f"{gib(r['activations']):.2f}", f"{gib(r['peak']):.2f}", "yes" if r["fits"] else "NO",
                     f"{r['compute_s']:.3f}", f"{r['comm_s']:.3f}", both(r["step_s"], ".3f"),
                     both(r["tokens_per_s_per_gpu"], ",.0f"), both(r["efficiency"], ".1%")))
    return format_table(rows)


def comm_table(p):
    """Each setup's collectives: GB per GPU and step (offload's copies are of a 1/G partition), and their
    seconds at each G, each alone."""
    rows = [("setup", "collective", "phase", "GB per GPU", *[f"s at {g}" for g in p["inputs"]["gpus"]])]
    for setup in p["inputs"]["stages"]:
        mine = [r for r in p["rows"] if r["setup"] == setup]
        for i, c in enumerate(mine[0]["comm"]):
            per_g = c["kind"] == "host_copy"
            gb = f"{c['bytes'] * (mine[0]['gpus'] if per_g else 1) / 1e9:.2f}{'/G' if per_g else ''}"
            rows.append((label(setup, p["inputs"]), c["kind"], c["phase"], gb,
                         *[f"{r['comm'][i]['s']:.3f}" for r in mine]))
    return format_table(rows)


NOTES = [
    "memory per GPU in GiB: peak = what a rank holds throughout (model states, less the gradients freed between",
    "  steps, stage 3's bucket, cuBLAS's workspace) + the most of backward's start (weights gathered, activations),",
    "  its end (gradients, one block) and the optimizer step (gradients, their fp32 copy): accounting/predict.py's",
    "  rank_memory, within 1% of every H200 run in benchmarks/logs/h200/24-peaks; the allocator's slack is not counted",
    "compute: (6 x params + 12 x layers x d_model x seq) FLOPs per token (PaLM), a third more with checkpointing",
    "  (the recomputed forward), at MFU x peak: --mfu counts the recomputed FLOPs as work done",
    "step: serial = compute + every collective; overlapped = per pass the longer of its compute and its collectives,",
    "  plus one layer's share of those, which nothing hides, plus what runs after backward (stage 0's all-reduce,",
    "  stage 1's reduce-scatter, stages 1-2's all-gather, offload's copy back), each over the slowest link it crosses",
    "efficiency: tokens/s per GPU against the smallest G planned",
]


def text(p):
    smallest = ", ".join(f"{label(s, p['inputs'])}: {g if g else 'none up to ' + format(MAX_GPUS, ',')}"
                         for s, g in p["smallest_fitting_gpus"].items())
    notes = NOTES + (["offload: the CPU optimizer's own time and host memory per node are not planned"]
                     if p["inputs"]["offload"] else [])
    return "\n".join([*header(p), "", main_table(p), "", comm_table(p), "",
                      f"smallest G on which the peak fits: {smallest}", "", *notes])


def plot(p, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plan.py: matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, (memory_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for setup in p["inputs"]["stages"]:
        rows = [r for r in p["rows"] if r["setup"] == setup]
        gpus = [r["gpus"] for r in rows]
        name = label(setup, p["inputs"])
        name = name if SETUPS[setup][1] == "fsdp2" else f"ZeRO-{name}"
        memory_ax.plot(gpus, [gib(r["peak"]) for r in rows], marker="o", label=name)
        speed_ax.plot(gpus, [r["tokens_per_s_per_gpu"]["overlapped"] for r in rows], marker="o")
    memory_ax.axhline(p["inputs"]["gpu_mem_gib"], color="k", linestyle="--", label="GPU memory")
    memory_ax.set_ylabel("predicted peak per GPU (GiB)")
    speed_ax.set_ylabel("tokens/s per GPU (overlapped)")
    for ax in (memory_ax, speed_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
    memory_ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    try:
        args = parse_args(argv)
        model = resolve_model(args)
        settle(args)
    except BadInput as e:
        print(f"plan.py: error: {e}", file=sys.stderr)
        sys.exit(EXIT["bad input"])
    p = plan(model, args)
    print(json.dumps(p, indent=1) if args.json else text(p))
    if args.plot:
        plot(p, args.plot)


if __name__ == "__main__":
    main()
