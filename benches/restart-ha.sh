#!/usr/bin/env bash
# The restart command of `bench --scenario restart` against the shared real kube-apiserver
# (../shared/realk8s): stops the apiserver, writes one key into etcd (what the other apiservers
# of an HA control plane would write meanwhile: node Leases, Events — so the restarted watch
# caches list at a revision newer than any the clients hold), starts it again and returns once
# it is ready. Owned by the restart benchmark (docs/reliability.md "Restarts: what the clients
# see"); run by the bench, not by CI.
# Usage: bench --scenario restart --kubeconfig DIR/kubeconfig --restart-command "benches/restart-ha.sh DIR"
set -euo pipefail
DIR=${1:?usage: restart-ha.sh K8S_DIR}
REALK8S=${REALK8S:-$(cd "$(dirname "$0")/../.." && pwd)/shared/realk8s}
bash "$REALK8S/down.sh" "$DIR" apiserver
etcdctl --endpoints=http://127.0.0.1:2379 put /bench-restart/tick "$(date +%s%N)" >/dev/null
bash "$REALK8S/up.sh" "$DIR" >/dev/null
