"""
(c), the loss: the first steps train on one batch, and its loss must fall at each, alike at both stages; the
distances between two runs' losses and weights, which (e) reads too.
"""
import math
from dataclasses import replace
from typing import NamedTuple, Optional

from zero3bench import options
from zero3bench.result import RankResult, shape_of
from .bounds import DESIGN_LOSS, FALLING_STEPS, FIRST_LOSS_RTOL, LOSS_RTOL, WEIGHTS_RTOL
from .figures import Loss
from .reading import Results, failed, status, how_to_observe


def loss_falls(losses: list[float]) -> bool:
    """Falls at each of the first FALLING_STEPS steps, which train on the same rows, and no later step, on fresh
    rows, comes back to the first step's loss."""
    early = losses[:FALLING_STEPS]
    return (all(map(math.isfinite, losses)) and all(b < a for a, b in zip(early, early[1:]))
            and all(x < losses[0] for x in losses[FALLING_STEPS:]))


def largest_gap(a: list[float], b: list[float]) -> float:
    """The largest relative difference between two runs' losses, step by step; infinite where a loss is not
    finite (max() would pass over a NaN)."""
    gaps = [abs(x - y) / abs(x) for x, y in zip(a, b)]
    return max(gaps, default=0.0) if all(map(math.isfinite, gaps)) else math.inf


class LossGaps(NamedTuple):
    """How far one run's losses are from another's, relative."""
    step1: float  # at the first step
    anywhere: float  # the most at any step
    same: bool  # both within bounds


def loss_gaps(a: RankResult, b: RankResult) -> LossGaps:
    """How far run b's losses are from run a's."""
    la, lb = a.trained_losses or [], b.trained_losses or []
    step1, anywhere = largest_gap(la[:1], lb[:1]), largest_gap(la, lb)
    return LossGaps(step1, anywhere, step1 <= FIRST_LOSS_RTOL and anywhere <= LOSS_RTOL)


def weights_apart(a: RankResult, b: RankResult) -> float | None:
    """How far apart two runs' weights are after the steps on one batch (a checksum, which a fault too small to
    move the loss past LOSS_RTOL still moves); None where a run has no checksum."""
    x, y = a.trained_checksum, b.trained_checksum
    return abs(x - y) / abs(x) if x and y else None


def design_losses(model: str, losses: dict[str, list[float]]) -> Optional[dict]:
    """{stage: its loss at DESIGN_LOSS's step}, for the model the acceptance check names; else None."""
    if model != DESIGN_LOSS["model"] or len(losses["stage 3"]) < DESIGN_LOSS["step"]:
        return None
    return {name: x[DESIGN_LOSS["step"] - 1] for name, x in losses.items() if len(x) >= DESIGN_LOSS["step"]}


def loss(dense: Results, zero3: Results) -> tuple[str, Loss]:
    """Stage 3 finished; each finished stage's loss falls at each of the first FALLING_STEPS steps, which train on
    one batch; no later step, on fresh rows, comes back to the first step's loss; the stages' losses are within
    LOSS_RTOL of each other at every step; their weights after the first FALLING_STEPS steps are within
    WEIGHTS_RTOL of each other; and for the model that DESIGN_LOSS names, each stage is below its loss by its step.

    Not observable with fewer than FALLING_STEPS steps applied, where stage 0 did not finish (that the stages are
    alike is then not observed), or where the loss misses only its fall, alike at both stages, at a learning rate of
    the run's own (at_own_rate)."""
    if failed(zero3):
        return "FAIL", Loss(unfinished=status(zero3))
    finished = {"stage 3": zero3} if failed(dense) else {"stage 0": dense, "stage 3": zero3}
    losses = {name: rs[0].trained_losses or [] for name, rs in finished.items()}
    both = len(finished) == 2
    f = Loss(losses=losses, skipped={name: rs[0].skipped_steps for name, rs in finished.items() if rs[0].skipped_steps},
             not_falling=[name for name, x in losses.items() if not loss_falls(x)],
             gap=largest_gap(*losses.values()) if both else None,
             weights_apart=weights_apart(dense[0], zero3[0]) if both else None,
             steps=min(len(x) for x in losses.values()), at_design_step=design_losses(zero3[0].run.model, losses))
    f = replace(f, misses=loss_misses(f))
    if f.steps < FALLING_STEPS and not f.misses:
        return "NOT OBSERVABLE", f
    if not both and not f.misses:  # stage 3's fall alone was observed, not that it is alike at stage 0
        return "NOT OBSERVABLE", replace(f, stage0_unfinished=status(dense),
                                         observe=how_to_observe(dense, "stage 0", zero3[0]))
    if f.misses and alike(f) and at_own_rate(zero3[0]):
        return "NOT OBSERVABLE", replace(f, own_rate=zero3[0].run.lr, preset_rate=shape_of(zero3[0]).lr)
    return ("FAIL" if f.misses else "PASS"), f


