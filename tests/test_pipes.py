"""Output into `head` and the like: a command whose reader has gone ends quietly, with its own exit status and
its work done (formatting.quiet_when_closed)."""
import json
import shutil
import subprocess
import sys

from conftest import ROOT

# a run of both stages on 2 CPU ranks, as run.sh left it
RUN = ROOT / "benchmarks" / "logs" / "cpu" / "20261201-132528-s0xf"


def with_the_reader_gone(argv):
    """argv run with its stdout a pipe whose reading end is closed before it prints anything."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=300), err


def test_report_py_into_a_closed_pipe_ends_quietly_with_its_verdict_and_writes_its_files(tmp_path):
    for log in RUN.glob("*.log"):
        shutil.copy(log, tmp_path)
    read = subprocess.run([sys.executable, "report.py", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    status, err = with_the_reader_gone([sys.executable, "report.py", "--write", str(tmp_path)])
    assert err == "" and status == read.returncode, err[-2000:]
    assert f"VERDICT: {json.loads((tmp_path / 'summary.json').read_text())['verdict']}" in read.stdout
