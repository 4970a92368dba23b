"""Interrupted, killed or diverged: every process that run.sh started ends, no shared memory is left, and the
report says what finished."""
import os
import subprocess
import sys

import pytest

from zero3bench import machine
from conftest import ROOT, shared_memory_of


@pytest.mark.parametrize("case, signal_name, status", [("ctrl_c", "SIGINT", 130), ("sigterm", "SIGTERM", 143)])
def test_a_signal_ends_every_process_of_the_run_within_10_s_with_128_plus_its_number(case, signal_name, status,
                                                                                        request):
    run = request.getfixturevalue(case)
    assert run.status == status, run.out[-3000:]
    assert run.ended < 10
    assert run.alive == []


@pytest.mark.parametrize("case", ["ctrl_c", "sigterm"])
def test_the_report_of_an_interrupted_run_is_written_before_a_schedulers_kill(case, request):
    """Slurm's KillWait and Kubernetes' grace period send SIGKILL 30 s after SIGTERM by default. On a 16-core H100
    host running the suite on 16 workers, run.sh ended 11.8 s after Ctrl-C (benchmarks/logs/h100/6-suite), when the
    end of the run's processes and that of its report were not timed apart."""
    run = request.getfixturevalue(case)
    assert run.seconds < 30 and (run.folder / "report.txt").exists()


@pytest.mark.parametrize("case", ["ctrl_c", "sigterm", "rank_killed"])
def test_no_shared_memory_of_the_run_is_left(case, request):
    run = request.getfixturevalue(case)
    assert len(run.buffers_during) == 2, run.buffers_during  # the glob finds each rank's while the run holds them
    assert run.buffers == []


def test_no_shared_memory_is_left_after_a_timeout(hung_rank):
    assert len(hung_rank.buffers_during) == 2, hung_rank.buffers_during  # as above
    assert hung_rank.buffers == []


def test_no_shared_memory_is_left_after_an_out_of_memory(memory_cap):
    assert shared_memory_of(memory_cap.folder) == []


@pytest.mark.parametrize("case", ["ctrl_c", "sigterm"])
def test_an_interrupted_run_names_its_folder_at_start_and_end(case, request):
    run = request.getfixturevalue(case)
    lines = run.out.splitlines()
    assert lines[0] == f"results: {run.folder}" and lines[-1].startswith(f"results: {run.folder} (")
    assert (run.folder / "report.txt").exists() and (run.folder / "summary.json").exists()


def test_ctrl_c_reports_the_steps_done_and_the_stages_not_started(ctrl_c):
    assert "VERDICT: INTERRUPTED by SIGINT: stage0 " in ctrl_c.out
    assert "of 3000 steps; not started: stage3" in ctrl_c.out


def test_an_interrupted_rank_reports_the_steps_it_completed(sigterm):
    from conftest import json_runs
    [r0, r1] = json_runs(sigterm.folder)["stage3"]
    assert r0["interrupted_by"] == r1["interrupted_by"] == "SIGTERM"
    assert 5 <= len(r0["steps"]) == len(r1["steps"]) < 3000 and r0["steps_planned"] == 3000


def test_a_killed_rank_is_named_and_fails_the_run(rank_killed):
    assert rank_killed.status == 1, rank_killed.out[-3000:]
    assert "stage3: rank 1 on " in rank_killed.out and "killed by SIGKILL" in rank_killed.out
    assert "VERDICT: FAIL" in rank_killed.out and rank_killed.alive == []


@pytest.mark.parametrize("results", ["/etc/hostname/x", "/proc/x"])
def test_an_unusable_results_location_is_bad_input_before_any_check(results):
    proc = subprocess.run(["bash", "run.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RESULTS": results})
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("run.sh: error: RESULTS ") and "Traceback" not in proc.stdout


@pytest.mark.parametrize("lr, says", [("1e30", "the loss is not finite"), ("1e3", "over 10x the first step's")])
def test_a_diverged_loss_stops_the_run_at_that_step_with_exit_4(lr, says):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(machine.free_port()), "train_gpt.py", "--stage", "3", "--lr", lr, "--steps", "100000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "exitcode  : 4" in proc.stderr, proc.stderr[-3000:]
    assert f"stopped after step " in proc.stdout and says in proc.stdout
    assert "step 100/100000" not in proc.stdout


def test_each_environment_builds_its_ops_in_a_cache_of_its_own(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    machine.keep_extensions_apart()
    mine = os.environ["TORCH_EXTENSIONS_DIR"]
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")
    machine.keep_extensions_apart()
    assert os.environ["TORCH_EXTENSIONS_DIR"] != mine and "venv-torch" in os.environ["TORCH_EXTENSIONS_DIR"]


def stopped_early(r):
    """A record as a rank leaves it when a signal stopped it after step 2 of 3: no census of its model states."""
    uncounted = ("model_state_breakdown", "model_state_bytes", "predicted_model_state_bytes", "host_state_breakdown")
    return {**r, **dict.fromkeys(uncounted), "steps": r["steps"][:2], "losses": r["losses"][:2],
            "interrupted_by": "SIGTERM"}


def test_a_stage_3_stopped_after_stage_0_finished_is_reported_as_interrupted(run_sh, tmp_path, capsys):
    import report
    from conftest import planted
    assert report.main([str(planted(run_sh.folder, tmp_path, "stage3", stopped_early))]) == 143
    out = capsys.readouterr().out
    assert "VERDICT: INTERRUPTED by SIGTERM: stage0 3 of 3 steps; stage3 2 of 3 steps" in out
    assert "NOT OBSERVABLE  (b)" in out and "stage 3 stopped before the last step" in out


def test_peers_stopped_by_the_launcher_after_a_rank_failed_are_a_failure_not_an_interruption(run_sh, tmp_path,
                                                                                              capsys):
    import report
    from conftest import planted

    def one_rank_out_of_memory(r):
        return {**stopped_early(r), "oom": r["rank"] == 0, "error": "CUDA out of memory" if r["rank"] == 0 else None}
    assert report.main([str(planted(run_sh.folder, tmp_path, "stage3", one_rank_out_of_memory))]) == 1
    assert "VERDICT: FAIL" in capsys.readouterr().out
