#!/usr/bin/env bash
# 10 000 watchers of one resource, 10 events/s to all of them (issue 4): delivery lag and
# lost/duplicated/reordered events through the proxy vs directly from the sim, the proxy's memory
# per watcher, and CPU µs per delivery of the proxy and of the sim (each process alone). The sim,
# the proxy and the harness run as three processes; all share this machine's cores.
# Usage: benches/watch-fanout.sh [watchers] [seconds] [--tls] [--http2] [bench flags...]
#   --tls: HTTPS everywhere and the proxy's auth on (see benches/sim-proxy.sh); --http2: h2 (ALPN
#   over TLS, prior knowledge in the clear). Builds release first.
set -euo pipefail
cd "$(dirname "$0")/.."
WATCHERS=10000; SECS=20
[[ "${1:-}" =~ ^[0-9]+$ ]] && { WATCHERS=$1; shift; }
[[ "${1:-}" =~ ^[0-9]+$ ]] && { SECS=$1; shift; }
source benches/sim-proxy.sh
split_flags "$@"
start_pair
BEFORE=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
JSON=$PKI/report.json
run_bench --scenario watch-fanout --watchers "$WATCHERS" --events-per-sec 10 --duration "${SECS}s" \
    --json "$JSON" "${EXTRA[@]}"
python3 - "$JSON" "$BEFORE" "$WATCHERS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); before = int(sys.argv[2]) * 1024; n = int(sys.argv[3])
for t in r.get("targets", []):
    peak = t.get("peak_rss_bytes")
    if t["name"] == "proxy" and peak:
        print(f"proxy RSS {before/2**20:.1f} MiB before, peak {peak/2**20:.1f} MiB with {n} watchers: "
              f"{(peak-before)/n/1024:.1f} KiB per watcher")
    cpu = t.get("cpu_us_per_delivery")
    print(f"{t['name']}: CPU {cpu:.2f} µs per delivery" if cpu is not None else f"{t['name']}: CPU not measured",
          f"({t.get('deliveries', 0)} deliveries, {t.get('http_versions')})")
PY
