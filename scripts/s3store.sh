#!/usr/bin/env bash
# scripts/s3store.sh — a real S3-compatible store for the tests and benches:
# a single-node Ceph (one monitor, one memstore OSD, radosgw on 127.0.0.1).
#
#   s3store.sh start DIR   start it with everything under DIR; print the env
#   s3store.sh env DIR     print the export lines of a running store
#   s3store.sh stop DIR    stop every daemon that start started
#
# Everything lives under DIR: ceph.conf, mon/ and osd/ data, log/ (one log
# per daemon plus its stdout/stderr in NAME.out), run/ (pid files, admin
# sockets) and env (the export lines). No systemd, no root, no disk set-up:
# the OSD keeps objects in RAM (memstore; about twice the stored bytes), so
# keep test data small. Pool size 1; cephx off. The shared tier (DESIGN.md
# §11) speaks S3 to it; the tests start one per session.
#
# Facts this depends on (Ceph 16, Debian 12):
#   - paxos_propose_interval 0.05: every pool creation waits one interval;
#     radosgw creates about six pools, so the default 1 s makes start ~15 s.
#   - with cephx off cluster-wide, radosgw still needs auth_client_required
#     = none and ms_mon_client_mode = crc in its own section or it hangs.
#   - curl --aws-sigv4 needs `x-amz-content-sha256: UNSIGNED-PAYLOAD`,
#     otherwise RGW answers 403 SignatureDoesNotMatch.
#
# Environment: S3STORE_TIMEOUT (s, default 60) bounds each wait at start.
set -euo pipefail

log() { printf '[s3store] %s\n' "$*" >&2; }
die() { printf '[s3store] error: %s\n' "$*" >&2; exit 1; }

usage() {
  echo "usage: $0 start DIR | stop DIR | env DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
[ -n "$2" ] || usage
[ "$cmd" != start ] || mkdir -p "$2"
[ -d "$2" ] || { printf '[s3store] error: no store in %s\n' "$2" >&2; exit 1; }
dir=$(cd "$2" && pwd)
conf=$dir/ceph.conf
timeout=${S3STORE_TIMEOUT:-60}
daemons=(rgw osd mon)           # run/NAME.pid, log/NAME.out
region=us-east-1                # RGW takes the region from the signature
uid=thaw

# ---- helpers -----------------------------------------------------------------

pidfile() { echo "$dir/run/$1.pid"; }

# alive NAME: the daemon NAME started from this DIR is running
alive() {
  local f pid
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && running "$pid" || return 1
  # the pid is ours only if its command line names this DIR's ceph.conf
  cmdline "$pid"
  case $cmd_line in *"-c $conf "*) return 0 ;; *) return 1 ;; esac
}

# free_ports: two distinct TCP ports on 127.0.0.1 that nothing listens on
# now (-S: without site-packages python starts in a tenth of the time)
free_ports() {
  python3 -S -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))'
}

# fail NAME MSG: report which daemon failed with the tail of its logs, then
# stop whatever was started
fail() {
  local name=$1 f
  shift
  {
    printf '[s3store] error: %s: %s\n' "$name" "$*"
    for f in "$dir/log/$name.out" "$dir/log/$name.log"; do
      [ -s "$f" ] || continue
      printf -- '---- last lines of %s\n' "$f"
      tail -n 20 "$f"
    done
  } >&2
  stop_all >/dev/null 2>&1 || true
  exit 1
}

# spawn NAME CMD...: run a daemon in the foreground mode of Ceph (-f), in its
# own session, detached from our terminal; record its pid
spawn() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$dir/log/$name.out" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

# wait_for NAME WHAT CMD...: poll CMD until it succeeds; fail if any daemon
# started so far dies, or NAME when the time runs out
wait_for() {
  local name=$1 what=$2 t0=$SECONDS d
  shift 2
  until "$@" >/dev/null 2>&1; do
    for d in "${daemons[@]}"; do
      [ ! -f "$(pidfile "$d")" ] || alive "$d" || fail "$d" "exited while waiting for $what"
    done
    [ $((SECONDS - t0)) -lt "$timeout" ] || fail "$name" "no $what after ${timeout}s"
    sleep 0.05
  done
}

