#!/usr/bin/env python3
"""Records the same watch events from a real kube-apiserver twice, in JSON and in protobuf, while
the writes a cluster's status writers make go on, into `v1.28.7-raw/protobuf-edits.json`: so
that tests can replay the JSON events into the cache and compare the protobuf frames it makes
(each new version encoded from its predecessor's encoding: `proto::splice`, `proto::window`,
`proto::after`) with the apiserver's own, byte for byte.

Resources and writes (in namespace `rec-pb-edits`, and cluster-scoped nodes `rec-pb-edits-*`):
- leases: `renewTime` renewed (a scalar), `holderIdentity` changed, `leaseTransitions` and
  `acquireTime` appearing (members added);
- nodes: heartbeats of every condition (`lastHeartbeatTime`), a condition flipping (status,
  reason, message, `lastTransitionTime`), an image added to `status.images`, a taint added and
  removed, labels;
- pods: readiness flipping (conditions and container statuses), a container restarting (its
  state `running` → `terminated` → `running`, `lastState` filled, `restartCount`), a condition's
  `lastProbeTime` going from null to a time, annotations and labels added, changed and removed,
  one pod deleted (DELETED) and one created (ADDED) at the end.

For each resource: the JSON LIST the watches start from (`list`), then the two watch streams
from its resourceVersion (`json`, `proto`: the exact bytes, base64), each ended by the
apiserver's `timeoutSeconds`.

Run against the throwaway realk8s apiserver (../shared/realk8s; it deletes and re-creates its
own objects each run):
    python3 tests/recordings/record_protobuf_edits.py [--realk8s /work/k8s] [--rounds 12]
Standard library only: the admin token of tokens.csv and the CA of pki/.
"""

import argparse
import base64
import json
import pathlib
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

OUT = pathlib.Path(__file__).parent / "v1.28.7-raw" / "protobuf-edits.json"
PB = "application/vnd.kubernetes.protobuf"
NS = "rec-pb-edits"
N = 3
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class Api:
    def __init__(self, realk8s: str):
        self.server = "https://127.0.0.1:6443"
        self.token = open(realk8s + "/tokens.csv").readline().split(",")[0]
        self.ctx = ssl.create_default_context(cafile=realk8s + "/pki/ca.crt")

    def req(self, method, path, body=None, ctype="application/json", accept="application/json"):
        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(self.server + path, method=method, data=data)
        r.add_header("Authorization", "Bearer " + self.token)
        r.add_header("Accept", accept)
        if data is not None:
            r.add_header("Content-Type", ctype)
        return r

    def call(self, method, path, body=None, ctype="application/json", ok=(404, 409)):
        try:
            with urllib.request.urlopen(self.req(method, path, body, ctype), context=self.ctx, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            if e.code not in ok:
                raise SystemExit(f"{method} {path}: {e.code} {raw[:300]!r}")
            return e.code, raw

    def stream(self, path, accept, out, ready):
        with urllib.request.urlopen(self.req("GET", path, accept=accept), context=self.ctx, timeout=300) as r:
            ready.release()
            out.append(r.read())


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def micro():
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime()) + f"{int(time.time() * 1e6) % 1000000:06d}Z"


def conditions(ready: bool, probe: bool):
    t = now()
    out = []
    for c in ("Initialized", "Ready", "ContainersReady", "PodScheduled"):
        st = "True" if c not in ("Ready", "ContainersReady") or ready else "False"
        cond = {"type": c, "status": st, "lastProbeTime": t if probe and c == "Ready" else None, "lastTransitionTime": t}
        if st == "False":
            cond.update(reason="ContainersNotReady", message="containers with unready status: [main]")
        out.append(cond)
    return out


