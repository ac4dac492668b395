#!/usr/bin/env bash
# The servers of the side-by-side benchmarks, shared by scripts/bench-vs (`make compare`) and
# scripts/bench-python (`make compare-python`), which source this file: installing Debian's etcd
# and ZooKeeper, starting a 5-member etcd, a 5-server ZooKeeper ensemble and `warden dev` (plus
# 16 shard groups /bench/p0 … /bench/p15) on loopback, waiting until each answers, and stopping
# them. Sourcing it defines functions and variables only; it starts nothing.
#
# The sourcing script provides:
#   log, die            its messages (die exits)
#   work_dir            data directories and server logs
#   results_dir         where start_zookeeper copies one server's zoo.cfg
#   commands_file       where record_command appends each command line
#   startup_deadline_s  how long wait_until waits for a cluster
#   CARGO_TARGET_DIR    where the warden binary is (release/warden)
#   server_quota, cgroup_cap
#                       optional: when server_quota is set, each etcd member and ZooKeeper server
#                       is moved into a CPU cgroup of its own (bench-vs's isolated-nodes runs)
# and sets `trap stop_servers EXIT` (with anything else it cleans up) so no server outlives it.

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

# ---------------------------------------------------------------------------------------------
# Packages

# Installs Debian's etcd (server and etcdctl) and ZooKeeper when missing, without letting their
# packages start system services: those would hold the ports used here (2379, 2181) and take
# CPU during the runs.
install_servers() {
  local missing=()
  dpkg -s etcd-server >/dev/null 2>&1 || missing+=(etcd-server)
  dpkg -s etcd-client >/dev/null 2>&1 || missing+=(etcd-client)
  dpkg -s zookeeper >/dev/null 2>&1 || missing+=(zookeeper)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    # policy-rc.d exiting 101 tells invoke-rc.d and deb-systemd-invoke not to start services.
    local policy=/usr/sbin/policy-rc.d placed_policy=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
      "${sudo_cmd[@]}" chmod 755 "$policy"
      placed_policy=1
    fi
    local status=0
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || status=$?
    if [ "$status" -eq 0 ]; then
      "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null || status=$?
    fi
    if [ "$placed_policy" -eq 1 ]; then "${sudo_cmd[@]}" rm -f "$policy"; fi
    [ "$status" -eq 0 ] || die "apt-get failed (status $status)"
  fi
  # Services installed earlier (or started despite the policy) are stopped and disabled.
  if [ -d /run/systemd/system ]; then
    local unit
    for unit in etcd zookeeper; do
      if systemctl list-unit-files "$unit.service" >/dev/null 2>&1 && systemctl is-enabled --quiet "$unit.service" 2>/dev/null; then
        log "disabling the system service $unit"
        "${sudo_cmd[@]}" systemctl disable --now "$unit.service" >/dev/null 2>&1 || true
      fi
      if systemctl is-active --quiet "$unit.service" 2>/dev/null; then
        "${sudo_cmd[@]}" systemctl stop "$unit.service" >/dev/null 2>&1 || true
      fi
    done
  elif [ -x /etc/init.d/etcd ] && /etc/init.d/etcd status >/dev/null 2>&1; then
    log "stopping the system service etcd"
    "${sudo_cmd[@]}" /etc/init.d/etcd stop >/dev/null 2>&1 || true
  fi
}

# ---------------------------------------------------------------------------------------------
# Process bookkeeping: the servers started here, which the sourcing script stops on exit.

server_pids=()

