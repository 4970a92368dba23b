"""
The launchers that train_gpt.py runs under, one record each in LAUNCHERS: the variables by which a rank knows
it, the ones that give its rank, world and local rank (srun and mpirun set their own, which
machine.adopt_launcher_env turns into torch.distributed's), its name for the rank's node, and its words in the log
for a rank that died (reporting/deaths.py reads them). A new launcher is one record here, with its functions
beside it; tests/test_launchers.py says what else it needs. Torch-free: run.sh asks it which variables to unset
(python3 -m zero3bench.launchers).
"""
from __future__ import annotations

import ast
import base64
import json
import re
import signal
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import psutil

from zero3bench.options import BadInput

# A death as a launcher tells it: (rank, node, code), the code negative for a signal as in Python's subprocess;
# the rank is a list where the launcher names several, or only the node
Death = tuple[int | list[int], str, int]
# torch.distributed's variables as a launcher sets them: env:// reads these five (and DeepSpeed LOCAL_RANK)
TORCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# ...and these two beside them: the ranks of a host (machine.local_ranks) and a node's rank (torchrun's)
TORCH_EXTRAS = ("LOCAL_WORLD_SIZE", "GROUP_RANK")
UNREAD = ("PMI_RANK", "PMIX_RANK")  # the ranks of MPIs other than Open MPI, which train_gpt.py refuses
ONE_PROCESS = "one process"  # a RankResult's launcher where none started it
UNNAMED = "RANK set"  # ...where RANK and the rest were set, by a launcher that is none of these or by hand


@dataclass(frozen=True)
class Launcher:
    """One launcher, all that train_gpt.py and the report know of it. Its functions take the environment, or a
    log's text and the ranks that left a result."""
    name: str  # as a RankResult's `launcher` names it
    detected_by: tuple[str, ...]  # the variables that, all set, say that it started this process
    rank: str  # its variable for the rank: RANK where it sets torch.distributed's own
    world: str  # ...for the number of ranks
    local_rank: str  # ...for the rank on its node, "0" where it is not set
    # torch.distributed's LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from its own variables, or a one-line
    # refusal (BadInput); None where it sets torch.distributed's variables itself
    others: Callable[[Mapping[str, str]], dict[str, str]] | None
    node: Callable[[Mapping[str, str]], str | None] | None  # its name for this rank's node; None: the host's name
    dead: Callable[[str, Collection[int]], list[Death]]  # each death its words in the log tell of, in its order
    localhost_is_a_node: bool  # "localhost" in its words is a node that it was given, not rank 0's host
    one_stream: bool  # it forwards a rank's stdout and stderr apart, in chunks (machine.one_output_stream)

    def started(self, env: Mapping[str, str]) -> bool:
        """Whether it started a process with env: its variables are set, and RANK only where it sets RANK."""
        return all(name in env for name in self.detected_by) and ("RANK" in env) == (self.others is None)

    def torch_variables(self, env: Mapping[str, str]) -> dict[str, str]:
        """torch.distributed's variables from its own; none where it sets them itself."""
        if self.others is None:
            return {}
        others = self.others(env)  # first: it refuses what it cannot read
        return {"RANK": env[self.rank], "LOCAL_RANK": env.get(self.local_rank, "0"), "WORLD_SIZE": env[self.world],
                **others}


# -----------------------------------------------------------------------------
# torchrun

