#!/usr/bin/env bash
# The list-heavy scenario against a sim and a proxy in separate processes: 10 000 pods of ~2 KiB,
# 4 LISTs/s (alternately resourceVersion=0 and paginated by 500), 50 GETs/s, 20 watchers and
# 5 changes/s; reports the LIST latencies and the CPU ms per MB listed of the proxy and of the sim
# (each process alone), next to CPU µs per delivery.
# Usage: benches/list-heavy.sh [seconds] [--tls] [--http2] [bench flags...]
#   --tls: HTTPS everywhere and the proxy's auth on (see benches/sim-proxy.sh); --http2: h2 (ALPN
#   over TLS, prior knowledge in the clear). Builds release first.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=20
[[ "${1:-}" =~ ^[0-9]+$ ]] && { SECS=$1; shift; }
source benches/sim-proxy.sh
split_flags "$@"
start_pair
JSON=$PKI/report.json
run_bench --scenario list-heavy --duration "${SECS}s" --json "$JSON" "${EXTRA[@]}"
python3 - "$JSON" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r.get("targets", []):
    mb = t.get("cpu_ms_per_mb_listed")
    print(f"{t['name']}: CPU {mb:.2f} ms per MB listed" if mb is not None else f"{t['name']}: CPU not measured",
          f"({t.get('bytes_listed', 0)/1e6:.1f} MB listed, {t.get('http_versions')})")
PY
