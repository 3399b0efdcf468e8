#!/usr/bin/env bash
# Memory per cached object (issue 35 §2): a proxy caching only the sim's configmaps (half of
# OBJECTS, ~1.7 KiB of JSON each) against the same proxy caching a resource with no objects,
# both synced from one sim. Prints the JSON per object (the LIST's bytes / items), the RSS each
# object adds (RSS difference / objects) and their ratio; then the same after RUNS rounds of
# CHURN changes per second (each configmap changed about once: history, superseded versions).
# Usage: benches/object-memory.sh [objects] [churn seconds]   (default 100000 0)
#        CHANGE=data benches/object-memory.sh …: each change writes a data key instead of a label
#        (uid, labels and fields unchanged: the new version shares the old one's key).
#        BIN=/path/to/kube-watchcache benches/object-memory.sh …: another build (paired runs).
# Ports 18131 (sim), 18132 (proxy), 18133 (empty proxy).
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
OBJECTS="${1:-100000}"
CHURN_S="${2:-0}"
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/kube-watchcache
fi
RATE=$((OBJECTS / 2 / (CHURN_S > 0 ? CHURN_S : 1)))
$BIN sim --listen 127.0.0.1:18131 --objects "$OBJECTS" --lease-churn 0 >/dev/null 2>&1 &
SIM=$!
trap 'kill ${P:-} ${E:-} 2>/dev/null; sleep 0.2; kill $SIM 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18131/version >/dev/null; do sleep 0.5; done
serve() { $BIN serve --upstream http://127.0.0.1:18131 --resources "$1" --insecure-listen "127.0.0.1:$2" --auth=none --log-level error & }
serve configmaps 18132
P=$!
serve limitranges 18133
E=$!
for port in 18132 18133; do
    until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.5; done
done
report() {
    local body n json rss base
    body=$(mktemp)
    curl -s "http://127.0.0.1:18132/api/v1/configmaps?resourceVersion=0" -o "$body"
    n=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['items']))" "$body")
    json=$(stat -c %s "$body")
    rm -f "$body"
    rss=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
    base=$(awk '/VmRSS/ {print $2}' /proc/$E/status)
    # The anonymous part alone: the binary's own pages (RssFile) depend on what of it the page
    # cache holds (a freshly built binary maps more of itself), ~1-2 MiB between builds.
    anon=$(awk '/RssAnon/ {print $2}' /proc/$P/status)
    anon_base=$(awk '/RssAnon/ {print $2}' /proc/$E/status)
    python3 -c "
n, json, rss, base = $n, $json, $rss * 1024, $base * 1024
per = (rss - base) / n
anon = ($anon - $anon_base) * 1024 / n
print(f'$1: {n} configmaps, JSON {json / n:.0f} B per object; proxy RSS {rss / 2**20:.1f} MiB, empty proxy {base / 2**20:.1f} MiB: {per:.0f} B per object = {per / (json / n):.2f} x its JSON; anonymous memory alone {anon:.0f} B = {anon / (json / n):.2f} x')"
}
report "after sync"
if [ "$CHURN_S" -gt 0 ]; then
    # The sim's churn is a flag of its start: a second sim would be another cluster. Instead,
    # touch each configmap once through the sim's API (a label, or a data key), at RATE per second.
    python3 - "$OBJECTS" "$RATE" "${CHANGE:-label}" <<'PY'
import http.client, json, sys, time
n, rate = int(sys.argv[1]) // 2, int(sys.argv[2])
change = {"metadata": {"labels": {"touched": "yes"}}} if sys.argv[3] == "label" else {"data": {"touched": "yes"}}
per_ns = 1000
namespaces = max(1, -(-int(sys.argv[1]) // per_ns))
c = http.client.HTTPConnection("127.0.0.1", 18131)
start = time.time()
for i in range(n):
    ns = f"ns-{i % namespaces}"
    body = json.dumps(change)
    c.request("PATCH", f"/api/v1/namespaces/{ns}/configmaps/cm-{i}", body,
              {"Content-Type": "application/merge-patch+json"})
    r = c.getresponse(); r.read()
    ahead = (i + 1) / rate - (time.time() - start)
    if ahead > 0:
        time.sleep(ahead)
PY
    sleep 2
    report "after one change to each"
fi
