"""Cluster launchers: srun and OpenMPI's mpirun set their own variables, not torch.distributed's, and
train_gpt.py must read them, or every process would train alone as rank 0 of 1. Neither is installed here:
their environments are emulated on one host with 2 ranks. And a rank that hangs must end the run, with the
hung rank named, within a stated time."""
import pytest
import torch

import machine
import options
import train_gpt
from conftest import HUNG_TIMEOUT_S

LAUNCHERS = {"srun": "srun_2_ranks", "mpirun": "mpirun_2_ranks"}


def tiny_tensors():
    with torch.device("meta"):
        return len(list(train_gpt.GPT(train_gpt.PRESETS["tiny"]).parameters()))


@pytest.fixture(params=LAUNCHERS)
def launched(request):
    """(launcher's name, its 2-rank run)"""
    return request.param, request.getfixturevalue(LAUNCHERS[request.param])


# -----------------------------------------------------------------------------
# 2 ranks under each launcher, emulated


def test_both_ranks_finish_and_rank_0_reports_both(launched):
    name, run = launched
    assert run.statuses == [0, 0], run.output[-3000:]
    assert [r["rank"] for r in run.records] == [0, 1], run.output[-3000:]
    assert all(r["error"] is None for r in run.records)


def test_both_ranks_join_one_world_of_2(launched):
    name, run = launched
    assert [r["world_size"] for r in run.records] == [2, 2]
    assert [r["ranks_per_node"] for r in run.records] == [2, 2]


def test_the_record_names_the_launcher(launched):
    name, run = launched
    assert [r["launcher"] for r in run.records] == [name, name]


def test_stage3_partitions_every_tensor_under_each_launcher(launched):
    name, run = launched
    for r in run.records:
        assert r["stage"] == 3
        assert r["partitioned_tensors"] == r["param_tensors"] == tiny_tensors()
        assert r["shard_check_ok"]


def test_model_states_are_counted_after_one_step(launched):
    name, run = launched
    for r in run.records:
        assert len(r["steps"]) == 1
        assert r["partition_check_ok"]
        parts = r["model_state_breakdown"]
        assert parts["master"] > 0 and parts["moments"] > 0
        assert r["model_state_bytes"] == pytest.approx(r["predicted_model_state_bytes"], rel=0.05)


# -----------------------------------------------------------------------------
# reading the launchers' variables, without a launch


@pytest.mark.parametrize("nodelist, host", [
    ("gpu[03-04,07],cpu1", "gpu03"),
    ("node7", "node7"),
    ("node7,node8", "node7"),
    ("gpu[12,15]", "gpu12"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert machine.first_host(nodelist) == host


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


def test_rank_already_set_is_left_alone():
    # deepspeed and torchrun set RANK and the rest; a launcher's own variables beside them are not read
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "31000",
           **srun_task(3, 1)}
    before = dict(env)
    assert machine.adopt_launcher_env(env) == "deepspeed or torchrun"
    assert env == before


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
