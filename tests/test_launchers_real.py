"""The cluster launchers, run for real on this one machine where ZERO3BENCH_LAUNCHERS=1 asks for them, as
root: tests/launchers/start.sh starts their engines for the session, on 127.0.0.1 alone and in a folder of the
temp folder, and stop.sh stops them at its end. Slurm's srun, salloc and sbatch, Open MPI's mpirun, the deepspeed
launcher over pdsh and ssh to two node names, and torchrun with two rendezvous agents each run 2 ranks of stage
3, and a rank killed under each is named in the report. Without ZERO3BENCH_LAUNCHERS=1 this module skips, in one
line that says so, and the machine is left as it was (.ci/run checks it: tests/machine_state.sh)."""
import functools
import os
import socket
import subprocess
from types import SimpleNamespace

import psutil
import pytest
import torch

from zero3bench import launchers, parts
import train_gpt
from launchers import real

LAUNCHERS = tuple(launcher.name for launcher in launchers.LAUNCHERS)
WANTED = "ZERO3BENCH_LAUNCHERS"  # =1: these tests run, their engines started for the session
REQUIRED = "ZERO3BENCH_REQUIRE_LAUNCHERS"  # =1: they fail, rather than skip, where the engines do not start (.ci/run)
NOT_ASKED = (f"the real launchers run with {WANTED}=1 alone: as root, it starts Slurm, munge and sshd on 127.0.0.1 "
             "for the session (and installs their Debian packages where missing)")
if os.environ.get(WANTED) != "1" and os.environ.get(REQUIRED) != "1":
    pytest.skip(NOT_ASKED, allow_module_level=True)
# on one pytest-xdist worker: the engines are started once, and the launches through them shared lazily
pytestmark = pytest.mark.xdist_group("launchers")


def tiny_tensors():
    with torch.device("meta"):
        return len(list(train_gpt.GPT(train_gpt.PRESETS["tiny"]).parameters()))


@pytest.fixture(scope="session")
def engines():
    """Where ZERO3BENCH_LAUNCHERS=1 asks for them, the engines of tests/launchers/start.sh, every one up on this
    machine for this session and stopped at its end (stop.sh); else, or where they do not start, every real
    launch skipped, in one line on why; failed instead under ZERO3BENCH_REQUIRE_LAUNCHERS=1, which .ci/run sets
    where the engines should start."""
    started, why = (None, NOT_ASKED) if os.environ.get(WANTED) != "1" else real.start_engines()
    if why and os.environ.get(REQUIRED) == "1":
        pytest.fail(f"{REQUIRED}=1, and {why}", pytrace=False)
    if why:
        pytest.skip(why)
    yield started
    status, said = real.stop_engines(started.state)
    assert status == 0, said


@pytest.fixture(scope="session")
def stage3_under(engines, tmp_path_factory):
    """launcher -> its stage-3 launch on 2 ranks, launched when a test first asks for it."""
    return functools.cache(lambda launcher: real.stage3(tmp_path_factory.mktemp(f"stage3-{launcher}"), launcher,
                                                         engines))


@pytest.fixture(scope="session")
def rank_1_killed_under(engines, tmp_path_factory):
    """launcher -> its stage-3 launch on 2 ranks whose rank 1 was killed after step 1, with the report."""
    return functools.cache(lambda launcher: real.killed(tmp_path_factory.mktemp(f"killed-{launcher}"), launcher,
                                                         engines))


@pytest.fixture(scope="session")
def sbatch_both_stages(engines, tmp_path_factory):
    return real.sbatch(tmp_path_factory.mktemp("sbatch"), engines)


@pytest.fixture(scope="session")
def run_sh_over_two_nodes(engines, tmp_path_factory):
    return real.run_sh_over_hostfile(tmp_path_factory.mktemp("hostfile"), engines)


@pytest.fixture(params=LAUNCHERS)
def launched(request, stage3_under):
    if request.param == "deepspeed":  # run.sh over the hostfile's two nodes launches its stage 3
        return real.stage3_of(request.getfixturevalue("run_sh_over_two_nodes"))
    return stage3_under(request.param)


# -----------------------------------------------------------------------------
# 2 ranks of stage 3 under each launcher, for real


def test_both_ranks_finish_and_rank_0_reports_both(launched):
    tail = launched.log.read_text(errors="replace")[-3000:]
    assert set(launched.statuses) == {0}, tail
    assert [r["rank"] for r in launched.records] == [0, 1], tail
    assert all(r["error"] is None for r in launched.records), tail


def test_both_ranks_join_one_world_of_2(launched):
    assert [r["world_size"] for r in launched.records] == [2, 2]
    # the deepspeed launcher and torchrun run one rank on each of their two nodes
    per_node = 1 if launched.launcher in ("deepspeed", "torchrun") else 2
    assert [r["ranks_per_node"] for r in launched.records] == [per_node, per_node]


