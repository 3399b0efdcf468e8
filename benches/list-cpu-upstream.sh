#!/usr/bin/env bash
# Server CPU per LIST against a real apiserver (issue 35's keep-item): N ConfigMaps of about
# 2.75 KB of JSON (10 000: a 27.5 MB list) in namespace `list-cpu` (created when missing), listed
# at resourceVersion=0 by curl to /dev/null, in alternating rounds: from the apiserver (HTTPS,
# the kubeconfig's token), through the proxy in the clear (HTTP/1.1) and through the proxy over
# TLS (HTTP/1.1), all with a user agent that is not curl's (for `curl…` the apiserver indents its
# JSON). Each row's CPU is its server process's utime+stime from /proc over that one
# reading of K back-to-back LISTs (default 20: /proc counts in 10 ms ticks), per LIST; the
# apiserver's idle CPU over the same wall time, measured before each of its readings, is
# subtracted (its own background work). Prints per row: min / median / max ms per LIST, and the
# ratios of the medians.
# Usage: benches/list-cpu-upstream.sh KUBECONFIG APISERVER_PID [objects] [rounds] [K]
#        BIN=/path/to/kube-watchcache …: another build of the proxy.
# The kubeconfig must name a token and a CA file (as ../shared/realk8s's does). Ports 18181-2.
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
KC="${1:?usage: benches/list-cpu-upstream.sh KUBECONFIG APISERVER_PID [objects] [rounds]}"
APID="${2:?the pid of the apiserver}"
N="${3:-10000}"
ROUNDS="${4:-5}"
K="${5:-20}"
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/kube-watchcache
fi
TLS=tests/testdata/security
read -r SERVER CA TOKEN < <(python3 benches/support/kubeconfig.py "$KC")
# The objects, written through the apiserver when missing.
python3 - "$SERVER" "$CA" "$TOKEN" "$N" <<'PY'
import http.client, json, ssl, sys, threading, urllib.parse
server, ca, token, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
u = urllib.parse.urlparse(server)
ctx = ssl.create_default_context(cafile=ca)
H = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
def conn(): return http.client.HTTPSConnection(u.hostname, u.port, context=ctx)
c = conn()
c.request("POST", "/api/v1/namespaces", json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "list-cpu"}}), H)
c.getresponse().read()
c.request("GET", "/api/v1/namespaces/list-cpu/configmaps?limit=1", headers=H)
have = json.loads(c.getresponse().read())
rest = have["metadata"].get("remainingItemCount", 0) + len(have["items"])
if rest >= n:
    sys.exit(0)
print(f"creating {n - rest} configmaps", file=sys.stderr)
def work(k, T=8):
    c = conn()
    for i in range(rest + k, n, T):
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i:05d}", "namespace": "list-cpu", "labels": {"app": "list-cpu", "shard": str(i % 16)}},
                "data": {"config.yaml": f"key-{i}: " + "v" * 2200, "other": "x" * 40}}
        c.request("POST", "/api/v1/namespaces/list-cpu/configmaps", json.dumps(body), H)
        r = c.getresponse(); d = r.read()
        if r.status not in (201, 409):
            print(r.status, d[:200], file=sys.stderr); return
ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
trap 'kill ${PP:-} ${PT:-} 2>/dev/null || true' EXIT
$BIN serve --kubeconfig "$KC" --resources configmaps --insecure-listen 127.0.0.1:18181 --auth=none --log-level error &
PP=$!
$BIN serve --kubeconfig "$KC" --resources configmaps --bind-address 127.0.0.1 --secure-port 18182 \
    --tls-cert-file $TLS/server1.crt --tls-private-key-file $TLS/server1.key --auth=none --log-level error &
PT=$!
until curl -sf http://127.0.0.1:18181/readyz >/dev/null && curl -sfk https://127.0.0.1:18182/readyz >/dev/null; do sleep 0.3; done
Q="/api/v1/namespaces/list-cpu/configmaps?resourceVersion=0"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
# Not curl's own: the apiserver pretty-prints JSON for user agents starting with `curl`.
UA=${UA:-kube-watchcache-bench/list-cpu}
# one NAME PID URL [curl args]: CPU ms of PID per LIST over K LISTs, wall ms per LIST, bytes;
# the apiserver's less its idle CPU.
one() {
    local name=$1 pid=$2 url=$3; shift 3
    local idle=0
    if [ "$pid" = "$APID" ]; then
        local i0 w0; i0=$(ticks "$pid"); w0=$(date +%s%N)
        sleep 1
        idle=$(python3 -c "print(($(ticks "$pid") - $i0) * 1000 / $HZ / (($(date +%s%N) - $w0) / 1e6))")
    fi
    local c0 t0 c1 t1 bytes
    c0=$(ticks "$pid"); t0=$(date +%s%N)
    for _ in $(seq "$K"); do
        bytes=$(curl -s -o /dev/null -w '%{size_download}' -A "$UA" "$@" "$url")
    done
    t1=$(date +%s%N); c1=$(ticks "$pid")
    python3 -c "w = ($t1 - $t0) / 1e6; print('$name', max(0.0, ($c1 - $c0) * 1000 / $HZ - $idle * w) / $K, w / $K, $bytes)"
}
OUT=$(mktemp)
for _ in 1; do # warm-up: the proxies' first LISTs and the apiserver's
    K=2 one w "$APID" "$SERVER$Q" --cacert "$CA" -H "Authorization: Bearer $TOKEN" >/dev/null
    K=2 one w "$PP" "http://127.0.0.1:18181$Q" >/dev/null
    K=2 one w "$PT" "https://127.0.0.1:18182$Q" -k --http1.1 >/dev/null
done
for r in $(seq "$ROUNDS"); do
    one apiserver "$APID" "$SERVER$Q" --cacert "$CA" -H "Authorization: Bearer $TOKEN" --http1.1 >>"$OUT"
    one proxy-plain "$PP" "http://127.0.0.1:18181$Q" >>"$OUT"
    one proxy-tls "$PT" "https://127.0.0.1:18182$Q" -k --http1.1 >>"$OUT"
done
python3 - "$OUT" "$HZ" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, cpu, wall, b = line.split()
    rows.setdefault(name, []).append((float(cpu), float(wall), int(b)))
med = {}
print(f"CPU per LIST (ms; each reading the mean of K LISTs, /proc ticks of 1/{sys.argv[2]} s)")
for name, v in rows.items():
    cpu = sorted(c for c, _, _ in v); wall = sorted(w for _, w, _ in v)
    med[name] = statistics.median(cpu)
    print(f"{name:12} {v[0][2]/1e6:6.1f} MB  CPU min {cpu[0]:6.1f} median {med[name]:6.1f} max {cpu[-1]:6.1f}   wall median {statistics.median(wall):6.1f} ms   ({len(v)} readings)")
for p in ("proxy-plain", "proxy-tls"):
    if med.get(p):
        print(f"apiserver / {p}: {med['apiserver'] / med[p]:.1f}x less CPU")
PY
rm -f "$OUT"
