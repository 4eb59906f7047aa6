#!/usr/bin/env bash
# cluster.sh - start, stop or inspect a real local Slurm cluster (munged, slurmctld, one slurmd per
# node in its own network namespace) built from Debian's packages; all state under one base folder.
#
# Usage: slurm/cluster.sh start|stop|status [--nodes N] [--cpus C] [--gpus G] [--rate R]
#                                            [--rate-node N=R]... [--requeue-delay S] [--mpi-default M]
#   --nodes N   compute nodes node1..nodeN (default 2, at most 50)
#   --cpus C    CPUs each node declares to Slurm (default 4; more than the real cores is fine)
#   --gpus G    placeholder "GPUs" per node declared as gres/gpu (default 0). They are aliases of
#               /dev/null, not GPUs: they let jobs with GPU directives be scheduled on a CPU machine.
#   --rate R    limit every node's link to R in each direction (tc tbf on both ends of its veth),
#               e.g. 1gbit (about 115 MB/s) or 100mbit; default: no limit (about 1.3 GB/s)
#   --rate-node N=R  node N's link limited to R instead (repeatable), e.g. --rate-node 3=100mbit
#               with --rate 1gbit: one node 10x slower than the others
#   --requeue-delay S   seconds a requeued job waits before it may start again (AuthInfo's
#               cred_expire, which is also the job step credential lifetime; default Slurm's 120)
#   --mpi-default M  slurm.conf's MpiDefault: none (Slurm's own default: srun needs --mpi=pmix for
#               Open MPI programs) or pmix (default here)
# The nodes share this machine's cores: with more ranks than cores, compute-bound figures
# (samples/s, step times) fall with every rank added; `start` says so when it applies.
# Environment: DDP_SLURM_BASE (default /tmp/ddp-slurm), DDP_SLURM_PORT (slurmctld port, default
#   16817; slurmd uses PORT+1), DDP_SLURM_WAIT (seconds to wait for idle nodes, default 30).
# After `start`, use the cluster with:  source $DDP_SLURM_BASE/env.sh   (sets SLURM_CONF and the
# Open MPI settings that namespace nodes need), then sinfo, srun, sbatch, mpirun as usual.
# Needs root; installs nothing: a missing program is reported with the Debian package to install.
# One cluster per machine (fixed ports and network names): `start` stops one from another base.
set -euo pipefail

BASE=${DDP_SLURM_BASE:-/tmp/ddp-slurm}
CTLD_PORT=${DDP_SLURM_PORT:-16817}
SLURMD_PORT=$((CTLD_PORT + 1))
WAIT_S=${DDP_SLURM_WAIT:-30}
NODES=2
CPUS=4
GPUS=0
RATE=""                 # tc rate of every node's link, empty = unlimited
declare -A NODE_RATE=() # node number -> tc rate that replaces RATE for that node
REQUEUE_DELAY=""        # AuthInfo cred_expire, empty = Slurm's default (120 s)
MPI_DEFAULT=pmix        # slurm.conf's MpiDefault
NET=10.200.0            # bridge 10.200.0.1/24; nodeN is 10.200.0.(10+N)
BRIDGE=ddpbr0           # names of everything this script creates start with "ddp"
NS_PREFIX=ddp-node
CTL_HOST=$(hostname -s)
# The ports, bridge and namespace names are machine-wide, so one cluster runs at a time; this file
# names the base folder of the running one.
ACTIVE=/tmp/ddp-slurm.active

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit "${1:-0}"
}

# need CMD PACKAGE: fail with the Debian package to install when CMD is missing.
need() {
    command -v "$1" >/dev/null 2>&1 || [[ -x "$1" ]] ||
        die "'$1' not found: apt-get install -y --no-install-recommends $2"
}

