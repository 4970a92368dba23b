#!/usr/bin/env bash
# Starts, on this one machine, the engines behind the launchers that the README names, so that
# tests/test_launchers.py launches through them for real: munge and a one-node Slurm (slurmctld, and a slurmd
# with two CPUs that reads its config from slurmctld), sshd with a key for this user that reaches the node
# names localhost and 127.0.0.2 (for pdsh and the deepspeed launcher), and Open MPI's mpirun. Idempotent:
# what runs already is kept. Installs Debian's packages where they are missing. Needs root. Exit status 0
# when every engine answers; else 3, with one line on stderr that says why.
set -uo pipefail
STATE=/var/lib/zero3-launchers  # the Slurm config and state this script writes, apart from the system's
NODES=(localhost 127.0.0.2)
PACKAGES=(slurm-wlm munge openmpi-bin pdsh openssh-server openssh-client)
cannot() { echo "launchers: cannot start: $*" >&2; exit 3; }

export PATH=$PATH:/usr/sbin:/sbin  # the daemons' folder, which a user's PATH may lack
[ "$(id -u)" = 0 ] || cannot "not root (uid $(id -u)): the Slurm daemons, munged and sshd need root"
missing() {
  for c in munged slurmctld slurmd srun sbatch salloc mpirun pdsh sshd ssh; do command -v "$c" > /dev/null || return 0; done
  return 1
}
if missing; then
  command -v apt-get > /dev/null || cannot "no apt-get to install ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${PACKAGES[@]}" > /dev/null 2>&1 ||
    { apt-get update -qq > /dev/null 2>&1 && apt-get install -y -qq "${PACKAGES[@]}" > /dev/null 2>&1; } ||
    cannot "apt-get could not install ${PACKAGES[*]}"
fi

# munge: Slurm's authentication between its commands and its daemons
if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || mungekey --create > /dev/null 2>&1 || cannot "mungekey could not make a key"
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge && install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  runuser -u munge -- munged || cannot "munged did not start"
  munge -n | unmunge > /dev/null 2>&1 || cannot "munged does not answer"
fi

# Slurm: one node, this host, two CPUs; slurmd and the commands read the config from slurmctld (configless)
node=$(hostname -s)
mkdir -p "$STATE/ctld" "$STATE/d" /run/slurm
cat > "$STATE/slurm.conf.new" << EOF
ClusterName=zero3
SlurmctldHost=$node(127.0.0.1)
SlurmctldParameters=enable_configless
AuthType=auth/munge
SlurmUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
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
if cmp -s "$STATE/slurm.conf.new" "$STATE/slurm.conf"; then
  rm "$STATE/slurm.conf.new"
else
  mv "$STATE/slurm.conf.new" "$STATE/slurm.conf"
  scontrol reconfigure > /dev/null 2>&1 || true  # a slurmctld that runs already reads the new one
fi
if ! scontrol ping 2> /dev/null | grep -q UP; then
  slurmctld -f "$STATE/slurm.conf" || cannot "slurmctld did not start (see $STATE/slurmctld.log)"
  for _ in {1..50}; do scontrol ping 2> /dev/null | grep -q UP && break; sleep 0.2; done
fi
if ! pgrep -F "$STATE/slurmd.pid" slurmd > /dev/null 2>&1; then
  slurmd --conf-server 127.0.0.1 || cannot "slurmd did not start (see $STATE/slurmd.log)"
fi
for _ in {1..50}; do sinfo -h -N -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)' && break; sleep 0.2; done
sinfo -h -N -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)' ||
  cannot "the Slurm node $node is not up: $(sinfo -h -N -o '%t %E' 2>&1 | head -1)"

# sshd, and this user's key for both node names, their host keys accepted
install -d -m 700 ~/.ssh /run/sshd
[ -s ~/.ssh/id_zero3_launchers ] || ssh-keygen -q -t ed25519 -N "" -f ~/.ssh/id_zero3_launchers -C zero3-launchers
grep -qxF "$(cat ~/.ssh/id_zero3_launchers.pub)" ~/.ssh/authorized_keys 2> /dev/null ||
  cat ~/.ssh/id_zero3_launchers.pub >> ~/.ssh/authorized_keys
chmod 600 ~/.ssh/authorized_keys
grep -q "zero3-launchers" ~/.ssh/config 2> /dev/null || cat >> ~/.ssh/config << EOF
# zero3-launchers (tests/launchers/start.sh): this machine under the node names of the launch tests
Host ${NODES[*]}
  IdentityFile ~/.ssh/id_zero3_launchers
  BatchMode yes
EOF
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -A > /dev/null
if ! pgrep -x sshd > /dev/null; then
  /usr/sbin/sshd || cannot "sshd did not start"
fi
for name in "${NODES[@]}"; do
  ssh-keygen -F "$name" > /dev/null 2>&1 || ssh-keyscan -t ed25519 "$name" 2> /dev/null >> ~/.ssh/known_hosts
  ssh "$name" true 2> /dev/null || cannot "ssh $name does not log in with ~/.ssh/id_zero3_launchers"
done
PDSH_RCMD_TYPE=ssh pdsh -S -w "$(IFS=,; echo "${NODES[*]}")" true 2> /dev/null || cannot "pdsh over ssh fails"
echo "launchers: up: slurm ($node, 2 CPUs), munge, sshd (${NODES[*]}), pdsh, $(mpirun --version | head -1)"
