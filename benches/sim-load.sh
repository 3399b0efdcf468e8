#!/usr/bin/env bash
# The simulated apiserver under load (issue 4): 100 000 objects and 1 000 changes/s for D
# seconds. Reports the sim's resident memory over time (bounded: the change log keeps 10 000
# revisions) and checks its resourceVersions: two watches (pods, configmaps — the kinds the
# churn changes) must together see every revision exactly once, in order, with no gap, and the
# final LIST RVs must not be older than the last event seen.
# Usage: benches/sim-load.sh [seconds] [objects] [changes-per-sec]   (builds release first)
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
SECS="${1:-60}"; OBJECTS="${2:-100000}"; RATE="${3:-1000}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
OUT=$(mktemp -d)
$BIN sim --listen 127.0.0.1:18131 --objects "$OBJECTS" --churn "$RATE" --lease-churn 0 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${W1:-} ${W2:-} 2>/dev/null || true; rm -rf "$OUT"' EXIT
until curl -sf http://127.0.0.1:18131/version >/dev/null; do sleep 0.5; done
# One LIST gives the starting RV; both watches start there (the churn is already running).
# The watches run `command curl` so that `$!` is curl itself (the `curl` function above would be
# a subshell that `kill` ends while its curl goes on writing). No Lease churn: only the two
# watched kinds move the revision, so together they must see every one.
START=$(curl -s 'http://127.0.0.1:18131/api/v1/namespaces?limit=1' | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["resourceVersion"])')
command curl -sN -A kube-watchcache-bench "http://127.0.0.1:18131/api/v1/pods?watch=1&resourceVersion=$START&timeoutSeconds=$((SECS + 5))" >"$OUT/pods" &
W1=$!
command curl -sN -A kube-watchcache-bench "http://127.0.0.1:18131/api/v1/configmaps?watch=1&resourceVersion=$START&timeoutSeconds=$((SECS + 5))" >"$OUT/cms" &
W2=$!
for t in $(seq 5 5 "$SECS"); do
    sleep 5
    echo "$t $(awk '/VmRSS/ {print $2}' /proc/$SIM/status)" >>"$OUT/rss"
done
kill $W1 $W2 2>/dev/null || true
wait $W1 $W2 2>/dev/null || true
END_PODS=$(curl -s 'http://127.0.0.1:18131/api/v1/pods?limit=1' | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["resourceVersion"])')
python3 - "$OUT" "$START" "$END_PODS" "$SECS" "$OBJECTS" "$RATE" <<'PY'
import json, sys
out, start, end, secs, objects, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
rvs, problems = [], []
for name in ("pods", "cms"):
    last = start
    for line in open(f"{out}/{name}", errors="replace"):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue  # the last line may be cut by kill
        rv = int(e["object"]["metadata"]["resourceVersion"])
        if e["type"] not in ("MODIFIED",):
            problems.append(f"{name}: unexpected {e['type']} at {rv}")
        if rv <= last:
            problems.append(f"{name}: RV {rv} after {last}")
        last = rv
        rvs.append(rv)
rvs.sort()
gaps = sum(1 for a, b in zip(rvs, rvs[1:]) if b != a + 1) + (1 if rvs and rvs[0] != start + 1 else 0)
dups = len(rvs) - len(set(rvs))
rss = [(int(t), int(k)) for t, k in (l.split() for l in open(f"{out}/rss"))]
mib = [k / 1024 for _, k in rss]
print(f"sim: {objects} objects, churn {rate}/s for {secs} s")
print(f"events seen {len(rvs)} = {len(rvs)/secs:.0f}/s; RVs {rvs[0] if rvs else '-'}..{rvs[-1] if rvs else '-'}; "
      f"gaps {gaps}, duplicates {dups}, out of order {len(problems)}; final LIST RV {end} >= last event: {end >= (rvs[-1] if rvs else 0)}")
print("sim RSS MiB over time: " + " ".join(f"{t}s:{m:.0f}" for (t, _), m in zip(rss, mib)))
half = mib[len(mib)//2:]
print(f"RSS second half: min {min(half):.0f} max {max(half):.0f} MiB (bounded if flat)")
ok = not problems and gaps == 0 and dups == 0 and rvs and end >= rvs[-1]
for p in problems[:10]:
    print("  " + p)
sys.exit(0 if ok else 1)
PY
