#!/usr/bin/env python3
"""Records what a real kube-apiserver answers in protobuf (`application/vnd.kubernetes.protobuf`),
next to its JSON answers for the same object versions, into `v1.28.7-raw/protobuf.json`, so that
tests can compare the proxy's protobuf bytes with the apiserver's, byte for byte.

Every body is kept complete and exact: JSON text as `"body"`, anything else (protobuf, watch
streams) as `"body_b64"`. The recorder also decodes a few fields (resourceVersions, names, watch
event types) with a minimal protobuf reader, only to check that the JSON and protobuf answers show
the same object versions and to write the `events` summaries of the watch streams.

Sections: `lists` (every list-able built-in resource of discovery: JSON, protobuf and
metadata-only protobuf at one resourceVersion), `gets`, `watch` (one configmap watch opened three
ways at once, 70 s, with bookmarks), `watchlist` (apiserver restarted with
--feature-gates=WatchList=true, then restored), `errors`, `negotiation` (Accept header table).

Run against the throwaway realk8s apiserver (../shared/realk8s; it creates objects in `rec-pb*`
namespaces and cluster-scoped `rec-pb-*` objects, reuses them when they exist, compacts etcd once
and restarts the apiserver twice):
    python3 tests/recordings/record_protobuf.py [--realk8s /work/realk8s] [--skip-watchlist]
Standard library only: the admin token of tokens.csv, the CA of pki/, etcd's JSON gateway on
127.0.0.1:2379 (compaction), and ../shared/realk8s/{down,up}.sh for the WatchList restart.
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

PB = "application/vnd.kubernetes.protobuf"
PB_META_LIST = PB + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PB_META = PB + ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
JSON = "application/json"
OUT = pathlib.Path(__file__).parent / "v1.28.7-raw" / "protobuf.json"
SCRIPTS = pathlib.Path("/work/shared/realk8s")
ETCD = "http://127.0.0.1:2379"

NS = "rec-pb"              # the rich objects
NS_SMALL = "rec-pb-small"  # 3 configmaps: negotiation and watch-list
NS_WATCH = "rec-pb-watch"  # the 70 s watch (emptied before it starts)
NODE = "rec-pb-node"
GROUP = "pb.rec.example.com"
CR_PATH = f"/apis/{GROUP}/v1/namespaces/{NS}/gadgets"

# A real ECDSA P-256 certificate request (CN=rec-pb-client, O=rec-pb), made once with
# `openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes`.
CSR_PEM = """-----BEGIN CERTIFICATE REQUEST-----
MIHkMIGLAgEAMCkxFjAUBgNVBAMMDXJlYy1wYi1jbGllbnQxDzANBgNVBAoMBnJl
Yy1wYjBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABPvsH3KMxANd90G97ycxqTXj
DuYrEytzeLR8fshEoo2hyy/26rKp+94awhQhjonzwQau3i8Y+yUqfblpROHglvCg
ADAKBggqhkjOPQQDAgNIADBFAiAqGaKg4M0iqMmcCFLlLvn/CvKDnB51hgjcvwUY
8MYOFAIhAPJU5yAeRw3Lv5N8EdUu8zeUFeH5T6IztPMMxvE3GRf6
-----END CERTIFICATE REQUEST-----
"""

ANN = {"rec-pb.example.com/note": "a<b>&c \"quoted\" \u00e9\u00e8 \u2713", "empty": ""}


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


# ---------------------------------------------------------------------------------------------
# HTTP


class Api:
    def __init__(self, realk8s: str):
        self.server = "https://127.0.0.1:6443"
        self.token = open(realk8s + "/tokens.csv").readline().split(",")[0]
        self.ctx = ssl.create_default_context(cafile=realk8s + "/pki/ca.crt")

    def _req(self, method, path, query, accept, body, ctype, headers):
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(url, method=method, data=data)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        return req

    def request(self, path, query=None, accept=JSON, method="GET", body=None,
                ctype="application/json", headers=None):
        """(status, content-type, raw body, extra headers kept, elapsed s)"""
        req = self._req(method, path, query, accept, body, ctype, headers)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
                raw = r.read()
                return r.status, r.headers.get("Content-Type"), raw, kept(r.headers), time.monotonic() - t0
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, e.headers.get("Content-Type"), raw, kept(e.headers), time.monotonic() - t0

    def json(self, path, query=None, method="GET", body=None, ctype="application/json", headers=None):
        s, _, raw, _, _ = self.request(path, query, JSON, method, body, ctype, headers)
        try:
            return s, json.loads(raw)
        except ValueError:
            return s, {"raw": raw.decode(errors="replace")}

    def stream(self, path, query, accept, ready=None):
        """Reads a whole (watch) response; returns the exact bytes and when each chunk arrived."""
        req = self._req("GET", path, query, accept, None, None, None)
        t0 = time.monotonic()
        chunks = []
        try:
            r = urllib.request.urlopen(req, context=self.ctx, timeout=120)
        except urllib.error.HTTPError as e:
            if ready:
                ready.set()
            return {"status": e.code, "content_type": e.headers.get("Content-Type"), "chunks": [(0.0, e.read())],
                    "elapsed_s": round(time.monotonic() - t0, 3)}
        with r:
            if ready:
                ready.set()
            while True:
                b = r.read1(65536)
                if not b:
                    break
                chunks.append((round(time.monotonic() - t0, 3), b))
            return {"status": r.status, "content_type": r.headers.get("Content-Type"), "chunks": chunks,
                    "elapsed_s": round(time.monotonic() - t0, 3), "headers": kept(r.headers)}


def kept(headers) -> dict:
    out = {}
    for k in ("Retry-After", "Transfer-Encoding", "Content-Encoding"):
        if headers.get(k) is not None:
            out[k.lower()] = headers.get(k)
    return out


def rec(status, ctype, raw, extra=None, elapsed=None, query=None) -> dict:
    """A response recorded exactly: JSON text as `body`, anything else as `body_b64`."""
    out = {"status": status, "content_type": ctype}
    if query is not None:
        out["query"] = query
    if ctype and ctype.split(";")[0].strip() == "application/json":
        out["body"] = raw.decode()
    else:
        out["body_b64"] = b64(raw)
    if extra:
        out["headers"] = extra
    if elapsed is not None and elapsed > 1:
        out["elapsed_s"] = round(elapsed, 2)
    return out


# ---------------------------------------------------------------------------------------------
# A minimal protobuf reader (only for the recorder's own checks and summaries)


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def fields(b):
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((f, v))
    return out


def first(fs, n, default=b""):
    for f, v in fs:
        if f == n:
            return v
    return default


def unknown(b):
    """k8s\\0 + runtime.Unknown -> (apiVersion, kind, raw)"""
    assert b[:4] == b"k8s\x00", b[:8]
    fs = fields(b[4:])
    tm = fields(first(fs, 1))
    return first(tm, 1).decode(), first(tm, 2).decode(), first(fs, 2)


def obj_meta(raw):
    """(namespace, name, resourceVersion) of an object's ObjectMeta (field 1 of every built-in)"""
    m = fields(first(fields(raw), 1))
    return first(m, 3).decode(), first(m, 1).decode(), first(m, 6).decode()


