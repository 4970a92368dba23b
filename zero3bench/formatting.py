"""Figures as text, shared by train_gpt.py's lines and report.py's tables, the progress lines of a run, and a
command's output into a pipe that its reader closes."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

START = time.perf_counter()



class QuietWhenClosed:
    """stdout that goes to /dev/null once its reader has gone (`| head -1`), without a BrokenPipeError."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        return self.quietly(self.stream.write, text)

    def flush(self) -> None:
        return self.quietly(self.stream.flush)

    def quietly(self, call: Callable[..., T], *args: object) -> T:
        try:
            return call(*args)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())  # what is buffered goes there too
            return call(*args)


def quiet_when_closed() -> None:
    """A command's output into `head` and the like: once the reader has gone, the command carries on with its work
    (report.py --write still writes its files) and ends with its own status, printing nowhere, with no traceback
    at a print or at exit's flush."""
    if not isinstance(sys.stdout, QuietWhenClosed):
        sys.stdout = QuietWhenClosed(sys.stdout)


def gib(nbytes: float) -> float:
    return nbytes / 2**30


def size(nbytes: float) -> str:
    """Bytes in GiB, or in MiB below one GiB, so that a toy model's figures still show."""
    return f"{gib(nbytes):.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def fmt(value: float | None, spec: str) -> str:
    """A figure, or '-' where nothing was measured; spec 'bytes' gives GiB or MiB."""
    if value is None:
        return "-"
    return size(value) if spec == "bytes" else format(value, spec)


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    """Measured against predicted, as a fraction; None where either is missing or zero."""
    return measured / predicted - 1 if measured and predicted else None


def format_table(rows: Sequence[Sequence[object]]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def phase(rank: int, name: str, quiet_under_s: float = 0.0) -> Iterator[None]:
    """Log a phase's end (where it took quiet_under_s or more), and a line every 30 s while it runs: a first JIT
    build of DeepSpeed's ops can take minutes, and a long start should never sit silent."""
    start, done = time.perf_counter(), threading.Event()

    def heartbeat() -> None:
        while not done.wait(30):
            log(rank, f"{name}: still running after {time.perf_counter() - start:.0f} s")

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        yield
    finally:
        done.set()
    if time.perf_counter() - start >= quiet_under_s:
        log(rank, f"{name}: done in {time.perf_counter() - start:.1f} s")
