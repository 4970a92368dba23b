"""Bad input: one clear line on stderr, exit status 2, no traceback, before any process group starts."""
import subprocess
import sys

import pytest

from conftest import ROOT

CASES = {
    "unknown stage": (["--stage", "5"], "invalid choice: 5"),
    "a stage that does not exist": (["--config", "tests/stage5.json"],
                                    "zero_optimization.stage must be 0, 1, 2 or 3, not 5"),
    "unknown preset": (["--model", "13b"], "invalid choice: '13b'"),
    "missing config": (["--config", "no/such.json"], "config not found: no/such.json"),
    "invalid json": (["--config", "run.sh"], "is not valid JSON"),
    "stage mismatch": (["--stage", "3", "--config", "ds_config_stage0.json"],
                       "has zero_optimization.stage 0, but --stage is 3"),
    "fp16 on a cpu": (["--dtype", "fp16"], "fp16 needs a GPU"),
    "sequence beyond the context": (["--model", "tiny", "--seq", "257"], "outside the tiny model's context"),
    "micro batch below 1": (["--micro-batch", "0"], "--micro-batch must be at least 1"),
    "a memory cap of nothing": (["--max-mem-gib", "0"], "--max-mem-gib must be positive"),
    "missing data file": (["--data", "no/such.bin"], "--data no/such.bin: no such file"),
    "unknown option": (["--stages", "3"], "unrecognized arguments: --stages 3"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line(case):
    args, message = CASES[case]
    proc = subprocess.run([sys.executable, "train_gpt.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "train_gpt.py: error:" in line]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    data = tmp_path / "tokens.bin"
    data.write_bytes(bytes(range(256)) * 64)  # as uint16, ids up to 0xfffe
    proc = subprocess.run([sys.executable, "train_gpt.py", "--model", "tiny", "--data", str(data)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "outside the vocabulary of 256" in proc.stderr
