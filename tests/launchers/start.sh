#!/usr/bin/env bash
# Starts, on this one machine and for one test session, the engines behind the launchers that the README names,
# so that tests/test_launchers_real.py launches through them for real: munge, a one-node Slurm (slurmctld, and a
# slurmd of two CPUs), sshd for the node names localhost and 127.0.0.2 (for pdsh and the deepspeed launcher),
# and Open MPI's mpirun. Contained: each daemon listens on a free port of 127.0.0.1 (sshd of 127.0.0.2 too) and
# no other address, and keeps its config, keys, logs and state in the folder FOLDER (else a new one in the temp
# folder): its own munge key and socket, slurm.conf, sshd_config, host key and authorized key. It writes nothing
# under ~/.ssh, /etc or /var/lib; it creates /run/sshd, the empty folder that sshd requires, where it is missing.
# FOLDER/env holds the variables that reach them (SLURM_CONF, and PATH led by an ssh that reads FOLDER's ssh
# config, which pdsh and the deepspeed launcher call): `source FOLDER/env`. Stop them, and remove the folder,
# with `bash tests/launchers/stop.sh FOLDER`. Installs Debian's packages where missing (install.sh). Needs root.
# Usage: start.sh [FOLDER]. Exit status 0 when every engine answers; else 3, with what it started stopped again
# and one line on stderr that says why.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NODES=(localhost 127.0.0.2)
cannot() { echo "launchers: cannot start: $*" >&2; [ -z "${owned:-}" ] || bash "$HERE/stop.sh" "$owned"; exit 3; }

export PATH=$PATH:/usr/sbin:/sbin  # the daemons' folder, which a user's PATH may lack
[ "$(id -u)" = 0 ] || cannot "not root (uid $(id -u)): the Slurm daemons, munged and sshd need root"
why=$(bash "$HERE/install.sh" 2>&1) || cannot "${why#launchers: cannot install: }"
STATE=${1:-$(mktemp -d "${TMPDIR:-/tmp}/zero3-launchers-XXXXXX")}
STATE=$(cd "$STATE" && pwd) || cannot "no folder $1"
mkdir "$STATE/munge" "$STATE/slurm" && mkdir -m 700 "$STATE/ssh" "$STATE/bin" ||
  cannot "cannot make its folders in $STATE (not empty?)"
# whose session this is (its process and that one's start time): stop.sh without a folder stops the engines of a
# session that has ended, and stops no folder without it
echo "$PPID $(sed 's/.*) //' "/proc/$PPID/stat" | cut -d' ' -f20)" > "$STATE/owner" && owned=$STATE
read -r CTLD_PORT SLURMD_PORT SSHD_PORT < <(python3 -c '
import socket
held = [socket.socket() for _ in range(3)]
for s in held:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in held))') || cannot "python3 found no free port"

# munge: Slurm's authentication between its commands and its daemons, with a key of its own; forced, as a temp
# folder that only its owner may enter (pytest's) would fail munged's check that every user can reach its
# socket: root's daemons and commands alone use it
mungekey --create --keyfile="$STATE/munge/munge.key" > /dev/null 2>&1 || cannot "mungekey could not make a key"
munged --force --socket="$STATE/munge/socket" --key-file="$STATE/munge/munge.key" \
  --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/seed" ||
  cannot "munged did not start (see $STATE/munge/munged.log)"
munge -S "$STATE/munge/socket" -n | unmunge -S "$STATE/munge/socket" > /dev/null 2>&1 || cannot "munged does not answer"

# Slurm 22.05 binds its daemons to the address that their host's name resolves to (NoCtldInAddrAny, NoInAddrAny;
# else to every address): they run under the name localhost, in a UTS namespace of their own, where root may
# make one; else under this host's name, where that name resolves to a loopback address
if unshare --uts true 2> /dev/null; then
  node=localhost
  as_node() { unshare --uts sh -c 'hostname localhost && exec "$0" "$@"' "$@"; }
else
  node=$(hostname -s)
  getent ahostsv4 "$node" | awk '{print $1; exit}' | grep -q '^127\.' ||
    cannot "no UTS namespace (unshare --uts), and $node resolves to no loopback address: Slurm would listen beyond it"
  as_node() { "$@"; }
