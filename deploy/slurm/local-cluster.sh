#!/usr/bin/env bash
# local-cluster.sh: run a real 4-node Slurm cluster (nodes n1 to n4) on this
# one machine, for development, the demo (deploy/demo.sh) and the test suite.
#
#   deploy/slurm/local-cluster.sh start    # idempotent; installs slurm-wlm + munge if missing
#   eval "$(deploy/slurm/local-cluster.sh env)"
#   srun -N3 --ntasks-per-node=1 bash -c 'echo $SLURM_NODEID $SLURMD_NODENAME'
#   deploy/slurm/local-cluster.sh status   # exit 0 iff up and every node is usable
#   deploy/slurm/local-cluster.sh stop     # idempotent; cancels jobs, stops what start started
#
# Verified with Slurm 22.05.8 (`sinfo --version`: slurm-wlm 22.05.8, Debian 12
# package 22.05.8-4+deb12u3) and munge 0.5.15, as root, without systemd.
#
# How it works: one slurmctld and four slurmd's (`slurmd -N n1` ... `-N n4`)
# all run here as root. The nodes share NodeHostname=localhost and
# NodeAddr=127.0.0.1 and differ only by port, so no /etc/hosts edits are
# needed and all Slurm traffic goes over loopback. Everything lives in a state
# directory; the system's /etc/slurm is never touched (clients find the config
# through SLURM_CONF, see `env`). The munge daemon is the system one
# (/etc/munge/munge.key, default socket); it is started if it is not running,
# and stopped again by `stop` only if this script started it.
#
# Scheduling: select/linear (whole nodes, like an exclusive-node cluster) with
# CPUs=8 per node (more than the machine has; SlurmdParameters=config_overrides
# makes slurmd accept that) and OverSubscribe=FORCE:32 on the partition, so up
# to 32 jobs share a node at once instead of queueing. Tasks are spread over
# whole nodes as on a real cluster: `srun -N2 -n4` gives SLURM_TASKS_PER_NODE
# 2(x2), `srun -N2 -n3` gives 2,1, and two concurrent
# `srun -N3 --ntasks-per-node=2` jobs run at the same time. (select/cons_tres
# with CR_CPU also shares nodes, but it allocates CPUs greedily, so
# `srun -N2 -n4` would give 3,1.)
#
# Networking: every node address is 127.0.0.1; if this machine's host name
# also resolves to a loopback address, the daemons and srun bind to it
# (CommunicationParameters=NoCtldInAddrAny,NoInAddrAny) instead of 0.0.0.0.
#
# Environment:
#   RDZV_SLURM_DIR        state directory (default /tmp/rdzv-slurm)
#   RDZV_SLURM_PORT_BASE  slurmctld port; slurmd n1..n4 use the next four
#                         (default 16817, so slurmd's use 16818-16821)
#   RDZV_SLURM_CPUS       CPUs declared per node (default 8)
#   RDZV_SLURM_TIMEOUT    seconds to wait for the cluster to come up (default 60)
#   RDZV_SLURM_FIRST_JOB_ID  the first job id (default 1); two clusters on one machine
#                         with separate ranges never derive the same rendezvous port
#
# State directory layout:
#   slurm.conf  plugstack.conf (empty: no SPANK plugins from /etc/slurm)
#   state/slurmctld/       StateSaveLocation
#   state/slurmd-n{1,2,3,4}/ SlurmdSpoolDir of each node
#   log/slurmctld.log  log/slurmd-n{1,2,3,4}.log  log/*.out (daemon stdout/stderr)
#   run/slurmctld.pid  run/slurmd-n{1,2,3,4}.pid  run/munged.ours (only if we started munged)
set -euo pipefail

readonly NODES=(n1 n2 n3 n4)

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { printf 'local-cluster: error: %s\n' "$*" >&2; exit 1; }

