"""
The moments that DeepSpeed's own code adds above what a rank holds: stage 3's reduction of a full bucket, the prefetch
that runs ahead of backward, the weights gathered through the loss's backward, and the rehearsal's re-gather after
the step of stages 1 and 2; and, below them, DeepSpeed's stage-3 parameter coordinator
(partitioned_param_coordinator.py) as arithmetic: which tensors it holds fetched, and their elements, as a step's
modules fetch and release them, checked row by row against DeepSpeed 0.19.8's own coordinator
(benchmarks/prefetch_probe.py, benchmarks/logs/cpu/prefetch).
Pure arithmetic, as predict.py; memory.MemoryTerms' peak takes the most of the moments.
"""
import collections
import math
from typing import Any

from zero3bench.accounting.predict import zero_setting
from zero3bench.accounting.shapes import ModelShape
from zero3bench.stages import shards_params, splits_one_buffer

# The blocks that stage 3 gathers ahead of backward at most, with checkpointing, by the share of a block that one
# prefetch gathers: (per block of the model, besides), the root's weights also. Read off DeepSpeed 0.19.8's own
# coordinator on 2 CPU ranks (benchmarks/prefetch_probe.py, benchmarks/logs/cpu/prefetch), on models shaped as
# 1.3b and 2.7b, with 12 to 48 blocks, roots of 1.7 to 4 blocks, and every bucket and cap scaled to their block.
# Keyed by twelfths of a block. Not modelled: stage3_max_reuse_distance above 0 (DeepSpeed's default 1e9; the
# project's configs set 0), not probed, and backward without checkpointing, which gathers ahead too.
# The third: the blocks gathered ahead as backward starts, besides the root's weights (inputs_left).
AHEAD = {8: (1 / 4, 3, 3), 12: (1 / 2, 4, 7)}


def reduction_copies(width: int, world: int, zero: dict[str, Any], params: int) -> float:
    """Stage 3's reduction of a full gradient bucket (stage3.py, __avg_scatter_grads): its flat copy of
    reduce_bucket_size elements (the model's, where fewer) and this rank's part."""
    return width * min(zero_setting(zero, "reduce_bucket_size"), params) * (1 + 1 / world)


def scatter_bytes(stage: int, engine: str, width: int, world: int, zero: dict[str, Any], params: int,
                  blocks: float, held_output_grad: float) -> float:
    """Stage 3's reduction of its first full gradient bucket in backward (reduction_copies), after the output
    layer's backward: the blocks' activations not yet run then (blocks: all of them), and the tied embedding's
    whole gradient (held_output_grad: its elements, held_output_grad_elems; none where the output layer is not
    tied), which the output layer made and which is reduced only after the embedding's own."""
    if not (shards_params(stage) and engine == "deepspeed" and world > 1):
        return 0
    bucket = min(zero_setting(zero, "reduce_bucket_size"), params)
    return reduction_copies(width, world, zero, params) + blocks * (1 - bucket / params) + width * held_output_grad


def taken_by_prefetch(limit: float, tensors: list[int]) -> int:
    """The elements of tensors, in order, that one prefetch gathers: DeepSpeed takes whole tensors while it has fewer
    than limit elements (partitioned_param_coordinator.py, fetch_sub_module)."""
    taken = 0
    for elements in tensors:
        if taken >= limit:
            break
        taken += elements
    return taken


def prefetched_twelfths(prefetch: float, matrices: list[int]) -> float:
    """The twelfths of a block's matrices (the block as stage 3 partitions it, in the order it prefetches; model.py's
    qkv, its projection, fc and mlp.proj are 3, 1, 4 and 4 twelfths) that one prefetch of stage3_prefetch_bucket_size
    gathers (taken_by_prefetch); more than a block, inf. The norms and biases persist at 1.3b's 1e4 threshold; where
    some do not, as at 2.7b, the probe with a threshold of 0 stayed within 1.5%."""
    taken = taken_by_prefetch(prefetch, matrices)
    return 12 * taken / sum(matrices) if taken >= prefetch else math.inf


