#!/usr/bin/env bash
# N kubelets on one proxy (issue 16; default 5 000), the sim upstream, everything on HTTPS with
# the proxy's auth on: each kubelet a client of its own on HTTP/2 with a node certificate
# (CN=system:node:node-<n>, O=system:nodes, signed by the run's CA, which the proxy trusts with
# --client-ca-file), protobuf-first Accept, watching its pods by spec.nodeName and GETting the
# Secret its pods mount; 100 pod changes/s spread over the nodes. The proxy authorizes every
# node with SubjectAccessReviews that the sim's Node authorizer answers (1.34 rules).
# Prints: lost/duplicated/reordered, p99 lag, proxy memory per watch, CPU per delivery, upstream
# SARs (per second and per node) and the auth cache hit rate.
# Usage: [EVENTS=changes/s] benches/kubelets.sh [nodes] [seconds] [bench flags...]   (builds release first;
# 100 changes/s unless EVENTS says otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=5000; SECS=30
[[ "${1:-}" =~ ^[0-9]+$ ]] && { NODES=$1; shift; }
[[ "${1:-}" =~ ^[0-9]+$ ]] && { SECS=$1; shift; }
source benches/sim-proxy.sh
TLS=1; EXTRA=("$@")
RESOURCES=pods,secrets
PROXY_EXTRA=(--client-ca-file "$PKI/ca.crt")
start_pair
BEFORE=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
JSON=$PKI/report.json
run_bench --scenario kubelet --watchers "$NODES" --objects $((NODES * 2)) --events-per-sec "${EVENTS:-100}" \
    --gets-per-sec 100 --lists-per-sec 0 --duration "${SECS}s" --http2 --node-identities \
    --node-ca-cert "$PKI/ca.crt" --node-ca-key "$PKI/ca.key" --json "$JSON" "${EXTRA[@]}"
python3 - "$JSON" "$BEFORE" "$NODES" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); before = int(sys.argv[2]) * 1024; n = int(sys.argv[3])
for t in r.get("targets", []):
    w = t["watch"]
    print(f"{t['name']}: lost {w['lost']} duplicated {w['duplicated']} reordered {w['out_of_order']}, "
          f"lag p99 {w['lag']['p99_ms']:.1f} ms, deliveries {t.get('deliveries', 0)}, "
          f"CPU {t['cpu_us_per_delivery']:.1f} µs per delivery" if t.get("cpu_us_per_delivery") else "")
    peak = t.get("peak_rss_bytes")
    if t["name"] == "proxy" and peak:
        print(f"proxy RSS {before/2**20:.1f} MiB before, peak {peak/2**20:.1f} MiB with {n} kubelets: "
              f"{(peak-before)/n/1024:.1f} KiB per watch (each kubelet its own TLS connection)")
    a = t.get("auth_lookups")
    if a:
        total = a["hits"] + a["misses"]
        print(f"proxy auth: {a['subject_access_reviews']} upstream SARs in {t['seconds']:.0f} s "
              f"({a['subject_access_reviews']/t['seconds']:.1f}/s, {a['subject_access_reviews']/n:.2f} per node), "
              f"cache hit rate {100*a['hits']/max(total,1):.1f} % of {total} lookups")
PY