usage() {
  cat >&2 <<'EOF'
usage: local-cluster.sh start|stop|status|env
  start   start (or keep) a 4-node Slurm cluster on this machine (root)
  stop    cancel all jobs and stop the daemons that start started (root)
  status  print sinfo; exit 0 iff the cluster is up and all nodes are usable
  env     print `export SLURM_CONF=...` for eval
Environment: RDZV_SLURM_DIR (default /tmp/rdzv-slurm), RDZV_SLURM_PORT_BASE
(default 16817), RDZV_SLURM_CPUS (default 8), RDZV_SLURM_TIMEOUT (default 60),
RDZV_SLURM_FIRST_JOB_ID (default 1).
EOF
}

DIR=${RDZV_SLURM_DIR:-/tmp/rdzv-slurm}
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
DIR=${DIR%/}
PORT_BASE=${RDZV_SLURM_PORT_BASE:-16817}
CPUS=${RDZV_SLURM_CPUS:-8}
GPUS=${RDZV_SLURM_GPUS:-4}
SELECT=${RDZV_SLURM_SELECT:-linear}
TIMEOUT=${RDZV_SLURM_TIMEOUT:-60}
FIRST_JOB_ID=${RDZV_SLURM_FIRST_JOB_ID:-1}
CONF=$DIR/slurm.conf
GRES_CONF=$DIR/gres.conf
MUNGE_MARK=$DIR/run/munged.ours

if ! [[ $PORT_BASE =~ ^[0-9]+$ ]] || ((PORT_BASE < 1024 || PORT_BASE > 65530)); then
  die "RDZV_SLURM_PORT_BASE must be a port number between 1024 and 65530, got '$PORT_BASE'"
fi
if ! [[ $CPUS =~ ^[0-9]+$ ]] || ((CPUS < 1)); then
  die "RDZV_SLURM_CPUS must be a positive integer, got '$CPUS'"
fi
if ! [[ $GPUS =~ ^[0-9]+$ ]] || ((GPUS > 64)); then
  die "RDZV_SLURM_GPUS must be an integer from 0 to 64, got '$GPUS'"
fi
case $SELECT in
  linear | cons_tres) ;;
  *) die "RDZV_SLURM_SELECT must be linear or cons_tres, got '$SELECT'" ;;
esac
if ! [[ $FIRST_JOB_ID =~ ^[0-9]+$ ]] || ((FIRST_JOB_ID < 1 || FIRST_JOB_ID > 60000000)); then
  die "RDZV_SLURM_FIRST_JOB_ID must be an integer from 1 to 60000000, got '$FIRST_JOB_ID'"
fi
if ! [[ $TIMEOUT =~ ^[0-9]+$ ]] || ((TIMEOUT < 1)); then
  die "RDZV_SLURM_TIMEOUT must be a positive integer, got '$TIMEOUT'"
fi

export SLURM_CONF=$CONF

need_root() {
  [[ $(id -u) == 0 ]] || die "must run as root (the slurmd's run jobs as root and munged needs /etc/munge); try: sudo $0 $1"
}

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null; }
have_munge() { command -v munged >/dev/null && command -v munge >/dev/null && command -v unmunge >/dev/null; }

ensure_packages() {
  have_slurm && have_munge && return 0
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and apt-get is not available"
  log "installing slurm-wlm and munge with apt-get"
  apt-get update >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge >&2 ||
    die "apt-get install slurm-wlm munge failed"
  if ! have_slurm || ! have_munge; then
    die "slurm-wlm and munge were installed but slurmctld/slurmd/munged are still not found"
  fi
}

# --- finding our daemons ------------------------------------------------------
# A daemon is "ours" if its command line names our slurm.conf (we always pass
# -f "$CONF"), so this works even if pid files are missing or stale.

# our_pids COMM [NODE]: pids of our slurmctld (COMM=slurmctld) or of the slurmd
# of NODE (COMM=slurmd), one per line.
our_pids() {
  local comm=$1 node=${2:-} p c have_conf have_node prev a
  for p in /proc/[0-9]*; do
    c=$(cat "$p/comm" 2>/dev/null) || continue
    [[ $c == "$comm" ]] || continue
    have_conf=0 have_node=0 prev=
    while IFS= read -r -d '' a; do
      [[ $a == "$CONF" ]] && have_conf=1
      [[ $prev == -N && $a == "$node" ]] && have_node=1
      prev=$a
    done 2>/dev/null <"$p/cmdline" || true
    ((have_conf)) || continue
    [[ -z $node ]] || ((have_node)) || continue
    echo "${p#/proc/}"
  done
}