# its account of the first rank that failed, its "Root Cause" block, and of each failure in its "Failures"
ROOT_CAUSE = re.compile(r"Root Cause.*?host\s*:\s*(\S+).*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
FAILURE = re.compile(r"^\s*host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)", re.M)


def torchrun_deaths(text: str, reported: Collection[int]) -> list[Death]:
    """Its Root Cause, the first failure it observed, then the others: it observed rank 0's exit 1, which the loss
    of its peer caused, before that peer's SIGKILL."""
    found = ROOT_CAUSE.search(text)
    if not found:
        return []
    first = (int(found.group(2)), found.group(1), int(found.group(3)))
    others = [(int(rank), host, int(code)) for host, rank, code in FAILURE.findall(text)]
    return [first, *(death for death in others if death != first)]


# -----------------------------------------------------------------------------
# the deepspeed launcher

# its launch.py names the command of the rank it spawned last, whichever rank ended, and pdsh puts the node's
# name before each line of a node's launch.py; the nodes' ranks it logs at start
DEEPSPEED_END = re.compile(r"^(?:(\S+): )?.*\bexits with return code = (-?\d+)$", re.M)
DEEPSPEED_RANKS = re.compile(r"global_rank_mapping=defaultdict\(<class 'list'>, (\{.*\})\)")


def deepspeed_node(env: Mapping[str, str]) -> str | None:
    """Its hostfile's name for this node (where two names reach one host, the host's own name would not tell the
    nodes apart): its launch.py, this rank's parent, holds the nodes in its --world_info, in node-rank order."""
    try:
        [world_info] = [a[len("--world_info="):] for a in psutil.Process().parent().cmdline()
                        if a.startswith("--world_info=")]
        return list(json.loads(base64.urlsafe_b64decode(world_info)))[int(env.get("CROSS_RANK", 0))]
    except (psutil.Error, ValueError, IndexError, AttributeError):  # not launch.py's child after all
        return None


def deepspeed_deaths(text: str, reported: Collection[int]) -> list[Death]:
    """For each node whose launch.py saw a rank end, that node's ranks that left no result."""
    ranks = DEEPSPEED_RANKS.search(text)
    if not ranks:
        return []
    nodes, found = ast.literal_eval(ranks.group(1)), []
    for prefix, code in DEEPSPEED_END.findall(text):
        node = prefix if prefix in nodes else next(iter(nodes))  # one node: launch.py alone, no pdsh
        silent = [rank for rank in nodes[node] if rank not in reported] or nodes[node]
        found.append((silent[0] if len(silent) == 1 else silent, node, int(code)))
    return found


# -----------------------------------------------------------------------------
# Open MPI's mpirun

# "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
MPIRUN_END = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


def mpirun_others(env: Mapping[str, str]) -> dict[str, str]:
    """With one host the master is this host; across hosts nothing says which is rank 0's, so MASTER_ADDR must
    come with the command (mpirun -x)."""
    world, local = env["OMPI_COMM_WORLD_SIZE"], env.get("OMPI_COMM_WORLD_LOCAL_SIZE", env["OMPI_COMM_WORLD_SIZE"])
    if "MASTER_ADDR" not in env and local != world:
        raise BadInput("under mpirun across hosts, give rank 0's address: mpirun -x MASTER_ADDR=<host> ...")
    return {"LOCAL_WORLD_SIZE": local, "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": env.get("MASTER_PORT", "29500")}


def mpirun_deaths(text: str, reported: Collection[int]) -> list[Death]:
    return [(int(rank), node, -int(number)) for rank, node, number in MPIRUN_END.findall(text)]


# -----------------------------------------------------------------------------
# Slurm's srun

# "srun: error: vm: task 1: Killed", "...: tasks 0-1,3: Killed", or "...: task 1: Exited with exit code 3"
SRUN_END = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$", re.M)
SIGNAL_BY_TEXT = {signal.strsignal(s): s for s in signal.Signals}  # "Killed" -> SIGKILL, as srun writes it


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[03-04,07],cpu1' -> 'gpu03'."""
    match = re.match(r"([^,\[]+)(?:\[([^\],-]+))?", nodelist)
    if not match:
        raise BadInput(f"cannot read the first host of the Slurm node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def srun_others(env: Mapping[str, str]) -> dict[str, str]:
    """One task per GPU, the first node as the master."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    # "8(x2),4": 8 tasks on each of the first two nodes; the ranks per node are the first node's
    local_size = (env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "").split("(")[0]
    if not nodelist or "SLURM_NTASKS" not in env:
        raise BadInput("srun set SLURM_PROCID but not SLURM_NTASKS and the node list: run one task per GPU with srun")
    return {"LOCAL_WORLD_SIZE": local_size.split(",")[0] or env["SLURM_NTASKS"],
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodelist),
            # every task must agree on the port without talking first: derive it from the job
            "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)}


def srun_node(env: Mapping[str, str]) -> str | None:
    return env.get("SLURMD_NODENAME") or None


def srun_deaths(text: str, reported: Collection[int]) -> list[Death]:
    """In its order: it told of rank 0's exit 1, which the loss of its peer caused, before the SIGKILL of that peer."""
    return [(one_or_all(tasks), node, srun_code(how.strip())) for node, tasks, how in SRUN_END.findall(text)]


def srun_code(how: str) -> int:
    exited = re.match(r"Exited with exit code (\d+)", how)
    return int(exited.group(1)) if exited else -SIGNAL_BY_TEXT.get(how, signal.SIGKILL)


def one_or_all(tasks: str) -> int | list[int]:
    """srun's task list ("1", "0-1,3") as a rank, or the list of its ranks."""
    ranks = [n for part in tasks.split(",") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
    return ranks[0] if len(ranks) == 1 else ranks


# -----------------------------------------------------------------------------
# the table: where the launcher is not named, its words are looked for in this order

LAUNCHERS = (
    Launcher("deepspeed", detected_by=("RANK", "CROSS_RANK"),  # launch.py's node rank, beside torch's
             rank="RANK", world="WORLD_SIZE", local_rank="LOCAL_RANK", others=None, node=deepspeed_node,
             dead=deepspeed_deaths, localhost_is_a_node=True, one_stream=False),
    Launcher("torchrun", detected_by=("RANK", "TORCHELASTIC_RUN_ID"),
             rank="RANK", world="WORLD_SIZE", local_rank="LOCAL_RANK", others=None, node=None,
             dead=torchrun_deaths, localhost_is_a_node=False, one_stream=False),
    # before srun's: inside an allocation, mpirun starts its daemons on the other nodes with srun, whose
    # SLURM_PROCID and SLURM_STEP_ID (the daemon's) its ranks there inherit
    Launcher("mpirun", detected_by=("OMPI_COMM_WORLD_RANK",),
             rank="OMPI_COMM_WORLD_RANK", world="OMPI_COMM_WORLD_SIZE", local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
             others=mpirun_others, node=None, dead=mpirun_deaths, localhost_is_a_node=False, one_stream=True),
    Launcher("srun", detected_by=("SLURM_PROCID", "SLURM_STEP_ID"),  # a step's task, not a batch script's shell
             rank="SLURM_PROCID", world="SLURM_NTASKS", local_rank="SLURM_LOCALID", others=srun_others,
             node=srun_node, dead=srun_deaths, localhost_is_a_node=False, one_stream=False),
)


def named(name: str | None) -> Launcher | None:
    """The launcher of a RankResult's name for it; None for one process, RANK set, or none."""
    return next((launcher for launcher in LAUNCHERS if launcher.name == name), None)


def inherited() -> list[str]:
    """What run.sh unsets, as it is its runs' launcher: torch.distributed's variables and each launcher's rank, which
    a caller's own (a Slurm step, a PyTorchJob pod) would leave set."""
    ranks = [launcher.rank for launcher in LAUNCHERS]
    return list(dict.fromkeys([*TORCH_VARIABLES, *TORCH_EXTRAS, *ranks, *UNREAD]))


if __name__ == "__main__":
    print(" ".join(inherited()))