def container(r: int, ready: bool, running: bool):
    state = {"running": {"startedAt": now()}} if running else {
        "terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": now(), "finishedAt": now(),
                       "containerID": f"containerd://{r:064x}"}}
    last = {} if r == 0 else {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now(), "finishedAt": now(),
                                            "containerID": f"containerd://{r - 1:064x}"}}
    return {"name": "main", "image": "registry.example.com/team/app:v1.2.3",
            "imageID": "registry.example.com/team/app@sha256:" + "ab" * 32,
            "containerID": f"containerd://{r:064x}", "ready": ready, "restartCount": r, "started": running,
            "state": state, "lastState": last}


def setup(api: Api):
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    # Without a controller-manager nobody makes the namespace's default service account.
    api.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    for i in range(N + 1):
        api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/pod-{i}", {"gracePeriodSeconds": 0})
        api.call("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lease-{i}")
        api.call("DELETE", f"/api/v1/nodes/{NS}-node-{i}")
    for i in range(N):
        api.call("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": f"lease-{i}"},
            "spec": {"holderIdentity": f"holder-{i}", "leaseDurationSeconds": 40, "renewTime": micro()}})
        node = f"{NS}-node-{i}"
        api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "labels": {"rec-pb-edits": "yes", "kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}},
            "spec": {"podCIDR": f"10.244.{i}.0/24", "podCIDRs": [f"10.244.{i}.0/24"]}})
        api.call("PATCH", f"/api/v1/nodes/{node}/status", {"status": {
            "capacity": {"cpu": "4", "memory": "16394500Ki", "pods": "110", "ephemeral-storage": "101430960Ki"},
            "allocatable": {"cpu": "4", "memory": "16292100Ki", "pods": "110", "ephemeral-storage": "93478772582"},
            "conditions": [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": now(),
                            "lastTransitionTime": now()} for t, s, r, m in (
                ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                ("Ready", "True", "KubeletReady", "kubelet is posting ready status"))],
            "addresses": [{"type": "InternalIP", "address": f"172.18.0.{i + 2}"}, {"type": "Hostname", "address": node}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:08x}-0000-0000-0000-000000000000",
                         "bootID": f"{i:08x}-1111-2222-3333-444444444444", "kernelVersion": "6.1.0",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.28.7", "kubeProxyVersion": "v1.28.7", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": ["registry.k8s.io/pause@sha256:" + "cd" * 32, "registry.k8s.io/pause:3.9"],
                        "sizeBytes": 321520}]}}, STRATEGIC, ok=())
        api.call("POST", f"/api/v1/namespaces/{NS}/pods", pod(i), ok=())
        pod_status(api, i, 0, ready=True, running=True, probe=False)


