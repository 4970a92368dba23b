"""
The verdict: each criterion is a function that judges runs and returns its status and its figures; a separate
function composes the sentence that tells them. CRITERIA lists them with their scope:

    pair      one stage-0 run against one stage-3 run with the same number of ranks. The verdict PASSes
              when every pair criterion passes at some number of ranks.
    all runs  every run of the folder. These can only make the verdict FAIL, never PASS it.
A new criterion costs its figures (figures.py), its judging function, its sentence, one line in CRITERIA, and its
test (docs/layout.md).
"""
import os
import signal
from dataclasses import dataclass, replace
from typing import Callable, Optional

from zero3bench.formatting import size
from zero3bench.result import line_value
from .bounds import (FALLING_STEPS, FIRST_LOSS_RTOL, LOSS_RTOL, MEMORY_SLACK, SAME_IN_BOTH, SAME_TRAINING,
                     SAME_WEIGHTS_RTOL)
from .defects import known_defects
from .losses import loss, loss_gaps, say_loss
from .figures import Check, Comparison, Memory, Partitioning, Promises, SameTraining
from .reading import (Results, Runs, failed, most, oom, pairs, reference_rank, status, unaccounted,
                      how_to_observe)
from .theory import PEAK_SLACK, predicted_peak

PAIR, ALL_RUNS = "pair", "all runs"


@dataclass(frozen=True)
class Criterion:
    name: str
    scope: str  # PAIR: judge(dense, zero3); ALL_RUNS: judge(runs), None where nothing applies
    judge: Callable  # -> (status, figures), the figures a frozen dataclass of figures.py
    say: Callable  # figures -> the sentence
    every_rank: bool = False  # judges each rank: cannot PASS while a rank of a run it judges is unaccounted


# -----------------------------------------------------------------------------
# (a) partitioning


def partitioning(dense: Results, zero3: Results) -> tuple[str, Partitioning]:
    """Stage 3 counted what it partitions; every rank of stage 3 partitions every parameter tensor; every rank's
    shards have the sizes that ZeRO-3 gives them; no rank of stage 0 partitions any; and the shards hold exactly
    stage 0's initial weights, their checksums within SAME_WEIGHTS_RTOL.

    Stage 0 may have failed before it counted, and a run before its checksum: the weights are then not compared,
    and where stage 0 did not finish, what compares with it is not observed."""
    counted = [r for r in zero3 if r.shards.partitioned_tensors is not None]  # a rank that failed early counted nothing
    if not counted:
        return "FAIL", Partitioning(counted=False)
    # stage 0 may have run out of memory before it counted anything; what it did count must be nothing
    counted0 = [r.shards.partitioned_tensors for r in dense if r.shards.partitioned_tensors is not None]
    gap = checksum_gap(dense[0].weights_checksum, counted[0].weights_checksum)
    f = Partitioning(counted=True, partitioned=min(r.shards.partitioned_tensors for r in counted),
                     tensors=counted[0].shards.param_tensors, shards_ok=all(r.shards.shard_check_ok for r in counted),
                     stage0_partitioned=max(counted0, default=None),
                     same_weights=gap <= SAME_WEIGHTS_RTOL if gap is not None else None, weights_gap=gap,
                     world=counted[0].world_size)
    whole = all(r.shards.partitioned_tensors == r.shards.param_tensors > 0 and r.shards.shard_check_ok for r in counted)
    if not whole or any(counted0) or f.same_weights is False:
        return "FAIL", f
    if failed(dense) and None in (f.stage0_partitioned, f.same_weights):  # stage 3's half alone was observed
        return "NOT OBSERVABLE", replace(f, stage0_unfinished=status(dense),
                                         observe=how_to_observe(dense, "stage 0", counted[0]))
    return "PASS", f


def checksum_gap(a: float | None, b: float | None) -> float | None:
    """How far apart two weights checksums are, relative to the larger, as math.isclose measures it; None without
    both."""
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0


