"""
A rank's record completed once it has run: its peaks, and where it counted its model states, what theory predicts
of them (accounting.memory.rank_memory, from this rank's counts), its shares of each kind against its stage's
promise, and where the two part, in words (explain.differences).
"""
from typing import Any

from zero3bench import explain, parts
from zero3bench.accounting import predict
from zero3bench.accounting.memory import Counts, Seat, offload_of, rank_memory
from zero3bench.accounting.shapes import ModelShape
from zero3bench.result import RankResult, most

PARTITION_TOLERANCE = 0.10  # a rank's share of a kind of model state may differ from its promise by this


def held_bytes(r: RankResult) -> dict[str, int]:
    """This rank's model states by kind, on the device and in host memory together."""
    device, host = r.model_state_breakdown, r.host_state_breakdown
    return {kind: device.kind(kind) + (host.kind(kind) if host else 0) for kind in predict.KINDS}


def seat(r: RankResult) -> Seat:
    """Where the rank ran, as its record says."""
    return Seat(r.world_size, r.rank, on_gpu=r.mem_kind == "cuda", rehearsed=bool(r.rehearsal),
                deepspeed_adam=r.optimizer == predict.DEEPSPEED_ADAM)


def partition(r: RankResult) -> float:
    """This rank's partition of the model, as its stage splits it (predict.shard_elems) from what it counted."""
    return predict.shard_elems(r.run.stage, r.shards.params_total, r.shards.local_param_elems, r.world_size)


def persistent(r: RankResult) -> int:
    """The elements that this rank's stage 3 keeps whole besides its shards (predict.persistent_besides)."""
    return predict.persistent_besides(r.shards.persistent_elems or 0, r.world_size, offload_of(r.run))


def counted(r: RankResult, shape: ModelShape) -> Counts:
    """What the rank counted of the model's parameters: the shape's blocks, its own partition and largest tensor."""
    c = r.shards
    return Counts(c.params_total, c.largest_param_elems, shape.block_params, shape.root_params, partition(r),
                  persistent(r))


def add_predictions(r: RankResult, shape: ModelShape, zero: dict[str, Any]) -> None:
    """The paper's model states by kind and by where they live, DeepSpeed's estimate, the activations, the
    optimizer step's fp32 gradients and the peak, against which the measurement is judged; zero is the
    zero_optimization section as DeepSpeed read it."""
    run, c = r.run, r.shards
    m = rank_memory(run, shape, counted(r, shape), zero, seat(r))
    estimate = None
    if run.engine == "deepspeed":
        estimate = predict.deepspeed_estimate(run.stage, c.params_total, c.largest_param_elems, r.ranks_per_node,
                                              r.world_size // r.ranks_per_node, run.offload)
    r.predicted = parts.Predicted(breakdown=m.breakdown, states=m.states, host_states=m.host_states, deepspeed=estimate,
                                  activations=m.activations, transient=m.transient, peak=m.peak, moments=m.moments())


def add_shares(r: RankResult) -> None:
    """What this rank holds of each kind of model state against what its stage promises: the paper's shares, where
    the prediction also holds what DeepSpeed keeps beyond them."""
    run, c = r.run, r.shards
    whole = predict.model_states(run.stage, run.dtype, c.params_total, c.params_total, engine=run.engine)
    paper = predict.model_states(run.stage, run.dtype, c.params_total, partition(r), persistent(r), run.engine)
    r.held_fraction = predict.shares(held_bytes(r), whole)
    r.promised_fraction = predict.shares(paper, whole)
    straddling = 2 * c.largest_param_elems / c.params_total
    r.partition_check_ok = predict.holds_as_promised(r.held_fraction, r.promised_fraction, r.run.stage, straddling,
                                                     PARTITION_TOLERANCE)


def finish(r: RankResult, shape: ModelShape, memory_now: parts.MemorySnapshot) -> None:
    """Complete a rank's result once it has run: its peaks, and where it counted its model states, the
    predictions and shares they are judged against, at the zero_optimization section as DeepSpeed read it (its own
    defaults where no DeepSpeed engine read one: FSDP2's, as tests/test_accounting.py predicts the committed records);
    memory_now the memory snapshot at the end."""
    taken = [memory_now, *([r.memory_at_start] if r.memory_at_start else [])]
    snapshots = [*taken, *(s.memory for s in r.steps if s.memory)]
    r.peaks = parts.MemorySnapshot(peak_mem_bytes=most(s.peak_mem_bytes for s in snapshots),
                                   peak_reserved_bytes=most(s.peak_reserved_bytes for s in snapshots),
                                   host_peak_rss_bytes=most(s.host_peak_rss_bytes for s in snapshots),
                                   device_total_bytes=memory_now.device_total_bytes)
    if r.model_state_breakdown:
        add_predictions(r, shape, r.zero_config or {})
        add_shares(r)
        r.differences = explain.differences(r, held_bytes(r))
