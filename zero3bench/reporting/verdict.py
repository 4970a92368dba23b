"""
The verdict: each criterion is a function that judges runs and returns its status and its figures; a separate
function composes the sentence that tells them. CRITERIA lists them with their scope:

    pair      one stage-0 run against one stage-3 run with the same number of ranks. The verdict PASSes
              when every pair criterion passes at some number of ranks.
    all runs  every run of the folder. These can only make the verdict FAIL, never PASS it.

A new criterion costs its judging function, its sentence, one line in CRITERIA, and its test (docs/layout.md).
"""
import math
import os
import signal
from dataclasses import dataclass
from typing import Callable

from zero3bench import options
from zero3bench.formatting import size
from .defects import known_defects
from .reading import failed, first, most, oom, pairs, plain, reference_rank, status, unaccounted
from .theory import PEAK_SLACK, predicted_peak

# Stage 3's model states per rank, as a fraction of stage 0's, may exceed the predicted fraction (1/G,
# plus the persistent parameters) by this factor before (b) fails.
MEMORY_SLACK = 1.25
# Both runs of a comparison must agree on these, or they compare different things.
SAME_IN_BOTH = ("model", "world_size", "micro_batch", "seq", "dtype", "seed", "checkpoint", "compile", "max_mem_gib")
# The same settings, compiled or not: compiling must not change the losses (engine.compile raced on two H200s:
# BENCHMARKS.md). FSDP2 is set against the stage-3 runs that agree on these.
SAME_COMPILED_OR_NOT = tuple(key for key in SAME_IN_BOTH if key != "compile")
# (e) compares the losses of runs that agree on these.
SAME_TRAINING = SAME_COMPILED_OR_NOT + ("lr", "warmup")
# Both stages train the same model on the same data with the same recipe, so their losses differ only by
# rounding, at every step.
LOSS_RTOL = 0.01
# After the steps on one batch, the weights of the two stages, as weights_checksum sums them, differ only where
# bf16 rounds an update differently: by 7.6e-6 to 2.1e-4 on 2 CPU ranks (seeds 0-2); a planted 1% perturbation of
# one rank's shard moved them by far more, and the losses by only 0.17%.
WEIGHTS_RTOL = 1e-3
# The first step's loss is one forward pass over the same weights and batch: runs differ there only in the
# order of sums, at most 7.8e-5 apart over the 1.3b runs in benchmarks/logs/, across versions of this code.
FIRST_LOSS_RTOL = 2e-4
# The loss must fall at each of the first steps, which train on the same rows, and never return to the first
# step's later on.
FALLING_STEPS = options.SAME_ROWS_STEPS
# The acceptance check: "the loss falls from about 10 to below about 8 within the first steps" (1.3b model).
DESIGN_LOSS = {"model": "1.3b", "step": 3, "below": 8.0}
PAIR, ALL_RUNS = "pair", "all runs"


@dataclass(frozen=True)
class Criterion:
    name: str
    scope: str  # PAIR: judge(dense, zero3); ALL_RUNS: judge(runs), None where nothing applies
    judge: Callable  # -> (status, figures)
    say: Callable  # figures -> the sentence
    every_rank: bool = False  # judges each rank: cannot PASS while a rank of a run it judges is unaccounted


# -----------------------------------------------------------------------------
# (a) partitioning


def partitioning(dense, zero3):
    counted = [r for r in zero3 if r.partitioned_tensors is not None]  # a rank that failed early counted nothing
    if not counted:
        return "FAIL", {"counted": False}
    # stage 0 may have run out of memory before it counted anything; what it did count must be nothing
    counted0 = [r.partitioned_tensors for r in dense if r.partitioned_tensors is not None]
    a, b = dense[0].weights_checksum, counted[0].weights_checksum
    f = {"counted": True, "partitioned": counted[0].partitioned_tensors, "tensors": counted[0].param_tensors,
         "shards_ok": all(r.shard_check_ok for r in counted), "stage0": counted0[0] if counted0 else None,
         "same_weights": math.isclose(a, b, rel_tol=1e-9) if a is not None and b is not None else None,
         "world": counted[0].world_size}
    whole = all(r.partitioned_tensors == r.param_tensors > 0 and r.shard_check_ok for r in counted)
    return ("PASS" if whole and not any(counted0) and f["same_weights"] is not False else "FAIL"), f


