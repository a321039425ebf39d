#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for the Slurm executor's tests (issue 26).
#
#   scripts/slurm_local.sh start DIR   install slurm-wlm + munge if missing, start munged,
#                                      slurmctld and slurmd, wait until the node is idle
#   scripts/slurm_local.sh stop DIR    stop the daemons started by `start` (by the PIDs in DIR)
#
# Why a script and not a mock: sbatch/squeue/scancel semantics (queueing, time limits, SIGTERM then
# SIGKILL after KillWait, array tasks) are what the executor must get right. The recipe is the one
# measured in issue 26: Debian's slurm-wlm runs as root without systemd with process tracking by
# /proc (no cgroups), no accounting, and one node described by `slurmd -C`. DIR holds slurm.conf,
# the state, the logs and the PIDs; `start` prints `export SLURM_CONF=DIR/slurm.conf`.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"

stop() {
  # Jobs first: slurmstepd and a job's processes outlive slurmd. Cancel what this cluster still
  # runs (SIGTERM, SIGKILL after KillWait) and wait for its queue to empty (at most 20 s).
  if [ -s "$dir/slurmctld.pid" ] && [ -f "$conf" ]; then
    jobs=$(SLURM_CONF="$conf" timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      SLURM_CONF="$conf" timeout 10 scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [ -z "$(SLURM_CONF="$conf" timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
  # Then only the daemons this script started, by the PIDs it recorded: slurmd, slurmctld, munged.
  for name in slurmd slurmctld munged; do
    pidfile="$dir/$name.pid"
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || { echo "slurm_local: no slurmctld and no apt-get to install it" >&2; return 1; }
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) >"$dir/apt.log" 2>&1 \
    || { echo "slurm_local: apt-get install slurm-wlm munge failed (see $dir/apt.log)" >&2; return 1; }
}

start() {
  install
  stop  # a previous start in the same DIR
  # munge: a key and the runtime folders, owned by the munge user; munged run as that user.
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey -c -f -k /etc/munge/munge.key; else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
  fi
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
  chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
  if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid 2>"$dir/munged.err" \
      || { echo "slurm_local: munged did not start: $(cat "$dir/munged.err")" >&2; return 1; }
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
    cp /run/munge/munged.pid "$dir/munged.pid"
  fi
  munge -n >/dev/null || { echo "slurm_local: munge does not answer" >&2; return 1; }

  # One node as slurmd -C sees it, memory at 90 %, more CPUs declared than cores so that a
  # job of 2 ranks and a second job can run at once on a 2-core machine (tests stay serial).
  node=$(slurmd -C | head -1)
  host=$(echo "$node" | sed -E 's/.*NodeName=([^ ]+).*/\1/')
  mem=$(echo "$node" | sed -E 's/.*RealMemory=([0-9]+).*/\1/')
  cpus=$(echo "$node" | sed -E 's/.*CPUs=([0-9]+).*/\1/')
  declared=$(( cpus < 8 ? 8 : cpus ))
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat >"$conf" <<CONF
ClusterName=autoparallel-ci
SlurmctldHost=$host
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
NodeName=$host CPUs=$declared RealMemory=$(( mem * 9 / 10 )) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$conf"
  slurmctld -c -i -f "$conf" || { echo "slurm_local: slurmctld did not start ($dir/log/slurmctld.log)" >&2; return 1; }
  slurmd -f "$conf" || { echo "slurm_local: slurmd did not start ($dir/log/slurmd.log)" >&2; return 1; }
  for _ in $(seq 100); do
    state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
    [ "$state" = idle ] && { echo "export SLURM_CONF=$conf"; return 0; }
    sleep 0.2
  done
  echo "slurm_local: node not idle after 20 s (state '${state:-none}'; see $dir/log)" >&2
  return 1
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