fi
export SLURM_CONF=$STATE/slurm/slurm.conf
# train_gpt.py derives a job's master port from its id, so that every task agrees on it unasked: each session's
# job ids start apart, lest two sessions' jobs meet on one port
first_job=$(( (RANDOM << 15 | RANDOM) % 60000000 + 1 ))
mkdir "$STATE/slurm/ctld" "$STATE/slurm/d"
cat > "$SLURM_CONF" << EOF
ClusterName=zero3
FirstJobId=$first_job
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/socket
SlurmUser=root
StateSaveLocation=$STATE/slurm/ctld
SlurmdSpoolDir=$STATE/slurm/d
SlurmctldPidFile=$STATE/slurm/slurmctld.pid
SlurmdPidFile=$STATE/slurm/slurmd.pid
SlurmctldLogFile=$STATE/slurm/slurmctld.log
SlurmdLogFile=$STATE/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
as_node slurmctld -f "$SLURM_CONF" || cannot "slurmctld did not start (see $STATE/slurm/slurmctld.log)"
for _ in {1..100}; do scontrol ping 2> /dev/null | grep -q UP && break; sleep 0.2; done
as_node slurmd -f "$SLURM_CONF" || cannot "slurmd did not start (see $STATE/slurm/slurmd.log)"
for _ in {1..100}; do sinfo -h -N -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)' && break; sleep 0.2; done
sinfo -h -N -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)' ||
  cannot "the Slurm node $node is not up: $(sinfo -h -N -o '%t %E' 2>&1 | head -1)"

# sshd of its own, for both node names, and an ssh that reads this folder's config alone
ssh=$STATE/ssh
ssh-keygen -q -t ed25519 -N "" -f "$ssh/host_key" -C zero3-launchers-host &&
  ssh-keygen -q -t ed25519 -N "" -f "$ssh/id" -C zero3-launchers && cp "$ssh/id.pub" "$ssh/authorized_keys" ||
  cannot "ssh-keygen could not make the keys"
cat > "$ssh/sshd_config" << EOF
Port $SSHD_PORT
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey $ssh/host_key
AuthorizedKeysFile $ssh/authorized_keys
PidFile $ssh/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
PrintLastLog no
# the key's folder lies in the temp folder, which everyone may write
StrictModes no
EOF
for name in "${NODES[@]}"; do echo "[$name]:$SSHD_PORT $(cat "$ssh/host_key.pub")"; done > "$ssh/known_hosts"
cat > "$ssh/ssh_config" << EOF
Host ${NODES[*]}
  Port $SSHD_PORT
  IdentityFile $ssh/id
  IdentitiesOnly yes
  UserKnownHostsFile $ssh/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
EOF
printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$ssh/ssh_config" > "$STATE/bin/ssh"
chmod 755 "$STATE/bin/ssh"
[ -d /run/sshd ] || install -d -m 755 /run/sshd
"$(command -v sshd)" -f "$ssh/sshd_config" -E "$ssh/sshd.log" || cannot "sshd did not start (see $ssh/sshd.log)"
cat > "$STATE/env" << EOF
export SLURM_CONF=$SLURM_CONF
export PATH=$STATE/bin:\$PATH
export PDSH_RCMD_TYPE=ssh
EOF
source "$STATE/env"
for name in "${NODES[@]}"; do
  ssh "$name" true 2> /dev/null || cannot "ssh $name does not log in to the sshd on port $SSHD_PORT (see $ssh/sshd.log)"
done
pdsh -S -w "$(IFS=,; echo "${NODES[*]}")" true 2> /dev/null || cannot "pdsh over ssh fails"
echo "launchers: up in $STATE: slurm (node $node, 2 CPUs; slurmctld on 127.0.0.1:$CTLD_PORT, slurmd on" \
  "127.0.0.1:$SLURMD_PORT), munge, sshd (127.0.0.1 and 127.0.0.2:$SSHD_PORT: ${NODES[*]}), pdsh," \
  "$(mpirun --version | head -1)"
echo "launchers: use them: source $STATE/env; stop them: bash $HERE/stop.sh $STATE"
