"""
Where in a step the memory goes (--timeline): rank 0's traced step of each run, measured at each hook
(parts.Timeline), against the moments that the prediction names (memory.MOMENTS, in the record's predicted moments).
One line per run for the report, and timeline.png: the runs side by side on one scale, forward, backward and the
optimizer step shaded, the predicted moments marked where they fall, and each peak named.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zero3bench import parts
from zero3bench.accounting.memory import MOMENTS, PEAK_MOMENTS
from zero3bench.formatting import signed_pct, size
from zero3bench.result import RankResult

from .reading import Runs

if TYPE_CHECKING:  # matplotlib is optional: plot() imports it where it draws
    from matplotlib.axes import Axes

# Where in its part of the step each predicted moment is marked: at its first point, its middle or its last
POSITION = {"states": "first", "gathered": "middle", "activations": "last", "backward's start": "first",
            "first bucket": "last", "prefetch": "middle", "backward's end": "first", "reduction": "last",
            "offloaded gradient": "first", "regathered": "last", "optimizer step": "last"}
SHADES = {"forward": "#dbe9f6", "backward": "#fde3c8", "optimizer": "#d9f0d3"}
WORDS = {"cuda": "allocated", "malloc": "malloc's bytes in use", "rss": "resident set"}


@dataclass(frozen=True)
class Peak:
    """Where a traced step reached its most: measured (at a point) or predicted (a moment of memory.MOMENTS)."""
    bytes: float
    part: str  # its part of the step (memory.MOMENTS' words): "forward", "the output layer's backward", ...
    what: str  # the module and event where it was measured ("lm_head gathered"), or the moment's name


@dataclass(frozen=True)
class Panel:
    """What timeline.png shows of one run, and its line in the report: rank 0's traced step."""
    name: str  # the run's log name
    r: RankResult
    points: list[parts.Point]
    measured: Peak
    predicted: Peak | None  # None where the prediction names no moments (a model activations.py does not know)
    marks: dict[str, tuple[int, float]]  # each predicted moment: the point it is marked at, and its bytes as drawn
    # what the drawing takes off the measured bytes and the predicted ones: nothing on a GPU; on a CPU, whose memory
    # holds its runtime besides, the step's start and the predicted states, so that both are drawn as a rise
    base: float
    states: float


def parts_of_step(points: list[parts.Point]) -> list[str]:
    """Each point's part of the step, in memory.MOMENTS' words: forward; backward until a block's backward starts
    (the output layer's and the loss's); the blocks'; from the first block's on (backward's end, as the model's first
    block runs its backward last); the optimizer step."""
    first = min((p.block for p in points if p.block is not None), default=None)
    said, blocks, end = [], False, False
    for p in points:
        if p.phase == "backward" and p.block is not None:
            blocks, end = True, end or p.block == first
        said.append("forward" if p.phase == "forward" else "the optimizer step" if p.phase == "optimizer" else
                    "backward's end" if end else "the blocks' backward" if blocks else "the output layer's backward")
    return said


def measured_peak(points: list[parts.Point]) -> tuple[int, Peak]:
    """The point where the step's peak was first reached (on a GPU, reached since the point before it), and the
    peak, named by the point's module and event (the engine's own points, backward's and the step's, name none)."""
    top = max(p.peak for p in points)
    i = next(i for i, p in enumerate(points) if p.peak == top)
    return i, Peak(top, parts_of_step(points)[i], f"{points[i].module} {points[i].event}".strip())


def predicted_peak(r: RankResult) -> Peak | None:
    moments = r.predicted.moments
    if not moments:
        return None
    name = max(PEAK_MOMENTS, key=lambda m: moments.get(m, 0))
    return Peak(moments[name], MOMENTS[name], name)


