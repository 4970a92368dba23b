"""train_gpt.py with one fault planted, for the tests that hold the verdict to failing on it:

    torchrun --nproc_per_node 2 tests/plant_fault.py FAULT [train_gpt.py options ...]

FAULT is one of FAULTS: a learning rate of 0, rank 1's gradients zeroed before each optimizer step, rank 1's
shard of the weights perturbed after each step, or at stage 3 parameters kept gathered after backward: one
block's weights whole on every rank, or every parameter; or the first 3 optimizer steps skipped, as fp16's loss
scaler skips a step whose gradients overflow (fp16 itself needs a GPU)."""
import sys
from pathlib import Path

import deepspeed
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt  # noqa: E402
from zero3bench.accounting import measure  # noqa: E402


def zero_rank1_gradients(engine):
    """Before the step: every gradient that rank 1 holds, on the parameters and in ZeRO's partitions, is 0."""
    if torch.distributed.get_rank() == 1:
        for p in engine.module.parameters():
            if p.grad is not None:
                p.grad.zero_()
        for t in measure.partitioned_gradients(engine.optimizer):
            if torch.is_tensor(t):
                t.zero_()


def perturb_rank1_shard(engine):
    """After the step: rank 1's own elements of every weight (its ZeRO-3 shard, or its replica) move by 1%."""
    if torch.distributed.get_rank() == 1:
        with torch.no_grad():
            for p in engine.module.parameters():
                owned = p.ds_tensor if hasattr(p, "ds_tensor") else p.data
                owned.mul_(1.01)


def keep_gathered(modules_of):
    """After backward, every rank gathers the parameters of modules_of(model) and keeps them whole, as a stage 3
    that never released them would (a GatheredParameters context entered and never left; gathering is collective)."""
    held = []

    def after_backward(engine):
        if held:  # DeepSpeed refuses to gather again what a context still holds: that one is left, this one kept
            held.pop().__exit__(None, None, None)
        held.append(deepspeed.zero.GatheredParameters([p for m in modules_of(engine.module) for p in m.parameters()]))
        held[-1].__enter__()
    return after_backward


def skip_first_steps(count):
    """The first `count` optimizer steps skipped on every rank, as DeepSpeed does on an overflow: the gradients
    dropped, the weights and the optimizer's states untouched, and engine.was_step_applied() False."""
    def build_skipping(*args):
        engine = build(*args)
        step, skipped = engine.step, []

        def skipping_step(*a, **k):
            if len(skipped) < count:
                skipped.append(True)
                engine.optimizer.zero_grad()
                engine._step_applied = False
                return None
            return step(*a, **k)
        engine.step = skipping_step
        return engine
    build = train_gpt.build_engine
    train_gpt.build_engine = build_skipping


def wrap_engine(before=None, after=None, after_backward=None):
    build = train_gpt.build_engine

    def build_with_fault(*args):
        engine = build(*args)
        step, backward = engine.step, engine.backward

        def faulty_backward(*a, **k):
            result = backward(*a, **k)
            if after_backward:
                after_backward(engine)
            return result
        engine.backward = faulty_backward

        def faulty_step(*a, **k):
            if before:
                before(engine)
            result = step(*a, **k)
            if after:
                after(engine)
            return result
        engine.step = faulty_step
        return engine
    train_gpt.build_engine = build_with_fault


FAULTS = {
    "lr0": lambda: setattr(train_gpt, "learning_rate", lambda step, args: 0.0),
    "zero_grads": lambda: wrap_engine(before=zero_rank1_gradients),
    "perturb_shard": lambda: wrap_engine(after=perturb_rank1_shard),
    "keep_block": lambda: wrap_engine(after_backward=keep_gathered(lambda model: [model.blocks[0]])),
    "keep_gathered": lambda: wrap_engine(after_backward=keep_gathered(lambda model: [model])),
    "skip_3": lambda: skip_first_steps(3),
}

if __name__ == "__main__":
    FAULTS[sys.argv[1]]()
    train_gpt.main(sys.argv[2:])
