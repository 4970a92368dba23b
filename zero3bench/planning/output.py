"""
plan.py's output: the plan as text (its header, the table per setup and GPU count, the collectives, the notes)
and as a plot, from the plan's typed rows.
"""
import sys
from pathlib import Path

from zero3bench.formatting import format_table, gib
from zero3bench.planning.cluster import DTYPE, MAX_GPUS, Inputs, Modes, Plan, Row, host_pass_of
from zero3bench.planning.steptime import OFFLOADS, WorldOne


def within(inputs: Inputs) -> str:
    curve = inputs.link_curve
    if not curve:
        return f"{inputs.intra_busbw_gbs:g} GB/s"
    return (f"the measured link's curve ({min(curve.values()) / 1e9:.0f} to {max(curve.values()) / 1e9:.0f} GB/s "
            f"over {min(curve) / 2**20:g} MiB to {max(curve) / 2**20:g} MiB), read at each collective's call size")


def header(p: Plan) -> list[str]:
    i, m, s = p.inputs, p.model, p.model.shape
    shape = (f"{s.layers} layers, d_model {s.d_model}, {s.heads} heads, vocab {s.vocab}, "
             if s else "no shape: activations and attention FLOPs not counted, ")
    hfu = f" (HFU {i.hfu:.3g}, the recomputed forward counted)" if i.checkpoint else ""
    lines = [f"model {m.name}: {shape}seq {i.seq}; {m.params:,} parameters; micro batch {i.micro_batch} "
             f"per GPU, checkpointing {'on' if i.checkpoint else 'off'}, {DTYPE}",
             f"GPU{' (' + i.device + ')' if i.device else ''}: {i.gpu_mem_gib:.1f} GiB, "
             f"{i.peak_tflops:g} TFLOP/s peak at MFU {i.mfu:.3g}{hfu}; {i.gpus_per_node} GPUs per node; bus "
             f"bandwidth {within(i)} within a node, {i.inter_busbw_gbs:g} GB/s across nodes"]
    return lines + [f"  {key} {getattr(i, key):g}: {why}" for key, why in p.sources.items()] + host_lines(p)


def host_used(p: Plan) -> list[str]:
    """The host passes that the plan's rows take: 3_offload's, 3_infinity's."""
    return sorted({host_pass_of(r.setup, p.inputs) for r in p.rows if r.host_pass_s})


def host_lines(p: Plan) -> list[str]:
    h = p.host
    return [f"  host pass {s} {h.core_s[s]:.3g} core-seconds per element, on {p.inputs.host_cores} host cores a node: "
            f"{h.sources[s]}" for s in host_used(p)]


def both(figures: Modes | None, spec: str) -> str:
    return f"{figures.overlapped:{spec}} / {figures.serial:{spec}}" if figures else "-"


def host_pass_cell(p: Plan, r: Row) -> str:
    if not r.host_pass_s:
        return "-"
    return f"{r.host_pass_s:.3f} {'assumed' if p.host.assumed(host_pass_of(r.setup, p.inputs)) else 'measured'}"


def main_table(p: Plan) -> str:
    offloaded = any(r.host_per_node for r in p.rows)
    on_host = any(r.host_pass_s for r in p.rows)
    rows = [("setup", "GPUs", "link", "states", "DS est.", "activations", "peak", *(("host/node",) * offloaded),
             "fits", "left", "compute s", *(("host pass s",) * on_host), "comm s", "step s (overlap / serial)",
             "tok/s/GPU", "scaling")]
    for r in p.rows:
        estimate = f"{gib(r.deepspeed_estimate):.2f}" if r.deepspeed_estimate is not None else "-"
        host = (f"{gib(r.host_per_node):.1f}",) * offloaded
        rows.append((p.label(r.setup), str(r.gpus), r.link, f"{gib(r.memory['states']):.2f}", estimate,
                     f"{gib(r.memory['activations']):.2f}", f"{gib(r.memory['peak']):.2f}", *host,
                     "yes" if r.fits else "NO", f"{gib(r.headroom_left):.1f}", f"{r.compute_s:.3f}",
                     *((host_pass_cell(p, r),) * on_host), f"{r.comm_s:.3f}", both(r.step_s, ".3f"),
                     both(r.tokens_per_s_per_gpu, ",.0f"), both(r.scaling, ".1%")))
    return format_table(rows)