def say_partitioning(f):
    if not f["counted"]:
        return "stage 3 reported no partitioning"
    text = (f"stage 3 partitions {f['partitioned']}/{f['tensors']} tensors (shards checked: "
            f"{'ok' if f['shards_ok'] else 'WRONG SIZES'}), stage 0 "
            f"{'failed before counting' if f['stage0'] is None else f['stage0']}")
    if f["same_weights"] is None:
        text += "; a run failed before its checksum, so the weights were not compared"
    else:
        text += f"; the shards hold {'exactly' if f['same_weights'] else 'NOT'} stage 0's initial weights (checksum)"
    return text + ("; with 1 rank each shard is the whole tensor" if f["world"] == 1 else "")


# -----------------------------------------------------------------------------
# (b) memory


def unmeasured_memory(dense, zero3):
    """Why (b) cannot judge the two runs, as figures; None where it can."""
    runs = (("stage 0", dense), ("stage 3", zero3))
    untrained = [name for name, rs in runs if rs[0].steps and not rs[0].applied_steps]
    if untrained:  # before Adam's first step its states do not exist: the peak is not training's
        return {"untrained": untrained, "skipped": max(rs[0].skipped_steps for _, rs in runs)}
    uncounted = [name for name, rs in runs if most(r.model_state_bytes for r in rs) is None]
    return {"uncounted": uncounted} if uncounted else None


def memory(dense, zero3):
    if failed(zero3):
        return "FAIL", {"unfinished": "stage 3", "status": status(zero3)}
    if oom(dense):
        return "PASS", {"only_stage3_fits": True, "cap": zero3[0].max_mem_gib}
    if failed(dense):
        return "FAIL", {"unfinished": "stage 0", "status": status(dense)}
    if unmeasured := unmeasured_memory(dense, zero3):
        return "NOT OBSERVABLE", unmeasured
    f = {"s0": most(r.model_state_bytes for r in dense), "s3": most(r.model_state_bytes for r in zero3),
         "p0": most(r.peak_mem_bytes for r in dense), "p3": most(r.peak_mem_bytes for r in zero3),
         "ideal": most(r.predicted_model_state_bytes for r in dense) / most(r.predicted_model_state_bytes
                                                                             for r in zero3),
         "world": zero3[0].world_size, "on_gpu": zero3[0].mem_kind == "cuda"}
    f["states_ok"] = f["s3"] <= MEMORY_SLACK * f["s0"] / f["ideal"]
    if f["world"] == 1:
        return "NOT OBSERVABLE", f
    if not f["on_gpu"]:
        return ("PASS" if f["states_ok"] else "FAIL"), f
    theory = predicted_peak(dense[0]), predicted_peak(zero3[0])
    if None in theory:
        return "NOT OBSERVABLE", {**f, "no_theory": dense[0].model}
    f["predicted"] = theory[0] / theory[1]
    f["expected"] = f["predicted"] / PEAK_SLACK
    f["peak_ok"] = f["p0"] / f["p3"] >= f["expected"]
    return ("PASS" if f["states_ok"] and f["peak_ok"] else "FAIL"), f


def change(before, after):
    return f"{before / after:.2f}x less" if after <= before else f"{after / before:.2f}x more"


def say_unmeasured_memory(f):
    if "untrained" in f:
        return (f"{' and '.join(f['untrained'])} applied none of its steps (fp16's loss scaler skipped "
                f"{f['skipped']}): Adam's states, made at the first applied step, never existed, so the peak is not "
                "training's")
    return f"{' and '.join(f['uncounted'])} stopped before the last step, where the model states are counted"


def say_memory(f):
    if "unfinished" in f:
        return f"{f['unfinished']} did not finish: {f['status']}"
    if "only_stage3_fits" in f:
        return ("stage 0 ran out of memory where stage 3 fit: only stage 3 trains this model on this hardware"
                + (f", with memory capped at {f['cap']} GiB per rank" if f["cap"] else ""))
    if "untrained" in f or "uncounted" in f:
        return say_unmeasured_memory(f)
    text = (f"model states per rank {size(f['s0'])} -> {size(f['s3'])} ({change(f['s0'], f['s3'])}, predicted "
            f"{f['ideal']:.2f}x less{'' if f['states_ok'] else ': MISSED'}); peak {size(f['p0'])} -> {size(f['p3'])} "
            f"({change(f['p0'], f['p3'])}")
    if f["world"] == 1:
        return text + "); with 1 rank there is nothing to shard across: rehearse N ranks with `bash run.sh --ranks 4`"
    if not f["on_gpu"]:
        return text + "; a CPU process's peak is mostly its runtime, not judged)"
    if "no_theory" in f:
        return text + f"; no prediction for the model {f['no_theory']}, so the peak is not judged)"
    return text + (f", expected {change(1, 1 / f['expected'])} or better{'' if f['peak_ok'] else ': MISSED'}: "
                   f"theory predicts {change(1, 1 / f['predicted'])} for these two runs (predict.rank_memory), "
                   f"and stage 3 may hold up to {PEAK_SLACK:g}x its predicted share)")


