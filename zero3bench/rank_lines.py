"""One rank's result in words: the lines its log shows as it trains (step_line) and once it has run (human_lines),
above its RESULT line (emit), and the table of a run's ranks."""
import sys

from zero3bench import parts
from zero3bench.accounting import memory, predict
from zero3bench.formatting import fmt, format_table, gib, pct, relative_error, size
from zero3bench.result import RankResult, result_line, shape_of


def step_line(r: RankResult, s: parts.Step) -> str:
    """One step as the terminal shows it as it runs; once one is skipped, how many of --steps were applied."""
    tflops = r.tflops_at(s.time_s)
    skipped = ("  SKIPPED: overflow, weights not updated" if not s.applied else
               f"  applied {r.applied_steps} of {r.run.steps_planned}" if r.skipped_steps else "")
    scale = f"  loss scale {s.loss_scale:g}{skipped}" if s.loss_scale is not None else skipped
    hfu = r.hfu_at(s.time_s)
    return (f"step {s.step}/{r.run.steps_planned}  loss {s.loss:.4f}  lr {s.lr:.2e}  time {s.time_s:.3f}s  "
            f"mem {gib(s.memory.peak_mem_bytes):.2f} GiB  tok/s {r.tokens_per_step() / s.time_s:,.0f}  "
            f"mfu {pct(tflops / r.peak_tflops if tflops and r.peak_tflops else None)}"
            f"{f'  hfu {pct(hfu)}' if hfu else ''}{scale}")


def kinds_text(census: parts.Census) -> str:
    return ", ".join(f"{kind} {size(census.kind(kind))}" for kind in predict.KINDS)


def partition_lines(tag: str, r: RankResult) -> list[str]:
    c = r.shards
    return [f"{tag} - total param tensors: {c.param_tensors}, sharded param tensors: {c.partitioned_tensors}, "
            f"persistent: {c.persistent_tensors}, local elements: {c.local_param_elems:,} of "
            f"{c.params_total:,}, shard sizes: {'ok' if c.shard_check_ok else 'WRONG'}"]


def memory_lines(tag: str, r: RankResult) -> list[str]:
    lines = [f"{tag} model states: {size(r.model_state_bytes)} ({kinds_text(r.model_state_breakdown)}) vs ZeRO "
             f"prediction {size(r.predicted.states)} "
             f"({fmt(relative_error(r.model_state_bytes, r.predicted.states), '+.1%')}); other tensors "
             f"{size(r.model_state_breakdown.other)}; partitioned parameters still gathered after backward: "
             f"{r.gathered_tensors}"]
    if r.host_state_breakdown:
        lines.append(f"{tag} host (CPU) model states: {size(r.host_state_bytes)} "
                     f"({kinds_text(r.host_state_breakdown)}) vs prediction {size(r.predicted.host_states)}; "
                     f"other host tensors {size(r.host_state_breakdown.other)}")
    held, promised = r.held_fraction, r.promised_fraction
    lines.append(f"{tag} holds of the whole model's states: " + ", ".join(
        f"{kind} {held[kind]:.1%} (promised {promised[kind]:.1%})" for kind in held) +
        f": {'as' if r.partition_check_ok else 'NOT as'} stage {r.run.stage} promises")
    estimate = r.predicted.deepspeed
    if estimate:
        lines.append(f"{tag} DeepSpeed's estimator: {size(estimate['device'])} per device, "
                     f"{size(estimate['host_per_node'])} per node")
    if r.predicted.activations is None:  # what the model keeps for backward was not counted at the run's settings
        missing = memory.missing(shape_of(r), r.run.dtype, r.run.seq, r.mem_kind == "cuda")
        lines.append(f"{tag} estimated: the optimizer step's fp32 gradients {size(r.predicted.transient)}; this "
                     f"model's activations and peak are not predicted: {missing}")
    else:
        peak = f"; the peak at {size(r.predicted.peak)}" if r.mem_kind == "cuda" else ""
        lines.append(f"{tag} estimated: activations {size(r.predicted.activations)}, the optimizer step's fp32 "
                     f"gradients {size(r.predicted.transient)}{peak}")
    return lines + [f"{tag} difference: {d}" for d in r.differences]


def human_lines(r: RankResult) -> list[str]:
    """What one rank holds, in words; a rank that failed early has fewer figures."""
    tag = f"[Stage {r.run.stage}] Rank {r.rank}"
    lines = partition_lines(tag, r) if r.shards.param_tensors is not None else []
    lines += memory_lines(tag, r) if r.model_state_bytes is not None else []
    if r.rank == 0 and r.losses:
        lines.append(f"[Stage {r.run.stage}] first-step loss: {r.first_loss:.4f}; losses: "
                     + ", ".join(f"{x:.4f}" for x in r.losses))
    if r.mem_kind == "cuda":
        extra = (f"peak allocated; reserved {gib(r.peaks.peak_reserved_bytes or 0):.2f}, after init "
                 f"{gib(r.mem_after_init_bytes or 0):.2f}, device "
                 f"{gib(r.peaks.device_total_bytes or 0):.1f} GiB")
    else:
        extra = "peak RSS of the process"
    lines.append(f"{tag} peak memory: {gib(r.peaks.peak_mem_bytes):.2f} GiB ({extra})")
    if r.oom:
        lines.append(f"{tag} OUT OF MEMORY: {r.error}")
    elif r.error:
        lines.append(f"{tag} FAILED: {r.error}")
    if r.nonfinite_loss:
        lines.append(f"{tag} WARNING: the loss is not finite: {r.losses}")
    if r.diverged:
        lines.append(f"{tag} DIVERGED: {r.diverged}")
    if r.interrupted_by:
        lines.append(f"{tag} INTERRUPTED by {r.interrupted_by} after {len(r.steps)} step(s)")
    return lines


def other_bytes(results: list[RankResult], host: bool = False) -> int | None:
    """The most any rank holds in tensors that are not model states, on the device or (host) in host memory."""
    censuses = (r.host_state_breakdown if host else r.model_state_breakdown for r in results)
    return max((census.other for census in censuses if census), default=None)


def rank_table(results: list[RankResult]) -> str:
    """One row per rank of one run: what it partitioned and what it holds."""
    rows: list[tuple[object, ...]] = [("rank", "partitioned/total", "local elems", "model states", "predicted", "diff",
                                       "other tensors", "peak", "status")]
    for r in results:
        measured, predicted = r.model_state_bytes, r.predicted.states
        rows.append((r.rank, f"{fmt(r.shards.partitioned_tensors, 'd')}/{fmt(r.shards.param_tensors, 'd')}",
                     fmt(r.shards.local_param_elems, ","), fmt(measured or None, "bytes"),
                     fmt(predicted or None, "bytes"), fmt(relative_error(measured, predicted), "+.1%"),
                     fmt(other_bytes([r]), "bytes"), fmt(r.peaks.peak_mem_bytes or None, "bytes"),
                     "OOM" if r.oom else "error" if r.error else "ok"))
    return format_table(rows)


def emit(results: list[RankResult]) -> None:
    """The ranks' human lines and RESULT lines, in one write so that ranks sharing a log don't interleave."""
    lines = [line for r in results for line in (*human_lines(r), result_line(r))]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
