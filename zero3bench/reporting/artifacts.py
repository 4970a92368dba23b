"""
What a report leaves in a results folder: summary.json (the whole account, every rank's result in it),
summary.md (the same for a reader), memory.png, timeline.png where a run traced a step (reporting/timelines.py) and,
for run.sh, report.txt. Each is written whole or not at all.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from zero3bench.formatting import QuietWhenClosed, gib
from zero3bench.rank_lines import rank_table
from zero3bench.result import RankResult, as_dict

from .figures import Check
from .reading import Results, Runs, first, most, oom, pairs, read_command, read_marks, read_sized
from .tables import comparison_table, compile_lines, peer_lines
from .timelines import panels, picture
from .verdict import verdict_lines

if TYPE_CHECKING:  # matplotlib is optional: plot() imports it where it draws
    from matplotlib.axes import Axes


def run_environment(runs: Runs) -> dict[str, Any]:
    """The software and machines of a run, from the ranks' results: the GPUs it used or, without GPUs, its CPU
    processes (which the results count as their "gpus", the devices that share the work)."""
    ranks = [r for rs in runs.values() for r in rs if r.env]
    if not ranks:
        return {}
    env = {k: v for k, v in ranks[0].env.as_dict().items() if k != "host"}
    env["hosts"] = sorted({r.env.host for r in ranks})
    if ranks[0].mem_kind == "cuda":
        env["gpus"] = max(r.gpus for r in ranks)
    else:
        env.update(device="CPU processes", processes=max(r.world_size for r in ranks))
    return env


def span(start: float | None, end: float | None) -> float | None:
    return round(end - start, 2) if start and end else None


def run_timing(log: Path, results: Results) -> dict[str, float]:
    """Where one run's time went, in seconds, from run.sh's marks in its log and rank 0's clock."""
    marks, t = read_marks(log), (first(results).timing or {})
    parts = {"launch_and_imports_s": span(marks.get("launched"), t.get("imported")),
             "engine_start_s": span(t.get("imported"), t.get("engine_ready")),
             "steps_s": span(t.get("engine_ready"), t.get("trained")),
             "probes_s": span(t.get("trained"), t.get("probed")),
             "teardown_s": span(t.get("probed"), marks.get("ended")),
             "total_s": span(marks.get("launched"), marks.get("ended"))}
    return {k: v for k, v in parts.items() if v is not None}


def timing(folder: str | Path, runs: Runs, verdict_at: float) -> dict[str, Any]:
    """Where the time went from run.sh's start (RUN_STARTED) to the verdict: the input checks, each run, and
    the report; total_s is the whole."""
    marks = [read_marks(Path(folder) / f"{name}.log") for name in runs]
    started = float(os.environ.get("RUN_STARTED") or 0) or None
    launched = min((m["launched"] for m in marks if "launched" in m), default=None)
    ended = max((m["ended"] for m in marks if "ended" in m), default=None)
    return {"checks_s": span(started, launched),
            "runs": {name: run_timing(Path(folder) / f"{name}.log", rs) for name, rs in runs.items()},
            "report_s": span(ended, verdict_at), "total_s": span(started, verdict_at)}


def summary(folder: str | Path, runs: Runs, checks: dict[str, list[Check]], overall: str,
            verdict_at: float) -> dict[str, Any]:
    return {
        "folder": str(folder),
        "command": os.environ.get("RUN_COMMAND"),
        "commands": {name: read_command(Path(folder) / f"{name}.log") for name in runs},
        "sized_for": next(filter(None, (read_sized(Path(folder) / f"{name}.log") for name in runs)), None),
        "environment": run_environment(runs),
        "verdict": overall,
        "checks": {scope: [asdict(check) for check in rows] for scope, rows in checks.items()},
        "timing": timing(folder, runs, verdict_at),
        "results": {name: [as_dict(r) for r in rs] for name, rs in runs.items()},
    }


