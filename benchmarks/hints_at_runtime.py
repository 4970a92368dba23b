"""Every value that reaches a function of zero3bench, held to the function's type hints as it runs (issue 35: hints
with no wrong ones). typeguard does the checking; it is no dependency of the project (pip install typeguard).

    python3 benchmarks/hints_at_runtime.py LOG -- python3 -m pytest -q -n 2 tests

runs the command with zero3bench instrumented in every Python process it starts, the launched ranks included: a
line in site-packages (a .pth file, removed at the end) installs the hook wherever $TYPEGUARD_LOG is set. A value
outside its hint is written to LOG, with the test that was running, instead of raising; the distinct ones are
printed at the end, each with its count."""
import collections
import os
import signal
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


def checked_fields(cls: type) -> None:
    """A dataclass whose fields are checked against their hints when it is made and whenever one is set: typeguard
    instruments the functions in the source, not the __init__ that dataclasses writes."""
    import dataclasses
    import typing

    from typeguard import TypeCheckError, check_type
    module = sys.modules[cls.__module__]
    hints = {}
    for f in dataclasses.fields(cls):
        try:
            hints[f.name] = typing.get_type_hints(cls, vars(module))[f.name]
        except (NameError, TypeError):
            pass  # a hint that names what exists only for a type checker

    def check(self: object, name: str, value: object) -> None:
        if name in hints:
            try:
                check_type(value, hints[name])
            except TypeCheckError as e:
                record(TypeCheckError(f"field {cls.__name__}.{name} ({type(value).__name__}) {e}"), None)
    made, setattr_ = cls.__init__, cls.__setattr__

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)
        for name in hints:
            check(self, name, getattr(self, name))

    def __setattr__(self: object, name: str, value: object) -> None:
        setattr_(self, name, value)
        check(self, name, value)
    cls.__init__ = __init__
    if not cls.__dataclass_params__.frozen:
        cls.__setattr__ = __setattr__


class CheckedFields:
    """An import finder that hands each module of zero3bench's dataclasses to checked_fields once it has run."""

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        import dataclasses
        if not name.startswith("zero3bench"):
            return None
        spec = next((found for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     and (found := finder.find_spec(name, path, target))), None)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: object) -> None:
            run(module)
            for cls in list(vars(module).values()):
                if dataclasses.is_dataclass(cls) and isinstance(cls, type) and cls.__module__ == name:
                    checked_fields(cls)
        spec.loader.exec_module = exec_module
        return spec


def install_hook() -> None:
    from typeguard import CollectionCheckStrategy, config, install_import_hook
    config.collection_check_strategy = CollectionCheckStrategy.ALL_ITEMS
    config.typecheck_fail_callback = record
    install_import_hook(["zero3bench"])
    sys.meta_path.insert(0, CheckedFields())


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
    # a kill is an exit too: the .pth goes, and subprocess.call kills the command (which leaves its own children, as
    # pytest's workers, to their own handling)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        status = subprocess.call(command, env={**os.environ, "TYPEGUARD_LOG": str(log)})
    finally:
        PTH.unlink()
    print(f"exit status {status}\n{summary(log)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