def pb_list(body):
    _, kind, raw = unknown(body)
    fs = fields(raw)
    lm = fields(first(fs, 1))
    return first(lm, 2).decode(), [obj_meta(v) for f, v in fs if f == 2]


def pb_object(body):
    return obj_meta(unknown(body)[2])


def json_list(text):
    d = json.loads(text)
    return d["metadata"].get("resourceVersion", ""), [
        (i["metadata"].get("namespace", ""), i["metadata"]["name"], i["metadata"].get("resourceVersion", ""))
        for i in d["items"]]


def json_object(text):
    m = json.loads(text)["metadata"]
    return m.get("namespace", ""), m["name"], m.get("resourceVersion", "")


def pb_status(raw):
    fs = fields(raw)
    return {"kind": "Status", "status": first(fs, 2).decode(), "reason": first(fs, 4).decode(),
            "code": first(fs, 6, 0), "message": first(fs, 3).decode()}


def summarize_watch(ctype, chunks):
    """The events of a watch stream with their arrival time (decoded by the recorder)."""
    data = b"".join(c for _, c in chunks)
    ends, pos = [], 0
    for t, c in chunks:
        pos += len(c)
        ends.append((pos, t))

    def at(end):
        for p, t in ends:
            if p >= end:
                return t
        return None

    events = []
    base = (ctype or "").split(";")[0].strip()
    if base == "application/json":
        pos = 0
        for line in data.split(b"\n"):
            pos += len(line) + 1
            if not line.strip():
                continue
            ev = json.loads(line)
            o = ev.get("object", {})
            m = o.get("metadata", {})
            e = {"type": ev.get("type"), "kind": o.get("kind"), "name": m.get("name"),
                 "resourceVersion": m.get("resourceVersion")}
            if m.get("annotations"):
                e["annotations"] = m["annotations"]
            if o.get("kind") == "Status":
                e.update(code=o.get("code"), reason=o.get("reason"), message=o.get("message"))
            e["offset_s"] = at(pos)
            events.append(e)
    elif base == PB:
        i = 0
        while i + 4 <= len(data):
            n = int.from_bytes(data[i:i + 4], "big")
            frame = data[i + 4:i + 4 + n]
            i += 4 + n
            fs = fields(frame)
            typ = first(fs, 1).decode()
            obj = first(fields(first(fs, 2)), 1)
            api_version, kind, raw = unknown(obj)
            e = {"type": typ, "frame_length": n, "apiVersion": api_version, "kind": kind}
            if kind == "Status":
                e.update(pb_status(raw))
            else:
                _, e["name"], e["resourceVersion"] = obj_meta(raw)
                ann = {first(fields(v), 1).decode(): first(fields(v), 2).decode()
                       for f, v in fields(first(fields(raw), 1)) if f == 12}
                if ann:
                    e["annotations"] = ann
            e["offset_s"] = at(i)
            events.append(e)
        if i != len(data):
            events.append({"trailing_bytes": len(data) - i})
    return events


def rec_stream(s, accept=None, query=None, path=None):
    data = b"".join(c for _, c in s["chunks"])
    out = {}
    if path:
        out["path"] = path
    if query is not None:
        out["query"] = query
    if accept:
        out["accept"] = accept
    out.update(status=s["status"], content_type=s["content_type"], body_b64=b64(data),
               length=len(data), elapsed_s=s["elapsed_s"])
    if s.get("headers"):
        out["headers"] = s["headers"]
    if s["status"] == 200:
        try:
            out["events"] = summarize_watch(s["content_type"], s["chunks"])
        except Exception as e:  # noqa: BLE001 - a summary only
            out["events_error"] = repr(e)
    return out


# ---------------------------------------------------------------------------------------------
# Setup: rich objects (created once, reused when they exist)


def pod_template(app, extra_spec=None):
    spec = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9",
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}],
            "terminationGracePeriodSeconds": 5}
    spec.update(extra_spec or {})
    return {"metadata": {"labels": {"app": app}, "annotations": {"rec-pb/t": "<t>"}}, "spec": spec}


