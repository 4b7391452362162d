#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for orchestra's tests and local development.
#
# Usage: tools/slurm_cluster.sh start|stop|status|env
#
#   start   install the packages if missing (apt), write the config, start munged, slurmctld
#           and slurmd, resume a drained node, wait until a real `srun -t 1 true` succeeds.
#           Idempotent: daemons that already run are kept; stale pid/socket files are removed.
#   stop    cancel the cluster's jobs, then stop the daemons this script started (by the PIDs
#           in its pid files, never by name). Exits 0 when nothing runs.
#   status  exit 0 when the controller answers and the node is usable; prints sinfo.
#   env     print the exports a shell or a test needs (eval "$(tools/slurm_cluster.sh env)").
#
# Needs root (Slurm and munge daemons run as root here; no systemd, no cgroups).
#
# All state lives in one folder, $ORCHESTRA_SLURM_DIR (default /tmp/orchestra-slurm):
#   slurm.conf, gres.conf, munge/ (key, socket, pid, log, seed), dev/nvidia[0-3] (fake GPUs,
#   character devices), spool/ (slurmctld state, slurmd spool), log/, run/ (pid files),
#   jobcomp.txt (finished jobs, read with `sacct -c`).
#
# Config location, a decision: nothing is written to /etc. Every Slurm command (srun, sbatch,
# squeue, scancel, sacct, scontrol) must see SLURM_CONF=$ORCHESTRA_SLURM_DIR/slurm.conf in its
# environment. A dev box may already have, or later get, a real /etc/slurm/slurm.conf, and
# overwriting it would silently point the user's tools at a toy cluster. Child processes
# (submitit, the SlurmRunner) inherit SLURM_CONF from os.environ, which the pytest fixture
# sets; inside a job slurmd sets SLURM_CONF itself.
#
# Settings and why (see docs/dev/slurm-notes.md): linuxproc/none plugins (no cgroups),
# cons_tres + CR_Core_Memory + DefMemPerCPU (otherwise one job takes all memory), immediate
# scheduling, EnforcePartLimits=ALL (impossible requests fail at submit instead of pending
# forever), 8 declared CPUs via config_overrides (more concurrent test jobs on 2 cores),
# cred_expire=10 (a requeued job may restart after ~10 s instead of 120 s), MinJobAge=600
# (finished jobs stay visible to squeue/scontrol), jobcomp/filetxt (there is no slurmdbd),
# MaxJobCount=50000 (Slurm's default 10000 counts ended jobs until MinJobAge has passed: a
# 10,000-task run at ~7 jobs/s on the 8 slots, plus other sessions' jobs, reached it and had
# submissions refused; slurmctld's memory with 50000 records is not measured here). MinJobAge
# stays 600: tests read ended jobs from squeue. A real cluster keeps ended jobs too, so
# SlurmRunner waits out such refusals instead of relying on this setting.
#
# Ports 6817/6818 are fixed: one such cluster per machine.
set -euo pipefail

