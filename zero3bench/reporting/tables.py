"""
The runs side by side: one row per figure (COMPARISON), the most that any rank holds of a per-rank figure;
and the lines that describe runs without judging them (offload, DeepCompile, FSDP2 against ZeRO-3).
"""
from dataclasses import dataclass
from typing import Callable, Optional

from zero3bench.formatting import fmt, format_table, relative_error, size
from zero3bench.rank_lines import other_bytes
from zero3bench.result import RankResult, line_value
from zero3bench.stages import ZERO3

from .bounds import SAME_COMPILED_OR_NOT
from .losses import loss_gaps
from .reading import (Results, Runs, failed, first, most, offloads, pairs, peer, plain, reference_rank,
                      speed_not_measured, status)
from .theory import predicted_host_peak

# The directions of a ratio, as words: what the second run's figure is when it is below the first's, and above.
SMALLER, FASTER, LOWER = ("less", "more"), ("slower", "faster"), ("lower", "higher")
# Below this share of the other run's figure, a figure is next to nothing, and a ratio against it means nothing.
NEAR_ZERO = 0.01


def estimator(results: Results) -> float | None:
    """DeepSpeed's estimate for the device; without GPUs, device and host are one memory, so both."""
    estimate = first(results).predicted.deepspeed
    if not estimate:
        return None
    # DeepSpeed estimates host memory per node, for all the node's ranks
    per_rank_host = estimate["host_per_node"] / first(results).ranks_per_node
    return estimate["device"] + (per_rank_host if first(results).mem_kind != "cuda" and offloads(results) else 0)


def comm(results: Results, figure: str, kind: str) -> float | None:
    """Rank 0's bytes of one kind of collective per step, or the best bus bandwidth of any rank: a rank's NCCL
    kernel also times its wait for the others, so the rank that waited least comes closest to the link's."""
    per_rank = [(getattr(r, figure) or {}).get(kind) for r in results]
    if figure == "busbw":
        return max(filter(None, per_rank), default=None)
    return per_rank[0] if per_rank else None


def gbps(value: float | None) -> float | None:
    return value / 1e9 if value else None


def gpu_only(value: float | None, results: Results) -> float | None:
    return value if first(results).mem_kind == "cuda" else None


def states_error(results: Results, measured: Callable[[RankResult], float | None],
                 predicted: Callable[[Results], float | None]) -> float | None:
    return relative_error(most(measured(r) for r in results), predicted(results))


@dataclass(frozen=True)
class Row:
    """One row of the comparison: its key (what --compare tracks and a test names; the label may change), its
    label, the figure of one run, that figure's format, the words of a ratio of two runs (None where a ratio
    means nothing), whether the row is left out when no run has the figure (offload only, GPUs only), and
    whether it is a speed, which CPU processes and rehearsals do not measure."""
    key: str
    label: str
    get: Callable
    spec: str
    words: Optional[tuple] = None
    optional: bool = False
    speed: bool = False


