"""
DeepSpeed's defects that this project has traced, each with the symptom a criterion fails with, the versions
that have it and where it was traced and fixed: a criterion that fails with one of these symptoms in a version
that has the defect names it (verdict.judged). The same table is in docs/result-keys.md.
"""
from dataclasses import dataclass
from typing import Callable, Optional

from zero3bench.finishing import PARTITION_TOLERANCE
from zero3bench.stages import shards_nothing, shards_params

from .reading import Results

# Stage 0's last loss this far above the other stage's: gradients scaled down, so it trains less (0.18.4: 1.1%)
LOSS_GAP = 0.005


@dataclass(frozen=True)
class Defect:
    what: str
    criteria: tuple  # the criteria it fails, by their letters
    fixed_in: Optional[str]  # the first DeepSpeed version without it; None while none is
    source: str
    symptom: Callable  # [results of a run, ...] -> whether the runs show it


def share(rs: Results, group: str, side: Callable[[list[float]], float]) -> float | None:
    """The most (side max) or least (min) share of one group of model states that any rank of a run holds."""
    held = [r.held_fraction[group] for r in rs if r.held_fraction]
    return side(held) if held else None


def stage3_holds_more_params(runs: list[Results]) -> bool:
    """A stage-3 DeepSpeed run holds more of the parameters after backward than it promises (0.19.2: 33% at 4
    ranks, promised 25%; 65% of the tiny model at 2, promised 51%)."""
    return any(shards_params(rs[0].run.stage) and rs[0].run.engine == "deepspeed" and rs[0].promised_fraction
               and (share(rs, "params", max) or 0) > (1 + PARTITION_TOLERANCE) * rs[0].promised_fraction["params"]
               for rs in runs if rs)


def stage0_bf16_trains_less(runs: list[Results]) -> bool:
    """A bf16 stage-0 run's last loss is above the other stage's (0.18.4: 4.723 against 4.669)."""
    dense = [rs[0] for rs in runs if rs and shards_nothing(rs[0].run.stage) and rs[0].run.dtype == "bf16"]
    others = [rs[0] for rs in runs if rs and not shards_nothing(rs[0].run.stage)]
    return any(d.trained_losses and o.trained_losses and d.trained_losses[-1] > (1 + LOSS_GAP) * o.trained_losses[-1]
               for d in dense for o in others)


def stage0_bf16_partitions_optimizer(runs: list[Results]) -> bool:
    """A bf16 stage-0 run on several ranks holds less than all of its optimizer states (0.17.5: 50% at 2 ranks)."""
    return any(shards_nothing(rs[0].run.stage) and rs[0].run.dtype == "bf16" and rs[0].world_size > 1
               and (share(rs, "optimizer", min) or 1) < 1 - PARTITION_TOLERANCE for rs in runs if rs)


def stage0_fp16_never_overflows(runs: list[Results]) -> bool:
    """An fp16 stage-0 DeepSpeed run skipped no step where another stage's skipped some: its gradients were never
    scaled (machine.loss_for_backward's defect; 0.19.8 unpatched, 4 ranks: none against 3)."""
    dense = [rs[0] for rs in runs if rs and shards_nothing(rs[0].run.stage) and rs[0].run.dtype == "fp16"
             and rs[0].run.engine == "deepspeed"]
    others = [rs[0] for rs in runs if rs and not shards_nothing(rs[0].run.stage) and rs[0].run.dtype == "fp16"]
    return any(not d.skipped_steps and o.skipped_steps for d in dense for o in others)


DEFECTS = [
    Defect("stage 3 holds the embeddings after backward (they take token ids, which need no gradient, and get no "
           "post-backward release until the optimizer step)", ("(d)",), "0.19.3",
           "DeepSpeed issue #5524, fixed by PR #8148", stage3_holds_more_params),
    Defect("stage 0 in bf16 scales its gradients by 1/65536 and accumulates them across steps", ("(c)", "(e)"),
           "0.18.6", "DeepSpeed PR #7839", stage0_bf16_trains_less),
    Defect("bf16 without ZeRO (stage 0) partitions the optimizer states", ("(b)",), "0.17.6", "DeepSpeed PR #7515",
           stage0_bf16_partitions_optimizer),
    Defect("without ZeRO (stage 0), engine.backward leaves an fp16 loss unscaled while the step divides the "
           "gradients by the loss scale: they are 1/loss-scale of their size and never clipped", ("(c)", "(e)"),
           None, "DeepSpeed PR #8393, open; train_gpt.py scales the loss itself up to DeepSpeed 0.19.8",
           stage0_fp16_never_overflows),
]


def version(text: str | None) -> tuple[int, ...] | None:
    """'0.19.2' or '0.19.2+abc' as (0, 19, 2); None where it cannot be read."""
    try:
        return tuple(int(part) for part in text.split("+")[0].split(".")[:3])
    except (AttributeError, ValueError):
        return None


def deepspeed_version(runs: list[Results]) -> str | None:
    """The oldest DeepSpeed version that any of the runs recorded, as text; None where none did."""
    found = [(v, text) for rs in runs for r in rs[:1] if (v := version(text := r.env.deepspeed if r.env else None))]
    return min(found)[1] if found else None


def known_defects(criterion: str, runs: list[Results]) -> str:
    """The traced defects that explain a failed criterion in these runs' DeepSpeed, as one clause; "" where none
    does. runs: the results of each run that the criterion judged."""
    installed = deepspeed_version(runs)
    letter = criterion.split()[0]
    found = [d for d in DEFECTS if letter in d.criteria and installed
             and (d.fixed_in is None or version(installed) < version(d.fixed_in)) and d.symptom(runs)]
    return "".join(f"; KNOWN DEEPSPEED DEFECT in {installed}: {d.what} ({d.source}"
                   f"{f'; fixed in {d.fixed_in}' if d.fixed_in else ''})" for d in found)
