"""Every value that reaches a function of zero3bench, held to the function's type hints as it runs (issue 35: hints
with no wrong ones). typeguard does the checking; it is no dependency of the project (pip install typeguard).

    python3 benchmarks/hints_at_runtime.py LOG -- python3 -m pytest -q -n 2 tests

runs the command with zero3bench instrumented in every Python process it starts, the launched ranks included: a
line in site-packages (a .pth file, removed at the end) installs the hook wherever $TYPEGUARD_LOG is set. A value
outside its hint is written to LOG, with the test that was running, instead of raising; the distinct ones are
printed at the end, each with its count."""
import collections
import os
import site
import subprocess
import sys
import traceback
from pathlib import Path

PTH = Path(site.getsitepackages()[0]) / "zero3bench_hints_at_runtime.pth"


def record(exc: Exception, memo: object) -> None:
    frame = next((f for f in reversed(traceback.extract_stack()[:-1]) if "zero3bench/" in f.filename), None)
    where = f"zero3bench/{frame.filename.split('zero3bench/')[-1]}:{frame.lineno} {frame.name}" if frame else "?"
    with open(os.environ["TYPEGUARD_LOG"], "a") as log:
        log.write(f"{where}\t{' '.join(str(exc).split())}\t{os.environ.get('PYTEST_CURRENT_TEST', '')}\n")


def install_hook() -> None:
    from typeguard import CollectionCheckStrategy, config, install_import_hook
    config.collection_check_strategy = CollectionCheckStrategy.ALL_ITEMS
    config.typecheck_fail_callback = record
    install_import_hook(["zero3bench"])


def summary(log: Path) -> str:
    lines = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    counts = collections.Counter((where, what) for where, what, _ in lines)
    first = {}
    for where, what, test in lines:
        first.setdefault((where, what), test)
    return "\n".join([f"{len(counts)} distinct values outside their hints ({len(lines)} in all):"]
                     + [f"{n:6d}  {where}: {what}\n        first in: {first[where, what] or 'no test'}"
                        for (where, what), n in counts.most_common()])


def main(argv: list[str]) -> int:
    log, command = Path(argv[0]).resolve(), argv[argv.index("--") + 1:]
    log.unlink(missing_ok=True)
    PTH.write_text(f"import os, sys; os.environ.get('TYPEGUARD_LOG') and (sys.path.append("
                   f"{str(Path(__file__).parent)!r}), __import__('hints_at_runtime').install_hook())\n")
    try:
        status = subprocess.call(command, env={**os.environ, "TYPEGUARD_LOG": str(log)})
    finally:
        PTH.unlink()
    print(f"exit status {status}\n{summary(log)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
