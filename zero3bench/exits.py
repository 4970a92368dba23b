"""The exit statuses, one meaning each, in train_gpt.py, report.py, plan.py and run.sh alike (README, "Exit
status"); a signal ends any of them with 128 plus its number, as a shell does."""
EXIT = {"done": 0, "PASS": 0, "failed": 1, "FAIL": 1, "bad input": 2, "out of memory": 3, "diverged": 4,
        "NOT OBSERVABLE": 5, "not written": 6}
SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGTERM": 15}
