#!/usr/bin/env bash
# Soak of the relist / resume model (issue 22): runs tests/model.rs for longer than CI does —
# two replicas behind fault relays and the sim, churn, stalls, cuts, compactions (relists), and
# clients that drop their streams and resume at a random one of A, B and the sim — and prints
# its figures (writes, faults, relists, resumes, 410s, clients at the truth, 0 ghosts).
#
# Usage: benches/relist-soak.sh [SECONDS] [SEED]   (defaults: 300 s, seed 22)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-300}"
seed="${2:-22}"
SOAK_SECS="$secs" MODEL_SEED="$seed" cargo test --test model -- --nocapture 2>&1 | grep -E '^model \(|^test |panicked|client [0-9]'
