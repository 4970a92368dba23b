"""
The model: GPT-2/3 style, pre-LayerNorm, learned positions, tied input and output embedding. Its shapes
(PRESETS) are in zero3bench/accounting/shapes.py, torch-free, so that plan.py reads the same ones. A Hugging Face
model (--model CONFIG) is trained through HuggingFace below, with the GPT's loss.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from zero3bench.accounting import timing
from zero3bench.accounting.shapes import LOSS_CHUNK

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Linear(nn.Linear):
    """nn.Linear with GPT-2's initialisation. nn.Linear's constructor calls reset_parameters, so the init
    happens while the tensor is still whole: under zero.Init it is partitioned as the constructor returns."""

    def __init__(self, d_in, d_out, bias=True, std=0.02):
        self.std = std
        super().__init__(d_in, d_out, bias)

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    def reset_parameters(self):
        nn.init.normal_(self.weight, std=0.02)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads, proj_std):
        super().__init__()
        self.heads = heads
        self.qkv = Linear(d_model, 3 * d_model)
        self.proj = Linear(d_model, d_model, std=proj_std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model, proj_std):
        super().__init__()
        self.fc = Linear(d_model, 4 * d_model)
        self.proj = Linear(4 * d_model, d_model, std=proj_std)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, heads, proj_std):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, proj_std)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def summed_cross_entropy(logits, targets):
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def mean_loss(logits, targets):
    """The mean cross-entropy of logits (rows, vocabulary) in fp32, a chunk of rows at a time and recomputed in
    backward: whole, the fp32 logits, their log-softmax and its gradient would hold 12 bytes per logit, which no
    ZeRO stage partitions."""
    rows = zip(logits.split(LOSS_CHUNK), targets.flatten().split(LOSS_CHUNK))
    total = sum(torch.utils.checkpoint.checkpoint(summed_cross_entropy, *pair, use_reentrant=False)
                for pair in rows)
    return total / targets.numel()


class GPT(nn.Module):
    block_class = Block  # what ZeRO-3 gathers whole (train_gpt.build_engine)

    def __init__(self, shape, checkpoint=False):
        super().__init__()
        self.shape, self.checkpoint = shape, checkpoint
        proj_std = 0.02 / math.sqrt(2 * shape.layers)  # GPT-2: scale the residual projections by depth
        self.wte = Embedding(shape.padded_vocab, shape.d_model)
        self.wpe = Embedding(shape.context, shape.d_model)
        # each block is built explicitly: zero.Init cannot follow modules that deep-copy a layer
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads, proj_std) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.padded_vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return self.loss(x, targets)

    def loss(self, x, targets):
        """The mean loss of the blocks' output x: the final LayerNorm, the output layer and the cross-entropy."""
        return mean_loss(self.lm_head(self.ln_f(x)).flatten(0, 1), targets)

    def flops_per_token(self, params, seq):
        return timing.flops_per_token(params, self.shape.layers, self.shape.d_model, seq)


class HuggingFace(nn.Module):
    """A Hugging Face causal language model (zero3bench/hf.py builds it), trained as the GPT is: its own forward
    gives the logits (its norms, its output layer and whatever it does to the logits), and mean_loss their loss, so
    that both models' losses hold the same memory. The KV cache is off."""

    def __init__(self, model, shape, block_class, deepspeed_config=None):
        super().__init__()
        self.hf, self.shape, self.block_class = model, shape, block_class
        self.deepspeed_config = deepspeed_config  # HfDeepSpeedConfig, alive as long as the model (hf.build)

    def forward(self, idx, targets):
        return mean_loss(self.hf(input_ids=idx, use_cache=False).logits.flatten(0, 1), targets)

    def flops_per_token(self, params, seq):
        return timing.flops_per_token(params, self.shape.layers, self.shape.d_model, seq)
