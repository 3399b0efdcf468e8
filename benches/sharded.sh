#!/usr/bin/env bash
# Sharded watchers (issue 34, KEP-5866 `shardSelector`): kube-state-metrics-like watchers of
# pods split over 4 shards by uid, against the same load unsharded (`watch-fanout` at the same
# sizes), on the same sim + proxy pair (two processes, see benches/sim-proxy.sh). Prints, for
# each run and each target, the watch bytes and the CPU seconds of the process, in all and per
# shard (a quarter of the watchers). The direct target is the sim, a 1.28 apiserver that
# ignores `shardSelector`: there every sharded watcher gets every event (what a sharded client
# gets today, filtering by itself).
# Usage: benches/sharded.sh [watchers] [seconds] [bench flags...]   (builds release first)
set -euo pipefail
cd "$(dirname "$0")/.."
WATCHERS=400; SECS=20
[[ "${1:-}" =~ ^[0-9]+$ ]] && { WATCHERS=$1; shift; }
[[ "${1:-}" =~ ^[0-9]+$ ]] && { SECS=$1; shift; }
source benches/sim-proxy.sh
# Ports of their own: other benches may run meanwhile.
SIM_ADDR=127.0.0.1:18341
PROXY_ADDR=127.0.0.1:18342
split_flags "$@"
start_pair
SIZES=(--watchers "$WATCHERS" --objects 2000 --object-size 1024 --events-per-sec 20 --duration "${SECS}s")
run_bench --scenario sharded "${SIZES[@]}" --json "$PKI/sharded.json" "${EXTRA[@]}"
run_bench --scenario watch-fanout --skip-seed "${SIZES[@]}" --json "$PKI/unsharded.json" "${EXTRA[@]}"
python3 - "$PKI/sharded.json" "$PKI/unsharded.json" <<'PY'
import json, sys
for path, label in zip(sys.argv[1:], ["sharded (4 by uid)", "unsharded"]):
    r = json.load(open(path))
    for t in r.get("targets", []):
        w = t["watch"]; secs = t["seconds"]
        mb = w["bytes_per_sec"] * secs / 1e6
        cpu = t.get("cpu_seconds")
        cpu_s = f"{cpu:.2f} CPU-s ({cpu/4:.2f} per shard)" if cpu is not None else "CPU not measured"
        print(f"{label:20} {t['name']:6} {w['watchers']} watchers, {w['changes_written']} changes, "
              f"{w['deliveries_received']} deliveries ({w['deliveries_expected']} expected), "
              f"{mb:.1f} MB ({mb/4:.1f} per shard, {mb*1e3/w['watchers']:.1f} KB per watcher), {cpu_s}, "
              f"lost/dup/reordered {w['lost']}/{w['duplicated']}/{w['out_of_order']}")
PY
