#!/usr/bin/env bash
# Stop the cluster started by start.sh: cancel its jobs, then TERM each daemon by its pid file.
#
#   bash slurm/local-cluster/stop.sh [STATE_DIR]   # same default as start.sh
#
# Jobs are cancelled first because a job's slurmstepd outlives slurmd. Never kills by process name.
# Set NEMO_AZR_SLURM_CLEAN=1 to also delete STATE_DIR afterwards.
set -uo pipefail

DIR=${1:-${NEMO_AZR_SLURM_DIR:-/tmp/nemo-azr-slurm}}
RUN=$DIR/run
export SLURM_CONF=$DIR/slurm.conf
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$RUN/slurmctld.pid" && scontrol ping >/dev/null 2>&1; then
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null
        for _ in $(seq 150); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
fi

stop_pid() {  # TERM, wait up to 10 s, then KILL
    local file=$1
    alive "$file" || { rm -f "$file"; return 0; }
    local pid
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    rm -f "$file"
}
for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do  # one node, or every node's slurmd
    [ -e "$f" ] && stop_pid "$f"
done
stop_pid "$RUN/slurmctld.pid"
stop_pid "$RUN/munged.pid"
[ "${NEMO_AZR_SLURM_CLEAN:-0}" = 1 ] && rm -rf "$DIR"
echo "stopped the cluster in $DIR"
