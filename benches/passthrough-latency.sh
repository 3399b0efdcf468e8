#!/usr/bin/env bash
# Added latency of a forwarded request: GET with resourceVersion unset (always forwarded) through
# the proxy vs directly, N sequential requests each on one kept-alive curl connection.
# Usage: benches/passthrough-latency.sh [N]
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
N="${1:-2000}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
$BIN sim --listen 127.0.0.1:18111 --objects 100 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${P:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18111/version >/dev/null; do sleep 0.3; done
$BIN serve --upstream http://127.0.0.1:18111 --resources configmaps --insecure-listen 127.0.0.1:18112 --auth=none --log-level error &
P=$!
until curl -sf http://127.0.0.1:18112/readyz >/dev/null; do sleep 0.3; done
run() { # base → per-request seconds, one per line (curl reuses the connection across URLs)
    for _ in $(seq "$N"); do echo "url = \"$1/api/v1/namespaces/ns-0/configmaps/cm-0\""; echo "output = /dev/null"; done \
        | curl -s -K - -w '%{time_total}\n'
}
run http://127.0.0.1:18112 > /tmp/kwc-proxy-latency.txt
run http://127.0.0.1:18111 > /tmp/kwc-direct-latency.txt
python3 - <<'PY'
p = sorted(float(x) for x in open("/tmp/kwc-proxy-latency.txt").read().split())
d = sorted(float(x) for x in open("/tmp/kwc-direct-latency.txt").read().split())
q = lambda a, f: a[int(f * (len(a) - 1))] * 1e6
print(f"forwarded GET, {len(p)} requests: proxy p50 {q(p,.5):.0f} µs p90 {q(p,.9):.0f} µs | direct p50 {q(d,.5):.0f} µs p90 {q(d,.9):.0f} µs | added p50 {q(p,.5)-q(d,.5):.0f} µs")
PY