def marks(points: list[parts.Point], moments: dict[str, float], offset: float) -> dict[str, tuple[int, float]]:
    """Each predicted moment that holds more than the states, and the states, at its point (POSITION) of its part
    of the step, where the step has that part."""
    said, placed = parts_of_step(points), {}
    for name, at in POSITION.items():
        span = [i for i, part in enumerate(said) if part == MOMENTS[name]]
        if span and name in moments and (name == "states" or moments[name] > moments["states"]):
            index = {"first": span[0], "middle": span[len(span) // 2], "last": span[-1]}[at]
            placed[name] = (index, moments[name] + offset)
    return placed


def panel(name: str, r: RankResult) -> Panel:
    t = r.memory_timeline
    points = t.points
    _, measured = measured_peak(points)
    moments = r.predicted.moments or {}
    on_gpu = t.memory == "cuda"
    base, states = (0, 0) if on_gpu else (points[0].allocated, moments.get("states", 0))
    return Panel(name, r, points, measured, predicted_peak(r), marks(points, moments, -states), base, states)


def panels(runs: Runs) -> list[Panel]:
    """Rank 0 of each run that traced a step (the first rank that did, where rank 0 did not)."""
    found = []
    for name, results in runs.items():
        traced = [r for r in results if r.memory_timeline and r.memory_timeline.rows]
        if traced:
            found.append(panel(name, traced[0]))
    return found


def trace_cost(r: RankResult) -> str:
    """What tracing cost its step: the hooks' own seconds, of the step's."""
    t = r.memory_timeline
    hooks = f"its {len(t.rows or []) + t.left_out} hooks"
    if t.hooks_s is None:  # a trace converted from an older record
        return f"{hooks} (their time not recorded)"
    step = next((s for s in r.steps if s.step == t.step and s.traced), None)
    of = f" of the step's {step.time_s:.3f} s" if step and step.time_s is not None else ""
    return f"{hooks} took {t.hooks_s:.3f} s{of} (a traced step is not timed)"


def peak_words(p: Panel) -> tuple[str, str]:
    """The measured peak and the predicted one in words: on a GPU, what is allocated; on a CPU, which holds its
    runtime besides, the rise above the step's start (measured) and above the states (predicted)."""
    kind, start = p.r.memory_timeline.memory, p.points[0].allocated
    measured = (f"peaked at {size(p.measured.bytes)}" if kind == "cuda" else
                f"rose most, {size(p.measured.bytes - start)} above the step's start,")
    measured += f" in {p.measured.part} ({p.measured.what})"
    if p.predicted is None:
        return measured, ""
    where = "there" if p.predicted.part == p.measured.part else f"in {p.predicted.part}"
    if kind == "cuda":
        return measured, (f"predicted {size(p.predicted.bytes)} {where} ({p.predicted.what}), "
                          f"{signed_pct(p.measured.bytes / p.predicted.bytes - 1)}")
    return measured, f"predicted {size(p.predicted.bytes - p.states)} above the states {where} ({p.predicted.what})"


def line(p: Panel) -> str:
    """One run's traced step in words: where it peaked against where the prediction puts its peak, what stayed
    gathered after it, and what tracing it cost."""
    t = p.r.memory_timeline
    measured, predicted = peak_words(p)
    said = f"{p.name} rank {p.r.rank}, step {t.step}: {WORDS.get(t.memory, t.memory)} {measured}"
    said += f"; {predicted}" if predicted else ""
    if t.still_gathered:
        ended = next((q for q in reversed(p.points) if q.event == "backward done"), p.points[-1])
        said += (f"; STILL GATHERED as backward returned: {', '.join(t.still_gathered[:3])}"
                 + (f" and {len(t.still_gathered) - 3} more" if len(t.still_gathered) > 3 else "")
                 + f" ({size(ended.gathered)} of weights whole, where a healthy step holds none)")
    return f"{said}; {trace_cost(p.r)}"


def lines(runs: Runs) -> list[str]:
    found = panels(runs)
    return ["Memory through each run's traced step (--timeline):", *(f"  {line(p)}" for p in found)] if found else []


def draw(ax: Axes, p: Panel, unit: float) -> None:
    """One run's step in units of unit bytes: phases shaded, the measured curves, the predicted moments and both peaks
    named."""
    x = range(len(p.points))
    for phase, shade in SHADES.items():
        at = [i for i, q in enumerate(p.points) if q.phase == phase]
        if at:
            ax.axvspan(at[0] - 0.5, at[-1] + 0.5, color=shade, label=phase)
    ax.plot(x, [(q.allocated - p.base) / unit for q in p.points], "-", color="C0",
            label=WORDS.get(p.r.memory_timeline.memory))
    ax.plot(x, [(q.peak - p.base) / unit for q in p.points], "--", color="C0", linewidth=0.8, label="peak so far")
    if any(q.gathered for q in p.points):
        ax.plot(x, [q.gathered / unit for q in p.points], ":", color="C2", label="weights gathered")
    for name, (i, value) in p.marks.items():
        ax.plot([i], [value / unit], "_", color="C3", markersize=14, markeredgewidth=2)
        ax.annotate(name, (i, value / unit), textcoords="offset points", xytext=(3, 3), fontsize=7, color="C3")
    i, _ = measured_peak(p.points)
    ax.plot([i], [(p.measured.bytes - p.base) / unit], "*", color="black", markersize=11, label="measured peak")
    if p.predicted and p.predicted.what in p.marks:
        at, value = p.marks[p.predicted.what]
        ax.plot([at], [value / unit], "*", color="C3", markersize=11, label="predicted peak")
    measured, predicted = peak_words(p)
    ax.set_title(f"{p.name}, rank {p.r.rank} of {p.r.world_size}\nmeasured: {measured}"
                 + (f"\n{predicted}" if predicted else ""), fontsize=8)
    ax.set_xlabel(f"hooks of step {p.r.memory_timeline.step}, in order")


def picture(found: list[Panel]) -> bytes | None:
    """timeline.png of the panels, side by side on one scale; None where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("timeline.png skipped: matplotlib is not installed (pip install matplotlib)")
        return None
    fig, axes = plt.subplots(1, len(found), sharey=True, squeeze=False, figsize=(6.5 * len(found), 5.2))
    top = max(max(q.peak - p.base for q in p.points) for p in found)
    unit, label = (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")
    for ax, p in zip(axes[0], found):
        draw(ax, p, unit)
    on_gpu = all(p.r.memory_timeline.memory == "cuda" for p in found)
    axes[0][0].set_ylabel(label + ("" if on_gpu else " above the step's start (predicted: above the states)"))
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=9, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue()
