"""
The rank that ended first with a failure, as its launcher tells it in the log: each launcher says it in its
own words (tests/test_launchers.py kills a rank under each). A death is (rank, node, code), the code negative
for a signal as in Python's subprocess; the rank is a list where the launcher names only the node.
"""
import ast
import re
import signal

SIGNAL_BY_TEXT = {signal.strsignal(s): s for s in signal.Signals}  # "Killed" -> SIGKILL, as srun writes it

# torchrun's account of the first rank that failed: its "Root Cause" block
ROOT_CAUSE = re.compile(r"Root Cause.*?host\s*:\s*(\S+).*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
# srun: "srun: error: vm: task 1: Killed", "...: tasks 0-1,3: Killed", or "...: task 1: Exited with exit code 3"
SRUN = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$", re.M)
# Open MPI's mpirun: "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
MPIRUN = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# The deepspeed launcher's launch.py names the command of the rank it spawned last, whichever rank ended, and
# pdsh puts the node's name before each line of a node's launch.py; the nodes' ranks it logs at start.
DEEPSPEED_END = re.compile(r"^(?:(\S+): )?.*\bexits with return code = (-?\d+)$", re.M)
DEEPSPEED_RANKS = re.compile(r"global_rank_mapping=defaultdict\(<class 'list'>, (\{.*\})\)")


def torchrun(text, reported):
    found = ROOT_CAUSE.search(text)
    return found and (int(found.group(2)), found.group(1), int(found.group(3)))


def srun(text, reported):
    found = SRUN.search(text)
    if not found:
        return None
    how = found.group(3).strip()
    exited = re.match(r"Exited with exit code (\d+)", how)
    code = int(exited.group(1)) if exited else -SIGNAL_BY_TEXT.get(how, signal.SIGKILL)
    return one_or_all(found.group(2)), found.group(1), code


def one_or_all(tasks):
    """srun's task list ("1", "0-1,3") as a rank, or the list of its ranks."""
    ranks = [n for part in tasks.split(",") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
    return ranks[0] if len(ranks) == 1 else ranks


def mpirun(text, reported):
    found = MPIRUN.search(text)
    return found and (int(found.group(1)), found.group(2), -int(found.group(3)))


def deepspeed(text, reported):
    """The node whose launch.py saw a rank end first; of its ranks, the ones that left no result."""
    ended, ranks = DEEPSPEED_END.search(text), DEEPSPEED_RANKS.search(text)
    if not (ended and ranks):
        return None
    nodes = ast.literal_eval(ranks.group(1))
    node = ended.group(1) if ended.group(1) in nodes else next(iter(nodes))  # one node: launch.py alone, no pdsh
    silent = [rank for rank in nodes[node] if rank not in reported] or nodes[node]
    return (silent[0] if len(silent) == 1 else silent), node, int(ended.group(2))


LAUNCHERS = {"torchrun": torchrun, "srun": srun, "mpirun": mpirun, "deepspeed": deepspeed}


def first_death(text, launcher, reported):
    """(rank, node, code) of the first rank to fail, by the account of launcher (a RankResult's name for it),
    or of any launcher whose words the log holds; reported is the ranks that left a result."""
    readers = [LAUNCHERS[launcher]] if launcher in LAUNCHERS else LAUNCHERS.values()
    return next((death for read in readers if (death := read(text, reported))), None)
