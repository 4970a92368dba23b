"""
What moved between two results folders, run by run: the figures it tracks (TRACKED, by their rows' keys in
tables.COMPARISON, so that a new label changes nothing), and the regressions beyond a tolerance.
"""
from pathlib import Path
from typing import Any

from zero3bench.formatting import fmt, format_table, signed_pct
from zero3bench.result import RankResult, line_value

from .bounds import SAME_IN_BOTH
from .reading import Results, load_runs, status
from .tables import ROWS

# the figures that --compare follows, by key, and what a regression is: a rise or a fall (none for losses)
TRACKED = {"model_states": "rise", "peak_memory": "rise", "first_loss": None, "last_loss": None,
           "tokens_per_s": "fall", "mfu": "fall"}


def steps_trained(r: RankResult) -> int:
    """The steps a run was to train; logs from before steps_planned was recorded give the steps that ran."""
    return r.run.steps_planned or len(r.steps)


def settings(r: RankResult) -> dict[str, Any]:
    """What two runs of one name must agree on to measure the same thing: SAME_IN_BOTH, the GPUs, and the steps,
    which move the last loss and the steps that speed is timed over."""
    return {**{key: line_value(r, key) for key in (*SAME_IN_BOTH, "gpus")}, "steps": steps_trained(r)}


def compare_run(name: str, a: Results, b: Results,
                tolerance: float) -> tuple[list[tuple[str, str, str, str, str, str]], list[str]]:
    """One run in folders A and B: its table rows, and its regressions."""
    rows, regressed = [], []
    if status(a).startswith("ok") and not status(b).startswith("ok"):
        regressed.append(f"{name} no longer finishes ({status(b)})")
    differ = [key for key, value in settings(a[0]).items() if settings(b[0])[key] != value] if a and b else []
    if differ:
        regressed.append(f"{name} measured something else: it differs in {', '.join(differ)}")
    for key, bad in TRACKED.items():
        row = ROWS[key]
        label, spec = row.label, row.spec
        before, after = row.get(a), row.get(b)
        if not before or after is None:
            continue
        moved = after / before - 1
        worse = bad == "rise" and moved > tolerance / 100 or bad == "fall" and moved < -tolerance / 100
        if worse:
            regressed.append(f"{name} {label} {signed_pct(moved)}")
        rows.append((name, label, fmt(before, spec), fmt(after, spec), signed_pct(moved),
                     "REGRESSED" if worse else ""))
    return rows, regressed


def compare(a: Path, b: Path, tolerance: float) -> int:
    """Print what moved between two results folders, run by run; return 1 if memory or speed regressed
    by more than tolerance percent, a run of A is missing from B or no longer finishes, or a run measured
    something else (another model, batch, dtype, number of ranks, GPUs or steps), else 0."""
    runs_a, runs_b = load_runs(a), load_runs(b)
    rows, regressed = [("run", "figure", "A", "B", "change", "")], []
    regressed += [f"{name} is missing from B" for name in runs_a if name not in runs_b]
    for name in [n for n in runs_a if n in runs_b]:
        run_rows, run_regressed = compare_run(name, runs_a[name], runs_b[name], tolerance)
        rows, regressed = rows + run_rows, regressed + run_regressed
    print(format_table(rows))
    new = [name for name in runs_b if name not in runs_a]
    if new:
        print(f"\nin B only: {', '.join(new)}")
    print(f"\n{len(regressed)} regression(s) beyond {tolerance}%" + (": " + "; ".join(regressed) if regressed else ""))
    return 1 if regressed else 0
