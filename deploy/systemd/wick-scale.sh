#!/usr/bin/env bash
# deploy/systemd/wick-scale.sh - start a wick worker on this node when its queue has work:
# the bare-metal counterpart of KEDA. The worker stops itself (idle exit), so this only ever
# starts units.
#
#   wick-scale.sh --queue URL --unit wick-worker@jobs.service [--lease S] [--interval S]
#                 [--once] [--dry-run]
#
# Work, per queue kind (the same rules as deploy/k8s):
#   spool:DIR      a job in DIR/new, or a claim in DIR/claimed whose lease expired or whose
#                  process is gone (the next worker reclaims it)
#   redis://HOST:PORT/STREAM?group=G (or rediss://: TLS, with the worker's WICK_REDIS_CA_FILE,
#                  WICK_REDIS_CERT_FILE and WICK_REDIS_KEY_FILE)
#                  the group's lag (XINFO GROUPS, Redis >= 7: entries never delivered), or a
#                  pending entry idle longer than --lease (XPENDING IDLE: its worker died or
#                  drained it back)
# SQS and RunPod queues are scaled by their platform (KEDA, RunPod), not by this script.
#
# When there is work and the unit is not active, `systemctl start --no-block UNIT`. Every
# check prints one line: "work N (why)" or "idle". --once checks once and exits 0 when there
# was work, 1 when idle (for cron and tests); --dry-run prints what it would start.
# Exit 2 on a usage error or an unreachable queue.
set -uo pipefail

queue="" unit="" lease=60 interval=5 once=0 dry=0
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --queue) queue=${2:-}; shift 2 ;;
    --unit) unit=${2:-}; shift 2 ;;
    --lease) lease=${2:-}; shift 2 ;;
    --interval) interval=${2:-}; shift 2 ;;
    --once) once=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) echo "wick-scale: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$queue" ] || { echo "wick-scale: --queue URL is required" >&2; exit 2; }