def say_partitioning(f: Partitioning) -> str:
    if not f.counted:
        return "stage 3 reported no partitioning"
    text = (f"stage 3 partitions {f.partitioned}/{f.tensors} tensors (shards checked: "
            f"{'ok' if f.shards_ok else 'WRONG SIZES'})")
    if f.stage0_unfinished:
        return text + (f"; stage 0 did not finish ({f.stage0_unfinished}): that it partitions none, and that the "
                       f"shards hold its initial weights (checksum), are not observed; observe them {f.observe}")
    text += f", stage 0 {'failed before counting' if f.stage0_partitioned is None else f.stage0_partitioned}"
    if f.same_weights is None:
        text += "; a run failed before its checksum, so the weights were not compared"
    else:
        text += ("; the shards hold exactly stage 0's initial weights (checksum)" if f.same_weights else
                 f"; the shards do NOT hold stage 0's initial weights: their checksums are {f.weights_gap:.1e} apart "
                 f"(at most {SAME_WEIGHTS_RTOL:g})")
    return text + ("; with 1 rank each shard is the whole tensor" if f.world == 1 else "")


# -----------------------------------------------------------------------------
# (b) memory


def unmeasured_memory(dense: Results, zero3: Results) -> Optional[Memory]:
    """Why (b) cannot judge the two runs, as figures; None where it can."""
    runs = (("stage 0", dense), ("stage 3", zero3))
    untrained = tuple(name for name, rs in runs if rs[0].steps and not rs[0].applied_steps)
    if untrained:  # before Adam's first step its states do not exist: the peak is not training's
        return Memory(untrained=untrained, skipped=max(rs[0].skipped_steps for _, rs in runs))
    uncounted = tuple(name for name, rs in runs if most(r.model_state_bytes for r in rs) is None)
    return Memory(uncounted=uncounted) if uncounted else None


def measured_memory(dense: Results, zero3: Results) -> Memory:
    """(b)'s figures of two runs that both counted their model states."""
    s0, s3 = most(r.model_state_bytes for r in dense), most(r.model_state_bytes for r in zero3)
    ideal = most(r.predicted.states for r in dense) / most(r.predicted.states for r in zero3)
    return Memory(states0=s0, states3=s3, peak0=most(r.peaks.peak_mem_bytes for r in dense),
                  peak3=most(r.peaks.peak_mem_bytes for r in zero3), predicted_states_ratio=ideal,
                  states_ok=s3 <= MEMORY_SLACK * s0 / ideal, world=zero3[0].world_size,
                  on_gpu=zero3[0].mem_kind == "cuda")


def memory(dense: Results, zero3: Results) -> tuple[str, Memory]:
    """Stage 3 finished; stage 0 finished, or ran out of memory where stage 3 fit; stage 3's model states per rank
    are within MEMORY_SLACK of stage 0's over the ratio that theory predicts of them; and on GPUs, stage 0's peak
    over stage 3's is at least the ratio that theory predicts of the two runs (memory.rank_memory) over PEAK_SLACK.

    Not observable where a run applied none of its steps or stopped before it counted its model states, with one
    rank, or without a prediction of the peak."""
    if failed(zero3):
        return "FAIL", Memory(unfinished="stage 3", status=status(zero3))
    if oom(dense):
        return "PASS", Memory(only_stage3_fits=True, cap_gib=zero3[0].run.max_mem_gib)
    if failed(dense):
        return "FAIL", Memory(unfinished="stage 0", status=status(dense))
    if unmeasured := unmeasured_memory(dense, zero3):
        return "NOT OBSERVABLE", unmeasured
    f = measured_memory(dense, zero3)
    if f.world == 1:
        return "NOT OBSERVABLE", f
    if not f.on_gpu:
        return ("PASS" if f.states_ok else "FAIL"), f
    theory = predicted_peak(dense[0]), predicted_peak(zero3[0])
    if None in theory:
        return "NOT OBSERVABLE", replace(f, no_theory=dense[0].run.model)
    predicted = theory[0] / theory[1]
    f = replace(f, predicted_peak_ratio=predicted, expected_peak_ratio=predicted / PEAK_SLACK,
                peak_ok=f.peak0 / f.peak3 >= predicted / PEAK_SLACK)
    return ("PASS" if f.states_ok and f.peak_ok else "FAIL"), f


