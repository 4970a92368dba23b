"""
Where one rank's measured memory departs from theory by more than EXPLAIN_BEYOND, in words.
"""
from zero3bench.accounting.predict import zero_setting
from zero3bench.formatting import size
from zero3bench.result import RankResult
from zero3bench.stages import shards_params

EXPLAIN_BEYOND = 0.10

# why a kind of model state can differ from the paper: (kind, sign of the difference, the stages it applies to,
# as a test of what the stage partitions) -> cause
CAUSES = {
    ("params", 1, shards_params): "partitioned parameters still gathered after backward (gathered layers)",
}


def estimator_gap(r: RankResult) -> list[str]:
    """Why DeepSpeed's estimate of the device's model states departs from the measurement: what its formulas
    add. Without GPUs, offload's device and host are one memory: no gap."""
    estimate = r.predicted.deepspeed
    if not estimate or (r.mem_kind != "cuda" and any(r.run.offload.values())):
        return []
    if abs(r.model_state_bytes / estimate["device"] - 1) <= EXPLAIN_BEYOND:
        return []
    adds = []
    if not r.run.offload["optimizer"]:
        paper = 16 if shards_params(r.run.stage) else 14
        why = "" if shards_params(r.run.stage) else (
            ": fp32 gradients, by its own comment, which exist here only in the optimizer step (the peak estimate "
            "has them)")
        adds.append(f"{18 - paper} bytes per partition element (18 where the paper counts {paper}){why}")
    if shards_params(r.run.stage):
        adds.append(f"4 bytes per element of the largest layer ({r.shards.largest_param_elems:,} elements)")
    return [f"DeepSpeed's estimator: {size(estimate['device'])} against {size(r.model_state_bytes)} "
            f"measured: " + ("it adds " + " and ".join(adds) if adds else "no known cause")]


def state_gaps(r: RankResult, held: dict[str, float]) -> list[str]:
    """The kinds of model state that make a difference of more than EXPLAIN_BEYOND from the paper."""
    predicted = r.predicted.breakdown
    total = sum(predicted.values())
    if abs(sum(held.values()) / total - 1) <= EXPLAIN_BEYOND:
        return []
    found = []
    for kind in predicted:
        diff = held[kind] - predicted[kind]
        if abs(diff) > 0.02 * total:
            cause = next((c for (k, sign, applies), c in CAUSES.items()
                          if k == kind and sign * diff > 0 and applies(r.run.stage)), "no known cause")
            found.append(f"model states: {kind} {'+' if diff > 0 else '-'}{size(abs(diff))}: {cause}")
    return found


def prefetch_cause(r: RankResult) -> str:
    """A cause of a stage-3 peak far from its estimate on more than one rank without checkpointing: DeepSpeed's
    prefetcher gathers blocks ahead up to stage3_max_live_parameters elements, which the estimate counts in
    backward with checkpointing only (moments.prefetch_bytes; benchmarks/logs/h200/29-live)."""
    if not r.zero_config:  # a record from before it was kept: what capped its prefetch is unknown
        return ""
    live = zero_setting(r.zero_config, "stage3_max_live_parameters")
    bucket = zero_setting(r.zero_config, "stage3_prefetch_bucket_size")
    if not (shards_params(r.run.stage) and r.run.engine == "deepspeed" and r.world_size > 1 and not r.run.checkpoint
            and live > 2 * bucket):
        return ""
    return f"; stage3_max_live_parameters ({live:.0e}) lets the prefetch gather up to {live:,.0f} elements at once"


def peak_gap(r: RankResult) -> list[str]:
    """Where the peak departs from its prediction; none on CPU ranks, or for a model whose peak is not predicted (its
    record says so: rank_lines)."""
    measured, predicted = r.peaks.peak_mem_bytes, r.predicted.peak
    if r.mem_kind != "cuda" or not measured or not predicted or abs(measured / predicted - 1) <= EXPLAIN_BEYOND:
        return []
    return [f"peak: {size(r.peaks.peak_mem_bytes)} measured against {size(r.predicted.peak)} estimated from "
            f"model states, buffers and gathered weights, and the most of backward's start (activations "
            f"{size(r.predicted.activations)}), its end, the reduction after it and the step (what it makes "
            f"{size(r.predicted.transient)}){prefetch_cause(r)}"]


def differences(r: RankResult, held: dict[str, float]) -> list[str]:
    """Where the measured memory departs from theory by more than EXPLAIN_BEYOND, in words. held: this rank's
    model states by kind, on the device and in host memory together."""
    return estimator_gap(r) + state_gaps(r, held) + peak_gap(r)
