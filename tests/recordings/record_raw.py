#!/usr/bin/env python3
"""Records the exact bytes a real kube-apiserver answers to metadata-only requests
(`as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`), next to its full JSON answers for the
same object versions, into `v1.28.7-raw/metadata-only.json` (issue 17, item 4).

Unlike the scenarios of `v1.28.7/` (bodies parsed, compared semantically), every body here is
kept as the exact text received, so that `tests/metadata_only.rs` can feed the full answers to
the proxy's cache and compare what it serves, metadata only, byte for byte.

Run against a throwaway cluster (it creates objects in `raw-meta*` namespaces):
    python3 tests/recordings/record_raw.py --kubeconfig /work/realk8s/kubeconfig
Standard library only, plus `kubectl` on PATH for the setup manifest.
"""

import argparse
import base64
import json
import pathlib
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
META = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
OUT = pathlib.Path(__file__).parent / "v1.28.7-raw" / "metadata-only.json"

SETUP = """
apiVersion: v1
kind: Namespace
metadata: {name: raw-meta}
---
apiVersion: v1
kind: Namespace
metadata: {name: raw-meta-empty}
---
apiVersion: v1
kind: Namespace
metadata: {name: raw-meta-watch}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: raw-meta}
---
apiVersion: v1
kind: Node
metadata: {name: raw-n1, labels: {kubernetes.io/hostname: raw-n1}, annotations: {a: "1"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm-1, namespace: raw-meta, labels: {app: a}, annotations: {note: "x\\u003cy\\"z"}}
data: {k: v}
---
apiVersion: v1
kind: Secret
metadata: {name: s-1, namespace: raw-meta}
stringData: {password: hunter2}
---
apiVersion: v1
kind: Service
metadata: {name: svc-1, namespace: raw-meta}
spec: {ports: [{port: 80}], selector: {app: a}}
---
apiVersion: v1
kind: Pod
metadata:
  name: p-1
  namespace: raw-meta
  labels: {app: a}
  finalizers: [example.com/keep]
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: cm-1, uid: 00000000-0000-0000-0000-000000000001, controller: true, blockOwnerDeletion: false}
spec:
  nodeName: raw-n1
  containers: [{name: c, image: busybox}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d-1, namespace: raw-meta}
spec:
  replicas: 1
  selector: {matchLabels: {app: d}}
  template:
    metadata: {labels: {app: d}}
    spec: {containers: [{name: c, image: busybox}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: j-1, namespace: raw-meta}
spec:
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: l-1, namespace: raw-meta}
spec: {holderIdentity: raw-n1, leaseDurationSeconds: 40}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: es-1, namespace: raw-meta, labels: {kubernetes.io/service-name: svc-1}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-1, namespace: raw-meta}
spec: {podSelector: {}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pdb-1, namespace: raw-meta}
spec: {minAvailable: 1, selector: {matchLabels: {app: a}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: r-1, namespace: raw-meta}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-1}
spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/pv-1}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: sc-1}
provisioner: example.com/none
"""


class Api:
    def __init__(self, kubeconfig: str):
        text = pathlib.Path(kubeconfig).read_text()
        # The realk8s kubeconfig is flow-style YAML: pick the three values without a YAML parser.
        self.server = text.split('server: "', 1)[1].split('"', 1)[0]
        ca = text.split('certificate-authority: "', 1)[1].split('"', 1)[0]
        self.token = text.split("token: ", 1)[1].split("}", 1)[0].strip().strip('"')
        self.ctx = ssl.create_default_context(cafile=ca)

    def request(self, path: str, query: dict | None = None, accept: str = "application/json",
                method: str = "GET", body: bytes | None = None, ctype: str | None = None):
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        req = urllib.request.Request(url, method=method, data=body)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", accept)
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as r:
                return r.status, r.headers.get("Content-Type"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read()

    def watch_lines(self, path: str, query: dict, accept: str, out: list, ready: threading.Event):
        url = self.server + path + "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", accept)
        with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
            out.append({"status": r.status, "content-type": r.headers.get("Content-Type")})
            ready.set()
            for line in r:
                out.append(line.decode())