[ -n "$unit" ] || [ "$dry" = 1 ] || { echo "wick-scale: --unit UNIT is required" >&2; exit 2; }
[[ $lease =~ ^[0-9]+$ ]] || { echo "wick-scale: --lease wants whole seconds, not '$lease'" >&2; exit 2; }
[[ $interval =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "wick-scale: --interval wants seconds" >&2; exit 2; }

# Prints "N WHY" (N jobs of work) or "0"; returns 2 when the queue cannot be read.
work_spool() {
  local dir=$1 n=0 dead=0 now_ms f exp pid rest
  [ -d "$dir" ] || { echo 0; return 0; }
  if [ -d "$dir/new" ]; then
    n=$(find "$dir/new" -mindepth 1 -maxdepth 1 -type f -name '*.json' | wc -l)
  fi
  now_ms=$(($(date +%s%N) / 1000000))
  if [ -d "$dir/claimed" ]; then
    # claimed/<id>~<attempt>~<pid>~<lease expiry, unix ms> (worker/queue_spool.c): a worker
    # reclaims a claim whose lease expired or whose pid is gone
    for f in "$dir"/claimed/*~*~*~*; do
      [ -e "$f" ] || continue
      exp=${f##*~}; rest=${f%~*}; pid=${rest##*~}
      [[ $exp =~ ^[0-9]+$ && $pid =~ ^[0-9]+$ ]] || continue
      if [ "$exp" -lt "$now_ms" ] || [ ! -d "/proc/$pid" ]; then dead=$((dead + 1)); fi
    done
  fi
  if [ $((n + dead)) -gt 0 ]; then echo "$((n + dead)) new=$n reclaimable=$dead"; else echo 0; fi
}

work_redis() {
  local rest=${1#redis*://} hostport path stream group host port lag idle info
  hostport=${rest%%/*}; path=${rest#*/}
  stream=${path%%\?*}; group=wick
  if [[ $path == *\?* ]]; then
    local q=${path#*\?} kv
    IFS='&' read -r -a kvs <<<"$q"
    for kv in "${kvs[@]}"; do [ "${kv%%=*}" = group ] && group=${kv#*=}; done
  fi
  host=${hostport%:*}; port=${hostport##*:}
  [ "$host" != "$hostport" ] || port=6379
  command -v redis-cli >/dev/null || { echo "wick-scale: redis-cli is not installed" >&2; return 2; }
  local rc=(redis-cli -h "$host" -p "$port" --raw)
  # TLS as the worker makes it: the server verified (the CA file, else the system's CAs) and
  # SNI sent; a client certificate when the worker has one
  if [[ $1 == rediss://* ]]; then
    rc+=(--tls --sni "$host")
    [ -n "${WICK_REDIS_CA_FILE:-}" ] && rc+=(--cacert "$WICK_REDIS_CA_FILE")
    [ -n "${WICK_REDIS_CERT_FILE:-}" ] &&
      rc+=(--cert "$WICK_REDIS_CERT_FILE" --key "${WICK_REDIS_KEY_FILE:-}")
  fi
  # the worker's credentials (WICK_REDIS_PASSWORD or _FILE, WICK_REDIS_USERNAME); redis-cli
  # takes the password from REDISCLI_AUTH, off its command line
  [ -n "${WICK_REDIS_USERNAME:-}" ] && rc+=(--user "$WICK_REDIS_USERNAME")
  [ -n "${WICK_REDIS_PASSWORD:-}" ] && export REDISCLI_AUTH=$WICK_REDIS_PASSWORD
  if [ -n "${WICK_REDIS_PASSWORD_FILE:-}" ]; then
    REDISCLI_AUTH=$(cat "$WICK_REDIS_PASSWORD_FILE") || return 2
    export REDISCLI_AUTH
  fi
  # redis-cli --raw exits 0 on an error reply (ERR, NOAUTH, WRONGPASS, ...): an upper-case
  # word first is one (the replies' own lines are field names, ids and numbers)
  if ! info=$("${rc[@]}" XINFO GROUPS "$stream" 2>&1) || [[ $info =~ ^[A-Z]{3,}( |$) ]]; then
    # no stream yet: nothing was ever submitted
    [[ $info == *"no such key"* ]] && { echo 0; return 0; }
    echo "wick-scale: XINFO GROUPS $stream: $info" >&2; return 2
  fi
  # --raw prints each group as alternating field and value lines
  lag=$(awk -v g="$group" '
    prev == "name" { cur = $0 }
    prev == "lag" && cur == g { print $0 }
    { prev = $0 }' <<<"$info")
  [ -n "$lag" ] || { echo "0"; return 0; }   # no such group yet: its creator will see id 0
  [[ $lag =~ ^[0-9]+$ ]] || { echo "wick-scale: no lag for group $group (Redis < 7?)" >&2; return 2; }
  local pend
  if ! pend=$("${rc[@]}" XPENDING "$stream" "$group" IDLE $((lease * 1000)) - + 1000 2>&1) ||
     [[ $pend =~ ^[A-Z]{3,}( |$) ]]; then
    echo "wick-scale: XPENDING $stream $group: $pend" >&2; return 2
  fi
  # --raw prints each entry as 4 lines: id, consumer, idle ms, deliveries
  idle=$(awk 'NF' <<<"$pend" | awk 'END { print int(NR / 4) }')
  if [ $((lag + idle)) -gt 0 ]; then echo "$((lag + idle)) lag=$lag idle_pending=$idle"; else echo 0; fi
}

check() {
  case $queue in
    spool:*) work_spool "${queue#spool:}" ;;
    redis://* | rediss://*) work_redis "$queue" ;;
    *) echo "wick-scale: $queue: only spool: and redis:// queues (SQS and RunPod scale on their platform)" >&2; return 2 ;;
  esac
}

case $queue in
  spool:* | redis://* | rediss://*) ;;
  *) echo "wick-scale: $queue: only spool: and redis:// queues (SQS and RunPod scale on their platform)" >&2; exit 2 ;;
esac
while :; do
  if ! out=$(check) || ! [[ ${out%% *} =~ ^[0-9]+$ ]]; then
    # a Redis blip (or a lag Redis cannot say) must not end the scaler: once, it is an error
    [ "$once" = 1 ] && exit 2
    echo "wick-scale: could not read $queue; trying again in ${interval}s" >&2
    sleep "$interval"
    continue
  fi
  n=${out%% *}
  if [ "$n" -gt 0 ]; then
    echo "work $n (${out#* })"
    if [ "$dry" = 1 ]; then
      echo "would start ${unit:-the worker unit}"
    elif ! systemctl is-active --quiet "$unit"; then
      systemctl start --no-block "$unit" && echo "started $unit"
    fi
  else
    echo "idle"
  fi
  if [ "$once" = 1 ]; then [ "$n" -gt 0 ]; exit $?; fi
  sleep "$interval"
done
