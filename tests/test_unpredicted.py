"""A record that the prediction could not judge: a GPU rank of a model whose peak is not predicted (a family that
the prediction does not cover), and a pair in which stage 0 did not finish beside stage 3. Nothing that reads
a record crashes, and no criterion passes on a comparison that it did not make (issue 62)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, planted
from zero3bench import explain, finishing, rank_lines
from zero3bench.reporting import reading
from zero3bench.result import RankResult

# one H200 rehearsing the default, 4 ranks of the 1.3b model at stages 0 and 3
DEFAULT = ROOT / "benchmarks/logs/h200/43-suite/gpu/gpu_default0/20261204-204615-JNRy"
# an 80 GB H100 at the default of 7b29559: 4 rehearsed ranks, stage 0 out of memory, stage 3 trained
H100_OOM = ROOT / "benchmarks/logs/h100/1-first-run/results/20261207-042356-ktEG"


def unpredicted(r):
    """r as a model of no known shape leaves it: no predicted activations or peak."""
    return {**r, "model": "a-family-of-its-own", "built": {**r["built"], "shape": None},
            "activation_estimate_bytes": None, "predicted_peak_bytes": None}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unpredicted")
    return planted(planted(DEFAULT, tmp, "stage0", unpredicted), tmp, "stage3", unpredicted)


@pytest.fixture(scope="module")
def records(folder):
    return [r for rs in reading.load_runs(folder).values() for r in rs]


def command(*argv):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_gpu_record_without_a_predicted_peak_is_read_as_a_cuda_rank_with_none(records):
    assert records and all(r.mem_kind == "cuda" and r.predicted.peak is None and r.peaks.peak_mem_bytes
                           for r in records)


def test_explaining_a_gpu_rank_without_a_predicted_peak_names_no_peak_gap(records):
    for r in records:
        assert not any(line.startswith("peak:") for line in explain.differences(r, finishing.held_bytes(r)))


def test_a_gpu_rank_without_a_predicted_peak_still_prints_its_result_line(records, capsys):
    rank_lines.emit(records)
    out = capsys.readouterr().out
    assert out.count("RESULT {") == len(records)
    assert "this model's activations and peak are not predicted" in out


def test_report_writes_every_file_of_a_folder_without_a_predicted_peak(folder):
    proc = command("report.py", "--write", folder)
    assert "Traceback" not in proc.stderr and proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no prediction for the model a-family-of-its-own, so the peak is not judged" in proc.stdout
    summary = json.loads((folder / "summary.json").read_text())
    assert all(r["predicted_peak_bytes"] is None for rs in summary["results"].values() for r in rs)
    assert (folder / "summary.md").stat().st_size and (folder / "memory.png").stat().st_size


def test_plan_from_a_folder_without_a_predicted_peak_answers_in_one_line_or_plans(folder):
    proc = command("plan.py", "--from", folder, "--gpus", "8")
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 2), proc.stderr[-2000:]
    assert proc.returncode == 0 or len(proc.stderr.strip().splitlines()) == 1


# -----------------------------------------------------------------------------
# stage 0 out of memory where stage 3 trained: 4 rehearsed ranks of the 1.3b model on an 80 GB H100


def reported(folder):
    """report.py FOLDER's exit status and its verdict lines, by criterion letter."""
    proc = command("report.py", folder)
    lines = {line.split("(")[1][0]: line.split("(")[0].strip() for line in proc.stdout.splitlines()
             if line.strip().startswith(("PASS  (", "FAIL  (", "NOT OBSERVABLE  ("))}
    return proc, lines


@pytest.fixture(scope="module")
def oom_pair():
    return reported(H100_OOM)


def test_stage_0_out_of_memory_leaves_the_verdict_not_observable_not_pass(oom_pair):
    proc, statuses = oom_pair
    assert proc.returncode == 5 and "VERDICT: NOT OBSERVABLE" in proc.stdout


def test_stage_0_out_of_memory_leaves_each_comparison_with_it_not_observable(oom_pair):
    assert {letter: status for letter, status in oom_pair[1].items() if letter in "ace"} == {
        "a": "NOT OBSERVABLE", "c": "NOT OBSERVABLE", "e": "NOT OBSERVABLE"}


def test_stage_0_out_of_memory_names_the_command_that_would_observe_what_it_did_not(oom_pair):
    out = oom_pair[0].stdout
    for letter in "ace":
        [line] = [line for line in out.splitlines() if f"  ({letter})" in line]
        assert "where stage0 fits" in line or "where stage 0 fits" in line, line
        assert "`--ranks 3`" in line and "`--model 760m`" in line, line


def test_stage_0_out_of_memory_passes_b_on_what_stage_3_alone_shows(oom_pair):
    assert oom_pair[1]["b"] == "PASS"
    assert "only stage 3 trains this model on this hardware" in oom_pair[0].stdout


def test_the_table_sets_no_ratio_against_a_run_that_did_not_finish(oom_pair):
    table = oom_pair[0].stdout.split("REHEARSAL")[0]
    assert "peak memory" in table and " less" not in table and " more" not in table


def test_stage_0_out_of_memory_still_fails_a_stage_3_that_does_not_partition_every_tensor(tmp_path):
    folder = planted(H100_OOM, tmp_path, "stage3", lambda r: {**r, "partitioned_tensors": r["param_tensors"] - 1})
    proc, statuses = reported(folder)
    assert statuses["a"] == "FAIL" and proc.returncode == 1


def test_stage_0_out_of_memory_still_fails_a_stage_3_loss_that_does_not_fall(tmp_path):
    folder = planted(H100_OOM, tmp_path, "stage3", lambda r: {**r, "losses": [11.1, 11.2, 11.3]})
    proc, statuses = reported(folder)
    assert statuses["c"] == "FAIL" and proc.returncode == 1