def change(before: float, after: float) -> str:
    return f"{before / after:.2f}x less" if after <= before else f"{after / before:.2f}x more"


def say_unmeasured_memory(f: Memory) -> str:
    if f.untrained:
        return (f"{' and '.join(f.untrained)} applied none of its steps (fp16's loss scaler skipped "
                f"{f.skipped}): Adam's states, made at the first applied step, never existed, so the peak is not "
                "training's")
    return f"{' and '.join(f.uncounted)} stopped before the last step, where the model states are counted"


def say_memory(f: Memory) -> str:
    if f.unfinished:
        return f"{f.unfinished} did not finish: {f.status}"
    if f.only_stage3_fits:
        return ("stage 0 ran out of memory where stage 3 fit: only stage 3 trains this model on this hardware"
                + (f", with memory capped at {f.cap_gib} GiB per rank" if f.cap_gib else ""))
    if f.untrained or f.uncounted:
        return say_unmeasured_memory(f)
    text = (f"model states per rank {size(f.states0)} -> {size(f.states3)} ({change(f.states0, f.states3)}, "
            f"predicted {f.predicted_states_ratio:.2f}x less{'' if f.states_ok else ': MISSED'}); peak "
            f"{size(f.peak0)} -> {size(f.peak3)} ({change(f.peak0, f.peak3)}")
    if f.world == 1:
        return text + "); with 1 rank there is nothing to shard across: rehearse N ranks with `bash run.sh --ranks 4`"
    if not f.on_gpu:
        return text + "; a CPU process's peak is mostly its runtime, not judged)"
    if f.no_theory is not None:
        return text + f"; no prediction for the model {f.no_theory}, so the peak is not judged)"
    return text + (f", expected {change(1, 1 / f.expected_peak_ratio)} or better{'' if f.peak_ok else ': MISSED'}: "
                   f"theory predicts {change(1, 1 / f.predicted_peak_ratio)} for these two runs (memory.rank_memory), "
                   f"and stage 3 may hold up to {PEAK_SLACK:g}x its predicted share)")


# -----------------------------------------------------------------------------
# (d) and (e), over all runs


def promises(runs: Runs) -> Optional[tuple[str, Promises]]:
    """Every run finished, or ran out of memory (a result too); and every rank of each holds the share of
    parameters, gradients and optimizer states that its stage promises (finishing.add_shares).

    None where no run measured its shares (logs from before they were). The shares told are a run's first rank's
    that broke its promise, else its rank 0's."""
    held: dict[str, dict[str, float] | None] = {}
    broken: list[str] = []
    for name, rs in runs.items():
        if oom(rs):
            held[name] = None
        elif failed(rs):
            broken.append(f"{name} {status(rs)}")
        elif all(r.partition_check_ok is not None for r in rs):
            breaking = [r for r in rs if not r.partition_check_ok]
            held[name] = dict((breaking or rs)[0].held_fraction)
            broken += [f"{name} not as promised"] if breaking else []
    if not broken and not any(r.partition_check_ok is not None for rs in runs.values() for r in rs):
        return None  # logs from before the shares were measured
    return ("FAIL" if broken else "PASS"), Promises(held=held, broken=broken)


def say_promises(f: Promises) -> str:
    held = ", ".join(f"{name} out of memory" if shares is None
                     else f"{name} " + "/".join(f"{v:.0%}" for v in shares.values()) for name, shares in f.held.items())
    return (f"share held of params/grads/optimizer states: {held}"
            + ("; FAILED: " + ", ".join(f.broken) if f.broken else ""))


