#!/usr/bin/env python3
"""Writes N Pods through a real apiserver for the memory-per-object runs (issue 35 §2,
docs/performance.md "Memory per cached pod"): namespace NS (created when missing, with its
`default` ServiceAccount, which the ServiceAccount admission needs and no controller-manager
makes here), each Pod as a Deployment's pod looks once a kubelet runs it: labels, an owner
reference, one container (ports, env, requests and limits, a readiness probe, mounts), bound
to one of 100 nodes, then its status written as a kubelet writes it (Running, four conditions,
IPs, a running container's status). The apiserver adds what its admission and defaults add
(the service-account token volume, tolerations, defaults). Eight connections at once; the
ones already there are kept.

Usage: benches/support/pods_upstream.py KUBECONFIG N [NS]
"""
import sys

from writer import Apiserver

kc, n = sys.argv[1], int(sys.argv[2])
ns = sys.argv[3] if len(sys.argv) > 3 else "pod-memory"
api = Apiserver(kc)
c = api.conn()
api.call(c, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
api.call(c, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})


def pod(i):
    rs = f"web-{i // 50:04d}-7d9f8b6c5d"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{rs}-{i:06d}",
            "labels": {"app": f"web-{i // 50:04d}", "pod-template-hash": "7d9f8b6c5d", "tier": "frontend"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                "uid": f"6f1c2b3a-4d5e-4f60-8a7b-{i // 50:012d}", "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "nodeName": f"node-{i % 100:03d}",
            "containers": [{
                "name": "web",
                "image": "registry.k8s.io/nginx-slim:0.27",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [
                    {"name": "LOG_LEVEL", "value": "info"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": "web-config"}}],
        },
    }


def status(i):
    t = "2026-11-27T22:00:00Z"
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    return {"status": {
        "phase": "Running",
        "conditions": [
            {"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
            for c in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": f"192.168.{(i % 100) // 250}.{i % 100 + 1}",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": t,
        "containerStatuses": [{
            "name": "web", "ready": True, "restartCount": 0, "started": True,
            "state": {"running": {"startedAt": t}}, "lastState": {},
            "image": "registry.k8s.io/nginx-slim:0.27",
            "imageID": "registry.k8s.io/nginx-slim@sha256:" + "0123456789abcdef" * 4,
            "containerID": f"containerd://{i:064x}",
        }],
        "qosClass": "Burstable",
    }}


def work(k, T):
    c = api.conn()
    for i in range(k, n, T):
        p = pod(i)
        if api.call(c, "POST", f"/api/v1/namespaces/{ns}/pods", p) == 201:
            path = f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}/status"
            api.call(c, "PATCH", path, status(i), ok=(200,), content_type="application/merge-patch+json")
        if api.failed:
            return


api.parallel(work)
