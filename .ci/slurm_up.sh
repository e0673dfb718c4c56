#!/usr/bin/env bash
# A single-node SLURM cluster in one folder, for tests: munged, slurmctld and slurmd of Debian's
# slurm-wlm and munge (installed with apt when missing), run as root, every file (configuration, key,
# sockets, state, logs, pid files) under DIR, on free ports, so that nothing in /etc is touched.
#
#   bash .ci/slurm_up.sh DIR      # prints SLURM_CONF=DIR/slurm.conf once the node is idle
#   SLURM_CONF=DIR/slurm.conf sbatch --wrap hostname
#   bash .ci/slurm_down.sh DIR    # stops the three daemons by their pid files
#
# Needs root (slurmd starts jobs as their user; munged and the daemons run as root here). Exits
# non-zero with one line saying why when it cannot start the cluster.
set -euo pipefail

DIR=${1:?usage: slurm_up.sh DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

fail() { echo "slurm_up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (slurmd and munged run as root; this is uid $(id -u))"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || fail "slurm-wlm and munge are not installed and there is no apt-get to install them"
    echo "slurm_up: installing slurm-wlm and munge with apt-get" >&2
    (apt-get install -y -q slurm-wlm munge >"$DIR/apt.log" 2>&1 ||
        { apt-get update -q >>"$DIR/apt.log" 2>&1 && apt-get install -y -q slurm-wlm munge >>"$DIR/apt.log" 2>&1; }) ||
        fail "apt-get install slurm-wlm munge failed (see $DIR/apt.log: $(tail -1 "$DIR/apt.log"))"
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1024 / 2 ))  # half of what is free now
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"

# munge: its own key (1024 random bytes, owner root, mode 400) and socket
head -c 1024 /dev/urandom >"$DIR/munge.key"
chmod 400 "$DIR/munge.key"
munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge.sock" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munged.seed" || fail "munged did not start (see $DIR/log/munged.log)"

cat >"$DIR/slurm.conf" <<EOF
ClusterName=archlab-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
JobRequeue=1
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$DIR/slurm.conf"
slurmctld || fail "slurmctld did not start (see $DIR/log/slurmctld.log)"
slurmd || fail "slurmd did not start (see $DIR/log/slurmd.log)"

for _ in $(seq 60); do
    state=$(sinfo -h -N -o %T 2>/dev/null || true)
    [ "$state" = idle ] && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.5
done
fail "the node is not idle after 30 s (sinfo says '${state:-nothing}'; see $DIR/log/slurmctld.log and slurmd.log)"
