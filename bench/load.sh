#!/usr/bin/env bash
# Load-generator benchmark: nyann-bench generate and oha (a raw HTTP load
# tool) side by side against `nyann-bench sim --profile fast`, sending the same
# streaming chat request, at several concurrencies. Prints req/s of both, the
# ratio, nyann-bench's peak RSS, and at c=1024 the client's TTFT p50 against
# the simulator's own first-token record.
#
# Usage: bench/load.sh [SECONDS_PER_POINT]   (default 10)
# Env:   CONCURRENCIES="64 256 1024 4096"   CARGO_TARGET_DIR (default target)
#        BIN: a nyann-bench binary to measure instead of building one (for
#        before/after comparisons; it also runs the simulator)
# Needs: cargo, jq (apt-get install jq), /usr/bin/time (apt-get install time);
#        installs oha from crates.io when missing.
# Targets: nyann-bench >= 0.8x oha at c=1024; peak RSS <= 150 MB at c=4096;
#          client TTFT p50 within 1 ms of the simulator's at c=1024.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_POINT=${1:-10}
CONCURRENCIES=${CONCURRENCIES:-"64 256 1024 4096"}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BUILD=0
if [[ -z "${BIN:-}" ]]; then
    BIN="$TARGET_DIR/release/nyann-bench"
    BUILD=1
fi
OSL=32
ISL=32

source "$(dirname "$0")/common.sh"
require_tools bench jq /usr/bin/time
if ! command -v oha >/dev/null; then
    echo "bench: installing oha from crates.io (cargo install oha --locked)" >&2
    cargo install oha --locked >&2
fi
if [[ "$BUILD" == 1 ]]; then cargo build --release -p nyann-bench >&2; fi

start_fast_sim bench "$BIN"
HOST=${BASE%/v1}
echo "simulator: $BASE (profile fast), ${SECONDS_PER_POINT}s per point" >&2

# The request nyann-bench sends with --isl $ISL --osl $OSL (synthetic workload,
# 4 chars/token from the simulator's /tokenize), spelled out for oha.
PROMPT=$(printf 'word %.0s' $(seq $((ISL * 4 / 5))) | head -c $((ISL * 4)))
BODY=$(jq -cn --arg p "$PROMPT" --argjson n $OSL \
    '{model:"nyann-sim",messages:[{role:"user",content:$p}],max_tokens:$n,stream:true,ignore_eos:true,min_tokens:$n}')

printf '%6s %12s %12s %7s %10s\n' conc oha_req/s nyann_req/s ratio nyann_RSS_MB
for C in $CONCURRENCIES; do
    oha -z "${SECONDS_PER_POINT}s" -c "$C" --no-tui --output-format json \
        -m POST -H 'content-type: application/json' -d "$BODY" "$BASE/chat/completions" \
        >"$WORK/oha-$C.json" 2>"$WORK/oha-$C.err" || true
    OHA=$(jq -r '.summary.requestsPerSec // 0' "$WORK/oha-$C.json" 2>/dev/null || echo 0)

    SINCE=$(date +%s.%N)
    /usr/bin/time -v "$BIN" generate --target "$BASE" --concurrency "$C" --duration "${SECONDS_PER_POINT}s" \
        --workload synthetic --isl $ISL --osl $OSL --max-consecutive-errors 0 --seed 1 \
        --output-dir "$WORK/gen-$C" >"$WORK/gen-$C.json" 2>"$WORK/gen-$C.err" || true
    NYANN=$(jq -r '.totals.requests_per_second // 0' "$WORK/gen-$C.json" 2>/dev/null || echo 0)
    RSS_KB=$(awk -F: '/Maximum resident set size/{gsub(/ /,"",$2); print $2}' "$WORK/gen-$C.err")
    RATIO=$(awk -v a="$NYANN" -v b="$OHA" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    printf '%6s %12.0f %12.0f %7s %10.1f\n' "$C" "$OHA" "$NYANN" "$RATIO" "$(awk -v k="${RSS_KB:-0}" 'BEGIN{print k/1024}')"

    if [[ "$C" == 1024 ]]; then
        # TTFT p50: the client's (send -> first chunk) vs the simulator's own
        # record (arrival -> first token handed to the connection), same window.
        curl -s "$HOST/sim/requests?since=$SINCE" >"$WORK/sim-requests.json"
        SIM_P50=$(jq '[.[] | select(.status == "ok" and .first_token != null) | (.first_token - .arrival)] | sort | if length > 0 then .[length/2|floor] else 0 end' "$WORK/sim-requests.json")
        CLIENT_P50=$(jq '.totals.ttft_p50_seconds' "$WORK/gen-$C.json")
        echo "$C" "$CLIENT_P50" "$SIM_P50" >"$WORK/ttft"
    fi
done
if [[ -f "$WORK/ttft" ]]; then
    read -r C CLIENT_P50 SIM_P50 <"$WORK/ttft"
    awk -v c="$CLIENT_P50" -v s="$SIM_P50" -v n="$C" \
        'BEGIN{ printf "TTFT p50 at c=%s: client %.3f ms, simulator %.3f ms, difference %.3f ms\n", n, c*1000, s*1000, (c-s)*1000 }'
fi
