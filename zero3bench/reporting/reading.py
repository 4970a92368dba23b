"""
The ranks' results from a results folder's logs, as result.RankResult, and what each run says: whether it
finished, how, and which runs the criteria set side by side. A run is the list of its ranks' results.
"""
import json
import re
import signal
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from zero3bench import parts
from zero3bench.accounting.shapes import smaller_presets
from zero3bench.exits import EXIT, SIGNALS
from zero3bench.reporting import deaths
from zero3bench.result import LINE_TYPES, RankResult, most
from zero3bench.stages import DENSE, ZERO3, is_own_config

NOTHING = RankResult()  # what first() gives for a run without results: every figure at its default
Results = list[RankResult]  # a run: its ranks' results
Runs = dict[str, Results]  # a folder's runs, by log name


# A typed part's field holds its record on a RESULT line
LINE_KINDS = dict.fromkeys(parts.ONE, (dict,))


def held_types(hint: Any) -> tuple[type, ...] | None:
    """The classes of a field's value where it holds one: X for X | None (a run's setting that a log may lack, a
    part that a rank may not have measured), X and Y for X | Y | None, an int too where a float is; None for a
    hint that names no class (Any)."""
    kinds = [get_origin(kind) or kind for kind in (get_args(hint) if isinstance(hint, UnionType) else (hint,))
             if kind is not NoneType]
    return (*kinds, *([int] if float in kinds else [])) if all(isinstance(k, type) for k in kinds) else None