DIR="${ORCHESTRA_SLURM_DIR:-/tmp/orchestra-slurm}"
case "$DIR" in
  /*) ;;
  *) DIR="$(pwd)/$DIR" ;;
esac
CONF="$DIR/slurm.conf"
NODE=localhost
NUM_CPUS="${ORCHESTRA_SLURM_CPUS:-8}"
NUM_GPUS=4
PARTITIONS=(debug gpu)
READY_TIMEOUT_S=60

log() { echo "slurm_cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

export SLURM_CONF="$CONF"

# ---------------------------------------------------------------- helpers

# proc_running PID: PID is a process that is not a zombie (a killed daemon whose parent is
# init stays a zombie until init reaps it, with its name still in /proc).
proc_running() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is a running process whose command name is NAME.
pid_alive() {
  local pidfile=$1 name=$2 pid comm
  [[ -s $pidfile ]] || return 1
  pid=$(tr -dc '0-9' <"$pidfile")
  [[ -n $pid ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$name" ]] && proc_running "$pid"
}

read_pid() { tr -dc '0-9' <"$1"; }

require_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (it starts munged, slurmctld and slurmd)"
}

install_packages() {
  local missing=()
  for cmd in slurmctld slurmd srun munged mungekey; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
  mkdir -p "$DIR"/{munge,dev,spool/ctld,spool/d,log,run}
  # munged insists that the socket folder and its parents be reachable by everyone.
  chmod 755 "$DIR" "$DIR/munge"

  if [[ ! -s $DIR/munge/munge.key ]]; then
    mungekey --create --keyfile="$DIR/munge/munge.key" --bits=1024
  fi
  chmod 400 "$DIR/munge/munge.key"

  local i
  for ((i = 0; i < NUM_GPUS; i++)); do
    # gres File= must be a character device; a regular file is rejected. 1,3 is /dev/null's.
    [[ -c $DIR/dev/nvidia$i ]] || { rm -f "$DIR/dev/nvidia$i"; mknod "$DIR/dev/nvidia$i" c 1 3; }
  done

  local mem
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  [[ -n $mem ]] || die "could not read RealMemory from 'slurmd -C'"

  local tmp="$CONF.tmp.$$"
  cat >"$tmp" <<EOF
# Written by tools/slurm_cluster.sh; rewritten on every start. Do not edit.
ClusterName=orchestra
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=10
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: the cgroup plugins crash slurmd inside VMs and containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none

SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
EnforcePartLimits=ALL
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
MaxJobCount=50000
KillWait=5
InactiveLimit=0
Waittime=0

AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt

GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NUM_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$NUM_CPUS ThreadsPerCore=1 RealMemory=$mem Gres=gpu:$NUM_GPUS State=UNKNOWN
PartitionName=${PARTITIONS[0]} Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=${PARTITIONS[1]} Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF
  mv "$tmp" "$CONF"
  cat >"$DIR/gres.conf" <<EOF
# Written by tools/slurm_cluster.sh. Fake GPUs: character devices, no autodetection.
AutoDetect=off
NodeName=$NODE Name=gpu File=$DIR/dev/nvidia[0-$((NUM_GPUS - 1))]
EOF
}

start_munged() {
  local pidfile="$DIR/munge/munged.pid"
  if pid_alive "$pidfile" munged; then return 0; fi
  rm -f "$pidfile" "$DIR/munge/munge.socket.2" "$DIR/munge/munge.socket.2.lock"
  munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket.2" \
    --pid-file="$pidfile" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" 9>&-
  log "munged started (pid $(read_pid "$pidfile"))"
}

start_slurmctld() {
  local pidfile="$DIR/run/slurmctld.pid"
  if pid_alive "$pidfile" slurmctld; then return 0; fi
  rm -f "$pidfile"
  slurmctld -f "$CONF" 9>&-
  wait_for_file "$pidfile" slurmctld
  log "slurmctld started (pid $(read_pid "$pidfile"))"
}

start_slurmd() {
  local pidfile="$DIR/run/slurmd.pid"
  if pid_alive "$pidfile" slurmd; then return 0; fi
  rm -f "$pidfile"
  slurmd -f "$CONF" -N "$NODE" 9>&-
  wait_for_file "$pidfile" slurmd
  log "slurmd started (pid $(read_pid "$pidfile"))"
}

wait_for_file() {
  local pidfile=$1 name=$2 i
  for ((i = 0; i < 50; i++)); do
    pid_alive "$pidfile" "$name" && return 0
    sleep 0.1
  done
  die "$name did not start; see $DIR/log/$name.log"
}

# The node stays DRAIN/DOWN across restarts (e.g. after a gres mismatch) until resumed.
resume_node() {
  local state
  state=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1 || true)
  case "$state" in
    *drain* | *down* | *fail*)
      log "node $NODE is '$state'; resuming"
      scontrol update nodename="$NODE" state=resume || true
      ;;
  esac
}

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    resume_node
    if timeout 10 srun -t 1 --quiet true >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.5
  done
  die "no 'srun -t 1 true' succeeded within ${READY_TIMEOUT_S}s; see $DIR/log/"
}

stop_pidfile() {
  local pidfile=$1 name=$2 pid i
  if ! pid_alive "$pidfile" "$name"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(read_pid "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    proc_running "$pid" || break
    sleep 0.1
  done
  if proc_running "$pid"; then
    log "$name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  log "$name (pid $pid) stopped"
}

print_env() {
  echo "export SLURM_CONF=$CONF"
  echo "export ORCHESTRA_SLURM_DIR=$DIR"
}

# ---------------------------------------------------------------- commands

cmd_start() {
  require_root
  install_packages
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 90 9 || die "another start/stop holds $DIR/.lock"
  write_config
  start_munged
  start_slurmctld
  start_slurmd
  wait_ready
  log "ready: $(sinfo -h -o '%P %T %C' | tr '\n' ';')"
  cat >&2 <<EOF
slurm_cluster: use it with
  eval "\$($0 env)"     # or: export SLURM_CONF=$CONF
  srun --gres=gpu:1 env | grep CUDA_VISIBLE_DEVICES
EOF
}

cmd_stop() {
  [[ -d $DIR ]] || return 0
  require_root
  exec 9>"$DIR/.lock"
  flock -w 90 9 || die "another start/stop holds $DIR/.lock"
  if pid_alive "$DIR/run/slurmctld.pid" slurmctld; then
    local jobs
    jobs=$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    if [[ -n ${jobs// /} ]]; then
      log "cancelling jobs: $jobs"
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      sleep 1
    fi
  fi
  stop_pidfile "$DIR/run/slurmd.pid" slurmd
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$DIR/munge/munged.pid" munged
}

cmd_status() {
  [[ -f $CONF ]] || { log "no cluster config at $CONF"; return 1; }
  pid_alive "$DIR/run/slurmctld.pid" slurmctld || { log "slurmctld not running"; return 1; }
  pid_alive "$DIR/run/slurmd.pid" slurmd || { log "slurmd not running"; return 1; }
  timeout 10 scontrol ping >/dev/null 2>&1 || { log "slurmctld does not answer"; return 1; }
  local state
  state=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1)
  sinfo
  case "$state" in
    idle | mixed | allocated | completing) return 0 ;;
    *) log "node $NODE is '$state'"; return 1 ;;
  esac
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) print_env ;;
  *)
    echo "usage: $0 start|stop|status|env   (state dir: $DIR)" >&2
    exit 2
    ;;
esac