def same_training(runs: Runs) -> Optional[tuple[str, SameTraining]]:
    """Every finished run has the first step's loss of the reference among the runs with its settings
    (reference_rank's first), within FIRST_LOSS_RTOL; and its loss at every step, within LOSS_RTOL.

    None where no run has another to compare with. Settings that race show here: DeepSpeed's fast sharding for
    leaf modules on two H200s moved the first loss by up to 0.9% and later ones by up to 67%. A finished run whose
    reference did not finish is not compared, and (e) cannot PASS it."""
    ranked = sorted(((name, rs) for name, rs in runs.items() if rs), key=lambda item: reference_rank(item[1][0]))
    groups: dict[tuple, list[tuple[str, Results]]] = {}
    for name, rs in ranked:
        groups.setdefault(tuple(line_value(rs[0], key) for key in SAME_TRAINING), []).append((name, rs))
    compared, unobserved, observe = [], [], None
    for (first, first_rs), *rest in groups.values():
        finished = [(name, rs) for name, rs in [(first, first_rs), *rest] if not failed(rs)]
        if finished and failed(first_rs):  # the reference did not finish: its first finished peer is not compared
            unobserved.append((finished[0][0], first, status(first_rs)))
            observe = observe or how_to_observe(first_rs, first, finished[0][1][0])
        reference, ref = finished[0] if finished else (None, None)
        compared += [Comparison(name, reference, *loss_gaps(ref[0], rs[0])) for name, rs in finished[1:]]
    if not compared and not unobserved:
        return None
    f = SameTraining(compared=compared, unobserved=unobserved, observe=observe)
    if not all(c.same for c in compared):
        return "FAIL", f
    return ("NOT OBSERVABLE" if unobserved else "PASS"), f


def say_same_training(f: SameTraining) -> str:
    said = [f"losses against the reference (at most {FIRST_LOSS_RTOL:.3%} apart at step 1, {LOSS_RTOL:.0%} at any "
            "step): " + ", ".join(f"{c.run} {c.step1_gap:.3%} at step 1 and {c.largest_gap:.2%} at most from "
                                  f"{c.reference}" for c in f.compared)] if f.compared else []
    if f.unobserved:
        said.append(", ".join(f"{run} is not compared, as its reference {reference} did not finish ({why})"
                              for run, reference, why in f.unobserved) + f"; observe it {f.observe}")
    text = "; ".join(said)
    differ = [f"{c.run} and {c.reference} DIFFER" for c in f.compared if not c.same]
    return text + ("; MISSED: " + ", ".join(differ) if differ else "")


CRITERIA = [
    Criterion("(a) stage 3 partitions every parameter tensor, stage 0 none", PAIR, partitioning, say_partitioning,
              every_rank=True),
    Criterion("(b) stage 3 holds far less per rank than stage 0", PAIR, memory, say_memory, every_rank=True),
    Criterion(f"(c) the loss of one batch falls at each of the first {FALLING_STEPS} steps, alike at both stages",
              PAIR, loss, say_loss),
    Criterion("(d) every run holds what its stage promises", ALL_RUNS, promises, say_promises, every_rank=True),
    Criterion("(e) every run trains the same model", ALL_RUNS, same_training, say_same_training),
]


def pair_labels() -> str:
    """The pair criteria's labels, "(a) to (c)" where their letters run on, for the line that judges none."""
    labels = [c.name.split()[0] for c in CRITERIA if c.scope == PAIR]
    run_on = [ord(label[1]) - ord(labels[0][1]) for label in labels] == list(range(len(labels)))
    return f"{labels[0]} to {labels[-1]}" if run_on and len(labels) > 2 else ", ".join(labels)


# -----------------------------------------------------------------------------
# the verdict


def lost_ranks(runs: Runs) -> dict[str, list[int]]:
    """{run: the ranks that wrote no complete RESULT line} of the runs that look finished (reading.unaccounted)."""
    return {name: lost for name, rs in runs.items() if (lost := unaccounted(rs))}


def say_lost(lost: dict[str, list[int]]) -> str:
    return "; " + ", ".join(f"{name} rank(s) {' '.join(map(str, ranks))}" for name, ranks in lost.items()) + \
        " wrote no complete RESULT line (cut off, garbled, mistyped, missing, twice or beyond the world): not judged"


def judged(criterion: Criterion, *runs: Results | Runs) -> list[Check]:
    """[Check] for one criterion, or [] where it has nothing to judge. A criterion of every
    rank judges the ranks that reported: what it finds wrong stands, but it cannot PASS a run with a rank
    unaccounted."""
    found = criterion.judge(*runs)
    if found is None:
        return []
    named = runs[0] if len(runs) == 1 else {"stage 0": runs[0], "stage 3": runs[1]}
    lost = lost_ranks(named) if criterion.every_rank else {}
    state = "NOT OBSERVABLE" if lost and found[0] == "PASS" else found[0]
    defects = known_defects(criterion.name, list(named.values())) if state == "FAIL" else ""
    sentence = criterion.say(found[1]) + (say_lost(lost) if lost else "") + defects
    return [Check(criterion.name, state, sentence, found[1])]