def without_nan(value: object) -> object:
    """JSON has no NaN or infinity (a diverged loss); write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


def summary_markdown(account: dict[str, Any], runs: Runs, checks: dict[str, list[Check]]) -> str:
    env = account["environment"]
    command = account["command"] or f"python3 report.py {account['folder']}"
    lines = [f"# ZeRO benchmark: {account['verdict']}", "", f"`{command}`", ""]
    if env:
        lines += ["| | |", "|---|---|"] + [f"| {k} | {', '.join(map(str, v)) if isinstance(v, list) else v} |"
                                            for k, v in env.items()] + [""]
    lines += ["## Commands", ""] + [f"- {name}: `{cmd}`" for name, cmd in account["commands"].items() if cmd] + [""]
    lines += ["## Comparison", "", "```", comparison_table(runs), "```", ""]
    lines += [line + "\n" for line in compile_lines(runs) + peer_lines(runs)]  # a paragraph each
    lines += ["## Verdict", "", "```", *verdict_lines(checks), "```", ""]
    for name, results in runs.items():
        if results:
            lines += [f"## {name}: each rank", "", "```", rank_table(results), "```", ""]
    return "\n".join(lines)


def draw_per_rank(ax: Axes, runs: Runs) -> int:
    """Bars per run and rank: the measured peak, the measured model states, the predicted ones, and the
    host's model states with offload. Returns the number of series."""
    bars = [(f"{name}, rank {r.rank}" + (" (OOM)" if r.oom else " (failed)" if r.error else ""), r)
            for name, results in runs.items() for r in results]
    series: list[tuple[str, Callable[[RankResult], float | None]]] = [
        ("measured peak", lambda r: r.peaks.peak_mem_bytes), ("measured model states", lambda r: r.model_state_bytes),
        ("predicted model states", lambda r: r.predicted.states)]
    if any(r.host_state_bytes for _, r in bars):
        series.append(("measured host (CPU) model states", lambda r: r.host_state_bytes))
    height = 0.8 / len(series)
    for i, (label, figure) in enumerate(series):
        ax.barh([y + (i - (len(series) - 1) / 2) * height for y in range(len(bars))],
                [gib(figure(r) or 0) for _, r in bars], height, label=label)
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    values = [gib(v) for _, r in bars for v in (r.peaks.peak_mem_bytes, r.model_state_bytes) if v]
    if values and max(values) > 100 * min(values):  # a toy model's states beside a process's runtime
        ax.set_xscale("log")
    ax.set_xlabel("GiB per rank")
    ax.set_title("Memory per rank")
    return len(series)


def draw_scaling(ax: Axes, worlds: dict[int, tuple[Results, Results]]) -> None:
    """Lines against the number of ranks G: the most any rank holds of model states at stages 0 and 3 and,
    on GPUs, both stages' peaks, beside the ideal: stage 0's model states over G."""
    sizes = sorted(worlds)
    dense_at = {g: dense for g, (dense, _) in worlds.items()}
    zero3_at = {g: zero3 for g, (_, zero3) in worlds.items()}
    base = next(filter(None, (most(r.model_state_bytes for r in dense_at[g]) for g in sizes)), None)
    if base:
        ax.plot(sizes, [gib(base) / g for g in sizes], ":", color="gray", linewidth=3,
                label="ideal: stage 0 model states / G")
    def states(r: RankResult) -> int | None:
        return r.model_state_bytes

    def peak(r: RankResult) -> int | None:
        return r.peaks.peak_mem_bytes

    lines = [("stage 0 model states", dense_at, states, "s--"), ("stage 3 model states", zero3_at, states, "o--")]
    if first(zero3_at[sizes[-1]]).mem_kind == "cuda":  # a CPU's peak RSS is mostly the runtime
        lines += [("stage 0 peak", dense_at, peak, "s-"), ("stage 3 peak", zero3_at, peak, "o-")]
    for label, run_at, figure, style in lines:
        points = [(g, gib(v)) for g in sizes if (v := most(figure(r) for r in run_at[g]))]
        if points:
            ax.plot(*zip(*points), style, label=label)
    for g in sizes:
        if oom(dense_at[g]):
            ax.annotate("stage 0: OOM", (g, gib(base or 0)), ha="right", va="bottom", color="red", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(g) for g in sizes])
    ax.set_xlabel("ranks (G)")
    ax.set_ylabel("GiB per rank (the most any rank holds)")
    ax.set_title("Memory per rank against the number of ranks")
    ax.legend(fontsize=8)


