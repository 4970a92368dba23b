"""Every figure of README.md that a run measured is what its committed log says, and the README links that log;
every figure that the code works out (the verdict's expected ratios, the plan's table) is what the code prints
today. DOCS holds the same for the measured figures of docs/ (page= names each one's page) and a few of
BENCHMARKS.md. A figure edited by hand, or a log or the code that changes under it, fails here.

FIGURES holds each figure as the page writes it, with {} where the value goes, the log it comes from, and a
regular expression whose groups read the value off the log (or off a command's output); `show` turns the groups
into the page's form where the two differ (seconds into minutes, say), and `read` reads a figure that several
logs make. Every other number of the README's prose is one that no run made, named in NOT_FROM_A_RUN.

A figure is also the newest of its kind: a log named for a commit (readme-fresh-clone-046398c.txt), or in a numbered
session's folder (h200/43-suite/tests.txt), has newer logs of its kind where the same path names a later commit or
session, or is not committed yet. The figure is what the newest says, unless its paragraph names, in its own words,
the commit that its log speaks of ("at 9aae04a"). After a new log of a kind, take its figures and link it (and set
the constant above, CPU_CI say, to it)."""
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from conftest import ROOT
from zero3bench import finishing, result

README = ROOT / "README.md"
LOGS = "benchmarks/logs/"
H200_DEFAULT = LOGS + "h200/36-step-time/1-default-mb2/results/20261203-125033-TaPl"
H200X2 = LOGS + "h200x2/13-fsdp2/15-final5/r/20261130-212629-JBTr"
CPU_CI = LOGS + "cpu/ci/readme-fresh-clone-1e400c5.txt"
STEP_LINE = LOGS + "cpu/ci/readme-fresh-clone-32b24d4.txt"  # docs/running.md's step line, which names its commit
HF_LLAMA = LOGS + "h200/39-hf/1-llama/results/20261204-040054-mcYy"
EVERY_PEAK = LOGS + "cpu/predict/every-peak-2420cab.txt"


@dataclass(frozen=True)
class Figure:
    text: str  # as the README writes it, {} for each value
    log: str  # the committed log, relative to the root; or a command whose output the pattern reads
    pattern: str  # its groups are the values, in the text's order
    show: Optional[Callable[..., tuple]] = None  # the groups as the README writes them
    command: bool = False  # the log is a command (run from the root), not a file
    page: str = "README.md"
    read: Optional[Callable[[], tuple]] = None  # for a figure that several logs make: the values, read off them

    def values(self, source: str) -> tuple:
        if self.read:
            return self.read()
        found = re.search(self.pattern, source, flags=re.M)
        assert found, f"{self.log} no longer has {self.pattern!r}"
        return self.show(*found.groups()) if self.show else found.groups()


def ratio(a: str, b: str) -> str:
    return f"{float(a.replace(',', '')) / float(b.replace(',', '')):.2f}x"


def minutes_seconds(s: str) -> tuple:
    return f"{int(float(s)) // 60} min {int(float(s)) % 60} s",


PEAK_ROW = r"^peak memory +([\d.]+) GiB +([\d.]+) GiB +([\d.]+) GiB$"
FIGURES = [
    # the two commands
    Figure("It took {} s on a 2-core CPU", CPU_CI, r"VERDICT: PASS\n.*\n\nreal\t(\d+)m([\d.]+)s",
           lambda m, s: (str(round(60 * int(m) + float(s))),)),
    Figure("and {} s on one H200 (", H200_DEFAULT + "/summary.json",
           r'"report_s": [\d.]+,\s*"total_s": ([\d.]+)', lambda s: (str(round(float(s))),)),
    Figure("Run the tests: {} on 2 CPU cores, {} passed and {} skipped", CPU_CI,
           r"^(\d+) passed, (\d+) skipped in ([\d.]+)s", lambda p, s, t: (*minutes_seconds(t), p, s)),
    # the answer on 2 H200s
    Figure("| DeepSpeed stage 0 | {} GiB | {} GiB | {} |", H200X2 + "/report.txt",
           r"^model states +[\d.]+ GiB +([\d.]+) GiB[\s\S]*^peak memory +[\d.]+ GiB +([\d.]+) GiB"
           r"[\s\S]*^tokens/s +[\d,]+ +([\d,]+)"),
    Figure("| DeepSpeed stage 3 | {} GiB | {} GiB | {} |", H200X2 + "/report.txt",
           r"^model states +[\d.]+ GiB +[\d.]+ GiB +([\d.]+) GiB[\s\S]*" + PEAK_ROW[:-1] + r"[\s\S]*"
           r"^tokens/s +[\d,]+ +[\d,]+ +([\d,]+)", lambda m, _a, _b, p, t: (m, p, t)),
    Figure("| PyTorch FSDP2 | {} GiB | {} GiB | {} |", H200X2 + "/report.txt",
           r"^model states +([\d.]+) GiB[\s\S]*^peak memory +([\d.]+) GiB[\s\S]*^tokens/s +([\d,]+)"),
    # stage 0's peak over stage 3's, and stage 3's tokens/s over FSDP2's
    Figure("cuts the peak {} against stage 0, and runs at {} FSDP2's tokens/s", H200X2 + "/report.txt",
           PEAK_ROW[:-1] + r"[\s\S]*^tokens/s +([\d,]+) +[\d,]+ +([\d,]+)",
           lambda _f, p0, p3, fsdp2, s3: (ratio(p0, p3), ratio(s3, fsdp2))),
    # the plan, and the versions
    Figure("within 5% of {} of the {} peaks of committed GPU runs", EVERY_PEAK, r"^\d+ rank records and \d+ timelines: "
           r"(\d+) of (\d+) within 5%"),
    Figure("torch {}, DeepSpeed {}: run.sh PASS at stages 0 to 3, {} passed (`{}`, `{}`)",
           LOGS + "cpu/ci/oldest-leg-cf5351a.txt", r"^oldest pair: torch ([\d.]+)\+\w+ deepspeed ([\d.]+)$[\s\S]*stages "
           r"\"0 1 2 3\"[\s\S]*^VERDICT: PASS[\s\S]*^\$ python3 -m pytest -q (tests/\w+\.py) (tests/\w+\.py)$\n[\s\S]*"
           r"^(\d+) passed", lambda torch, ds, a, b, passed: (torch, ds, passed, a, b)),
    Figure("torch {}, DeepSpeed {}: the tests above", CPU_CI,
           r"^\d+ passed[\s\S]*torch ([\d.]+)\+\w+ deepspeed ([\d.]+)"),
    Figure("torch {}, DeepSpeed {}: stages 0 and 3 on 4 rehearsed ranks, {}", LOGS
           + "h200/25-oldest/default/full-0.19.3/20261201-142019-mAuG/summary.md",
           r"^# ZeRO benchmark: (\w+)[\s\S]*^\| torch \| ([\d.]+)\+\w+ \|\n\| deepspeed \| ([\d.]+) \|",
           lambda verdict, torch, ds: (torch, ds, verdict)),
    Figure("torch {}, DeepSpeed {}: {} passed, {} failed, {} errors, cut at {}%, mended since", LOGS + "h200/45-suite/tests.txt",
           r"torch.* \(([\d.]+)\)\n.*deepspeed.* \(([\d.]+)\)[\s\S]*\[ *(\d+)%\]$(?![\s\S]*%\]$)[\s\S]*"
           r"^(\d+) failed, (\d+) passed, \d+ skipped, (\d+) errors",
           lambda torch, ds, cut, failed, passed, errors: (torch, ds, passed, failed, errors, cut)),
    Figure("torch {}, DeepSpeed {}: {} passed, {} failed, cut at {}% at 797c2fd", LOGS + "h100/9-suite/tests.txt", "",
           read=lambda: cut_suite(LOGS + "h100/9-suite/tests.txt", "torch", "deepspeed", "passed", "failed", "cut")),
    Figure("the rest at db23841, cut at {}%: {} passed, {} failed", LOGS + "h100/10-suite/tests.txt", "",
           read=lambda: cut_suite(LOGS + "h100/10-suite/tests.txt", "cut", "passed", "failed")),
    # where the memory goes, and offload's plan
    Figure("the default on an {} GB H100 ([log]", LOGS + "h100/3-timeline/default.txt", r"one GPU \(NVIDIA H100 (\d+)GB"),
    Figure("1.3b's `3_offload` at micro batch 8, {} s planned, {} measured on one H100",
           LOGS + "h100/4-offload-step/check_1.3b_fastest.txt", r"^\| \w+ \| 3_offload \| 8 \| on \| ([\d.]+) \| ([\d.]+) \|"),
    # what the code works out: (b)'s expectation, from today's report.py on the two runs
    # the report of the run's day had no predicted peak for Llama: (b) judged none
    Figure("Its report.txt says {};", HF_LLAMA + "/report.txt",
           r"^NOT OBSERVABLE  \(b\) .*no prediction for the model llama-3\.2-1b[\s\S]*^VERDICT: (.+)$"),
    Figure("today's `report.py` says {}, predicting the peak of Llama", f"report.py {HF_LLAMA}",
           r"^VERDICT: (\w+)$", command=True),
    Figure("theory's ratio for the two runs (`memory.rank_memory`) divided by {}.", f"report.py {H200X2}",
           r"stage 3 may hold up to ([\d.]+)x its predicted share", command=True),
]

def cut_suite(log: str, *asked: str) -> tuple:
    """What a suite that was cut short says, which prints no counts, as `asked`: its torch and deepspeed, its tests
    that passed and that failed or erred, counted from the lines of -vv, and the percent it was cut at."""
    text = (ROOT / log).read_text()
    torch_version, ds_version = re.search(r"torch.* \(([\d.]+)\)\n.*deepspeed.* \(([\d.]+)\)", text).groups()

    def printed(*outcomes):
        return str(sum(len(re.findall(rf"^\[gw\d+\] \[ *\d+%\] {o} tests/", text, re.M)) for o in outcomes))
    said = dict(torch=torch_version, deepspeed=ds_version, passed=printed("PASSED"), failed=printed("FAILED", "ERROR"),
                cut=re.findall(r"\[ *(\d+)%\]", text)[-1])
    return tuple(said[a] for a in asked)


def compile_minutes() -> tuple:
    """DeepCompile's compiling, at steps 1 and 6 of each of its five runs on 2 H200s: the least and the most."""
    logs = [p for case in ("10-deepcompile", "11-deepcompile-mb2", "16-deepcompile-peer", "18-repeat-mb16",
                           "19-repeat-mb2") for p in (ROOT / LOGS / "h200x2/13-fsdp2" / case).glob("r/*/stage3_deepcompile.log")]
    assert len(logs) == 5
    spent = [sum(float(t) for t in re.findall(r"step [16]/\d+ .* time ([\d.]+)s", log.read_text())) for log in logs]
    return f"{min(spent) / 60:.1f}", f"{max(spent) / 60:.1f}"


RECIPE = "docs/training-recipe.md"
RECIPE_FP16 = LOGS + "h200/28-suite-matrix/2-batch/results/original_design/20261202-050444-4Lre"
RECIPE_2GPUS = LOGS + "h200x2/8-recipe-2gpus/results"
STAGES0123 = LOGS + "h200x2/stages0123-2gpus"
PEAK_PAIR = r"^peak memory +([\d.]+) GiB +([\d.]+) GiB[\s\S]*^tokens/s +([\d,]+) +([\d,]+)"


