#!/bin/sh
# Runs every fuzz target for N seconds (default 30) from its seed corpus, without sanitizers
# (works on a stable toolchain). Needs cargo-fuzz: `cargo install cargo-fuzz --locked`.
# `--dev` builds the targets unoptimized: the build takes about half the time and a third of the
# CPU, and each target runs ~10× fewer inputs per second — what CI's smoke run wants (the seeds
# and the first mutations of every target, quickly); real fuzzing runs without it.
# A crash leaves its input under fuzz/artifacts/<target>/: turn it into a unit test next to the
# code it broke, then fix. Usage: fuzz/smoke.sh [seconds] [--dev]
set -eu
N="${1:-30}"
PROFILE="${2:--O}"
cd "$(dirname "$0")"
for t in classify selectors continue_token object x509_subject protobuf path_segments state_file; do
    mkdir -p "corpus/$t"
    echo "== $t ($N s)"
    cargo fuzz run "$t" "$PROFILE" -s none "corpus/$t" "seeds/$t" -- -max_total_time="$N" -max_len=4096
done
