"""Losses, speed and failure reports."""
import math
import subprocess
import sys

import pytest

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