def checkpoint_cost() -> tuple:
    """What checkpointing cost each stage's tokens/s on 2 H200s at micro batch 2, from the two runs' reports."""
    on, off = (re.search(PEAK_PAIR, (ROOT / RECIPE_2GPUS / run / "report.txt").read_text(), re.M).groups()[2:]
               for run in ("20261130-133806-hn0t", "20261130-133930-37Ih"))
    return tuple(f"{1 - float(a.replace(',', '')) / float(b.replace(',', '')):.0%}" for a, b in zip(on[::-1], off[::-1]))


FSDP2_PAGE = "docs/zero3-vs-fsdp2.md"
F2 = LOGS + "h200x2/13-fsdp2/"
EAGER_MB2, EAGER_MB16 = F2 + "15-final5/r/20261130-212629-JBTr", F2 + "15-final5/r/20261130-212805-1qpr"
DC_MB2, DC_MB2_PEER = F2 + "11-deepcompile-mb2/r/20261130-183616-WICi", F2 + "11-deepcompile-mb2/r/20261130-184146-VV5X"
DC_MB16 = F2 + "16-deepcompile-peer/r/20261130-213208-HlxM"
REPEAT_MB16, REPEAT_MB2 = F2 + "18-repeat-mb16/r/20261130-232917-p3xa", F2 + "19-repeat-mb2/r/20261130-235155-yLZq"
DC_SUB1E9 = F2 + "20-deepcompile-sub1e9/r/20261201-000023-iXSl"


def cell(folder: str, row: str, run: str) -> str:
    """One figure of a report's table: its row's value in the run's column, less its unit."""
    lines = (ROOT / folder / "report.txt").read_text().splitlines()
    runs = lines[0].split()
    [line] = [line for line in lines if re.match(re.escape(row) + r" {2,}", line)]
    return re.split(r" {2,}", line.strip())[1:][runs.index(run)].removesuffix(" GiB")


def against(folder: str, run: str) -> str:
    """The report's line that sets a run against FSDP2: its share of FSDP2's tokens/s."""
    text = (ROOT / folder / "report.txt").read_text()
    return re.search(rf"^{run} against fsdp2: ([\d.]+x) its tokens/s", text, re.M).group(1)


def timed_from_step_7(folder: str) -> str:
    """DeepCompile's tokens/s as the report times it today: the median over steps 7..N, less the profiled last."""
    log = (ROOT / folder / "stage3_deepcompile.log").read_text()
    rates = [int(r.replace(",", "")) for n, last, r in re.findall(r"step (\d+)/(\d+) .* tok/s ([\d,]+)", log)
             if 7 <= int(n) < int(last)]
    assert len(rates) % 2 == 1
    return f"{sorted(rates)[len(rates) // 2]:,}"


def deepcompile_row() -> tuple:
    mb2 = timed_from_step_7(DC_MB2)
    return (mb2, ratio(mb2, cell(DC_MB2_PEER, "tokens/s", "fsdp2")), cell(DC_MB2, "peak memory", "stage3_deepcompile"),
            cell(DC_MB16, "tokens/s", "stage3_deepcompile"), against(DC_MB16, "stage3_deepcompile"),
            cell(DC_MB16, "peak memory", "stage3_deepcompile"))


def same_model_states() -> tuple:
    states = {cell(EAGER_MB2, "model states", run) for run in ("fsdp2", "stage3")}
    assert len(states) == 1, states
    return tuple(states)


def on_par() -> tuple:
    calls = sorted((against(folder, run) for folder, run in ((DC_MB16, "stage3_deepcompile"),
                    (REPEAT_MB16, "stage3_deepcompile"), (DC_SUB1E9, "stage3_deepcompile_sub1e9"))), key=lambda r: float(r[:-1]))
    return calls[0], calls[-1]


def agree_with_fsdp2() -> tuple:
    found = [re.search(r"against fsdp2: .* the losses agree to ([\d.]+%)", (ROOT / f / "report.txt").read_text()).group(1)
             for f in (EAGER_MB2, EAGER_MB16, DC_MB2_PEER, DC_MB16, REPEAT_MB16, REPEAT_MB2)]
    return max(found, key=lambda v: float(v[:-1])),



def compiled_against_eager() -> tuple:
    """engine.compile's loss at step 3 on 2 H200s, and eager stage 3's in the same sweep."""
    def at_step_3(log):
        loss = re.search(r"step 3/\d+  loss ([\d.]+)", (ROOT / F2 / "2-levers/r" / log).read_text()).group(1)
        return f"{float(loss):.2f}"
    return at_step_3("20261130-152833-lZ0F/stage3.log"), at_step_3("20261130-153023-7VRY/stage3_subgroup1e8.log")


def table_cell(path: str, row: str, run: str) -> str:
    """One figure of the first report table in a run.sh output or report: its row's value in the run's column."""
    lines = (ROOT / path).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    runs = lines[at - 1].split()
    [line] = [line for line in lines[at:] if re.match(re.escape(row) + r" {2,}", line)][:1]
    return re.split(r" {2,}", line.strip())[1:][runs.index(run)].removesuffix(" GiB")


def gib_apart(a: str, b: str) -> str:
    return f"{float(a) - float(b):.2f}"


def host_work_per_step() -> tuple:
    """Eager stage 3's step time above FSDP2's at run.sh's default, in 15-final5 and 11-deepcompile-mb2."""
    return tuple(f"{float(cell(d, 'step time s', 'stage3')) - float(cell(d, 'step time s', 'fsdp2')):.2f}"
                 for d in (EAGER_MB2, DC_MB2_PEER))


def plain_linear() -> tuple:
    """Stage 3 against FSDP2 at micro batch 2 with the first comparison's config (3-final's combined call, 1-peer),
    and with torch's linear layer (5-levers, 6-fast-sharding)."""
    first = sorted(ratio(table_cell(f, "tokens/s", "stage3"), table_cell(f, "tokens/s", "fsdp2"))
                   for f in (F2 + "3-final/combined/mb2/report.txt", F2 + "1-peer/mb2.txt"))
    plain = sorted(ratio(table_cell(f, "tokens/s", "stage3_plain"), table_cell(f, "tokens/s", "fsdp2"))
                   for f in (F2 + "5-levers/mb2.txt", F2 + "6-fast-sharding/mb2.txt"))
    return first[0][:-1], first[1], plain[0][:-1], plain[1]


def linear_without_checkpointing() -> tuple:
    """Stage 3's peak without checkpointing, 9-final4's config against the first comparison's (3-final), at micro
    batch 2 and 16: the same GiB apart."""
    mb2 = re.search(r"^peak memory +- +([\d.]+) GiB", (ROOT / F2 / "3-final/r/mb2_no_checkpoint/summary.md").read_text(),
                    re.M).group(1)
    apart = {gib_apart(cell(F2 + "9-final4/r/20261130-182358-caAY", "peak memory", "stage3"), mb2),
             gib_apart(cell(F2 + "9-final4/r/20261130-182236-p8JO", "peak memory", "stage3"),
                       cell(F2 + "3-final/r/mb16_no_checkpoint", "peak memory", "stage3"))}
    assert len(apart) == 1, apart
    return tuple(apart)


def fast_sharding_losses() -> tuple:
    """The runs with fast sharding (6-fast-sharding's *fs*, 7-final-fast-sharding's stage 3): the most their
    first-step loss and any loss moved from the reference's (stage 0's where it ran, else FSDP2's)."""
    first, any_step = [], []
    for summary in sorted([*(ROOT / F2).glob("6-fast-sharding/r/*/summary.json"),
                           *(ROOT / F2).glob("7-final-fast-sharding/r/*/summary.json")]):
        results = json.loads(summary.read_text())["results"]
        reference = results.get("stage0", results["fsdp2"])[0]["losses"]
        for name, ranks in results.items():
            if "fs" in name.removeprefix("fsdp2") or "7-final" in str(summary) and name == "stage3":
                losses = ranks[0]["losses"]
                first.append(abs(losses[0] / reference[0] - 1))
                any_step.append(max(abs(a / b - 1) for a, b in zip(losses, reference)))
    assert len(first) == 9
    return f"{max(first):.1%}", f"{max(any_step):.0%}"


def engine_start() -> tuple:
    """The engine's start (ready_s) of DeepCompile's five runs, and of eager stage 3 with today's config (15-final5's
    four runs and 11-deepcompile-mb2's), the least and the most, in seconds."""
    def ready(globs, run):
        return [d["ready_s"] for g in globs for s in (ROOT / F2).glob(g + "/r/*/summary.json")
                for name, ranks in json.loads(s.read_text())["results"].items() if name == run for d in ranks]
    compiled = ready(("10-deepcompile", "11-deepcompile-mb2", "16-deepcompile-peer", "18-repeat-mb16", "19-repeat-mb2"),
                     "stage3_deepcompile")
    eager = ready(("15-final5", "11-deepcompile-mb2"), "stage3")
    assert len(compiled) == 10 and len(eager) == 10
    return tuple(f"{s:.0f}" for s in (min(compiled), max(compiled), min(eager), max(eager)))


RUNNING = "docs/running.md"
OFFLOAD_FIRST, OFFLOAD_FINAL = LOGS + "h200/5-stages-offload-cap/offload-1rank", LOGS + "h200/6-final-1gpu/stages-0-3-offload"


def offload_on_one_h200() -> tuple:
    """Offload's and Infinity's GPU peaks on one H200, their step times over stage 3's in the first and the final
    run, and the host's peak resident set that the final run's per-step records hold."""
    def times(folder, run):
        return float(cell(folder, "step time s", run)) / float(cell(folder, "step time s", "stage3"))
    results = json.loads((ROOT / OFFLOAD_FINAL / "summary.json").read_text())["results"]
    rss = {run: max(s["host_peak_rss_bytes"] for r in results[run] for s in r["steps"]) / 2**30
           for run in ("stage3_offload", "stage3_infinity")}
    peak = lambda run: f"{float(cell(OFFLOAD_FINAL, 'peak memory', run)):.1f}"
    return (peak("stage3"), peak("stage3_offload"), peak("stage3_infinity"),
            *(f"{times(folder, run):.1f}" for run in ("stage3_offload", "stage3_infinity")
              for folder in (OFFLOAD_FIRST, OFFLOAD_FINAL)),
            f"{rss['stage3_offload']:.0f}", f"{rss['stage3_infinity']:.0f}")


def deepcompile_ranges() -> tuple:
    mb2 = sorted([ratio(timed_from_step_7(DC_MB2), cell(DC_MB2_PEER, "tokens/s", "fsdp2")),
                  against(REPEAT_MB2, "stage3_deepcompile")])
    mb16 = sorted([against(DC_MB16, "stage3_deepcompile"), against(REPEAT_MB16, "stage3_deepcompile")])
    return mb2[0][:-1], mb2[1], mb16[0][:-1], mb16[1]