# Stops the processes in server_pids (TERM, then KILL after a deadline) and forgets them.
stop_servers() {
  local pid deadline
  [ ${#server_pids[@]} -gt 0 ] || return 0
  for pid in "${server_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 20))
  for pid in "${server_pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid did not stop after TERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  server_pids=()
}

# Fails when something already listens on a port a cluster needs (a system service, or a
# leftover of an earlier run), rather than benchmarking a stranger.
require_free_ports() {
  local port
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port is already in use; stop whatever listens there (a system service, or a leftover of an earlier run)"
    fi
  done
}

# Runs "$@" until it succeeds or the startup deadline passes; the name says what is awaited.
wait_until() {
  local what=$1
  shift
  local deadline=$((SECONDS + startup_deadline_s))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      die "$what not ready after ${startup_deadline_s}s (logs in $work_dir)"
    fi
    local pid
    for pid in "${server_pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || die "$what: server pid $pid exited during startup (logs in $work_dir)"
    done
    sleep 0.5
  done
}

# Appends a command line to the run's list of exact commands, single-quoting the arguments
# that need it (printf %q would also escape every comma of the endpoint lists).
record_command() {
  local arg line=""
  for arg in "$@"; do
    if [[ ! "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then arg="'${arg//\'/\'\\\'\'}'"; fi
    line+="${line:+ }$arg"
  done
  echo "$line" >>"$commands_file"
}

# ---------------------------------------------------------------------------------------------
# etcd: 5 members on loopback, client port 2379+10i, peer port 2380+10i.

etcd_members=5
etcd_endpoints=""

start_etcd() {
  local i cluster="" ports=()
  for ((i = 0; i < etcd_members; i++)); do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:$((2380 + 10 * i))"
    ports+=($((2379 + 10 * i)) $((2380 + 10 * i)))
  done
  require_free_ports "${ports[@]}"
  mkdir -p "$work_dir/etcd"
  etcd_endpoints=""
  for ((i = 0; i < etcd_members; i++)); do
    local client="http://127.0.0.1:$((2379 + 10 * i))" peer="http://127.0.0.1:$((2380 + 10 * i))"
    local cmd=(etcd --name "m$i" --data-dir "$work_dir/etcd/m$i"
      --listen-client-urls "$client" --advertise-client-urls "$client"
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer"
      --initial-cluster "$cluster" --initial-cluster-token warden-compare --initial-cluster-state new)
    record_command "${cmd[@]}"
    "${cmd[@]}" >"$work_dir/etcd/m$i.log" 2>&1 &
    server_pids+=($!)
    [ -z "${server_quota:-}" ] || cgroup_cap "etcd-m$i" $!
    etcd_endpoints+="${etcd_endpoints:+,}127.0.0.1:$((2379 + 10 * i))"
  done
  wait_until "etcd cluster" env ETCDCTL_API=3 etcdctl --endpoints="$etcd_endpoints" --command-timeout=3s endpoint health --cluster
  log "etcd: $etcd_members members healthy ($etcd_endpoints)"
}

# ---------------------------------------------------------------------------------------------
# ZooKeeper: 5 servers on loopback, client port 2181+i, quorum 2888+i, election 3888+i.

zk_servers=5
zk_endpoints=""

# The classpath of Debian's zookeeper package, as /usr/share/zookeeper/bin/zkEnv.sh sets it;
# zookeeper.jar's manifest names its dependencies. Debian ships no SLF4J binding on it (the
# server logs nothing); slf4j-simple (from libslf4j-java, a dependency) at level warn puts
# warnings and errors in the server's log without the cost of INFO logging.
zk_classpath() {
  local cp="/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
  [ -f /usr/share/java/slf4j-simple.jar ] && cp+=":/usr/share/java/slf4j-simple.jar"
  echo "$cp"
}

# Asks a ZooKeeper server a four-letter word and prints the answer.
# (A subshell, so a refused connection fails the function rather than the script.)
zk_4lw() (
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf '%s' "$2" >&3
  timeout 5 cat <&3
)

# Succeeds when every server answers `srvr` as leader or follower and exactly one leads.
zk_quorum_ready() {
  local i answer leaders=0
  for ((i = 0; i < zk_servers; i++)); do
    answer=$(zk_4lw $((2181 + i)) srvr) || return 1
    case "$answer" in
      *"Mode: leader"*) leaders=$((leaders + 1)) ;;
      *"Mode: follower"*) ;;
      *) return 1 ;;
    esac
  done
  [ "$leaders" -eq 1 ]
}

start_zookeeper() {
  local i servers="" ports=()
  for ((i = 0; i < zk_servers; i++)); do
    servers+="server.$((i + 1))=127.0.0.1:$((2888 + i)):$((3888 + i))"$'\n'
    ports+=($((2181 + i)) $((2888 + i)) $((3888 + i)))
  done
  require_free_ports "${ports[@]}"
  local classpath
  classpath=$(zk_classpath)
  zk_endpoints=""
  for ((i = 0; i < zk_servers; i++)); do
    local dir="$work_dir/zookeeper/s$((i + 1))"
    mkdir -p "$dir/data"
    echo $((i + 1)) >"$dir/data/myid"
    # Defaults everywhere that matters for durability (forceSync=yes: fsync per commit).
    # maxClientCnxns=0 lifts the default limit of 60 connections per client address, which
    # all loopback clients share; the admin HTTP server (port 8080) is off so 5 servers fit.
    cat >"$dir/zoo.cfg" <<EOF
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=$((2181 + i))
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
$servers
EOF
    # The heap is zkEnv.sh's default (ZK_SERVER_HEAP=1000 MiB).
    local cmd=(java -Xmx1000m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dzookeeper.log.dir="$dir" -cp "$classpath"
      org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg")
    record_command "${cmd[@]}"
    "${cmd[@]}" >"$dir/server.log" 2>&1 &
    server_pids+=($!)
    [ -z "${server_quota:-}" ] || cgroup_cap "zookeeper-s$((i + 1))" $!
    zk_endpoints+="${zk_endpoints:+,}127.0.0.1:$((2181 + i))"
  done
  # The report shows one server's configuration (the others differ only in ports and paths).
  cp "$work_dir/zookeeper/s1/zoo.cfg" "$results_dir/zookeeper-s1.cfg"
  wait_until "ZooKeeper ensemble" zk_quorum_ready
  log "zookeeper: $zk_servers servers, one leader ($zk_endpoints)"
}

# ---------------------------------------------------------------------------------------------
# Warden: `warden dev` (5 nodes, placement, a router on 127.0.0.1:7100) plus 16 shard groups.

warden_bin="$CARGO_TARGET_DIR/release/warden"
warden_endpoints=127.0.0.1:7100
warden_groups=16

# Succeeds when every group of the routing table is ready and /bench/p0 … /bench/p15 are among them.
warden_groups_ready() {
  local groups
  groups=$("$warden_bin" --endpoints "$warden_endpoints" --timeout 3000 admin groups --json) || return 1
  python3 - "$groups" "$warden_groups" <<'PY'
import json, sys
rows = [json.loads(line) for line in sys.argv[1].splitlines() if line.strip()]
wanted = {f"/bench/p{i}" for i in range(int(sys.argv[2]))}
sys.exit(0 if wanted <= {r.get("prefix") for r in rows} and all(r.get("ready") is True for r in rows) else 1)
PY
}

start_warden() {
  require_free_ports 7100 7101 7102 7103 7104 7105 2379
  mkdir -p "$work_dir"
  local cmd=("$warden_bin" dev --fresh --data-dir "$work_dir/warden")
  record_command "${cmd[@]}"
  "${cmd[@]}" >"$work_dir/warden-dev.log" 2>&1 &
  server_pids+=($!)
  wait_until "warden router" "$warden_bin" --endpoints "$warden_endpoints" --timeout 2000 ls /
  local i
  for ((i = 0; i < warden_groups; i++)); do
    cmd=("$warden_bin" --endpoints "$warden_endpoints" admin create-group "/bench/p$i")
    record_command "${cmd[@]}"
    "${cmd[@]}" >/dev/null || die "creating the shard group /bench/p$i failed"
  done
  wait_until "warden shard groups" warden_groups_ready
  log "warden: $warden_groups shard groups ready (router $warden_endpoints)"
}

# The processes whose CPU time counts as the server's: those started here and their children
# (`warden dev` may run nodes as child processes).
server_pid_list() {
  local pid children list=""
  for pid in "${server_pids[@]}"; do
    list+="${list:+,}$pid"
    children=$(ps -o pid= --ppid "$pid" 2>/dev/null | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
    [ -n "$children" ] && list+=",$children"
  done
  echo "$list"
}
