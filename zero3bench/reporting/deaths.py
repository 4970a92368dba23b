"""
The ranks that ended with a failure, as their launcher tells it in the log, in the order it tells them: each
launcher says it in its own words, which its record in zero3bench/launchers.py reads (tests/test_launchers_real.py
kills a rank under each). A death is (rank, node, code), the code negative for a signal as in Python's
subprocess; the rank is a list where the launcher names several, or only the node. The order is the launcher's:
srun told of rank 0's exit 1, which the loss of its peer caused, before the SIGKILL of that peer.
"""
from collections.abc import Collection

from zero3bench import launchers
from zero3bench.launchers import Death


def told(text: str, launcher: str | None, reported: Collection[int], host: str | None) -> list[Death]:
    """Every death (rank, node, code) by the account of launcher (a RankResult's name for it), or of the first
    launcher whose words the log holds; reported is the ranks that left a result. A node told as localhost is
    host, rank 0's, where one is known and the launcher was given no node of that name (torchrun names one so)."""
    named = launchers.named(launcher)
    readers = [named] if named else launchers.LAUNCHERS
    deaths = next((deaths for reader in readers if (deaths := reader.dead(text, reported))), [])
    if not host or (named and named.localhost_is_a_node):
        return deaths
    return [(rank, host if node == "localhost" else node, code) for rank, node, code in deaths]
