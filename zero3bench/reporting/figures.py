"""
What each verdict criterion judged, as a typed record: the criterion's function (verdict.py) fills one, its
sentence reads it, and summary.json carries it under the check (dataclasses.asdict), so that a reader finds
(b)'s expected ratio there by name. A figure a case does not reach stays None.
"""
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Check:
    """One line of the verdict: a criterion, its status, its sentence and the figures it was judged on."""
    criterion: str
    status: str
    detail: str
    figures: Optional[object] = None  # one of the records below; None for a check that judges no figures


@dataclass(frozen=True)
class Partitioning:
    """(a): stage 3's count of partitioned tensors, against stage 0's."""
    counted: bool  # False where no stage-3 rank lived to count
    partitioned: Optional[int] = None  # tensors stage 3 partitions, on its first rank that counted
    tensors: Optional[int] = None  # parameter tensors of the model
    shards_ok: Optional[bool] = None  # every rank's shards have the sizes ZeRO-3 gives them
    stage0_partitioned: Optional[int] = None  # None where stage 0 failed before counting
    same_weights: Optional[bool] = None  # the shards hold stage 0's initial weights; None without both checksums
    weights_gap: Optional[float] = None  # how far apart the two checksums are, relative; None without both
    world: Optional[int] = None
    stage0_unfinished: Optional[str] = None  # stage 0's status, where it did not finish and compared nothing
    observe: Optional[str] = None  # then, how to observe what it did not


@dataclass(frozen=True)
class Memory:
    """(b): model states and peaks per rank at stage 0 and stage 3, and the ratios theory expects."""
    unfinished: Optional[str] = None  # the run that did not finish ("stage 0" or "stage 3")
    status: Optional[str] = None  # that run's status
    only_stage3_fits: bool = False  # stage 0 ran out of memory where stage 3 fit
    cap_gib: Optional[float] = None  # the memory cap per rank, where there was one
    untrained: tuple = ()  # the runs that applied none of their steps
    skipped: Optional[int] = None  # the most steps fp16's loss scaler skipped in those runs
    uncounted: tuple = ()  # the runs that stopped before counting their model states
    states0: Optional[int] = None  # model-state bytes per rank at stage 0
    states3: Optional[int] = None
    peak0: Optional[int] = None  # peak bytes per rank at stage 0
    peak3: Optional[int] = None
    predicted_states_ratio: Optional[float] = None  # stage 0's predicted model states over stage 3's
    states_ok: Optional[bool] = None  # within MEMORY_SLACK of the predicted ratio
    world: Optional[int] = None
    on_gpu: Optional[bool] = None  # a CPU process's peak is mostly its runtime: judged on GPUs only
    no_theory: Optional[str] = None  # the model that has no predicted peak
    predicted_peak_ratio: Optional[float] = None  # stage 0's predicted peak over stage 3's
    expected_peak_ratio: Optional[float] = None  # the least the measured ratio may be (PEAK_SLACK allowed)
    peak_ok: Optional[bool] = None


@dataclass(frozen=True)
class Loss:
    """(c): each finished stage's applied losses, how far apart the stages are, and what was missed."""
    unfinished: Optional[str] = None  # stage 3's status, where it did not finish
    losses: dict = field(default_factory=dict)  # {stage: losses of the applied steps}
    skipped: dict = field(default_factory=dict)  # {stage: steps skipped}, where it skipped any
    not_falling: list = field(default_factory=list)  # the stages whose loss does not fall as it should
    gap: Optional[float] = None  # the largest relative gap between the stages' losses; None with one stage
    weights_apart: Optional[float] = None  # relative gap of the weights checksums after the same-rows steps
    steps: int = 0  # the fewest steps a stage applied
    at_design_step: Optional[dict] = None  # {stage: loss at DESIGN_LOSS's step}, for the model it names
    misses: list = field(default_factory=list)  # what (c) found wrong, in words
    own_rate: Optional[float] = None  # the run's learning rate, where (c) missed only its fall, alike at both
    preset_rate: Optional[float] = None  # stages, at a rate not the model's preset (its config's or --lr's)
    stage0_unfinished: Optional[str] = None  # stage 0's status, where it did not finish: alike is not observed
    observe: Optional[str] = None  # then, how to observe it


@dataclass(frozen=True)
class Promises:
    """(d): the share of parameters, gradients and optimizer states each run holds."""
    held: dict  # {run: {params, grads, optimizer: the fraction held}, or None where it ran out of memory}
    broken: list  # the runs that failed or hold more than promised, in words


@dataclass(frozen=True)
class Comparison:
    """One run's losses against its reference's."""
    run: str
    reference: str
    step1_gap: float  # relative gap of the first step's loss
    largest_gap: float  # the largest relative gap at any step
    same: bool  # both within bounds


@dataclass(frozen=True)
class SameTraining:
    """(e): every finished run against the reference among the runs with its settings."""
    compared: list  # [Comparison]
    unobserved: list = field(default_factory=list)  # [(run, its reference, the reference's status)]
    observe: Optional[str] = None  # how to observe those