def mistyped(d: dict[str, Any]) -> bool:
    """Whether a RESULT record holds a value of another kind than its field's (a number in quotes, steps that are
    not a list of records), which every reader after this one would trip on."""
    for key, hint in LINE_TYPES.items():
        value, kinds = d.get(key), LINE_KINDS.get(key) or held_types(hint)
        if value is not None and kinds and (
                not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            return True
    return not all(isinstance(s, dict) for s in d.get("steps") or [])


def parsed(line: str) -> RankResult | None:
    """The result of one RESULT line, or None where the line is cut off, garbled or mistyped: its rank is then
    unaccounted."""
    try:
        d = json.loads(line.partition("RESULT ")[2])  # the launcher may put a host name before the line
        r = RankResult.from_dict(d) if isinstance(d, dict) and not mistyped(d) else None
    except (ValueError, TypeError, AttributeError):  # AttributeError: a part's record that is no record
        return None
    return r if r is not None and isinstance(r.rank, int) and isinstance(r.world_size, int) else None


def log_text(log: str | Path) -> str:
    """A log's text; "" where it cannot be read (a folder in its place, no permission): its run has no result."""
    try:
        return Path(log).read_text(errors="replace")
    except OSError:
        return ""


def read_results(log: str | Path) -> Results:
    """The results of one log, one per rank that wrote a complete RESULT line, by rank."""
    lines = log_text(log).splitlines()
    found = [r for r in (parsed(line) for line in lines if "RESULT {" in line) if r is not None]
    return sorted(found, key=lambda r: r.rank)


def read_command(log: str | Path) -> str | None:
    """The launch command that run.sh writes as a log's first line."""
    first_line = log_text(log).partition("\n")[0]
    return first_line.partition("COMMAND ")[2] or None


def read_sized(log: str | Path) -> dict[str, Any] | None:
    """The memory that run.sh sized a rehearsal for (launches.Rehearsal.record), from its SIZED line; None where
    it sized none."""
    line = next((line for line in log_text(log).splitlines() if line.startswith("SIZED {")), None)
    try:
        return json.loads(line.partition(" ")[2]) if line else None
    except json.JSONDecodeError:
        return None


def read_marks(log: str | Path) -> dict[str, float]:
    """run.sh's marks in a log: when it launched the run and when the launcher ended, with its exit status."""
    marks: dict[str, float] = {}
    for line in log_text(log).splitlines():
        word, _, rest = line.partition(" ")
        if word in ("LAUNCHED", "ENDED") and rest:
            marks[word.lower()] = float(rest.split()[0])
            if word == "ENDED":
                marks["status"] = int(rest.split()[1])
    return marks


def dead_rank(log: str | Path, results: Results) -> str | None:
    """The first rank that the launcher saw end with a failure that no result explains (not one of train_gpt.py's
    own statuses), by rank and node, and how it ended (reporting.deaths reads each launcher's words); None where
    the launcher tells of none."""
    own = [*EXIT.values(), *(128 + n for n in SIGNALS.values())]
    host = first(results).env and first(results).env.host
    told = deaths.told(log_text(log), first(results).launcher, {r.rank for r in results}, host)
    found = next((death for death in told if death[2] not in own), None)
    if not found:
        return None
    rank, node, code = found
    ranks = f"rank {rank}" if isinstance(rank, int) else "one of ranks " + ", ".join(map(str, rank))
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return f"{ranks} on {node} ended first, {how} (the launcher's report)"


def natural(name: str) -> list[int | str]:
    """Sort key that puts stage3_8ranks before stage3_16ranks."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def load_runs(folder: str | Path) -> Runs:
    """{log name: results} for every log in a results folder, in run.sh's order (stage, then ranks)."""
    return {log.stem: read_results(log) for log in sorted(Path(folder).glob("*.log"), key=lambda p: natural(p.stem))}


# -----------------------------------------------------------------------------
# what each run says


def first(results: Results) -> RankResult:
    """Rank 0's result, which holds the run's settings; NOTHING for a run without results."""
    return results[0] if results else NOTHING


def failed(results: Results) -> bool:
    return not results or any(r.oom or r.error for r in results)


def oom(results: Results) -> bool:
    return any(r.oom for r in results)


def how_to_observe(reference: Results, name: str, r: RankResult) -> str:
    """How to observe what compares r's run with the reference run name, which did not finish: where it ran out of
    memory, with fewer ranks a GPU (a rehearsal's) or a smaller model."""
    if not oom(reference):
        return f"once {name} finishes"
    ways = [f"fewer ranks a GPU (`--ranks {r.world_size - 1}`)"] if r.rehearsal and r.world_size > 2 else []
    smaller = smaller_presets(r.run.model or "")
    ways.append(f"a smaller model (`--model {smaller[0]}`)" if smaller else "a smaller model")
    return f"where {name} fits: " + " or ".join(ways)


def status(results: Results) -> str:
    if not results:
        return "no result"
    if oom(results):
        return "OOM"
    if any(r.error and not r.interrupted_by for r in results):
        return "error"
    if first(results).interrupted_by:
        return f"interrupted by {first(results).interrupted_by} after {len(results[0].steps)} step(s)"
    if failed(results):
        return "error"
    if first(results).diverged:
        return f"diverged at step {len(results[0].steps)}"
    lost = unaccounted(results)
    return f"rank(s) {' '.join(map(str, lost))} wrote no complete RESULT" if lost else "ok"


def unaccounted(results: Results) -> list[int]:
    """The ranks of a run that finished, as far as its results say, that wrote no complete RESULT line: a node
    that died as it wrote, a log cut off. A run that failed is judged as failed: its launcher stops the peers of
    a rank that fails before they report."""
    if failed(results):
        return []
    world, ranks = most(r.world_size for r in results), [r.rank for r in results]
    # a rank twice, beyond the world or of another world: two runs' lines in one log, or a forged one
    stray = {r.rank for r in results if ranks.count(r.rank) > 1 or not 0 <= r.rank < world or r.world_size != world}
    return sorted(set(range(world)) - set(ranks) | stray)


def offloads(results: Results) -> bool:
    return bool(results) and any((results[0].run.offload or {}).values())


def peer(results: Results) -> bool:
    """A run of FSDP2, ZeRO-3's peer, rather than of DeepSpeed."""
    return first(results).run.engine != "deepspeed"


def plain(results: Results) -> bool:
    """A DeepSpeed run without offload: what (a) to (c) and the FSDP2 lines compare."""
    return not offloads(results) and not peer(results)


def reference_rank(r: RankResult) -> tuple[bool, bool, bool, bool]:
    """Stage 0 first; then an eager run before a compiled one, a stage's own config before variants of it, and
    DeepSpeed before its peer."""
    return (r.run.stage != DENSE, bool(r.run.compile), not is_own_config(r.run.config, r.run.stage),
            r.run.engine != "deepspeed")


def same_compile(a: Results, b: Results) -> bool:
    return bool(a[0].run.compile) == bool(b[0].run.compile)


def pairs(runs: Runs) -> dict[int, tuple[Results, Results]]:
    """{world size: (stage-0 results, stage-3 results)}, at each world size the first run of each stage in
    reference_rank's order (a stage's own config before its variants), the stage-3 run compiled as stage 0's
    is or not: compiling changes the peak that (b) compares."""
    found: dict[int, tuple[Results, Results]] = {}
    for results in sorted((rs for rs in runs.values() if rs), key=lambda rs: reference_rank(rs[0])):
        if results[0].run.stage in (DENSE, ZERO3) and plain(results):
            dense, zero3 = found.setdefault(results[0].world_size, ([], []))
            if results[0].run.stage == DENSE and not dense:
                dense.extend(results)
            elif results[0].run.stage == ZERO3 and not zero3 and (not dense or same_compile(dense, results)):
                zero3.extend(results)
    return found


def speed_not_measured(runs: Runs) -> str | None:
    """Why speed means nothing in these runs, or None: CPU processes, or ranks that share a GPU."""
    ranks0 = [rs[0] for rs in runs.values() if rs]
    if any(r.mem_kind != "cuda" for r in ranks0):
        return "CPU processes"
    return "a rehearsal, ranks sharing a GPU" if any(r.rehearsal for r in ranks0) else None


# -----------------------------------------------------------------------------
# why a run did not finish


# What a log says of why its run stopped, the most telling kind first: a rank that stopped answering, a port
# taken, the launcher's own check of the hosts, a folder it could not write, memory, and then any error.
CAUSES = [re.compile(pattern) for pattern in (
    r"failed to pass monitoredBarrier", r"EADDRINUSE|[Aa]ddress already in use", r"not reachable via ssh",
    r"Read-only file system", r"[Oo]ut of memory", r"[Pp]ermission denied", r"\b\w*(Error|Exception)\b: \S",
    r"Received \d+ death signal")]  # torchrun's, where its ranks were ended before they could say (h100/10-suite)


def cause(log: str | Path) -> str | None:
    """The first line of a log that says why its run did not finish, by the most telling kind that any line
    says (CAUSES), trimmed to one screen line's worth; None where no line says."""
    lines = [line.strip() for line in log_text(log).splitlines()
             if "RESULT {" not in line and not line.startswith("COMMAND ")]
    for pattern in CAUSES:
        found = next((line for line in lines if pattern.search(line)), None)
        if found:
            return found[:240]
    return None


def cause_lines(folder: str | Path, runs: Runs) -> list[str]:
    """One line for each run that did not finish (a failure, not a signal), with the line of its log that says
    why."""
    return [f"{name} did not finish ({status(rs)}): {cause(Path(folder) / f'{name}.log') or 'its log does not say why'}"
            for name, rs in runs.items() if failed(rs) and not first(rs).interrupted_by]