def launch_loads() -> tuple:
    """The load average as the launchers' run began, the time the run under load took, and its load."""
    folder = ROOT / LOGS / "cpu/launchers"
    load = lambda f: re.search(r"load average: ([\d.]+)", f.read_text()).group(1)
    under = re.search(r"^start.sh and the launches: ([\d.]+) s", (folder / "under-load/pytest.txt").read_text(), re.M)
    return f"{float(load(folder / 'machine.txt')):.1f}", str(round(float(under.group(1)))), \
        f"{float(load(folder / 'under-load/machine.txt')):.1f}"


TYPES = LOGS + "cpu/types/"
OLDEST = LOGS + "h200/25-oldest/"

MEASUREMENT = "docs/measurement.md"
FP32_STAGE0 = "h200x2/10-final/results/20261130-135408-BSt7"
ALL_STAGES_4 = "h200/5-stages-offload-cap/all-stages-4ranks"


def held_out(folder: str, run: str) -> tuple:
    """docs/measurement.md's row for a run without a recorded config: rank 0's peak in its steps, today's prediction
    with its stage's config as it is today (tests/test_accounting.py), and the miss."""
    from test_accounting import committed, miss_with_todays_config, training_peak
    r = committed(folder + "/summary.json", run)[0]
    miss = miss_with_todays_config(r)
    return f"{training_peak(r) / 2**30:.2f}", f"{r.predicted.peak / 2**30:.2f}", f"{miss:+.1%}".replace("-", "−")


def same_peak_at_stages_1_and_2() -> tuple:
    from test_accounting import committed, training_peak
    peaks = {training_peak(r) for run in ("stage1", "stage2") for r in committed(ALL_STAGES_4 + "/summary.json", run)}
    assert len(peaks) == 1, peaks
    return f"{peaks.pop():,}",


MFU_BASELINES = LOGS + "h200/2-lr-stage3-mfu-baselines"


def last_mfu(log: str) -> str:
    """The MFU of a run's RESULT line, in the baselines' logs on one H200."""
    mfu = re.findall(r'"mfu": ([\d.e-]+)', (ROOT / MFU_BASELINES / (log + ".log")).read_text())[-1]
    return f"{float(mfu):.1%}"


def planned_against_measured() -> tuple:
    """The largest miss of the plan from one GPU against the runs it planned."""
    misses = re.findall(r"\(([-+][\d.]+)%\)", (ROOT / LOGS / "plan/planned-against-measured.txt").read_text())
    return f"{max(abs(float(m)) for m in misses):.1f}%",


LIVE = LOGS + "h200/29-live/"


def traced(log: str) -> tuple:
    """A stage-3 timeline of 29-live (as benchmarks/every_peak.py reads it): step 3's traced peak, today's predicted
    peak, its miss against the trace's exact peak, and the most elements gathered."""
    path = ROOT / LIVE / log
    r = result.RankResult.from_dict(next(d for d in (json.loads(line[7:]) for line in path.read_text().splitlines()
                                                     if line.startswith("RESULT ")) if d["rank"] == 0))
    finishing.add_predictions(r, result.shape_of(r), r.zero_config)
    summary = re.search(r"^step 3: peak ([\d.]+) GiB[\s\S]*?^most gathered: ([\d,]+) elements", path.read_text(), re.M)
    tag = path.stem.removeprefix("timeline_")
    rows = (ROOT / LIVE / log).parent.joinpath("timeline", f"{tag}_rank0.csv").read_text().splitlines()
    exact = max(float(row.split(",")[5]) for row in rows[1:] if row.startswith("3,"))
    predicted = r.predicted.peak / 2**30
    return summary.group(1), f"{predicted:.2f}", f"{predicted / exact - 1:+.1%}", summary.group(2)


def held(run: str) -> tuple:
    """A run of 29-live/3-held: its peak, and the peak its own report predicted before it ran."""
    [folder] = (ROOT / LIVE / "3-held/results" / run).glob("*/report.txt")
    folder = str(folder.parent.relative_to(ROOT))
    return cell(folder, "peak memory", next(iter(json.loads((ROOT / folder / "summary.json").read_text())["results"]))), \
        cell(folder, "  estimated", next(iter(json.loads((ROOT / folder / "summary.json").read_text())["results"])))


DEFAULT_33 = LOGS + "h200/33-suite/gpu_launches/popen-gw1/gpu_default0/20261202-135050-LG4z/summary.json"
S1_R4 = LOGS + "h200/31-suite/s1_r4_nock"
OFFLOAD_92VQ = LOGS + "h200/36-step-time/1-default-mb2/results/20261203-125222-92vQ"
S12_R4 = LOGS + "h200/28-suite-matrix/4-trace/held/results/s12_r4"


def records(folder: str, run: str) -> list:
    """A run's rank records, from the one summary.json under its folder."""
    [summary] = (ROOT / folder).glob("**/summary.json")
    return json.loads(summary.read_text())["results"][run]


def step_peak(d: dict) -> int:
    return max(s["peak_mem_bytes"] for s in d["steps"])


def step_rss(d: dict) -> int:
    return max(s["host_peak_rss_bytes"] for s in d["steps"])



@functools.lru_cache(maxsize=None)
def host_peaks() -> dict:
    """Today's predicted host peak against each committed offload record's, as tests/test_accounting.py holds them:
    (log, config, rank) -> (miss, measured bytes, predicted bytes, model, ranks)."""
    from test_accounting import records as rank_records
    from zero3bench.reporting import theory
    timelines = ((log, result.RankResult.from_dict(json.loads(line[len("RESULT "):])))
                 for log in sorted((ROOT / LOGS).glob("h200/**/timeline_*.txt"))
                 for line in log.read_text(errors="replace").splitlines() if line.startswith("RESULT "))
    found = {}
    for path, r in (*rank_records(ROOT / LOGS), *timelines):
        predicted = theory.predicted_host_peak(r) if r.peaks.host_peak_rss_bytes and r.steps else None
        if predicted:
            found[(str(path.relative_to(ROOT / LOGS)), r.run.config, r.rank)] = (
                predicted / r.peaks.host_peak_rss_bytes - 1, r.peaks.host_peak_rss_bytes, predicted, r.world_size)
    return found


def offload_host() -> tuple:
    found = host_peaks()
    alone = {k: v for k, v in found.items() if "infinity" not in k[1]}
    five = {k: v for k, v in found.items() if "infinity" in k[1] and v[3] == 1 and "-step-time" in k[0]}
    assert len({k[0] for k in five}) == len(five) == 5
    return (str(len({k[0] for k in alone})), str(len(alone)), f"{max(abs(v[0]) for v in alone.values()):.1%}",
            f"{max(abs(v[0]) for v in five.values()):.1%}", f"{min(v[1] for v in five.values()) / 1e9:.2f}",
            f"{max(v[1] for v in five.values()) / 1e9:.2f}", *{f"{v[2] / 1e9:.2f}" for v in five.values()})


def host_2_7b_on_one_rank() -> tuple:
    [(_, measured, predicted, _)] = [v for k, v in host_peaks().items() if k[0].startswith("h200/29-live/5-host/")]
    return f"{predicted / 1e9:.2f}", f"{measured / 1e9:.2f}"



def oldest_tiny() -> tuple:
    """25-oldest's tiny runs: their DeepSpeed versions, cuBLAS's workspace over stage 0's peak, and today's
    prediction's miss at each stage."""
    from zero3bench.accounting import predict
    misses, share, versions = {"stage0": [], "stage3": []}, [], []
    for summary in sorted((ROOT / OLDEST / "quick").glob("*/*/summary.json")):
        for name, ranks in json.loads(summary.read_text())["results"].items():
            for d in ranks:
                r = result.RankResult.from_dict(d)
                finishing.add_predictions(r, result.shape_of(r), r.zero_config or {})
                peak = max(s.memory.peak_mem_bytes for s in r.steps)
                misses[name].append(r.predicted.peak / peak - 1)
                versions.append(tuple(map(int, r.env.deepspeed.split("."))))
                if name == "stage0":
                    share.append(predict.WORKSPACE_BYTES / peak)
    v = lambda t: ".".join(map(str, t))
    return (v(min(versions)), v(max(versions)), f"{min(share):.0%}".removesuffix("%"), f"{max(share):.0%}",
            f"{max(map(abs, misses['stage3'])):.1%}", f"{min(misses['stage0']):.1%}".removesuffix("%"),
            f"{max(misses['stage0']):.1%}")



def held_out_stage_1() -> tuple:
    """Today's prediction against every rank of the runs held out for stage 1's reduction: 350m on 3 and 8 ranks,
    760m on 6, 125m in fp32 on 5, 1.3b in fp32 on 4, 2.7b on 4 (both stages where the run has both)."""
    misses = []
    for folder in ("32-s12/results/s12_350m_r3", "32-s12/results/s12_350m_r8_mb1", "32-s12/results/s12_2.7b_r4",
                   "34-s1/results"):
        for summary in (ROOT / LOGS / "h200" / folder).glob("**/summary.json"):
            for ranks in json.loads(summary.read_text())["results"].values():
                for d in ranks:
                    r = result.RankResult.from_dict(d)
                    finishing.add_predictions(r, result.shape_of(r), r.zero_config or {})
                    misses.append(r.predicted.peak / max(s.memory.peak_mem_bytes for s in r.steps) - 1)
    assert len(misses) == 3 * 2 + 8 * 2 + 4 * 2 + 8 + 6 + 5 + 4
    return f"{max(map(abs, misses)):.1%}",



def output_layer_probe() -> tuple:
    """benchmarks/output_layer_probe.py on an H200: the output layer's predicted bytes against the measured, at
    its largest miss, over the presets, micro batches and dtypes it ran."""
    cases = [json.loads(line) for line in (ROOT / LOGS / "h200/31-suite/probe/output_layer.jsonl").read_text().splitlines()]
    miss = max(abs(c["predicted_bytes"] / c["measured_bytes"] - 1) for c in cases)
    presets, batches, dtypes = (sorted({c[k] for c in cases}, key=str) for k in ("preset", "micro_batch", "dtype"))
    return (f"{miss:.1%}", *sorted(presets, key=lambda p: float(p[:-1]) * (1e-3 if p.endswith("m") else 1)), min(batches), max(batches), *dtypes)



def offloaded_weights() -> tuple:
    """The 16-bit weights that parameter offload adds to the host, predicted, and measured as the resident sets of
    3_infinity less 3_offload when the engine is ready, where both ran with the same settings (as
    tests/test_accounting.py reads them)."""
    from zero3bench.accounting import host, predict
    added, predicted = [], set()
    for summary in sorted((ROOT / LOGS).glob("h200/3[68]-step-time*/**/summary.json")):
        runs = {name: result.RankResult.from_dict(ranks[0])
                for name, ranks in json.loads(summary.read_text())["results"].items()}
        if {"stage3_infinity", "stage3_offload"} <= set(runs):
            r, offload = runs["stage3_infinity"], runs["stage3_offload"]
            added.append(r.memory_at_start.host_peak_rss_bytes - offload.memory_at_start.host_peak_rss_bytes)
            predicted.add(host.offloaded_weights_bytes(predict.WIDTH[r.run.dtype], 1, r.zero_config, result.shape_of(r)))
    assert len(added) == 3 and len(predicted) == 1
    return f"{predicted.pop() / 1e9:.3f}", f"{min(added) / 1e9:.3f}", f"{max(added) / 1e9:.3f}"


