#!/usr/bin/env bash
# N kubelets against a real apiserver and through the proxy in front of it (issue 35 §1 and §5),
# in one run: every kubelet its own TLS connection with a node certificate signed by the
# cluster's CA (CN=system:node:node-<n>, O=system:nodes), HTTP/2, protobuf-first, a
# `spec.nodeName` watch and Secret GETs, 2 pods per node, 100 changes/s. The apiserver must run
# with `--authorization-mode=Node,RBAC` (and, with no controller-manager, without the
# ServiceAccount admission plugin); the proxy runs with `--client-ca-file` (the cluster's CA)
# and `--auth=upstream`, its serving certificate signed by the same CA. Prints the bench's
# report: lost / duplicated / reordered, lag, CPU per delivery, and each process's peak RSS
# growth per kubelet (the apiserver's measured from before the bench seeds its pods, so it
# also holds what the proxy phase left in it).
# Usage: benches/kubelets-upstream.sh KUBECONFIG CA_CERT CA_KEY APISERVER_PID [nodes] [seconds]
#        (../shared/realk8s: DIR/kubeconfig DIR/pki/ca.crt DIR/pki/ca.key $(cat DIR/apiserver.pid))
# Port 18191.
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
KC=${1:?usage: benches/kubelets-upstream.sh KUBECONFIG CA_CERT CA_KEY APISERVER_PID [nodes] [seconds]}
CA=${2:?CA_CERT}; CAKEY=${3:?CA_KEY}; APID=${4:?APISERVER_PID}
NODES=${5:-1000}; SECS=${6:-30}
BIN=${BIN:-target/release/kube-watchcache}
[ "$BIN" = target/release/kube-watchcache ] && cargo build --release --quiet
ulimit -n "$(ulimit -Hn)"
PKI=$(mktemp -d)
trap 'kill ${P:-} 2>/dev/null || true; rm -rf "$PKI"' EXIT
openssl req -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$PKI/proxy.key" -out "$PKI/proxy.csr" \
    -subj "/CN=kube-watchcache bench proxy" 2>/dev/null
openssl x509 -req -in "$PKI/proxy.csr" -CA "$CA" -CAkey "$CAKEY" -CAcreateserial -CAserial "$PKI/ca.srl" -days 2 \
    -out "$PKI/proxy.crt" 2>/dev/null -extfile <(printf '%s\n' "subjectAltName=IP:127.0.0.1" \
    "extendedKeyUsage=serverAuth" "basicConstraints=critical,CA:FALSE")
$BIN serve --kubeconfig "$KC" --resources pods,secrets --bind-address 127.0.0.1 --secure-port 18191 \
    --tls-cert-file "$PKI/proxy.crt" --tls-private-key-file "$PKI/proxy.key" --client-ca-file "$CA" \
    --auth=upstream --max-watches-per-user=0 --log-level error &
P=$!
until curl -sf --cacert "$CA" https://127.0.0.1:18191/readyz >/dev/null; do sleep 0.5; done
BP=$(awk '/VmRSS/ {print $2}' /proc/$P/status); BA=$(awk '/VmRSS/ {print $2}' /proc/$APID/status)
$BIN bench --target https://127.0.0.1:18191 --kubeconfig "$KC" --proxy-pid "$P" --direct-pid "$APID" \
    --scenario kubelet --watchers "$NODES" --objects $((NODES * 2)) --events-per-sec 100 --gets-per-sec 100 \
    --lists-per-sec 0 --duration "${SECS}s" --http2 --node-identities --node-ca-cert "$CA" --node-ca-key "$CAKEY" \
    --json "$PKI/report.json"
python3 - "$PKI/report.json" "$NODES" "$BP" "$BA" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[2])
before = {"proxy": int(sys.argv[3]) * 1024, "direct": int(sys.argv[4]) * 1024}
growth = {}
for t in r.get("targets", []):
    w = t["watch"]
    print(f"{t['name']}: lost {w['lost']} duplicated {w['duplicated']} reordered {w['out_of_order']}, "
          f"lag p99 {w['lag']['p99_ms']:.1f} ms, CPU {t.get('cpu_us_per_delivery') or 0:.1f} µs per delivery, "
          f"peak RSS {t.get('peak_rss_bytes', 0)/2**20:.1f} MiB")
    b, peak = before.get(t["name"]), t.get("peak_rss_bytes")
    if b is not None and peak:
        growth[t["name"]] = (peak - b) / n / 1024
        print(f"  RSS {b/2**20:.1f} MiB before, peak {peak/2**20:.1f} MiB: {growth[t['name']]:.1f} KiB per kubelet")
if len(growth) == 2:
    print(f"proxy / apiserver per kubelet: {growth['proxy'] / growth['direct']:.2f}x")
PY
