"""train_gpt.py with one fault planted, for the tests that hold the verdict to failing on it:

    torchrun --nproc_per_node 2 tests/plant_fault.py FAULT [train_gpt.py options ...]

FAULT is one of FAULTS: a learning rate of 0, rank 1's gradients zeroed before each optimizer step, or rank 1's
shard of the weights perturbed after each step."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt  # noqa: E402
from accounting import measure  # noqa: E402


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


def wrap_engine(before=None, after=None):
    build = train_gpt.build_engine

    def build_with_fault(*args):
        engine = build(*args)
        step = engine.step

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
}

if __name__ == "__main__":
    FAULTS[sys.argv[1]]()
    train_gpt.main(sys.argv[2:])
