"""The machinery's faults: a full disk, a launcher's environment inherited, odd paths, a closed pipe, a killed
process group, a port taken between two runs. Each ends in one line, or the run goes on; nothing is cut short."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zero3bench import launches, machine, stages
from conftest import ROOT, json_runs, run, run_processes

# what a launcher (torchrun, a PyTorchJob pod, a Slurm step) leaves in the environment of the shell inside it
INHERITED = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


def fill(folder):
    """Writes into folder until its file system has no room left."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_disk_leaves_no_report_file_cut_short_and_says_which_it_could_not_write(run_sh, tmpfs):
    logs = sorted(run_sh.folder.glob("*.log"))
    room = sum(-(-p.stat().st_size // 4096) * 4096 for p in logs) + 8192  # the logs, and less than summary.json
    folder = tmpfs(room)
    for log in logs:
        shutil.copy(log, folder)
    proc = subprocess.run([sys.executable, "report.py", "--write", str(folder)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RUN_COMMAND": "bash run.sh"})
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.splitlines() == [f"report.py: error: cannot write {folder}/summary.json: No space left on "
                                        "device"]
    assert "VERDICT: PASS" in proc.stdout
    assert sorted(p.name for p in folder.iterdir()) == [p.name for p in logs]  # no part of a file, no temporary


def test_a_log_that_cannot_be_written_stops_the_run_with_one_line(tmpfs):
    results = tmpfs(64 * 1024)
    fill(results)
    proc = run(["bash", "run.sh", "--steps", "1"], env={"RESULTS": str(results)})
    assert proc.returncode == 6, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert re.fullmatch(rf"run\.sh: error: cannot write the log {results}/[^ /]+/stage0\.log: No space left on "
                        "device", line), line
    assert "== stage3" not in proc.stdout and "VERDICT" not in proc.stdout


def test_run_sh_checks_its_inputs_whatever_rank_its_caller_is():
    proc = run(["bash", "run.sh", "--lr", "nan"], env=INHERITED)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("train_gpt.py: error: argument --lr: ") and line.endswith(", not nan"), line


def test_one_rank_under_an_inherited_launcher_environment_trains_alone(pipe_and_caller):
    assert pipe_and_caller.proc.returncode == 5, pipe_and_caller.proc.stderr[-3000:]  # NOT OBSERVABLE: one rank
    for name, [r] in pipe_and_caller.runs.items():
        assert (r["world_size"], r["error"]) == (1, None), name


def test_a_closed_stdout_leaves_the_runs_going_and_the_report_written(pipe_and_caller):
    assert len(pipe_and_caller.proc.stdout.splitlines()) == 4
    assert list(pipe_and_caller.runs) == ["stage0", "stage3"]
    report = (pipe_and_caller.folder / "report.txt").read_text().splitlines()
    assert "VERDICT: NOT OBSERVABLE" in report and report[-1].startswith(f"results: {pipe_and_caller.folder} (")
    assert json.loads((pipe_and_caller.folder / "summary.json").read_text())["verdict"] == "NOT OBSERVABLE"
    assert "error" not in pipe_and_caller.proc.stderr and "Traceback" not in pipe_and_caller.proc.stderr


def test_each_run_launches_on_a_port_free_as_it_starts(pipe_and_caller):
    ports = {name: re.search(r"MASTER_PORT=(\d+)", (pipe_and_caller.folder / f"{name}.log").read_text())[1]
             for name in ("stage0", "stage3")}
    assert pipe_and_caller.squatted == int(ports["stage0"])  # a listener held stage 0's port as stage 3 launched
    assert ports["stage3"] != ports["stage0"]


def test_a_killed_process_group_leaves_no_rank_or_launcher_after_10_s(group_killed):
    assert group_killed.status == -9
    assert group_killed.seconds < 10 and run_processes(group_killed.folder.parent) == []


def test_a_killed_process_group_leaves_no_shared_memory(group_killed):
    # its ranks' buffers, which a rank killed before it unlinks them leaves, go with run.sh's watchdog
    assert len(group_killed.buffers_during) == 2, group_killed.buffers_during  # the glob finds them as it runs
    assert group_killed.buffers == []


def test_a_results_location_may_begin_with_a_dash(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "run.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RESULTS": "-out", "HOSTFILE": str(tmp_path / "none")})
    assert proc.stderr.splitlines() == [f"run.sh: error: HOSTFILE {tmp_path}/none is not a readable file"]
    assert (tmp_path / "-out").is_dir()


def test_a_config_that_is_a_folder_is_named_as_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stages, "CONFIG_FOLDERS", (tmp_path,))
    (tmp_path / "ds_config_stage3.json").mkdir()
    with pytest.raises(SystemExit) as e:
        launches.config_args("3")
    assert e.value.code == 2
    assert capsys.readouterr().err == f"run.sh: error: {tmp_path}/ds_config_stage3.json is a folder, not a config file\n"


@pytest.fixture
def read_only_home(tmpfs, monkeypatch, tmp_path, run_sh):
    """A home folder mounted read-only as HOME (a tmpfs, which holds nothing of value if left mounted), with a
    copy of the ops that this environment built (run_sh's ranks build them, if no launch before did), and a fresh
    temp dir."""
    built = machine.extensions_folder()
    home = tmpfs(sum(-(-f.stat().st_size // 4096) * 4096 for f in built.rglob("*") if f.is_file()) + 2**20)
    shutil.copytree(built, home / built.relative_to(Path.home()), symlinks=True)
    subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # which gettempdir() keeps once asked
    for variable in machine.home_caches():
        monkeypatch.delenv(variable, raising=False)
    return home


def test_a_home_that_cannot_be_written_moves_the_caches_to_the_temp_dir_with_the_ops_built(read_only_home):
    env = {}
    moved = machine.fall_back_caches(env)
    assert moved == machine.home_caches() and not any(machine.writable(folder) for folder in moved.values())
    ops = env["TORCH_EXTENSIONS_DIR"]
    assert ops.startswith(os.environ["TMPDIR"]) and machine.writable(Path(ops))
    built = sorted(p.relative_to(moved["TORCH_EXTENSIONS_DIR"]) for p in moved["TORCH_EXTENSIONS_DIR"].rglob("*.so"))
    assert built and built == sorted(p.relative_to(ops) for p in Path(ops).rglob("*.so"))


def test_a_run_under_a_read_only_home_says_where_its_caches_went_and_trains(read_only_home, tmp_path):
    proc = run(["bash", "run.sh", "--stages", "3", "--steps", "1"], env={"RESULTS": str(tmp_path / "results")})
    [note] = [line for line in proc.stdout.splitlines() if line.startswith("cannot write ")]
    assert f"TORCH_EXTENSIONS_DIR={os.environ['TMPDIR']}/" in note and str(read_only_home) in note
    [folder] = (tmp_path / "results").iterdir()
    [r0, r1] = json_runs(folder)["stage3"]
    assert r0["error"] is None and r1["error"] is None, proc.stdout[-3000:]
    assert "Building extension" not in (folder / "stage3.log").read_text()  # the ops copied over, not rebuilt