def gathered_ahead(layers: int, block: float, root: float, params: float, live: float, twelfths: float) -> float:
    """The most elements that stage 3 holds gathered in backward with checkpointing; block: the elements of a
    block that it partitions; twelfths: of a block, that one prefetch gathers (prefetched_twelfths). Recomputation
    fetches each block twice (for its recomputed forward, then its backward) while backward frees it once, and
    each fetch prefetches: where a prefetch gathers more than half a block, the blocks ahead grow at each block,
    as far as stage3_max_live_parameters lets them (and the block that backward asks for besides), and no
    further than AHEAD says; where it gathers more than a block, up to the whole model. Where it gathers a third
    or less, the block, one prefetch and the root's weights. A prefetch takes no more than the cap less what is
    gathered, so where one block reaches the cap, none while a block is held: the block alone (Mistral 7B's 218M
    elements at 1e8, benchmarks/logs/cpu/backward-probe)."""
    if block >= live:
        return min(block, params)
    if twelfths > 12:
        end = params
    elif twelfths in AHEAD:
        per_block, besides, _ = AHEAD[twelfths]
        end = (per_block * layers + besides) * block + root
    else:
        end = (1 + twelfths / 12) * block + root
    return min(live + block, end, params)


def inputs_left(twelfths: float, ahead: float, shape: ModelShape) -> float:
    """The share of the blocks' checkpointed inputs still held when stage 3 holds the most gathered ahead: backward
    frees a block's input with its gradients, while the blocks ahead, besides the one that backward asks for, grow by
    2 x twelfths / 12 - 1 of a block at each block from AHEAD's third (where backward starts), so that the most comes
    that many blocks in (prefetch_probe, as this says: at 1.3b's share, 8 of 24 blocks in; at 2.7b's and a cap of 1e9,
    21 of 32).
    All of them where the blocks ahead do not grow."""
    if twelfths not in AHEAD:
        return 1.0
    block = sum(shape.block_tensors[0])
    into = ((ahead - shape.root_params) / block - 1 - AHEAD[twelfths][2]) / (2 * twelfths / 12 - 1)
    return min(1.0, max(0.0, 1 - into / shape.layers))


def prefetch_reach(zero: dict[str, Any], shape: ModelShape, params: float) -> tuple[float, float]:
    """The twelfths of a block that one prefetch gathers, and the most elements gathered ahead of backward, at a
    config's bucket and cap (prefetched_twelfths, gathered_ahead)."""
    matrices = shape.block_tensors[0]
    twelfths = prefetched_twelfths(zero_setting(zero, "stage3_prefetch_bucket_size"), matrices)
    return twelfths, gathered_ahead(shape.layers, sum(matrices), shape.root_params, params,
                                    zero_setting(zero, "stage3_max_live_parameters"), twelfths)


def held_output_grad_elems(shape: ModelShape) -> int:
    """The output layer's gradient elements that stage 3 holds whole through the blocks' backward: a tied
    embedding's, which autograd adds to the embedding's own before DeepSpeed's hook reduces it; an untied output
    layer's is reduced at the next hook, the final norm's."""
    return shape.embedding if shape.tied else 0


def start_gathered_bytes(width: int, world: int, fetches: bool, gathered: float, zero: dict[str, Any],
                         shape: ModelShape | None, checkpoint: bool, params: float) -> float:
    """The 16-bit weights that stage 3 holds gathered through the loss's backward, which comes before any module's,
    where it fetches weights (predict.fetches_weights) and the model's shape is known:
    - ranks that all-gather gather each fetch into one flat buffer (partition_parameters.py: _all_gather_coalesced),
      which a release frees whole: forward's are freed, and what backward's first fetch (the model's own, whose loss
      has no parameters) prefetches is held, the output layer's weight and behind it the last block's tensors on,
      whole, while fewer than stage3_prefetch_bucket_size and stage3_max_live_parameters are taken
      (taken_by_prefetch). The output layers of 350m (51M elements), 1.3b (103M) and 39-hf's models (131M to 263M)
      fill the bucket of 5e7 alone, as the probe finds (benchmarks/logs/cpu/backward-probe: the weight, twice with
      the copy of predict.saved_weights_bytes);
    - one rank that copies its weights in from host memory copies each tensor on its own, so the device holds what
      DeepSpeed's coordinator has fetched then, forward's last prefetches among it
      (fetched_at_backward_start: at 1.3b and the infinity config, the tied embedding and 5 blocks, 0.66
      GiB; 3_infinity on one H200 peaked 0.66 to 0.70 GiB above the rest of backward's start at micro batch 2 to 16,
      36-step-time and 38-step-time2).
    Elsewhere what is gathered at once (gathered, predict.gathered_bytes): nothing on a rank that fetches no
    weights, FSDP2's root module, which stays gathered from forward into backward, and without a shape the module
    and the prefetch bucket."""
    if shape is None or not fetches:
        return gathered
    if world == 1:
        return width * fetched_at_backward_start(shape, zero, checkpoint)
    room = min(zero_setting(zero, "stage3_prefetch_bucket_size"), zero_setting(zero, "stage3_max_live_parameters"))
    return width * min(taken_by_prefetch(room, [shape.embedding, *shape.layers * shape.block_tensors[0]]), params)