check_prereqs() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, munged, slurmd)"
    need munged munge; need mungekey munge
    need slurmctld slurmctld; need slurmd slurmd
    need sinfo slurm-client; need scontrol slurm-client; need srun slurm-client
    need ip iproute2; need nsenter util-linux; need unshare util-linux
    [[ -z $RATE && ${#NODE_RATE[@]} -eq 0 ]] || need tc iproute2
    need mpirun openmpi-bin
    # Slurm's mpi/pmix plugin dlopens this library at run time; only the -dev package ships it.
    local pmix=/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so
    [[ -e $pmix ]] || die "$pmix missing (srun --mpi=pmix needs it): apt-get install -y libpmix-dev"
}

# proc_alive PID: true when PID names a running process; zombies (reaped slowly here) count as dead.
proc_alive() {
    local stat
    stat=$(ps -o stat= -p "$1" 2>/dev/null || true)
    [[ -n $stat && $stat != Z* ]]
}

# pid_of PIDFILE: print the pid in PIDFILE, or nothing (daemons delete their own file on exit).
pid_of() { cat "$1" 2>/dev/null || true; }

# stop_pid PIDFILE NAME: SIGTERM, wait up to 5 s, then SIGKILL.
stop_pid() {
    local pid i
    pid=$(pid_of "$1")
    if [[ -n $pid ]] && proc_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            proc_alive "$pid" || break
            sleep 0.1
        done
        if proc_alive "$pid"; then
            log "$2 (pid $pid) ignored SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$1"
}

write_conf() {
    local n
    {
        echo "# slurm.conf written by slurm/cluster.sh for a local test cluster; rewritten on start."
        echo "ClusterName=ddp"
        echo "SlurmctldHost=$CTL_HOST($NET.1)"
        echo "SlurmUser=root"
        echo "MailProg=/bin/true"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$BASE/munge/munge.socket${REQUEUE_DELAY:+,cred_expire=$REQUEUE_DELAY}"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "StateSaveLocation=$BASE/ctld/state"
        echo "SlurmctldPidFile=$BASE/ctld/slurmctld.pid"
        echo "SlurmctldLogFile=$BASE/ctld/slurmctld.log"
        echo "SlurmdSpoolDir=$BASE/%n/spool"
        echo "SlurmdPidFile=$BASE/%n/slurmd.pid"
        echo "SlurmdLogFile=$BASE/%n/slurmd.log"
        echo "# Every node sees the same /tmp: give each its own TmpFS, or multi-node PMIx steps fail"
        echo "# with 'Cannot create directory /tmp/spmix_appdir_...: File exists'."
        echo "TmpFS=$BASE/%n/tmp"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "# config_overrides: a node may declare more CPUs than the machine has cores."
        echo "SlurmdParameters=config_overrides"
        echo "MpiDefault=$MPI_DEFAULT"
        echo "ReturnToService=2"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=30"
        echo "KillWait=5"
        ((GPUS == 0)) || echo "GresTypes=gpu"
        for ((n = 1; n <= NODES; n++)); do
            local gres=""
            ((GPUS == 0)) || gres=" Gres=gpu:$GPUS"
            echo "NodeName=node$n NodeAddr=$NET.$((10 + n)) CPUs=$CPUS RealMemory=2048$gres State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$BASE/slurm.conf"
    if ((GPUS > 0)); then
        # Slurm wants character devices; these have /dev/null's numbers (1,3), so nothing can
        # be harmed through them. Slurm then sets CUDA_VISIBLE_DEVICES per task as on a GPU node.
        echo "# gres.conf: placeholder GPUs (aliases of /dev/null) so GPU directives can be scheduled." \
            >"$BASE/gres.conf"
        echo "AutoDetect=off" >>"$BASE/gres.conf"
        echo "Name=gpu File=$BASE/fakegpu/nvidia[0-$((GPUS - 1))]" >>"$BASE/gres.conf"
        rm -rf "$BASE/fakegpu"
        mkdir -p "$BASE/fakegpu"
        for ((n = 0; n < GPUS; n++)); do
            mknod "$BASE/fakegpu/nvidia$n" c 1 3 || die "mknod failed: cannot fake GPUs here (use --gpus 0)"
        done
    else
        rm -f "$BASE/gres.conf"
    fi
}

write_env() {
    cat >"$BASE/env.sh" <<EOF
# env.sh written by slurm/cluster.sh: source it to use the local Slurm cluster in $BASE.
export SLURM_CONF=$BASE/slurm.conf
# Open MPI as root, and only over the nodes' bridge network (each node is a network namespace).
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=$NET.0/24
export OMPI_MCA_oob_tcp_if_include=$NET.0/24
export OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# The nodes share this machine's cores and declare more CPUs than it has: ranks started by srun
# cannot tell they are oversubscribed, and Open MPI's busy-polling then starves the ranks that
# compute (measured: 4 ranks on 2 cores trained 8x slower). Yield the core while waiting.
export OMPI_MCA_mpi_yield_when_idle=1
# Large messages as plain send/receive fragments: Open MPI's TCP BTL otherwise emulates RDMA puts
# for them (ob1's RDMA pipeline), whose control messages queue behind the other direction's data on
# a shaped link; an all-reduce then ran at half the link's rate (2 ranks, 8 MiB over 1gbit: 130 ms
# = 65 MB/s; without put 71-90 ms, a raw TCP exchange 76 ms). A second connection per peer
# (btl_tcp_links=2) also reached 71 ms, but jobs fell back to 127 ms steps partway through.
export OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum,hetero-rdma
# The ring all-reduce for every size (what NCCL runs across nodes, and what benchmarks/costmodel.py
# models). Open MPI's fixed decision rules pick other algorithms here that move less over TCP: at
# 4 ranks, 8 MiB took 208 ms by default and 118 ms as a ring (ideal 107 ms at 118 MB/s).
export OMPI_MCA_coll_tuned_use_dynamic_rules=1
export OMPI_MCA_coll_tuned_allreduce_algorithm=4
export OPENBLAS_NUM_THREADS=1
EOF
}

start_munge() {
    mkdir -p "$BASE/munge"
    chmod 755 "$BASE" "$BASE/munge"
    [[ -s $BASE/munge/munge.key ]] || mungekey -c -k "$BASE/munge/munge.key"
    chmod 400 "$BASE/munge/munge.key"
    munged --force -S "$BASE/munge/munge.socket" --key-file="$BASE/munge/munge.key" \
        --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/munge/munged.log" \
        --seed-file="$BASE/munge/munged.seed" ||
        die "munged failed to start; log: $(tail -n 5 "$BASE/munge/munged.log" 2>/dev/null)"
}

make_network() {
    local n ns
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    {
        echo "127.0.0.1 localhost"
        echo "$NET.1 $CTL_HOST"
        for ((n = 1; n <= NODES; n++)); do echo "$NET.$((10 + n)) node$n"; done
    } >"$BASE/hosts"
    for ((n = 1; n <= NODES; n++)); do
        ns=$NS_PREFIX$n
        ip netns add "$ns"
        ip link add "ddpv$n" type veth peer name eth0 netns "$ns"
        ip link set "ddpv$n" master "$BRIDGE" up
        ip -n "$ns" addr add "$NET.$((10 + n))/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$NET.1"
        local rate=${NODE_RATE[$n]:-$RATE}
        [[ -z $rate ]] || limit_link "$n" "$rate"
    done
}

# limit_link N RATE: token-bucket limit RATE on both ends of node N's veth (tbf shapes egress only: the
# root-side end limits traffic into the node, eth0 inside the namespace traffic out of it).
limit_link() {
    local tbf=(root tbf rate "$2" burst 256kb latency 10ms)
    tc qdisc add dev "ddpv$1" "${tbf[@]}" || die "tc tbf rate $2 on ddpv$1 failed"
    tc -n "$NS_PREFIX$1" qdisc add dev eth0 "${tbf[@]}" || die "tc tbf rate $2 on node$1's eth0 failed"
}

# Start slurmd for node N inside its network namespace, with its own hostname (UTS namespace) and
# a private /etc/hosts (mount namespace). `ip netns exec` is not used: it remounts /sys and slurmd
# then finds no cgroup file system.
start_slurmd() {
    local n=$1
    mkdir -p "$BASE/node$n/spool" "$BASE/node$n/tmp"
    chmod 755 "$BASE/node$n/spool"
    chmod 1777 "$BASE/node$n/tmp"
    nsenter --net="/run/netns/$NS_PREFIX$n" unshare --uts --mount --propagation private \
        sh -c "hostname node$n && mount --bind '$BASE/hosts' /etc/hosts &&
               exec slurmd -f '$BASE/slurm.conf' -N node$n" ||
        die "slurmd for node$n failed to start; log:$(echo; tail -n 20 "$BASE/node$n/slurmd.log" 2>/dev/null)"
}

# Wait until sinfo reports every node idle; on timeout print the daemons' log tails and fail.
wait_idle() {
    local deadline=$((SECONDS + WAIT_S)) idle=0 n
    local why="after ${WAIT_S}s"
    while ((SECONDS < deadline)); do
        idle=$(SLURM_CONF=$BASE/slurm.conf sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
        ((idle >= NODES)) && return 0
        if ! proc_alive "$(pid_of "$BASE/ctld/slurmctld.pid")"; then why="(slurmctld died)"; break; fi
        sleep 0.2
    done
    {
        echo "cluster.sh: error: only $idle of $NODES nodes idle $why"
        SLURM_CONF=$BASE/slurm.conf sinfo -N -l 2>&1 || true
        echo "--- tail of $BASE/ctld/slurmctld.log"
        tail -n 20 "$BASE/ctld/slurmctld.log" 2>/dev/null || true
        for ((n = 1; n <= NODES; n++)); do
            echo "--- tail of $BASE/node$n/slurmd.log"
            tail -n 10 "$BASE/node$n/slurmd.log" 2>/dev/null || true
        done
    } >&2
    return 1
}

# A cluster started from another base folder holds the ports and network names: stop it first.
stop_other_cluster() {
    local other
    other=$(cat "$ACTIVE" 2>/dev/null || true)
    [[ -n $other && $other != "$BASE" && -d $other ]] || return 0
    log "stopping the cluster in $other first (one cluster per machine)"
    DDP_SLURM_BASE=$other "$0" stop || log "warning: could not stop the cluster in $other"
}

# Namespace nodes are not machines: say when the CPUs they declare exceed the real cores.
note_shared_cores() {
    local cores n rates=""
    cores=$(nproc)
    for n in "${!NODE_RATE[@]}"; do rates+=" node$n=${NODE_RATE[$n]}"; done
    [[ -z $rates ]] || log "per-node link limits:$rates"
    ((NODES * CPUS > cores)) || return 0
    log "note: the $NODES nodes declare $((NODES * CPUS)) CPUs but share this machine's $cores cores:" \
        "with more ranks than $cores, ranks compete for cores and compute-bound figures (samples/s," \
        "step times) fall with every rank added; link-bound figures stay meaningful"
}

cmd_start() {
    local n t0=$EPOCHREALTIME
    check_prereqs
    stop_other_cluster
    cmd_stop quiet
    # From here on a failed start stops whatever it did start (network, daemons), and the marker
    # lets a later start from another base find and stop it.
    echo "$BASE" >"$ACTIVE"
    trap 'cmd_stop quiet' EXIT
    # A fresh controller numbers jobs from 1 again: slurmd's spool of an earlier run would then
    # reject the new job 1 ("Job credential revoked"), so nodes start from empty folders.
    rm -rf "$BASE"/node[0-9]*
    rm -f "$BASE"/ctld/*.log "$BASE"/munge/munged.log
    mkdir -p "$BASE/ctld/state"
    write_conf
    write_env
    start_munge
    make_network
    slurmctld -c -i -f "$BASE/slurm.conf" ||
        die "slurmctld failed to start; log:$(echo; tail -n 20 "$BASE/ctld/slurmctld.log" 2>/dev/null)"
    for ((n = 1; n <= NODES; n++)); do start_slurmd "$n"; done
    wait_idle || exit 1
    trap - EXIT
    note_shared_cores
    log "cluster up: $NODES nodes x $CPUS CPUs$( ((GPUS == 0)) || echo " x $GPUS placeholder GPUs")$([[ -z $RATE ]] || echo ", links limited to $RATE"), MpiDefault=$MPI_DEFAULT in $BASE ($(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s)"
    echo "export SLURM_CONF=$BASE/slurm.conf    # or: source $BASE/env.sh"
}

# Kill every process still inside one of our network namespaces (job tasks, strays), then
# delete the namespaces, the veths and the bridge. A veth usually goes with its namespace, but a
# namespace outlives `ip netns del` while the kernel still holds its sockets (TCP retransmitting to a
# node whose link was taken down: measured over a minute), and its veth with it: our end is deleted
# by name, so the next start can create it again.
remove_network() {
    local ns link pids=()
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NS_PREFIX}[0-9]*\$" || true); do
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
        ((${#pids[@]} == 0)) || kill -KILL "${pids[@]}" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep '^ddpv[0-9]*$' || true); do
        ip link del "$link" 2>/dev/null || log "could not delete the leftover link $link"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

cmd_stop() {
    local quiet=${1:-} f
    for f in "$BASE"/node*/slurmd.pid; do
        if [[ -e $f ]]; then stop_pid "$f" "slurmd ${f#"$BASE"/}"; fi
    done
    stop_pid "$BASE/ctld/slurmctld.pid" slurmctld
    stop_pid "$BASE/munge/munged.pid" munged
    remove_network
    rm -rf "$BASE/ctld/state"
    if [[ $(cat "$ACTIVE" 2>/dev/null || true) == "$BASE" ]]; then rm -f "$ACTIVE"; fi
    [[ -n $quiet ]] || log "cluster in $BASE stopped"
}

cmd_status() {
    local f pid up=0
    for f in "$BASE/munge/munged.pid" "$BASE/ctld/slurmctld.pid" "$BASE"/node*/slurmd.pid; do
        pid=$(pid_of "$f")
        [[ -n $pid ]] || continue
        if proc_alive "$pid"; then echo "running: ${f#"$BASE"/} (pid $pid)"; up=1
        else echo "dead:    ${f#"$BASE"/} (pid $pid)"; fi
    done
    ((up)) || { echo "no cluster running in $BASE"; return 1; }
    SLURM_CONF=$BASE/slurm.conf sinfo -N -l
    echo "export SLURM_CONF=$BASE/slurm.conf    # or: source $BASE/env.sh"
}

check_rate() {
    [[ $1 =~ ^[0-9]+(\.[0-9]+)?[kmgt]?(bit|bps)$ ]] ||
        die "a link rate must be a tc rate such as 1gbit, 500mbit or 100mbit (got '$1')"
}

main() {
    (($# >= 1)) || usage 2
    local n
    local cmd=$1
    shift
    while (($#)); do
        case $1 in
            --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
            --cpus) CPUS=${2:?--cpus needs a number}; shift 2 ;;
            --gpus) GPUS=${2:?--gpus needs a number}; shift 2 ;;
            --rate) RATE=${2:?--rate needs a rate, e.g. 1gbit}; shift 2 ;;
            --rate-node)
                [[ ${2:-} =~ ^([1-9][0-9]*)=(.+)$ ]] ||
                    die "--rate-node takes NODE=RATE, e.g. --rate-node 3=100mbit (got '${2:-}')"
                n=${BASH_REMATCH[1]}
                NODE_RATE[$n]=${BASH_REMATCH[2]}
                check_rate "${NODE_RATE[$n]}"
                shift 2 ;;
            --requeue-delay) REQUEUE_DELAY=${2:?--requeue-delay needs seconds}; shift 2 ;;
            --mpi-default) MPI_DEFAULT=${2:?--mpi-default needs none or pmix}; shift 2 ;;
            -h | --help) usage 0 ;;
            *) die "unknown option '$1' (try --help)" ;;
        esac
    done
    if ! [[ $NODES =~ ^[1-9][0-9]*$ ]] || ((NODES > 50)); then die "--nodes must be 1..50"; fi
    [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "--cpus must be a positive number"
    [[ $GPUS =~ ^[0-9]+$ ]] || die "--gpus must be a number"
    [[ -z $REQUEUE_DELAY || $REQUEUE_DELAY =~ ^[1-9][0-9]*$ ]] || die "--requeue-delay must be seconds"
    [[ $MPI_DEFAULT == none || $MPI_DEFAULT == pmix ]] ||
        die "--mpi-default must be none or pmix (got '$MPI_DEFAULT')"
    [[ -z $RATE ]] || check_rate "$RATE"
    for n in "${!NODE_RATE[@]}"; do
        ((n <= NODES)) || die "--rate-node $n=${NODE_RATE[$n]}: there are only $NODES nodes (--nodes)"
    done
    case $cmd in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        -h | --help) usage 0 ;;
        *) die "unknown command '$cmd' (start|stop|status)" ;;
    esac
}

main "$@"
