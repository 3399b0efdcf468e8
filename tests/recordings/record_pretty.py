#!/usr/bin/env python3
"""Records how a real kube-apiserver indents its JSON for people (`?pretty=true`, or a user
agent starting with `curl`, `Wget` or `Mozilla/5.0`): each request twice — as a program asks it
(compact) and as a person does — with the exact bytes of both, into `v1.28.7-raw/pretty.json`.
`tests/serving/pretty.rs` checks that the proxy's indentation of each compact answer is the
apiserver's pretty one, byte for byte, and that watches and protobuf stay as they are.

Run against a throwaway cluster (it creates objects in the `raw-pretty` namespace):
    python3 tests/recordings/record_pretty.py --kubeconfig /work/realk8s/kubeconfig
Standard library only.
"""

import argparse
import http.client
import json
import pathlib
import ssl
import time
import urllib.parse

OUT = pathlib.Path(__file__).parent / "v1.28.7-raw" / "pretty.json"
NS = "raw-pretty"
PROGRAM = "record-pretty/1.0"


class Api:
    def __init__(self, kubeconfig: str):
        text = pathlib.Path(kubeconfig).read_text()
        # The realk8s kubeconfig is flow-style YAML: pick the three values without a YAML parser.
        self.server = text.split('server: "', 1)[1].split('"', 1)[0]
        ca = text.split('certificate-authority: "', 1)[1].split('"', 1)[0]
        self.token = text.split("token: ", 1)[1].split("}", 1)[0].strip().strip('"')
        self.ctx = ssl.create_default_context(cafile=ca)
        u = urllib.parse.urlparse(self.server)
        self.host, self.port = u.hostname, u.port

    def request(self, method, path, agent=PROGRAM, body=None, token=None, accept="application/json", read=None):
        c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
        h = {"Authorization": "Bearer " + (token or self.token), "Accept": accept, "User-Agent": agent}
        if body is not None:
            h["Content-Type"] = "application/json"
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        data = r.read(read) if read else r.read()
        c.close()
        return r.status, r.getheader("Content-Type"), data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    args = ap.parse_args()
    api = Api(args.kubeconfig)
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "odd", "labels": {"app": "p"}, "annotations": {"note": 'a<b>&"c"\\ {x}: [y], z'}},
        "data": {"empty": "", "unicode": "é\u2028✓", "json": '{"k":[1,{}]}', "nl": "a\nb\tc"},
    })
    api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain"}})
    time.sleep(1)
    rv = json.loads(api.request("GET", f"/api/v1/namespaces/{NS}/configmaps")[2])["metadata"]["resourceVersion"]
    meta_list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    cases = [
        ("GET a ConfigMap", "GET", f"/api/v1/namespaces/{NS}/configmaps/odd", {}),
        ("LIST at resourceVersion=0", "GET", f"/api/v1/namespaces/{NS}/configmaps?resourceVersion=0", {}),
        ("LIST of an empty namespace", "GET", "/api/v1/namespaces/raw-pretty-none/configmaps?resourceVersion=0", {}),
        ("LIST with limit (continue token)", "GET", f"/api/v1/namespaces/{NS}/configmaps?limit=1", {}),
        ("metadata-only LIST", "GET", f"/api/v1/namespaces/{NS}/configmaps?resourceVersion=0", {"accept": meta_list}),
        ("404 Status", "GET", f"/api/v1/namespaces/{NS}/configmaps/none", {}),
        ("401 Status", "GET", f"/api/v1/namespaces/{NS}/configmaps", {"token": "not-a-token"}),
        ("400 Status (bad selector)", "GET", f"/api/v1/namespaces/{NS}/configmaps?labelSelector=a%3D%3D%3Db", {}),
        ("LIST Exact at resourceVersion=1", "GET",
         f"/api/v1/namespaces/{NS}/configmaps?resourceVersion=1&resourceVersionMatch=Exact", {}),
    ]
    out = []
    for name, method, path, kw in cases:
        compact = api.request(method, path, **kw)
        row = {"name": name, "path": path, "accept": kw.get("accept", "application/json"),
               "status": compact[0], "content-type": compact[1], "compact": compact[2].decode()}
        for how, agent, p in [("curl", "curl/8.5.0", path), ("wget", "Wget/1.21.4", path),
                              ("pretty=true", PROGRAM, path + ("&" if "?" in path else "?") + "pretty=true")]:
            r = api.request(method, p, agent=agent, **kw)
            row[how] = r[2].decode()
        # pretty=false wins over a curl user agent.
        p = path + ("&" if "?" in path else "?") + "pretty=false"
        row["curl, pretty=false"] = api.request(method, p, agent="curl/8.5.0", **kw)[2].decode()
        out.append(row)
        print(f"{name}: {compact[0]}, compact {len(row['compact'])} B, curl {len(row['curl'])} B")
    # A watch from the list's RV, as curl: its first event (an ADDED from a create), not indented.
    import threading
    got = {}

    def watch():
        got["watch"] = api.request("GET", f"/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=3",
                                   agent="curl/8.5.0", read=None)

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.5)
    api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"w-{int(time.time())}"}})
    t.join()
    w = got["watch"]
    out.append({"name": "watch as curl", "status": w[0], "content-type": w[1], "curl": w[2].decode()})
    print(f"watch as curl: {w[0]}, {len(w[2])} B")
    OUT.write_text(json.dumps({
        "server": "kube-apiserver v1.28.7 (../shared/realk8s)",
        "recorded": time.strftime("%Y-%m-%d"),
        "note": "compact: asked by a program; curl / wget / pretty=true: the same request as a person asks it; "
                "`curl, pretty=false`: the parameter overrides the user agent. The watch is curl's whole stream.",
        "requests": out,
    }, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
