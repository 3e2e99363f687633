#!/usr/bin/env bash
# Start a SLURM cluster of one or more nodes on this Debian machine, for development and CI (root,
# no systemd).
#
#   bash slurm/local-cluster/start.sh [STATE_DIR]      # default: $NEMO_AZR_SLURM_DIR or /tmp/nemo-azr-slurm
#   NEMO_AZR_SLURM_NODES=2 bash slurm/local-cluster/start.sh   # two nodes on this one machine
#   export SLURM_CONF=STATE_DIR/slurm.conf              # printed on the last line; sbatch/squeue need it
#
# One node (the default) is this host under its own name. N > 1 nodes are named nemo1..nemoN, each
# its own slurmd (slurmd -N nodeN) on its own port, all reached over loopback: every node gets this
# machine's CPU and memory shape (SlurmdParameters=config_overrides lets the nodes share the
# hardware), so a job of 2 tasks per node on 2 nodes runs 4 processes on the real cores.
#
# Installs slurmctld, slurmd, slurm-client and munge with apt when missing (quiet, idempotent;
# NEMO_AZR_SLURM_INSTALL=0 forbids it), writes slurm.conf and every state/spool/log/pid file under
# STATE_DIR, then starts munged (as the munge user, on its own socket), slurmctld and slurmd and waits
# for the node to be idle. Partitions: $NEMO_AZR_SLURM_PARTITION (default debug, the default one) and
# urgent, whose jobs preempt it (PreemptMode=REQUEUE). Running it again while the cluster is up only
# prints the export line. Stop with stop.sh (by pid files).
# STATE_DIR and its parents must be readable by the munge user (not a 0700 temp folder).
# Exit codes: 0 up; 3 the packages are not installed and cannot be (no apt / no network /
# NEMO_AZR_SLURM_INSTALL=0); 1 other.
set -euo pipefail

DIR=${1:-${NEMO_AZR_SLURM_DIR:-/tmp/nemo-azr-slurm}}
PORT=${NEMO_AZR_SLURM_PORT:-6817}  # slurmctld port; slurmd uses PORT+1 (node i of N: PORT+i)
NODES=${NEMO_AZR_SLURM_NODES:-1}
PARTITION=${NEMO_AZR_SLURM_PARTITION:-debug}
URGENT=urgent  # a partition whose jobs preempt those of $PARTITION
# s without an answer from a slurmd before slurmctld sets its node DOWN and fails the node's jobs
# (NODE_FAIL; requeued when they may be); Slurm's default 300
SLURMD_TIMEOUT=${NEMO_AZR_SLURMD_TIMEOUT:-300}
PACKAGES=(slurmctld slurmd slurm-client munge)