def pod(i: int):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "labels": {"app": "rec-pb"},
            "annotations": {"kubectl.kubernetes.io/default-container": "main"}},
            "spec": {"nodeName": f"{NS}-node-{i % N}", "containers": [{
                "name": "main", "image": "registry.example.com/team/app:v1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5}}]}}


def pod_status(api: Api, i: int, r: int, ready: bool, running: bool, probe: bool):
    status = {"phase": "Running", "conditions": conditions(ready, probe), "hostIP": f"172.18.0.{i % N + 2}",
              "podIP": f"10.244.{i % N}.{i + 10}", "podIPs": [{"ip": f"10.244.{i % N}.{i + 10}"}],
              "startTime": now(), "qosClass": "Burstable", "containerStatuses": [container(r, ready, running)]}
    api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}/status", {"status": status}, MERGE, ok=())


def writes(api: Api, rounds: int):
    for r in range(1, rounds + 1):
        for i in range(N):
            lease = {"renewTime": micro()}
            if r % 4 == 0:
                lease.update(holderIdentity=f"holder-{i}-{r}", leaseTransitions=r // 4, acquireTime=micro())
            api.call("PATCH", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lease-{i}", {"spec": lease}, MERGE, ok=())
            node = f"{NS}-node-{i}"
            conds = [{"type": t, "lastHeartbeatTime": now()} for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
            ready = {"type": "Ready", "lastHeartbeatTime": now()}
            if r % 5 == 0:
                ready.update(status="False", reason="KubeletNotReady", message="container runtime is down",
                             lastTransitionTime=now())
            elif r % 5 == 1 and r > 1:
                ready.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                             lastTransitionTime=now())
            status = {"conditions": conds + [ready]}
            if r == 6:
                status["images"] = [{"names": ["registry.example.com/team/app@sha256:" + "ab" * 32,
                                               "registry.example.com/team/app:v1.2.3"], "sizeBytes": 52428800},
                                    {"names": ["registry.k8s.io/pause@sha256:" + "cd" * 32, "registry.k8s.io/pause:3.9"],
                                     "sizeBytes": 321520}]
            api.call("PATCH", f"/api/v1/nodes/{node}/status", {"status": status}, STRATEGIC, ok=())
            if r in (7, 9):
                taints = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}] if r == 7 else None
                api.call("PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": taints}}, MERGE, ok=())
            # Pods: readiness flips every third round, a restart every fourth (terminated, then
            # running again the round after), the Ready condition probed from the fifth.
            restarts = r // 4
            pod_status(api, i, restarts, ready=r % 3 != 0, running=r % 4 != 0, probe=r >= 5)
            if r % 3 == 2:
                ann = {"rec-pb-edits/seq": str(r), f"rec-pb-edits/r{r}": "x" * 80, f"rec-pb-edits/r{r - 3}": None}
                api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}", {"metadata": {"annotations": ann}}, MERGE, ok=())
            if r % 5 == 2:
                labels = {"round": str(r), f"r{r}": "x", f"r{r - 5}": None}
                api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/pod-{i}", {"metadata": {"labels": labels}}, MERGE, ok=())
        time.sleep(0.3)
    api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/pod-0", {"gracePeriodSeconds": 0}, ok=())
    api.call("POST", f"/api/v1/namespaces/{NS}/pods", pod(N), ok=())
    pod_status(api, N, 0, ready=False, running=True, probe=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--realk8s", default="/work/k8s")
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    api = Api(a.realk8s)
    _, version = api.call("GET", "/version")
    setup(api)
    resources = [
        ("coordination.k8s.io", "v1", "leases", "Lease", True, f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", ""),
        ("", "v1", "nodes", "Node", False, "/api/v1/nodes", "labelSelector=rec-pb-edits%3Dyes"),
        ("", "v1", "pods", "Pod", True, f"/api/v1/namespaces/{NS}/pods", ""),
    ]
    timeout = 20 + a.rounds * 2
    out, threads, ready = [], [], threading.Semaphore(0)
    for group, version_, resource, kind, namespaced, path, sel in resources:
        q = sel + ("&" if sel else "")
        _, body = api.call("GET", f"{path}?{sel}")
        rv = json.loads(body)["metadata"]["resourceVersion"]
        streams = {"json": [], "proto": []}
        watch = f"{path}?{q}watch=1&resourceVersion={rv}&allowWatchBookmarks=false&timeoutSeconds={timeout}"
        for name, accept in (("json", "application/json"), ("proto", PB)):
            t = threading.Thread(target=api.stream, args=(watch, accept, streams[name], ready))
            t.start()
            threads.append(t)
        out.append({"group": group, "version": version_, "resource": resource, "kind": kind, "namespaced": namespaced,
                    "path": path, "query": sel, "start_resourceVersion": rv, "list": body.decode(), "streams": streams})
    for _ in threads:
        ready.acquire()
    time.sleep(0.5)
    writes(api, a.rounds)
    for t in threads:
        t.join()
    for r in out:
        s = r.pop("streams")
        r["json"] = s["json"][0].decode()
        r["proto"] = base64.b64encode(s["proto"][0]).decode()
        print(f"{r['resource']}: {r['json'].count(chr(10))} JSON events, {len(s['proto'][0])} protobuf bytes")
    OUT.write_text(json.dumps({"recorded_with": json.loads(version), "resources": out}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
