"""README.md names only options that the scripts take and files that the repository holds, and every relative
link of README.md, BENCHMARKS.md and docs/ leads to a file or folder of the repository."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
SCRIPT = re.compile(r"\b(train_gpt\.py|run\.sh|report\.py|plan\.py)\b")
# names joined by /; a leading / or ~ is the machine's path (/dev/shm, ~/.cache), not the repository's
PATH = re.compile(r"[\w.*<>-]+(/[\w.*<>-]+)*/?")
# the files of a run's record, which run.sh writes into each results folder
RECORD = ("report.txt", "summary.json", "summary.md", "memory.png")
HELPS = ([sys.executable, "train_gpt.py", "--help"], ["bash", "run.sh", "--help"],
         [sys.executable, "report.py", "--help"], [sys.executable, "plan.py", "--help"])


def code_spans():
    """The README's inline code, and each command line of its bash blocks from the first of our scripts it
    names on (srun's options before it are srun's); comments left out."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [line.partition(" #")[0] for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return re.findall(r"`([^`]+)`", prose) + [line[found.start():] for line in lines if (found := SCRIPT.search(line))]


def repo_paths(span):
    """The words of a span that name a file or folder of the repository, less placeholders (<N>) and what run.sh
    makes: results folders and the record in each."""
    return [word for word in span.split() if PATH.fullmatch(word)
            and ("/" in word or word.endswith((".py", ".sh", ".json", ".md")))
            and "<" not in word and not word.startswith("results/") and word not in RECORD]


@pytest.fixture(scope="module")
def options_taken():
    """Every option that train_gpt.py, run.sh, report.py and plan.py list in their --help."""
    taken = set()
    for command in HELPS:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        taken.update(OPTION.findall(proc.stdout))
    return taken


def test_every_option_the_readme_names_is_taken(options_taken):
    named = {option for span in code_spans() for option in OPTION.findall(span)}
    assert named and sorted(named - options_taken) == []


def test_ci_runs_the_readmes_test_command_as_it_is_written():
    [command] = [line for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S) for line in block.splitlines()
                 if "pytest" in line]
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_file_the_readme_names_is_in_the_repository():
    named = {path for span in code_spans() for path in repo_paths(span)}
    assert named and sorted(p for p in named if not list(ROOT.glob(p.rstrip("/")))) == []


# [text](target) and ![alt](target), a target without spaces; an optional "title" after it
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(page):
    """The targets of a page's links that point into the repository, less their #anchor."""
    targets = LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
    return [t.partition("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_every_relative_link_of_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages for target in relative_links(page)
              if not (page.parent / target).exists()]
    assert broken == []


def anchors(page):
    """The #anchors that GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_anchor_of_the_docs_names_a_heading():
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    targets = [(page, target) for page in pages
               for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
               if "#" in target and not re.match(r"[a-z]+:", target)]
    missing = [f"{page.relative_to(ROOT)}: {target}" for page, target in targets
               if target.partition("#")[2] not in anchors((page.parent / target.partition("#")[0]).resolve()
                                                          if target.partition("#")[0] else page)]
    assert targets and missing == []
