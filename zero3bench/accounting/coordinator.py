"""
DeepSpeed's stage-3 parameter coordinator (partitioned_param_coordinator.py) as arithmetic: which tensors it holds
fetched, and their elements, as a step's modules fetch and release them. Pure arithmetic, as predict.py; checked
row by row against DeepSpeed 0.19.8's own coordinator (benchmarks/prefetch_probe.py, benchmarks/logs/cpu/prefetch).
"""
import collections
import math
from typing import Any

from zero3bench.accounting.predict import zero_setting
from zero3bench.accounting.shapes import ModelShape

Module = list[tuple[str, int]]  # the tensors that a module's fetch takes: a name and its elements, each


def fetch_order(shape: ModelShape, zero: dict[str, Any], checkpoint: bool) -> tuple[list[Module], list[Module]]:
    """The modules of model.py's GPT in the order that stage 3 fetches them, in forward (the root, which has no
    weights of its own; the token embedding; the learned positions; each block, a leaf; the final norm; the output
    layer, which is the embedding where tied) and in backward (the root, then the others in reverse, each block
    twice with checkpointing: its backward, then its recomputed forward). A tensor of no more than
    stage3_param_persistence_threshold elements persists whole and is never fetched; a block's vectors follow its
    matrices (model.py interleaves them, but at the configs' 1e4 they persist, 2.7b's MLP bias apart). A Hugging Face
    model's wrappers without weights of their own (its inner model, the rotary embedding) fetch too: not counted."""
    threshold = zero_setting(zero, "stage3_param_persistence_threshold")

    def module(*tensors: tuple[str, int]) -> Module:
        return [(name, n) for name, n in tensors if n > threshold]
    embedding = module(("embedding", shape.embedding))
    output = embedding if shape.tied else module(("output", shape.embedding))
    positions = [module(("positions", shape.context * shape.d_model))] if shape.positions == "learned" else []
    norm = module(*((f"norm.{k}", n) for k, n in enumerate(shape.norm)))
    tensors = [*shape.block_tensors[0], *shape.block_tensors[1]]
    blocks = [module(*((f"{i}.{k}", n) for k, n in enumerate(tensors))) for i in range(shape.layers)]
    backward = [block for block in reversed(blocks) for _ in range(1 + checkpoint)]
    return [[], embedding, *positions, *blocks, norm, output], [[], output, norm, *backward, *positions, embedding]


class Coordinator:
    """The coordinator in a step after the one that recorded the fetch order: the tensors fetched (gathered, or on
    their way) and their elements, at each fetch and release."""

    def __init__(self, order: list[Module], zero: dict[str, Any]) -> None:
        self.order, self.sizes = order, {name: n for module in order for name, n in module}
        self.live, self.bucket, self.reuse = (zero_setting(zero, key) for key in (
            "stage3_max_live_parameters", "stage3_prefetch_bucket_size", "stage3_max_reuse_distance"))
        self.queue = collections.deque((name, step) for step, module in enumerate(order) for name, _ in module)
        self.passed: dict[str, float] = collections.defaultdict(lambda: -math.inf)  # the latest use queued past
        self.fetched: set[str] = set()
        self.elements, self.step = 0, 0

    def take(self, names: list[str]) -> None:
        new = [name for name in names if name not in self.fetched]
        self.fetched.update(new)
        self.elements += sum(self.sizes[name] for name in new)

    def fetch(self) -> None:
        """The next module: its tensors, its own entries off the queue, then a prefetch, whole tensors off the queue
        while it has fewer new elements than stage3_prefetch_bucket_size and stage3_max_live_parameters leaves room."""
        names = [name for name, _ in self.order[self.step]]
        self.take(names)
        for _ in [name for name in names if self.passed[name] < self.step]:  # the queue's head is these entries
            name, used = self.queue.popleft()
            self.passed[name] = used
        prefetch, taken, room = [], 0, min(self.live - self.elements, self.bucket)
        while self.queue and taken < room:
            name, used = self.queue.popleft()
            self.passed[name] = max(self.passed[name], used)
            if name not in self.fetched and name not in prefetch:
                prefetch.append(name)
                taken += self.sizes[name]
        self.take(prefetch)
        self.step += 1

    def release(self, step: int) -> None:
        """The module fetched at step, computed: its tensors, but those the queue has passed for a later use and
        those that the modules within stage3_max_reuse_distance elements ahead use again."""
        kept = {name for name, _ in self.order[step] if self.passed[name] > self.step}
        ahead = 0
        for module in self.order[self.step:]:
            if ahead >= self.reuse:
                break
            kept.update(name for name, _ in module)
            ahead += sum(n for _, n in module)
        for name, n in self.order[step]:
            if name in self.fetched and name not in kept:
                self.fetched.discard(name)
                self.elements -= n


def fetched_until_backward(shape: ModelShape, zero: dict[str, Any], checkpoint: bool) -> list[int]:
    """The elements fetched after each fetch and release of forward, then after the root's backward fetch, which
    comes as the loss's backward starts: the rows that benchmarks/prefetch_probe.py reads off DeepSpeed's."""
    forward, backward = fetch_order(shape, zero, checkpoint)
    coordinator, rows = Coordinator(forward + backward, zero), []
    coordinator.fetch()  # the root, released once forward is done
    rows.append(coordinator.elements)
    for step in range(1, len(forward)):
        coordinator.fetch()
        rows.append(coordinator.elements)
        coordinator.release(step)
        rows.append(coordinator.elements)
    coordinator.release(0)
    rows.append(coordinator.elements)
    coordinator.fetch()
    return [*rows, coordinator.elements]


def fetched_at_backward_start(shape: ModelShape, zero: dict[str, Any], checkpoint: bool) -> int:
    """The elements fetched when the loss's backward runs (fetched_until_backward). Forward's last fetches prefetch
    into backward's order, and the blocks that forward computed last are kept for their backward, so at the offload
    configs' settings (a prefetch of one block, a cap of 1e9) the tied embedding and 5 blocks are fetched, where
    forward holds 3 blocks at most."""
    return fetched_until_backward(shape, zero, checkpoint)[-1]