def test_the_record_names_the_launcher(launched):
    assert [r["launcher"] for r in launched.records] == [launched.launcher] * 2


def test_the_record_names_the_node_of_each_rank(launched):
    hosts = [r["env"]["host"] for r in launched.records]
    nodes = list(real.NODES) if launched.launcher == "deepspeed" else hosts  # the hostfile's names
    assert [r["node"] for r in launched.records] == nodes


def test_stage3_partitions_every_tensor_under_each_launcher(launched):
    for r in launched.records:
        assert r["stage"] == 3
        assert r["partitioned_tensors"] == r["param_tensors"] == tiny_tensors()
        assert r["shard_check_ok"]


def test_model_states_are_counted_after_the_last_step(launched):
    for r in launched.records:
        assert r["partition_check_ok"]
        held = parts.Census.from_dict(r["model_state_breakdown"])
        assert held.master > 0 and held.moments > 0
        assert r["model_state_bytes"] == pytest.approx(r["predicted_model_state_bytes"], rel=0.05)


def test_sbatch_runs_both_stages_and_the_report_passes(sbatch_both_stages):
    assert sbatch_both_stages.statuses == [0], sbatch_both_stages.output[-3000:]
    assert real.verdict(sbatch_both_stages.output) == "PASS", sbatch_both_stages.output[-3000:]
    assert {name: [r["launcher"] for r in rs] for name, rs in sbatch_both_stages.runs.items()} == {
        "stage0": ["srun", "srun"], "stage3": ["srun", "srun"]}


def test_run_sh_over_a_hostfile_of_two_nodes_passes_through_pdsh_and_ssh(run_sh_over_two_nodes):
    run = run_sh_over_two_nodes
    assert run.statuses == [0], run.output[-3000:]
    assert real.verdict(run.output) == "PASS", run.output[-3000:]
    assert "pdsh -S" in (run.folder / "stage3.log").read_text()  # the deepspeed launcher's multi-node path
    for name in ("stage0", "stage3"):
        assert [(r["launcher"], r["node"]) for r in run.runs[name]] == [("deepspeed", n) for n in real.NODES]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_killed_rank_is_named_in_the_report(launcher, rank_1_killed_under, engines):
    run = rank_1_killed_under(launcher)
    tail = run.log.read_text(errors="replace")[-3000:] + run.report[-2000:]
    assert all(s not in (0, None) for s in run.statuses), tail
    node = {"deepspeed": "127.0.0.2", "srun": engines.node}.get(launcher, socket.gethostname())
    assert f"stage3: rank 1 on {node} ended first, killed by SIGKILL" in run.report, tail
    assert run.report_status == 1 and "VERDICT: FAIL" in run.report, tail


# -----------------------------------------------------------------------------
# the engines: on loopback alone, in a folder of their own, and gone once stopped


@pytest.fixture(scope="session")
def second_session(engines, tmp_path_factory):
    """start.sh beside this session's engines, as another session would start its own, by a parent that then ends,
    with HOME an empty folder and TMPDIR one of this session's (where no other session's `stop.sh` looks); then
    `stop.sh` without a folder, as after a session that did not stop its engines: what ran, what listened, and
    what was left."""
    home, temp = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("temp")
    env = {"HOME": str(home), "TMPDIR": str(temp)}
    other, why = real.start_engines(env=env, via=["sh", "-c", '"$@"; exit $?', "sh"])
    assert other, why
    running = real.holders(other.state)
    names, listened = {p.name() for p in running}, real.listening(running)
    status, said = real.stop_engines(env=env)
    alive = [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return SimpleNamespace(state=other.state, names=names, listened=listened, status=status, said=said, alive=alive,
                           home=sorted(home.iterdir()))


def test_every_engine_listens_on_loopback_alone(engines):
    listened = real.listening(real.holders(engines.state))
    assert sorted(listened) == ["slurmctld", "slurmd", "sshd"]
    assert {ip for addresses in listened.values() for ip, _ in addresses} <= {"127.0.0.1", "127.0.0.2"}, listened


def test_two_sessions_engines_listen_on_ports_of_their_own(engines, second_session):
    ports = lambda listened: {port for addresses in listened.values() for _, port in addresses}
    assert len(ports(second_session.listened)) == 3
    assert not ports(second_session.listened) & ports(real.listening(real.holders(engines.state)))


def test_stopping_a_session_that_ended_leaves_none_of_its_processes(second_session):
    assert second_session.names >= {"munged", "slurmctld", "slurmd", "sshd"}
    assert (second_session.status, second_session.alive) == (0, []), second_session.said
    assert not second_session.state.exists()


def test_stopping_another_session_leaves_this_ones_engines_answering(engines, second_session):
    for check in (["scontrol", "ping"], ["ssh", "127.0.0.2", "true"]):
        proc = subprocess.run(check, capture_output=True, text=True, timeout=60, env={**os.environ, **engines.env})
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_engines_write_nothing_in_home(second_session):
    assert second_session.home == []
