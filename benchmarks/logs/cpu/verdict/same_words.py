"""Today's verdict words (tests/golden/reports.json, what report.py says of every committed folder) against the
committed report.txt of each folder that has one, criterion by criterion: python3 benchmarks/logs/cpu/verdict/same_words.py"""
import json
import re
from pathlib import Path

golden = json.loads(Path("tests/golden/reports.json").read_text())
words = lambda text: re.findall(r"^ +(PASS|FAIL|NOT OBSERVABLE) +(\([a-e]\)(?: to \([a-e]\))?)", text, flags=re.M)
with_report = [k for k in golden if (Path(k) / "report.txt").exists()]
differ = [k for k in with_report if words((Path(k) / "report.txt").read_text()) != words(golden[k][1])]
print(f"{len(golden)} folders; {len(with_report)} with a report.txt; {len(with_report) - len(differ)} give the same "
      f"verdict words, criterion by criterion; {len(differ)} differ:")
for k in differ:
    then, now = dict((c, w) for w, c in words((Path(k) / "report.txt").read_text())), dict((c, w) for w, c in words(golden[k][1]))
    print(f"  {k}: " + "; ".join(f"{c} {then.get(c, '-')} -> {now.get(c, '-')}" for c in sorted(set(then) | set(now))
                                   if then.get(c) != now.get(c)))
