#!/usr/bin/env bash
# Stop the cluster .ci/slurm_up.sh started in DIR: slurmd, slurmctld, then munged, each by its pid file.
set -uo pipefail
DIR=${1:?usage: slurm_down.sh DIR}
for name in slurmd slurmctld munged; do
    pidfile="$DIR/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
done
