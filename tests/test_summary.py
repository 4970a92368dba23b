"""What a run leaves behind: summary.json, summary.md, memory.png; comparing two runs; progress lines."""
import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

from zero3bench import options
import report
from zero3bench import parts, result
from zero3bench.reporting import compare, tables
from zero3bench.reporting.verdict import CRITERIA
from conftest import ROOT, facts, planted, record

# a results folder in the repository, from a rehearsal of 4 ranks on one H200
COMMITTED = ROOT / "benchmarks" / "logs" / "h200" / "21-verdict" / "2-warm" / "results" / "20261201-111451-Hmzt"


def test_run_sh_writes_summary_files_and_a_plot(run_sh):
    for name in ("summary.json", "summary.md", "memory.png"):
        assert (run_sh.folder / name).stat().st_size > 0, name
    assert (run_sh.folder / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_json_holds_environment_commands_results_and_verdict(run_sh):
    record = json.loads((run_sh.folder / "summary.json").read_text())
    assert record["verdict"] == "PASS"
    assert record["command"] == "bash run.sh"
    assert set(record["commands"]) == {"stage0", "stage3"}
    for cmd in record["commands"].values():
        assert cmd.startswith("python3 -m torch.distributed.run --nnodes 1 --nproc_per_node 2")
        assert "train_gpt.py --stage" in cmd
    env = record["environment"]
    assert env["torch"] and env["deepspeed"] and env["python"] and len(env["hosts"]) == 1
    assert [len(record["results"][name]) for name in ("stage0", "stage3")] == [2, 2]
    assert [c["status"] for c in record["checks"]["2 rank(s)"] + record["checks"]["all runs"]] == ["PASS"] * len(CRITERIA)


def test_summary_md_is_a_readable_report(run_sh):
    text = (run_sh.folder / "summary.md").read_text()
    assert text.startswith("# ZeRO benchmark: PASS")
    for part in ("## Commands", "## Comparison", "## Verdict", "## stage3: each rank", "deepspeed"):
        assert part in text


def test_without_matplotlib_the_plot_is_skipped_with_one_line(run_sh, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(run_sh.folder, folder, ignore=shutil.ignore_patterns("memory.png"))
    code = ("import sys; sys.modules['matplotlib'] = None; import report; "
            "sys.exit(report.main(['--write', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "memory.png skipped: matplotlib is not installed" in proc.stdout
    assert (folder / "summary.json").exists() and not (folder / "memory.png").exists()


def test_summary_md_counts_cpu_processes_not_gpus(run_sh):
    text = (run_sh.folder / "summary.md").read_text()
    assert "| device | CPU processes |" in text and "| processes | 2 |" in text
    assert "gpus | 0" not in text


def contents(folder):
    """{path: its bytes} of every file under folder: what a read must leave as it found it (without git, which a
    source archive lacks)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_reading_a_committed_folder_changes_nothing_in_it(capsys):
    before = contents(COMMITTED)
    assert report.main([str(COMMITTED)]) == 0
    assert contents(COMMITTED) == before
    assert capsys.readouterr().out.splitlines()[-1] == f"results: {COMMITTED}"


def test_write_puts_the_record_into_the_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RUN_COMMAND", raising=False)  # run.sh's, which would add its report.txt
    folder = tmp_path / "run"
    folder.mkdir()
    for log in COMMITTED.glob("*.log"):
        shutil.copy(log, folder)
    report.main([str(folder)])
    assert sorted(p.name for p in folder.iterdir()) == ["stage0.log", "stage3.log"]
    report.main(["--write", str(folder)])
    assert capsys.readouterr().out.splitlines()[-1] == f"results: {folder} (summary.json, summary.md, memory.png)"
    assert json.loads((folder / "summary.json").read_text())["verdict"] == "PASS"
    assert "| gpus | 1 |" in (folder / "summary.md").read_text()  # one H200, which 4 ranks shared
    assert (folder / "memory.png").stat().st_size > 0


def scaled(folder, tmp_path, peak=1.0, speed=1.0):
    """A copy of a results folder whose stage-3 logs claim another peak memory and speed."""
    return planted(folder, tmp_path, "stage3", lambda r: {**r, "peak_mem_bytes": int(r["peak_mem_bytes"] * peak),
                                                          "tokens_per_s": r["tokens_per_s"] * speed})


def test_compare_finds_no_regression_between_a_run_and_itself(run_sh, capsys):
    assert report.main(["--compare", str(run_sh.folder), str(run_sh.folder)]) == 0
    assert "0 regression(s)" in capsys.readouterr().out


def test_compare_flags_a_planted_memory_regression(run_sh, tmp_path, capsys):
    assert report.main(["--compare", str(run_sh.folder), str(scaled(run_sh.folder, tmp_path, peak=1.2))]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "stage3 peak memory +20.0%" in out


def test_compare_flags_a_planted_slowdown_beyond_the_tolerance_only(run_sh, tmp_path, capsys):
    slower = str(scaled(run_sh.folder, tmp_path, speed=0.9))
    assert report.main(["--compare", str(run_sh.folder), slower, "--tolerance", "5"]) == 1
    assert "stage3 tokens/s -10.0%" in capsys.readouterr().out
    assert report.main(["--compare", str(run_sh.folder), slower, "--tolerance", "15"]) == 0


def test_compare_flags_runs_that_trained_another_number_of_steps(tmp_path, capsys):
    def two_steps(r):
        return {**r, "steps_planned": 2, "steps": r["steps"][:2], "losses": r["losses"][:2]}
    assert report.main(["--compare", str(COMMITTED), str(planted(COMMITTED, tmp_path, "stage3", two_steps))]) == 1
    assert "stage3 measured something else: it differs in steps" in capsys.readouterr().out
    assert compare.steps_trained(result.RankResult(steps=[parts.Step(), parts.Step()])) == 2  # a log from before steps_planned


def test_compare_tracks_a_figure_whatever_its_row_is_called(tmp_path, capsys, monkeypatch):
    renamed = dataclasses.replace(tables.ROWS["peak_memory"], label="peak (renamed)")
    monkeypatch.setitem(tables.ROWS, "peak_memory", renamed)
    assert report.main(["--compare", str(COMMITTED), str(scaled(COMMITTED, tmp_path, peak=1.2))]) == 1
    assert "stage3 peak (renamed) +20.0%" in capsys.readouterr().out


def test_long_phases_and_each_step_report_progress(run_sh):
    log = (run_sh.folder / "stage3.log").read_text()
    for phase in ("starting the process group", "building the model", "starting the DeepSpeed engine"):
        assert f"{phase}: done in" in log
    assert "step 2/3  loss " in log and " mem " in log and " tok/s " in log and " mfu " in log


def test_a_sweep_of_world_sizes_gives_one_verdict_per_size_and_a_scaling_plot(sweep):
    assert sweep.proc.returncode == 0, sweep.proc.stdout[-3000:]
    assert sorted(sweep.runs) == ["stage0_1ranks", "stage0_2ranks", "stage3_1ranks", "stage3_2ranks"]
    assert "1 rank(s):" in sweep.proc.stdout and "2 rank(s):" in sweep.proc.stdout
    assert "NOT OBSERVABLE  (b)" in sweep.proc.stdout  # one rank
    assert "VERDICT: PASS" in sweep.proc.stdout  # two ranks show it
    assert (sweep.folder / "memory.png").exists()


def test_compare_fails_when_a_run_is_missing_or_measured_something_else(run_sh, tmp_path, capsys):
    missing = tmp_path / "missing"
    shutil.copytree(run_sh.folder, missing)
    (missing / "stage3.log").unlink()
    assert report.main(["--compare", str(run_sh.folder), str(missing)]) == 1
    assert "stage3 is missing from B" in capsys.readouterr().out
    other = tmp_path / "other"
    shutil.copytree(run_sh.folder, other)
    log = other / "stage0.log"
    log.write_text(log.read_text().replace('"micro_batch": 2', '"micro_batch": 4'))
    assert report.main(["--compare", str(run_sh.folder), str(other)]) == 1
    assert "stage0 measured something else: it differs in micro_batch" in capsys.readouterr().out


def test_a_log_without_results_still_gives_a_record(run_sh, tmp_path, capsys):
    folder = tmp_path / "crashed"
    shutil.copytree(run_sh.folder, folder)
    (folder / "stage0.log").write_text("Segmentation fault\n")
    assert report.main(["--write", str(folder)]) == 1
    assert json.loads((folder / "summary.json").read_text())["verdict"] == "FAIL"
    assert "no result" in capsys.readouterr().out


def test_summary_json_stays_valid_json_when_the_loss_diverges(tmp_path):
    def diverged(r):  # the last step's loss NaN: a figure that summary.json's results carry
        return {**r, "losses": [*r["losses"][:-1], float("nan")]}
    folder = planted(COMMITTED, tmp_path, "stage3", diverged)
    assert "NaN" in (folder / "stage3.log").read_text()
    report.main(["--write", str(folder)])
    summary = json.loads((folder / "summary.json").read_text(),
                         parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    last = [r["steps"][-1]["loss"] for r in summary["results"]["stage3"]]
    assert last and all(x is None for x in last), last  # the NaN reached summary.json, written null


def test_a_result_line_begins_with_every_setting_of_the_run_in_its_order():
    run = [f.name for f in dataclasses.fields(options.Run)]
    assert list(result.as_dict(record(**facts(3))))[:len(run)] == run


def test_a_result_line_reads_back_as_the_same_result():
    run = dataclasses.replace(result.RankResult().run, stage=3, micro_batch=2, seq=8)
    r = result.RankResult(run, rank=1, world_size=2, env=parts.Environment(host="vm", gpus_on_host=0),
                          steps=[parts.Step(step=1, loss=5.0, time_s=0.5)])
    assert result.RankResult.from_dict(json.loads(result.result_line(r)[len("RESULT "):])) == r


def test_a_step_made_by_its_fields_records_the_keys_given_alone_in_their_order():
    s = parts.Step.made(step=1, loss=5.0, time_s=0.5, memory=parts.MemorySnapshot.made(peak_mem_bytes=7))
    assert list(s.as_dict()) == ["step", "loss", "time_s", "peak_mem_bytes"]


def test_a_step_made_with_a_mistyped_field_raises():
    with pytest.raises(TypeError):
        parts.Step.made(step=1, los=5.0)
