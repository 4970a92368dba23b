"""Launches through the real engines that tests/launchers/start.sh starts on this machine, for one test session:
Slurm's srun, salloc and sbatch, Open MPI's mpirun, the deepspeed launcher over pdsh and ssh, and torchrun with
two rendezvous agents. Each launch reaches the session's engines through the variables of their folder's env file
(SLURM_CONF, and PATH led by an ssh that reads their ssh config), leaves its logs in a folder that report.py reads,
and none of its processes behind: every one carries a marker in its environment (the deepspeed launcher's,
through its DS_ENV_FILE)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

import conftest
from conftest import ROOT, free_port, json_results
from zero3bench import launchers

START = ROOT / "tests" / "launchers" / "start.sh"
STOP = ROOT / "tests" / "launchers" / "stop.sh"
NODES = ("localhost", "127.0.0.2")  # two names of this machine, as a hostfile's two nodes
STEPS_TO_KILL = 3000  # a killed launch's --steps: far more than it runs before its rank 1 is killed
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]  # as root, 2 ranks on 2 cores


def start_engines(env=None, via=()):
    """start.sh in a new folder of the temp folder (env's TMPDIR, if it names one), with the variables env, run by
    the command via (a parent of its own) if given: the engines (their folder, the variables that reach them and
    Slurm's node), or None and its one line on why not."""
    state = Path(tempfile.mkdtemp(prefix="zero3-launchers-", dir=(env or {}).get("TMPDIR")))
    proc = subprocess.run([*via, "bash", str(START), str(state)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        shutil.rmtree(state, ignore_errors=True)  # what start.sh made before it failed, and stopped
        return None, (proc.stderr.strip().splitlines() or ["start.sh failed"])[-1]
    reach = {name: os.path.expandvars(value) for name, value in
             re.findall(r"^export (\w+)=(.*)$", (state / "env").read_text(), re.M)}
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **reach}).stdout.strip()
    return SimpleNamespace(state=state, env=reach, node=node), None


def stop_engines(*args, env=None):
    """stop.sh ARGS (a folder, or none for those of sessions that have ended), with the variables env: its exit
    status and stderr."""
    proc = subprocess.run(["bash", str(STOP), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stderr


def holders(state):
    """The processes that hold a file open in the folder state, as stop.sh finds them: the engines started there."""
    found = []
    for proc in psutil.process_iter():
        try:
            if any(Path(f.path).is_relative_to(state) for f in proc.open_files()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def listening(procs):
    """{name of a process of procs: the (address, port) it listens on}, for those that listen."""
    pids = {p.pid: p.name() for p in procs}
    found = {}
    for c in psutil.net_connections("inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            found.setdefault(pids[c.pid], set()).add((c.laddr.ip, c.laddr.port))
    return found


def hostfile(folder):
    path = folder / "hostfile"
    path.write_text("".join(f"{node} slots=1\n" for node in NODES))
    return path


def torchrun_agents(port, *train):
    """Two torchrun agents, one node each, meeting at a c10d rendezvous on this machine."""
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-id", "zero3", "--rdzv-endpoint", f"127.0.0.1:{port}", "train_gpt.py",
             *train]
    return [agent, agent]


# each launcher's command lines (torchrun's two agents are two) that run train_gpt.py with train on 2 ranks, given a
# folder of the launch's own and a free port
COMMANDS = {
    "srun": lambda folder, port, *train: [["salloc", "--ntasks", "2", "srun", "--ntasks", "2", "python3", "train_gpt.py",
                                           *train]],
    # a port of its own: under mpirun, train_gpt.py's is 29500 unless given, which another session's may hold
    "mpirun": lambda folder, port, *train: [[*MPIRUN, "-x", f"MASTER_PORT={port}", "python3", "train_gpt.py", *train]],
    "deepspeed": lambda folder, port, *train: [["deepspeed", "--hostfile", str(hostfile(folder)), "--master_port",
                                                port, "train_gpt.py", *train]],
    "torchrun": lambda folder, port, *train: torchrun_agents(port, *train),
}


def commands(launcher, folder, *train):
    return COMMANDS[launcher](folder, str(free_port()), *train)


def marked(folder):
    """The environment of a launch, with its marker, which the deepspeed launcher carries over ssh too."""
    marker = str(folder)
    (folder / "deepspeed_env").write_text(f"ZERO3_TEST_LAUNCH={marker}\n")
    return marker, {**os.environ, "ZERO3_TEST_LAUNCH": marker, "DS_ENV_FILE": str(folder / "deepspeed_env")}


def end_leftovers(marker):
    conftest.end_processes(conftest.run_processes(marker, "ZERO3_TEST_LAUNCH"))


def launch(folder, cmds, log, engines, until=None, act=None, extra=None):
    """Runs cmds at once (torchrun's agents), their output into log, with the variables that reach the engines and
    extra; with until, calls act(marker) once the log holds it. Returns the exit statuses (None for one that did
    not end within 10 minutes) and the seconds."""
    marker, env = marked(folder)
    env.update({**engines.env, **(extra or {})})
    started, procs = time.monotonic(), []
    try:
        with open(log, "a") as out:
            procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT) for c in cmds]
        while until and until not in log.read_text(errors="replace"):
            if all(p.poll() is not None for p in procs) or time.monotonic() - started > 600:
                break
            time.sleep(0.2)
        else:
            if act:
                act(marker)
        statuses = []
        for p in procs:
            try:
                statuses.append(p.wait(timeout=max(1, 600 - (time.monotonic() - started))))
            except subprocess.TimeoutExpired:
                statuses.append(None)
        return statuses, time.monotonic() - started
    finally:
        for p in procs:
            p.kill()
            p.wait()
        end_leftovers(marker)


def report(folder):
    proc = subprocess.run([sys.executable, "report.py", str(folder)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def stage3(folder, launcher, engines):
    """train_gpt.py --stage 3 --steps 1 on 2 ranks under launcher: the census and the shards need one step."""
    log = folder / "stage3.log"
    statuses, seconds = launch(folder, commands(launcher, folder, "--stage", "3", "--steps", "1"), log, engines)
    return SimpleNamespace(launcher=launcher, statuses=statuses, seconds=seconds, log=log, records=json_results(log))


def stage3_of(run_sh):
    """The stage-3 launch of a run.sh over the hostfile (run_sh_over_hostfile), as stage3 gives one."""
    log = run_sh.folder / "stage3.log"
    return SimpleNamespace(launcher="deepspeed", statuses=run_sh.statuses, seconds=None, log=log,
                           records=json_results(log))


def kill_rank_1(launcher):
    def act(marker):
        conftest.rank_1(conftest.run_processes(marker, "ZERO3_TEST_LAUNCH"), launchers.named(launcher).rank).kill()
    return act


def killed(folder, launcher, engines):
    """Stage 3 on 2 ranks under launcher whose rank 1 is killed (SIGKILL) once rank 0 has logged step 1, and the
    report of its log."""
    log = folder / "stage3.log"
    statuses, seconds = launch(folder, commands(launcher, folder, "--stage", "3", "--steps", str(STEPS_TO_KILL)),
                               log, engines, until=f"step 1/{STEPS_TO_KILL}", act=kill_rank_1(launcher))
    status, out = report(folder)
    (folder / "report.txt").write_text(out)
    return SimpleNamespace(launcher=launcher, statuses=statuses, seconds=seconds, log=log, report=out,
                           report_status=status)


SBATCH_SCRIPT = """#!/bin/bash
#SBATCH --ntasks 2
# both stages as the README's Slurm lines run them, then the report
cd {root}
srun python3 train_gpt.py --stage 0 > {folder}/stage0.log 2>&1
srun python3 train_gpt.py --stage 3 > {folder}/stage3.log 2>&1
python3 report.py {folder}
"""


def sbatch(folder, engines):
    """sbatch --wait of a script that runs both stages with srun, then report.py; its output and report."""
    script, out, logs = folder / "both.sbatch", folder / "slurm.out", folder / "logs"
    logs.mkdir()
    script.write_text(SBATCH_SCRIPT.format(root=ROOT, folder=logs))
    statuses, seconds = launch(folder, [["sbatch", "--wait", "--output", str(out), str(script)]],
                               folder / "sbatch.out", engines)
    return SimpleNamespace(statuses=statuses, seconds=seconds, output=out.read_text(errors="replace"), folder=logs,
                           runs=conftest.json_runs(logs))


def run_sh_over_hostfile(folder, engines):
    """HOSTFILE=<the two node names, slots=1 each> bash run.sh: both stages under the deepspeed launcher."""
    results, out = folder / "results", folder / "run_sh.out"
    results.mkdir()
    statuses, seconds = launch(folder, [["bash", "run.sh"]], out, engines,
                               extra={"HOSTFILE": str(hostfile(folder)), "RESULTS": str(results)})
    [run] = results.iterdir()
    return SimpleNamespace(statuses=statuses, seconds=seconds, output=out.read_text(errors="replace"), folder=run,
                           runs=conftest.json_runs(run))


def verdict(text):
    found = re.search(r"^VERDICT: (\S+)", text, re.M)
    return found and found.group(1)