def host_sets_the_step(p: Plan) -> list[str]:
    """One line: the rows whose host pass, not the passes on the GPU, is the longer part of the step."""
    if not any(r.host_pass_s for r in p.rows):
        return []
    held = {}
    for r in (r for r in p.rows if r.host_pass_s > r.compute_s):
        held.setdefault(p.label(r.setup), []).append(str(r.gpus))
    where = "; ".join(f"{setup} at G = {', '.join(gpus)}" for setup, gpus in held.items())
    return [f"offload's host pass, not the GPU, sets the step (it is longer than the passes) for: {where}" if held
            else "offload's host pass is shorter than the passes on the GPU in every row: the GPU sets the step", ""]


def comm_table(p: Plan) -> str:
    """Each setup's collectives: GB per GPU and step (offload's copies are of a 1/G partition), and their
    seconds at each G, each alone."""
    rows = [("setup", "collective", "phase", "GB per GPU", *[f"s at {g}" for g in p.inputs.gpus])]
    for setup in p.inputs.stages:
        mine = [r for r in p.rows if r.setup == setup]
        for n, c in enumerate(mine[0].comm):
            per_g = c.kind == "host_copy"
            gb = f"{c.bytes * (mine[0].gpus if per_g else 1) / 1e9:.2f}{'/G' if per_g else ''}"
            rows.append((p.label(setup), c.kind, c.phase, gb, *[f"{r.comm[n].s:.3f}" for r in mine]))
    return format_table(rows)


NOTES = [
    "memory per GPU in GiB: peak = what a rank holds throughout (model states, less the gradients freed between",
    "  steps, stage 3's bucket, cuBLAS's workspace) + the most of backward's start (weights gathered, activations),",
    "  its end (gradients, one block), the reduction after it (stage 0's flat bucket, stages 1-2's partition copy)",
    "  and the optimizer step (gradients, what the step makes): zero3bench/accounting/memory.py's rank_memory,",
    "  within 5% of every committed GPU run that records its config but the misses tests/test_accounting.py names",
    "step: serial = compute + every collective; overlapped = per pass the longer of its compute and its collectives,",
    "  plus one layer's share of those, which nothing hides, plus what runs after backward (stage 0's all-reduce,",
    "  stage 1's reduce-scatter, stages 1-2's all-gather, offload's copy back), each over the slowest link it crosses",
    "collective: its bytes at the link's bus bandwidth, plus per call (one per block or bucket) a ring's latency as",
    "  NCCL's own cost model gives it (Simple protocol: 8.4 us, 3.4 us per NVLink step, 14 us per network step)",
    "scaling: tokens/s per GPU against the smallest G planned; above 100% where each GPU's work falls with G",
    "  (offload's copies and the optimizer's pass, of a 1/G partition; CPU Adam, shared by more nodes)",
    "DS est.: DeepSpeed's estimate_zero2/zero3_model_states_mem_needs per GPU, which has none for stage 0 or FSDP2;",
    "  why it differs from states, in one line per stage:",
]
# Why DeepSpeed's estimator differs from the plan's model states, by stage (predict.deepspeed_estimate).
ESTIMATOR_GAPS = {
    "1": "  1: it is ZeRO-2's estimate, gradients partitioned: 2 + 18/G bytes a parameter where stage 1 holds 4 + 12/G",
    "2": "  2: it counts fp32 gradient partitions: 2 + 18/G bytes a parameter where the plan counts 2 + 14/G",
    "3": "  3: 18/G bytes a parameter where the plan counts 16/G (fp32 gradients), and 4 bytes per element of the "
         "largest layer",
}
OFFLOAD_NOTES = [
    "host/node in GiB: what the ranks of one node hold on the host: at stage 3 with the optimizer offloaded, each",
    "  process's peak resident set; otherwise what they offload (gradients, fp32 weights and moments, the CPU",
    "  optimizer's fp32 gradients; --offload-param: the 16-bit weights besides)",
    "host pass s: offload's step on the host after the passes, which nothing hides: the gradients unscaled,",
    "  DeepSpeed's CPU Adam and the updated weights copied back, on a rank's 1/G partition with its share of the",
    "  node's host cores; measured by a run's probe (zero3bench/accounting/hostpass.py) or assumed, as said above",
]


