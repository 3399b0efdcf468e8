#!/usr/bin/env bash
# 10 000 watchers of one resource, 10 events/s to all of them (issue 4): delivery lag and
# lost/duplicated/reordered events through the proxy vs directly from the sim, and the proxy's
# memory per watcher. The sim, the proxy and the harness run as three processes (the harness
# gets the proxy's PID for its CPU and peak RSS); all share this machine's cores.
# Usage: benches/watch-fanout.sh [watchers] [seconds] [--http2]   (builds release first)
set -euo pipefail
cd "$(dirname "$0")/.."
WATCHERS="${1:-10000}"; SECS="${2:-20}"; shift 2 || true
cargo build --release --quiet
BIN=target/release/kube-watchcache
ulimit -n "$(ulimit -Hn)"
$BIN sim --listen 127.0.0.1:18141 --objects 0 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${P:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18141/version >/dev/null; do sleep 0.5; done
$BIN serve --upstream http://127.0.0.1:18141 --resources pods --insecure-listen 127.0.0.1:18142 --auth=none \
    --log-level error &
P=$!
until curl -sf http://127.0.0.1:18142/readyz >/dev/null; do sleep 0.5; done
BEFORE=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
JSON=$(mktemp)
$BIN bench --target http://127.0.0.1:18142 --direct http://127.0.0.1:18141 --proxy-pid $P \
    --scenario watch-fanout --watchers "$WATCHERS" --events-per-sec 10 --duration "${SECS}s" --json "$JSON" "$@"
python3 - "$JSON" "$BEFORE" "$WATCHERS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); before = int(sys.argv[2]) * 1024; n = int(sys.argv[3])
for t in r.get("targets", []):
    peak = t.get("peak_rss_bytes")
    if peak:
        print(f"proxy RSS {before/2**20:.1f} MiB before, peak {peak/2**20:.1f} MiB with {n} watchers: "
              f"{(peak-before)/n/1024:.1f} KiB per watcher")
PY
rm -f "$JSON"
