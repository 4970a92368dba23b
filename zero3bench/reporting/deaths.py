"""
The ranks that ended with a failure, as their launcher tells it in the log, in the order it tells them: each
launcher says it in its own words (tests/test_launchers.py kills a rank under each). A death is (rank, node,
code), the code negative for a signal as in Python's subprocess; the rank is a list where the launcher names
several, or only the node. The order is the launcher's: srun told of rank 0's exit 1, which the loss of its
peer caused, before the SIGKILL of that peer.
"""
import ast
import re
import signal
from collections.abc import Collection

Death = tuple[int | list[int], str, int]  # (rank, node, code), as above
SIGNAL_BY_TEXT = {signal.strsignal(s): s for s in signal.Signals}  # "Killed" -> SIGKILL, as srun writes it

# torchrun's account of the first rank that failed, its "Root Cause" block, and of each failure in its "Failures"
ROOT_CAUSE = re.compile(r"Root Cause.*?host\s*:\s*(\S+).*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
FAILURE = re.compile(r"^\s*host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
# srun: "srun: error: vm: task 1: Killed", "...: tasks 0-1,3: Killed", or "...: task 1: Exited with exit code 3"
SRUN = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$", re.M)
# Open MPI's mpirun: "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
MPIRUN = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# The deepspeed launcher's launch.py names the command of the rank it spawned last, whichever rank ended, and
# pdsh puts the node's name before each line of a node's launch.py; the nodes' ranks it logs at start.
DEEPSPEED_END = re.compile(r"^(?:(\S+): )?.*\bexits with return code = (-?\d+)$", re.M)
DEEPSPEED_RANKS = re.compile(r"global_rank_mapping=defaultdict\(<class 'list'>, (\{.*\})\)")


def torchrun(text: str, reported: Collection[int]) -> list[Death]:
    """Its Root Cause, the first failure it observed, then the others: it observed rank 0's exit 1, which the loss
    of its peer caused, before that peer's SIGKILL."""
    found = ROOT_CAUSE.search(text)
    if not found:
        return []
    first = (int(found.group(2)), found.group(1), int(found.group(3)))
    others = [(int(rank), host, int(code)) for host, rank, code in FAILURE.findall(text)]
    return [first, *(death for death in others if death != first)]


def srun(text: str, reported: Collection[int]) -> list[Death]:
    return [(one_or_all(tasks), node, srun_code(how.strip())) for node, tasks, how in SRUN.findall(text)]


def srun_code(how: str) -> int:
    exited = re.match(r"Exited with exit code (\d+)", how)
    return int(exited.group(1)) if exited else -SIGNAL_BY_TEXT.get(how, signal.SIGKILL)


def one_or_all(tasks: str) -> int | list[int]:
    """srun's task list ("1", "0-1,3") as a rank, or the list of its ranks."""
    ranks = [n for part in tasks.split(",") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
    return ranks[0] if len(ranks) == 1 else ranks


def mpirun(text: str, reported: Collection[int]) -> list[Death]:
    return [(int(rank), node, -int(number)) for rank, node, number in MPIRUN.findall(text)]


def deepspeed(text: str, reported: Collection[int]) -> list[Death]:
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


LAUNCHERS = {"torchrun": torchrun, "srun": srun, "mpirun": mpirun, "deepspeed": deepspeed}


def told(text: str, launcher: str | None, reported: Collection[int]) -> list[Death]:
    """Every death (rank, node, code) by the account of launcher (a RankResult's name for it), or of the first
    launcher whose words the log holds; reported is the ranks that left a result."""
    readers = [LAUNCHERS[launcher]] if launcher in LAUNCHERS else LAUNCHERS.values()
    return next((deaths for read in readers if (deaths := read(text, reported))), [])