COMPARISON = [
    Row("ranks", "ranks", lambda rs: first(rs).world_size, "d"),
    Row("partitioned_tensors", "partitioned tensors", lambda rs: most(r.shards.partitioned_tensors for r in rs), "d"),
    Row("param_tensors", "param tensors", lambda rs: most(r.shards.param_tensors for r in rs), "d"),
    Row("local_params", "local params", lambda rs: most(r.shards.local_param_elems for r in rs), ",", SMALLER),
    Row("model_states", "model states", lambda rs: most(r.model_state_bytes for r in rs), "bytes", SMALLER),
    Row("model_states_predicted", "  predicted", lambda rs: most(r.predicted.states for r in rs), "bytes",
        SMALLER),
    Row("model_states_predicted_error", "  error", lambda rs: states_error(
        rs, lambda r: r.model_state_bytes, lambda rs: most(r.predicted.states for r in rs)), "+.1%"),
    Row("model_states_estimator", "  DeepSpeed estimator", estimator, "bytes", SMALLER),
    Row("model_states_estimator_error", "  error",
        lambda rs: states_error(rs, lambda r: r.model_state_bytes, estimator), "+.1%"),
    Row("host_states", "host model states", lambda rs: most(r.host_state_bytes for r in rs) or None, "bytes",
        optional=True),
    Row("host_states_paper", "  ZeRO paper", lambda rs: most(r.predicted.host_states for r in rs) or None, "bytes",
        optional=True),
    Row("host_states_error", "  error", lambda rs: states_error(
        rs, lambda r: r.host_state_bytes, lambda rs: most(r.predicted.host_states for r in rs)), "+.1%",
        optional=True),
    Row("other_tensors", "other tensors", other_bytes, "bytes"),
    Row("peak_memory", "peak memory", lambda rs: most(r.peaks.peak_mem_bytes for r in rs) or None, "bytes", SMALLER),
    Row("peak_memory_estimated", "  estimated", lambda rs: gpu_only(most(r.predicted.peak for r in rs), rs),
        "bytes", SMALLER, optional=True),
    Row("all_gather_bytes", "all-gather / step", lambda rs: comm(rs, "comm_bytes", "all_gather"), "bytes", SMALLER,
        optional=True),
    Row("reduce_scatter_bytes", "reduce-scatter / step", lambda rs: comm(rs, "comm_bytes", "reduce_scatter"), "bytes",
        SMALLER, optional=True),
    Row("all_reduce_bytes", "all-reduce / step", lambda rs: comm(rs, "comm_bytes", "all_reduce"), "bytes", SMALLER,
        optional=True),
    Row("comm_volume", "  volume, x params", lambda rs: first(rs).comm_volume, ".2f", SMALLER, optional=True),
    Row("comm_volume_paper", "  ZeRO paper",
        lambda rs: first(rs).paper_comm_volume if first(rs).comm_volume is not None else None, "d", optional=True),
    Row("busbw_all_gather", "busbw all-gather GB/s", lambda rs: gbps(comm(rs, "busbw", "all_gather")), ",.0f", LOWER,
        optional=True),
    Row("busbw_reduce_scatter", "busbw reduce-scatter GB/s", lambda rs: gbps(comm(rs, "busbw", "reduce_scatter")),
        ",.0f", LOWER, optional=True),
    Row("busbw_all_reduce", "busbw all-reduce GB/s", lambda rs: gbps(comm(rs, "busbw", "all_reduce")), ",.0f", LOWER,
        optional=True),
    Row("link_busbw", "  all-gather alone GB/s", lambda rs: gbps(first(rs).link_busbw_at(1 << 28)), ",.0f",
        optional=True),
    Row("nvlink", "  NVLink GB/s", lambda rs: gbps(first(rs).link_bytes_per_s), ",.0f", optional=True),
    Row("first_loss", "first loss", lambda rs: first(rs).first_loss, ".4f"),
    Row("last_loss", "last loss", lambda rs: (first(rs).losses or [None])[-1], ".4f"),
    # fp16's loss scaler skips a step on overflow
    Row("skipped_steps", "skipped steps",
        lambda rs: first(rs).skipped_steps if first(rs).run.dtype == "fp16" or first(rs).skipped_steps else None, "d",
        optional=True),
    Row("step_time_s", "step time s", lambda rs: first(rs).step_time_s, ".3f", FASTER[::-1], speed=True),
    Row("timed_from", "  timed from step", lambda rs: first(rs).timed_from if first(rs).run.deepcompile else None, "d",
        optional=True),
    Row("tokens_per_s", "tokens/s", lambda rs: first(rs).tokens_per_s, ",.0f", FASTER, speed=True),
    Row("mfu", "MFU", lambda rs: first(rs).mfu, ".1%", LOWER, speed=True),
    Row("hfu", "  HFU", lambda rs: first(rs).hfu, ".1%", LOWER, optional=True, speed=True),
]
ROWS = {row.key: row for row in COMPARISON}


def figure(key: str, results: Results) -> float | None:
    """One figure of a run, by its row's key."""
    return ROWS[key].get(results)


def ratio(before: float | None, after: float | None, words: tuple[str, str] | None) -> str:
    """The second figure against the first, in the words of its row: "4.00x less", "2.86x slower"; nothing where
    either is missing or next to nothing beside the other."""
    if words is None or not before or not after or min(before, after) < NEAR_ZERO * max(before, after):
        return ""
    if max(before, after) / min(before, after) < 1.005:
        return "same"
    return f"{max(before, after) / min(before, after):.2f}x {words[after > before]}"


def comparison_table(runs: Runs) -> str:
    """The runs side by side, per-rank figures taken from the rank that holds the most; with two runs, a last
    column gives the second against the first. Speeds are marked where they mean nothing."""
    names = list(runs)
    unmeasured = speed_not_measured(runs)
    both = len(names) == 2 and not any(failed(runs[name]) for name in names)  # no ratio against a run that stopped
    rows = [("", *names, f"{names[1]} against {names[0]}" if len(names) == 2 else "")]
    for row in COMPARISON:
        values = [row.get(runs[name]) for name in names]
        if row.optional and all(v is None for v in values):
            continue
        label = row.label + (" *" if row.speed and unmeasured else "")
        rows.append((label, *(fmt(v, row.spec) for v in values), ratio(*values, row.words) if both else ""))
    rows.append(("status", *(status(runs[name]) for name in names), ""))
    table = format_table(rows)
    return table + (f"\n* not a measure of speed: {unmeasured}" if unmeasured else "")


