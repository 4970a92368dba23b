"""Shared launches: each costs seconds of start-up on a CPU, so each runs once per test session and
the tests read its logs."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import report  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env=None, log=None):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})
    if log:
        log.write_text(proc.stdout + proc.stderr)
    return proc


@pytest.fixture(scope="session")
def run_sh(tmp_path_factory):
    """`bash run.sh` end to end: on a machine without GPUs, the tiny model on 2 gloo ranks, stage 0 then 3."""
    results = tmp_path_factory.mktemp("results")
    proc = run(["bash", "run.sh"], env={"RESULTS": str(results)})
    folders = list(results.iterdir())
    assert len(folders) == 1, proc.stdout + proc.stderr
    return SimpleNamespace(proc=proc, folder=folders[0], runs=report.load_runs(folders[0]))


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
    results = tmp_path_factory.mktemp("sweep")
    proc = run(["bash", "run.sh", "--ranks", "1 2", "--steps", "2"], env={"RESULTS": str(results)})
    [folder] = results.iterdir()
    return SimpleNamespace(proc=proc, folder=folder, runs=report.load_runs(folder))


@pytest.fixture(scope="session")
def other_stages(tmp_path_factory):
    """`bash run.sh --stages "0 1 2 3 3_offload 3_infinity"`: every stage, ZeRO-Offload and ZeRO-Infinity
    (parameters and optimizer in host memory) on 2 CPU ranks. The first offload run JIT-builds DeepSpeed's
    CPU Adam, which takes about a minute."""
    results = tmp_path_factory.mktemp("stages")
    proc = run(["bash", "run.sh", "--stages", "0 1 2 3 3_offload 3_infinity"], env={"RESULTS": str(results)})
    [folder] = results.iterdir()
    return SimpleNamespace(proc=proc, folder=folder, runs=report.load_runs(folder))


@pytest.fixture(scope="session")
def memory_cap(tmp_path_factory):
    """`bash run.sh --model small --max-mem-gib 1.75 --stages "0 3"`: a 101M-parameter model that, under the
    cap, only stage 3 can train on 2 CPU ranks (it needs 1.35-1.5 GiB, stage 0 2.0-2.1: benchmarks/cpu-cap).
    run.sh's own option comes last, after train_gpt.py's."""
    results = tmp_path_factory.mktemp("cap")
    proc = run(["bash", "run.sh", "--model", "small", "--max-mem-gib", "1.75", "--stages", "0 3"],
               env={"RESULTS": str(results)})
    [folder] = results.iterdir()
    return SimpleNamespace(proc=proc, folder=folder, runs=report.load_runs(folder))
