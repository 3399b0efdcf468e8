"""Prints the current context's server URL, CA file and token of a kubeconfig (as
../shared/realk8s writes it), space-separated, for the benches that talk to a real apiserver
(`benches/*-upstream.sh`). Usage: python3 benches/support/kubeconfig.py KUBECONFIG"""
import sys

import yaml

c = yaml.safe_load(open(sys.argv[1]))
ctx = next(x["context"] for x in c["contexts"] if x["name"] == c["current-context"])
cl = next(x["cluster"] for x in c["clusters"] if x["name"] == ctx["cluster"])
u = next(x["user"] for x in c["users"] if x["name"] == ctx["user"])
print(cl["server"], cl["certificate-authority"], u["token"])
