#!/usr/bin/env bash
# --cache-memory-limit under a data set larger than it (issue 35 §3): the same sim data (half
# configmaps, half pods, ~2 KiB each, with churn) cached by a proxy without a limit, then by a
# proxy whose limit is a fraction of what the first one counted. Each proxy serves JSON and
# protobuf LISTs of both resources (every item checked against the sim's count) and then runs
# for a while under churn; the script prints what the caches count, the resident memory now and
# at its peak (VmHWM), and what the limit did.
#
#   benches/memory-limit.sh [OBJECTS=100000] [FRACTION=0.5] [CHURN=200]
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
OBJECTS="${1:-100000}"
FRACTION="${2:-0.5}"
CHURN="${3:-200}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
SIM=127.0.0.1:18131
PROXY=127.0.0.1:18132
$BIN sim --listen $SIM --objects "$OBJECTS" --churn "$CHURN" --log-level error >/dev/null 2>&1 &
SIM_PID=$!
trap 'kill $SIM_PID ${P:-} 2>/dev/null || true' EXIT
until curl -sf "http://$SIM/version" >/dev/null; do sleep 0.5; done

metric() { curl -s "http://$PROXY/watchcache/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {printf "%d", s}'; }
kib() { awk "/^$1/ {print \$2}" "/proc/$P/status"; }
count() { # items in a LIST answer (JSON)
  curl -s "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))'
}

# run LABEL LIMIT: one proxy, its reads, 30 s under churn; prints one line.
run() {
  local label=$1 limit=$2
  $BIN serve --upstream "http://$SIM" --resources pods,configmaps --insecure-listen $PROXY --auth=none \
    --cache-memory-limit "$limit" --cache-memory-check-period 1s --log-level 'warn,kube_watchcache::memory=debug' \
    2>"/tmp/memory-limit.$label.log" &
  P=$!
  until curl -sf "http://$PROXY/readyz" >/dev/null 2>&1; do sleep 0.5; done
  local ok=yes
  for r in pods configmaps; do
    local want got
    want=$(count "http://$SIM/api/v1/$r")
    got=$(count "http://$PROXY/api/v1/$r?resourceVersion=0")
    [ "$want" = "$got" ] || ok="no ($r: $got of $want)"
    curl -s -o /dev/null -H 'Accept: application/vnd.kubernetes.protobuf' "http://$PROXY/api/v1/$r?resourceVersion=0"
  done
  local peak_rss=0
  for _ in $(seq 30); do
    sleep 1
    local r; r=$(kib VmRSS); [ "$r" -gt "$peak_rss" ] && peak_rss=$r
  done
  local counted dropped actions
  counted=$(metric 'watchcache_cache_memory_bytes{')
  dropped=$(metric 'watchcache_cache_memory_dropped_resources ')
  actions=$(curl -s "http://$PROXY/watchcache/metrics" | awk '/^watchcache_cache_memory_actions_total/ {sub(/.*action="/, ""); sub(/"}/, ""); printf "%s ", $0}')
  local forwarded; forwarded=$(metric 'watchcache_forwarded_requests_total{reason="memory_limit"}')
  printf '%s: limit %s, counted %.1f MiB, RSS %.1f MiB (max over 30 s of churn %.1f, peak VmHWM %.1f), dropped resources %s, all items answered: %s, forwarded for the limit: %s; actions: %s\n' \
    "$label" "$limit" "$(echo "$counted / 1048576" | bc -l)" "$(echo "$(kib VmRSS) / 1024" | bc -l)" \
    "$(echo "$peak_rss / 1024" | bc -l)" "$(echo "$(kib VmHWM) / 1024" | bc -l)" "$dropped" "$ok" "$forwarded" "$actions"
  echo "$counted $(kib VmHWM)" > "/tmp/memory-limit.$label"
  kill $P; wait $P 2>/dev/null || true
  P=
}

run unlimited 1Ti
read -r counted _ < /tmp/memory-limit.unlimited
limit=$(python3 -c "print(int($counted * $FRACTION))")
run limited "$limit"
read -r _ hwm < /tmp/memory-limit.limited
python3 -c "l=$limit; h=$hwm*1024; print(f'limited: peak RSS {h/2**20:.1f} MiB = limit {l/2**20:.1f} MiB + {(h-l)/2**20:.1f} MiB ({h/l:.2f} x the limit)')"
grep -h 'cache-memory-limit' /tmp/memory-limit.limited.log | head -5 || true
# What one measurement of every cache took (the governor's cost, every --cache-memory-check-period).
grep -ho 'took=[^ ]*' /tmp/memory-limit.unlimited.log | tail -3 || true