def plot(folder: str | Path, runs: Runs) -> bool:
    """memory.png: memory per run and rank; with several numbers of ranks, also memory against the number
    of ranks. Returns whether it was drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("memory.png skipped: matplotlib is not installed (pip install matplotlib)")
        return False
    worlds = pairs(runs)
    rows = sum(len(results) for results in runs.values())
    fig, axes = plt.subplots(1, 2 if len(worlds) > 1 else 1, squeeze=False,
                             figsize=(15 if len(worlds) > 1 else 9, max(4.0, 1.5 + 0.32 * rows)))
    series = draw_per_rank(axes[0][0], runs)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower left", ncol=series, fontsize=9)
    if len(worlds) > 1:
        draw_scaling(axes[0][1], worlds)
    fig.tight_layout(rect=(0, 0.04 + 0.4 / fig.get_figheight(), 1, 1))  # room for the legend below
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_whole(Path(folder) / "memory.png", png.getvalue())
    return True


def write(folder: str | Path, runs: Runs, checks: dict[str, list[Check]], overall: str, verdict_at: float) -> list[str]:
    """summary.json, summary.md, memory.png and, where a run traced a step (--timeline), timeline.png in the folder;
    returns the names of the files written."""
    account = summary(folder, runs, checks, overall, verdict_at)
    write_whole(Path(folder, "summary.json"), json.dumps(without_nan(account), indent=1, allow_nan=False).encode())
    write_whole(Path(folder, "summary.md"), summary_markdown(account, runs, checks).encode())
    written = ["summary.json", "summary.md"] + (["memory.png"] if plot(folder, runs) else [])
    traced = panels(runs)
    png = picture(traced) if traced else None
    if png:
        write_whole(Path(folder, "timeline.png"), png)
    return written + (["timeline.png"] if png else [])


def results_line(folder: str | Path, written: list[str]) -> str:
    """The last line: the folder, and the files that this report wrote, with report.txt where run.sh (which sets
    RUN_COMMAND) tees this output into it."""
    files = (["report.txt"] if os.environ.get("RUN_COMMAND") else []) + written
    return f"results: {folder}" + (f" ({', '.join(files)})" if files else "")


class NotWritten(Exception):
    """A file of the report that could not be written (a full disk, a read-only folder), in one line."""


def write_whole(path: Path, data: bytes) -> None:
    """path holds data whole or is left as it was: the data goes into a file beside it, renamed over it once
    complete, so that a full disk leaves no file cut short."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise NotWritten(f"cannot write {path}: {e.strerror or e}") from None


class Copied(io.TextIOBase):
    """The terminal's output, kept as it is shown. A terminal that is gone (`bash run.sh | head`) stops
    nothing: its later lines go to /dev/null, and the copy keeps them."""

    def __init__(self, terminal: TextIO | QuietWhenClosed) -> None:
        self.terminal, self.text = terminal, io.StringIO()

    def write(self, text: str) -> int:
        self.text.write(text)
        try:
            self.terminal.write(text)
            self.terminal.flush()
        except OSError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.terminal.fileno())
        return len(text)


def kept_in(path: Path, report: Callable[[], int]) -> int:
    """report()'s exit status, with what it prints shown and then written whole into path (run.sh's
    report.txt)."""
    terminal, sys.stdout = sys.stdout, Copied(sys.stdout)
    try:
        status = report()
        text = sys.stdout.text.getvalue()
    finally:
        sys.stdout = terminal
    write_whole(path, text.encode())
    return status
