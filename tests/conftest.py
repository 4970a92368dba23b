"""Shared launches: each costs seconds of start-up on a CPU, so each runs once per test session and
the tests read its logs."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import report  # noqa: E402
from train_gpt import free_port  # noqa: E402


def run(cmd, env=None, log=None):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})
    if log:
        log.write_text(proc.stdout + proc.stderr)
    return proc


def run_sh_once(tmp_path_factory, name, *args):
    """`bash run.sh ARGS` with its results in a fresh folder: the process, the run's folder and its runs."""
    results = tmp_path_factory.mktemp(name)
    proc = run(["bash", "run.sh", *args], env={"RESULTS": str(results)})
    folders = list(results.iterdir())
    assert len(folders) == 1, proc.stdout + proc.stderr
    return SimpleNamespace(proc=proc, folder=folders[0], runs=report.load_runs(folders[0]))


def planted(folder, tmp_path, name, edit):
    """A copy of a results folder in which edit(record) rewrites every RESULT of the run `name`."""
    copy = Path(tempfile.mkdtemp(prefix=f"planted-{name}-", dir=tmp_path))
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    log = copy / f"{name}.log"
    lines = [("RESULT " + json.dumps(edit(json.loads(line[len("RESULT "):])))) if line.startswith("RESULT ")
             else line for line in log.read_text().splitlines()]
    log.write_text("\n".join(lines) + "\n")
    return copy


@pytest.fixture(scope="session")
def run_sh(tmp_path_factory):
    """`bash run.sh` end to end: on a machine without GPUs, the tiny model on 2 gloo ranks, stage 0 then 3."""
    return run_sh_once(tmp_path_factory, "results")


@pytest.fixture(scope="session")
def stage0(run_sh):
    return run_sh.runs["stage0"]


@pytest.fixture(scope="session")
def stage3(run_sh):
    return run_sh.runs["stage3"]


@pytest.fixture(scope="session")
def stage3_torchrun_3_ranks(tmp_path_factory):
    """Stage 3 under torchrun with an odd world size, where shards need padding."""
    log = tmp_path_factory.mktemp("torchrun") / "stage3.log"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
                "--master_port", str(free_port()), "train_gpt.py", "--stage", "3", "--model", "tiny"], log=log)
    return SimpleNamespace(proc=proc, records=report.read_results(log))


@pytest.fixture(scope="session")
def single_process(tmp_path_factory):
    """Plain `python train_gpt.py`, one process and no launcher, at stage 0 and stage 3."""
    folder = tmp_path_factory.mktemp("single")
    procs = {stage: run([sys.executable, "train_gpt.py", "--stage", str(stage)], log=folder / f"stage{stage}.log")
             for stage in (0, 3)}
    return SimpleNamespace(procs=procs, folder=folder, runs=report.load_runs(folder))


@pytest.fixture(scope="session")
def fp32(tmp_path_factory):
    """Both stages in fp32 on 2 ranks, where the two should follow the same trajectory to rounding."""
    folder = tmp_path_factory.mktemp("fp32")
    procs = {stage: run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_gpt.py",
                         "--stage", str(stage), "--dtype", "fp32"], log=folder / f"stage{stage}.log")
             for stage in (0, 3)}
    return SimpleNamespace(procs=procs, folder=folder, runs=report.load_runs(folder))


@pytest.fixture(scope="session")
def failing_config(tmp_path_factory):
    """A launch whose DeepSpeed config DeepSpeed itself rejects, after the process group has started."""
    folder = tmp_path_factory.mktemp("failing")
    config = json.loads((ROOT / "ds_config_stage3.json").read_text())
    config["train_batch_size"] = 999  # not micro batch x ranks
    (folder / "bad.json").write_text(json.dumps(config))
    log = folder / "stage3.log"
    proc = run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_gpt.py",
                "--config", str(folder / "bad.json")], log=log)
    return SimpleNamespace(proc=proc, records=report.read_results(log))


@pytest.fixture(scope="session")
def sweep(tmp_path_factory):
    """`bash run.sh --ranks "1 2"`: both stages at two world sizes, in one results folder."""
    return run_sh_once(tmp_path_factory, "sweep", "--ranks", "1 2", "--steps", "2")


@pytest.fixture(scope="session")
def other_stages(tmp_path_factory):
    """`bash run.sh --stages "0 1 2 3 3_offload 3_infinity"`: every stage, ZeRO-Offload and ZeRO-Infinity
    (parameters and optimizer in host memory) on 2 CPU ranks. The first offload run JIT-builds DeepSpeed's
    CPU Adam, which takes about a minute."""
    return run_sh_once(tmp_path_factory, "stages", "--stages", "0 1 2 3 3_offload 3_infinity")


@pytest.fixture(scope="session")
def memory_cap(tmp_path_factory):
    """`bash run.sh --model small --max-mem-gib 1.75 --stages "0 3"`: a 101M-parameter model that, under the
    cap, only stage 3 can train on 2 CPU ranks (it needs 1.35-1.5 GiB, stage 0 2.0-2.1: benchmarks/cpu-cap).
    run.sh's own option comes last, after train_gpt.py's."""
    return run_sh_once(tmp_path_factory, "cap", "--model", "small", "--max-mem-gib", "1.75", "--stages", "0 3")