def alike(f: Loss) -> bool:
    """Both stages ran and agree, in their losses and weights: what (c) missed is the fall alone."""
    return (f.gap is not None and f.gap <= LOSS_RTOL
            and (f.weights_apart is None or f.weights_apart <= WEIGHTS_RTOL))


def at_own_rate(r: RankResult) -> bool:
    """The run trained at a rate of its own (its config's or --lr's), not its model's preset: one at which the
    loss does not fall, alike at both stages, says nothing of ZeRO-3 (the original design's 1e-4 rose at both)."""
    preset = shape_of(r)
    return bool(r.run.lr and preset and preset.lr and not math.isclose(r.run.lr, preset.lr))


def loss_misses(f: Loss) -> list[str]:
    """What (c) found wrong, in words."""
    misses = [f"{name} does not fall as it should" for name in f.not_falling]
    if f.gap is not None and f.gap > LOSS_RTOL:
        misses.append(f"the stages DIFFER by {f.gap:.2%}")
    if f.weights_apart is not None and f.weights_apart > WEIGHTS_RTOL:
        misses.append(f"the weights DIFFER by {f.weights_apart:.3%}")
    return misses + [f"{name} is at {x:.3f} at step {DESIGN_LOSS['step']}"
                     for name, x in (f.at_design_step or {}).items() if not x < DESIGN_LOSS["below"]]


def say_loss(f: Loss) -> str:
    if f.unfinished:
        return f"stage 3 did not finish: {f.unfinished}"
    text = "; ".join(f"{name} {' -> '.join(f'{x:.3f}' for x in losses)}" for name, losses in f.losses.items())
    if f.skipped:  # logs from before steps were marked applied have none
        text += " (the applied steps; skipped as fp16's loss scale overflowed: " + ", ".join(
            f"{name} {n}" for name, n in f.skipped.items()) + ")"
    if f.gap is not None:
        text += f"; the stages agree to {f.gap:.2%} at every step (at most {LOSS_RTOL:.0%})"
        if f.weights_apart is not None:
            text += (f", and their weights after step {FALLING_STEPS} to {f.weights_apart:.3%} "
                     f"(at most {WEIGHTS_RTOL:.1%})")
    misses = f.misses
    if f.steps < FALLING_STEPS and not misses:
        return text + (f"; {f.steps} step(s) applied, and (c) judges the first {FALLING_STEPS}: "
                       f"give --steps {FALLING_STEPS} or more" + (f", or a loss scale that overflows less (at most "
                                                                   f"{options.MAX_SKIPPED_STEPS} steps are skipped)"
                                                                   if f.skipped else ""))
    if f.own_rate is not None:
        return text + (f"; the loss does not fall, alike at both stages, at this run's learning rate {f.own_rate:g} "
                       f"(its config's or --lr's; {f.preset_rate:g} is the preset's): the stages agree, and the "
                       f"fall is not observable at that rate")
    if f.at_design_step is not None:
        text += f"; below {DESIGN_LOSS['below']:g} by step {DESIGN_LOSS['step']}, as the acceptance check expects"
    if f.stage0_unfinished:
        text += (f"; stage 0 did not finish ({f.stage0_unfinished}), so that the loss is alike at both stages is "
                 f"not observed; observe it {f.observe}")
    return text + ("; MISSED: " + ", ".join(misses) if misses else "")
