#!/usr/bin/env bash
# Soak: the proxy in front of a churning sim with watchers attached for a long time, its RSS
# sampled every 10 s (VmRSS from /proc/PID/status) into a CSV; prints first / median / last / max
# RSS and the slope (least squares over the whole run and over its second half, after warm-up).
# Owned by the reliability work (README "## Reliability"); run by hand, not by CI.
# Processes: `kube-watchcache sim` (N objects, R updates/s, Lease churn when the flag exists),
# `kube-watchcache serve` (pods,configmaps) and `kube-watchcache bench --scenario watch-fanout`
# against the proxy only (its watchers must see every change exactly once, in order: a loss
# makes the bench, and so this script, fail).
# Usage: benches/soak.sh [duration=30m] [csv=target/soak-<time>.csv]
#   env: OBJECTS=5000 CHURN=50 WATCHERS=500 EVENTS=10 PORT=18161 (sim) and PORT+1 (proxy)
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
DURATION="${1:-30m}"
CSV="${2:-target/soak-$(date +%Y%m%d-%H%M%S).csv}"
OBJECTS="${OBJECTS:-5000}"; CHURN="${CHURN:-50}"; WATCHERS="${WATCHERS:-500}"; EVENTS="${EVENTS:-10}"
SIM_PORT="${PORT:-18161}"; PROXY_PORT=$((SIM_PORT + 1))
cargo build --release --quiet --bin kube-watchcache
BIN=target/release/kube-watchcache
ulimit -n "$(ulimit -Hn)"

LEASE=()
if $BIN sim --help | grep -q -- '--lease-churn'; then LEASE=(--lease-churn 20); fi
$BIN sim --listen "127.0.0.1:$SIM_PORT" --objects "$OBJECTS" --churn "$CHURN" "${LEASE[@]}" \
    --log-level error >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${P:-} ${B:-} 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$SIM_PORT/version" >/dev/null; do sleep 0.5; done
$BIN serve --upstream "http://127.0.0.1:$SIM_PORT" --resources pods,configmaps \
    --insecure-listen "127.0.0.1:$PROXY_PORT" --auth=none --log-level warn &
P=$!
until curl -sf "http://127.0.0.1:$PROXY_PORT/readyz" >/dev/null; do sleep 0.5; done

mkdir -p "$(dirname "$CSV")"
echo "seconds,rss_kib,threads,fds" >"$CSV"
sample() {
    local rss thr fds
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$P/status" 2>/dev/null) || return 0
    thr=$(awk '/^Threads/ {print $2}' "/proc/$P/status" 2>/dev/null) || return 0
    fds=$(find "/proc/$P/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) || fds=0
    echo "$(( $(date +%s) - START )),$rss,$thr,$fds" >>"$CSV"
}
START=$(date +%s)
sample
echo "soak: sim $OBJECTS objects, churn $CHURN/s ${LEASE[*]}; proxy pid $P; $WATCHERS watchers," \
    "writer $EVENTS/s, $DURATION; RSS every 10 s into $CSV" >&2
$BIN bench --target "http://127.0.0.1:$PROXY_PORT" --proxy-pid "$P" --scenario watch-fanout \
    --watchers "$WATCHERS" --events-per-sec "$EVENTS" --duration "$DURATION" --log-level warn &
B=$!
while kill -0 "$B" 2>/dev/null; do
    for _ in $(seq 20); do kill -0 "$B" 2>/dev/null && sleep 0.5; done
    sample
done
set +e; wait "$B"; BENCH_RC=$?; set -e
kill -0 "$P" 2>/dev/null || { echo "soak: the proxy died" >&2; exit 1; }
sample

python3 - "$CSV" <<'PY'
import csv, statistics, sys
rows = [(int(r["seconds"]), int(r["rss_kib"]), int(r["fds"])) for r in csv.DictReader(open(sys.argv[1]))]
t = [r[0] for r in rows]; m = [r[1] / 1024 for r in rows]
def slope(ts, ms):
    if len(ts) < 2: return float("nan")
    mt, mm = statistics.fmean(ts), statistics.fmean(ms)
    den = sum((x - mt) ** 2 for x in ts)
    return sum((x - mt) * (y - mm) for x, y in zip(ts, ms)) / den * 3600 if den else float("nan")
h = len(rows) // 2
print(f"samples {len(rows)} over {t[-1]} s; proxy RSS MiB: first {m[0]:.1f}, median {statistics.median(m):.1f}, "
      f"last {m[-1]:.1f}, max {max(m):.1f}")
print(f"slope {slope(t, m):+.2f} MiB/h over the run, {slope(t[h:], m[h:]):+.2f} MiB/h over the second half; "
      f"open fds first {rows[0][2]}, last {rows[-1][2]}")
PY
echo "bench exit code $BENCH_RC (non-zero: lost/duplicated/reordered events or errors)"
exit "$BENCH_RC"
