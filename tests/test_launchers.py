"""The cluster launchers as train_gpt.py and report.py read them, without a launch: srun and mpirun set their own
variables, not torch.distributed's, and train_gpt.py must read them, or every process would train alone as rank 0
of 1; a rank killed under each is named in the report, in the launcher's own words; and a rank that hangs must end
the run, with the hung rank named, within a stated time (one launch, under the deepspeed launcher on this machine).
tests/test_launchers_real.py runs each launcher for real, where ZERO3BENCH_LAUNCHERS=1 asks for it.

A new launcher brings: its record in zero3bench/launchers.py's LAUNCHERS, with the functions that it names; its
command line in tests/launchers/real.py's COMMANDS, and its engine in tests/launchers/start.sh; and its SAMPLE
below (the variables it sets and its words for a rank it lost). The tests of "a new launcher" fail until each is
there, and nothing else names a launcher."""
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import pytest

from zero3bench import launchers, machine, options, parts, result
from conftest import HUNG_TIMEOUT_S, ROOT, record
from launchers import real
from zero3bench.reporting import deaths, reading

LAUNCHERS = tuple(launcher.name for launcher in launchers.LAUNCHERS)


# -----------------------------------------------------------------------------
# reading the launchers' variables, without a launch


@pytest.mark.parametrize("nodelist, host", [
    ("gpu[03-04,07],cpu1", "gpu03"),
    ("node7", "node7"),
    ("node7,node8", "node7"),
    ("gpu[12,15]", "gpu12"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert launchers.first_host(nodelist) == host


def srun_task(rank, local_rank, job_id="4242"):
    """What srun sets for one task of `srun --nodes 2 --ntasks 4` in job job_id."""
    return {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local_rank), "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0",
            "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_TASKS_PER_NODE": "2(x2)"}


def test_srun_sets_rank_local_rank_world_size_and_the_first_node_as_master():
    env = srun_task(3, 1)
    assert machine.adopt_launcher_env(env) == "srun"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "4", "2")
    assert env["MASTER_ADDR"] == "gpu03"


def test_srun_tasks_agree_on_a_master_port_derived_from_the_job():
    tasks = [srun_task(rank, rank % 2) for rank in range(4)]
    for env in tasks:
        machine.adopt_launcher_env(env)
    ports = {env["MASTER_PORT"] for env in tasks}
    assert len(ports) == 1
    assert 1024 < int(ports.pop()) < 65536
    other_job = srun_task(0, 0, job_id="4243")
    machine.adopt_launcher_env(other_job)
    assert other_job["MASTER_PORT"] != tasks[0]["MASTER_PORT"]


def test_srun_keeps_a_master_address_and_port_given_with_the_command():
    env = {**srun_task(0, 0), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "31000"}
    machine.adopt_launcher_env(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "31000")


def test_a_batch_scripts_own_shell_is_one_process():
    # sbatch sets SLURM_PROCID in the script's shell too, but no SLURM_STEP_ID: it is not a task of srun
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[03-04]"}
    assert machine.adopt_launcher_env(env) == "one process"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("0", "0", "1")


def test_mpirun_on_one_host_sets_the_ranks_and_this_host_as_master():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert machine.adopt_launcher_env(env) == "mpirun"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("1", "1", "2", "2")
    assert env["MASTER_ADDR"] == "127.0.0.1"


def test_mpirun_across_hosts_without_a_master_address_is_refused():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(options.BadInput, match="mpirun -x MASTER_ADDR="):
        machine.adopt_launcher_env(env)


def test_mpirun_across_hosts_with_a_master_address_uses_it():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
    assert machine.adopt_launcher_env(env) == "mpirun"
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("2", "4", "10.0.0.1")


@pytest.mark.parametrize("variable", ["PMI_RANK", "PMIX_RANK"])
def test_an_mpi_that_sets_only_pmi_rank_is_refused(variable):
    with pytest.raises(options.BadInput, match="sets PMI_RANK, which train_gpt.py does not read"):
        machine.adopt_launcher_env({variable: "0"})


@pytest.mark.parametrize("own, launcher", [({"CROSS_RANK": "0"}, "deepspeed"),
                                            ({"TORCHELASTIC_RUN_ID": "zero3"}, "torchrun"), ({}, "RANK set")])
def test_rank_already_set_is_left_alone_and_its_launcher_named(own, launcher):
    # deepspeed and torchrun set RANK and the rest; a launcher's own variables beside them are not read
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "31000",
           **own, **srun_task(3, 1)}
    before = dict(env)
    assert machine.adopt_launcher_env(env) == launcher
    assert env == before


