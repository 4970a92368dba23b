"""Runs the survivors named in a mutants log (benchmarks/mutants.py's) against chosen test files, to check that
a new test kills them: `python3 benchmarks/mutants_recheck.py LOG MODULE_PART[,...] TEST_FILE ...` prints
killed or survived for each survivor, timeout or uncovered one of the modules named, or gone where its line has
changed since the log."""
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT), str(ROOT / "tests")]
os.chdir(ROOT)
import mutants  # noqa: E402

if __name__ == "__main__":
    log, parts, tests = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    found = [mutants.LINE.match(line) for line in Path(log).read_text().splitlines()]
    selection = mutants.Selection(mutants.launch_fixtures())
    started = time.monotonic()
    mutants.run_tests(tests, selection, first_failure=False)  # imports the tests once, as mutants.py does, timed
    unmutated_s = time.monotonic() - started
    for m in filter(None, found):
        module, qualname, what, same, text = m[2], m[3], m[4], int(m[5] or 1) - 1, m[6]
        if any(part in module for part in parts):
            __import__(module)
            source = Path(sys.modules[module].__file__).read_text()
            found = [x for x in mutants.mutants(source, sys.modules[module]) if x[:4] == (qualname, text, what, same)]
            verdict = (mutants.in_a_fork(module, qualname, found[0][4], tests, selection, unmutated_s) if found
                       else "gone")
            print(verdict, module, qualname, what, text[:70])  # gone: its line has changed since the log