ceph_cli() { ceph -c "$conf" --connect-timeout 10 "$@"; }

print_env() {
  [ -f "$dir/env" ] || die "no store in $dir (run: $0 start $dir)"
  cat "$dir/env"
}

# ---- stop --------------------------------------------------------------------

# running PID: PID is a live process. A zombie is not: the daemons outlive
# this script, so their parent is init, which may reap them only seconds
# after they died.
running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# cmdline PID: sets $cmd_line to the command line of PID, arguments
# followed by a space each (empty if PID is gone); no fork, so scanning
# /proc stays cheap
cmdline() {
  local -a args=()
  cmd_line=
  { mapfile -d '' -t args <"/proc/$1/cmdline"; } 2>/dev/null || return 0
  [ ${#args[@]} -eq 0 ] || printf -v cmd_line '%s ' "${args[@]}"
}

# stop_all: KILL every daemon of this DIR and wait until each is gone.
# KILL, not TERM: nothing is kept (the OSD holds its objects in RAM and start
# wipes DIR), and a clean stop costs ~2 s per daemon, one after the other
# (radosgw, then the OSD, then the monitor; together they wait on each other
# for 5 s or more). Any process whose command line names this DIR's
# ceph.conf and a daemon's name counts, so one whose pid file was lost is
# stopped as well.
stop_all() {
  local name pid p
  local -A pattern=() owner=()   # daemon -> command line; pid -> daemon
  for name in "${daemons[@]}"; do pattern[$name]="-c $conf -n $(ceph_name "$name") "; done
  for name in "${daemons[@]}"; do
    [ -f "$(pidfile "$name")" ] || continue
    pid=$(cat "$(pidfile "$name")")
    cmdline "$pid"
    # only ours: a recycled pid has another command line
    case $cmd_line in *"${pattern[$name]}"*) owner[$pid]=$name ;; esac
  done
  for p in /proc/[0-9]*; do
    cmdline "${p#/proc/}"
    for name in "${daemons[@]}"; do
      case $cmd_line in *"${pattern[$name]}"*) owner[${p#/proc/}]=$name ;; esac
    done
  done
  for pid in "${!owner[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${!owner[@]}"; do
    while running "$pid"; do sleep 0.05; done
    log "stopped ${owner[$pid]} (pid $pid)"
  done
  for name in "${daemons[@]}"; do rm -f "$(pidfile "$name")"; done
}

ceph_name() {
  case $1 in
    mon) echo mon.a ;;
    osd) echo osd.0 ;;
    rgw) echo client.rgw ;;
  esac
}

# ---- start -------------------------------------------------------------------

write_conf() {
  local mon_port=$1 rgw_port=$2 fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$conf" <<EOF
# written by scripts/s3store.sh: a single-node Ceph for tests, in RAM
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
run dir = $dir/run
admin socket = $dir/run/\$name.asok
crash dir = $dir/crash
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
log to stderr = false
err to stderr = true
keyring = $dir/keyring
# one OSD: pools of size 1, few placement groups, no balancing
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
# each pool creation waits one proposal interval (default 1 s)
paxos propose interval = 0.05
mon data = $dir/mon/\$name
mon data avail warn = 1
mon data avail crit = 0

[osd]
osd data = $dir/osd/\$name
osd objectstore = memstore
memstore device bytes = 1073741824
osd journal size = 0
osd max object name len = 460
osd max object namespace len = 64

[client]
log file = $dir/log/client.log

[client.rgw]
# with cephx off, radosgw still hangs at start without these two
auth client required = none
ms mon client mode = crc
log file = $dir/log/rgw.log
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw data = $dir/rgw
rgw dns name = 127.0.0.1
rgw enable usage log = false
EOF
}