def check_pair(dense: Results, zero3: Results) -> list[Check]:
    """The checks of one stage-0 run against one stage-3 run."""
    if not dense or not zero3:  # a run that crashed without a result fails (d) instead
        return [Check(pair_labels(), "NOT OBSERVABLE", f"no plain stage-{0 if not dense else 3} run with this "
                                                        "number of ranks; the criteria compare the two")]
    differ = [key for key in SAME_IN_BOTH if line_value(dense[0], key) != line_value(zero3[0], key)]
    if differ:
        return [Check("the two runs are comparable", "FAIL", "they differ in " + ", ".join(differ))]
    return [row for c in CRITERIA if c.scope == PAIR for row in judged(c, dense, zero3)]


def verdict(runs: Runs) -> tuple[dict[str, list[Check]], str]:
    """{scope: [Check]}, one scope per number of ranks with a stage-0 and a stage-3
    run, and one for all runs; and the overall status: FAIL if any check fails, PASS if some number of ranks
    passes every pair criterion, NOT OBSERVABLE otherwise (one rank, or no stage-0 and stage-3 pair)."""
    checks = {f"{world} rank(s)": check_pair(*pair) for world, pair in sorted(pairs(runs).items())}
    checks[ALL_RUNS] = [row for c in CRITERIA if c.scope == ALL_RUNS for row in judged(c, runs)]
    if not any(pairs(runs).values()):
        unpaired = "no stage-0 and plain stage-3 runs with the same number of ranks; the criteria compare the two"
        checks[ALL_RUNS].append(Check(pair_labels(), "NOT OBSERVABLE", unpaired))
    checks = {scope: rows for scope, rows in checks.items() if rows}
    if "FAIL" in {c.status for rows in checks.values() for c in rows}:
        return checks, "FAIL"
    passed = any(all(c.status == "PASS" for c in rows) for scope, rows in checks.items() if scope != ALL_RUNS)
    unobserved = any(c.status == "NOT OBSERVABLE" for c in checks.get(ALL_RUNS, []))  # a rank unaccounted in (d)
    return checks, "PASS" if passed and not unobserved else "NOT OBSERVABLE"


def verdict_lines(checks: dict[str, list[Check]]) -> list[str]:
    lines = []
    for scope, rows in checks.items():
        if len(checks) > 2:  # several numbers of ranks
            lines.append(f"{scope}:")
        lines += [f"{c.status:>14}  {c.criterion}: {c.detail}" for c in rows]
    return lines


def interruption(runs: Runs, deaths: list[str]) -> str | None:
    """The signal that interrupted the run, as run.sh (RUN_SIGNAL, a number) or a rank tells it; else None. A
    rank that died is a failure, not an interruption, though the launcher then stops its peers with SIGTERM."""
    number = os.environ.get("RUN_SIGNAL")
    if number or os.environ.get("RUN_COMMAND"):  # run.sh knows whether it was signalled
        return signal.Signals(int(number)).name if number else None
    ranks = [r for rs in runs.values() for r in rs]
    if deaths or any(r.oom or r.error and not r.interrupted_by for r in ranks):
        return None
    return next((r.interrupted_by for r in ranks if r.interrupted_by), None)


def progress_lines(runs: Runs) -> list[str]:
    """How far each run got, and which runs never started (RUN_SKIPPED, from run.sh)."""
    lines = [f"{name} {rs[0].applied_steps} of {rs[0].run.steps_planned or '?'} steps"
             + (f" ({rs[0].skipped_steps} more skipped)" if rs[0].skipped_steps else "") if rs else f"{name} no result"
             for name, rs in runs.items()]
    skipped = os.environ.get("RUN_SKIPPED", "").split()
    return lines + ([f"not started: {' '.join(skipped)}"] if skipped else [])
