#!/usr/bin/env bash
# What a cache per resource costs: the proxy's RSS with `--resources '*,-events,...'` against a
# real cluster, with N extra (empty) CRDs installed and without them, and with one resource, so
# that the per-resource overhead can be read off. Needs a kubeconfig with admin rights (it
# creates and deletes the CRDs `thingsNNN.benchNNN.example.com`) and kubectl.
#
#   benches/wildcard-memory.sh KUBECONFIG [CRDS=100]    (KUBECTL=/path/to/kubectl if not on PATH)
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
KUBECONFIG_FILE=${1:?usage: wildcard-memory.sh KUBECONFIG [CRDS]}
CRDS=${2:-100}
KUBECTL=${KUBECTL:-kubectl}
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=target/release/kube-watchcache
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

crds() {
  for i in $(seq -w 1 "$CRDS"); do
    printf -- '---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things%s.bench%s.example.com}\nspec:\n  group: bench%s.example.com\n  scope: Namespaced\n  names: {plural: things%s, singular: thing%s, kind: Thing%s, listKind: Thing%sList}\n  versions:\n  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}\n' \
      "$i" "$i" "$i" "$i" "$i" "$i" "$i"
  done
}

# measure LABEL RESOURCES: starts the proxy, waits for /readyz, prints RSS and cached resources.
measure() {
  local label=$1 resources=$2 port=18461
  "$BIN" serve --kubeconfig "$KUBECONFIG_FILE" --resources "$resources" \
    --insecure-listen 127.0.0.1:$port --auth=none --log-level warn 2>/dev/null &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  sleep 3 # let allocations settle after the first syncs
  local rss cached
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  cached=$(curl -s "http://127.0.0.1:$port/watchcache/metrics" | awk '/^watchcache_cached_resources / {print $2}')
  kill "$pid"; wait "$pid" 2>/dev/null || true
  printf '%-34s cached resources %4s   RSS %7.1f MiB\n' "$label" "$cached" "$(echo "$rss / 1024" | bc -l)"
  echo "$cached $rss" > "/tmp/wildcard-memory.$label"
}

WILD='*,-events,-events.k8s.io/events'
crds | k apply -f - >/dev/null
k wait --for=condition=Established crd --all --timeout=120s >/dev/null 2>&1 || true
measure "wildcard+$CRDS-crds" "$WILD"
crds | k delete -f - --wait=true >/dev/null
measure "wildcard" "$WILD"
measure "one-resource" "pods"
read -r n_all rss_all < "/tmp/wildcard-memory.wildcard+$CRDS-crds"
read -r n_bi rss_bi < /tmp/wildcard-memory.wildcard
read -r _ rss_one < /tmp/wildcard-memory.one-resource
echo "per CRD (empty):          $(echo "($rss_all - $rss_bi) / ($n_all - $n_bi)" | bc -l | xargs printf '%.1f') KiB"
echo "per built-in resource:    $(echo "($rss_bi - $rss_one) / ($n_bi - 1)" | bc -l | xargs printf '%.1f') KiB (objects included)"
