# Sourced by benches/watch-fanout.sh and benches/list-heavy.sh: starts a `kube-watchcache sim`
# and a proxy in front of it as two processes on loopback, then runs `bench` against both with
# their PIDs (so the report's CPU per delivery / per MB listed is each process alone).
#
#   plain (default): both on HTTP, the proxy with --auth=none on an --insecure-listen address.
#   TLS=1:           a throwaway CA made with openssl; the sim and the proxy serve HTTPS, the proxy
#                    reaches the sim over HTTPS and runs --auth=upstream (TokenReview and
#                    SubjectAccessReview at the sim, which accepts one admin token); the bench
#                    sends that token to both. No per-user watch limit (every watcher is one user).
#
# The caller calls `split_flags "$@"` (sets TLS and EXTRA), `start_pair`, then `run_bench ARGS...`.
# RESOURCES (default pods) and PROXY_EXTRA (an array of more `serve` flags) may be set first.
# Ports 18141 (sim) and 18142 (proxy).
# A program's user agent: kube-apiserver (and the proxy, and the sim) indent JSON for curl's.
curl() { command curl -A kube-watchcache-bench "$@"; }

# BIN=<binary> measures another build (paired runs); default: this tree's release build.
BIN=${BIN:-target/release/kube-watchcache}
SIM_ADDR=127.0.0.1:18141
PROXY_ADDR=127.0.0.1:18142
PKI=$(mktemp -d)
trap 'kill ${SIM:-} ${P:-} 2>/dev/null || true; rm -rf "$PKI"' EXIT

# `--tls` sets TLS=1; every other argument goes to EXTRA (passed on to `bench`).
split_flags() {
    TLS=0; EXTRA=()
    for a in "$@"; do
        if [ "$a" = --tls ]; then TLS=1; else EXTRA+=("$a"); fi
    done
}

make_pki() {
    local quiet=(-nodes -days 2 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1)
    openssl req -x509 "${quiet[@]}" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=kube-watchcache bench CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    # Distinct CommonNames: OpenSSL clients reject a chain whose subject equals its issuer.
    for n in sim proxy; do
        openssl req "${quiet[@]}" -keyout "$PKI/$n.key" -out "$PKI/$n.csr" -subj "/CN=kube-watchcache bench $n" 2>/dev/null
        openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 2 \
            -out "$PKI/$n.crt" 2>/dev/null -extfile <(printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
            "extendedKeyUsage=serverAuth" "basicConstraints=critical,CA:FALSE")
    done
    openssl rand -hex 24 >"$PKI/token"
}

start_pair() {
    [ "$BIN" = target/release/kube-watchcache ] && cargo build --release --quiet
    ulimit -n "$(ulimit -Hn)"
    if [ "${TLS:-0}" = 1 ]; then
        make_pki
        $BIN sim --listen $SIM_ADDR --objects 0 --compaction-window 200000 \
            --tls-cert-file "$PKI/sim.crt" --tls-private-key-file "$PKI/sim.key" --admin-token-file "$PKI/token" \
            >/dev/null 2>&1 &
        SIM=$!
        until curl -sf --cacert "$PKI/ca.crt" "https://$SIM_ADDR/version" >/dev/null; do sleep 0.5; done
        $BIN serve --upstream "https://$SIM_ADDR" --certificate-authority "$PKI/ca.crt" --token-file "$PKI/token" \
            --resources "${RESOURCES:-pods}" --bind-address 127.0.0.1 --secure-port "${PROXY_ADDR##*:}" \
            --tls-cert-file "$PKI/proxy.crt" --tls-private-key-file "$PKI/proxy.key" \
            --auth=upstream --max-watches-per-user=0 --log-level error ${PROXY_EXTRA[@]+"${PROXY_EXTRA[@]}"} &
        P=$!
        until curl -sf --cacert "$PKI/ca.crt" "https://$PROXY_ADDR/readyz" >/dev/null; do sleep 0.5; done
        TARGETS=(--target "https://$PROXY_ADDR" --direct "https://$SIM_ADDR"
            --certificate-authority "$PKI/ca.crt" --token-file "$PKI/token")
    else
        $BIN sim --listen $SIM_ADDR --objects 0 --compaction-window 200000 >/dev/null 2>&1 &
        SIM=$!
        until curl -sf "http://$SIM_ADDR/version" >/dev/null; do sleep 0.5; done
        $BIN serve --upstream "http://$SIM_ADDR" --resources pods --insecure-listen $PROXY_ADDR --auth=none \
            --log-level error &
        P=$!
        until curl -sf "http://$PROXY_ADDR/readyz" >/dev/null; do sleep 0.5; done
        TARGETS=(--target "http://$PROXY_ADDR" --direct "http://$SIM_ADDR")
    fi
}

run_bench() {
    # BENCH_BIN: the harness of another build (default: the one measured).
    ${BENCH_BIN:-$BIN} bench "${TARGETS[@]}" --proxy-pid "$P" --direct-pid "$SIM" "$@"
}