OFFLOAD_350M = LOGS + "h200/27-suite-matrix/2-probe2/results/offload_350m/20261202-023617-Q4OC"


def today_terms(r, zero=None):
    """A rank record's memory terms as today's code predicts them, with zero its config (the recorded one if None)."""
    from zero3bench.accounting.memory import rank_memory
    shape = result.shape_of(r)
    return rank_memory(r.run, shape, finishing.counted(r, shape), r.zero_config or {} if zero is None else zero,
                       finishing.seat(r))


def workspace_fit() -> tuple:
    """cuBLAS's workspace as fitted on 24-peaks: each rank's memory allocated after its last step less the states and
    buffers that today's prediction holds throughout, the least and the most in MB."""
    left = [r.steps[-1].memory.allocated_bytes - (m.held - m.workspace)
            for summary in sorted((ROOT / LOGS / "h200/24-peaks").glob("**/summary.json"))
            for ranks in json.loads(summary.read_text())["results"].values()
            for r in map(result.RankResult.from_dict, ranks) if r.steps for m in [today_terms(r)]]
    assert len(left) == 48
    return f"{min(left) / 1e6:.1f}", f"{max(left) / 1e6:.1f}"


def todays_config(stage: int) -> dict:
    """The zero_optimization section of the stage's config as it is today."""
    from zero3bench import stages
    return json.loads(stages.config_path(stage).read_text())["zero_optimization"]


def all_reduce_copy() -> tuple:
    """Stage 0 in fp32 on 2 H200s (10-final): the all-reduce's flat copy, its share of the peak, and the prediction's
    miss without it."""
    import dataclasses
    from test_accounting import committed, training_peak
    [r, *_] = committed(FP32_STAGE0 + "/summary.json", "stage0")
    m = today_terms(r, todays_config(0))
    without = dataclasses.replace(m, reduction=0).peak / training_peak(r) - 1
    return (f"{m.reduction / 1e9:.2f}", f"{m.reduction / training_peak(r):.1%}",
            f"{without:+.1%}".replace("-", "−"))


def above_backwards_start() -> tuple:
    """Stages 1 and 2 at 4 rehearsed ranks without checkpointing (all-stages-4ranks): the measured peak above
    backward's start as today's code predicts it with today's configs, in GB, the same on every rank."""
    from test_accounting import committed, training_peak
    found = []
    for run, stage in (("stage1", 1), ("stage2", 2)):
        above = set()
        for r in committed(ALL_STAGES_4 + "/summary.json", run):
            m = today_terms(r, todays_config(stage))
            above.add(training_peak(r) - (m.held + m.start_gathered + m.saved_weights + m.activations + m.backward_buckets))
        assert len(above) == 1, above
        found.append(f"{above.pop() / 1e9:.2f}")
    return tuple(found)


