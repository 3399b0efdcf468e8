#!/usr/bin/env python3
"""Records v1.28.7-raw/authz-before-validation.json: malformed reads of configmaps in `default`
by a user allowed everything (the realk8s admin token) and by a user with no RBAC rights (a
token line `nobody-token,nobody,nobody-uid,` added to the realk8s tokens.csv before `up.sh`).
The apiserver authorizes before its handlers validate: 403 for the second, 400/422 for the first.

Usage: record_authz.py <realk8s dir>   (standard library and curl only)
"""
import json
import subprocess
import sys
from pathlib import Path

DIR = Path(sys.argv[1])
ADMIN = (DIR / "tokens.csv").read_text().splitlines()[0].split(",")[0]
QUERIES = [
    "resourceVersionMatch=NotOlderThan",
    "labelSelector=tier%3Dfront%3Dx",
    "watch=1&resourceVersionMatch=Exact&resourceVersion=1",
]
PATH = "/api/v1/namespaces/default/configmaps"

cases = []
for user, token, groups in [("admin", ADMIN, ["system:masters"]), ("nobody", "nobody-token", [])]:
    for q in QUERIES:
        out = subprocess.run(
            ["curl", "-s", "-w", "\n%{http_code}", "--cacert", str(DIR / "pki/ca.crt"),
             "-H", f"Authorization: Bearer {token}", f"https://127.0.0.1:6443{PATH}?{q}"],
            capture_output=True, text=True, check=True).stdout
        body, code = out.rsplit("\n", 1)
        cases.append({"user": user, "groups": groups, "path": PATH, "query": q,
                      "status": int(code), "body": json.loads(body)})
rec = {"apiserver": "v1.28.7", "recorded": "2026-11-25",
       "about": "malformed reads of configmaps by a user allowed everything and by a user with no "
                "RBAC rights: the apiserver authorizes before its handlers validate (403 for the "
                "second, 400/422 for the first)",
       "cases": cases}
out = Path(__file__).parent / "v1.28.7-raw" / "authz-before-validation.json"
out.write_text(json.dumps(rec, indent=1))
print([(c["user"], c["status"]) for c in cases])
