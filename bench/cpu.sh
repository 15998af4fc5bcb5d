#!/usr/bin/env bash
# CPU cost per request of `nyann-bench generate`: user+sys seconds (from
# /usr/bin/time) divided by the requests it completed, against
# `nyann-bench sim --profile fast`. Unlike req/s, this figure changes little
# when other processes share the cores, so it is the one to compare across
# changes of the load generator.
#
# Usage: bench/cpu.sh [SECONDS] [CONCURRENCY]   (defaults 6 and 1024)
# Env:   BIN      the nyann-bench binary measured (default $CARGO_TARGET_DIR/release/nyann-bench,
#                 built first when BIN is not set)
#        SIM_BIN  the binary that runs the simulator (default BIN): pin it to one
#                 build so that only the client changes between measurements
#        RUNS     repetitions (default 1); each prints one line
#        OUTPUT   1 = also write requests.jsonl (as bench/load.sh does; default 1)
# Prints: conc, requests, user_s, sys_s, cpu_us_per_request, max_rss_MB, req/s
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${1:-6}
C=${2:-1024}
RUNS=${RUNS:-1}
OUTPUT=${OUTPUT:-1}
source "$(dirname "$0")/common.sh"
bin_or_build
SIM_BIN=${SIM_BIN:-$BIN}
require_tools cpu jq /usr/bin/time

start_fast_sim cpu "$SIM_BIN"

printf '%6s %9s %8s %8s %12s %10s %9s\n' conc requests user_s sys_s cpu_us/req max_rss_MB req/s
for _ in $(seq "$RUNS"); do
    OUT_ARGS=()
    # A new directory per run: generate refuses one that holds a run already.
    rm -rf "$WORK/gen"
    [[ "$OUTPUT" == 1 ]] && OUT_ARGS=(--output-dir "$WORK/gen")
    ${WRAP:-} /usr/bin/time -f '%U %S %M' -o "$WORK/time" "$BIN" generate --target "$BASE" --concurrency "$C" \
        --duration "${SECONDS_PER_RUN}s" --workload synthetic --isl 32 --osl 32 \
        --max-consecutive-errors 0 --seed 1 "${OUT_ARGS[@]}" >"$WORK/gen.json" 2>"$WORK/gen.err" || true
    # Every request the process handled: the measured stage's plus those
    # still finishing after it (requests_recorded counts them all).
    N=$(jq -r '.requests_recorded // .totals.requests_ok // 0' "$WORK/gen.json" 2>/dev/null || echo 0)
    RPS=$(jq -r '.totals.requests_per_second // 0' "$WORK/gen.json" 2>/dev/null || echo 0)
    read -r U S M <"$WORK/time"
    awk -v c="$C" -v n="$N" -v u="$U" -v s="$S" -v m="$M" -v r="$RPS" 'BEGIN{
        printf "%6s %9d %8.2f %8.2f %12.1f %10.1f %9.0f\n", c, n, u, s, (n > 0 ? (u + s) * 1e6 / n : 0), m / 1024, r }'
done