def reductions_traced() -> tuple:
    """Stage 3's reductions in backward at a 1e8 cap as traced (tests/test_accounting.py's REDUCTION_TRACES), and the
    moment that predicts them: its miss on 2 ranks offloaded (29-live/2-cap) and on 8 (35-trace)."""
    import dataclasses
    from zero3bench.accounting.memory import Seat, rank_memory
    misses = []
    for log in (ROOT / LIVE / "2-cap/timeline_offload_live1e8.txt", ROOT / LOGS / "h200/35-trace/timeline_stage3_r8.txt"):
        summary = (log.parent / "timeline" / f"{log.stem.removeprefix('timeline_')}_summary.txt").read_text()
        traced = max(float(line.split(" GiB")[0]) for line in summary.splitlines()[2:]
                     if "and _DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads" in line)
        lines = [json.loads(line[7:]) for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        r = result.RankResult.from_dict(next(d for d in lines if d["rank"] == 0))
        shape = result.shape_of(r)
        m = rank_memory(r.run, shape, dataclasses.replace(finishing.counted(r, shape), shard=r.shards.local_param_elems),
                        r.zero_config, Seat(r.world_size))
        misses.append(f"{(m.held + m.gathered + m.scatter) / 2**30 / traced - 1:+.1%}")
    return tuple(misses)


def cpu_adam_grads_against_census() -> tuple:
    """The CPU optimizer's fp32 gradients, 4 bytes a partition element, against the census's other host tensors, in
    each offload record of 5-stages-offload-cap: the most bytes apart."""
    apart = [abs(d["host_state_breakdown"]["other"] - 4 * d["local_param_elems"])
             for summary in (ROOT / LOGS / "h200/5-stages-offload-cap").glob("**/summary.json")
             for ranks in json.loads(summary.read_text())["results"].values() for d in ranks
             if d.get("host_state_breakdown")]
    assert len(apart) == 10
    return str(max(apart)),


def output_layer_350m_mb2() -> tuple:
    """benchmarks/output_layer_probe.py on an H200 (30-steady/1-probe): 350m at micro batch 2 in bf16, measured and
    as the term of its day counted it, in MB."""
    [case] = [c for c in map(json.loads, (ROOT / LOGS / "h200/30-steady/1-probe/output_layer.jsonl").read_text()
                             .splitlines()) if (c["preset"], c["micro_batch"], c["dtype"]) == ("350m", 2, "bf16")]
    return f"{case['measured_bytes'] / 1e6:.0f}", f"{case['predicted_bytes'] / 1e6:.0f}"


def prefetch_cases() -> tuple:
    """moments.gathered_ahead against DeepSpeed's coordinator in benchmarks/logs/cpu/prefetch's cases on 2 CPU ranks:
    the largest miss, the cases, and those it gets exactly."""
    from test_accounting import gpt_block_matrices, prefetch_probes
    from zero3bench.accounting import moments
    misses = []
    for p in prefetch_probes("*.json").values():
        zero, d_model = p["zero"], round((p["block"] / 12) ** 0.5)
        twelfths = moments.prefetched_twelfths(zero["stage3_prefetch_bucket_size"], gpt_block_matrices(d_model))
        ahead = moments.gathered_ahead(p["layers"], p["block"], p["root"], p["layers"] * p["block"] + p["root"],
                                       zero["stage3_max_live_parameters"], twelfths)
        misses.append(ahead / p["peak"] - 1)
    return f"{max(map(abs, misses)):.1%}", str(len(misses)), str(sum(m == 0 for m in misses))


def allocator_reserve() -> tuple:
    """What the allocator reserved beyond MemoryTerms.reserved, the most over every committed H200 run that records
    its config (tests/test_plan.py), over an H100's, and over the original design's config, which that test leaves
    out."""
    from test_accounting import records as rank_records
    from zero3bench.reporting.theory import predictable
    worst = {"h200": 0, "h100": 0, "original": 0}
    for path, r in rank_records(ROOT / LOGS):
        if predictable(r):
            beyond = max(s.memory.peak_reserved_bytes for s in r.steps) - today_terms(r).reserved
            kind = "original" if "_original" in r.run.config else "h100" if "/h100/" in str(path) else "h200"
            worst[kind] = max(worst[kind], beyond)
    return tuple(f"{worst[kind] / 2**30:.2f}" for kind in ("h200", "h100", "original"))


ERROR = r" ([-+][\d.]+)% \|$"


def step_check() -> tuple:
    """plan_step_check.py from the calibrating run at micro batch 2 (its first table): the runs and the largest error."""
    text = (ROOT / LOGS / "plan/step-check-18aea3b.txt").read_text()
    table = text.split("\nworst ")[0]
    errors = [abs(float(e)) for e in re.findall(r"^\| \w+ \| \w+ \| \d+ \| o[nf]f? \| \w+ \| [\d.]+ \| [\d.]+ \|" + ERROR,
                                                 table, re.M)]
    assert f"worst {max(errors):.1f}% over {len(errors)} runs" in text  # the table's rows make the log's own summary
    return str(len(errors)), f"{max(errors):.1f}%"


def two_gpus() -> tuple:
    """plan_two_gpus.py's rows over both calibrating runs: the largest error at micro batch 16, and the least and the
    most at micro batch 2."""
    rows = re.findall(r"^\| \S+ \| \w+ \| (\d+) \| o[nf]f? \| [\d.]+ / [\d.]+ \| [\d.]+ \|" + ERROR,
                      (ROOT / LOGS / "plan/two-gpus-f5a2c43.txt").read_text(), re.M)
    assert len(rows) == 18
    at = lambda mb: [abs(float(e)) for b, e in rows if b == mb]
    return f"{max(at('16')):.1f}%", f"{min(at('2')):.1f}%", f"{max(at('2')):.1f}%"

def host_pass_cost() -> tuple:
    """The JIT build of CPU Adam's op in an empty folder, and its loads in each run of run.sh's default after it."""
    text = (ROOT / LOGS / "cpu/hostpass/cost-f86c18c.txt").read_text()
    loads = [float(x) for x in re.findall(r"CPU Adam loaded in ([\d.]+) s", text)]
    return re.search(r"^first use \(JIT build\): None ([\d.]+) s$", text, re.M)[1], f"{min(loads)}", f"{max(loads)}"


def host_pass_rate() -> tuple:
    """3_infinity's host pass per element at one thread, beyond the caches (2^23 to 2^27 elements) and in them (2^20
    and fewer): the least and the most of each."""
    rows = re.findall(r"^ *([\d,]+) +1 .* ([\d.]+)$", (ROOT / LOGS / "cpu/hostpass/rate-f86c18c.txt").read_text(), re.M)
    at = {int(n.replace(",", "")): v for n, v in rows}
    beyond, within = [at[n] for n in at if n >= 2**23], [at[n] for n in at if n <= 2**20]
    assert len(beyond) == 5 and len(within) == 5
    return min(beyond, key=float), max(beyond, key=float), min(within, key=float), max(within, key=float)


HELD_OUT_FAMILIES = LOGS + "cpu/hf-heldout/families-a34cad9.txt"
FAMILY_NAMES = {"gpt2": "GPT-2", "mixtral": "Mixtral", "bloom": "Bloom", "qwen3": "Qwen3", "gemma2": "Gemma2",
                "phi3": "Phi-3", "qwen2_moe": "Qwen2-MoE"}
NUMBER_WORDS = dict(enumerate(("No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
                               "Eleven", "Twelve")))


HELD_OUT_SAVED = LOGS + "cpu/hf-heldout/saved-14f9d49.txt"


def held_out_saved() -> tuple:
    """benchmarks/heldout_saved.py's lines, one a config of benchmarks/families.json: those whose parameters and saved
    bytes are the count's, all of them, and the families (model types) among them."""
    lines = re.findall(r"^[\w-]+: (.*)$", (ROOT / HELD_OUT_SAVED).read_text(), re.M)
    families = json.loads((ROOT / "benchmarks" / "families.json").read_text())
    assert len(lines) == len(families)
    same = [line for line in lines if line.startswith("params") and "as built" in line and ": the same;" in line]
    return str(len(same)), str(len(lines)), str(len({config["model_type"] for config in families.values()}))


def held_out_families() -> tuple:
    """benchmarks/heldout_families.py's runs through run.sh: each `== name[:seed]: exit 0` header followed by its
    `VERDICT: PASS`, counted and named as the page names them (seeds, and the Qwen2-MoE with a wide shared expert)."""
    text = (ROOT / HELD_OUT_FAMILIES).read_text()
    runs = re.findall(r"^== (\w+)(?::(\d+))?: exit 0\n(?:(?!== ).*\n)*?VERDICT: PASS$", text, re.M)
    assert len(runs) == text.count("\n== ") == text.count("VERDICT: ")
    seeds = {}
    for name, seed in runs:
        seeds.setdefault(name.removesuffix("_wide"), []).append(int(seed or 0))
    wide = json.loads((ROOT / LOGS / "cpu/hf-heldout/qwen2_moe_wide.json").read_text())["shared_expert_intermediate_size"]
    named = []
    for name, found in seeds.items():
        if len(found) > 1 and name == "gpt2":
            named.append(f"{FAMILY_NAMES[name]} at seeds {', '.join(map(str, found[:-1]))} and {found[-1]}")
        elif len(found) > 1:
            named.append(f"{NUMBER_WORDS[len(found)].lower()} {FAMILY_NAMES[name]}, one with transformers' {wide}-wide "
                         f"shared expert")
        else:
            named.append(FAMILY_NAMES[name])
    return NUMBER_WORDS[len(runs)], ", ".join(named[:-1]) + " and " + named[-1]


# BENCHMARKS.md's goals: the default on 4 rehearsed ranks of one H200, 2 H200s, and 8 ranks rehearsed on 2 H200s
GOALS = (LOGS + "h200/33-suite/gpu_launches/popen-gw1/gpu_default0/20261202-135050-LG4z", H200X2,
         LOGS + "h200x2/10-final/results/20261130-135132-zYNH")


@functools.cache
def expected(folder: str) -> tuple:
    """(b)'s expected and predicted ratios of the peak, as today's report.py prints them on a folder."""
    out = subprocess.run([sys.executable, "report.py", folder], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    return re.search(r"expected ([\d.]+x) less or better: theory predicts ([\d.]+x) less", out).groups()


DOCS = [
    Figure("the hooks' own seconds: {} to {} ms for the {} points", LOGS + "cpu/timeline/cost-stage3-d365845.txt",
           r"hooks' own seconds in the last traced step \((\d+) points\): ([\d.]+), ([\d.]+), ([\d.]+)$",
           show=lambda points, *s: (round(1000 * float(min(s))), round(1000 * float(max(s))), points),
           page="docs/measurement.md"),
    Figure("the step peaks at {} GiB in the output layer's backward", LOGS + "h200/35-trace/timeline/stage3_r8_summary.txt",
           r"^step 3: peak ([\d.]+) GiB, first seen at event \d+ of \d+: between gathered model bwd and gathered "
           r"lm_head bwd", page="docs/measurement.md"),
    Figure('prints "peak {} GiB -> {} GiB ({} less, expected {} less or better: theory predicts {} less"',
           f"report.py {H200_DEFAULT}", r"peak ([\d.]+) GiB -> ([\d.]+) GiB \(([\d.]+x) less, expected ([\d.]+x) less "
           r"or better: theory predicts ([\d.]+x) less", command=True, page="docs/measurement.md"),
    Figure("{} rank records and {} traced timelines, Hugging Face models and parameter offload among them: {} of {} "
           "within 5%, from {} to {}", EVERY_PEAK, r"^(\d+) rank records and (\d+) timelines: (\d+) of (\d+) within 5%, "
           r"\d+ within 2%; from ([-+][\d.]+%) to ([-+][\d.]+%)", page="docs/measurement.md"),
    Figure("again at step 6: {} to {} minutes in all in its five runs here", LOGS + "h200x2/13-fsdp2/10-deepcompile",
           "", page="docs/zero3-vs-fsdp2.md", read=compile_minutes),
    Figure("after {} to {} minutes of compiling", LOGS + "h200x2/13-fsdp2/10-deepcompile", "", page="BENCHMARKS.md",
           read=compile_minutes),
    Figure("its walk of `train_gpt.py:main:argv` makes {} stays in {} rooms",
           LOGS + "cpu/structure/walk-argv-179ec1a.txt", r"^(\d+) stays; (\d+) rooms;", page="docs/layout.md"),
    # (b)'s expectation on the goals' row, as today's report.py prints it on the three folders
    Figure("3.99x on 4 rehearsed ranks ({} expected), 2.22x on 2 GPUs ({}); with an older stage-3 config, 5.00x on 8 "
           "rehearsed ranks ({})", f"report.py {GOALS[0]} {GOALS[1]} {GOALS[2]}", "", command=True,
           page="BENCHMARKS.md", read=lambda: tuple(expected(folder)[0] for folder in GOALS)),
    Figure('([33-suite]({}/): "expected {} less or better: theory predicts {} less"), on 2 GPUs ([15-final5]({}/): {}, '
           "theory {}) and on 8 rehearsed ranks ([10-final]({}/): {}, theory {}).", f"report.py {GOALS[0]}", "",
           command=True, page="BENCHMARKS.md", read=lambda: tuple(x for folder in GOALS for x in (folder,
                                                                                                  *expected(folder)))),
    # docs/zero3-vs-fsdp2.md
    Figure("| FSDP2 | {} tokens/s, peak {} GiB per rank | {} tokens/s, {} GiB |", EAGER_MB2, "", page=FSDP2_PAGE,
           read=lambda: (cell(EAGER_MB2, "tokens/s", "fsdp2"), cell(EAGER_MB2, "peak memory", "fsdp2"),
                         cell(EAGER_MB16, "tokens/s", "fsdp2"), cell(EAGER_MB16, "peak memory", "fsdp2"))),
    Figure("| stage 3, `ds_config_stage3.json` | {} ({} FSDP2's), {} GiB | {} ({}), {} GiB |", EAGER_MB2, "",
           page=FSDP2_PAGE, read=lambda: tuple(f(folder) for folder in (EAGER_MB2, EAGER_MB16) for f in (
               lambda d: cell(d, "tokens/s", "stage3"), lambda d: against(d, "stage 3"),
               lambda d: cell(d, "peak memory", "stage3")))),
    Figure("| stage 3 with DeepCompile | {} ({}), {} GiB | {} ({}), {} GiB |", DC_MB2, "", page=FSDP2_PAGE,
           read=deepcompile_row),
    Figure("the same call: {} and {} tokens/s there", DC_MB16, "", page=FSDP2_PAGE,
           read=lambda: (cell(DC_MB2_PEER, "tokens/s", "fsdp2"), cell(DC_MB16, "tokens/s", "fsdp2"))),
    Figure("Every run's losses agree with FSDP2's in the same call to {} at every step", EAGER_MB2, "", page=FSDP2_PAGE,
           read=agree_with_fsdp2),
    Figure("FSDP2 hold the same {} GiB of model states per rank", EAGER_MB2, "", page=FSDP2_PAGE, read=same_model_states),
    Figure("ranged from {} to {} tokens/s between machines", F2 + "1-peer/mb2.txt", "", page=FSDP2_PAGE,
           read=lambda: (re.search(r"^tokens/s +([\d,]+)", (ROOT / F2 / "1-peer/mb2.txt").read_text(), re.M).group(1),
                         cell(DC_MB2_PEER, "tokens/s", "fsdp2"))),
    Figure("gave {} at micro batch 16 ({} against {} tokens/s) and {} at 2 ({} against {},", REPEAT_MB16, "",
           page=FSDP2_PAGE, read=lambda: tuple(f(folder) for folder in (REPEAT_MB16, REPEAT_MB2) for f in (
               lambda d: against(d, "stage3_deepcompile"), lambda d: cell(d, "tokens/s", "stage3_deepcompile"),
               lambda d: cell(d, "tokens/s", "fsdp2")))),
    Figure("At 16 it is on par ({} to {} in three calls,", DC_SUB1E9, "", page=FSDP2_PAGE, read=on_par),
    Figure("it peaks higher than eager stage 3 ({} against {} GiB)", DC_MB2, "", page=FSDP2_PAGE,
           read=lambda: (cell(DC_MB2, "peak memory", "stage3_deepcompile"), cell(EAGER_MB2, "peak memory", "stage3"))),
    Figure("at step 3 its loss was {} where eager stage 3's was {} (", F2 + "2-levers", "", page=FSDP2_PAGE,
           read=compiled_against_eager),
    Figure("at run.sh's default {} and {} s a step more than FSDP2, which handles one flat buffer per block (two "
           "calls: 15-final5, 11-deepcompile-mb2)", EAGER_MB2, "", page=FSDP2_PAGE, read=host_work_per_step),
    Figure("that took stage 3 from {}–{} of FSDP2's tokens/s to {}–{}", F2 + "5-levers/mb2.txt", "", page=FSDP2_PAGE,
           read=plain_linear),
    Figure("Without checkpointing it costs {} GiB at micro batch 2 and 16 alike", F2 + "9-final4/r", "", page=FSDP2_PAGE,
           read=linear_without_checkpointing),
    Figure("stage 3 ran at {} stage 0's tokens/s at micro batch 2", LOGS + "h200x2/stages0123-2gpus/report.txt",
           r"^tokens/s +([\d,]+) +[\d,]+ +[\d,]+ +([\d,]+)$", lambda s0, s3: (ratio(s3, s0),), page=FSDP2_PAGE),
    Figure("and {} at micro batch 32 ({} MFU)", LOGS + "h200x2/run_2gpus_mb32.txt",
           r"^tokens/s +([\d,]+) +([\d,]+) .*\n^MFU +[\d.]+% +([\d.]+%)", lambda s0, s3, mfu: (ratio(s3, s0), mfu),
           page=FSDP2_PAGE),
    Figure("at run.sh's default it comes within {} GiB", EAGER_MB2, "", page=FSDP2_PAGE,
           read=lambda: (gib_apart(cell(EAGER_MB2, "peak memory", "stage3"), cell(EAGER_MB2, "peak memory", "fsdp2")),)),
    Figure("and bf16 gradient partition ({} GiB here)", EAGER_MB2, "", page=FSDP2_PAGE, read=lambda: (
        lambda b: (f"{(b['params'] + b['grads']) / 2**30:.2f}",))(records(EAGER_MB2, "stage3")[0]["model_state_breakdown"])),
    Figure("a time instead of the whole partition: {}–{} GiB less", F2 + "5-levers/mb2.txt", "", page=FSDP2_PAGE,
           read=lambda: tuple(sorted(gib_apart(table_cell(f, "peak memory", a), table_cell(f, "peak memory", b))
                                     for f, a, b in ((F2 + "5-levers/mb2.txt", "stage3_p0", "stage3_p0sg"),
                                                     (F2 + "6-fast-sharding/mb2.txt", "stage3_plainfs", "stage3_plainfssg"))))),
    Figure("at most 1e8 elements gathered ahead: {} GiB less with checkpointing", F2 + "14-live/mb2.txt",
           r"--stage 3 --steps 8\n[\s\S]*?Rank 0 peak memory: ([\d.]+) GiB[\s\S]*?--config ds_config_stage3_live1e8.json "
           r"--steps 8\n[\s\S]*?Rank 0 peak memory: ([\d.]+) GiB", lambda a, b: (gib_apart(a, b),), page=FSDP2_PAGE),
    Figure("After an engine start of {} to {} s ({} to {} s eager, in 15-final5 and 11-deepcompile-mb2)", F2 + "15-final5", "", page=FSDP2_PAGE,
           read=engine_start),
    Figure("by up to {}, and later losses by up to {}", F2 + "6-fast-sharding/r", "", page=FSDP2_PAGE,
           read=fast_sharding_losses),
    # docs/running.md
    Figure("it changed the losses ({} against {} at step 3;", F2 + "2-levers", "", page=RUNNING,
           read=compiled_against_eager),
    Figure("on 2 H200s {}–{} FSDP2's speed at micro batch 2 and {}–{} at 16", DC_MB16, "", page=RUNNING,
           read=deepcompile_ranges),
    Figure("none was left {} s after the SIGKILL", LOGS + "cpu/faults/sigkill-group.txt", r"^([\d.]+) \[\]$",
           page=RUNNING),
    Figure("freed the GPU in {} s with one rank and in {} s with 4", LOGS + "h200/21-verdict/2-warm", "", page=RUNNING,
           read=lambda: tuple(re.search(r"GPU back to 0 MiB after ([\d.]+) s", (ROOT / LOGS / "h200/21-verdict/2-warm" / f)
                                        .read_text()).group(1)[:-1] for f in ("interrupt_ranks1.txt", "interrupt_default.txt"))),
    Figure("GPU peak from {} to {} GiB and ZeRO-Infinity to {} GiB, at {}–{}x and {}–{}x the step time of stage 3. The "
           "host then held {}–{} GiB", OFFLOAD_FINAL, "", page=RUNNING, read=offload_on_one_h200),
    Figure("stage 3 peaks at {} GiB", LOGS + "h200/5-stages-offload-cap/cap20-2ranks", "", page=RUNNING,
           read=lambda: (f"{float(cell(LOGS + 'h200/5-stages-offload-cap/cap20-2ranks', 'peak memory', 'stage3')):.1f}",)),
    Figure("stage 3 peaks at {} GiB per rank", LOGS + "h200/5-stages-offload-cap/2.7b-4ranks", "", page=RUNNING,
           read=lambda: (f"{float(cell(LOGS + 'h200/5-stages-offload-cap/2.7b-4ranks', 'peak memory', 'stage3')):.1f}",)),
    Figure("launchers/start.txt): Open MPI {});", LOGS + "cpu/launchers/start.txt", r"mpirun \(Open MPI\) ([\d.]+)$",
           page=RUNNING),
    Figure("start.sh from nothing, installing its packages, took {} s, and the launches with it {} s in all",
           LOGS + "cpu/launchers/pytest.txt", "", page=RUNNING, read=lambda: (
               str(round(float(re.search(r"^start.sh: ([\d.]+) s", (ROOT / LOGS / "cpu/launchers/start.txt").read_text(),
                                         re.M).group(1)))),
               str(round(float(re.search(r"^start.sh and the launches: ([\d.]+) s", (ROOT / LOGS / "cpu/launchers/pytest.txt")
                                         .read_text(), re.M).group(1)))))),
    Figure("at a load of {} from other work (`benchmarks/launchers.sh`); {} s at a load of {}", LOGS + "cpu/launchers", "",
           page=RUNNING, read=launch_loads),
    Figure("whose gloo steps took {} to {} s", LOGS + "h200/21-verdict/2-warm/interrupt_default.txt", "", page=RUNNING,
           read=lambda: (lambda times: (f"{min(times):.1f}", f"{max(times):.1f}"))([float(s) for s in re.findall(
               r"step \d+/\d+ .* time ([\d.]+)s", (ROOT / LOGS / "h200/21-verdict/2-warm/interrupt_default.txt").read_text())])),
    Figure("(a JIT build, once: {} s on an H200's host", LOGS + "h200/5-stages-offload-cap/cpu_adam_prebuild.log",
           r"^real\t0m([\d.]+)s$", lambda s: (str(round(float(s))),), page=RUNNING),
    Figure("here stage 3's from 2 CPU processes at {} ([{}](../{})): ``` {} ```", STEP_LINE,
           r"^== stage3:[\s\S]*?^(\[ *[\d.]+s\] step 2/3 .*)$",
           lambda line: (commit_of(STEP_LINE), STEP_LINE.rpartition("/")[2], STEP_LINE, line), page=RUNNING),
    Figure("DeepSpeed's CPU all-reduce maps a {} MiB buffer per rank", LOGS + "cpu/shm-buffers.txt",
           r" (\d+) \w+ +\d+ [\d:]+ deepspeed_allreduce_buffer_", lambda b: (f"{int(b) / 2**20:.0f}",), page=RUNNING),
    # docs/hugging-face.md
    Figure("{} tiny configs of families this code was not written for ({}) PASS through run.sh on 2 CPU ranks",
           HELD_OUT_FAMILIES, "", page="docs/hugging-face.md", read=held_out_families),
    Figure("So do {} of the {} tiny configs that a held-out battery wrote by hand for {} families", HELD_OUT_SAVED, "",
           page="docs/hugging-face.md", read=held_out_saved),
    # docs/layout.md
    Figure("Over the test suite it found {} values outside their hints at a4e63fc", TYPES + "hints-runtime-a4e63fc.txt",
           r"^(\d+) distinct values outside their hints", page="docs/layout.md"),
    Figure("at 9aae04a, with the fields checked too, {} in {} tests", TYPES + "hints-runtime-9aae04a.txt",
           r"^(\d+) passed, [\s\S]*^(\d+) distinct values outside their hints",
           lambda passed, found: ("none" if found == "0" else found, passed), page="docs/layout.md"),
    Figure("finds {} errors at 48399c8", TYPES + "mypy-48399c8.txt", r"^Found (\d+) errors in", page="docs/layout.md"),
    # docs/result-keys.md
    Figure("(the embeddings: {} of the tiny model's at 2 ranks, {} of 1.3b's at 4)", OLDEST + "default", "",
           page="docs/result-keys.md", read=lambda: tuple(
               re.search(r"stage3 (\d+%)/\d+%/\d+%; FAILED", (ROOT / OLDEST / run / "report.txt").read_text()).group(1)
               for run in ("quick/quick-0.19.2/20261201-141837-YLA6", "default/full-0.19.2/20261201-142244-Kco8"))),
    # docs/measurement.md: the runs without a recorded config
    Figure("2 H200s ([10-final](../benchmarks/logs/h200x2/10-final/results/20261130-135408-BSt7/)) | {} GiB | {} GiB | {} (",
           LOGS + FP32_STAGE0, "", page=MEASUREMENT, read=lambda: held_out(FP32_STAGE0, "stage0")),
    Figure("([stages0123-2gpus](../benchmarks/logs/h200x2/stages0123-2gpus/)) | {} GiB | {} GiB | {} |\n"
           "| stage 2, the same | {} GiB | {} GiB | {} |", STAGES0123, "", page=MEASUREMENT,
           read=lambda: held_out("h200x2/stages0123-2gpus", "stage1") + held_out("h200x2/stages0123-2gpus", "stage2")),
    Figure("([all-stages-4ranks](../benchmarks/logs/h200/5-stages-offload-cap/all-stages-4ranks/)) | {} GiB | {} GiB | **{}** |\n"
           "| stage 2, the same | {} GiB | {} GiB | {} |", LOGS + ALL_STAGES_4, "", page=MEASUREMENT,
           read=lambda: held_out(ALL_STAGES_4, "stage1") + held_out(ALL_STAGES_4, "stage2")),
    Figure("peaked at the same {} bytes", LOGS + ALL_STAGES_4, "", page=MEASUREMENT, read=same_peak_at_stages_1_and_2),
    Figure("from {} to {} at micro batch 2 and from {} to {} at micro batch 16", MFU_BASELINES, "", page=MEASUREMENT,
           read=lambda: tuple(last_mfu(log) for log in ("s3_mb2", "s3_blocks_mb2", "s3_mb16", "s3_blocks_mb16"))),
    Figure("gave the 4-rank rehearsal and micro batch 16 within {} on the model states and on the peaks",
           LOGS + "plan/planned-against-measured.txt", "", page=MEASUREMENT, read=planned_against_measured),
    Figure("it is the peak: {} and {} GiB measured on 2 and 4 rehearsed ranks, {} and {} predicted; `ds_config_stage3.json` "
           "at 1e9, {} against {}", LIVE + "1-live", "", page=MEASUREMENT, read=lambda: (
               traced("1-live/timeline_offload_r2.txt")[0], traced("1-live/timeline_offload_r4.txt")[0],
               traced("1-live/timeline_offload_r2.txt")[1], traced("1-live/timeline_offload_r4.txt")[1],
               *traced("2-cap/timeline_stage3_live1e9.txt")[:2])),
    Figure("The offload config at 1e8 peaked at {} GiB in the loss's backward", LIVE + "2-cap", "", page=MEASUREMENT,
           read=lambda: traced("2-cap/timeline_offload_live1e8.txt")[:1]),
    Figure("as backward's start predicts: {}, {}.", LIVE + "2-cap", "", page=MEASUREMENT,
           read=lambda: traced("2-cap/timeline_offload_live1e8.txt")[1:3]),
    Figure("the 2.7b model offloaded on 2 ranks, {} GiB against {} measured; 350m offloaded on 2, {} against {} ({};",
           LIVE + "3-held", "", page=MEASUREMENT, read=lambda: (
               *held("offload_2.7b_r2")[::-1], *held("offload_350m_r2")[::-1],
               f"{float(held('offload_350m_r2')[1]) / float(held('offload_350m_r2')[0]) - 1:+.0%}".replace("+", ""))),
    Figure("to backward's start with {}M of its 353M partitioned elements gathered, now {}, {});", LIVE + "4-trace350m", "",
           page=MEASUREMENT, read=lambda: (lambda t: (str(round(int(t[3].replace(",", "")) / 1e6)), t[1], t[2]))(
               traced("4-trace350m/timeline_offload350m_r2.txt"))),
    Figure("`ds_config_stage3.json` at 1e9 on 4 ranks, {} against {}.", LIVE + "3-held", "", page=MEASUREMENT,
           read=lambda: held("live1e9_r4")[::-1]),
    Figure("these are the biases and LayerNorm weights: {} tensors and {} elements", DEFAULT_33,
           r'"persistent_tensors": ([1-9]\d*),[\s\S]*?"persistent_elems": (\d+)', lambda t, e: (t, f"{int(e):,}"),
           page=MEASUREMENT),
    Figure("4 ranks of the 1.3b model that is {} to {} of the gradients", S1_R4, "", page=MEASUREMENT, read=lambda: (
        f"{min(d['held_fraction']['grads'] for d in records(S1_R4, 'stage1')):.1%}".removesuffix("%"),
        f"{max(d['held_fraction']['grads'] for d in records(S1_R4, 'stage1')):.1%}")),
    Figure("on 4 ranks of 1.3b, {} GiB against {} on the others", S12_R4, "", page=MEASUREMENT, read=lambda: (
        lambda peaks: (f"{peaks[0]:.2f}", *{f"{p:.2f}" for p in peaks[1:]}))(
            [step_peak(d) / 2**30 for d in sorted(records(S12_R4, "stage1"), key=lambda d: d["rank"])])),
    Figure("predicted at {} GiB before it ran, peaked at {} ({})", S1_R4, "", page=MEASUREMENT, read=lambda: (
        lambda r: (f"{r['predicted_peak_bytes'] / 2**30:.2f}", f"{step_peak(r) / 2**30:.2f}",
                   f"{r['predicted_peak_bytes'] / step_peak(r) - 1:+.2%}"))(records(S1_R4, "stage1")[0])),
    Figure("30.40 GB at 1.3b on one H200 against {} GB of host tensors", OFFLOAD_92VQ, "",
           page=MEASUREMENT, read=lambda: (lambda r: (f"{(r['host_state_bytes'] + r['host_state_breakdown']['other']) / 1e9:.2f}",))(
               records(OFFLOAD_92VQ, "stage3_offload")[0])),
    Figure("The process's peak resident set is more: {} GB", OFFLOAD_92VQ, "", page=MEASUREMENT,
           read=lambda: (f"{step_rss(records(OFFLOAD_92VQ, 'stage3_offload')[0]) / 1e9:.2f}",)),
    Figure("All {} committed runs at stage 3 that offload the optimizer alone ([h200](../benchmarks/logs/h200/) and "
           "[h100](../benchmarks/logs/h100/4-offload-step/), {} rank records,", LOGS + "h100/4-offload-step", "",
           page=MEASUREMENT,
           read=lambda: offload_host()[:2]),
    Figure("prefetch caps of 1e8 to 1e9) are within {}, and the five with the parameters offloaded too (1.3b on one rank, "
           "`h200/36-step-time`, `h200/38-step-time2`) within {} ({} to {} GB, {} predicted).", LOGS + "h200", "",
           page=MEASUREMENT, read=lambda: offload_host()[2:]),
    Figure("The 2.7b model on one rank was predicted before it ran: {} GB, {} measured", LOGS + "h200/29-live/5-host", "",
           page=MEASUREMENT, read=host_2_7b_on_one_rank),
    Figure("(tiny on 2 rehearsed ranks under DeepSpeed {} to {}, where the workspace is {} to {} of stage 0's peak: "
           "within {} at stage 3 and {} to {} at stage 0)", OLDEST + "quick", "", page=MEASUREMENT, read=oldest_tiny),
    Figure("tiny's stage 3 had been predicted {} over ({} GiB against {})", OLDEST + "quick", "", page=MEASUREMENT,
           read=lambda: (lambda old: (f"{old[1] / old[0] - 1:.0%}", f"{old[1] / 1024:.2f}", f"{old[0] / 1024:.2f}"))(
               [float(cell(OLDEST + "quick/quick-0.19.3/20261201-141838-YAOB", row, "stage3").removesuffix(" MiB"))
                for row in ("peak memory", "  estimated")])),
    Figure("2.7b on 4) were within {} on every rank", LOGS + "h200/32-s12", "", page=MEASUREMENT, read=held_out_stage_1),
    Figure("counts 18 bytes per partition element, {}–{} above the measurement at stages 1 to 3 on the 1.3b model",
           LOGS + ALL_STAGES_4, "", page=MEASUREMENT, read=lambda: (lambda over: (f"{min(over):.0%}".removesuffix("%"),
               f"{max(over):.0%}"))([float(cell(LOGS + ALL_STAGES_4, "  DeepSpeed estimator", run).removesuffix(" GiB"))
                                     / float(cell(LOGS + ALL_STAGES_4, "model states", run).removesuffix(" GiB")) - 1
                                     for run in ("stage1", "stage2", "stage3")])),
    Figure("12 bytes a logit: within {} of an H200 at {} and {}, micro batch {} to {}, {} and {}",
           LOGS + "h200/31-suite/probe/output_layer.jsonl", "", page=MEASUREMENT, read=output_layer_probe),
    Figure("keeps ({} GB at 1.3b, {} to {} measured between the two offload configs' resident sets when the engine is "
           "ready, in the three pairs of runs", LOGS + "h200/36-step-time", "", page=MEASUREMENT, read=offloaded_weights),
    Figure("the 350m model offloaded on one rank ({} GiB predicted against {},", OFFLOAD_350M, "", page=MEASUREMENT,
           read=lambda: (cell(OFFLOAD_350M, "  estimated", "stage3_offload"), cell(OFFLOAD_350M, "peak memory", "stage3_offload"))),
    Figure("predicted states and buffers was {} to {} MB)", LOGS + "h200/24-peaks", "", page=MEASUREMENT, read=workspace_fit),
    Figure("in fp32 at 1.3b {} GB, {} of the peak", LOGS + FP32_STAGE0, "", page=MEASUREMENT,
           read=lambda: all_reduce_copy()[:2]),
    Figure("({} without the all-reduce's copy) |", LOGS + FP32_STAGE0, "", page=MEASUREMENT,
           read=lambda: all_reduce_copy()[2:]),
    Figure("{} GB above backward's start as predicted at stage 1 and {} GB at stage 2", LOGS + ALL_STAGES_4, "",
           page=MEASUREMENT, read=above_backwards_start),
    Figure("Predicted {} and {} over the reductions traced on 2 and 8 ranks", LOGS + "h200/35-trace", "",
           page=MEASUREMENT, read=reductions_traced),
    Figure("within {} bytes of the census in each offload run of", LOGS + "h200/5-stages-offload-cap", "",
           page=MEASUREMENT, read=cpu_adam_grads_against_census),
    Figure("measures {} MB above what the rank held before the logits", LOGS + "h200/30-steady/1-probe/output_layer.jsonl",
           "", page=MEASUREMENT, read=lambda: output_layer_350m_mb2()[:1]),
    Figure("and the term had counted {} MB", LOGS + "h200/30-steady/1-probe/output_layer.jsonl", "", page=MEASUREMENT,
           read=lambda: output_layer_350m_mb2()[1:]),
    Figure("within {} in all {} cases, {} of them exact)", LOGS + "cpu/prefetch", "", page=MEASUREMENT,
           read=prefetch_cases),
    Figure("its config: on an H200, {} GiB for the 2.7b model at stage 2 on 4 rehearsed ranks", LOGS + "h200/32-s12/results/s12_2.7b_r4",
           "", page=MEASUREMENT, read=lambda: allocator_reserve()[:1]),
    Figure("on an H100, {} GiB beyond for Qwen1.5-MoE cut to 2 layers", LOGS + "h100/7-families/results", "",
           page=MEASUREMENT, read=lambda: allocator_reserve()[1:2]),
    Figure("buckets, reserved up to {} GiB beyond", LOGS + "h200/28-suite-matrix/2-batch/results/original_design", "",
           page=MEASUREMENT, read=lambda: allocator_reserve()[2:]),
    Figure("At world 1 the {} committed runs are planned within {}", LOGS + "plan/step-check-18aea3b.txt", "",
           page=MEASUREMENT, read=step_check),
    Figure("where the GPU holds the step, are within {}; at micro batch 2 the host holds it, and that machine's host was "
           "faster: planned {} to {} too long", LOGS + "plan/two-gpus-f5a2c43.txt", "", page=MEASUREMENT, read=two_gpus),
    Figure("3_infinity's parts took {} to {} core-ns per element from 2^23 to 2^27 elements, and {} to {} at 2^20",
           LOGS + "cpu/hostpass/rate-f86c18c.txt", "", page=MEASUREMENT, read=host_pass_rate),
    Figure("CPU Adam's op, {} s on this project's 2 shared cores; after it a run loads it in {} to {} s",
           LOGS + "cpu/hostpass/cost-f86c18c.txt", "", page=MEASUREMENT, read=host_pass_cost),
    Figure("for 1.3b ({} s for `3_offload`, {} s for `3_infinity`", LOGS + "plan/step-check-18aea3b.txt",
           r"CPU Adam on 16 cores: 3_offload ([\d.]+) s, 3_infinity ([\d.]+) s", page=MEASUREMENT),
    Figure("the {} committed offload runs at world 1 of 36-step-time and 38-step-time2 are within {}",
           LOGS + "plan/offload-assumed-f86c18c.txt", r"^worst ([\d.]+%) over (\d+) runs", lambda w, n: (n, w),
           page=MEASUREMENT),
    # docs/training-recipe.md
    Figure("ran {} slower on an H200 ({} ms against {} ms forward and backward", LOGS + "h200/1-first-look/env.txt",
           r"^vocab 50257: .* ([\d.]+) ms,[\s\S]*^vocab 50304: .* ([\d.]+) ms,",
           lambda a, b: (f"{float(a) / float(b):.1f}x", f"{float(a):.1f}", f"{float(b):.1f}"), page=RECIPE),
    Figure("rose alike at both stages ({}, {}, {} on 2 rehearsed ranks of an H200", RECIPE_FP16 + "/report.txt",
           r"stage 0 ([\d.]+) -> ([\d.]+) -> ([\d.]+);", page=RECIPE),
    Figure("it trailed stage 3 by {} at step 3", LOGS + "h200/26-off-default/2-probe/fp16_p12_r2.txt",
           r"stage 0 [\d.]+ -> [\d.]+ -> ([\d.]+); stage 3 [\d.]+ -> [\d.]+ -> ([\d.]+);",
           lambda s0, s3: (f"{float(s0) / float(s3) - 1:.0%}",), page=RECIPE),
    Figure("the first update at stage 0 moved the weight matrices {} as far as at stage 1", LOGS + "cpu/priming-step.txt",
           r"^stage 0 keeping the priming step: .* ([\d.]+) of lr$", page=RECIPE),
    Figure("differed by {} at step 2 ({} against {};", STAGES0123 + "/report.txt",
           r"stage 0 [\d.]+ -> ([\d.]+) -> [\d.]+; stage 3 [\d.]+ -> ([\d.]+) ->",
           lambda s0, s3: (f"{1 - float(s0) / float(s3):.0%}", s0, s3), page=RECIPE),
    Figure("with the fix they agree to {} at every step", LOGS + "h200x2/10-final/sweep/report.txt", "", page=RECIPE,
           read=lambda: (max(re.findall(r"the stages agree to ([\d.]+%) at every step",
                                        (ROOT / LOGS / "h200x2/10-final/sweep/report.txt").read_text()),
                       key=lambda v: float(v[:-1])),)),
    Figure("At 1e-5 the 1.3b loss rose at step 2 ({} → {})", STAGES0123 + "/report.txt",
           r"stage 3 ([\d.]+) -> ([\d.]+) ->", page=RECIPE),
    Figure("made bf16 rise at step 3 on 2 GPUs ({} → {})", RECIPE_2GPUS + "/20261130-133806-hn0t/report.txt",
           r"stage 0 [\d.]+ -> ([\d.]+) -> ([\d.]+);", page=RECIPE),
    Figure("| checkpointing on (default) | {}, {} GiB | {}, {} GiB |", RECIPE_2GPUS + "/20261130-133806-hn0t/report.txt",
           PEAK_PAIR, lambda p0, p3, t0, t3: (t0, p0, t3, p3), page=RECIPE),
    Figure("| `--no-checkpoint` | {}, {} GiB | {}, {} GiB |", RECIPE_2GPUS + "/20261130-133930-37Ih/report.txt",
           PEAK_PAIR, lambda p0, p3, t0, t3: (t0, p0, t3, p3), page=RECIPE),
    Figure("It cost stage 3 {} of its tokens/s and stage 0 {}.", RECIPE_2GPUS, "", page=RECIPE, read=checkpoint_cost),
]

# Numbers of the README's prose that no run made: the specification's, the code's settings, names and citations.
NOT_FROM_A_RUN = {
    "1.3B", "1.3b", "2.7b", "6.7b",  # the presets' names
    "2020",  # the ZeRO paper's year
    "0", "1", "2", "3", "4", "5", "8", "16", "64", "1024",  # stages, ranks, steps, exit statuses, bytes, GPU counts
    "3–4x", "10",  # the acceptance checks' words ("about 10 to below about 8")
    "2.6",  # FSDP2 needs torch 2.6 (zero3bench/compat.py)
    "0.19.3",  # the oldest DeepSpeed that passes, named in requirements.txt
}


def readme() -> str:
    return README.read_text()


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def source(figure: Figure) -> str:
    if figure.read:
        return ""
    if not figure.command:
        return (ROOT / figure.log).read_text()
    return subprocess.run([sys.executable, *figure.log.split()], cwd=ROOT, capture_output=True, text=True,
                          timeout=120).stdout


@pytest.mark.parametrize("figure", FIGURES + DOCS, ids=lambda f: f"{f.page}: {f.text[:40]}")
def test_each_figure_is_what_its_source_says(figure):
    assert flat(figure.text.format(*figure.values(source(figure)))) in flat((ROOT / figure.page).read_text())


@pytest.mark.parametrize("figure", [f for f in FIGURES + DOCS if not f.command], ids=lambda f: f"{f.page}: {f.log}")
def test_each_page_links_each_log_it_takes_a_figure_from(figure):
    page = ROOT / figure.page
    linked = {(page.parent / t.partition("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
              if not re.match(r"[a-z]+:", t)}
    log = (ROOT / figure.log).resolve()
    assert any(log == t or t in log.parents for t in linked)


# -----------------------------------------------------------------------------
# every figure is the newest of its kind

# a log named for the commit it measured (every-peak-9d36bef.txt), and a numbered session's folder (h200/43-suite)
COMMIT = r"(?=[0-9a-f]*\d)[0-9a-f]{7,40}"
COMMIT_NAMED = rf"(?<=-){COMMIT}(?=[-.])"
NUMBERED = r"(?:^|(?<=/))\d+(?=-)"


def kind(log: str) -> re.Pattern:
    """The logs of the same kind as `log`: its path, less the commit its file is named for and the numbers of
    its numbered folders (the same script, in the same setting, run again)."""
    pattern, at = "", 0
    for m in re.finditer(f"(?P<commit>{COMMIT_NAMED})|(?P<number>{NUMBERED})", log):
        pattern += re.escape(log[at:m.start()]) + (r"\d+" if m["number"] else "[0-9a-f]{7,40}")
        at = m.end()
    return re.compile(pattern + re.escape(log[at:]) + "$")


def git(*args: str) -> str | None:
    found = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


@functools.cache
def commit_of(log: str) -> str | None:
    """The commit a log speaks of: the one its file is named for, else the one that added it; None where git has
    not seen it (a log not committed yet)."""
    named = re.search(COMMIT_NAMED, log.rpartition("/")[2])
    return named[0] if named else ((git("log", "--diff-filter=A", "--format=%h", "--", log) or "").split() or
                                   [None])[-1]


@functools.cache
def age(log: str) -> tuple:
    """How new a log is, among those of its kind: its folders' numbers, then when its commit was made; a log not
    committed yet is the newest."""
    numbers = tuple(int(n) for n in re.findall(NUMBERED, log))
    commit = commit_of(log)
    made = commit and git("log", "-1", "--format=%ct", commit, "--")
    return numbers + (int(made) if made else float("inf"),)


def newest_of_kind(log: str) -> str:
    pattern = kind(log)
    glob = re.sub(f"{COMMIT_NAMED}|{NUMBERED}", "*", log)
    same = [str(p.relative_to(ROOT)) for p in ROOT.glob(glob)]
    return max([x for x in same if pattern.match(x)], key=age)


def says_its_commit(figure: Figure, commit: str) -> bool:
    """Whether the paragraphs of the page that hold the figure name the commit it speaks of, in their words (not
    in a link)."""
    paragraphs = [flat(p).strip() for p in (ROOT / figure.page).read_text().split("\n\n")]
    starts = [sum(len(p) + 1 for p in paragraphs[:i]) for i in range(len(paragraphs) + 1)]
    said = flat(figure.text.format(*figure.values(source(figure)))).strip()
    start = " ".join(paragraphs).find(said)
    held = [p for p, a, b in zip(paragraphs, starts, starts[1:]) if start >= 0 and a < start + len(said) and b > start]
    return any(commit[:7] in re.sub(r"\[[^\]]*\]\([^)]*\)", "", p) for p in held)


def newest_values(figure: Figure, log: str):
    try:
        return figure.values((ROOT / log).read_text())
    except AssertionError:  # the newest log of its kind no longer says it
        return None


@pytest.mark.skipif(git("rev-parse", "HEAD") is None, reason="the logs' history needs git")
@pytest.mark.parametrize("figure", [f for f in FIGURES + DOCS if not f.command and not f.read],
                         ids=lambda f: f"{f.page}: {f.text[:40]}")
def test_each_figure_is_what_the_newest_log_of_its_kind_says_or_its_page_says_of_which_commit(figure):
    newest = newest_of_kind(figure.log)
    commit = commit_of(figure.log)
    if newest == figure.log or commit and says_its_commit(figure, commit):
        return
    cited, now = figure.values(source(figure)), newest_values(figure, newest)
    assert cited == now, (f"{figure.page}'s {figure.text!r} is {cited} from {figure.log}; the newest log of its kind, "
                          f"{newest}, says {now}: take the figure from that log, or say in its paragraph at which "
                          f"commit ({commit}) it speaks")


def test_a_logs_kind_is_its_path_less_the_commit_it_is_named_for_and_its_sessions_numbers():
    fresh = kind(LOGS + "cpu/ci/readme-fresh-clone-4453279.txt")
    assert fresh.match(LOGS + "cpu/ci/readme-fresh-clone-046398c.txt")
    assert not fresh.match(LOGS + "cpu/ci/readme-test-command-0e8d31f.txt")
    assert not fresh.match(LOGS + "cpu/ci/readme-fresh-clone-64f4dd3-one-failure.txt")
    suite = kind(LOGS + "h200/43-suite/tests.txt")
    assert suite.match(LOGS + "h200/45-suite/tests.txt") and not suite.match(LOGS + "h200/31-suite/suite/tests.txt")


@pytest.mark.skipif(git("rev-parse", "HEAD") is None, reason="the logs' history needs git")
def test_the_newest_of_a_kind_is_of_the_latest_commit_and_a_log_not_committed_yet_is_newer():
    assert age(LOGS + "cpu/ci/readme-fresh-clone-046398c.txt") > age(LOGS + "cpu/ci/readme-fresh-clone-4453279.txt")
    assert age(LOGS + "h200/99-suite/tests.txt") == (99, float("inf"))
    older = LOGS + "cpu/ci/readme-fresh-clone-4453279.txt"
    assert newest_of_kind(older) != older


@pytest.mark.parametrize("page, says", [
    ("Tests: 1508 passed ([log](x)), at 4453279.", True),
    ("At 4453279:\n\n```\nTests: 1508 passed\n```", False),  # another paragraph
    ("Tests: 1508 passed ([log at 4453279](x)).", False),  # a link's words
    ("Tests: 1508 passed\n```\nat 4453279\n```", True)])
def test_a_figure_speaks_of_the_commit_that_its_paragraph_names_in_its_own_words(page, says, tmp_path):
    (tmp_path / "page.md").write_text(page)
    figure = Figure("Tests: {} passed", CPU_CI, "", page=str(tmp_path / "page.md"), read=lambda: ("1508",))
    assert says_its_commit(figure, "4453279") == says


def prose_numbers(text: str) -> list[str]:
    """The numbers of the README's prose and tables: code blocks, inline code and link targets left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(rf"\b(?=[0-9a-f]*[a-f]){COMMIT}\b", "", text)  # a commit that it names
    return re.findall(r"(?<![\w.])\d+(?:[.,]\d+)*(?:–\d+x|[A-Za-z]\b)?", text)


def test_the_hugging_face_table_holds_a_row_for_each_committed_run_made_from_its_log():
    """benchmarks/hf_peaks.py's rows, one for each committed results folder of a Hugging Face model on GPUs: 39-hf's
    and 41-hf-rest's 11, and whatever is committed after them."""
    pytest.importorskip("transformers", reason="the runs recorded before issue 56 are counted again from their config")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import hf_peaks
    page = (ROOT / "docs/hugging-face.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| ") and line.endswith(" |")]
    folders = hf_peaks.hf_folders()
    assert len(folders) >= 11
    assert table == hf_peaks.HEADER[:1] + [hf_peaks.row(folder)[0] for folder in folders]


def test_every_number_of_the_readme_is_a_figure_or_named_as_no_run():
    text = flat(readme())
    for figure in FIGURES:
        text = text.replace(flat(figure.text.format(*figure.values(source(figure)))), " ")
    assert sorted(set(prose_numbers(text)) - NOT_FROM_A_RUN) == []


def code_blocks() -> list[tuple[str, str, str]]:
    """(its language, the last line of prose before it, its text) for each fenced block of the README."""
    blocks, prose, lines = [], "", iter(readme().splitlines())
    for line in lines:
        if line.startswith("```"):
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            blocks.append((line[3:], prose, "\n".join(body)))
        elif line.strip():
            prose = line
    return blocks


EXCERPTS = [CPU_CI, H200_DEFAULT + "/report.txt", HF_LLAMA + "/report.txt"]  # logs whose lines the README quotes, in a block after its link


@pytest.mark.parametrize("log", EXCERPTS)
def test_each_excerpt_is_the_logs_lines_in_order(log):
    """The block after the prose that links the log holds its lines, in order, less rows cut (…)."""
    [block] = [text for lang, before, text in code_blocks() if not lang and f"]({log})" in before]
    lines = iter((ROOT / log).read_text().splitlines())
    missing = [line for line in block.splitlines() if not line.startswith("…") and line not in lines]
    assert missing == []


def test_the_plan_example_is_what_its_command_prints_today():
    """The README's plan table is lines of a fresh `python3 plan.py ...`, one after another, as it prints them.
    After a change to plan.py's output, run the command and paste its table."""
    blocks = code_blocks()
    [at] = [i for i, (lang, _, text) in enumerate(blocks) if lang == "bash" and text.startswith("python3 plan.py")]
    command, block = blocks[at][2], blocks[at + 1][2]
    out = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout.splitlines()
    lines = block.splitlines()
    starts = [i for i, line in enumerate(out) if line == lines[0]]
    table = out[out.index(next(line for line in out if line.startswith("setup "))):]
    table = table[:table.index("")] if "" in table else table
    assert any(out[i:i + len(lines)] == lines for i in starts), f"paste {command}'s table:\n" + "\n".join(table)


def test_the_readme_is_a_front_door_of_under_12000_characters_and_200_lines():
    assert len(readme()) < 12000 and len(readme().splitlines()) <= 200
