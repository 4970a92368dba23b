"""
A model's shape, without torch: what the accounting reads of a model (its layers, widths, heads, vocabulary and the
kinds of its parts), as a Hugging Face config describes a family. train_gpt.py builds model.py's GPT from one and
plan.py plans a cluster from one; the GPT presets below are instances of it.
"""
import math
from dataclasses import asdict, astuple, dataclass
from typing import Any

LOSS_CHUNK = 256  # rows of logits per chunk of the loss


@dataclass(frozen=True)
class Tensors:
    """A model's parameter tensors as counted on the meta device (zero3bench/hf.py, for a Hugging Face config), where
    its fields alone do not give them: each tensor's elements, in the model's order."""
    block: tuple[tuple[int, ...], tuple[int, ...]]  # one block's matrices, then its vectors
    groups: tuple[tuple[int, ...], tuple[int, ...]]  # every tensor, in train_gpt.decay_groups' two groups
    root: int  # the elements outside the blocks


@dataclass(frozen=True)
class Kept:
    """What a model holds for backward when its forward ends, in bytes, at one micro batch: its storages made in the
    forward and still alive, each counted once (zero3bench/saved.py counts them on the meta device)."""
    total: int  # all of them but the logits, without checkpointing
    checkpointed: int  # the same with each block checkpointed: the blocks' inputs, and what the rest keeps
    head: int  # what the layers above the blocks made (the final norm's, the output layer's input, a soft-cap's)
    first_block: int  # what the first block made, whose backward comes last
    most_block: int  # what the block that keeps the most made, as its recomputation makes it again
    logits: int  # the logits, which the loss keeps


@dataclass(frozen=True)
class Saved:
    """What a model keeps for backward, counted at one sequence length, dtype and kind of device, at micro batches 1,
    2 and 3: from 2 rows on, each row keeps the same, and what all rows share (rotary positions, a mask of positions,
    a kernel's random seed) does not grow with them, so that one count per micro batch is exact at any. One row is
    counted apart: it can keep less than a row of more, where a tensor broadcast across the heads stays a view when
    reshaped for one row and is copied for more (torch 2.11's math attention on a CPU, under multi-query attention)."""
    seq: int
    dtype: str
    on_gpu: bool
    attention: str  # the attention kernels counted: "flash", "efficient", "math", "cpu-flash", "eager"
    one: Kept  # at micro batch 1
    two: Kept  # at micro batch 2
    three: Kept  # at micro batch 3

    def at(self, micro_batch: int) -> Kept:
        if micro_batch == 1:
            return self.one
        return Kept(*(a + (micro_batch - 2) * (b - a) for a, b in zip(astuple(self.two), astuple(self.three))))


