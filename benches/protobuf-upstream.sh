#!/usr/bin/env bash
# Protobuf watch events from the cache against a real apiserver's own (issue 35 §4): the proxy
# encodes each new object version from the previous version's encoding (`proto::splice` when
# only scalars changed, else `proto::window`, else whole), the apiserver from its decoded
# object. Writes, through the apiserver, the changes a cluster's status writers make — leases
# renewed (`renewTime`, `leaseTransitions`), node heartbeats (a condition's
# `lastHeartbeatTime`), pods' container statuses (`restartCount`, `ready`) and labels (values
# and annotations changed, labels added and removed) — while
# two protobuf watches of each resource (a kubelet's `Accept`) run from the same
# resourceVersion: one at the apiserver, one through the proxy. Every frame must be the same
# bytes, in the same order, and the proxy must have served its watches from the cache (nothing
# forwarded). Prints, per resource, the frames compared, and how the proxy made its encodings
# (`watchcache_protobuf_encodings_total`).
# Usage: benches/protobuf-upstream.sh KUBECONFIG [rounds]   (BIN=… another build of the proxy)
# The kubeconfig must name a token and a CA file (as ../shared/realk8s's does). Port 18183.
set -euo pipefail
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
KC="${1:?usage: benches/protobuf-upstream.sh KUBECONFIG [rounds]}"
ROUNDS="${2:-20}"
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/kube-watchcache
fi
read -r SERVER CA TOKEN < <(python3 benches/support/kubeconfig.py "$KC")
WORK=$(mktemp -d)
trap 'kill ${PP:-} $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
P=127.0.0.1:18183
$BIN serve --kubeconfig "$KC" --resources coordination.k8s.io/leases,nodes,pods \
    --insecure-listen $P --auth=none --log-level error &
PP=$!
until curl -sf "http://$P/readyz" >/dev/null; do sleep 0.3; done
export SERVER CA TOKEN P ROUNDS WORK
python3 - <<'PY'
import http.client, json, os, ssl, struct, subprocess, sys, time, urllib.parse
server, ca, token, proxy, rounds, work = (os.environ[k] for k in ("SERVER", "CA", "TOKEN", "P", "ROUNDS", "WORK"))
rounds = int(rounds)
u = urllib.parse.urlparse(server)
H = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
c = http.client.HTTPSConnection(u.hostname, u.port, context=ssl.create_default_context(cafile=ca))

def call(method, path, body=None, ctype="application/json"):
    c.request(method, path, json.dumps(body) if body is not None else None, dict(H, **{"Content-Type": ctype}))
    r = c.getresponse(); d = r.read()
    if r.status >= 300 and r.status != 409:
        sys.exit(f"{method} {path}: {r.status} {d[:300]!r}")
    return json.loads(d) if d else None

NS = "pb-check"
call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
# Without a controller-manager nobody makes the namespace's default service account.
call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
now = lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
micro = lambda: time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime()) + f"{int(time.time() * 1e6) % 1000000:06d}Z"
N = 3
for i in range(N):
    call("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": f"lease-{i}"}, "spec": {"holderIdentity": f"holder-{i}", "leaseDurationSeconds": 40, "renewTime": micro(), "leaseTransitions": 0}})
    call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"pb-node-{i}", "labels": {"pb-check": "yes"}}})
    call("PATCH", f"/api/v1/nodes/pb-node-{i}/status", {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}}, "application/strategic-merge-patch+json")
    call("POST", f"/api/v1/namespaces/{NS}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "labels": {"app": "pb"}},
         "spec": {"nodeName": f"pb-node-{i}", "containers": [{"name": "main", "image": "registry.example.com/app:v1"}]}})
    call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}/status", {"status": {"phase": "Running", "containerStatuses": [
        {"name": "main", "image": "registry.example.com/app:v1", "imageID": "", "ready": True, "restartCount": 0,
         "started": True, "state": {"running": {"startedAt": now()}}, "lastState": {}}]}}, "application/merge-patch+json")