start_all() {
  local name running=0 mon_port rgw_port uuid t0 key secret port
  for name in "${daemons[@]}"; do
    if alive "$name"; then running=$((running + 1)); fi
  done
  if [ $running -eq ${#daemons[@]} ] && [ -f "$dir/env" ]; then
    log "already running in $dir"
    print_env
    return 0
  fi
  if [ $running -gt 0 ]; then
    die "$dir holds a partly running store ($running of ${#daemons[@]} daemons); run: $0 stop $dir"
  fi
  for name in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool python3 curl setsid; do
    command -v "$name" >/dev/null 2>&1 || die "$name not found (install: ceph-mon ceph-osd radosgw ceph-common; see scripts/setup.sh)"
  done

  t0=$(date +%s.%N)
  rm -rf "$dir/mon" "$dir/osd" "$dir/rgw" "$dir/run" "$dir/log" "$dir/crash" "$dir/env" "$dir/monmap" "$dir/keyring"
  mkdir -p "$dir/mon/mon.a" "$dir/osd/osd.0" "$dir/rgw" "$dir/run" "$dir/log" "$dir/crash"
  chmod 0700 "$dir"
  read -r mon_port rgw_port < <(free_ports)
  write_conf "$mon_port" "$rgw_port"
  : >"$dir/keyring"

  # monitor
  monmaptool --create --clobber --fsid "$(sed -n 's/^fsid = //p' "$conf")" \
    --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >"$dir/log/mon.out" 2>&1 \
    || fail mon "monmaptool failed"
  ceph-mon -c "$conf" -n mon.a --mkfs --monmap "$dir/monmap" >>"$dir/log/mon.out" 2>&1 \
    || fail mon "ceph-mon --mkfs failed"
  spawn mon ceph-mon -f -c "$conf" -n mon.a

  # OSD: registered with the monitor (the client waits for it to answer:
  # no separate wait, each ceph CLI call costs ~0.4 s), then formatted in RAM
  uuid=$(cat /proc/sys/kernel/random/uuid)
  if [ "$(ceph_cli osd new "$uuid" 2>"$dir/log/osd.out")" != 0 ]; then
    alive mon || fail mon "exited at start"
    fail osd "ceph osd new did not give id 0"
  fi
  ceph-osd -c "$conf" -n osd.0 --mkfs --osd-uuid "$uuid" >>"$dir/log/osd.out" 2>&1 \
    || fail osd "ceph-osd --mkfs failed"
  spawn osd ceph-osd -f -c "$conf" -n osd.0

  # radosgw: creates its pools (its requests wait for the OSD to be up),
  # then serves S3
  spawn rgw radosgw -f -c "$conf" -n client.rgw
  wait_for rgw "HTTP answer on 127.0.0.1:$rgw_port" \
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$rgw_port/"

  # an S3 user with fresh credentials
  key=$(od -An -tx1 -N10 /dev/urandom | tr -d ' \n' | tr a-f A-F)
  secret=$(od -An -tx1 -N20 /dev/urandom | tr -d ' \n')
  radosgw-admin -c "$conf" -n client.rgw --log-file "$dir/log/radosgw-admin.log" \
    user create --uid "$uid" --display-name "thaw tests" \
    --access-key "$key" --secret-key "$secret" >"$dir/log/radosgw-admin.out" 2>&1 \
    || fail radosgw-admin "user create failed"

  port=$rgw_port
  cat >"$dir/env.tmp" <<EOF
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=$region
export THAW_S3_ENDPOINT=http://127.0.0.1:$port
EOF
  chmod 0600 "$dir/env.tmp"
  mv "$dir/env.tmp" "$dir/env"
  log "ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s: http://127.0.0.1:$port (mon $(cat "$(pidfile mon)"), osd $(cat "$(pidfile osd)"), rgw $(cat "$(pidfile rgw)"))"
  print_env
}

# ---- main --------------------------------------------------------------------

case $cmd in
  start) start_all ;;
  stop)
    [ -f "$conf" ] || die "no store in $dir"
    stop_all
    # the monitor's store (~40 MB allocated) means nothing without the OSD's
    # RAM; logs and ceph.conf stay for a look after a failure
    rm -rf "$dir/env" "$dir/mon" "$dir/osd"
    ;;
  env) print_env ;;
  *) usage ;;
esac
