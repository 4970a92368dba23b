"""What report.py says of every committed results folder: its exit status and its output, as the house work
(issue 35) must leave them, and the words of its verdict apart.

`python3 tests/golden/reports.py` is the one command that writes them anew; do that only where a change of the
report is meant, and say so in its commit. It writes

- tests/golden/reports/FOLDER.txt, one file per folder: "exit N", then the output line by line, so that a change
  diffs line by line;
- tests/golden/verdicts.txt, one line per word of each folder: "FOLDER: WORD", its exit status, each criterion's
  PASS, FAIL or NOT OBSERVABLE at each number of ranks, and the VERDICT. A word of a folder already there moves only where
  tests/golden/allowed.txt, in the same commit, names the folder and the new word (or "-" and the word dropped),
  as "FOLDER: WORD" lines; a move it does not name is refused: the old word is kept, this exits 1 and says which
  line to add, and tests/test_golden.py fails until the line is there. A folder new to verdicts.txt is taken as
  it is."""
import contextlib
import io
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
REPORTS = HERE / "reports"
VERDICTS = HERE / "verdicts.txt"
ALLOWED = HERE / "allowed.txt"
STATUS = re.compile(r"^\s*(PASS|FAIL|NOT OBSERVABLE)  (.*)$")
GROUP = re.compile(r"^(\d+ rank\(s\)):")


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


def as_text(status, output):
    """A folder's golden file: its exit status, then its output."""
    return f"exit {status}\n{output}"


def golden_file(folder):
    return REPORTS / f"{folder}.txt"


def goldens():
    """{folder: its golden file's text} of every golden file."""
    return {str(p.relative_to(REPORTS))[:-len(".txt")]: p.read_text() for p in sorted(REPORTS.glob("**/*.txt"))}


def words(text):
    """A golden file's words: 'exit N', each criterion's status by its letter (or its name where it has none),
    after the number of ranks it judged where the report has several, and 'VERDICT X'."""
    found, group = [], ""
    for line in text.splitlines():
        if line.startswith("exit ") and not found:
            found.append(line)
        elif GROUP.match(line):
            group = GROUP.match(line)[1] + " "
        elif line.startswith("VERDICT: "):
            found.append(f"VERDICT {line[len('VERDICT: '):].split(':')[0]}")
        elif STATUS.match(line):
            status, said = STATUS.match(line).groups()
            letters = re.match(r"\(\w\)( to \(\w\))?", said)
            found.append(f"{group}{letters[0] if letters else said.split(':')[0]} {status}")
    return found


def key(word):
    """What a word is of: 'exit', 'VERDICT', or the criterion without its status ('2 rank(s) (b)')."""
    if word.startswith(("exit ", "VERDICT ")):
        return word.split(" ")[0]
    return re.sub(r" (PASS|FAIL|NOT OBSERVABLE)$", "", word)


def moves(before, after):
    """The words that after has and before lacks, and "- WORD" for each word of before whose key after lacks."""
    kept = {key(w) for w in after}
    return [w for w in after if w not in before] + [f"- {w}" for w in before if w not in after and key(w) not in kept]


def read_lines(path):
    """{folder: [words]} of a file of "FOLDER: WORD" lines (verdicts.txt, allowed.txt); # begins a comment."""
    held = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                folder, _, said = line.partition(": ")
                held.setdefault(folder, []).append(said.strip())
    return held


def verdict_lines(held):
    return "".join(f"{folder}: {w}\n" for folder, ws in sorted(held.items()) for w in ws)


def settled(now, before, allowed):
    """verdicts.txt's words to write: a folder's new words where allowed names each of its moves, else its old
    ones; and the moves refused, as the allowed.txt lines that would let them."""
    held, refused = {}, []
    for folder, ws in now.items():
        missing = [m for m in moves(before.get(folder, ws), ws) if m not in allowed.get(folder, [])]
        held[folder] = before[folder] if missing else ws
        refused += [f"{folder}: {m}" for m in missing]
    return held, refused


def write():
    now = {folder: as_text(*said) for folder, said in snapshot().items()}
    for path in REPORTS.glob("**/*.txt"):
        if str(path.relative_to(REPORTS))[:-len(".txt")] not in now:
            path.unlink()
    for folder, text in now.items():
        golden_file(folder).parent.mkdir(parents=True, exist_ok=True)
        golden_file(folder).write_text(text)
    held, refused = settled({f: words(t) for f, t in now.items()}, read_lines(VERDICTS), read_lines(ALLOWED))
    VERDICTS.write_text(verdict_lines(held))
    print(f"{REPORTS}: {len(now)} folders; {VERDICTS}: their words")
    for line in refused:
        print(f"refused, as {ALLOWED.name} does not name it: {line}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(write())