def body_text(status, ctype, raw: bytes) -> dict:
    if ctype and ctype.startswith("application/json"):
        return {"status": status, "content-type": ctype, "body": raw.decode()}
    return {"status": status, "content-type": ctype, "body_base64": base64.b64encode(raw).decode()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    args = ap.parse_args()
    api = Api(args.kubeconfig)
    subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "apply", "-f", "-"],
                   input=SETUP.encode(), check=True, stdout=subprocess.DEVNULL)
    _, _, version = api.request("/version")
    out: dict = {
        "description": "Exact bytes of a real kube-apiserver: full JSON and metadata-only "
                       "answers for the same object versions (record_raw.py)",
        "apiserver_version": json.loads(version)["gitVersion"],
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lists": [], "gets": [], "edges": [],
    }

    # Every built-in list-able resource of discovery: a full LIST (limit 3), then the
    # metadata-only LIST of the same page at exactly its RV (same items, same token).
    groups = [("", "/api/v1")]
    _, _, g = api.request("/apis")
    for grp in json.loads(g)["groups"]:
        groups.append((grp["name"], "/apis/" + grp["preferredVersion"]["groupVersion"]))
    for group, base in groups:
        _, _, res = api.request(base)
        for r in json.loads(res)["resources"]:
            if "/" in r["name"] or "list" not in r.get("verbs", []):
                continue
            if r["name"] in ("events", "componentstatuses") or "events.k8s.io" in base:
                continue
            path = (base + "/namespaces/raw-meta/" if r["namespaced"] else base + "/") + r["name"]
            s, ct, full = api.request(path, {"limit": "3"})
            if s != 200:
                continue
            parsed = json.loads(full)
            if not parsed["items"]:
                path = base + "/" + r["name"]
                s, ct, full = api.request(path, {"limit": "3"})
                parsed = json.loads(full)
                if not parsed["items"]:
                    continue
            rv = parsed["metadata"]["resourceVersion"]
            q = {"limit": "3", "resourceVersion": rv, "resourceVersionMatch": "Exact"}
            ms, mct, meta = api.request(path, q, accept=META_LIST)
            entry = {"group": group, "resource": r["name"], "kind": r["kind"], "path": path,
                     "full": body_text(s, ct, full), "metadata": body_text(ms, mct, meta)}
            out["lists"].append(entry)
            # GET of the first item: full at RV 0 and metadata-only at RV 0, kept if equal RVs.
            item = parsed["items"][0]["metadata"]
            ns = f"/namespaces/{item['namespace']}" if r["namespaced"] else ""
            gpath = f"{base}{ns}/{r['name']}/{item['name']}"
            for _ in range(5):
                s1, c1, f1 = api.request(gpath, {"resourceVersion": "0"})
                s2, c2, m2 = api.request(gpath, {"resourceVersion": "0"}, accept=META)
                if s1 == s2 == 200 and json.loads(f1)["metadata"]["resourceVersion"] == \
                        json.loads(m2)["metadata"]["resourceVersion"]:
                    out["gets"].append({"resource": r["name"], "path": gpath,
                                        "full": body_text(s1, c1, f1), "metadata": body_text(s2, c2, m2)})
                    break

    # An empty list: what `items` is for PartialObjectMetadataList with nothing in it.
    path = "/api/v1/namespaces/raw-meta-empty/configmaps"
    s, ct, full = api.request(path)
    rv = json.loads(full)["metadata"]["resourceVersion"]
    ms, mct, meta = api.request(path, {"resourceVersion": rv, "resourceVersionMatch": "Exact"}, accept=META_LIST)
    out["empty_list"] = {"path": path, "full": body_text(s, ct, full), "metadata": body_text(ms, mct, meta)}

    # A watch seen twice at once, full and metadata-only, while configmaps change.
    wpath = "/api/v1/namespaces/raw-meta-watch/configmaps"
    _, _, lst = api.request(wpath)
    start = json.loads(lst)["metadata"]["resourceVersion"]
    q = {"watch": "1", "resourceVersion": start, "allowWatchBookmarks": "true", "timeoutSeconds": "4"}
    full_lines: list = []
    meta_lines: list = []
    r1, r2 = threading.Event(), threading.Event()
    t1 = threading.Thread(target=api.watch_lines, args=(wpath, q, "application/json", full_lines, r1))
    t2 = threading.Thread(target=api.watch_lines, args=(wpath, q, META, meta_lines, r2))
    t1.start()
    t2.start()
    r1.wait(10)
    r2.wait(10)
    time.sleep(0.5)
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "w-1", "namespace": "raw-meta-watch", "labels": {"x": "1"}}, "data": {"k": "v"}}
    api.request(wpath, method="POST", body=json.dumps(cm).encode(), ctype="application/json")
    api.request(wpath + "/w-1", method="PATCH", body=b'{"metadata":{"annotations":{"a":"b"}}}',
                ctype="application/merge-patch+json")
    api.request(wpath + "/w-1", method="DELETE")
    t1.join()
    t2.join()
    out["watch"] = {"path": wpath, "query": q, "full": full_lines, "metadata": meta_lines}

    # Negotiation edges: what the apiserver answers for the representations the cache forwards.
    cm_path = "/api/v1/namespaces/raw-meta/configmaps"
    for name, path, accept, query in [
        ("list as PartialObjectMetadata (not List)", cm_path, META, {}),
        ("get as PartialObjectMetadataList", cm_path + "/cm-1", META_LIST, {"resourceVersion": "0"}),
        ("list as v1beta1 PartialObjectMetadataList", cm_path,
         "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", {}),
        ("list as PartialObjectMetadataList without g/v", cm_path,
         "application/json;as=PartialObjectMetadataList", {}),
        ("list protobuf metadata first, JSON metadata second", cm_path,
         "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
         + META_LIST + ",application/json", {}),
        ("list metadata at q=0.5 after plain JSON", cm_path, META_LIST + ";q=0.5,application/json", {}),
    ]:
        s, ct, raw = api.request(path, query, accept=accept)
        out["edges"].append({"name": name, "path": path, "accept": accept, "query": query,
                             "response": body_text(s, ct, raw)})

    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}: {len(out['lists'])} lists, {len(out['gets'])} gets, "
          f"{len(full_lines)} + {len(meta_lines)} watch lines, {len(out['edges'])} edges")


if __name__ == "__main__":
    main()
