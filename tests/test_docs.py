"""README.md names only options that the scripts take and files that the repository holds, and every relative
link of README.md, BENCHMARKS.md and docs/ leads to a file or folder of the repository."""
import json
import os
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
    """The words of a span that name a file or folder of the repository, less placeholders (<N>), what run.sh
    makes (results folders and the record in each) and the logs that a command line writes (> log)."""
    words = span.split()
    written = {after for before, after in zip(words, words[1:]) if before == ">"}  # a log the command writes
    return [word for word in words if PATH.fullmatch(word) and word not in written
            and ("/" in word or word.endswith((".py", ".sh", ".json", ".md")))
            and "<" not in word and not word.startswith("results/") and word not in RECORD]


HELP_OF = {script: command for command in HELPS for script in command if SCRIPT.fullmatch(script)}


@pytest.fixture(scope="module")
def helps():
    """{script: what its --help prints}, each one run on its own; each must exit 0."""
    out = {}
    for script, command in HELP_OF.items():
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out[script] = proc.stdout
    return out


def options_named():
    """{script: the options that the README names for it}: an option belongs to the last of our scripts named
    before it in its span; with none named, to run.sh, the front door."""
    named = {script: set() for script in HELP_OF}
    for span in code_spans():
        for part in re.split(r"(?=\b(?:train_gpt\.py|run\.sh|report\.py|plan\.py)\b)", span):
            found = SCRIPT.match(part)
            named[found.group(1) if found else "run.sh"].update(OPTION.findall(part))
    return named


@pytest.mark.parametrize("script", sorted(HELP_OF))
def test_each_scripts_help_lists_every_option_the_readme_names_for_it(helps, script):
    assert sorted(options_named()[script] - set(OPTION.findall(helps[script]))) == []


def test_the_readme_names_options_of_run_sh_and_train_gpt_py():
    assert options_named()["run.sh"] and options_named()["train_gpt.py"]


def option_blocks(help_text):
    """An argparse help's options, each as its lines: the option's own and those its description wraps onto."""
    blocks = []
    for line in help_text.splitlines():
        if re.match(r"  -", line):
            blocks.append([line])
        elif blocks and re.match(r" {3,}\S", line):
            blocks[-1].append(line)
    return ["\n".join(block) for block in blocks]


def test_run_sh_help_passes_on_train_gpt_py_options_whole(helps):
    """Each of train_gpt.py's options that run.sh's help lists comes with all its lines, none cut off."""
    passed_on = helps["run.sh"].partition("they are:\n")[2]
    assert passed_on.startswith("  --")
    blocks = option_blocks(helps["train_gpt.py"].partition("options:\n")[2])
    ours = option_blocks(passed_on)
    assert ours and [b for b in ours if b not in blocks] == []
    assert "\n".join(ours) == passed_on.rstrip("\n")


def test_run_sh_help_lists_every_train_gpt_py_option_that_run_sh_does_not_set(helps):
    """run.sh sets the stage, the config and the engine itself, and checks every input: it refuses these."""
    listed = set(OPTION.findall(helps["run.sh"].partition("they are:\n")[2]))
    refused = []
    for option in sorted(set(OPTION.findall(helps["train_gpt.py"].partition("options:\n")[2])) - listed - {"--help"}):
        proc = subprocess.run(["bash", "run.sh", option], cwd=ROOT, capture_output=True, text=True, timeout=60)
        refused.append((option, proc.returncode))
    assert refused and [r for r in refused if r[1] != 2] == []


def test_run_sh_help_without_deepspeed_fails_with_one_line(tmp_path):
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text("raise ImportError('No module named deepspeed')\n")
    proc = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ["run.sh: error: python3 train_gpt.py --help failed: "
                                        "ImportError: No module named deepspeed"]


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


def multi_node_lines():
    """The README's block of other launchers, one command line each."""
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", README, flags=re.S) if "srun" in b]
    return block.splitlines()


def test_the_multi_node_block_writes_one_log_per_stage_per_launcher_and_reports_last():
    lines = multi_node_lines()
    runs = [(line.split()[0], re.search(r"--stage (\d)", line).group(1), line.split(" > ")[1])
            for line in lines if "train_gpt.py" in line]
    folders = {launcher for launcher, _, _ in runs}
    assert {(launcher, stage) for launcher, stage, _ in runs} == {(f, s) for f in folders for s in "03"}
    assert len({log for _, _, log in runs}) == len(runs), "a launcher's line overwrites another's log"
    assert all(log == f"{launcher}/stage{stage}.log" for launcher, stage, log in runs)
    assert lines[0] == "mkdir -p " + " ".join(sorted(folders, key=[r[0] for r in runs].index))
    [last] = [i for i, line in enumerate(lines) if "report.py" in line]
    assert last == len(lines) - 1 and re.findall(r"report\.py ([\w-]+)", lines[last]) == [r[0] for r in runs][::2]


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_each_launcher_of_the_block_wrote_a_log_that_report_py_reads(launcher):
    """tests/test_launchers_real.py's run of each launcher, committed: a log of its ranks' output, as the README's
    line writes it, holds a RESULT of each rank under that launcher, and report.py reads both ranks."""
    assert any(line.startswith(launcher + " ") for line in multi_node_lines())
    folder = ROOT / "benchmarks" / "logs" / "cpu" / "launchers" / f"stage3-{launcher}"
    results = [line for line in (folder / "stage3.log").read_text().splitlines() if line.startswith("RESULT {")]
    assert len(results) == 2 and all(f'"launcher": "{launcher}"' in line for line in results)
    proc = subprocess.run([sys.executable, "report.py", str(folder)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert re.search(r"^ranks +2$", proc.stdout, flags=re.M), proc.stdout + proc.stderr


def test_report_py_needs_no_package_beyond_the_standard_library_but_psutil_as_its_docstring_says():
    """Its imports, in a process of their own, against those of a bare interpreter (a .pth file may import some)."""
    third_party = ("import json, sys; print(json.dumps(sorted({n.split('.')[0] for n, m in list(sys.modules.items()) "
                   "if 'site-packages' in (getattr(m, '__file__', None) or '')})))")
    bare, imported = (subprocess.run([sys.executable, "-c", f"{before}{third_party}"], cwd=ROOT, capture_output=True,
                                     text=True, timeout=120).stdout for before in ("", "import report; "))
    assert set(json.loads(imported)) - set(json.loads(bare)) == {"psutil"}
    assert "the standard library and psutil" in " ".join((ROOT / "report.py").read_text().split())
