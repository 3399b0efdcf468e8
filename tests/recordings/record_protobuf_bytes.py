#!/usr/bin/env python3
"""Records how a real kube-apiserver writes `[]byte` fields that are empty, absent or null, in
JSON and in protobuf, into `v1.28.7-raw/protobuf-bytes.json`.

Go's JSON leaves an `omitempty` `[]byte` out both when it is nil and when it is empty, while the
generated protobuf Marshal writes an empty one (`12 00`): a ValidatingWebhookConfiguration
created with `caBundle: ""` and one created without it have the same JSON and different
protobuf, so the proxy, which keeps JSON, cannot serve either in protobuf. A Secret's map
value sent as `null` comes back as `""` (etcd's round trip makes it empty).

Objects (cluster-scoped `rec-pbb-*` webhook configurations, Secret `rec-pbb` in `default`) are
made again on each run. Run against the throwaway realk8s apiserver (../shared/realk8s):
    python3 tests/recordings/record_protobuf_bytes.py [--realk8s /work/k8s]
Standard library only.
"""

import argparse
import base64
import json
import pathlib
import ssl
import time
import urllib.error
import urllib.request

PB = "application/vnd.kubernetes.protobuf"
OUT = pathlib.Path(__file__).parent / "v1.28.7-raw" / "protobuf-bytes.json"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
SECRETS = "/api/v1/namespaces/default/secrets"


def webhook(name, ca_bundle):
    client = {"url": "https://example.com/hook"}
    if ca_bundle is not None:
        client["caBundle"] = ca_bundle
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "a.example.com",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "rules": [{"apiGroups": ["nothing.example.com"], "apiVersions": ["v1"],
                       "operations": ["CREATE"], "resources": ["things"]}],
            "clientConfig": client,
        }],
    }


class Api:
    def __init__(self, realk8s):
        self.token = open(realk8s + "/tokens.csv").readline().split(",")[0]
        self.ctx = ssl.create_default_context(cafile=realk8s + "/pki/ca.crt")

    def request(self, method, path, accept="application/json", body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request("https://127.0.0.1:6443" + path, method=method, data=data)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as r:
                return r.status, r.headers.get("Content-Type"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--realk8s", default="/work/k8s")
    args = ap.parse_args()
    api = Api(args.realk8s)
    made = [
        (VWC, webhook("rec-pbb-set", "Zm9v")),
        (VWC, webhook("rec-pbb-empty", "")),
        (VWC, webhook("rec-pbb-absent", None)),
        (SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rec-pbb"},
                   "data": {"a": None, "b": "", "c": "Zm9v"}}),
    ]
    gets = []
    for collection, obj in made:
        path = collection + "/" + obj["metadata"]["name"]
        api.request("DELETE", path)
        for _ in range(50):
            if api.request("GET", path)[0] == 404:
                break
            time.sleep(0.1)
        status, _, raw = api.request("POST", collection, body=obj)
        assert status == 201, (path, status, raw[:300])
        js = api.request("GET", path)
        pb = api.request("GET", path, accept=PB)
        assert js[0] == 200 and pb[0] == 200, (path, js[0], pb[0])
        gets.append({
            "path": path,
            "sent": obj,
            "json": {"status": js[0], "content_type": js[1], "body": js[2].decode()},
            "proto": {"status": pb[0], "content_type": pb[1], "body_b64": base64.b64encode(pb[2]).decode()},
        })
    version = json.loads(api.request("GET", "/version")[2])
    out = {
        "description": __doc__.split("\n\n")[0],
        "apiserver_version": version.get("gitVersion"),
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gets": gets,
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", OUT, len(gets), "objects")


if __name__ == "__main__":
    main()