ctld_pids() { our_pids slurmctld; }
slurmd_pids() { our_pids slurmd "$1"; }

# stepd_pids: slurmstepd's spawned by our slurmd's (they inherit the marker
# variable we put into the slurmd's environment).
stepd_pids() {
  local p c
  for p in /proc/[0-9]*; do
    c=$(cat "$p/comm" 2>/dev/null) || continue
    [[ $c == slurmstepd ]] || continue
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "RDZV_SLURM_LOCAL_CLUSTER=$DIR" || continue
    echo "${p#/proc/}"
  done
}

any_ours_running() {
  local n
  [[ -n $(ctld_pids) ]] && return 0
  for n in "${NODES[@]}"; do [[ -n $(slurmd_pids "$n") ]] && return 0; done
  return 1
}

# foreign_slurm_daemons: is any slurmctld/slurmd that is not ours running?
foreign_slurm_daemons() {
  local p c
  for p in /proc/[0-9]*; do
    c=$(cat "$p/comm" 2>/dev/null) || continue
    [[ $c == slurmctld || $c == slurmd ]] || continue
    alive "${p#/proc/}" || continue
    tr '\0' '\n' 2>/dev/null <"$p/cmdline" | grep -qxF "$CONF" && continue
    return 0
  done
  return 1
}

