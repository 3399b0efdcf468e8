#!/usr/bin/env bash
# Memory per cached ConfigMap in front of a real apiserver (issue 35 §2): the proxy caching the
# cluster's configmaps (RESOURCE=pods: its pods), against the same proxy caching `podtemplates` (none, usually), both
# synced from the apiserver of KUBECONFIG; then once more after a LIST at resourceVersion=0.
# Prints the JSON per object and the RSS per object. The apiserver's own side (its RSS over a
# fresh etcd, after a restart with the objects, and after one LIST) is read from its process
# the same way; docs/performance.md "Memory per cached object" has the steps.
# Usage: benches/object-memory-upstream.sh KUBECONFIG
#        RESOURCE=pods benches/object-memory-upstream.sh …: another core resource (default
#        configmaps; `benches/support/pods_upstream.py` writes pods as kubelets run them).
#        BIN=/path/to/kube-watchcache benches/object-memory-upstream.sh …: another build.
# Port 18171.
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
KUBECONFIG_FILE="${1:?usage: benches/object-memory-upstream.sh KUBECONFIG}"
PORT=18171
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/kube-watchcache
fi
trap 'kill ${P:-} 2>/dev/null || true' EXIT
run() {
    $BIN serve --kubeconfig "$KUBECONFIG_FILE" --resources "$1" --insecure-listen 127.0.0.1:$PORT \
        --auth=none --log-level error &
    P=$!
    until curl -sf http://127.0.0.1:$PORT/readyz >/dev/null; do sleep 0.3; done
    sleep 3
    local r1 r2 a1 n b
    r1=$(awk '/VmRSS/{print $2}' /proc/$P/status)
    a1=$(awk '/RssAnon/{print $2}' /proc/$P/status)
    b=$(curl -s -o /tmp/omu.$$ -w '%{size_download}' "http://127.0.0.1:$PORT/api/v1/$1?resourceVersion=0")
    n=$(python3 -c "import json; print(len(json.load(open('/tmp/omu.$$'))['items']))" 2>/dev/null || echo 0)
    rm -f /tmp/omu.$$
    sleep 1
    r2=$(awk '/VmRSS/{print $2}' /proc/$P/status)
    kill $P; wait $P 2>/dev/null || true
    echo "$r1 $r2 $n $b $a1"
}
read -r E1 _ _ _ EA < <(run podtemplates)
RESOURCE=${RESOURCE:-configmaps}
read -r F1 F2 N BYTES FA < <(run "$RESOURCE")
python3 -c "
e, f1, f2, n, b, ea, fa = $E1, $F1, $F2, $N, $BYTES, $EA, $FA
j = b / n
print(f'{n} $RESOURCE, JSON {j:.0f} B each; proxy RSS empty {e} KiB, synced {f1} KiB: {(f1-e)*1024/n:.0f} B per object ({(f1-e)*1024/n/j:.2f}x); after a LIST {(f2-e)*1024/n:.0f} B; anonymous memory alone {(fa-ea)*1024/n:.0f} B ({(fa-ea)*1024/n/j:.2f}x)')
"