def padded(vocab: int, multiple: int = 64) -> int:
    return multiple * math.ceil(vocab / multiple)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape. The defaults are model.py's GPT (GPT-2/3): multi-head attention, a
    GELU MLP of 4 x d_model, LayerNorms, learned positions, biases everywhere and the embedding tied to the output
    layer; a model that differs says so in its fields (zero3bench/hf.py reads them off a Hugging Face config and the
    model it builds), which the accounting reads where they matter. The activations of a block described by these
    fields are accounting/memory.py's arithmetic; a Hugging Face model's are counted (saved)."""
    layers: int
    heads: int
    d_model: int  # the hidden size
    vocab: int
    context: int
    lr: float | None  # the peak learning rate after the warm-up, for the benchmark's few steps and small batches
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: as many as heads
    ffn: int | None = None  # the MLP's inner width; None: 4 x d_model
    mlp: str = "plain"  # "plain": fc, its activation, proj; "gated": gate and up, the activation's product, down
    tied: bool = True  # the output layer is the token embedding
    norm_kind: str = "layernorm"  # "layernorm" (centred, a bias where it has one) or "rmsnorm" (not centred)
    positions: str = "learned"  # "learned" (an embedding of context rows), "rope" (rotary: no parameters), "none"
    bias: bool = True  # whether attention's and the MLP's linear layers have biases
    vocab_multiple: int = 64  # the embedding's rows are the vocabulary padded to a multiple of this
    tensors: Tensors | None = None  # the tensors as counted, where the fields above do not say them
    head_dim: int | None = None  # one head's width; None: d_model / heads
    norm_vectors: int | None = None  # one norm's vectors: 2 (weight, bias), 1 (weight), 0; None: as norm_kind has
    parallel: bool | None = False  # attention and the MLP read the same input, their outputs added to it (GPT-NeoX,
    # Falcon), as a Hugging Face model's counted forward shows it (zero3bench/saved.py); None until it runs
    experts: int = 0  # the MLP's experts (0: one dense MLP), of which each token is routed to top_k
    top_k: int = 0
    window: int | None = None  # the tokens that a sliding window of attention sees, where some layers have one
    dropout: float = 0.0  # the largest dropout probability that training applies
    saved: tuple[Saved, ...] | None = None  # counted, at each setting it was; None: these fields' arithmetic
    not_counted: str = ""  # where saved is empty, why it could not be counted

    @property
    def padded_vocab(self) -> int:
        # a multiple of 64 rows: the output layer's matmul with 50257 rows ran 5.6x slower on an H200 than with
        # 50304 (benchmarks/logs/h200/1-first-look/env.txt); the extra rows are tokens that never occur
        return padded(self.vocab, self.vocab_multiple)

    @property
    def head_width(self) -> int:
        return self.head_dim or self.d_model // self.heads

    @property
    def kv_width(self) -> int:
        """The width of the keys (and of the values): kv_heads heads of head_width."""
        return (self.kv_heads or self.heads) * self.head_width

    @property
    def inner(self) -> int:
        return self.ffn or 4 * self.d_model

    @property
    def norm(self) -> list[int]:
        """One norm's tensors: a LayerNorm's weight and bias, or an RMSNorm's weight, unless norm_vectors says."""
        vectors = (2 if self.norm_kind == "layernorm" else 1) if self.norm_vectors is None else self.norm_vectors
        return [self.d_model] * vectors

    @property
    def block_tensors(self) -> tuple[list[int], list[int]]:
        """One block's tensors in model.py's order, split as train_gpt.decay_groups splits them: the matrices
        (attention's, then the MLP's), and the vectors (the first norm, attention's biases, the second norm, the
        MLP's biases)."""
        if self.tensors:
            return tuple(map(list, self.tensors.block))
        d, kv, f = self.d_model, self.kv_width, self.inner
        if kv == d and self.mlp == "plain":  # model.py's attention: q, k and v as one matrix
            attention, attention_bias = [3 * d * d, d * d], [3 * d, d]
        else:
            attention, attention_bias = [d * d, kv * d, kv * d, d * d], [d, kv, kv, d]
        mlp, mlp_bias = ([f * d, f * d, d * f], [f, f, d]) if self.mlp == "gated" else ([d * f, f * d], [f, d])
        if not self.bias:
            attention_bias, mlp_bias = [], []
        return attention + mlp, self.norm + attention_bias + self.norm + mlp_bias

    @property
    def block_params(self) -> int:
        """One block: for model.py's, two LayerNorms (2d each), qkv and its projection (4d² + 4d), the MLP (8d² +
        5d)."""
        return sum(map(sum, self.block_tensors))

    @property
    def embedding(self) -> int:
        """The token embedding's elements (the largest tensor, or as large as the untied output layer)."""
        return self.padded_vocab * self.d_model

    @property
    def root_params(self) -> int:
        """Outside the blocks: the token embedding (with its own output layer where untied), the positions and the
        final norm. FSDP2 shards them as the root module."""
        if self.tensors:
            return self.tensors.root
        positions = self.context * self.d_model if self.positions == "learned" else 0
        return (1 if self.tied else 2) * self.embedding + positions + sum(self.norm)

    @property
    def params(self) -> int:
        return self.root_params + self.layers * self.block_params

    @property
    def qkv_params(self) -> int:
        """Attention's input projections: model.py's qkv weight (3d²), or q, k and v."""
        return self.d_model * (self.heads * self.head_width + 2 * self.kv_width)

    @property
    def decay_groups(self) -> tuple[list[int], list[int]]:
        """Each tensor's elements, in model.py's order, in train_gpt.decay_groups' two groups: the matrices (the
        token embedding, tied to the output layer, the positions, and each block's qkv, projection and MLP
        weights), then the vectors (each block's LayerNorms and biases, and the final LayerNorm)."""
        if self.tensors:
            return tuple(map(list, self.tensors.groups))
        matrices, vectors = self.block_tensors
        positions = [self.context * self.d_model] if self.positions == "learned" else []
        untied = [] if self.tied else [self.embedding]
        return [self.embedding, *positions, *self.layers * matrices, *untied], [*self.layers * vectors, *self.norm]