MFU_COMPUTE = [
    "compute: (6 x params + 12 x layers x d_model x seq) FLOPs per token (PaLM) at MFU x peak; with checkpointing",
    "  the hardware does a third more (the recomputed forward), at HFU = 4/3 MFU x peak",
]
WORLD_ONE_COMPUTE = [
    "compute: the step at world 1 below without offload's copies and host pass: the longer of the host's clock",
    "  (launches, the engine's own cost such as ZeRO-3's hooks) and the GPU's (FLOPs, the optimizer's pass on a 1/G",
    "  partition where the optimizer is sharded); FSDP2 on stage 0's clocks. The host's",
    "  clock is the calibrating machine's: for 2 H200s of another machine, the steps at micro batch 2 were planned",
    "  +21% to +55% too long, those at 16 within 12% (benchmarks/logs/plan/two-gpus-*.txt)",
]


def headroom_note(p: Plan) -> list[str]:
    i = p.inputs
    return ["fits: the reserved bytes (the peak, and the gradients freed between steps, which the allocator keeps",
            f"  cached) + a headroom of {i.reserve_gib + i.context_gib:g} GiB (the allocator's reserve "
            f"{i.reserve_gib:g} + the CUDA context {i.context_gib:g}) within the GPU's memory; left: what "
            f"remains"]


def text(p: Plan) -> str:
    smallest = ", ".join(f"{p.label(s)}: {g if g else 'none up to ' + format(MAX_GPUS, ',')}"
                         for s, g in p.smallest_fitting_gpus.items())
    offloaded = any(r.host_per_node for r in p.rows)
    gaps = [ESTIMATOR_GAPS[s] for s in p.inputs.stages if s in ESTIMATOR_GAPS]
    compute = WORLD_ONE_COMPUTE if p.world_one else MFU_COMPUTE
    notes = NOTES[:5] + compute + NOTES[5:] + gaps + headroom_note(p) + (OFFLOAD_NOTES if offloaded else [])
    return "\n".join([*header(p), "", main_table(p), "", comm_table(p), "",
                      f"smallest G on which the peak fits: {smallest}", "", *host_sets_the_step(p),
                      *world_one_lines(p.world_one), *notes])


def world_one_lines(w: WorldOne | None) -> list[str]:
    """Each setup's step at world 1 as steptime.py plans it from the calibrating run, with the run named."""
    if not w:
        return []
    steps = ", ".join(f"{setup} {s:.3f} s" for setup, s in sorted(w.step_s.items()))
    derived = sorted(set(w.step_s) - set(w.ran) - set(OFFLOADS))
    offloads = sorted(set(OFFLOADS) - set(w.ran))
    on_stage0 = [f"  {', '.join(derived)}: not run there; planned on its stage 0 and steptime.py's H200 constants"]
    kinds = sorted({"assumed" if w.host.assumed(s) else "measured" for s in offloads})
    on_stage3 = [f"  {', '.join(offloads)}: not run there; planned on its stage 3 and a host pass "
                 f"{' or '.join(kinds)}"]
    return [f"step at world 1 ({w.model}, micro batch {w.micro_batch}, checkpointing "
            f"{'on' if w.checkpoint else 'off'}, {w.host_cores} host cores; from {w.source}): {steps}",
            *(on_stage0 if derived else []), *(on_stage3 if offloads else []), ""]


def plot(p: Plan, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plan.py: matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, (memory_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for setup in p.inputs.stages:
        rows = [r for r in p.rows if r.setup == setup]
        gpus = [r.gpus for r in rows]
        name = p.label(setup)
        name = name if setup == "fsdp2" else f"ZeRO-{name}"
        memory_ax.plot(gpus, [gib(r.memory["peak"]) for r in rows], marker="o", label=name)
        speed_ax.plot(gpus, [r.tokens_per_s_per_gpu.overlapped for r in rows], marker="o")
    memory_ax.axhline(p.inputs.gpu_mem_gib, color="k", linestyle="--", label="GPU memory")
    memory_ax.set_ylabel("predicted peak per GPU (GiB)")
    speed_ax.set_ylabel("tokens/s per GPU (overlapped)")
    for ax in (memory_ax, speed_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
    memory_ax.legend()
    fig.tight_layout()
    fig.savefig(path)
