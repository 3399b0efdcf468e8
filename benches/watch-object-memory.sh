#!/usr/bin/env bash
# Memory per cached object that arrived as a watch event, not in a LIST (issue 35 §2): the sim
# starts empty, the proxy caches its configmaps, then N configmaps (~1.2 KiB of JSON each) are
# created while it watches; every ADDED event is still in the history. Prints the JSON per
# object and the proxy's RSS growth per object.
# Usage: benches/watch-object-memory.sh [n]   (default 20000)
#        BIN=/path/to/kube-watchcache benches/watch-object-memory.sh …: another build.
# Ports 18161 (sim), 18162 (proxy).
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
N="${1:-20000}"; SP=18161; PP=18162
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/kube-watchcache
fi
$BIN sim --listen 127.0.0.1:$SP --objects 0 >/dev/null 2>&1 &
S=$!
trap 'kill $S ${P:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:$SP/version >/dev/null; do sleep 0.3; done
$BIN serve --upstream http://127.0.0.1:$SP --resources configmaps --insecure-listen 127.0.0.1:$PP \
    --auth=none --log-level error &
P=$!
until curl -sf http://127.0.0.1:$PP/readyz >/dev/null; do sleep 0.3; done
sleep 2
R0=$(awk '/VmRSS/{print $2}' /proc/$P/status)
python3 - "$N" "$SP" <<'PY'
import http.client, json, sys, threading
n, port, T = int(sys.argv[1]), int(sys.argv[2]), 4
def work(k):
    c = http.client.HTTPConnection('127.0.0.1', port)
    for i in range(k, n, T):
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": f"cm-{i:05d}", "namespace": "default",
                                        "labels": {"app": "mem", "shard": str(i % 16)}},
                           "data": {"config.yaml": ("key-%d: " % i) + "v" * 900, "other": "x" * 40}})
        c.request('POST', '/api/v1/namespaces/default/configmaps', body, {'Content-Type': 'application/json'})
        r = c.getresponse(); r.read()
        assert r.status == 201, r.status
ts = [threading.Thread(target=work, args=(k,)) for k in range(T)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
until [ "$(curl -s "http://127.0.0.1:$PP/api/v1/configmaps?resourceVersion=0" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))')" -ge "$N" ]; do sleep 0.5; done
sleep 2
BYTES=$(curl -s -o /dev/null -w '%{size_download}' "http://127.0.0.1:$PP/api/v1/configmaps?resourceVersion=0")
R1=$(awk '/VmRSS/{print $2}' /proc/$P/status)
python3 -c "n=$N; j=$BYTES/n; g=($R1-$R0)*1024/n; print(f'{n} configmaps by watch events: JSON {j:.0f} B each; proxy RSS {$R0} -> {$R1} KiB: {g:.0f} B per object ({g/j:.2f}x)')"
