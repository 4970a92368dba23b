"""
PyTorch FSDP2 (fully_shard) as ZeRO-3's peer: train_gpt.py trains the same model on the same data with the
same precision, recipe, micro batch and checkpointing, through the few calls of DeepSpeed's engine that its
training loop makes.
"""
from __future__ import annotations

import torch


def missing() -> str | None:
    """Why FSDP2 cannot run here, in one line, or None: fully_shard and MixedPrecisionPolicy are public in
    torch.distributed.fsdp from torch 2.6."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
    except ImportError:
        return f"FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6; this is torch {torch.__version__}"
    return None


def shard(model: torch.nn.Module, dtype: torch.dtype, compile_blocks: bool) -> torch.nn.Module:
    """fully_shard each block, then the rest, as torchtitan does. The weights stay in fp32 and sharded; a
    block is gathered in the training dtype for its forward and again for its backward, and its gradients are
    reduce-scattered in that dtype, as ZeRO-3 does. The model comes built in the training dtype, so its
    weights start where ZeRO's fp32 master weights do."""
    # imported here: torch before 2.6 has no fully_shard, and the rest of the benchmark runs without it
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    model.float()
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    # a Hugging Face model keeps its blocks under its own names; block_class is what both kinds share
    for block in [m for m in model.modules() if isinstance(m, model.block_class)]:
        if compile_blocks:
            block.compile()
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


class Engine:
    """FSDP2 behind the calls of DeepSpeed's engine that train_gpt.train() makes."""
    lr_scheduler = None

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, clipping: float) -> None:
        self.module, self.optimizer, self.basic_optimizer, self.clipping = module, optimizer, optimizer, clipping

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module(*inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        if self.clipping:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clipping)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def was_step_applied(self) -> bool:
        return True  # no loss scaler skips a step

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]