# -----------------------------------------------------------------------------
# (c) the loss


def loss_falls(losses):
    """Falls at each of the first FALLING_STEPS steps, which train on the same rows, and no later step, on fresh
    rows, comes back to the first step's loss."""
    early = losses[:FALLING_STEPS]
    return (all(map(math.isfinite, losses)) and all(b < a for a, b in zip(early, early[1:]))
            and all(x < losses[0] for x in losses[FALLING_STEPS:]))


def largest_gap(a, b):
    """The largest relative difference between two runs' losses, step by step; infinite where a loss is not
    finite (max() would pass over a NaN)."""
    gaps = [abs(x - y) / abs(x) for x, y in zip(a, b)]
    return max(gaps, default=0.0) if all(map(math.isfinite, gaps)) else math.inf


def loss_gaps(a, b):
    """How far run b's losses are from run a's: at step 1, at any step, and whether both are within bounds."""
    a, b = a.trained_losses or [], b.trained_losses or []
    step1, anywhere = largest_gap(a[:1], b[:1]), largest_gap(a, b)
    return step1, anywhere, step1 <= FIRST_LOSS_RTOL and anywhere <= LOSS_RTOL


def weights_apart(a, b):
    """How far apart two runs' weights are after the steps on one batch (a checksum, which a fault too small to
    move the loss past LOSS_RTOL still moves); None where a run has no checksum."""
    x, y = a.trained_checksum, b.trained_checksum
    return abs(x - y) / abs(x) if x and y else None


def loss(dense, zero3):
    if failed(zero3):
        return "FAIL", {"unfinished": status(zero3)}
    finished = {"stage 3": zero3} if failed(dense) else {"stage 0": dense, "stage 3": zero3}
    f = {"losses": {name: rs[0].trained_losses or [] for name, rs in finished.items()},
         "skipped": {name: rs[0].skipped_steps for name, rs in finished.items() if rs[0].skipped_steps}}
    f["not_falling"] = [name for name, losses in f["losses"].items() if not loss_falls(losses)]
    if len(finished) == 2:
        f["gap"], f["apart"] = largest_gap(*f["losses"].values()), weights_apart(dense[0], zero3[0])
    f["steps"] = min(len(losses) for losses in f["losses"].values())
    if zero3[0].model == DESIGN_LOSS["model"] and len(f["losses"]["stage 3"]) >= DESIGN_LOSS["step"]:
        f["at_design_step"] = {name: losses[DESIGN_LOSS["step"] - 1] for name, losses in f["losses"].items()
                               if len(losses) >= DESIGN_LOSS["step"]}
    f["misses"] = loss_misses(f)
    if f["steps"] < FALLING_STEPS and not f["misses"]:
        return "NOT OBSERVABLE", f
    return ("FAIL" if f["misses"] else "PASS"), f


def loss_misses(f):
    """What (c) found wrong, in words."""
    misses = [f"{name} does not fall as it should" for name in f["not_falling"]]
    if f.get("gap") is not None and f["gap"] > LOSS_RTOL:
        misses.append(f"the stages DIFFER by {f['gap']:.2%}")
    if f.get("apart") is not None and f["apart"] > WEIGHTS_RTOL:
        misses.append(f"the weights DIFFER by {f['apart']:.3%}")
    return misses + [f"{name} is at {x:.3f} at step {DESIGN_LOSS['step']}"
                     for name, x in f.get("at_design_step", {}).items() if not x < DESIGN_LOSS["below"]]


