#!/usr/bin/env bash
# Resident memory of the proxy against the raw JSON bytes of what it caches.
# Usage: benches/memory.sh [objects]   (sim objects: half configmaps, half pods, ~2 KiB each)
# Then the same after protobuf LISTs of both (the protobuf kept per object version).
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
OBJECTS="${1:-100000}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
$BIN sim --listen 127.0.0.1:18121 --objects "$OBJECTS" >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${P:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18121/version >/dev/null; do sleep 0.5; done
$BIN serve --upstream http://127.0.0.1:18121 --resources pods,configmaps --insecure-listen 127.0.0.1:18122 --auth=none --log-level error &
P=$!
until curl -sf http://127.0.0.1:18122/readyz >/dev/null; do sleep 0.5; done
raw=0
for r in pods configmaps; do
    n=$(curl -s -o /dev/null -w '%{size_download}' "http://127.0.0.1:18122/api/v1/$r?resourceVersion=0")
    raw=$((raw + n))
done
rss_kib=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
python3 -c "raw=$raw; rss=$rss_kib*1024; print(f'objects {$OBJECTS}: raw JSON {raw/2**20:.1f} MiB, proxy RSS {rss/2**20:.1f} MiB = {rss/raw:.2f} x raw; budget 1.5 x raw + 64 MiB = {(1.5*raw+64*2**20)/2**20:.1f} MiB')"

# Protobuf readers (issue 17): each object's protobuf is made at the first protobuf read and kept;
# what that adds to the resident memory of the JSON store.
pb=0
for r in pods configmaps; do
    n=$(curl -s -o /dev/null -w '%{size_download}' -H 'Accept: application/vnd.kubernetes.protobuf' "http://127.0.0.1:18122/api/v1/$r?resourceVersion=0")
    pb=$((pb + n))
done
rss2_kib=$(awk '/VmRSS/ {print $2}' /proc/$P/status)
python3 -c "raw=$raw; pb=$pb; a=$rss_kib*1024; b=$rss2_kib*1024; print(f'protobuf LISTs {pb/2**20:.1f} MiB ({100*pb/raw:.0f} % of JSON); proxy RSS with protobuf readers {b/2**20:.1f} MiB = {b/a:.2f} x the JSON-only RSS')"
