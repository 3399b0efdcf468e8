#!/usr/bin/env python3
"""Writes N ConfigMaps through a real apiserver for the memory-per-object runs (issue 35 §2,
docs/performance.md "Memory per cached object"): namespace NS (created when missing), each
ConfigMap with two labels and one value of VALUE bytes (940: about 1 440 B of JSON with the
managedFields of its one Update), eight connections at once; the ones already there are kept.

Usage: benches/support/configmaps_upstream.py KUBECONFIG N [NS] [VALUE]
"""
import http.client
import json
import ssl
import subprocess
import sys
import threading
import urllib.parse
import os

kc, n = sys.argv[1], int(sys.argv[2])
ns = sys.argv[3] if len(sys.argv) > 3 else "object-memory"
value = int(sys.argv[4]) if len(sys.argv) > 4 else 940
here = os.path.dirname(os.path.abspath(__file__))
server, ca, token = subprocess.check_output([sys.executable, os.path.join(here, "kubeconfig.py"), kc], text=True).split()
u = urllib.parse.urlparse(server)
ctx = ssl.create_default_context(cafile=ca)
H = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}


def conn():
    return http.client.HTTPSConnection(u.hostname, u.port, context=ctx)


c = conn()
c.request("POST", "/api/v1/namespaces", json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}), H)
c.getresponse().read()
failed = []


def work(k, T=8):
    c = conn()
    for i in range(k, n, T):
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:06d}", "namespace": ns, "labels": {"app": "object-memory", "shard": str(i % 16)}},
            "data": {"value": f"{i:08d}" + "v" * (value - 8)},
        }
        c.request("POST", f"/api/v1/namespaces/{ns}/configmaps", json.dumps(body), H)
        r = c.getresponse()
        d = r.read()
        if r.status not in (201, 409):
            failed.append((r.status, d[:200]))
            return


ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
if failed:
    sys.exit(f"failed: {failed[:3]}")