def as_record(shape: ModelShape) -> dict[str, Any]:
    return asdict(shape)


def third(saved: dict[str, Any]) -> Kept:
    """A count's micro batch 3 as its record holds it; a record from before it was counted, as its rows then were
    taken to keep the same from the first: micro batch 2's and a row more."""
    if saved.get("three"):
        return Kept(**saved["three"])
    one, two = astuple(Kept(**saved["one"])), astuple(Kept(**saved["two"]))
    return Kept(*(2 * b - a for a, b in zip(one, two)))


def from_record(d: dict[str, Any]) -> ModelShape:
    """The shape that as_record wrote, its tensors' lists read back as tuples and its counts as records. A record
    from before the activations were counted (issue 56) said of a Hugging Face model whether its block was the
    Llama layer that its fields describe: so it is read, or as not counted."""
    d, t = dict(d), d.get("tensors")
    tensors = t and Tensors(tuple(map(tuple, t["block"])), tuple(map(tuple, t["groups"])), t["root"])
    if d.pop("activations_known", True) is False:
        d.update(saved=(), not_counted="its record is older than the count of what its layers keep for backward")
    elif d.get("saved") is not None:
        d["saved"] = tuple(Saved(**{**s, "one": Kept(**s["one"]), "two": Kept(**s["two"]), "three": third(s)})
                           for s in d["saved"])
    return ModelShape(**{**d, "tensors": tensors})


# The GPT-3 paper's shapes, plus two byte-level models for CPUs: tiny, and small, sized for the memory-cap
# demo. 1.3b's rate was measured on H200s (BENCHMARKS.md, section 9): Adam's first step moves every weight by
# about the rate, whatever its gradient; at 1e-5 the loss rose at step 2, and a warm-up to it (5e-6, then
# 1e-5) made bf16 rise at step 3 on 2 GPUs, where 5e-6 fell at every step. The other GPT-3 rates keep the
# paper's ratios to 1.3b's, but 2.7b's: at the paper's ratio (4e-6) its loss rose at step 2 (11.322, 12.890) on one
# H200, at 2e-6 at step 3 (11.340, 8.166, 13.331), at 3e-6 it fell (11.340, 7.834, 6.789;
# benchmarks/logs/h200/26-off-default); on 2 rehearsed ranks 3e-6 rose at step 3 (11.322, 7.773, 8.059), 2.5e-6 too
# (8.027, 13.274) and 3.5e-6 fell (7.762, 6.195; h200/27-suite-matrix); 3.5e-6 is not yet run on one rank.
# tiny's 3e-3 overshot one batch at its third step on one CPU rank (seed 0:
# 5.369, 4.718, 5.057); 1e-3 fell at each of the first 3 steps for seeds 0-5 and 10-15. small's 1e-5 rose at step 3
# in bf16 on the H200 machine's CPU ranks (Python 3.12's sources as data: 5.574, 4.551, 4.794; the test suite there);
# 5e-6 fell on 2 CPU ranks in fp32 here for seeds 0 and 1 (5.182, 4.273, 4.045; 5.504, 4.461, 4.199;
# benchmarks/logs/cpu/small-rate).
PRESETS = {
    "tiny": ModelShape(2, 4, 128, 256, 256, 1e-3),
    "small": ModelShape(8, 8, 1024, 256, 256, 5e-6),
    "125m": ModelShape(12, 12, 768, 50257, 1024, 1.5e-5),
    "350m": ModelShape(24, 16, 1024, 50257, 1024, 7.5e-6),
    "760m": ModelShape(24, 16, 1536, 50257, 1024, 6.25e-6),
    "1.3b": ModelShape(24, 16, 2048, 50257, 1024, 5e-6),
    "2.7b": ModelShape(32, 32, 2560, 50257, 1024, 3.5e-6),
    "6.7b": ModelShape(32, 32, 4096, 50257, 1024, 3e-6),
}
DEFAULT_MODEL = "1.3b"  # what a GPU trains and plan.py plans when no model is named (CPU ranks train tiny: inputs.py)


def smaller_presets(model: str) -> list[str]:
    """The GPT presets with fewer parameters than the preset model, largest first; none for another model."""
    if model not in PRESETS:
        return []
    return sorted((name for name, shape in PRESETS.items() if shape.params < PRESETS[model].params),
                  key=lambda name: -PRESETS[name].params)