def prefetch_bytes(stage: int, engine: str, width: int, world: int, fetches: bool, zero: dict[str, Any],
                   shape: ModelShape, params: int, checkpoint: bool, tokens: int, last_block: float,
                   activations: float) -> float:
    """Stage 3 where it fetches weights (predict.fetches_weights: on more than one rank, or on one whose partitions
    live in host memory), in backward with checkpointing, where the prefetch holds the most ahead (gathered_ahead):
    those weights, the tied embedding's whole gradient (held_output_grad_elems), the checkpointed inputs of the
    blocks that backward has not reached then (inputs_left), a recomputed block's activations, and a bucket's
    reduction. The offload config's 1e9 cap on 2 rehearsed ranks: 15 gathered blocks in flight at once, 3.68 GiB at
    the peak (benchmarks/logs/h200/29-live). Where a prefetch gathers more than a block, forward's end has gathered
    them already, so backward's start, with all its activations, may hold more (350m offloaded on 2 ranks: 290M of
    its 353M partitioned elements gathered there, its peak, 29-live/4-trace350m)."""
    if not (shards_params(stage) and engine == "deepspeed" and fetches and checkpoint):
        return 0
    twelfths, ahead = prefetch_reach(zero, shape, params)
    inputs = shape.layers * width * tokens * shape.d_model * inputs_left(twelfths, ahead, shape)
    deep = (width * (ahead + held_output_grad_elems(shape)) + inputs + last_block
            + reduction_copies(width, world, zero, params))
    return max(deep, width * ahead + activations if twelfths > 12 else 0)


def rank_moments(stage: int, engine: str, width: int, world: int, fetches: bool, zero: dict[str, Any],
                 shape: ModelShape | None, params: int, checkpoint: bool, tokens: int, act: dict[str, float | None],
                 gathered: float, rehearsed: bool) -> dict[str, float]:
    """One rank's moments, as memory.MemoryTerms holds them, from its activations (act: memory.activations') and
    the weights that stage 3 gathers at once (gathered, predict.gathered_bytes); fetches: predict.fetches_weights."""
    held_grad = held_output_grad_elems(shape) if shape else 0
    return {"scatter": scatter_bytes(stage, engine, width, world, zero, params, act["blocks"] or 0, held_grad),
            "prefetched": prefetch_bytes(stage, engine, width, world, fetches, zero, shape, params, checkpoint, tokens,
                                         act["last_block"] or 0, act["activations"] or 0) if shape else 0,
            "regathered": regathered_bytes(stage, engine, width, params, world, rehearsed),
            "start_gathered": start_gathered_bytes(width, world, fetches, gathered, zero, shape, checkpoint, params)}


def regathered_bytes(stage: int, engine: str, width: int, params: int, world: int, rehearsed: bool) -> int:
    """Stages 1 and 2 all-gather the updated 16-bit weights at the step's end (utils.all_gather_dp_groups'
    all_gather_into_tensor); over gloo, as ranks rehearsed on one GPU use, that makes a copy of the whole output on
    the device, where NCCL gathers in place: 8 rehearsed ranks at stage 2 peaked there, 2.446 GiB over what they
    held, against 2 x 1.314B bytes (28-suite-matrix/4-trace)."""
    return width * params if rehearsed and world > 1 and engine == "deepspeed" and splits_one_buffer(stage) else 0


# DeepSpeed's stage-3 parameter coordinator

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
