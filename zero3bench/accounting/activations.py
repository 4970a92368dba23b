"""
The activations that backward needs, from the model's shape: what one block saves, the output layer's backward, and
their most, with checkpointing or without. Pure arithmetic, as predict.py; each block's count was checked against
saved_tensors_hooks on a CPU (tests/test_accounting.py for model.py's block, tests/test_hf.py for the Llama layer's).
A shape whose block is neither (shapes.ModelShape.activations_known) has no prediction here.
"""
from zero3bench.accounting.predict import WIDTH
from zero3bench.accounting.shapes import ModelShape

# The values of the MLP's inner width per token that one block keeps: GELU's input and mlp.proj's input; or the gated
# MLP's gate and up outputs, SiLU's output and down's input (the product)
MLP_VALUES = {"gelu": 2, "gated": 4}


def uses_flash(on_gpu: bool, dtype: str) -> bool:
    """Whether attention runs SDPA's flash kernels, which keep no scores for backward: on a GPU, in 16 bits
    (they take 16-bit inputs only)."""
    return on_gpu and WIDTH[dtype] == 2


def norm_bytes(shape: ModelShape, width: int) -> int:
    """What one norm saves per token: a LayerNorm its input and fp32 mean and rstd; transformers' RMSNorm its input
    cast to fp32, the fp32 rstd, and the normalised input cast back, which the weight multiplies."""
    d = shape.d_model
    return width * d + 2 * 4 if shape.norm_kind == "layernorm" else 4 * d + 4 + width * d


def block_activation_bytes(shape: ModelShape, width: int, tokens: int, seq: int, flash: bool) -> int:
    """What one block saves for backward: its two norms (norm_bytes), attention's input, q, k and v, attention's
    output (which the output projection takes as it is), the MLP's input and its inner values (MLP_VALUES), and flash
    attention's fp32 logsumexp per head. For model.py's block, 16 values of d_model a token and the LayerNorms' stats:
    Korthikanti et al.'s 34 per token and d_model, less the two dropout masks that this model lacks. Without a fused
    attention kernel SDPA's math path keeps its softmax too, one value per score."""
    d = shape.d_model
    values = 3 * d + 2 * shape.kv_width + d + MLP_VALUES[shape.mlp] * shape.inner
    per_token = 2 * norm_bytes(shape, width) + width * values + (4 * shape.heads if flash else 0)
    return tokens * per_token + (0 if flash else width * shape.heads * seq * tokens)


def positions_bytes(shape: ModelShape, width: int, tokens: int) -> int:
    """Rotary positions' cos and sin, made once per forward and saved by every block's attention: one head's width
    each per token."""
    return 2 * width * (shape.d_model // shape.heads) * tokens if shape.positions == "rope" else 0


def output_layer_bytes(shape: ModelShape, width: int, tokens: int, loss_chunk: int) -> int:
    """The most that backward holds for the layers above the blocks, on top of what the blocks keep: the final norm's
    input (an RMSNorm's, as norm_bytes says) and output (the output layer's input), and at the last chunk of the loss,
    the logits (kept for the loss, recomputed chunk by chunk), the other chunks' gradients, which the split's backward
    joins only once all are made, and the last chunk's fp32 log-softmax, its gradient and its input's (12 bytes a
    logit). Measured on an H200 within 1.6% at 350m and 1.3b, micro batch 1 to 16, bf16 and fp32
    (benchmarks/logs/h200/31-suite/probe, which tests/test_accounting.py reads)."""
    chunk, d = min(loss_chunk, tokens), shape.d_model
    final_norm = width * d if shape.norm_kind == "layernorm" else norm_bytes(shape, width)
    return (final_norm + width * d) * tokens + (2 * width * tokens + (12 - width) * chunk) * shape.padded_vocab


def activation_bytes(shape: ModelShape, dtype: str, micro_batch: int, seq: int, checkpoint: bool, flash: bool,
                     loss_chunk: int) -> int:
    """The activations when backward starts, their most: every block's saved tensors, or with checkpointing each
    block's input only, and the output layer's backward (output_layer_bytes); with checkpointing, a block
    recomputed during backward instead where it holds more than the output layer (not at 1.3b)."""
    width, tokens = WIDTH[dtype], micro_batch * seq
    block = block_activation_bytes(shape, width, tokens, seq, flash)
    output = output_layer_bytes(shape, width, tokens, loss_chunk) + positions_bytes(shape, width, tokens)
    if checkpoint:
        return shape.layers * width * tokens * shape.d_model + max(output, block)
    return shape.layers * block + output


def blocks_backward_bytes(shape: ModelShape, dtype: str, micro_batch: int, seq: int, checkpoint: bool,
                          flash: bool) -> int:
    """The activations when the blocks' backward starts, the output layer's done: every block's saved tensors, or with
    checkpointing each block's input and the last block recomputed; the rotary positions once, which every block
    saves by reference."""
    width, tokens = WIDTH[dtype], micro_batch * seq
    block = block_activation_bytes(shape, width, tokens, seq, flash)
    saved = shape.layers * width * tokens * shape.d_model + block if checkpoint else shape.layers * block
    return saved + positions_bytes(shape, width, tokens)