def say_loss(f):
    if "unfinished" in f:
        return f"stage 3 did not finish: {f['unfinished']}"
    text = "; ".join(f"{name} {' -> '.join(f'{x:.3f}' for x in losses)}" for name, losses in f["losses"].items())
    if f.get("skipped"):  # logs from before steps were marked applied have none
        text += " (the applied steps; skipped as fp16's loss scale overflowed: " + ", ".join(
            f"{name} {n}" for name, n in f["skipped"].items()) + ")"
    if "gap" in f:
        text += f"; the stages agree to {f['gap']:.2%} at every step (at most {LOSS_RTOL:.0%})"
        if f["apart"] is not None:
            text += f", and their weights after step {FALLING_STEPS} to {f['apart']:.3%} (at most {WEIGHTS_RTOL:.1%})"
    misses = f["misses"]
    if f["steps"] < FALLING_STEPS and not misses:
        return text + (f"; {f['steps']} step(s) applied, and (c) judges the first {FALLING_STEPS}: "
                       f"give --steps {FALLING_STEPS} or more" + (f", or a loss scale that overflows less (at most "
                                                                   f"{options.MAX_SKIPPED_STEPS} steps are skipped)"
                                                                   if f.get("skipped") else ""))
    if "at_design_step" in f:
        text += f"; below {DESIGN_LOSS['below']:g} by step {DESIGN_LOSS['step']}, as the acceptance check expects"
    return text + ("; MISSED: " + ", ".join(misses) if misses else "")


# -----------------------------------------------------------------------------
# (d) and (e), over all runs


def promises(runs):
    """Every run finished, or ran out of memory (a result too), and its ranks hold the share of parameters,
    gradients and optimizer states that their stage promises (result.add_shares)."""
    held, broken = [], []
    for name, rs in runs.items():
        if oom(rs):
            held.append((name, None))
        elif failed(rs):
            broken.append(f"{name} {status(rs)}")
        elif all(r.partition_check_ok is not None for r in rs):
            held.append((name, list(rs[0].held_fraction.values())))
            broken += [] if all(r.partition_check_ok for r in rs) else [f"{name} not as promised"]
    if not broken and not any(r.partition_check_ok is not None for rs in runs.values() for r in rs):
        return None  # logs from before the shares were measured
    return ("FAIL" if broken else "PASS"), {"held": held, "broken": broken}


def say_promises(f):
    held = ", ".join(f"{name} out of memory" if shares is None else f"{name} " + "/".join(f"{v:.0%}" for v in shares)
                     for name, shares in f["held"])
    return (f"share held of params/grads/optimizer states: {held}"
            + ("; FAILED: " + ", ".join(f["broken"]) if f["broken"] else ""))


def same_training(runs):
    """Every finished run trains the same model as the reference among the runs with its settings
    (reference_rank's first): the same first-step loss within FIRST_LOSS_RTOL, and the same losses within
    LOSS_RTOL at every step. Settings that race show here: DeepSpeed's fast sharding for leaf modules on two
    H200s moved the first loss by up to 0.9% and later ones by up to 67%."""
    finished = sorted(((name, rs[0]) for name, rs in runs.items() if not failed(rs)),
                      key=lambda item: reference_rank(item[1]))
    references, compared = {}, []
    for name, r in finished:
        reference, ref = references.setdefault(tuple(getattr(r, key) for key in SAME_TRAINING), (name, r))
        if ref is not r:
            compared.append((name, reference, *loss_gaps(ref, r)))
    if not compared:
        return None
    return ("PASS" if all(same for *_, same in compared) else "FAIL"), {"compared": compared}


def say_same_training(f):
    text = (f"losses against the reference (at most {FIRST_LOSS_RTOL:.3%} apart at step 1, {LOSS_RTOL:.0%} at any "
            "step): " + ", ".join(f"{name} {step1:.3%} at step 1 and {anywhere:.2%} at most from {reference}"
                                  for name, reference, step1, anywhere, _ in f["compared"]))
    differ = [f"{name} and {reference} DIFFER" for name, reference, *_, same in f["compared"] if not same]
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


# -----------------------------------------------------------------------------
# the verdict


def lost_ranks(runs):
    """{run: the ranks that wrote no complete RESULT line} of the runs that look finished (reading.unaccounted)."""
    return {name: lost for name, rs in runs.items() if (lost := unaccounted(rs))}


def say_lost(lost):
    return "; " + ", ".join(f"{name} rank(s) {' '.join(map(str, ranks))}" for name, ranks in lost.items()) + \
        " wrote no complete RESULT line (cut off, garbled, mistyped, missing, twice or beyond the world): not judged"