die() { echo "start.sh: $*" >&2; exit "${2:-1}"; }
[ "$(id -u)" = 0 ] || die "needs root (the daemons run as root here)"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "NEMO_AZR_SLURM_NODES must be a positive integer, got '$NODES'"
[[ "$SLURMD_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "NEMO_AZR_SLURMD_TIMEOUT must be a positive integer (seconds), got '$SLURMD_TIMEOUT'"

have_binaries() { command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null
if ! have_binaries; then
    [ "${NEMO_AZR_SLURM_INSTALL:-1}" = 0 ] && die "slurm is not installed (NEMO_AZR_SLURM_INSTALL=0: not installing it)" 3
    command -v apt-get >/dev/null || die "slurm is not installed and apt-get is missing" 3
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; } \
        >"${TMPDIR:-/tmp}/nemo-azr-slurm-apt.log" 2>&1 \
        || die "apt-get install ${PACKAGES[*]} failed (see ${TMPDIR:-/tmp}/nemo-azr-slurm-apt.log)" 3
    have_binaries || die "slurm binaries still missing after apt-get install" 3
fi

RUN=$DIR/run
export SLURM_CONF=$DIR/slurm.conf
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
HOST=$(hostname -s)
if [ "$NODES" = 1 ]; then
    NODE_NAMES=("$HOST")
    NODE_LIST=$HOST
else
    NODE_NAMES=()
    for i in $(seq "$NODES"); do NODE_NAMES+=("nemo$i"); done
    NODE_LIST="nemo[1-$NODES]"
fi
pidfile() { [ "$NODES" = 1 ] && echo "$RUN/slurmd.pid" || echo "$RUN/slurmd-$1.pid"; }
all_slurmd_alive() { for n in "${NODE_NAMES[@]}"; do alive "$(pidfile "$n")" || return 1; done; }
if alive "$RUN/slurmctld.pid" && all_slurmd_alive && scontrol ping >/dev/null 2>&1; then
    [ "$(sinfo -h -o %D -p "$PARTITION" 2>/dev/null | head -n1)" = "$NODES" ] \
        || die "a cluster of another size is up in $DIR: stop it first (stop.sh $DIR)"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi

mkdir -p "$DIR"/{state,spool,log,run,munge}
chmod 0755 "$DIR"  # munged runs as the munge user and must reach its socket folder
chown munge:munge "$DIR/munge"
chmod 0755 "$DIR/munge"
[ -s /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || die "cannot create /etc/munge/munge.key"; }
chown munge:munge /etc/munge/munge.key

# The node's real shape (CPUs, sockets, memory), renamed and reached over loopback.
SHAPE=$(slurmd -C | head -n1 | sed -e "s/^NodeName=[^ ]* //")
if [ "$NODES" = 1 ]; then
    NODE_LINES="NodeName=$HOST $SHAPE NodeAddr=127.0.0.1 State=UNKNOWN"
    SLURMD_FILES="SlurmdPidFile=$RUN/slurmd.pid
SlurmdSpoolDir=$DIR/spool
SlurmdLogFile=$DIR/log/slurmd.log"
else
    # several slurmd on one host: each its own port, and %n (the node name) in its files
    NODE_LINES="NodeName=$NODE_LIST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((PORT + 1))-$((PORT + NODES))] $SHAPE State=UNKNOWN"
    SLURMD_FILES="SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdSpoolDir=$DIR/spool/%n
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides"
fi
cat >"$SLURM_CONF" <<CONF
# Written by slurm/local-cluster/start.sh: a development cluster of $NODES node(s) on this host.
ClusterName=nemoazr
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=5: a requeued job may start again after ~6 s instead of 120 s.
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$DIR/state
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
$SLURMD_FILES
# Containers without cgroup/systemd: plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=$SLURMD_TIMEOUT
MailProg=/bin/true
SchedulerParameters=bf_interval=1,sched_interval=1
# No slurmdbd: finished jobs are written to a text file (the launcher's status falls back to it).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
# Preemption as many sites run it: a job in the higher tier "$URGENT" preempts jobs of "$PARTITION"
# on its nodes; they get SIGTERM and Slurm requeues them (GraceTime 0; scontrol update
# PartitionName=$PARTITION GraceTime=N / PreemptMode=CANCEL try the other set-ups).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$NODE_LINES
PartitionName=$PARTITION Nodes=$NODE_LIST Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=$URGENT Nodes=$NODE_LIST MaxTime=INFINITE State=UP PriorityTier=2
CONF

# Daemons get their stdio redirected: one holding the caller's pipe open would make it wait forever.
if ! alive "$RUN/munged.pid"; then
    runuser -u munge -- munged --socket="$DIR/munge/munge.socket.2" --pid-file="$DIR/munge/munged.pid" \
        --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" --force </dev/null >>"$DIR/log/daemons.out" 2>&1
    for _ in $(seq 50); do [ -s "$DIR/munge/munged.pid" ] && break; sleep 0.1; done
    [ -s "$DIR/munge/munged.pid" ] || die "munged did not start (see $DIR/munge/munged.log)"
    cp "$DIR/munge/munged.pid" "$RUN/munged.pid"
fi
alive "$RUN/slurmctld.pid" || slurmctld -f "$SLURM_CONF" </dev/null >>"$DIR/log/daemons.out" 2>&1
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping >/dev/null 2>&1 || die "slurmctld did not answer (see $DIR/log/slurmctld.log)"
for n in "${NODE_NAMES[@]}"; do
    if [ "$NODES" = 1 ]; then
        alive "$(pidfile "$n")" || slurmd -f "$SLURM_CONF" </dev/null >>"$DIR/log/daemons.out" 2>&1
    else
        mkdir -p "$DIR/spool/$n"
        alive "$(pidfile "$n")" || slurmd -f "$SLURM_CONF" -N "$n" </dev/null >>"$DIR/log/daemons.out" 2>&1
    fi
done

# Up: every node answers and takes jobs (idle; or running one already, when a node that was lost
# comes back under a requeued job); "*" marks a node that does not answer.
nodes_up() {
    [ "$(sinfo -h -N -p "$PARTITION" -o %N | wc -l)" = "$NODES" ] \
        && ! sinfo -h -N -p "$PARTITION" -o %T | grep -Eqv '^(idle|mixed|allocated|completing)$'
}
for _ in $(seq 150); do
    nodes_up 2>/dev/null && break
    sleep 0.2
done
if ! nodes_up 2>/dev/null; then
    states=$(sinfo -h -N -p "$PARTITION" -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    die "nodes $NODE_LIST are '${states:-unknown}', not all up (see $DIR/log/slurmd*.log)"
fi
echo "export SLURM_CONF=$SLURM_CONF"
