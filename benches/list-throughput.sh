#!/usr/bin/env bash
# LIST throughput end to end: 10 000 pods (~2 KiB each) listed at resourceVersion=0 by curl to
# /dev/null, through the proxy (plain HTTP and TLS) and directly from the simulated apiserver,
# next to the ceiling measured in the same run: a trivial server that writes a body of the same
# size from one prebuilt buffer (one sendall; no HTTP framework, no copies of its own). Prints
# the TLS version and suite curl negotiated with the proxy.
# Usage: benches/list-throughput.sh [runs]   (builds the release binary first)
#        GZIP=1 benches/list-throughput.sh [runs]: the same with `curl --compressed` (the proxy
#        gzips lists > 128 KiB); rates are of the uncompressed JSON, the bytes column is what
#        crossed the wire. The simulated apiserver never compresses, so "direct" stays identity.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-10}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
TLS=tests/testdata/security
$BIN sim --listen 127.0.0.1:18101 --objects 20000 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM ${PLAIN:-} ${SECURE:-} ${CEIL:-} 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18101/version >/dev/null; do sleep 0.5; done
$BIN serve --upstream http://127.0.0.1:18101 --resources pods --insecure-listen 127.0.0.1:18102 --auth=none --log-level warn &
PLAIN=$!
$BIN serve --upstream http://127.0.0.1:18101 --resources pods --bind-address 127.0.0.1 --secure-port 18103 \
    --tls-cert-file $TLS/server1.crt --tls-private-key-file $TLS/server1.key --auth=none --log-level warn &
SECURE=$!
until curl -sf http://127.0.0.1:18102/readyz >/dev/null && curl -skf https://127.0.0.1:18103/readyz >/dev/null; do sleep 0.5; done
Q='/api/v1/pods?resourceVersion=0'
SIZE=$(curl -s -o /dev/null -w '%{size_download}' "http://127.0.0.1:18102$Q")
python3 - "$SIZE" <<'PY' &
import socket, sys
body = b"x" * int(sys.argv[1])
head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 18104)); s.listen(16)
while True:
    c, _ = s.accept()
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(65536)
        if not d:
            break
        req += d
    if req:
        c.sendall(head + body)
    c.close()
PY
CEIL=$!
until curl -sf -o /dev/null http://127.0.0.1:18104/; do sleep 0.2; done

set -f # ARGS entries are split into words below, never globbed
GZ=()
[ "${GZIP:-0}" = 1 ] && GZ=(--compressed)
# The targets are measured in interleaved rounds (one request to each, RUNS times), so that load
# from other work on the machine hits every row alike; rates are JSON bytes / curl's time_total.
NAMES=("ceiling (one prebuilt buffer)" "proxy, plain HTTP/1.1" "proxy, TLS HTTP/1.1" "proxy, TLS HTTP/2" "direct (sim), plain")
ARGS=("http://127.0.0.1:18104/" "http://127.0.0.1:18102$Q" "https://127.0.0.1:18103$Q -k --http1.1"
    "https://127.0.0.1:18103$Q -k --http2" "http://127.0.0.1:18101$Q")
echo "TLS: $(curl -skv -o /dev/null "https://127.0.0.1:18103$Q" 2>&1 | sed -n 's/^\* SSL connection using //p')"
declare -a JSON BYTES RATES
for i in "${!NAMES[@]}"; do
    JSON[i]=$(curl -s ${ARGS[i]} -o /dev/null -w '%{size_download}') # identity size
done
for _ in $(seq "$RUNS"); do
    for i in "${!NAMES[@]}"; do
        read -r bytes secs < <(curl -s "${GZ[@]}" ${ARGS[i]} -o /dev/null -w '%{size_download} %{time_total}\n')
        BYTES[i]=$bytes
        RATES[i]+="$(python3 -c "print(${JSON[i]}/$secs/1e9)") "
    done
done
for i in "${!NAMES[@]}"; do
    # shellcheck disable=SC2086
    python3 -c '
import statistics as st, sys
name, b = sys.argv[1], int(sys.argv[2]); r = sorted(float(x) for x in sys.argv[3:])
print(f"{name:<30} {b:>10} bytes  median {st.median(r):5.2f}  range {r[0]:5.2f}-{r[-1]:5.2f}  mean {st.mean(r):5.2f} GB/s")' \
        "${NAMES[i]}" "${BYTES[i]}" ${RATES[i]}
done