# alive PID: the process exists and is not a zombie (in a container whose
# PID 1 does not reap orphans, exited daemons stay zombies forever).
alive() {
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# wait_gone SECONDS PID...: wait until none of the pids is alive; 1 on timeout.
wait_gone() {
  local secs=$1 p left
  shift
  local deadline=$((SECONDS + secs))
  while :; do
    left=0
    for p in "$@"; do alive "$p" && left=1; done
    ((left)) || return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# stop_pids WHAT PID...: SIGTERM, wait up to 15 s, then SIGKILL.
stop_pids() {
  local what=$1
  shift
  (($#)) || return 0
  log "stopping $what (pid $*)"
  kill -TERM "$@" 2>/dev/null || true
  if ! wait_gone 15 "$@"; then
    log "$what did not exit after SIGTERM; sending SIGKILL"
    kill -KILL "$@" 2>/dev/null || true
    wait_gone 5 "$@" || die "could not stop $what (pid $*)"
  fi
}

port_in_use() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# --- munge --------------------------------------------------------------------

close_inherited_fds() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    [[ $fd -gt 2 ]] && eval "exec $fd>&-" 2>/dev/null
  done
  return 0
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
  getent passwd munge >/dev/null || die "user 'munge' does not exist (is the munge package installed correctly?)"
  if [[ ! -s /etc/munge/munge.key ]]; then
    install -d -o munge -g munge -m 0700 /etc/munge
    log "creating munge key /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key --force
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi

  if munge_ok; then
    return 0
  fi
  log "starting munged"
  # Without systemd nobody creates /run/munge (the others come with the package).
  [[ -d /run/munge ]] || install -d -o munge -g munge -m 0755 /run/munge
  [[ -d /var/lib/munge ]] || install -d -o munge -g munge -m 0711 /var/lib/munge
  [[ -d /var/log/munge ]] || install -d -o munge -g munge -m 0700 /var/log/munge
  local out=$DIR/log/munged.out
  # munged keeps every descriptor it inherits: start it with none but stdio, so that it never
  # holds a caller's lock (flock) or pipe open for its whole life.
  if ! (close_inherited_fds; exec runuser -u munge -- munged </dev/null >"$out" 2>&1); then
    die "munged failed to start: $(tail -n 5 "$out" /var/log/munge/munged.log 2>/dev/null | tr '\n' ' ')"
  fi
  local i pid=
  for i in $(seq 50); do
    munge_ok && break
    sleep 0.1
  done
  munge_ok || die "munged started but munge/unmunge still fail; see /var/log/munge/munged.log"
  pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
  [[ -n $pid ]] || die "munged is running but /run/munge/munged.pid is missing"
  echo "$pid" >"$MUNGE_MARK"
}

stop_munge() {
  [[ -f $MUNGE_MARK ]] || return 0
  local pid
  pid=$(cat "$MUNGE_MARK" 2>/dev/null || true)
  if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == munged ]]; then
    if foreign_slurm_daemons; then
      # Keep the mark: a later 'stop' stops munged once those are gone.
      log "leaving munged (pid $pid) running: other Slurm daemons on this machine use it"
      return 0
    else
      stop_pids munged "$pid"
    fi
  fi
  rm -f "$MUNGE_MARK"
}

# --- config -------------------------------------------------------------------

# hostname_is_loopback: does gethostname() resolve to 127.x? Slurm's
# NoInAddrAny/NoCtldInAddrAny bind to that address, so they are only safe then
# (in a container the host name usually resolves to the container's IP).
hostname_is_loopback() {
  local addr
  addr=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 { print $1 }') || return 1
  [[ $addr == 127.* ]]
}

write_conf() {
  local host=$1 out=$2 comm_params= gres_types= node_gres= select
  if hostname_is_loopback; then
    comm_params=$'# The host name resolves to loopback: bind there, not to 0.0.0.0.\nCommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n'
  fi
  if ((GPUS > 0)); then
    gres_types=$'# Fake GPUs, see gres.conf and make_gpu_devices.\nGresTypes=gpu\n'
    node_gres=" Gres=gpu:$GPUS"
  fi
  if [[ $SELECT == cons_tres ]]; then
    select=$'SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU'
  else
    select=SelectType=select/linear
  fi
  cat >"$out" <<EOF
# Generated by deploy/slurm/local-cluster.sh; rewritten by every 'start'.
# A 4-node cluster on one machine: all nodes are 127.0.0.1, told apart by port.
ClusterName=rdzv-local
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
${select}
# Nodes declare more CPUs than the machine has; accept that.
SlurmdParameters=config_overrides
${comm_params}${gres_types}ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=60
Waittime=0
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
PlugStackConfig=$DIR/plugstack.conf
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/state/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((PORT_BASE + 1))-$((PORT_BASE + 4))] CPUs=$CPUS${node_gres} State=UNKNOWN
PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:32
EOF
}

# gpu_dev_dir NODE: where the fake GPU devices of NODE live.
gpu_dev_dir() { printf '%s/dev/%s' "$DIR" "$1"; }

# write_gres_conf OUT: one line per node naming its fake GPU device files.
write_gres_conf() {
  local out=$1 n last=$((GPUS - 1))
  {
    echo "# Generated by deploy/slurm/local-cluster.sh; rewritten by every 'start'."
    echo "# $GPUS fake GPUs per node: character devices like /dev/null (see make_gpu_devices)."
    if ((GPUS > 0)); then
      for n in "${NODES[@]}"; do
        if ((GPUS == 1)); then
          echo "NodeName=$n Name=gpu File=$(gpu_dev_dir "$n")/nvidia0"
        else
          echo "NodeName=$n Name=gpu File=$(gpu_dev_dir "$n")/nvidia[0-$last]"
        fi
      done
    fi
  } >"$out"
}

# make_gpu_devices: the files gres.conf names. slurmd only stat()s them (nothing enforces
# device access without cgroups), so each is a character device with /dev/null's numbers:
# harmless if anything opens it. Made under the state directory, never in /dev.
make_gpu_devices() {
  local n i f
  for n in "${NODES[@]}"; do
    install -d -m 0755 "$(gpu_dev_dir "$n")"
    for ((i = 0; i < GPUS; i++)); do
      f=$(gpu_dev_dir "$n")/nvidia$i
      [[ -c $f ]] && continue
      rm -f "$f"
      mknod -m 0666 "$f" c 1 3 || die "mknod $f failed (needs CAP_MKNOD); set RDZV_SLURM_GPUS=0 to run without GPUs"
    done
  done
}

