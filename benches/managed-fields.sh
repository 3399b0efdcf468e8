#!/usr/bin/env bash
# The managedFields opt-out (issue 34 item 2, KEP-5958 `Accept: …;drop=metadata.managedFields`):
# a LIST of N pods (default 10 000) written like tests/recordings/v1.28.7-raw/ssa-pod.json — a
# real 1.28.7 apiserver's pod applied server-side and its status patched by a kubelet, so
# managedFields of two managers — through the proxy, with and without the opt-out, in JSON and
# protobuf, on the same sim + proxy pair (two processes, see benches/sim-proxy.sh). Prints, for
# each form, the bytes of one LIST and the proxy's CPU per LIST (utime+stime of its process over
# REPS LISTs, after one warm-up LIST of that form: the first lean read of an object version
# strips it once, kept for later reads, and its cost is printed apart), and the sim's CPU for the
# same full JSON LIST (the upstream, a 1.28 apiserver, has no opt-out: a client of it gets the
# full bytes). The proxy's RSS growth over each form's first LIST shows what the lean copies
# (and the protobuf forms, made at the first protobuf read) keep.
# Usage: benches/managed-fields.sh [pods] [reps]   (builds release first)
set -euo pipefail
cd "$(dirname "$0")/.."
PODS=10000; REPS=20
[[ "${1:-}" =~ ^[0-9]+$ ]] && { PODS=$1; shift; }
[[ "${1:-}" =~ ^[0-9]+$ ]] && { REPS=$1; shift; }
source benches/sim-proxy.sh
SIM_ADDR=127.0.0.1:18351
PROXY_ADDR=127.0.0.1:18352
split_flags
start_pair
python3 - "$SIM_ADDR" "$PROXY_ADDR" "$SIM" "$P" "$PODS" "$REPS" <<'PY'
import http.client, json, os, sys, time
sim, proxy, sim_pid, proxy_pid, pods, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rec = json.load(open("tests/recordings/v1.28.7-raw/ssa-pod.json"))
template = json.loads(next(a for a in rec["answers"] if a["accept"] == "application/json")["body"])
for k in ("uid", "resourceVersion", "creationTimestamp"):
    template["metadata"].pop(k, None)
tick = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0

def conn(addr):
    h, p = addr.split(":")
    return http.client.HTTPConnection(h, int(p), timeout=600)

c = conn(sim)
def call(method, path, body):
    c.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    if r.status >= 300:
        sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mf"}})
t0 = time.time()
for i in range(pods):
    p = json.loads(json.dumps(template))
    name = f"web-7d9f8b6c5d-{i:05d}"
    p["metadata"]["name"] = name
    call("POST", "/api/v1/namespaces/mf/pods", p)
    call("PUT", f"/api/v1/namespaces/mf/pods/{name}/status", p)
print(f"seeded {pods} pods in {time.time() - t0:.0f} s", flush=True)

pc = conn(proxy)
def list_(accept, addr_conn=None):
    cc = addr_conn or pc
    cc.request("GET", "/api/v1/pods?resourceVersion=0", headers={"Accept": accept})
    r = cc.getresponse(); body = r.read()
    assert r.status == 200, (r.status, body[:200])
    return body
# Wait until the proxy holds every pod.
while True:
    n = json.loads(list_("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")).get("items") or []
    if len(n) >= pods:
        break
    time.sleep(0.5)

D = ";drop=metadata.managedFields"
PB = "application/vnd.kubernetes.protobuf"
forms = [("JSON", "application/json"), ("JSON, drop", "application/json" + D),
         ("protobuf", PB), ("protobuf, drop", PB + D)]
rows = []
for label, accept in forms:
    m0 = rss(proxy_pid); c0 = cpu(proxy_pid); first = list_(accept); first_cpu = cpu(proxy_pid) - c0
    grew = rss(proxy_pid) - m0
    if "drop" in label:
        assert b"managedFields" not in first, label
    c0 = cpu(proxy_pid); t0 = time.time()
    for _ in range(reps):
        body = list_(accept)
    per = (cpu(proxy_pid) - c0) / reps; wall = (time.time() - t0) / reps
    rows.append((label, len(body), per, wall, first_cpu, grew))
sc = conn(sim)
c0 = cpu(sim_pid)
for _ in range(reps):
    sim_body = list_("application/json", sc)
sim_per = (cpu(sim_pid) - c0) / reps
print(f"{pods} pods, {reps} LISTs per form (proxy CPU per LIST: utime+stime / {reps}; first: the warm-up LIST)")
base = {l: (b, c) for l, b, c, _, _, _ in rows}
for label, size, per, wall, first, grew in rows:
    ref = base[label.split(",")[0]]
    print(f"  {label:15} {size/1e6:7.2f} MB ({size/ref[0]:5.1%} of full)  proxy {per*1e3:6.1f} ms CPU per LIST "
          f"({per/ref[1]:5.1%} of full), wall {wall*1e3:6.1f} ms; first LIST {first*1e3:6.1f} ms CPU, RSS {grew/1e6:+.1f} MB")
print(f"  sim (upstream) full JSON LIST: {len(sim_body)/1e6:.2f} MB, {sim_per*1e3:.1f} ms CPU per LIST")
PY
