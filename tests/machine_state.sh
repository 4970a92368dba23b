#!/usr/bin/env bash
# What of this machine the README's test command must leave as it found it, for .ci/run to compare before and
# after: the listening sockets and their processes; the processes of no test (PID 1's children: daemons, and
# orphans a test left; not zombies, which have ended and which only PID 1 can clear); the installed packages,
# Debian's and pip's; ~/.ssh, each file with its size and time; the names under /etc, /var/lib and /dev/shm; and
# the folders of tests/launchers/start.sh left in the temp folder. Usage: `machine_state.sh > BEFORE`, then
# `machine_state.sh BEFORE`: exit status 0 where nothing differs; else 1, with the difference (diff -u) on stdout;
# 2 where a tool it records with is missing.
set -uo pipefail
for tool in python3 find diff; do  # without one, a section would be empty both times, and pass on any change
  command -v "$tool" > /dev/null || { echo "machine state: cannot record: no $tool" >&2; exit 2; }
done
# The sockets and the processes through psutil, DeepSpeed's own dependency: slim GPU images lack ss (iproute2),
# some ps (procps)
python3 -c "import psutil" 2> /dev/null || { echo "machine state: cannot record: no psutil" >&2; exit 2; }
python3 -c "import psutil; psutil.net_connections('inet')" 2> /dev/null ||
  { echo "machine state: cannot record: psutil may not list this machine's sockets" >&2; exit 2; }

sockets_and_daemons() {
  python3 - <<'PY'
import psutil, socket

def name(pid):
    try:
        return psutil.Process(pid).name() if pid else ""
    except psutil.Error:
        return ""

def address(a):
    return f"[{a.ip}]:{a.port}" if ":" in a.ip else f"{a.ip}:{a.port}"

print("## listening sockets: protocol, address, process")
listening = {f"{'tcp' if c.type == socket.SOCK_STREAM else 'udp'} {address(c.laddr)} {name(c.pid)}".rstrip()
             for c in psutil.net_connections("inet")
             if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr)}
print("\n".join(sorted(listening)))
print("## processes of no test: pid, user, command")
for p in sorted(psutil.process_iter(["pid", "ppid", "status", "username", "name"]), key=lambda p: p.pid):
    if p.info["ppid"] == 1 and p.info["status"] != psutil.STATUS_ZOMBIE:
        print(p.info["pid"], p.info["username"], p.info["name"])
PY
}

record() {
  sockets_and_daemons
  echo "## Debian packages"
  dpkg-query -W -f '${Package} ${Version}\n' 2> /dev/null | sort
  echo "## pip packages"
  python3 -m pip freeze --all 2> /dev/null | sort
  echo "## ~/.ssh: path, bytes, time, mode"
  find ~/.ssh -printf '%p %s %T@ %m\n' 2> /dev/null | sort
  echo "## /etc, /var/lib, /dev/shm"
  find /etc /var/lib /dev/shm -xdev 2> /dev/null | sort
  echo "## the launchers' engines' folders"
  find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'zero3-launchers-*' 2> /dev/null | sort
}

[ $# -eq 0 ] && { record; exit; }
if record | diff -u --label before --label after "$1" -; then
  echo "machine state: unchanged"
else
  echo "machine state: changed (the lines above: - before, + after)"
  exit 1
fi