paths = {
    "leases": f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
    "nodes": "/api/v1/nodes?labelSelector=pb-check%3Dyes",
    "pods": f"/api/v1/namespaces/{NS}/pods",
}
rv = {k: call("GET", p)["metadata"]["resourceVersion"] for k, p in paths.items()}
# Both watches from the same RV once the proxy has reached it.
time.sleep(1)
accept = "application/vnd.kubernetes.protobuf, application/json"
procs = []
for k, p in paths.items():
    q = ("&" if "?" in p else "?") + f"watch=1&resourceVersion={rv[k]}&allowWatchBookmarks=false"
    for side, base, extra in (("direct", server, ["--cacert", ca, "-H", "Authorization: Bearer " + token]), ("proxy", "http://" + proxy, [])):
        procs.append(subprocess.Popen(["curl", "-sN", "-A", "kube-watchcache-bench", "--max-time", str(8 + rounds * 3 // 2), "-H", "Accept: " + accept,
                                       *extra, "-o", f"{work}/{k}.{side}", base + p + q]))
time.sleep(1)
for r in range(rounds):
    for i in range(N):
        call("PATCH", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lease-{i}",
             {"spec": {"renewTime": micro(), **({"leaseTransitions": r} if r % 5 == 4 else {})}}, "application/merge-patch+json")
        call("PATCH", f"/api/v1/nodes/pb-node-{i}/status", {"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": now()}]}},
             "application/strategic-merge-patch+json")
        status = {"containerStatuses": [{"name": "main", "image": "registry.example.com/app:v1", "imageID": "", "ready": r % 3 != 2,
                  "restartCount": r, "started": True, "state": {"running": {"startedAt": now()}}, "lastState": {}}]}
        call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}/status", {"status": status}, "application/merge-patch+json")
        if r % 5 == 3:
            # An annotation's value changed (a map's value: spliced; the first time added: walked).
            call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}", {"metadata": {"annotations": {"pb-check/seq": str(r)}}},
                 "application/merge-patch+json")
        if r % 7 == 6:
            # A label's value changed (spliced), one added and one removed (walked).
            labels = {"round": str(r), f"r{r}": "x", f"r{r - 7}": None}
            call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}", {"metadata": {"labels": labels}}, "application/merge-patch+json")
    time.sleep(1.0)
for p in procs:
    p.wait()

def frames(path):
    b = open(path, "rb").read(); out = []
    while len(b) >= 4:
        n = struct.unpack(">I", b[:4])[0]
        if len(b) < 4 + n:
            break
        out.append(b[4:4 + n]); b = b[4 + n:]
    return out

bad = 0
for k in paths:
    d, p = frames(f"{work}/{k}.direct"), frames(f"{work}/{k}.proxy")
    same = sum(1 for a, b in zip(d, p) if a == b)
    ok = len(d) == len(p) and same == len(d) and len(d) > 0
    bad += not ok
    print(f"{k:7} frames: apiserver {len(d)}, proxy {len(p)}, byte-identical {same}: {'ok' if ok else 'DIFFERENT'}")
    if not ok:
        first = next((i for i, (a, b) in enumerate(zip(d, p)) if a != b), None)
        print(f"  first difference at frame {first}")
sys.exit(1 if bad else 0)
PY
M=$(curl -s "http://$P/watchcache/metrics")
echo "$M" | grep -E '^watchcache_protobuf_encodings_total\{' | grep -v ' 0$' || true
if echo "$M" | grep -E '^watchcache_forwarded_requests_total' | grep -qv ' 0$'; then
    echo "$M" | grep -E '^watchcache_forwarded_requests_total'
    echo "the proxy forwarded requests: not all served from the cache" >&2
    exit 1
fi
echo "$M" | grep -qE '^watchcache_requests_total\{.*served="cache".*verb="watch"' ||
    { echo "no watch served from the cache" >&2; exit 1; }
