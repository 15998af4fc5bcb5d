#!/usr/bin/env bash
# What hostile policy components cost a nyann-bench binary, side by side for
# several binaries (e.g. a build from before a sandbox change and one from
# after). The components implement nyann:policy@0.1, which every binary
# loads:
#   sleep   a policy that sleeps 10 s in each judge (tests/guests/legacy-v01
#           with sleep_seconds=10s), checked with `policy check` (2 judges);
#   memory  32 linear memories, each grown and filled to 62 MiB in judge,
#           judged once in a sweep against the simulator with
#           --policy-timeout 2s;
#   memory3 3 linear memories, two of them grown and filled to 40 MiB
#           (120 MiB in all, each under a 64 MiB cap), the same way;
#   huge    a 116 MB component (mostly code), loaded by `policy check` with
#           an empty compiled-code cache.
# The last two are assembled by `cargo xtask assemble` (crates/guests).
#
# Usage: bench/policy-sandbox.sh [BIN...]
#        (default: $CARGO_TARGET_DIR/release/nyann-bench, built first)
# Prints per binary and case: wall seconds, peak RSS MB, cache MB, outcome.
# The machine's load changes the times: compare binaries in one run.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR=${CARGO_TARGET_DIR:-target}
if [[ $# -eq 0 ]]; then
    cargo build --release -p nyann-bench >&2
    set -- "$TARGET_DIR/release/nyann-bench"
fi
source "$(dirname "$0")/common.sh"
require_tools policy-sandbox jq /usr/bin/time

echo "building the hostile components..." >&2
cargo build --release --quiet --target wasm32-wasip2 -p legacy-v01-policy \
    --manifest-path crates/policy-host/tests/guests/Cargo.toml --target-dir "$WORK/guests" >&2
SLEEP_WASM="$WORK/guests/wasm32-wasip2/release/legacy_v01_policy.wasm"
cargo xtask assemble "$WORK/memory.wasm" 0.1 31 62 0 >&2
cargo xtask assemble "$WORK/memory3.wasm" 0.1 2 40 0 >&2
cargo xtask assemble "$WORK/huge.wasm" 0.1 0 0 90 >&2

# measure NAME COMMAND...: run COMMAND under /usr/bin/time with an empty
# cache; print wall s, peak RSS MB, cache MB and the outcome OUTCOME sets.
measure() {
    local name=$1
    shift
    rm -rf "$WORK/cache" "$WORK/out"
    mkdir -p "$WORK/out"
    NYANN_BENCH_CACHE_DIR="$WORK/cache" /usr/bin/time -f '%e %M' -o "$WORK/time" \
        "$@" >"$WORK/stdout" 2>"$WORK/stderr" || true
    local wall rss cache
    read -r wall rss < <(tail -n1 "$WORK/time")
    cache=$(du -sm "$WORK/cache" 2>/dev/null | cut -f1 || echo 0)
    printf '%-8s %8ss %8s MB %6s MB  %s\n' "$name" "$wall" "$((rss / 1024))" "${cache:-0}" "$(outcome)"
}

# The first failed judge, the recorded verdict, or the error line.
outcome() {
    if [[ -s "$WORK/out/summary.json" ]]; then
        jq -r '[.stages[] | .annotation.congestion // empty
                | (.policy_error // ("verdict: " + (if .verdict.congested then "congested" else "ok" end)))][0]' \
            "$WORK/out/summary.json"
    elif grep -q 'FAILED' "$WORK/stdout"; then
        grep -m1 'FAILED' "$WORK/stdout" | sed 's/^ *//'
    elif grep -q 'check passed' "$WORK/stdout"; then
        echo "check passed"
    else
        grep -m1 -i 'error' "$WORK/stderr" || tail -n1 "$WORK/stderr"
    fi
}

cat >"$WORK/sweep.star" <<'EOF'
scenario(
    workload = workload("synthetic", isl=16, osl=16),
    stages = until_congested([stage("2s", concurrency=1)]),
)
EOF

for bin in "$@"; do
    echo "== $bin"
    start_fast_sim policy-sandbox "$bin"
    measure sleep "$bin" policy check "$SLEEP_WASM" --param sleep_seconds=10s
    for memory in memory memory3; do
        measure "$memory" "$bin" generate --config "$WORK/sweep.star" --target "$BASE" \
            --scrape "${BASE%/v1}/metrics" --policy "$WORK/$memory.wasm" --policy-timeout 2s \
            --output-dir "$WORK/out"
    done
    measure huge "$bin" policy check "$WORK/huge.wasm"
    stop_sim
done
