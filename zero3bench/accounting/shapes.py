"""
The GPT's shapes, without torch: train_gpt.py builds its model from them and plan.py plans a cluster from them.
"""
from dataclasses import dataclass

from zero3bench.accounting import predict

LOSS_CHUNK = 256  # rows of logits per chunk of the loss


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    heads: int
    d_model: int
    vocab: int
    context: int
    lr: float | None  # the peak learning rate after the warm-up, for the benchmark's few steps and small batches

    @property
    def padded_vocab(self) -> int:
        # a multiple of 64 rows: the output layer's matmul with 50257 rows ran 5.6x slower on an H200 than with
        # 50304 (benchmarks/logs/h200/1-first-look/env.txt); the extra rows are tokens that never occur
        return predict.padded(self.vocab)

    @property
    def block_params(self) -> int:
        """One block: two LayerNorms (2d each), qkv and its projection (4d² + 4d), the MLP (8d² + 5d)."""
        return 12 * self.d_model**2 + 13 * self.d_model

    @property
    def root_params(self) -> int:
        """Outside the blocks: the token embedding, tied to the output layer, the positions and the final
        LayerNorm. FSDP2 shards them as the root module."""
        return (self.padded_vocab + self.context + 2) * self.d_model

    @property
    def params(self) -> int:
        return self.root_params + self.layers * self.block_params

    @property
    def decay_groups(self) -> tuple[list[int], list[int]]:
        """Each tensor's elements, in model.py's order, in train_gpt.decay_groups' two groups: the matrices (the
        token embedding, tied to the output layer, the positions, and each block's qkv, projection and MLP
        weights), then the vectors (each block's LayerNorms and biases, and the final LayerNorm)."""
        d = self.d_model
        matrices = [self.padded_vocab * d, self.context * d] + self.layers * [3 * d * d, d * d, 4 * d * d, 4 * d * d]
        vectors = self.layers * [d, d, 3 * d, d, d, d, 4 * d, d] + [d, d]
        return matrices, vectors


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
    "tiny": GPTConfig(2, 4, 128, 256, 256, 1e-3),
    "small": GPTConfig(8, 8, 1024, 256, 256, 5e-6),
    "125m": GPTConfig(12, 12, 768, 50257, 1024, 1.5e-5),
    "350m": GPTConfig(24, 16, 1024, 50257, 1024, 7.5e-6),
    "760m": GPTConfig(24, 16, 1536, 50257, 1024, 6.25e-6),
    "1.3b": GPTConfig(24, 16, 2048, 50257, 1024, 5e-6),
    "2.7b": GPTConfig(32, 32, 2560, 50257, 1024, 3.5e-6),
    "6.7b": GPTConfig(32, 32, 4096, 50257, 1024, 3e-6),
}
DEFAULT_MODEL = "1.3b"  # what a GPU trains and plan.py plans when no model is named (CPU ranks train tiny: inputs.py)
