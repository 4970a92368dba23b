"""tests/machine_state.sh, the check that .ci/run runs around the README's test command, fails where a test left
the machine changed, and names the change: a daemon left listening, a file written in ~/.ssh; where it lacks a
tool to record with, it refuses rather than passes. Its two records are of the whole machine, where the suite's
other launches listen and end meanwhile: each test asks for its planted change among the differences, not for it
alone."""
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT, free_port

CHECK = ROOT / "tests" / "machine_state.sh"


@pytest.fixture
def home(tmp_path):
    """An empty home folder, as ~ for the check and for what a test plants."""
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def check(home, *before):
    """machine_state.sh with HOME home: its record, or with before, its comparison against it."""
    return subprocess.run(["bash", str(CHECK), *map(str, before)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(home)})


def recorded(home, tmp_path):
    before = tmp_path / "before.txt"
    before.write_text(check(home).stdout)
    return before


def listening(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def test_a_daemon_left_listening_fails_the_check_named_with_its_port_and_process(home, tmp_path):
    before = recorded(home, tmp_path)
    port = free_port()
    # a fixture that starts a server in the background and never stops it: its shell ends at once, and the
    # server, orphaned, becomes PID 1's child, as a daemon is
    serve = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); time.sleep(120)"
    started = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{serve}" > /dev/null 2>&1 & echo $!'],
                             capture_output=True, text=True, timeout=60)
    daemon = psutil.Process(int(started.stdout))
    try:
        assert listening(port)
        proc = check(home, before)
    finally:
        daemon.kill()
    changed = [line for line in proc.stdout.splitlines() if line.startswith("+")]
    assert proc.returncode == 1, proc.stdout
    assert any(line.startswith(f"+tcp 127.0.0.1:{port} python") for line in changed), proc.stdout
    assert any(line.startswith(f"+{daemon.pid} ") for line in changed), proc.stdout


def test_a_file_written_in_ssh_fails_the_check_named_with_its_path(home, tmp_path):
    before = recorded(home, tmp_path)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA planted\n")
    proc = check(home, before)
    assert proc.returncode == 1, proc.stdout
    assert any(line.startswith(f"+{home}/.ssh/authorized_keys ") for line in proc.stdout.splitlines()), proc.stdout
    assert proc.stdout.splitlines()[-1] == "machine state: changed (the lines above: - before, + after)"


def test_without_a_tool_it_records_with_the_check_refuses_rather_than_passes(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("find", "diff"):
        (tools / tool).symlink_to(shutil.which(tool))
    (tools / "python3").write_text("#!/bin/sh\nexit 1\n")  # a Python without psutil, which imports nothing
    (tools / "python3").chmod(0o755)
    proc = subprocess.run(["/bin/bash", str(CHECK)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(tools)})
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "machine state: cannot record: no psutil\n")


def test_it_records_the_sockets_and_daemons_without_ss_or_ps(home, tmp_path):
    """As on a slim GPU image (iproute2 and procps missing): psutil, which DeepSpeed needs, records them."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("find", "diff", "sort", "dpkg-query"):
        if shutil.which(tool):
            (tools / tool).symlink_to(shutil.which(tool))
    # called by its own path, not linked: a link elsewhere to a virtual environment's python3 (the GPU image's) starts
    # it without the environment, and so without psutil
    (tools / "python3").write_text(f'#!/bin/sh\nexec {shutil.which("python3")} "$@"\n')
    (tools / "python3").chmod(0o755)
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        proc = subprocess.run(["/bin/bash", str(CHECK)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PATH": str(tools), "HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith(f"tcp 127.0.0.1:{port} python") for line in proc.stdout.splitlines()), proc.stdout
