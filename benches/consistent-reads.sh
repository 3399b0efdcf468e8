#!/usr/bin/env bash
# Most Recent reads in a live cluster (issue 9): LIST with resourceVersion unset and watch-list
# with resourceVersion unset (what client-go >= 1.34 informers send), through the proxy vs
# directly against the simulated apiserver, while the sim renews node Leases (a resource the
# proxy does not cache) LEASES times a second. Reports LIST p50/p90, the time to the
# `k8s.io/initial-events-end` bookmark, and how many of the proxy's requests reached the
# upstream (from the proxy's /watchcache/metrics: forwarded requests by reason, upstream LIST pages).
# Requests alternate proxy / direct so both see the same machine noise.
# Usage: benches/consistent-reads.sh [lists] [watch-lists] [leases/s]   (builds release first)
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
LISTS="${1:-200}"; WATCHES="${2:-50}"; LEASES="${3:-20}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
SIM=127.0.0.1:18151; PROXY=127.0.0.1:18152
$BIN sim --listen $SIM --objects 1000 --lease-churn "$LEASES" >/dev/null 2>&1 &
S=$!
trap 'kill $S ${P:-} 2>/dev/null || true' EXIT
until curl -sf "http://$SIM/version" >/dev/null; do sleep 0.2; done
$BIN serve --upstream "http://$SIM" --resources configmaps,pods --insecure-listen $PROXY --auth=none \
    --log-level error &
P=$!
until curl -sf "http://$PROXY/readyz" >/dev/null; do sleep 0.2; done
python3 - "$SIM" "$PROXY" "$LISTS" "$WATCHES" "$LEASES" <<'PY'
import http.client, re, sys, time

sim, proxy, lists, watches, leases = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
LIST = "/api/v1/namespaces/ns-0/configmaps"
WL = LIST + "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=30"

def conn(addr):
    h, p = addr.split(":")
    return http.client.HTTPConnection(h, int(p), timeout=30)

def metrics():
    c = conn(proxy); c.request("GET", "/watchcache/metrics"); body = c.getresponse().read().decode(); c.close()
    out = {}
    for m in re.finditer(r'^watchcache_forwarded_requests_total\{reason="([a-z_]+)"\} (\d+)', body, re.M):
        out[m.group(1)] = int(m.group(2))
    return out

def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))]

def timed_list(c):
    t = time.perf_counter(); c.request("GET", LIST); r = c.getresponse(); body = r.read()
    assert r.status == 200, (r.status, body[:200])
    return time.perf_counter() - t, len(body)

def time_to_end_bookmark(addr):
    c = conn(addr); t = time.perf_counter(); c.request("GET", WL); r = c.getresponse()
    assert r.status == 200, r.status
    added = 0
    while True:
        line = r.fp.readline()
        if not line:
            raise SystemExit(f"{addr}: the stream ended before the initial-events-end bookmark")
        if b'"type":"ADDED"' in line:
            added += 1
        if b"k8s.io/initial-events-end" in line:
            dt = time.perf_counter() - t
            c.close()
            return dt, added

conns = {"proxy": conn(proxy), "direct": conn(sim)}
for c in conns.values():  # warm the connections and the proxy's auth-free path
    timed_list(c)
before = metrics()
lat = {"proxy": [], "direct": []}
size = 0
for _ in range(lists):
    for side, c in conns.items():
        dt, size = timed_list(c)
        lat[side].append(dt)
mid = metrics()
wl = {"proxy": [], "direct": []}
items = 0
for _ in range(watches):
    for side, addr in (("proxy", proxy), ("direct", sim)):
        dt, items = time_to_end_bookmark(addr)
        wl[side].append(dt)
after = metrics()

def delta(a, b):
    return {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}

ms = lambda s: f"{s * 1000:.2f} ms"
print(f"\nMost Recent reads under lease churn ({leases} Lease renewals/s, not cached), {LIST}: {size} bytes, {items} objects")
print(f"{'':34} {'proxy':>12} {'direct':>12}")
print(f"{'LIST RV unset p50 (' + str(lists) + ' each)':34} {ms(pct(lat['proxy'], .5)):>12} {ms(pct(lat['direct'], .5)):>12}")
print(f"{'LIST RV unset p90':34} {ms(pct(lat['proxy'], .9)):>12} {ms(pct(lat['direct'], .9)):>12}")
print(f"{'watch-list RV unset: end bookmark p50':34} {ms(pct(wl['proxy'], .5)):>12} {ms(pct(wl['direct'], .5)):>12}")
print(f"{'watch-list: end bookmark max':34} {ms(max(wl['proxy'])):>12} {ms(max(wl['direct'])):>12}")
d_lists, d_watches = delta(before, mid), delta(mid, after)
print(f"proxy requests forwarded upstream during the LISTs: {d_lists or 'none'} (of {lists})")
print(f"proxy requests forwarded upstream during the watch-lists: {d_watches or 'none'} (of {watches} watches)")
PY
