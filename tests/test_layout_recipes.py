"""docs/layout.md's two recipes, each followed to the letter on a committed results folder (no launch): a new
criterion and a new measured figure show in the report's output and in summary.json."""
import json
import re
from dataclasses import dataclass

import pytest

import report
from conftest import ROOT, planted
from zero3bench import result
from zero3bench.reporting import reading, tables, verdict
from zero3bench.reporting.reading import most

# a healthy CPU run of both stages that PASSes every criterion
HEALTHY = ROOT / "benchmarks" / "logs" / "cpu" / "20261201-132528-s0xf"


@dataclass(frozen=True)
class Gathered:
    """The recipe's figures: the partitioned tensors stage 3 still holds gathered after backward."""
    gathered: int | None  # None where no rank counted them


def no_rank_gathered(dense, zero3) -> tuple[str, Gathered]:
    """Stage 3 holds no partitioned parameter gathered after backward."""
    gathered = most(r.gathered_tensors for r in zero3)
    return ("PASS" if not gathered else "FAIL"), Gathered(gathered=gathered)


def say_no_rank_gathered(f: Gathered) -> str:
    return f"{f.gathered or 0} partitioned tensors still gathered after backward"


@dataclass
class BuiltResult(result.RankResult):
    """RankResult with the recipe's field, as step 2 would add it."""
    build_s: float | None = None  # seconds to build the model on this rank


def reported(folder, capsys) -> tuple[int, str, dict]:
    status = report.main(["--write", str(folder)])
    return status, capsys.readouterr().out, json.loads((folder / "summary.json").read_text())


@pytest.fixture
def healthy(tmp_path, monkeypatch):
    monkeypatch.delenv("RUN_COMMAND", raising=False)  # run.sh's, which would add its report.txt
    return planted(HEALTHY, tmp_path, "stage3", lambda r: r)


def test_a_new_criterion_is_its_figures_function_sentence_and_one_line(healthy, capsys, monkeypatch):
    criterion = verdict.Criterion("(f) stage 3 releases what it gathers", verdict.PAIR, no_rank_gathered,
                                  say_no_rank_gathered)
    monkeypatch.setattr(verdict, "CRITERIA", [*verdict.CRITERIA, criterion])
    status, out, record = reported(healthy, capsys)
    assert status == 0 and out.count("PASS  (") == len(verdict.CRITERIA) == 6
    assert "PASS  (f) stage 3 releases what it gathers: 0 partitioned tensors still gathered after backward" in out
    check = record["checks"]["2 rank(s)"][-1]
    assert check["criterion"] == criterion.name and check["figures"] == {"gathered": 0}


def test_every_check_carries_its_figures_in_summary_json(healthy, capsys):
    _, _, record = reported(healthy, capsys)
    memory = next(c for c in record["checks"]["2 rank(s)"] if c["criterion"].startswith("(b)"))
    assert memory["figures"]["predicted_states_ratio"] == pytest.approx(2.0, rel=0.01)
    assert memory["figures"]["states_ok"] is True


def test_unpaired_runs_name_every_pair_criterion(monkeypatch):
    criterion = verdict.Criterion("(f) a pair criterion", verdict.PAIR, no_rank_gathered, say_no_rank_gathered)
    assert verdict.pair_labels() == "(a) to (c)"
    monkeypatch.setattr(verdict, "CRITERIA", [*verdict.CRITERIA, criterion])
    assert verdict.pair_labels() == "(a), (b), (c), (f)"


def with_build_s(monkeypatch) -> None:
    """Steps 2 and 3 of the recipe for a new measured figure: a field of RankResult, a row of COMPARISON."""
    monkeypatch.setattr(result, "RankResult", BuiltResult)
    monkeypatch.setattr(reading, "RankResult", BuiltResult)
    monkeypatch.setattr(result, "FIELDS", result.FIELDS | {"build_s"})  # as the module computes it at import
    row = tables.Row("build_s", "build s", lambda rs: most(r.build_s for r in rs), ".1f", tables.FASTER[::-1],
                     optional=True, speed=True)
    monkeypatch.setattr(tables, "COMPARISON", [*tables.COMPARISON, row])


def test_a_new_measured_figure_is_its_field_and_one_row(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RUN_COMMAND", raising=False)
    # 1. measured: every rank's RESULT line carries it, as train_gpt.py would print it
    folder = planted(planted(HEALTHY, tmp_path, "stage3", lambda r: {**r, "build_s": 2.5}), tmp_path, "stage0",
                     lambda r: {**r, "build_s": 1.5})
    with_build_s(monkeypatch)
    status, out, record = reported(folder, capsys)
    assert status == 0
    # a time, so marked as no measure of speed on CPU processes
    assert re.search(r"^build s \*\s+1\.5\s+2\.5\s", out, re.MULTILINE), out
    assert [r["build_s"] for name in ("stage0", "stage3") for r in record["results"][name]] == [1.5, 1.5, 2.5, 2.5]


def test_a_new_measured_figure_leaves_the_reports_of_older_logs_as_they_were(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RUN_COMMAND", raising=False)
    folder = planted(HEALTHY, tmp_path, "stage3", lambda r: r)  # a copy: --write writes into it
    _, before, _ = reported(folder, capsys)
    with_build_s(monkeypatch)
    _, after, _ = reported(folder, capsys)
    assert after == before and "build s" not in after
