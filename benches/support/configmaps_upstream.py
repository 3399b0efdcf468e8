#!/usr/bin/env python3
"""Writes N ConfigMaps through a real apiserver for the memory-per-object runs (issue 35 §2,
docs/performance.md "Memory per cached object"): namespace NS (created when missing), each
ConfigMap with two labels and one value of VALUE bytes (940: about 1 440 B of JSON with the
managedFields of its one Update), eight connections at once; the ones already there are kept.

Usage: benches/support/configmaps_upstream.py KUBECONFIG N [NS] [VALUE]
"""
import sys

from writer import Apiserver

kc, n = sys.argv[1], int(sys.argv[2])
ns = sys.argv[3] if len(sys.argv) > 3 else "object-memory"
value = int(sys.argv[4]) if len(sys.argv) > 4 else 940
api = Apiserver(kc)
api.call(api.conn(), "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})


def work(k, T):
    c = api.conn()
    for i in range(k, n, T):
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:06d}", "namespace": ns, "labels": {"app": "object-memory", "shard": str(i % 16)}},
            "data": {"value": f"{i:08d}" + "v" * (value - 8)},
        }
        api.call(c, "POST", f"/api/v1/namespaces/{ns}/configmaps", body, ok=(201, 409))
        if api.failed:
            return


api.parallel(work)
