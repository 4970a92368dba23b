"""
Communication in the units of its two references, without torch: the ZeRO paper's volume per step (in
parameters), and nccl-tests' bus bandwidth, that accounting.comms's counts and timings are read in.
"""
import math
from collections.abc import Mapping

from zero3bench.parts import Collectives
from zero3bench.stages import shards_params


def comm_volume(stage: int, world: int) -> int:
    """The ZeRO paper's communication per step and rank (section 7), in units of the parameters: an all-reduce
    of the gradients (a reduce-scatter and an all-gather) moves 2 at stages 0 to 2; stage 3 all-gathers the
    parameters in forward and again in backward, and reduce-scatters the gradients: 3. FSDP2 does as stage 3."""
    return 0 if world == 1 else 3 if shards_params(stage) else 2


def volume(counts: Mapping[str, Collectives], params: int) -> float:
    """Measured communication in the paper's units: elements all-gathered and reduce-scattered, and twice
    those all-reduced, over the parameters."""
    return (counts["all_gather"].elems + counts["reduce_scatter"].elems + 2 * counts["all_reduce"].elems) / params


BUS_FACTOR = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_reduce": lambda n: 2 * (n - 1) / n}


def bus_bandwidth(kind: str, nbytes: float, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth in bytes per second: the algorithm's (size over time) times what each rank
    must send of it, so that it is comparable with the link's bandwidth whatever the number of ranks."""
    return nbytes / seconds * BUS_FACTOR[kind](ranks)


def read_curve(curve: Mapping[int, float], x: float) -> float:
    """A curve {x: y} read at x: log-linear between its points, its nearest end beyond them."""
    xs = sorted(curve)
    if x <= xs[0] or x >= xs[-1]:
        return curve[xs[0] if x <= xs[0] else xs[-1]]
    hi = next(i for i, v in enumerate(xs) if v >= x)
    lo = hi - 1
    w = (math.log(x) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
    return curve[xs[lo]] + w * (curve[xs[hi]] - curve[xs[lo]])
