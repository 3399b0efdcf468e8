#!/usr/bin/env bash
# LIST throughput end to end: 10 000 pods (~2 KiB each) listed at resourceVersion=0 by curl to
# /dev/null, through the proxy (plain HTTP and TLS) and directly from the simulated apiserver,
# next to the ceiling measured in the same run: a trivial server that writes a body of the same
# size from one prebuilt buffer (one sendall; no HTTP framework, no copies of its own). Prints
# the TLS version and suite curl negotiated with the proxy, and the proxy's own CPU per list
# (utime+stime from /proc, each row served by its own proxy process): far less sensitive than
# GB/s to other work on the cores.
# Usage: benches/list-throughput.sh [runs]   (builds the release binary first)
#        GZIP=1 benches/list-throughput.sh [runs]: the same with `curl --compressed` (the proxy
#        gzips lists > 128 KiB); rates are of the uncompressed JSON, the bytes column is what
#        crossed the wire. The simulated apiserver never compresses, so "direct" stays identity.
#        BASE=/path/to/other/kube-watchcache benches/list-throughput.sh [runs]: the proxy rows
#        also for that binary (e.g. the previous commit's), interleaved in the same rounds.
#        RESOURCE=configmaps benches/list-throughput.sh [runs]: the 10 000 configmaps (~2 KiB)
#        of the same sim instead of its pods (issue 35's keep-item).
#        PLAIN=1 benches/list-throughput.sh [runs]: the plain HTTP/1.1 rows only (no TLS proxies).
set -euo pipefail
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }
cd "$(dirname "$0")/.."
RUNS="${1:-10}"
cargo build --release --quiet
BIN=target/release/kube-watchcache
TLS=tests/testdata/security
PIDS=()
# The proxies first, then the sim (a proxy whose upstream went away would log about it).
trap 'kill "${PIDS[@]:1}" 2>/dev/null; sleep 0.2; kill "${PIDS[0]}" 2>/dev/null || true' EXIT
$BIN sim --listen 127.0.0.1:18101 --objects 20000 >/dev/null 2>&1 &
PIDS+=($!)
SIM=$!
until curl -sf http://127.0.0.1:18101/version >/dev/null; do sleep 0.5; done
RESOURCE=${RESOURCE:-pods}
Q="/api/v1/$RESOURCE?resourceVersion=0"

# proxy BINARY PORT TLS(0/1): starts a proxy; its pid in $P.
READY=()
proxy() {
    if [ "$3" = 1 ]; then
        READY+=("https://127.0.0.1:$2/readyz")
        $1 serve --upstream http://127.0.0.1:18101 --resources "$RESOURCE" --bind-address 127.0.0.1 --secure-port "$2" \
            --tls-cert-file $TLS/server1.crt --tls-private-key-file $TLS/server1.key --auth=none --log-level warn &
    else
        READY+=("http://127.0.0.1:$2/readyz")
        $1 serve --upstream http://127.0.0.1:18101 --resources "$RESOURCE" --insecure-listen "127.0.0.1:$2" --auth=none --log-level warn &
    fi
    P=$!
    PIDS+=("$P")
}

# Rows: name, curl arguments, pid whose CPU is counted (0: none).
NAMES=() ARGS=() CPUPID=()
row() { NAMES+=("$1"); ARGS+=("$2"); CPUPID+=("$3"); }
row "ceiling (one prebuilt buffer)" "http://127.0.0.1:18104/" 0
for v in new ${BASE:+base}; do
    b=$BIN off=0
    [ "$v" = base ] && b=$BASE off=10
    proxy "$b" $((18102 + off)) 0
    row "$v proxy, plain HTTP/1.1" "http://127.0.0.1:$((18102 + off))$Q" "$P"
    [ "${PLAIN:-0}" = 1 ] && continue
    proxy "$b" $((18103 + off)) 1
    row "$v proxy, TLS HTTP/1.1" "https://127.0.0.1:$((18103 + off))$Q -k --http1.1" "$P"
    proxy "$b" $((18105 + off)) 1
    row "$v proxy, TLS HTTP/2" "https://127.0.0.1:$((18105 + off))$Q -k --http2" "$P"
done
row "direct (sim), plain" "http://127.0.0.1:18101$Q" "$SIM"
for u in "${READY[@]}"; do
    until curl -skf -o /dev/null "$u"; do sleep 0.5; done
done

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
PIDS+=($!)
until curl -sf -o /dev/null http://127.0.0.1:18104/; do sleep 0.2; done

set -f # ARGS entries are split into words below, never globbed
GZ=()
[ "${GZIP:-0}" = 1 ] && GZ=(--compressed)
# CPU seconds (utime+stime) of a process so far.
cpu() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat"; }
# The targets are measured in interleaved rounds (one request to each, RUNS times), so that load
# from other work on the machine hits every row alike; rates are JSON bytes / curl's time_total.
[ "${PLAIN:-0}" = 1 ] || echo "TLS: $(curl -skv -o /dev/null "https://127.0.0.1:18103$Q" 2>&1 | sed -n 's/^\* SSL connection using //p')"
declare -a JSON BYTES RATES CPU0 CPU1
for i in "${!NAMES[@]}"; do
    JSON[i]=$(curl -s ${ARGS[i]} -o /dev/null -w '%{size_download}') # identity size
    [ "${CPUPID[i]}" != 0 ] && CPU0[i]=$(cpu "${CPUPID[i]}")
done
for _ in $(seq "$RUNS"); do
    for i in "${!NAMES[@]}"; do
        read -r bytes secs < <(curl -s "${GZ[@]}" ${ARGS[i]} -o /dev/null -w '%{size_download} %{time_total}\n')
        BYTES[i]=$bytes
        RATES[i]+="$(python3 -c "print(${JSON[i]}/$secs/1e9)") "
    done
done
for i in "${!NAMES[@]}"; do
    cpu_ms=-1
    [ "${CPUPID[i]}" != 0 ] && cpu_ms=$(python3 -c "print(($(cpu "${CPUPID[i]}") - ${CPU0[i]}) * 1000 / $RUNS)")
    # shellcheck disable=SC2086
    python3 -c '
import statistics as st, sys
name, b, cpu = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]); r = sorted(float(x) for x in sys.argv[4:])
c = f"  server CPU {cpu:5.1f} ms/list" if cpu >= 0 else ""
print(f"{name:<30} {b:>10} bytes  median {st.median(r):5.2f}  range {r[0]:5.2f}-{r[-1]:5.2f}  mean {st.mean(r):5.2f} GB/s{c}")' \
        "${NAMES[i]}" "${BYTES[i]}" "$cpu_ms" ${RATES[i]}
done
