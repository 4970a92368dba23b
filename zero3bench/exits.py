"""The exit statuses, one meaning each, in train_gpt.py, report.py, plan.py and run.sh alike (README, "Exit
status"); a signal ends any of them with 128 plus its number, as a shell does."""
EXIT = {"done": 0, "PASS": 0, "failed": 1, "FAIL": 1, "bad input": 2, "out of memory": 3, "diverged": 4,
        "NOT OBSERVABLE": 5, "not written": 6}
SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGTERM": 15}


def rank_status(oom: bool, error: str | None, interrupted_by: str | None, diverged: bool) -> int:
    """A rank's exit status: 128 plus the signal that interrupted it, else as EXIT says."""
    if oom or error and not error.startswith("Interrupted"):  # a failure, though a signal came after it
        return EXIT["out of memory" if oom else "failed"]
    if interrupted_by:
        return 128 + SIGNALS.get(interrupted_by, SIGNALS["SIGTERM"])
    return EXIT["diverged"] if diverged else EXIT["done"]