def test_mpirun_inside_a_slurm_allocation_reads_mpiruns_ranks():
    # on the allocation's other nodes, mpirun's daemon is a task of srun: its ranks inherit the daemon's step
    env = {**srun_task(0, 0), "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "gpu03"}
    assert machine.adopt_launcher_env(env) == "mpirun"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")


# -----------------------------------------------------------------------------
# a hung rank


def test_a_hung_rank_ends_the_run_within_the_timeout_and_a_minute(hung_rank):
    tail = hung_rank.log.read_text(errors="replace")[-3000:]
    assert hung_rank.status is not None, f"still running {hung_rank.seconds:.0f} s after the stop:\n{tail}"
    assert hung_rank.status != 0, tail
    assert hung_rank.seconds <= HUNG_TIMEOUT_S + 60, tail


def test_the_error_says_how_long_the_collective_waited_and_names_the_hung_rank(hung_rank):
    tail = hung_rank.log.read_text(errors="replace")[-3000:]
    records = {r["rank"]: r for r in hung_rank.records}
    assert 0 in records, tail
    error = records[0]["error"] or ""
    assert f"a collective waited {HUNG_TIMEOUT_S} s" in error, error
    # torch.distributed.monitored_barrier's message names the ranks that failed to pass it
    assert "Ranks 1 failed to pass" in error, error


# -----------------------------------------------------------------------------
# the report's account of a rank that died, without a launch

# the deepspeed launcher's launch.py on one node of two ranks, whose rank 0 was killed: it logs the command
# of the rank it spawned last (--local_rank=1), whichever rank ended
DEEPSPEED_ONE_NODE = """\
[2026-12-01 19:13:32,213] [INFO] [launch.py:169:main] global_rank_mapping=defaultdict(<class 'list'>, {'localhost': [0, 1]})
[2026-12-01 19:13:39,220] [INFO] [launch.py:253:main] Killing subprocess 16929
[2026-12-01 19:13:39,220] [INFO] [launch.py:253:main] Killing subprocess 16930
[2026-12-01 19:13:39,221] [ERROR] [launch.py:259:main] ['python3', '-u', 'train_gpt.py', '--local_rank=1'] exits with return code = -9
"""


def test_the_deepspeed_launchers_dead_rank_is_the_one_that_left_no_result(tmp_path):
    log = tmp_path / "stage3.log"
    log.write_text(DEEPSPEED_ONE_NODE)
    rank_1 = result.RankResult(rank=1, world_size=2, launcher="deepspeed", error="RuntimeError: Connection reset")
    assert reading.dead_rank(log, [rank_1]) == ("rank 0 on localhost ended first, killed by SIGKILL "
                                                "(the launcher's report)")


def test_a_result_line_cut_short_is_passed_over(tmp_path):
    whole = result.result_line(record(rank=0, world_size=2, stage=3))
    log = tmp_path / "stage3.log"
    log.write_text(whole + "\n" + whole[:len(whole) // 2] + "\n")
    assert [r.rank for r in reading.read_results(log)] == [0]


def test_without_root_start_sh_says_why_in_one_line():
    user = pwd.getpwnam("nobody") if os.getuid() == 0 else pwd.getpwuid(os.getuid())
    as_user = ["runuser", "-u", user.pw_name, "--"] if os.getuid() == 0 else []
    proc = subprocess.run([*as_user, "bash", str(real.START)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [f"launchers: cannot start: not root (uid {user.pw_uid}): the Slurm daemons, "
                                        "munged and sshd need root"]


def test_under_srun_the_node_is_sruns_name_for_it():
    assert machine.launcher_node("srun", {"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    assert machine.launcher_node("mpirun", {"SLURMD_NODENAME": "gpu07"}) == socket.gethostname()


@pytest.mark.parametrize("line, named", [
    ("srun: error: gpu07: task 5: Killed", "rank 5 on gpu07 ended first, killed by SIGKILL"),
    ("srun: error: gpu07: tasks 4-5,7: Segmentation fault",
     "one of ranks 4, 5, 7 on gpu07 ended first, killed by SIGSEGV"),
    ("srun: error: gpu07: task 5: Exited with exit code 9", "rank 5 on gpu07 ended first, exit status 9"),
    # srun may tell of a peer's own exit, which the dead rank caused, first
    ("srun: error: gpu07: task 0: Exited with exit code 1\nsrun: error: gpu07: task 5: Killed",
     "rank 5 on gpu07 ended first, killed by SIGKILL"),
])
def test_sruns_words_for_a_dead_task_name_its_rank(tmp_path, line, named):
    log = tmp_path / "stage3.log"
    log.write_text(line + "\n")
    assert reading.dead_rank(log, []) == named + " (the launcher's report)"


# torchrun's account of a run whose rank 1 was killed: it observed rank 0's exit first (tests/test_interrupt.py)
TORCHRUN_RANK_0_FIRST = """\
Failures:
[1]:
  time      : 2026-12-01_20:12:10
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5218)  (SIGKILL)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_20:12:10
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5217)
"""


def test_torchruns_failure_that_no_result_explains_is_the_dead_rank(tmp_path):
    log = tmp_path / "stage3.log"
    log.write_text(TORCHRUN_RANK_0_FIRST)
    rank_0 = result.RankResult(rank=0, world_size=2, launcher="torchrun", error="RuntimeError: Connection reset",
                               env=parts.Environment(host="vm"))
    assert reading.dead_rank(log, [rank_0]) == "rank 1 on vm ended first, killed by SIGKILL (the launcher's report)"


# -----------------------------------------------------------------------------
# a new launcher: what it must bring


@dataclass(frozen=True)
class Sample:
    """A launcher as a rank sees it: what it sets for rank 1 of 2 on one node, and its words for that rank killed."""
    env: dict[str, str]
    words: str


TORCH_SET = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
SAMPLES = {
    "deepspeed": Sample({**TORCH_SET, "CROSS_RANK": "0"}, DEEPSPEED_ONE_NODE),
    "torchrun": Sample({**TORCH_SET, "TORCHELASTIC_RUN_ID": "zero3"}, TORCHRUN_RANK_0_FIRST),
    "mpirun": Sample({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
                     "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"),
    "srun": Sample({**srun_task(1, 1), "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2"},
                   "srun: error: vm: task 1: Killed\n"),
}


def test_every_launcher_of_the_table_has_a_sample_and_a_real_launch():
    assert sorted(SAMPLES) == sorted(real.COMMANDS) == sorted(LAUNCHERS)


@pytest.mark.parametrize("launcher", launchers.LAUNCHERS, ids=LAUNCHERS)
def test_a_launcher_is_known_by_its_variables_alone(launcher):
    env = SAMPLES[launcher.name].env
    assert [other.name for other in launchers.LAUNCHERS if other.started(env)] == [launcher.name]
    assert launcher.rank in launcher.detected_by  # the variable that says it started this process gives the rank


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_launchers_variables_become_torch_distributeds(launcher):
    env = dict(SAMPLES[launcher].env)
    assert machine.checked_launcher_env(env) == launcher
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "1", "2")


@pytest.mark.parametrize("launcher", launchers.LAUNCHERS, ids=LAUNCHERS)
def test_a_launchers_words_name_the_rank_it_lost_and_no_other_launcher_reads_them(launcher):
    words = SAMPLES[launcher.name].words
    node = "localhost" if launcher.name in ("deepspeed", "torchrun") else "vm"
    assert (1, node, -signal.SIGKILL) in launcher.dead(words, {0})
    assert [other.name for other in launchers.LAUNCHERS if other.dead(words, {0})] == [launcher.name]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_report_reads_a_launchers_words_without_its_name(launcher):
    # a run that left no result names no launcher: each launcher's words are looked for
    assert (1, "vm" if launcher in ("mpirun", "srun") else "localhost", -signal.SIGKILL) in deaths.told(
        SAMPLES[launcher].words, None, {0}, None)


def test_a_log_with_mpiruns_words_and_sruns_is_read_as_mpiruns():
    # mpirun inside an allocation: srun tells of the daemon it started on a node, mpirun of the rank
    words = "srun: error: vm: task 0: Killed\n" + SAMPLES["mpirun"].words
    assert deaths.told(words, None, set(), None) == [(1, "vm", -signal.SIGKILL)]


def test_run_sh_is_told_to_unset_every_launchers_rank_and_torch_distributeds_variables():
    proc = subprocess.run([sys.executable, "-m", "zero3bench.launchers"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split() == launchers.inherited()
    assert {launcher.rank for launcher in launchers.LAUNCHERS} | set(launchers.TORCH_VARIABLES) <= set(proc.stdout.split())


def own_variables():
    """Each launcher's variables that are not torch.distributed's."""
    named = {v for launcher in launchers.LAUNCHERS
             for v in (*launcher.detected_by, launcher.rank, launcher.world, launcher.local_rank)}
    return sorted(named - set(launchers.TORCH_VARIABLES))


# a launcher's name compared with a literal: launcher == "srun", r.launcher != "deepspeed", launcher in ("srun", ...)
NAME_COMPARED = re.compile(r"launcher\w*\)?\s*(==|!=|in|not in)\s*\(?[\"']")
CONSUMERS = sorted({*ROOT.glob("*.py"), *ROOT.glob("zero3bench/**/*.py"), ROOT / "run.sh"} -
                   {ROOT / "zero3bench" / "launchers.py"})


@pytest.mark.parametrize("path", CONSUMERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_table_names_a_launcher_or_its_variables(path):
    text = path.read_text()
    assert [v for v in own_variables() if re.search(rf"\b{v}\b", text)] == []
    assert NAME_COMPARED.findall(text) == []