# -----------------------------------------------------------------------------
# lines that describe, and judge nothing


def stage3_runs(runs: Runs, peer_run: RankResult) -> Runs:
    """{name: results} of DeepSpeed's stage-3 runs without offload with the peer's settings (compiled or not),
    in reference_rank's order: the stage's own config first, then its variants (DeepCompile, ...)."""
    found = [(name, rs) for name, rs in runs.items() if rs and rs[0].run.stage == ZERO3 and plain(rs)
             and all(line_value(rs[0], key) == line_value(peer_run, key) for key in SAME_COMPILED_OR_NOT)]
    return dict(sorted(found, key=lambda item: reference_rank(item[1][0])))


def peer_lines(runs: Runs) -> list[str]:
    """Each stage-3 run against FSDP2 with the same settings: speed, peak memory, communication, losses."""
    lines = []
    for name, rs in runs.items():
        if not rs or not peer(rs):
            continue
        for name3, zero3 in (stage3_runs(runs, rs[0]) or {"stage3": None}).items():
            label = "stage 3" if name3 == "stage3" else name3
            lines.append(f"{label} against {name}: " + peer_line(zero3, label, rs, name))
    return lines


def peer_line(zero3: Results | None, label: str, rs: Results, name: str) -> str:
    if failed(rs) or not zero3 or failed(zero3):
        return f"{name} {status(rs)}, {label} {status(zero3) if zero3 else 'not run'}"
    a, b = zero3[0], rs[0]
    volume = (f", communication {a.comm_volume:.2f} against {b.comm_volume:.2f} x the parameters per step"
              if a.comm_volume and b.comm_volume else "")
    gaps = loss_gaps(a, b)
    losses = (f"the losses agree to {gaps.anywhere:.2%} at every step" if gaps.same else
              f"the losses DIFFER, by {gaps.step1:.3%} at step 1 and up to {gaps.anywhere:.2%}: the two do not train "
              "the same model")
    unmeasured = speed_not_measured({label: zero3, name: rs})
    speed = (f"speed not compared ({unmeasured})" if unmeasured else
             f"{ratio(b.tokens_per_s, a.tokens_per_s, FASTER)} in tokens/s" if a.tokens_per_s else "not timed")
    return (f"{speed}, peak memory {size(most(r.peaks.peak_mem_bytes for r in zero3))} against "
            f"{size(most(r.peaks.peak_mem_bytes for r in rs))}"
            f"{volume}; " + losses)


def compile_lines(runs: Runs) -> list[str]:
    """What DeepCompile cost, and what its figures leave out."""
    lines = []
    for name, rs in runs.items():
        if failed(rs) or not rs[0].run.deepcompile:  # a failed run's status is in the table
            continue
        timed_from = rs[0].timed_from
        took = " and ".join(f"{s.time_s:.0f} s at step {s.step}" for s in rs[0].steps if s.step in (1, timed_from - 1))
        lines.append(f"{name}: DeepCompile compiled, taking {took}; its speed is timed from step {timed_from} on; "
                     "its collectives run inside its compiled graph, where the communication count does not see them")
    return lines


def offload_memory(results: Results) -> str:
    """Where an offload run's memory went, per rank: the GPU's and the host's."""
    if results[0].mem_kind != "cuda":
        return "without GPUs, device and host are one memory"
    rss = most(r.peaks.host_peak_rss_bytes for r in results)  # logs from before it was recorded lack it
    predicted = predicted_host_peak(first(results))
    return (f"per rank, GPU model states {size(figure('model_states', results))}, GPU peak "
            f"{size(most(r.peaks.peak_mem_bytes for r in results))}; host (CPU) model states "
            f"{size(most(r.host_state_bytes for r in results))}, other host tensors "
            f"{size(other_bytes(results, host=True))}" + (f", host peak RSS {size(rss)}" if rss else "")
            + (f" (predicted {size(predicted)})" if rss and predicted else ""))


def offload_lines(runs: Runs) -> list[str]:
    """What each offload run costs against stage 3 without offload, at the same number of ranks."""
    lines, stage3 = [], {world: zero3 for world, (_, zero3) in pairs(runs).items()}
    for name, rs in runs.items():
        if not offloads(rs):
            continue
        if failed(rs):
            lines.append(f"offload {name}: {status(rs)}")
            continue
        zero3 = stage3.get(rs[0].world_size)
        cost = f"{rs[0].step_time_s / zero3[0].step_time_s:.2f}x the step time of stage 3" \
            if zero3 and not failed(zero3) else "no stage-3 run to compare"
        lines.append(f"offload {name}: {cost}; {offload_memory(rs)}")
    return lines
