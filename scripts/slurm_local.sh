#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for running and testing the experiment drivers' grids through
# `--executor slurm` without a cluster: munge, one controller (slurmctld) and one compute node (slurmd) whose CPUs
# are separate job slots.
#
#   sudo apt-get install -y slurm-wlm munge      # Debian/Ubuntu packages (slurm-wlm 22.05 on Debian 12)
#   sudo scripts/slurm_local.sh start            # prints the `export SLURM_CONF=...` line the clients need
#   sudo scripts/slurm_local.sh status
#   sudo scripts/slurm_local.sh stop             # stops the daemons and deletes the state folder
#
# Settings (environment variables):
#   LIT_ICL_SLURM_DIR    state, spool, logs and slurm.conf (default: ${TMPDIR:-/tmp}/lit_icl_slurm)
#   LIT_ICL_SLURM_CPUS   job slots of the node (default 4; may exceed the real cores: slurmd is told to accept it)
#   LIT_ICL_SLURM_PORT   controller port; the node daemon takes the next one (default 6817)
#
# It runs as root (the daemons and munge need it) and leaves the system's own /etc/slurm alone: everything it
# writes is under LIT_ICL_SLURM_DIR, and clients find the cluster through SLURM_CONF. Process tracking is
# proctrack/linuxproc and task/none, so no cgroups are needed (a container is fine). There is no accounting
# database, so `sacct` has nothing to say; the drivers read job states from squeue and from their own records.
set -euo pipefail

DIR="${LIT_ICL_SLURM_DIR:-${TMPDIR:-/tmp}/lit_icl_slurm}"
CPUS="${LIT_ICL_SLURM_CPUS:-4}"
PORT="${LIT_ICL_SLURM_PORT:-6817}"
NODE="$(hostname -s)"
CONF="$DIR/slurm.conf"

die() { echo "slurm_local.sh: $*" >&2; exit 2; }

need_tools() {
  local missing=()
  for tool in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] || die "not installed: ${missing[*]}; install them with: apt-get install -y slurm-wlm munge"
  [ "$(id -u)" = 0 ] || die "the SLURM daemons and munge need root; run it with sudo"
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool"
  # RealMemory in MB, so jobs may ask for --mem; a little under what the machine has.
  local mem_mb
  mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  cat > "$CONF" <<EOF
# Written by scripts/slurm_local.sh: a one-node cluster for lit_icl's grids.
ClusterName=lit_icl_local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
# Scheduling passes often: a local test grid should not wait on the defaults meant for large clusters.
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
ReturnToService=2
JobRequeue=1
# A killed job's slot is free again at once.
KillWait=5
MinJobAge=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# The node may declare more CPUs than the machine has: each is a job slot.
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN
# A job that asks for no memory gets its CPUs' share, not the whole node (which would run one job at a time).
DefMemPerCPU=$((mem_mb / CPUS))
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return  # a munged already answers
  fi
  [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key; reinstall munge (apt-get install --reinstall munge)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.1
  done
  die "munged did not start; see /var/log/munge/munged.log"
}

wait_node_idle() {
  for _ in $(seq 100); do
    if SLURM_CONF="$CONF" sinfo -h -n "$NODE" -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; then
      return
    fi
    sleep 0.2
  done
  die "the node did not come up; see $DIR/slurmctld.log and $DIR/slurmd.log"
}

start() {
  need_tools
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    echo "already running; export SLURM_CONF=$CONF"
    return
  fi
  write_conf
  start_munge
  # -i: ignore state left by an earlier cluster in this folder; the grid's own records say what is done.
  slurmctld -f "$CONF" -i
  slurmd -f "$CONF"
  SLURM_CONF="$CONF" scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  wait_node_idle
  echo "export SLURM_CONF=$CONF"
}

stop() {
  local dir
  dir=$(readlink -f "$DIR")
  for daemon in slurmd slurmctld; do
    if [ -f "$DIR/$daemon.pid" ]; then
      local pid
      pid=$(cat "$DIR/$daemon.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  # Job steps left behind by a killed slurmd: this cluster's only (slurmd, and each step it starts, works in this
  # cluster's folder, where its log is), not those of another cluster on the machine (a test module's, a user's).
  local step
  for step in $(pgrep -f "slurmstepd: \[" || true); do
    if [ "$(readlink "/proc/$step/cwd" 2>/dev/null)" = "$dir" ]; then kill "$step" 2>/dev/null || true; fi
  done
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    [ -f "$CONF" ] || die "not started (no $CONF)"
    SLURM_CONF="$CONF" sinfo
    SLURM_CONF="$CONF" squeue ;;
  *) die "usage: scripts/slurm_local.sh start|stop|status" ;;
esac