# --- health -------------------------------------------------------------------

# node_states: "n1 idle" lines from sinfo (empty if slurmctld does not answer).
node_states() { timeout 15 sinfo -h -N -p debug -o '%N %T' 2>/dev/null || true; }

# healthy: our slurmctld and all slurmd's run and every node is usable.
healthy() {
  local n states good=0 name state
  [[ -n $(ctld_pids) ]] || return 1
  for n in "${NODES[@]}"; do [[ -n $(slurmd_pids "$n") ]] || return 1; done
  states=$(node_states)
  while read -r name state; do
    [[ -n $name ]] || continue
    case $state in
      idle | mixed | allocated | completing) good=$((good + 1)) ;;
      *) return 1 ;;
    esac
  done <<<"$states"
  ((good == ${#NODES[@]}))
}

log_tails() {
  local f n files=("$DIR/log/slurmctld.log" "$DIR/log/slurmctld.out")
  for n in "${NODES[@]}"; do files+=("$DIR/log/slurmd-$n.log" "$DIR/log/slurmd-$n.out"); done
  for f in "${files[@]}"; do
    [[ -s $f ]] || continue
    printf -- '--- last lines of %s ---\n' "$f" >&2
    tail -n 15 "$f" >&2
  done
}

# --- commands -----------------------------------------------------------------

cmd_env() {
  printf 'export SLURM_CONF=%q\n' "$CONF"
}

cmd_status() {
  if ! have_slurm; then
    log "not running (Slurm is not installed)"
    return 1
  fi
  if [[ ! -f $CONF || -z $(ctld_pids) ]]; then
    log "not running (no slurmctld for $CONF)"
    return 1
  fi
  timeout 15 sinfo -N -p debug -o '%10N %8c %12T %20E' || true
  if healthy; then
    return 0
  fi
  local n missing=()
  for n in "${NODES[@]}"; do [[ -n $(slurmd_pids "$n") ]] || missing+=("$n"); done
  if ((${#missing[@]})); then
    log "not healthy: slurmd not running for ${missing[*]} (run: $0 start)"
  else
    log "not healthy: not every node is idle/mixed/allocated"
  fi
  return 1
}

cmd_start() {
  need_root start
  ensure_packages
  mkdir -p "$DIR"/{state/slurmctld,log,run}
  local n
  for n in "${NODES[@]}"; do install -d -m 0755 "$DIR/state/slurmd-$n"; done
  chmod 0755 "$DIR"
  [[ -f $DIR/plugstack.conf ]] || : >"$DIR/plugstack.conf"

  local host
  host=$(hostname -s 2>/dev/null || hostname)
  [[ -n $host ]] || die "cannot determine the host name (hostname -s)"
  make_gpu_devices
  write_conf "$host" "$CONF.new"
  write_gres_conf "$GRES_CONF.new"
  if [[ -f $CONF && -f $GRES_CONF ]] && cmp -s "$CONF" "$CONF.new" &&
    cmp -s "$GRES_CONF" "$GRES_CONF.new"; then
    rm -f "$CONF.new" "$GRES_CONF.new"
  else
    if [[ -f $CONF ]] && any_ours_running; then
      log "configuration changed; restarting the cluster"
      stop_daemons
    fi
    mv -f "$GRES_CONF.new" "$GRES_CONF"
    mv -f "$CONF.new" "$CONF"
  fi

  if healthy; then
    log "already running ($CONF)"
    return 0
  fi

  ensure_munge

  # The daemons and the slurmstepd's they fork carry this variable, so that
  # stop can find leftovers.
  export RDZV_SLURM_LOCAL_CLUSTER=$DIR

  if [[ -z $(ctld_pids) ]]; then
    port_in_use "$PORT_BASE" &&
      die "port $PORT_BASE (slurmctld) is already in use; set RDZV_SLURM_PORT_BASE to another port"
    log "starting slurmctld on port $PORT_BASE"
    # -c: start from a clean slate (no jobs or node states from an earlier run).
    slurmctld -f "$CONF" -c </dev/null >>"$DIR/log/slurmctld.out" 2>&1 ||
      { log_tails; die "slurmctld failed to start"; }
  fi
  local i port
  for i in "${!NODES[@]}"; do
    n=${NODES[i]}
    [[ -z $(slurmd_pids "$n") ]] || continue
    port=$((PORT_BASE + 1 + i))
    port_in_use "$port" &&
      die "port $port (slurmd $n) is already in use; set RDZV_SLURM_PORT_BASE to another port"
    log "starting slurmd $n on port $port"
    slurmd -f "$CONF" -N "$n" </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1 ||
      { log_tails; die "slurmd $n failed to start"; }
  done

  log "waiting up to ${TIMEOUT}s for nodes n[1-4] to become idle"
  local deadline=$((SECONDS + TIMEOUT)) last_resume=0
  while ! healthy; do
    if [[ -z $(ctld_pids) ]]; then
      log_tails
      die "slurmctld exited during startup (see $DIR/log/slurmctld.log)"
    fi
    for n in "${NODES[@]}"; do
      if [[ -z $(slurmd_pids "$n") ]]; then
        log_tails
        die "slurmd $n exited during startup (see $DIR/log/slurmd-$n.log)"
      fi
    done
    if ((SECONDS >= deadline)); then
      node_states | sed 's/^/local-cluster:   /' >&2
      log_tails
      die "nodes did not become idle within ${TIMEOUT}s (logs in $DIR/log; '$0 stop' cleans up)"
    fi
    # A node left drained/down (e.g. by an earlier slurmctld that was killed)
    # would never become idle on its own.
    if ((SECONDS - last_resume >= 5)) && node_states | grep -Eq ' (down|drain|drained|draining|fail|failing)'; then
      timeout 15 scontrol update NodeName=n[1-4] State=RESUME >/dev/null 2>&1 || true
      last_resume=$SECONDS
    fi
    sleep 0.5
  done
  log "cluster is up: nodes n[1-4], partition debug; export SLURM_CONF=$CONF"
}

cancel_jobs() {
  [[ -n $(ctld_pids) ]] || return 0
  local jobs
  jobs=$(timeout 15 squeue -h -o '%A' 2>/dev/null || true)
  [[ -n $jobs ]] || return 0
  log "cancelling jobs: ${jobs//$'\n'/ }"
  # shellcheck disable=SC2086
  timeout 15 scancel $jobs 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while [[ -n $(timeout 15 squeue -h -o '%A' 2>/dev/null || true) ]]; do
    if ((SECONDS >= deadline)); then
      log "warning: jobs still listed 30s after scancel; stopping anyway"
      break
    fi
    sleep 0.5
  done
}

stop_daemons() {
  cancel_jobs
  # Job steps end before their jobs leave squeue, but give stragglers a moment.
  local steps
  steps=$(stepd_pids)
  if [[ -n $steps ]]; then
    # shellcheck disable=SC2086
    wait_gone 10 $steps || true
    steps=$(stepd_pids)
    # shellcheck disable=SC2086
    [[ -z $steps ]] || stop_pids "leftover slurmstepd" $steps
  fi
  local n pids=()
  for n in "${NODES[@]}"; do
    # shellcheck disable=SC2207
    pids+=($(slurmd_pids "$n"))
  done
  ((${#pids[@]} == 0)) || stop_pids "slurmd n1-n4" "${pids[@]}"
  # shellcheck disable=SC2207
  pids=($(ctld_pids))
  ((${#pids[@]} == 0)) || stop_pids slurmctld "${pids[@]}"
}

cmd_stop() {
  need_root stop
  if have_slurm; then
    stop_daemons
  fi
  stop_munge
  log "stopped"
}

main() {
  (($# == 1)) || { usage; exit 2; }
  case $1 in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