def judged(criterion, *runs):
    """[(name, status, sentence)] for one criterion, or [] where it has nothing to judge. A criterion of every
    rank judges the ranks that reported: what it finds wrong stands, but it cannot PASS a run with a rank
    unaccounted."""
    found = criterion.judge(*runs)
    if found is None:
        return []
    named = runs[0] if len(runs) == 1 else {"stage 0": runs[0], "stage 3": runs[1]}
    lost = lost_ranks(named) if criterion.every_rank else {}
    state = "NOT OBSERVABLE" if lost and found[0] == "PASS" else found[0]
    defects = known_defects(criterion.name, list(named.values())) if state == "FAIL" else ""
    return [(criterion.name, state, criterion.say(found[1]) + (say_lost(lost) if lost else "") + defects)]


def check_pair(dense, zero3):
    """[(criterion, status, sentence)] for one stage-0 run against one stage-3 run."""
    if not dense or not zero3:  # a run that crashed without a result fails (d) instead
        return [("(a) to (c)", "NOT OBSERVABLE", f"no plain stage-{0 if not dense else 3} run with this number of "
                                                 "ranks; the criteria compare the two")]
    differ = [key for key in SAME_IN_BOTH if getattr(dense[0], key) != getattr(zero3[0], key)]
    if differ:
        return [("the two runs are comparable", "FAIL", "they differ in " + ", ".join(differ))]
    return [row for c in CRITERIA if c.scope == PAIR for row in judged(c, dense, zero3)]


def verdict(runs):
    """{scope: [(criterion, status, sentence)]}, one scope per number of ranks with a stage-0 and a stage-3
    run, and one for all runs; and the overall status: FAIL if any check fails, PASS if some number of ranks
    passes every pair criterion, NOT OBSERVABLE otherwise (one rank, or no stage-0 and stage-3 pair)."""
    checks = {f"{world} rank(s)": check_pair(*pair) for world, pair in sorted(pairs(runs).items())}
    checks[ALL_RUNS] = [row for c in CRITERIA if c.scope == ALL_RUNS for row in judged(c, runs)]
    if not any(pairs(runs).values()):
        checks[ALL_RUNS].append(("(a) to (c)", "NOT OBSERVABLE", "no stage-0 and plain stage-3 runs with the same "
                                                                 "number of ranks; the criteria compare the two"))
    checks = {scope: rows for scope, rows in checks.items() if rows}
    if "FAIL" in {state for rows in checks.values() for _, state, _ in rows}:
        return checks, "FAIL"
    passed = any(all(s == "PASS" for _, s, _ in rows) for scope, rows in checks.items() if scope != ALL_RUNS)
    unobserved = any(s == "NOT OBSERVABLE" for _, s, _ in checks.get(ALL_RUNS, []))  # a rank unaccounted in (d)
    return checks, "PASS" if passed and not unobserved else "NOT OBSERVABLE"


def verdict_lines(checks):
    lines = []
    for scope, rows in checks.items():
        if len(checks) > 2:  # several numbers of ranks
            lines.append(f"{scope}:")
        lines += [f"{state:>14}  {name}: {detail}" for name, state, detail in rows]
    return lines


def interruption(runs, deaths):
    """The signal that interrupted the run, as run.sh (RUN_SIGNAL, a number) or a rank tells it; else None. A
    rank that died is a failure, not an interruption, though the launcher then stops its peers with SIGTERM."""
    number = os.environ.get("RUN_SIGNAL")
    if number or os.environ.get("RUN_COMMAND"):  # run.sh knows whether it was signalled
        return signal.Signals(int(number)).name if number else None
    ranks = [r for rs in runs.values() for r in rs]
    if deaths or any(r.oom or r.error and not r.interrupted_by for r in ranks):
        return None
    return next((r.interrupted_by for r in ranks if r.interrupted_by), None)


def progress_lines(runs):
    """How far each run got, and which runs never started (RUN_SKIPPED, from run.sh)."""
    lines = [f"{name} {rs[0].applied_steps} of {rs[0].steps_planned or '?'} steps"
             + (f" ({rs[0].skipped_steps} more skipped)" if rs[0].skipped_steps else "") if rs else f"{name} no result"
             for name, rs in runs.items()]
    skipped = os.environ.get("RUN_SKIPPED", "").split()
    return lines + ([f"not started: {' '.join(skipped)}"] if skipped else [])
