"""
A step's time on G GPUs, for plan.py: when each engine's collectives run and how large each call is, a ring
collective's seconds at a bus bandwidth, and a step's time with its collectives serial or overlapped with its
compute. Pure arithmetic, as zero3bench/accounting/predict.py.
"""
from typing import Any

from zero3bench.accounting.predict import zero_setting
from zero3bench.accounting.traffic import BUS_FACTOR
from zero3bench.stages import shards_params

# When each engine's collectives run in a step, each of one copy of the 16-bit weights: in "forward" or
# "backward" they overlap that pass's compute; "after" they run alone, once backward is done. DeepSpeed at
# stage 0 all-reduces the gradients after backward; at stage 1 (ds_config_stage1.json leaves overlap_comm
# off) it reduce-scatters them after backward, at stage 2 during it; stages 1 and 2 all-gather the updated
# weights after the step; stage 3 gathers each block in forward and again in backward and reduce-scatters its
# gradients in backward: the ZeRO paper's 2 and 3 x the parameters (section 7). FSDP2 runs as stage 3.
COLLECTIVES = {0: [("all_reduce", "after")],
               1: [("reduce_scatter", "after"), ("all_gather", "after")],
               2: [("reduce_scatter", "backward"), ("all_gather", "after")],
               3: [("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")]}


def collectives(stage: int, engine: str, width: int, params: int, root: int) -> list[tuple[str, str, int]]:
    """One rank's collectives in a step, as (kind, phase, bytes) in nccl-tests' sizes: an all-gather's output,
    a reduce-scatter's input, an all-reduce's buffer. FSDP2 keeps its root module (root elements: embeddings,
    final norm) gathered from forward into backward: it gathered 3.84 of 4 bytes per parameter at 1.3b on 2
    H200s, DeepSpeed's stage 3 4.08 (benchmarks/logs/h200x2/13-fsdp2)."""
    kept = root if engine == "fsdp2" else 0
    return [(kind, phase, width * (params - kept if (kind, phase) == ("all_gather", "backward") else params))
            for kind, phase in COLLECTIVES[stage]]


def message_bytes(kind: str, stage: int, engine: str, width: int, block: float, zero: dict[str, Any],
                  params: float) -> float:
    """The bytes of one call of a collective, which set the bus bandwidth it gets (a link's curve rises with
    them): stage 3 (each block a leaf module) and FSDP2 gather one block at a time, and FSDP2 reduce-scatters one
    block's gradients; stages 1 and 2 gather each param group's updated weights in one call (utils.py,
    all_gather_into_tensor_dp_groups, whatever allgather_bucket_size says): the matrices' group, nearly the whole
    model, sets the size, and the vectors' call adds a ring latency that is not counted; DeepSpeed reduces its
    gradients in buckets of reduce_bucket_size elements."""
    if engine == "fsdp2" or kind == "all_gather" and shards_params(stage):
        return width * block
    if kind == "all_gather":
        return width * params
    return width * zero_setting(zero, "reduce_bucket_size")


def host_copies(width: int, shard: float) -> list[tuple[str, float]]:
    """With the optimizer on the host (ZeRO-Offload), each rank copies its gradient partition out during
    backward and its updated 16-bit weights back after the step: (phase, bytes) over PCIe."""
    return [("backward", width * shard), ("after", width * shard)]


def ring_seconds(kind: str, nbytes: float, ranks: int, busbw: float) -> float:
    """A collective's time: the bytes each rank must send of it (BUS_FACTOR) over the bus bandwidth of the
    slowest link it crosses, nccl-tests' busbw, in bytes per second."""
    return nbytes * BUS_FACTOR[kind](ranks) / busbw


# NCCL's own cost model of a ring call with its Simple protocol, which it picks for large messages, in seconds
# (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, at b647562): a base latency, and one per step of the ring,
# an NVLink hop's within a node and the network's between nodes. NCCL rings all-gathers and reduce-scatters.
RING_BASE_S, NVLINK_STEP_S, NET_STEP_S = 8.4e-6, 3.4e-6, 14.0e-6


def ring_latency(kind: str, ranks: int, ranks_per_node: int) -> float:
    """One call's latency, as NCCL models it: G - 1 steps for an all-gather or a reduce-scatter, of which
    nodes - 1 cross the network; twice G - 1 for an all-reduce, 2·nodes of them across."""
    if ranks <= 1:
        return 0.0
    nodes = -(-ranks // ranks_per_node)
    steps, across = (2 * (ranks - 1), 2 * nodes if nodes > 1 else 0) if kind == "all_reduce" else (ranks - 1, nodes - 1)
    return RING_BASE_S + (steps - across) * NVLINK_STEP_S + across * NET_STEP_S


def pass_flops(flops: float, checkpoint: bool) -> dict[str, float]:
    """A step's FLOPs by pass: forward a third and backward two thirds of 6N (2N + 4N), and with checkpointing
    the forward once more, recomputed during backward: 4/3 of flops in all."""
    return {"forward": flops / 3, "backward": 2 * flops / 3 + (flops / 3 if checkpoint else 0)}


def hfu_per_mfu(checkpoint: bool) -> float:
    """The hardware's FLOPs per FLOP of the model, as pass_flops counts them: 4/3 with checkpointing, whose
    recomputed forward PaLM's MFU does not count and the hardware FLOPs utilization (HFU) does; else 1."""
    return sum(pass_flops(1.0, checkpoint).values())


def step_seconds(compute: dict[str, float], comm: list[tuple[str, float]], layers: int | None) -> dict[str, float]:
    """A step's time, serial (compute, then every collective) and overlapped: each pass takes the longer of its
    compute and its collectives, but one layer's share of those, which nothing hides (the first gather is
    waited for, as is the last reduce-scatter), adds on; collectives after backward add whole. compute: seconds
    by pass; comm: (phase, seconds); layers: None where unknown, which hides all of a pass's collectives."""
    in_pass = {p: sum(s for phase, s in comm if phase == p) for p in compute}
    after = sum(s for phase, s in comm if phase == "after")
    alone = 1 / layers if layers else 0
    overlapped = sum(max(compute[p], (1 - alone) * in_pass[p]) + alone * in_pass[p] for p in compute) + after
    return {"serial": sum(compute.values()) + sum(s for _, s in comm), "overlapped": overlapped}


def param_fetches(width: int, shard: float) -> list[tuple[str, float]]:
    """With the parameters on the host too (ZeRO-Infinity's offload_param), each rank copies its 16-bit
    partition in for forward and again for backward: (phase, bytes) over PCIe."""
    return [("forward", width * shard), ("backward", width * shard)]


def flops_per_token(params: int, layers: int, d_model: int, seq: int) -> int:
    """Training FLOPs per token: 6 per parameter (forward and backward) and 12·L·d·T for attention's
    scores and values (PaLM, appendix B), without checkpointing's recomputation."""
    return 6 * params + 12 * layers * d_model * seq
