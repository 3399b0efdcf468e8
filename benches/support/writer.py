"""What the bench writers share (configmaps_upstream.py, pods_upstream.py): the apiserver of a
kubeconfig (its URL, CA and token, read by kubeconfig.py), a new HTTPS connection for each
thread, one request checked against the statuses it may answer, and a run over eight threads
that stops at the first failure and exits with it."""
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.parse


class Apiserver:
    def __init__(self, kubeconfig):
        here = os.path.dirname(os.path.abspath(__file__))
        server, ca, token = subprocess.check_output(
            [sys.executable, os.path.join(here, "kubeconfig.py"), kubeconfig], text=True
        ).split()
        self.url = urllib.parse.urlparse(server)
        self.ctx = ssl.create_default_context(cafile=ca)
        self.headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
        self.failed = []

    def conn(self):
        return http.client.HTTPSConnection(self.url.hostname, self.url.port, context=self.ctx)

    def call(self, c, method, path, body, ok=(200, 201, 409), content_type=None):
        headers = dict(self.headers, **({"Content-Type": content_type} if content_type else {}))
        c.request(method, path, json.dumps(body), headers)
        r = c.getresponse()
        d = r.read()
        if r.status not in ok:
            self.failed.append((method, path, r.status, d[:200]))
        return r.status

    def parallel(self, work, threads=8):
        """Runs work(k, threads) for k in 0..threads at once; exits with the failures, if any."""
        ts = [threading.Thread(target=work, args=(k, threads)) for k in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        if self.failed:
            sys.exit(f"failed: {self.failed[:3]}")
