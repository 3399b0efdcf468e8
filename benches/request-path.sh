#!/usr/bin/env bash
# Per-request cost of the request path (the phases of server::stack), paired against another
# build: N sequential GETs on one kept-alive curl connection, served from the cache
# (resourceVersion=0) and forwarded (resourceVersion unset), plain HTTP, --auth=none: latency
# percentiles, and the proxy's CPU per request (/proc ticks over the N requests). Rounds
# alternate the two builds so that the machine's drift hits both alike.
# Usage: BASE=<other kube-watchcache binary> benches/request-path.sh [N] [rounds]
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
N="${1:-3000}"; ROUNDS="${2:-3}"
cargo build --release --quiet
NEW=target/release/kube-watchcache
BASE=${BASE:?set BASE to the binary to compare with}
$NEW sim --listen 127.0.0.1:18121 --objects 100 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${P:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18121/version >/dev/null; do sleep 0.3; done
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }  # utime + stime, in ticks
run() { # URL → per-request seconds, one per line
    for _ in $(seq "$N"); do echo "url = \"$1\""; echo "output = /dev/null"; done | curl -s -K - -w '%{time_total}\n'
}
for r in $(seq "$ROUNDS"); do
  for which in base new; do
    BIN=$BASE; [ $which = new ] && BIN=$NEW
    $BIN serve --upstream http://127.0.0.1:18121 --resources configmaps --insecure-listen 127.0.0.1:18122 \
        --auth=none --log-level error &
    P=$!
    until curl -sf http://127.0.0.1:18122/readyz >/dev/null; do sleep 0.2; done
    c0=$(cpu $P)
    run "http://127.0.0.1:18122/api/v1/namespaces/ns-0/configmaps/cm-0?resourceVersion=0" > /tmp/kwc-rp-$which-cached-$r.txt
    c1=$(cpu $P)
    run "http://127.0.0.1:18122/api/v1/namespaces/ns-0/configmaps/cm-0" > /tmp/kwc-rp-$which-fwd-$r.txt
    c2=$(cpu $P)
    echo "$(( (c1 - c0) * 1000000 / $(getconf CLK_TCK) / N ))" > /tmp/kwc-rp-$which-cached-$r.cpu
    echo "$(( (c2 - c1) * 1000000 / $(getconf CLK_TCK) / N ))" > /tmp/kwc-rp-$which-fwd-$r.cpu
    kill $P; wait $P 2>/dev/null || true
  done
done
python3 - "$ROUNDS" <<'PY'
import sys
rounds = int(sys.argv[1])
q = lambda a, f: a[int(f * (len(a) - 1))] * 1e6
for kind in ("cached", "fwd"):
    for which in ("base", "new"):
        p50s, p90s, cpus = [], [], []
        for r in range(1, rounds + 1):
            a = sorted(float(x) for x in open(f"/tmp/kwc-rp-{which}-{kind}-{r}.txt").read().split())
            p50s.append(q(a, .5)); p90s.append(q(a, .9))
            cpus.append(open(f"/tmp/kwc-rp-{which}-{kind}-{r}.cpu").read().strip())
        print(f"{kind:6} {which:4}: p50 " + " / ".join(f"{x:.0f}" for x in p50s) + " µs, p90 "
              + " / ".join(f"{x:.0f}" for x in p90s) + " µs, proxy CPU " + " / ".join(cpus) + " µs per request")
PY
