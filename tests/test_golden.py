"""The house work (issue 35) changes no behaviour: report.py says of every committed results folder what it said
before (tests/golden/reports/, one file per folder, written by tests/golden/reports.py), and no word of a verdict
moves (tests/golden/verdicts.txt) unless tests/golden/allowed.txt names the folder and the word."""
import difflib
import functools

from golden.reports import ALLOWED, VERDICTS, as_text, goldens, moves, read_lines, snapshot, words


@functools.cache
def reported_now():
    return {folder: as_text(*said) for folder, said in snapshot().items()}


def test_every_committed_results_folder_reports_as_it_did():
    before, now = goldens(), reported_now()
    assert sorted(now) == sorted(before)
    changed = [folder for folder in before if now[folder] != before[folder]]
    diff = [line for folder in changed[:3] for line in difflib.unified_diff(
        before[folder].splitlines(), now[folder].splitlines(), f"golden {folder}", f"now {folder}", lineterm="", n=1)]
    assert not changed, f"{len(changed)} folder(s) report otherwise:\n" + "\n".join(diff[:60])


def test_no_word_of_a_verdict_moves_unless_allowed_names_it():
    held = read_lines(VERDICTS)
    moved = [f"{folder}: {m}" for folder, text in reported_now().items()
             for m in moves(held.get(folder, []), words(text))]
    assert not moved, (f"words of the verdict moved; where meant, add these lines to {ALLOWED} in the same commit "
                       f"and run python3 tests/golden/reports.py:\n" + "\n".join(moved[:40]))


def test_each_word_that_allowed_names_is_the_one_verdicts_holds():
    held = read_lines(VERDICTS)
    stale = [f"{folder}: {w}" for folder, ws in read_lines(ALLOWED).items() for w in ws
             if (w[2:] in held.get(folder, []) if w.startswith("- ") else w not in held.get(folder, []))]
    assert not stale, f"{ALLOWED} names words that {VERDICTS} does not hold: {stale}"
