"""The pages are whole: no table split by a paragraph, no sentence cut off, no paragraph that begins in the
middle of a sentence. Edits that move text about leave these three marks; a page is read as Markdown's blocks."""
import re
from dataclasses import dataclass

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md",
         *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "layout.md")]  # layout.md: the lead's
BULLET = re.compile(r"\s*[-*+] ")
ORDERED = re.compile(r"\d+[.)] ")  # begins a list after a blank line only; within a paragraph it is a wrapped line
TABLE_RULE = re.compile(r"\s*\|(\s*:?-+:?\s*\|)+\s*$")
# a sentence ends on . : ! ? or a bracket, before any closing marks; a bullet of a series may end on ; or ,
ENDED = re.compile(r"[.:!?)][*_`\])]*$")
ENDED_ITEM = re.compile(r"[.:!?);,][*_`\])]*$")


@dataclass(frozen=True)
class Block:
    kind: str  # code, table, heading, bullet, paragraph
    line: int  # where it starts, from 1
    text: str


def blocks(page: str) -> list[Block]:
    """The page's blocks, in order. A fenced or 4-space-indented block is code; a bullet runs on over its wrapped
    lines until a blank line, another bullet, a table, a fence or a heading."""
    lines, out, i = page.splitlines(), [], 0
    starts = lambda line: BULLET.match(line) or line.lstrip().startswith(("|", "```")) or re.match(r"#+ ", line)
    while i < len(lines):
        line, start = lines[i], i
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            i += 1
            out.append(Block("code", start + 1, "\n".join(lines[start:i])))
        elif line.startswith("    ") and (not out or not lines[i - 1].strip()) and not BULLET.match(line):
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            out.append(Block("code", start + 1, "\n".join(lines[start:i])))
        elif line.lstrip().startswith("|"):
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                i += 1
            out.append(Block("table", start + 1, "\n".join(lines[start:i])))
        elif re.match(r"#+ ", line):
            i += 1
            out.append(Block("heading", start + 1, line))
        else:
            kind = "bullet" if BULLET.match(line) or ORDERED.match(line) else "paragraph"
            i += 1
            while i < len(lines) and lines[i].strip() and not starts(lines[i]):
                i += 1
            out.append(Block(kind, start + 1, " ".join(part.strip() for part in lines[start:i])))
    return out


def split_tables(page: str) -> list[int]:
    """Where a table goes on without its header: the rows that follow a paragraph set into a table."""
    return [b.line for b in blocks(page) if b.kind == "table"
            and not (len(b.text.splitlines()) >= 2 and TABLE_RULE.match(b.text.splitlines()[1]))]


def cut_sentences(page: str) -> list[int]:
    """Where a paragraph or bullet stops mid-sentence, or a paragraph begins mid-sentence. Text may run on
    through a code block (a formula, a command), so what stands on either side of one is left alone."""
    found, bs = [], blocks(page)
    for before, b, after in zip([None, *bs], bs, [*bs[1:], None]):
        if b.kind not in ("paragraph", "bullet"):
            continue
        body = re.sub(r"^\s*([-*+]|\d+[.)]) ", "", b.text)
        if not (after and after.kind == "code") and not (ENDED_ITEM if b.kind == "bullet" else ENDED).search(body):
            found.append(b.line)
        if b.kind == "paragraph" and re.match(r"[a-z]", body) and not re.match(r"[\w.]+\.(py|sh|json|md)\b", body) \
                and not (before and before.kind == "code"):
            found.append(b.line)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_table_is_split_by_a_paragraph(page):
    assert split_tables(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_sentence_is_cut_off(page):
    assert cut_sentences(page.read_text()) == []


GOOD = """| a | b |
|---|---|
| 1 | 2 |

A paragraph that ends.

- a bullet that wraps onto
  2. another line, and ends;
- its last one.
"""


def test_the_checks_catch_a_split_table_and_a_cut_sentence():
    """Planted: a paragraph set into a table, a bullet cut off before its end, a paragraph begun mid-sentence."""
    assert split_tables(GOOD) == [] and cut_sentences(GOOD) == []
    assert split_tables(GOOD.replace("| 1 | 2 |", "| 1 | 2 |\n\nA note.\n\n| 3 | 4 |")) == [7]
    assert cut_sentences(GOOD.replace("its last one.", "its last")) == [9]
    assert cut_sentences(GOOD.replace("A paragraph that ends.", "of a paragraph.")) == [5]


DOCS = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "layout.md")
# a figure with a unit, as a run measures one
MEASURED = re.compile(r"(?<![\w.])[-+−]?\d+(?:[.,]\d+)*\s?(GiB|MiB|GB|MB|s|ms|%|x|GB/s|TFLOP/s|tokens/s)(?!\w)")
CITES = re.compile(r"benchmarks/logs|BENCHMARKS\.md|`(h200|h200x2|cpu)/")  # a log, or BENCHMARKS.md's, with theirs
NO_RUN = {  # sections whose figures with units are settings and thresholds, not measurements
    ("measurement.md", "## The table, row by row"): "a bucket's size, sizes swept, NVLink's rating, the 10% bars",
    ("result-keys.md", "## The run"): "the link curve's message sizes",
    ("result-keys.md", "## How it ended"): "the divergence threshold",
    ("result-keys.md", "## Partitioning"): "the 10% bar",
    ("result-keys.md", "## Memory"): "the 10% bar",
    ("running.md", "## The record of a run, and comparing two runs"): "the interval of the progress lines",
}


def uncited_sections(page: str, name: str) -> list[str]:
    """The headings of the sections that hold a measured figure and name no log."""
    sections = re.split(r"(?m)^(?=#+ )", re.sub(r"```.*?```", "", page, flags=re.S))
    return [s.splitlines()[0] for s in sections if s.strip() and MEASURED.search(s) and not CITES.search(s)
            and (name, s.splitlines()[0]) not in NO_RUN]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_section_of_the_docs_with_a_measured_figure_names_its_log(page):
    assert uncited_sections(page.read_text(), page.name) == []


def test_a_section_with_a_figure_and_no_log_is_caught():
    assert uncited_sections("## A\n\nIt peaked at 6.14 GiB.\n", "x.md") == ["## A"]
    assert uncited_sections("## A\n\nIt peaked at 6.14 GiB ([log](benchmarks/logs/h200/x)).\n", "x.md") == []