def setup(api: Api, realk8s: str) -> list:
    log = []

    def create(path, obj, headers=None):
        s, body = api.json(path, method="POST", body=obj, headers=headers)
        m = obj["metadata"]
        log.append(f"POST {path} {m.get('name') or m.get('generateName')} -> {s}")
        if s not in (201, 200, 409):
            raise SystemExit(f"create {path} {m.get('name')}: {s} {json.dumps(body)[:800]}")
        return s == 201, body

    def uid(path):
        s, body = api.json(path)
        assert s == 200, (path, s, body)
        return body["metadata"]["uid"]

    core = "/api/v1"
    nsd = f"{core}/namespaces/{NS}"
    for n in (NS, NS_SMALL, NS_WATCH):
        create(f"{core}/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": n, "labels": {"rec-pb": "yes", "app.kubernetes.io/part-of": "rec-pb"}, "annotations": ANN}})
    create(f"{nsd}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    create(f"{nsd}/serviceaccounts", {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "rec-pb-sa", "labels": {"app": "rec-pb"}, "annotations": ANN},
        "secrets": [{"name": "secret-1"}], "imagePullSecrets": [{"name": "pull-1"}],
        "automountServiceAccountToken": False})

    # ConfigMaps: data + binaryData, an owned one, one kept by a finalizer while being deleted.
    create(f"{nsd}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm-1", "labels": {"app": "rec-pb", "tier": "web", "rec-pb.example.com/x": "y_z.1"},
                     "annotations": ANN},
        "data": {"k": "v", "multi": "line1\nline2\n", "html": "<a href=\"x\">&amp;</a>", "empty": "",
                 "unicode": "\u00e9\u4e2d\U0001F600"},
        "binaryData": {"bin": b64(b"\x00\x01\xfe\xff"), "zero": ""}})
    cm1 = uid(f"{nsd}/configmaps/cm-1")
    create(f"{nsd}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm-owned", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-1", "uid": cm1, "controller": True,
             "blockOwnerDeletion": True},
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "deploy-1",
             "uid": "00000000-0000-0000-0000-0000000000d1"}]},
        "data": {"a": "1"}, "immutable": True})
    new, _ = create(f"{nsd}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm-deleting", "finalizers": ["rec-pb.example.com/keep", "orphan-me.example.com/x"]},
        "data": {"a": "1"}})
    if new:
        s, _ = api.json(f"{nsd}/configmaps/cm-deleting", method="DELETE")
        log.append(f"DELETE {nsd}/configmaps/cm-deleting -> {s} (stays: finalizers; deletionTimestamp set)")

    # Secrets: an empty value; an immutable TLS one.
    create(f"{nsd}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "secret-1", "annotations": ANN},
        "type": "Opaque", "data": {"password": b64(b"hunter2"), "empty": "", "bin": b64(b"\x00\xff\n")}})
    create(f"{nsd}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "secret-tls"}, "immutable": True,
        "type": "kubernetes.io/tls", "data": {"tls.crt": b64(b"crt"), "tls.key": b64(b"key")}})

    # Node (by API, with status), PV, StorageClass, PVC, PriorityClass, RuntimeClass, CSI objects.
    create(f"{core}/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux",
                                              "node-role.kubernetes.io/worker": "",
                                              "topology.kubernetes.io/zone": "z-1", "rec-pb/runtime": "yes"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0", **ANN}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": "rec://rec-pb-node",
                 "taints": [{"key": "rec-pb/dedicated", "value": "yes", "effect": "NoSchedule"},
                            {"key": "rec-pb/flaky", "effect": "NoExecute", "timeAdded": "2026-11-25T10:00:00Z"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "16318440Ki", "pods": "110", "ephemeral-storage": "100Gi",
                         "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "3800m", "memory": "15.5Gi", "pods": "110", "ephemeral-storage": "95G",
                            "hugepages-2Mi": "0"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-11-25T10:00:00Z",
                            "lastTransitionTime": "2026-11-25T09:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}, {"type": "Hostname", "address": NODE}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1.0",
                         "osImage": "Debian", "containerRuntimeVersion": "containerd://1.7.0",
                         "kubeletVersion": "v1.28.7", "kubeProxyVersion": "v1.28.7", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": ["registry.k8s.io/pause:3.9"], "sizeBytes": 321520}]}})
    create("/apis/storage.k8s.io/v1/storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "rec-pb-sc", "annotations": ANN},
        "provisioner": "rec.csi.example.com", "parameters": {"type": "ssd", "iops": "3000"},
        "reclaimPolicy": "Retain", "allowVolumeExpansion": True, "mountOptions": ["noatime", "nfsvers=4.1"],
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["z-1", "z-2"]}]}]})
    create(f"{core}/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "rec-pb-pv", "labels": {"type": "local"}},
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "rec-pb-sc", "volumeMode": "Filesystem",
                 "local": {"path": "/mnt/disk1", "fsType": "ext4"},
                 "claimRef": {"namespace": NS, "name": "pvc-1"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}})
    create(f"{nsd}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pvc-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
                 "storageClassName": "rec-pb-sc", "volumeName": "rec-pb-pv", "volumeMode": "Filesystem"}})
    create("/apis/scheduling.k8s.io/v1/priorityclasses", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "rec-pb-priority"},
        "value": 1000000, "globalDefault": False, "preemptionPolicy": "Never",
        "description": "priority <for> rec-pb & friends"})
    create("/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "rec-pb-rc"}, "handler": "runc",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
        "scheduling": {"nodeSelector": {"rec-pb/runtime": "yes"},
                       "tolerations": [{"key": "rec-pb/dedicated", "operator": "Exists", "effect": "NoSchedule"}]}})
    create("/apis/storage.k8s.io/v1/csidrivers", {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "rec.csi.example.com"},
        "spec": {"attachRequired": True, "podInfoOnMount": True, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                 "fsGroupPolicy": "File", "storageCapacity": True, "requiresRepublish": False, "seLinuxMount": False,
                 "tokenRequests": [{"audience": "rec-pb", "expirationSeconds": 3600}, {"audience": ""}]}})
    create("/apis/storage.k8s.io/v1/csinodes", {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": NODE},
        "spec": {"drivers": [{"name": "rec.csi.example.com", "nodeID": "node-1",
                              "topologyKeys": ["topology.kubernetes.io/zone"], "allocatable": {"count": 10}}]}})
    create(f"/apis/storage.k8s.io/v1/namespaces/{NS}/csistoragecapacities", {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": {"name": "csc-1"},
        "storageClassName": "rec-pb-sc", "capacity": "10Gi", "maximumVolumeSize": "1Ti",
        "nodeTopology": {"matchLabels": {"topology.kubernetes.io/zone": "z-1"}}})
    create("/apis/storage.k8s.io/v1/volumeattachments", {
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "rec-pb-va"},
        "spec": {"attacher": "rec.csi.example.com", "nodeName": NODE, "source": {"persistentVolumeName": "rec-pb-pv"}}})

    # Service: targetPort as int and as a name.
    create(f"{nsd}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc-1", "labels": {"app": "rec-pb"}, "annotations": ANN},
        "spec": {"selector": {"app": "rec-pb"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                           {"name": "https", "port": 443, "targetPort": "https", "appProtocol": "https"},
                           {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}],
                 "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                 "publishNotReadyAddresses": True}})

    # The pod.
    create(f"{nsd}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod-1", "labels": {"app": "rec-pb", "tier": "web"}, "annotations": ANN,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-1", "uid": cm1}]},
        "spec": {
            "nodeName": NODE, "serviceAccountName": "rec-pb-sa", "automountServiceAccountToken": True,
            "priorityClassName": "rec-pb-priority", "runtimeClassName": "rec-pb-rc",
            "hostname": "pod-1", "subdomain": "svc-1", "dnsPolicy": "ClusterFirst",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                                "supplementalGroups": [4000, 5000, 0], "runAsNonRoot": True,
                                "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]},
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300},
                            {"key": "rec-pb/flaky", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0},
                            {"key": "rec-pb/dedicated", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z-1"]}]}}]}},
            "initContainers": [{"name": "init", "image": "busybox:1.36", "command": ["sh", "-c", "echo <init> && true"]}],
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.9", "imagePullPolicy": "IfNotPresent",
                "args": ["--flag=a&b", ""],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "https", "containerPort": 8443, "hostPort": 0}],
                "env": [{"name": "A", "value": "1"}, {"name": "EMPTY", "value": ""},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"containerName": "main",
                                                                               "resource": "limits.cpu",
                                                                               "divisor": "1m"}}},
                        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm-1", "key": "k",
                                                                            "optional": True}}}],
                "envFrom": [{"prefix": "S_", "secretRef": {"name": "secret-1"}}],
                "resources": {"requests": {"cpu": "100m", "memory": "1Gi", "ephemeral-storage": "1.5Gi"},
                              "limits": {"cpu": "0.5", "memory": "1536Mi", "ephemeral-storage": "2G"}},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP",
                                              "httpHeaders": [{"name": "X-Probe", "value": "<1>"}]},
                                  "initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 2},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "successThreshold": 1},
                "startupProbe": {"exec": {"command": ["sh", "-c", "test -f /tmp/ok"]}, "failureThreshold": 30},
                "lifecycle": {"preStop": {"httpGet": {"path": "/stop", "port": "https"}}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
                                 {"name": "scratch", "mountPath": "/scratch"},
                                 {"name": "proj", "mountPath": "/proj", "subPath": "x"}]}],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cm-1", "items": [{"key": "k", "path": "k.txt", "mode": 0o400}],
                                              "defaultMode": 0o644, "optional": True}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "proj", "projected": {"defaultMode": 0o440, "sources": [
                    {"configMap": {"name": "cm-1", "items": [{"key": "k", "path": "cm-k"}]}},
                    {"secret": {"name": "secret-1", "optional": False}},
                    {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                                               {"path": "cpu", "resourceFieldRef": {"containerName": "main",
                                                                                   "resource": "requests.cpu",
                                                                                   "divisor": "1"}}]}},
                    {"serviceAccountToken": {"audience": "rec-pb", "expirationSeconds": 3600, "path": "token"}}]}},
                {"name": "pvc", "persistentVolumeClaim": {"claimName": "pvc-1", "readOnly": True}}]}})

    # Workloads.
    apps = f"/apis/apps/v1/namespaces/{NS}"
    create(f"{apps}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "deploy-1", "annotations": ANN},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}}, "revisionHistoryLimit": 3,
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                 "template": pod_template("d")}})
    create(f"{apps}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs-1", "labels": {"app": "rs"}},
        "spec": {"replicas": 1, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["rs"]}]},
                 "template": pod_template("rs")}})
    create(f"{apps}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "sts-1"},
        "spec": {"replicas": 1, "serviceName": "svc-1", "selector": {"matchLabels": {"app": "s"}},
                 "podManagementPolicy": "Parallel",
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": "50%"}},
                 "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
                 "template": pod_template("s"),
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Mi"}}}}]}})
    sts = uid(f"{apps}/statefulsets/sts-1")
    create(f"{apps}/daemonsets", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds-1"},
        "spec": {"selector": {"matchLabels": {"app": "ds"}}, "minReadySeconds": 3,
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 0}},
                 "template": pod_template("ds", {"tolerations": [{"operator": "Exists"}]})}})
    create(f"{apps}/controllerrevisions", {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "sts-1-rev-1", "labels": {"controller.kubernetes.io/hash": "abc123"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "sts-1", "uid": sts,
                                          "controller": True, "blockOwnerDeletion": True}]},
        "data": {"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "s"}},
                                       "spec": {"containers": [{"name": "main", "image": "x<y>&z"}]}},
                          "n": 1.5, "list": [1, "two", None, True]}},
        "revision": 3})
    create(f"{core}/namespaces/{NS}/replicationcontrollers", {
        "apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc-1"},
        "spec": {"replicas": 0, "selector": {"app": "rc"}, "template": pod_template("rc")}})
    create(f"{core}/namespaces/{NS}/podtemplates", {
        "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "pt-1"}, "template": pod_template("pt")})
    batch = f"/apis/batch/v1/namespaces/{NS}"
    create(f"{batch}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job-1"},
        "spec": {"completions": 3, "parallelism": 2, "backoffLimit": 4, "activeDeadlineSeconds": 600,
                 "ttlSecondsAfterFinished": 100, "completionMode": "Indexed",
                 "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                     "containerName": "main", "operator": "In", "values": [42]}}]},
                 "template": pod_template("job", {"restartPolicy": "Never"})}})
    create(f"{batch}/cronjobs", {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cron-1"},
        "spec": {"schedule": "*/5 * * * *", "timeZone": "Etc/UTC", "concurrencyPolicy": "Forbid",
                 "startingDeadlineSeconds": 30, "suspend": True, "successfulJobsHistoryLimit": 1,
                 "jobTemplate": {"spec": {"template": pod_template("cron", {"restartPolicy": "OnFailure"})}}}})

    # Networking, policy, autoscaling, discovery.
    net = f"/apis/networking.k8s.io/v1"
    create(f"{net}/ingressclasses", {
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "rec-pb-ic"},
        "spec": {"controller": "example.com/ingress", "parameters": {
            "apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "p1", "scope": "Namespace",
            "namespace": NS}}})
    create(f"{net}/namespaces/{NS}/ingresses", {
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ing-1", "annotations": ANN},
        "spec": {"ingressClassName": "rec-pb-ic",
                 "defaultBackend": {"service": {"name": "svc-1", "port": {"number": 80}}},
                 "tls": [{"hosts": ["a.example.com"], "secretName": "secret-tls"}],
                 "rules": [{"host": "a.example.com", "http": {"paths": [
                     {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "svc-1", "port": {"name": "http"}}}},
                     {"path": "/exact", "pathType": "Exact", "backend": {"resource": {
                         "apiGroup": "k8s.example.com", "kind": "Bucket", "name": "b"}}}]}}]}})
    create(f"{net}/namespaces/{NS}/networkpolicies", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "np-1"},
        "spec": {"podSelector": {"matchLabels": {"app": "rec-pb"}}, "policyTypes": ["Ingress", "Egress"],
                 "ingress": [{"from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                                       {"namespaceSelector": {"matchLabels": {"rec-pb": "yes"}}}],
                              "ports": [{"port": 8080}, {"port": "http", "protocol": "TCP"},
                                        {"port": 9000, "endPort": 9100}]}],
                 "egress": [{}]}})
    pol = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
    create(pol, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb-int"},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "rec-pb"}}}})
    create(pol, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb-pct"},
                 "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "d"}},
                          "unhealthyPodEvictionPolicy": "AlwaysAllow"}})
    create(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "hpa-1"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "deploy-1"},
                 "minReplicas": 1, "maxReplicas": 5,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                                        "averageUtilization": 80}}},
                             {"type": "Pods", "pods": {"metric": {"name": "qps", "selector": {"matchLabels": {"a": "b"}}},
                                                       "target": {"type": "AverageValue", "averageValue": "1500m"}}},
                             {"type": "External", "external": {"metric": {"name": "queue"},
                                                               "target": {"type": "Value", "value": "30"}}}],
                 "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                                            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]},
                              "scaleUp": {"stabilizationWindowSeconds": 0,
                                          "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]}}}})
    create(f"{nsd}/endpoints", {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "svc-1", "labels": {"app": "rec-pb"}},
        "subsets": [{"addresses": [{"ip": "10.244.1.5", "nodeName": NODE, "hostname": "pod-1",
                                    "targetRef": {"kind": "Pod", "namespace": NS, "name": "pod-1"}}],
                     "notReadyAddresses": [{"ip": "10.244.1.6"}],
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                               {"name": "https", "port": 8443, "protocol": "TCP", "appProtocol": "https"}]}]})
    create(f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "svc-1-abcde", "labels": {"kubernetes.io/service-name": "svc-1"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": True, "serving": True, "terminating": False},
                       "hostname": "pod-1", "nodeName": NODE, "zone": "z-1",
                       "targetRef": {"kind": "Pod", "namespace": NS, "name": "pod-1"},
                       "hints": {"forZones": [{"name": "z-1"}]}},
                      {"addresses": ["10.244.1.6"], "conditions": {"ready": False}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}, {"name": ""}]})

    # RBAC (the cluster role also lets rec-pb-user create the CSR below).
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    create(f"{rbac}/namespaces/{NS}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "role-1"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cm-1"], "verbs": ["update"]}]})
    create(f"{rbac}/namespaces/{NS}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb-1"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-1"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
                     {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "devs"},
                     {"kind": "ServiceAccount", "name": "rec-pb-sa", "namespace": NS}]})
    create(f"{rbac}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "rec-pb-cr", "labels": {"rec-pb.example.com/aggregate": "true"}},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
                   "verbs": ["create", "get"]},
                  {"nonResourceURLs": ["/healthz", "/metrics/*"], "verbs": ["get"]}]})
    create(f"{rbac}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "rec-pb-aggregated"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rec-pb.example.com/aggregate": "true"}}]},
        "rules": []})
    create(f"{rbac}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "rec-pb-crb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rec-pb-cr"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "rec-pb-user"}]})

    # A CSR created by an impersonated user with uid, groups and extra (spec.* filled by the apiserver).
    csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
    new, _ = create(csrs, {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "rec-pb-csr"},
        "spec": {"request": b64(CSR_PEM.encode()), "signerName": "example.com/rec-pb-signer", "expirationSeconds": 86400,
                 "usages": ["digital signature", "key encipherment", "client auth"]}},
        headers={"Impersonate-User": "rec-pb-user", "Impersonate-Uid": "rec-pb-uid-1",
                 "Impersonate-Extra-Scopes": "view",
                 "Impersonate-Extra-Rec-Pb.example.com%2fteam": "blue <&>"})
    if new:
        s, c = api.json(f"{csrs}/rec-pb-csr")
        c["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "RecPbApprove",
                                       "message": "approved <by> rec-pb & co"}]}
        s, c = api.json(f"{csrs}/rec-pb-csr/approval", method="PUT", body=c)
        log.append(f"PUT {csrs}/rec-pb-csr/approval -> {s}")
        c["status"]["certificate"] = b64(pathlib.Path(realk8s + "/pki/ca.crt").read_bytes())
        s, _ = api.json(f"{csrs}/rec-pb-csr/status", method="PUT", body=c)
        log.append(f"PUT {csrs}/rec-pb-csr/status (certificate: the realk8s CA's PEM) -> {s}")

    # Lease with MicroTimes; events (core/v1 with eventTime + series, events.k8s.io/v1).
    create(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lease-1"},
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "leaseTransitions": 2,
                 "acquireTime": "2026-11-25T10:00:00.000001Z", "renewTime": "2026-11-25T10:00:05.123456Z"}})
    pod_uid = uid(f"{nsd}/pods/pod-1")
    create(f"{nsd}/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "pod-1.ev-core", "annotations": ANN},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "pod-1", "namespace": NS, "uid": pod_uid,
                           "fieldPath": "spec.containers{main}"},
        "reason": "Pulled", "message": "image <pause> pulled & ready", "type": "Normal",
        "source": {"component": "kubelet", "host": NODE},
        "firstTimestamp": "2026-11-25T10:00:00Z", "lastTimestamp": "2026-11-25T10:05:00Z", "count": 3,
        "eventTime": "2026-11-25T10:00:00.123456Z",
        "series": {"count": 2, "lastObservedTime": "2026-11-25T10:05:00.654321Z"},
        "action": "Pulling", "reportingComponent": "kubelet", "reportingInstance": NODE})
    create(f"/apis/events.k8s.io/v1/namespaces/{NS}/events", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "pod-1.ev-new"},
        "eventTime": "2026-11-25T11:00:00.000100Z",
        "series": {"count": 5, "lastObservedTime": "2026-11-25T11:10:00.999999Z"},
        "reportingController": "example.com/rec-pb", "reportingInstance": "rec-pb-1",
        "action": "Recording", "reason": "Recorded", "type": "Warning", "note": "note <with> & chars",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "pod-1", "namespace": NS, "uid": pod_uid},
        "related": {"apiVersion": "v1", "kind": "Node", "name": NODE}})

    # Admission webhooks that can never match anything (a resource nobody serves + matchCondition false).
    never = {"rules": [{"apiGroups": [GROUP], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                        "resources": ["nothings"], "scope": "Namespaced"}],
             "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1", "v1beta1"],
             "timeoutSeconds": 1, "matchPolicy": "Equivalent",
             "namespaceSelector": {"matchLabels": {"rec-pb/webhook": "never"}},
             "objectSelector": {"matchExpressions": [{"key": "rec-pb/never", "operator": "Exists"}]},
             "matchConditions": [{"name": "never", "expression": "false"}]}
    adm = "/apis/admissionregistration.k8s.io/v1"
    create(f"{adm}/validatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "rec-pb-vwc"},
        "webhooks": [{"name": "v.rec-pb.example.com", **never,
                      "clientConfig": {"url": "https://rec-pb.example.com:8443/validate",
                                       "caBundle": b64(b"\x00\x01rec-pb\xff")}}]})
    create(f"{adm}/mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rec-pb-mwc"},
        "webhooks": [{"name": "m.rec-pb.example.com", **never, "reinvocationPolicy": "IfNeeded",
                      "clientConfig": {"service": {"namespace": NS, "name": "svc-1", "path": "/mutate", "port": 443}}}]})

    # The CRD (schema with default, enum, preserve-unknown-fields, int-or-string, additionalProperties
    # as bool and as a schema, items, a description with < > &) and two custom objects.
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    create(crds, {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{GROUP}", "annotations": ANN},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList",
                           "shortNames": ["gd"], "categories": ["rec-pb"]},
                 "versions": [{
                     "name": "v1", "served": True, "storage": True,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                              "statusReplicasPath": ".status.replicas",
                                                              "labelSelectorPath": ".status.selector"}},
                     "additionalPrinterColumns": [
                         {"name": "Color", "type": "string", "jsonPath": ".spec.color", "description": "<c>"},
                         {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                     "schema": {"openAPIV3Schema": {
                         "type": "object", "description": "A gadget <for> recordings & tests",
                         "properties": {
                             "spec": {"type": "object", "required": ["color"], "properties": {
                                 "replicas": {"type": "integer", "format": "int32", "default": 1, "minimum": 0},
                                 "size": {"type": "number", "default": 2.5, "maximum": 10, "exclusiveMaximum": True},
                                 "color": {"type": "string", "enum": ["red", "green", "<blue>"], "default": "red"},
                                 "port": {"x-kubernetes-int-or-string": True,
                                          "anyOf": [{"type": "integer"}, {"type": "string"}]},
                                 "tags": {"type": "array", "items": {"type": "string", "maxLength": 63},
                                          "x-kubernetes-list-type": "set", "maxItems": 10},
                                 "ports": {"type": "array", "x-kubernetes-list-type": "map",
                                           "x-kubernetes-list-map-keys": ["name"],
                                           "items": {"type": "object", "required": ["name"], "properties": {
                                               "name": {"type": "string"}, "number": {"type": "integer"}}}},
                                 "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                 "open": {"type": "object", "additionalProperties": True},
                                 "closed": {"type": "object", "additionalProperties": False},
                                 "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                              "x-kubernetes-embedded-resource": False},
                                 "raw": {"x-kubernetes-preserve-unknown-fields": True,
                                         "default": {"a": [1, "b", None], "c": {"d": True}}},
                                 "when": {"type": "string", "format": "date-time", "nullable": True},
                                 "mode": {"type": "string", "default": "<auto>",
                                          "x-kubernetes-validations": [{"rule": "self != 'bad'",
                                                                        "message": "mode must not be <bad>"}]}}},
                             "status": {"type": "object", "properties": {
                                 "replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}})
    for _ in range(50):
        s, c = api.json(f"{crds}/gadgets.{GROUP}")
        if any(x["type"] == "Established" and x["status"] == "True" for x in (c.get("status") or {}).get("conditions") or []):
            break
        time.sleep(0.2)
    time.sleep(1)
    gd = {"apiVersion": f"{GROUP}/v1", "kind": "Gadget"}
    for _ in range(30):
        s, _b = api.json(CR_PATH)
        if s == 200:
            break
        time.sleep(0.5)
    create(CR_PATH, {**gd, "metadata": {"name": "gadget-1", "labels": {"app": "rec-pb"}, "annotations": ANN,
                                        "finalizers": ["rec-pb.example.com/keep"],
                                        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-1",
                                                             "uid": cm1, "controller": True}]},
                     "spec": {"color": "<blue>", "port": "http", "tags": ["a", "b"], "labels": {"x": "<y>"},
                              "ports": [{"name": "p", "number": 1}], "open": {"k": {"nested": [1, 2.5]}},
                              "anything": {"z": 1, "a": {"b": None}}, "when": None}})
    create(CR_PATH, {**gd, "metadata": {"name": "gadget-2"}, "spec": {"color": "green", "port": 8080, "replicas": 3}})

    # LimitRange and ResourceQuota last (no controller-manager computes the quota's status, so it is
    # set by hand; without it the quota admission would refuse every pod).
    create(f"{nsd}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr-1"},
        "spec": {"limits": [
            {"type": "Container", "default": {"cpu": "500m", "memory": "512Mi"},
             "defaultRequest": {"cpu": "0.1", "memory": "128Mi"}, "max": {"cpu": "2", "memory": "4Gi"},
             "min": {"cpu": "10m"}, "maxLimitRequestRatio": {"cpu": "10"}},
            {"type": "PersistentVolumeClaim", "max": {"storage": "10Gi"}, "min": {"storage": "1Mi"}}]}})
    new, _ = create(f"{nsd}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "quota-1"},
        "spec": {"hard": {"pods": "1k", "requests.cpu": "4", "requests.memory": "8Gi", "limits.cpu": "8",
                          "limits.memory": "16Gi", "count/gadgets." + GROUP: "100"}}})
    if new:
        s, q = api.json(f"{nsd}/resourcequotas/quota-1")
        q["status"] = {"hard": q["spec"]["hard"],
                       "used": {"pods": "1", "requests.cpu": "100m", "requests.memory": "1Gi", "limits.cpu": "500m",
                                "limits.memory": "1536Mi", "count/gadgets." + GROUP: "2"}}
        s, _ = api.json(f"{nsd}/resourcequotas/quota-1/status", method="PUT", body=q)
        log.append(f"PUT {nsd}/resourcequotas/quota-1/status -> {s}")

    # Small namespace: 3 configmaps (negotiation, watch-list).
    for i in (1, 2, 3):
        create(f"{core}/namespaces/{NS_SMALL}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"small-{i}", "labels": {"app": "small"}}, "data": {"i": str(i)}})
    return log


# ---------------------------------------------------------------------------------------------
# Sections


def discovery(api):
    groups = [("", "/api/v1")]
    _, g = api.json("/apis")
    for grp in g["groups"]:
        groups.append((grp["name"], "/apis/" + grp["preferredVersion"]["groupVersion"]))
    out = []
    for group, base in groups:
        _, res = api.json(base)
        for r in res["resources"]:
            if "/" in r["name"] or "list" not in r.get("verbs", []):
                continue
            if group.endswith(".example.com"):  # custom resources: see negotiation
                continue
            out.append((group, base, r))
    return out


def record_lists(api):
    lists, gets = [], []
    preferred = {"configmaps": "cm-1", "secrets": "secret-1", "serviceaccounts": "rec-pb-sa", "nodes": NODE,
                 "namespaces": NS, "persistentvolumes": "rec-pb-pv", "clusterroles": "rec-pb-cr",
                 "clusterrolebindings": "rec-pb-crb", "storageclasses": "rec-pb-sc",
                 "priorityclasses": "rec-pb-priority", "customresourcedefinitions": f"gadgets.{GROUP}",
                 "apiservices": "v1.apps", "flowschemas": "system-leader-election",
                 "prioritylevelconfigurations": "workload-low", "csinodes": NODE, "ingressclasses": "rec-pb-ic",
                 "certificatesigningrequests": "rec-pb-csr", "runtimeclasses": "rec-pb-rc",
                 "csidrivers": "rec.csi.example.com", "volumeattachments": "rec-pb-va",
                 "validatingwebhookconfigurations": "rec-pb-vwc", "mutatingwebhookconfigurations": "rec-pb-mwc",
                 "pods": "pod-1", "services": "svc-1", "endpoints": "svc-1", "poddisruptionbudgets": "pdb-pct",
                 "events": "pod-1.ev-core"}
    for group, base, r in discovery(api):
        path = (f"{base}/namespaces/{NS}/" if r["namespaced"] else base + "/") + r["name"]
        for attempt in range(5):
            s, ct, raw, _, _ = api.request(path)
            if s != 200:
                print("skip", path, s)
                break
            rv, items = json_list(raw)
            q = {"resourceVersion": rv, "resourceVersionMatch": "Exact"} if rv else {}
            ps, pct, praw, _, _ = api.request(path, q, PB)
            ms, mct, mraw, _, _ = api.request(path, q, PB_META_LIST)
            ok = ps == ms == 200 and pb_list(praw) == (rv, items) == pb_list(mraw)
            if ok or attempt == 4:
                break
            time.sleep(0.5)
        if s != 200:
            continue
        entry = {"group": group, "resource": r["name"], "kind": r["kind"], "path": path, "namespaced": r["namespaced"],
                 "items": len(items), "versions_agree": ok,
                 "json": rec(s, ct, raw), "proto": rec(ps, pct, praw, query=q), "meta_proto": rec(ms, mct, mraw, query=q)}
        if not rv:
            entry["note"] = "this list has no resourceVersion (not stored in etcd): protobuf lists made without one"
        lists.append(entry)
        print(f"list {path}: {len(items)} items, json {len(raw)} B, pb {len(praw)} B, meta {len(mraw)} B, agree={ok}")

        # GET one object of the kind: ours when there is one.
        names = [n for _, n, _ in items]
        if not names:
            continue
        name = preferred.get(r["name"]) if preferred.get(r["name"]) in names else names[0]
        ns_of = {n: ns for ns, n, _ in items}
        gets.append(record_get(api, r["name"], f"{base}{'/namespaces/' + ns_of[name] if ns_of[name] else ''}/{r['name']}/{name}"))
    return lists, gets


def record_get(api, resource, gpath, note=None):
    for attempt in range(5):
        s1, c1, f1, _, _ = api.request(gpath)
        s2, c2, p2, _, _ = api.request(gpath, accept=PB)
        s3, c3, m3, _, _ = api.request(gpath, accept=PB_META)
        try:
            ok = s1 == s2 == s3 == 200 and json_object(f1) == pb_object(p2) == pb_object(m3)
        except Exception:  # noqa: BLE001
            ok = False
        if ok or attempt == 4:
            break
        time.sleep(0.3)
    print(f"get {gpath}: {s1}/{s2}/{s3} agree={ok}")
    out = {"resource": resource, "path": gpath, "versions_agree": ok,
           "json": rec(s1, c1, f1), "proto": rec(s2, c2, p2), "meta_proto": rec(s3, c3, m3)}
    if note:
        out["note"] = note
    return out


def record_watch(api):
    path = f"/api/v1/namespaces/{NS_WATCH}/configmaps"
    _, lst = api.json(path)
    for it in lst["items"]:
        api.json(f"{path}/{it['metadata']['name']}", method="DELETE")
    _, lst = api.json(path)
    start = lst["metadata"]["resourceVersion"]
    q = {"watch": "1", "resourceVersion": start, "allowWatchBookmarks": "true", "timeoutSeconds": "70"}
    accepts = {"json": JSON, "proto": PB, "meta_proto": PB_META}
    results, readies, threads = {}, [], []
    for key, acc in accepts.items():
        ev = threading.Event()
        readies.append(ev)
        t = threading.Thread(target=lambda k=key, a=acc, e=ev: results.__setitem__(k, api.stream(path, q, a, e)))
        t.start()
        threads.append(t)
    for ev in readies:
        ev.wait(10)
    time.sleep(0.5)
    writes = []

    def write(method, p, body=None, ctype="application/json"):
        s, b = api.json(p, method=method, body=body, ctype=ctype)
        writes.append({"method": method, "path": p, "content_type": ctype if body is not None else None,
                       "body": body, "status": s, "resourceVersion": b.get("metadata", {}).get("resourceVersion")})

    write("POST", path, {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "w-1", "labels": {"app": "w"}, "annotations": {"n": "<&>"}},
                         "data": {"k": "v"}, "binaryData": {"b": b64(b"\x00\xff")}})
    write("PATCH", f"{path}/w-1", {"metadata": {"labels": {"app": "w2", "extra": "1"}}}, "application/merge-patch+json")
    write("DELETE", f"{path}/w-1")
    print("watch: writes made, waiting for the 70 s streams to end")
    for t in threads:
        t.join()
    out = {"path": path, "query": q, "start_resourceVersion": start, "writes": writes,
           "note": "three watches opened at once from the same RV (Accept json, protobuf, metadata protobuf); "
                   "writes made 0.5 s after all three answered; each stream read until the server ended it. "
                   "`events` is the recorder's decoding of body_b64, with arrival times (s after the request)."}
    for key, acc in accepts.items():
        out[key] = rec_stream(results[key], acc)
    return out


def record_watchlist(api, realk8s, scripts):
    def restart(*flags):
        subprocess.run([str(scripts / "down.sh"), realk8s, "apiserver"], check=True)
        subprocess.run([str(scripts / "up.sh"), realk8s, *flags], check=True)

    path = f"/api/v1/namespaces/{NS_SMALL}/configmaps"
    bump = f"/api/v1/namespaces/{NS_WATCH}/configmaps"
    restart("--feature-gates=WatchList=true")
    try:
        time.sleep(2)
        q = {"watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
             "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "5"}
        accepts = {"json": JSON, "proto": PB, "meta_proto": PB_META}
        results, readies, threads = {}, [], []
        for key, acc in accepts.items():
            ev = threading.Event()
            readies.append(ev)
            t = threading.Thread(target=lambda k=key, a=acc, e=ev: results.__setitem__(k, api.stream(path, q, a, e)))
            t.start()
            threads.append(t)
        for ev in readies:
            ev.wait(10)
        time.sleep(0.5)
        # A configmap write in ANOTHER namespace: moves the configmaps cache RV up to etcd's revision,
        # which the initial-events-end bookmark of an RV-unset watch-list waits for.
        s, b = api.json(bump, method="POST", body={"apiVersion": "v1", "kind": "ConfigMap",
                                                   "metadata": {"generateName": "bump-"}, "data": {"a": "1"}})
        bump_write = {"method": "POST", "path": bump, "status": s, "name": b["metadata"]["name"],
                      "resourceVersion": b["metadata"]["resourceVersion"]}
        api.json(f"{bump}/{b['metadata']['name']}", method="DELETE")
        for t in threads:
            t.join()
        out = {"apiserver_flags": "--feature-gates=WatchList=true (apiserver restarted; restored afterwards)",
               "path": path, "query": q, "bump_write": bump_write,
               "note": "three watch-lists opened at once (RV unset); 0.5 s later a configmap is created (and "
                       "deleted) in " + NS_WATCH + " so that the configmaps cache reaches etcd's revision and "
                       "the initial-events-end bookmark can be sent."}
        for key, acc in accepts.items():
            out[key] = rec_stream(results[key], acc)
    finally:
        restart()
    _, v = api.json("/version")
    print("apiserver restarted with default flags:", v.get("gitVersion"))
    return out


def etcd_post(path, body):
    r = urllib.request.Request(ETCD + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(r, timeout=30) as f:
        return json.loads(f.read())


def record_errors(api):
    accepts = [PB + ", " + JSON, PB]
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    _, lst = api.json(cms)
    cur = int(lst["metadata"]["resourceVersion"])
    cases = [
        ("get-missing-rv0", "GET of a missing object at resourceVersion=0: 404 NotFound",
         f"{cms}/does-not-exist", {"resourceVersion": "0"}),
        ("get-rv-far-future", "GET at a far-future resourceVersion (cache): 504 after ~3 s",
         f"{cms}/cm-1", {"resourceVersion": str(cur + 1000000)}),
        ("list-rv-future", "LIST at resourceVersion=current+1000 (cache): 504 Too large resource version after ~3 s",
         cms, {"resourceVersion": str(cur + 1000)}),
        ("list-bad-label-selector", "LIST with a malformed labelSelector: 400",
         cms, {"labelSelector": "a in (b"}),
        ("list-bad-continue", "LIST with a malformed continue token: 400",
         cms, {"continue": "%%%not-base64"}),
        ("list-rvm-exact-without-rv", "LIST with resourceVersionMatch=Exact and no resourceVersion: 422",
         cms, {"resourceVersionMatch": "Exact"}),
    ]
    out = []
    for name, desc, path, q in cases:
        for acc in accepts:
            s, ct, raw, hdr, el = api.request(path, q, acc)
            out.append({"name": name, "description": desc, "method": "GET", "path": path, "query": q,
                        "accept": acc, **rec(s, ct, raw, hdr, el)})
            print(f"error {name} [{acc}]: {s} {ct}")
    # WATCH from a very old RV: HTTP 200 and one ERROR event (410 Expired) in the stream, once the
    # watch cache's window starts later than RV 1 (after an apiserver restart; with a fresh etcd and
    # no restart, RV 1 is still inside it and the watch replays every event instead).
    q = {"watch": "1", "resourceVersion": "1", "timeoutSeconds": "5"}
    for acc in accepts:
        st = api.stream(cms, q, acc)
        out.append({"name": "watch-rv-too-old", "description": "WATCH from resourceVersion=1 (older than the watch "
                    "cache window): the form the 410 takes", "method": "GET", "path": cms, "query": q,
                    "accept": acc, **rec_stream(st)})
        print(f"error watch-rv-too-old [{acc}]: {st['status']} {st['content_type']}")
    # An expired continue token: a limit=1 page, one more write, etcd compacted at the current revision.
    s, page = api.json(cms, {"limit": "1"})
    token = page["metadata"].get("continue")
    if token:
        api.json(f"{cms}/cm-1", method="PATCH", body={"metadata": {"annotations": {"rec-pb/compacted-at": str(time.time())}}},
                 ctype="application/merge-patch+json")
        rev = int(etcd_post("/v3/kv/range", {"key": b64(b"\x00"), "limit": 1})["header"]["revision"])
        etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        q = {"limit": "1", "continue": token}
        for acc in accepts:
            s, ct, raw, hdr, el = api.request(cms, q, acc)
            out.append({"name": "list-continue-compacted", "description": "LIST with a continue token (from a "
                        f"limit=1 page at RV {page['metadata']['resourceVersion']}) after etcd was compacted at "
                        f"revision {rev}: 410 Expired, the Status carries a fresh token", "method": "GET",
                        "path": cms, "query": q, "accept": acc, **rec(s, ct, raw, hdr, el)})
            print(f"error list-continue-compacted [{acc}]: {s} {ct}")
    return out


NEGOTIATION_ACCEPTS = [
    PB,
    PB + ", " + JSON,
    JSON + ", " + PB,
    JSON + ";q=0.9, " + PB,
    PB + ";q=0.5, " + JSON + ";q=0.9",
    PB + ";q=0, " + JSON,
    "*/*",
    "application/*",
    PB + ";stream=watch",
    PB_META_LIST,
    PB_META_LIST + ",application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    PB_META,
    PB + ";as=Table;g=meta.k8s.io;v=v1",
]


def record_negotiation(api):
    small = f"/api/v1/namespaces/{NS_SMALL}/configmaps"
    # One write on each side just before, so that a watch from the RV before it replays exactly one event.
    _, before = api.json(small)
    rv_cm = before["metadata"]["resourceVersion"]
    api.json(f"{small}/small-2", method="PATCH", body={"metadata": {"annotations": {"rec-pb/touched": str(time.time())}}},
             ctype="application/merge-patch+json")
    _, crl = api.json(CR_PATH)
    rv_cr = crl["metadata"]["resourceVersion"]
    api.json(f"{CR_PATH}/gadget-2", method="PATCH", body={"metadata": {"annotations": {"rec-pb/touched": str(time.time())}}},
             ctype="application/merge-patch+json")
    time.sleep(0.5)
    targets = [
        ("builtin-list", small, {"resourceVersion": "0"}),
        ("builtin-get", f"{small}/small-1", {"resourceVersion": "0"}),
        ("builtin-watch", small, {"watch": "1", "resourceVersion": rv_cm, "timeoutSeconds": "1"}),
        ("cr-list", CR_PATH, {"resourceVersion": "0"}),
        ("cr-get", f"{CR_PATH}/gadget-2", {"resourceVersion": "0"}),
        ("cr-watch", CR_PATH, {"watch": "1", "resourceVersion": rv_cr, "timeoutSeconds": "1"}),
    ]
    out = []
    for target, path, q in targets:
        for acc in NEGOTIATION_ACCEPTS:
            if "watch" in q:
                st = api.stream(path, q, acc)
                out.append({"target": target, "method": "GET", "path": path, "query": q, "accept": acc,
                            **rec_stream(st)})
            else:
                s, ct, raw, hdr, _ = api.request(path, q, acc)
                out.append({"target": target, "method": "GET", "path": path, "query": q, "accept": acc,
                            **rec(s, ct, raw, hdr)})
            print(f"negotiation {target} [{acc}]: {out[-1]['status']} {out[-1]['content_type']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--realk8s", default="/work/realk8s")
    ap.add_argument("--scripts", default=str(SCRIPTS), help="folder of down.sh / up.sh")
    ap.add_argument("--skip-watchlist", action="store_true", help="do not restart the apiserver")
    args = ap.parse_args()
    api = Api(args.realk8s)
    setup_log = setup(api, args.realk8s)
    _, v = api.json("/version")
    out = {
        "description": "Exact bytes of a real kube-apiserver in protobuf (Accept application/vnd.kubernetes.protobuf "
                       "and its metadata-only form) beside the JSON answers for the same object versions "
                       "(record_protobuf.py). JSON bodies are text (`body`), all others base64 (`body_b64`).",
        "apiserver_version": v["gitVersion"],
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "apiserver_flags": "default flags (watchlist: --feature-gates=WatchList=true, apiserver restarted)",
        "setup": setup_log,
    }
    out["lists"], out["gets"] = record_lists(api)
    nsd = f"/api/v1/namespaces/{NS}"
    out["gets"] += [
        record_get(api, "configmaps", f"{nsd}/configmaps/cm-deleting", "finalizers + deletionTimestamp"),
        record_get(api, "configmaps", f"{nsd}/configmaps/cm-owned", "ownerReferences, immutable"),
        record_get(api, "secrets", f"{nsd}/secrets/secret-tls", "immutable TLS secret"),
        record_get(api, "poddisruptionbudgets",
                   f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/pdb-int", "minAvailable as an int"),
        record_get(api, "events", f"/apis/events.k8s.io/v1/namespaces/{NS}/events/pod-1.ev-new",
                   "events.k8s.io/v1 Event"),
        record_get(api, "gadgets", f"{CR_PATH}/gadget-1", "a custom resource: no protobuf (406)"),
    ]
    out["watch"] = record_watch(api)
    # The watch-list restarts the apiserver (twice): afterwards every watch cache's window starts at
    # the restart, so that the too-old WATCH of `errors` gets its 410.
    if not args.skip_watchlist:
        out["watchlist"] = record_watchlist(api, args.realk8s, pathlib.Path(args.scripts))
    out["errors"] = record_errors(api)
    out["negotiation"] = record_negotiation(api)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {len(out['lists'])} lists, {len(out['gets'])} gets, "
          f"{len(out['errors'])} errors, {len(out['negotiation'])} negotiation rows")


if __name__ == "__main__":
    main()
