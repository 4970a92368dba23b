"""The verdict as a user meets it: what (c) judges, faults that must fail it, what it says with too few steps,
and the screen that run.sh shows."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from zero3bench import options
import report
from zero3bench.reporting import reading, tables, verdict
import train_gpt
from conftest import ROOT, planted


def test_the_first_steps_train_on_the_same_rows_and_later_steps_draw_fresh_ones():
    tokens = np.arange(10_000, dtype=np.uint16)
    rows = [train_gpt.get_batch(tokens, 0, step, 0, 2, 2, 8, "cpu")[0] for step in range(1, 6)]
    assert options.SAME_ROWS_STEPS == verdict.FALLING_STEPS == 3
    assert all((rows[0] == r).all() for r in rows[1:3])
    assert not (rows[0] == rows[3]).all() and not (rows[3] == rows[4]).all()


# what the failing criterion says of a run that trained to its end with the fault: its figures, not "no result"
FAULT_FIGURES = {"(c)": r"stage 3 \d+\.\d{3} -> \d+\.\d{3} -> \d+\.\d{3}",
                 "(d)": r"stage3 \d+%/\d+%/\d+%; FAILED: stage3 not as promised$"}


@pytest.mark.parametrize("fault, criterion", [("lr0", "(c)"), ("zero_grads", "(c)"), ("perturb_shard", "(c)"),
                                             ("keep_block", "(d)"), ("keep_gathered", "(d)")])
def test_a_planted_fault_fails_the_verdict(fault, criterion, planted_faults, capsys):
    # the run with the fault trained to its end on both ranks: a harness that crashed it would fail (d) too
    stage3 = reading.load_runs(planted_faults[fault])["stage3"]
    assert [(r.rank, len(r.steps)) for r in stage3] == [(rank, r.run.steps_planned) for rank, r in enumerate(stage3)]
    assert len(stage3) == 2
    assert report.main([str(planted_faults[fault])]) == report.EXIT["FAIL"]
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if re.match(rf"\s*FAIL  {re.escape(criterion)} ", line)]
    assert re.search(FAULT_FIGURES[criterion], line) and "no result" not in out, line
    assert "VERDICT: FAIL" in out


def test_a_rate_of_0_fails_c_though_both_stages_agree(planted_faults, capsys):
    report.main([str(planted_faults["lr0"])])
    out = capsys.readouterr().out
    assert "stage 0 does not fall as it should" in out and "the stages DIFFER" not in out


ORIGINAL_DESIGN = ROOT / "benchmarks/logs/h200/28-suite-matrix/2-batch/results/original_design"


def test_a_loss_that_rises_alike_at_both_stages_at_a_rate_of_the_users_is_not_observable(capsys):
    # the original design's config on 2 rehearsed ranks of an H200: fp16, lr 1e-4, no warm-up
    [folder] = ORIGINAL_DESIGN.iterdir()
    assert report.main([str(folder)]) == report.EXIT["NOT OBSERVABLE"]
    out = capsys.readouterr().out
    assert re.search(r"NOT OBSERVABLE  \(c\) .*stage 0 11\.120 -> 13\.594 -> 20\.019.* the loss does not fall, alike "
                     r"at both stages, at this run's learning rate 0\.0001 \(its config's or --lr's; 5e-06 is the", out)
    assert re.search(r"PASS  \(b\) ", out) and "VERDICT: NOT OBSERVABLE" in out


def test_a_rate_of_the_users_does_not_excuse_stages_that_differ(tmp_path, capsys):
    def own_rate(r):
        return {**r, "lr": r["lr"] * 10}
    def rise(r):
        return {**own_rate(r), "losses": [r["losses"][0], r["losses"][1], r["losses"][1] + 1.0]}
    [folder] = ORIGINAL_DESIGN.iterdir()
    alike = planted(planted(folder, tmp_path, "stage0_original", own_rate), tmp_path, "stage3_original", own_rate)
    assert report.main([str(alike)]) == report.EXIT["NOT OBSERVABLE"]
    apart = planted(folder, tmp_path, "stage3_original", rise)
    assert report.main([str(apart)]) == report.EXIT["FAIL"]
    assert re.search(r"FAIL  \(c\) .*the stages DIFFER", capsys.readouterr().out)


@pytest.mark.parametrize("fault", ["zero_grads", "perturb_shard"])
def test_a_fault_on_one_rank_of_stage_3_shows_as_stages_that_differ(fault, planted_faults, capsys):
    report.main([str(planted_faults[fault])])
    assert re.search(r"the (stages|weights) DIFFER", capsys.readouterr().out)


def test_fewer_steps_than_c_judges_are_not_observable(run_sh, tmp_path, capsys):
    def two_steps(r):
        return {**r, "steps": r["steps"][:2], "losses": r["losses"][:2]}
    folder = planted(planted(run_sh.folder, tmp_path, "stage0", two_steps), tmp_path, "stage3", two_steps)
    assert report.main([str(folder)]) == report.EXIT["NOT OBSERVABLE"]
    out = capsys.readouterr().out
    assert "NOT OBSERVABLE  (c)" in out and "give --steps 3 or more" in out


def test_run_sh_shows_one_screen_ending_with_the_results_folder(run_sh):
    lines = run_sh.proc.stdout.splitlines()
    assert len(lines) <= 60, run_sh.proc.stdout
    assert lines[0] == f"results: {run_sh.folder}"
    assert lines[-1].startswith(f"results: {run_sh.folder} (")
    assert not any("RESULT {" in line or "[INFO]" in line or "[WARNING]" in line for line in lines)


def test_each_ratio_says_which_side_it_favours(run_sh):
    table = run_sh.proc.stdout
    assert re.search(r"model states .* 2\.00x less", table), table
    assert re.search(r"tokens/s \* .* (same|\d+\.\d\dx (faster|slower))", table), table


def test_no_ratio_is_given_against_next_to_nothing():
    assert tables.ratio(0.9 * 2**20, 20, tables.SMALLER) == ""
    assert tables.ratio(4.0, 1.0, tables.SMALLER) == "4.00x less"
    assert tables.ratio(2.86, 1.0, tables.FASTER) == "2.86x slower"


def test_speed_on_cpu_is_marked_as_no_measure(run_sh):
    assert "* not a measure of speed: CPU processes" in run_sh.proc.stdout


def test_summary_json_says_where_the_time_went(run_sh):
    timing = json.loads((run_sh.folder / "summary.json").read_text())["timing"]
    parts = ("launch_and_imports_s", "engine_start_s", "steps_s", "probes_s", "teardown_s")
    for name in ("stage0", "stage3"):
        run = timing["runs"][name]
        assert all(run[part] >= 0 for part in parts), run
        assert sum(run[part] for part in parts) == pytest.approx(run["total_s"], abs=0.1)
    spent = timing["checks_s"] + sum(r["total_s"] for r in timing["runs"].values()) + timing["report_s"]
    rounding = 0.005 * (3 + len(timing["runs"]))  # each of the figures is rounded to 0.01 s
    assert spent - rounding <= timing["total_s"] <= spent + 5


def test_one_rank_counts_no_communication(single_process):
    for stage in ("stage0", "stage3"):
        r = single_process.runs[stage][0]
        assert all(v == 0 for v in r["comm_bytes"].values()), (stage, r["comm_bytes"])


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_run_sh_help_prints_its_usage_and_launches_nothing(flag, tmp_path):
    proc = subprocess.run(["bash", "run.sh", flag], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RESULTS": str(tmp_path / "results")})
    assert proc.returncode == 0, proc.stderr
    for option in ("--ranks", "--stages", "--peer", "--steps", "--micro-batch", "--model"):
        assert option in proc.stdout
    assert "usage: bash run.sh" in proc.stdout and not (tmp_path / "results").exists()
