"""What report.py says of every committed results folder: its exit status and its output, as the house work
(issue 35) must leave them. `python3 tests/golden/reports.py` writes tests/golden/reports.json anew; do that only
where a change of the report is meant, and say so in its commit."""
import contextlib
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("reports.json")


def results_folders():
    """Every folder under benchmarks/logs that holds a run's log (a stage's, or one with a RESULT line: a run
    that died before its RESULT is a result too), relative to the project's root."""
    logs = ROOT / "benchmarks" / "logs"
    return sorted({p.parent.relative_to(ROOT) for p in logs.glob("**/*.log")
                   if p.name.startswith("stage") or "RESULT {" in p.read_text(errors="replace")})


def reported(folder):
    """report.py FOLDER's exit status and output (stdout and stderr), run from the project's root."""
    import report
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = report.main([str(folder)])
        except SystemExit as e:
            status = e.code
    return [status, out.getvalue()]


def snapshot():
    """{folder: reported(folder)}, each read from the project's root, as the folders are named."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return {str(folder): reported(folder) for folder in results_folders()}
    finally:
        os.chdir(here)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"{SNAPSHOT}: {len(json.loads(SNAPSHOT.read_text()))} folders")
