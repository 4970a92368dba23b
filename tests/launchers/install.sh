#!/usr/bin/env bash
# Installs the Debian packages behind the real launchers (tests/launchers/start.sh), those that are missing;
# installs nothing where every command is there. The one change that asking for the real launchers
# (ZERO3BENCH_LAUNCHERS=1) leaves on the machine: Debian's packages would start their services as they install
# (sshd on port 22 of every address, munged, slurmctld, slurmd), which a policy-rc.d that refuses them prevents
# for the length of the install; on a machine with systemd, Debian still enables them from the next boot. Needs
# root and apt-get. Exit status 0 when every command is there; else 3, with one line on stderr that says why.
set -uo pipefail
PACKAGES=(slurm-wlm munge openmpi-bin pdsh openssh-server openssh-client)
COMMANDS=(munged mungekey slurmctld slurmd srun sbatch salloc scontrol sinfo mpirun pdsh sshd ssh ssh-keygen)
cannot() { echo "launchers: cannot install: $*" >&2; exit 3; }

export PATH=$PATH:/usr/sbin:/sbin  # the daemons' folder, which a user's PATH may lack
missing() {
  for c in "${COMMANDS[@]}"; do command -v "$c" > /dev/null || return 0; done
  return 1
}
missing || exit 0
[ "$(id -u)" = 0 ] || cannot "not root (uid $(id -u)): apt-get needs root to install ${PACKAGES[*]}"
command -v apt-get > /dev/null || cannot "no apt-get to install ${PACKAGES[*]}"
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "${PACKAGES[@]}" > /dev/null 2>&1 ||
  { apt-get update -qq > /dev/null 2>&1 && apt-get install -y -qq "${PACKAGES[@]}" > /dev/null 2>&1; } ||
  cannot "apt-get could not install ${PACKAGES[*]}"
