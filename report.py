"""
Reads the RESULT lines that train_gpt.py leaves in a run's logs, compares the ZeRO stages, and gives the
verdict; the work is in zero3bench/reporting/ (reading, verdict, tables, artifacts, compare), this is its command line:

    python report.py results/<timestamp>           # table, verdict
    python report.py --write results/<timestamp>   # and writes summary.json, summary.md, memory.png there (and
                                                   # timeline.png, where a run traced a step: --timeline)
    python report.py --compare results/A results/B [--tolerance 5]   # what moved; exit 1 on a regression

The verdict exits 0 on PASS, 1 on FAIL, 5 when it is not observable (one rank), 2 on bad input, 6 when a
file of the report cannot be written (one line says which). It needs the standard library and psutil, which
DeepSpeed installs (zero3bench/launchers.py reads a launcher's command line with it), not torch; matplotlib, if
installed, draws the plot.
"""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

from zero3bench.exits import EXIT, SIGNALS

from zero3bench.formatting import quiet_when_closed
from zero3bench.reporting import artifacts, compare, reading, tables, timelines, verdict


def parse_args(argv):
    p = argparse.ArgumentParser(description="Compare the ZeRO stages of a run, or compare two runs.")
    p.add_argument("folder", nargs="?", type=Path, help="a results folder of run.sh")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two results folders, A before B")
    p.add_argument("--tolerance", type=float, default=5.0, help="percent a figure may worsen in --compare (default 5)")
    p.add_argument("--write", action="store_true", help="write summary.json, summary.md, memory.png and, where a run "
                   "traced a step (--timeline), timeline.png into the folder (run.sh does, into its own); without it, "
                   "reading a folder changes nothing")
    return p.parse_args(argv)


def report(folder, write):
    """The table, the lines, the verdict and, with write, the folder's summary files; returns the exit status."""
    runs = reading.load_runs(folder)
    print(tables.comparison_table(runs))
    if any(r.rehearsal for rs in runs.values() for r in rs):
        print("\nREHEARSAL: several ranks shared each GPU over gloo; per-rank memory is real, speed is not.")
    checks, overall = verdict.verdict(runs)
    deaths = [f"{name}: {dead}" for name, rs in runs.items() if (dead := reading.dead_rank(folder / f"{name}.log", rs))]
    stopped_by = verdict.interruption(runs, deaths)
    print("", *tables.offload_lines(runs), *tables.compile_lines(runs), *tables.peer_lines(runs),
          *timelines.lines(runs), *deaths, *verdict.verdict_lines(checks), sep="\n")
    if stopped_by:
        overall = "INTERRUPTED"
        print(f"\nVERDICT: INTERRUPTED by {stopped_by}: " + "; ".join(verdict.progress_lines(runs)))
    else:
        print(f"\nVERDICT: {overall}")
    for line in reading.cause_lines(folder, runs):  # under the verdict, why each failed run stopped
        print(line)
    written = artifacts.write(folder, runs, checks, overall, time.time()) if write else []
    print(artifacts.results_line(folder, written))
    return 128 + SIGNALS.get(stopped_by, SIGNALS["SIGTERM"]) if stopped_by else EXIT[overall]


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.write and os.environ.get("RUN_COMMAND") and args.folder and args.folder.is_dir():  # run.sh's report.txt
            return artifacts.kept_in(args.folder / "report.txt", lambda: command(args))
        return command(args)
    except artifacts.NotWritten as e:  # a full disk: the files written stand whole, the others are not there
        print(f"report.py: error: {e}", file=sys.stderr)
        return EXIT["not written"]


def command(args):
    """What the command line asks: a folder's report, or the comparison of two."""
    if args.folder and os.environ.get("RUN_SIGNAL") and not any(args.folder.glob("*.log")):
        name = signal.Signals(int(os.environ["RUN_SIGNAL"])).name
        print(f"VERDICT: INTERRUPTED by {name}: no run started\nresults: {args.folder}")
        return 128 + int(os.environ["RUN_SIGNAL"])
    if not (args.compare or args.folder):
        print("report.py: error: give a results folder (results/<timestamp>), or --compare A B", file=sys.stderr)
        return EXIT["bad input"]
    for folder in args.compare or [args.folder]:
        if not folder.is_dir() or not any(folder.glob("*.log")):
            print(f"report.py: error: {folder} is not a results folder with logs", file=sys.stderr)
            return EXIT["bad input"]
    if args.compare:
        return compare.compare(*args.compare, args.tolerance)
    return report(args.folder, args.write)


if __name__ == "__main__":
    quiet_when_closed()
    sys.exit(main())
