"""Losses, speed and failure reports."""
import json
import math
import subprocess
import sys

import pytest

from zero3bench import parts
from conftest import ROOT


def test_both_stages_report_every_step(stage0, stage3):
    for r in stage0 + stage3:
        assert len(r["losses"]) == len(r["steps"]) == 3
        assert r["first_loss"] == r["losses"][0]
        assert not r["oom"] and r["error"] is None


def test_stage0_and_stage3_give_the_same_first_step_loss(stage0, stage3):
    assert stage3[0]["first_loss"] == pytest.approx(stage0[0]["first_loss"], rel=0.01)


@pytest.mark.parametrize("stage", [0, 3])
def test_loss_falls_at_every_step(stage, stage0, stage3):
    losses = (stage0 if stage == 0 else stage3)[0]["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.3


def test_loss_of_the_tiny_model_starts_near_uniform(stage0):
    assert stage0[0]["first_loss"] == pytest.approx(math.log(256), abs=0.5)


def test_speed_is_reported_on_cpu_without_mfu(stage0):
    r = stage0[0]
    assert r["tokens_per_s"] > 0 and r["tflops_per_gpu"] > 0
    assert r["mfu"] is None  # no peak rate is known for a CPU
    assert r["mem_kind"] == "cpu_rss" and r["peak_mem_bytes"] > 0


def test_non_finite_loss_is_flagged_with_exit_status_4(tmp_path):
    proc = subprocess.run([sys.executable, "train_gpt.py", "--stage", "0", "--lr", "1e30"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "the loss is not finite" in proc.stdout
    assert '"nonfinite_loss": true' in proc.stdout


def test_in_fp32_both_stages_follow_the_same_trajectory(fp32):
    for proc in fp32.procs.values():
        assert proc.returncode == 0, proc.stderr[-3000:]
    dense, zero3 = fp32.runs["stage0"][0]["losses"], fp32.runs["stage3"][0]["losses"]
    assert zero3 == pytest.approx(dense, rel=1e-4)


def test_in_fp32_stage3_keeps_a_separate_master_copy_and_the_verdict_knows(fp32, capsys):
    import report
    r = fp32.runs["stage3"][0]
    held = parts.Census.from_dict(r["model_state_breakdown"])
    assert held.master == pytest.approx(held.params, rel=0.02)
    assert r["model_state_bytes"] == pytest.approx(r["predicted_model_state_bytes"], rel=0.05)
    assert report.main([str(fp32.folder)]) == 0
    assert "VERDICT: PASS" in capsys.readouterr().out


def test_a_failing_rank_reports_its_error_as_a_result(failing_config):
    assert failing_config.proc.returncode == 1
    assert len(failing_config.records) >= 1
    for r in failing_config.records:
        assert r["error"] and not r["oom"]
        assert r["param_tensors"] is None  # it failed before counting anything
    assert "FAILED:" in failing_config.proc.stdout


def test_a_token_file_trains(tmp_path):
    data = tmp_path / "tokens.bin"
    # exactly one row of the tiny model's 256 tokens + 1, as uint16 ids
    data.write_bytes(b"".join((65 + i % 26).to_bytes(2, "little") for i in range(257)))
    proc = subprocess.run([sys.executable, "train_gpt.py", "--stage", "0", "--data", str(data)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [record] = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert record["losses"][-1] < record["losses"][0]


def test_the_original_designs_config_runs_as_it_is(original_design):
    assert original_design.proc.returncode == 0, original_design.proc.stdout[-3000:]
    assert "micro batch 4 per rank (from train_batch_size) x 2 rank(s)" in original_design.proc.stdout
    assert "lr 0.0001 (from the config; constant), optimizer AdamW (DeepSpeed builds it)" in original_design.proc.stdout
    for r in original_design.records:
        assert r["micro_batch"] == 4 and r["dtype"] == "bf16" and r["optimizer"].startswith("deepspeed.")
        assert r["partition_check_ok"] and r["error"] is None
