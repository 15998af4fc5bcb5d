#!/usr/bin/env bash
# Load-generator benchmark: nyann-bench generate and oha (a raw HTTP load
# tool) side by side against `nyann-bench sim --profile fast`, sending the same
# streaming chat request, at several concurrencies. Prints req/s of both, the
# ratio and nyann-bench's peak RSS; then, at c=1024, the client's TTFT against
# the simulator's own records of each request, matched by response id.
#
# The TTFT comparison runs twice: with the simulator and the client sharing
# every core (as the req/s table does), and with each on its own half of the
# cores (taskset), as a client and a server on different hosts are. Each run
# prints the TTFT p50 of both sides and splits the difference: send -> the
# simulator's arrival stamp (the request waiting in the simulator's socket
# and runtime before its handler runs) and the simulator's first-token stamp
# -> the first token's arrival as the client dates it.
#
# Usage: bench/load.sh [SECONDS_PER_POINT]   (default 10)
# Env:   CONCURRENCIES="64 256 1024 4096"   CARGO_TARGET_DIR (default target)
#        BIN: a nyann-bench binary to measure instead of building one (for
#        before/after comparisons)
#        SIM_BIN: the binary that runs the simulator (default BIN; give the
#        same one to both sides of a before/after comparison so that only
#        the client differs)
# Needs: cargo, jq (apt-get install jq), python3, /usr/bin/time (apt-get install time),
#        taskset (util-linux) for the split-core run; installs oha from crates.io
#        when missing.
# Targets: nyann-bench >= 0.8x oha at c=1024; peak RSS <= 150 MB at c=4096;
#          client TTFT within 1 ms (p50) of the simulator's record of when it
#          sent the first token, at c=1024.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_POINT=${1:-10}
CONCURRENCIES=${CONCURRENCIES:-"64 256 1024 4096"}
OSL=32
ISL=32

source "$(dirname "$0")/common.sh"
require_tools bench jq python3 /usr/bin/time
if ! command -v oha >/dev/null; then
    echo "bench: installing oha from crates.io (cargo install oha --locked)" >&2
    cargo install oha --locked >&2
fi
bin_or_build

start_fast_sim bench "${SIM_BIN:-$BIN}"
HOST=${BASE%/v1}
echo "simulator: $BASE (profile fast), ${SECONDS_PER_POINT}s per point" >&2

# The request nyann-bench sends with --isl $ISL --osl $OSL (synthetic workload,
# 4 chars/token from the simulator's /tokenize), spelled out for oha.
PROMPT=$(printf 'word %.0s' $(seq $((ISL * 4 / 5))) | head -c $((ISL * 4)))
BODY=$(jq -cn --arg p "$PROMPT" --argjson n $OSL \
    '{model:"nyann-sim",messages:[{role:"user",content:$p}],max_tokens:$n,stream:true,ignore_eos:true,min_tokens:$n}')

# ttft_report LABEL DIR SINCE: TTFT figures of the generate run in DIR (its
# requests.jsonl) against the simulator's records since SINCE, matched by
# response id (a join jq does too slowly for 200,000 records).
ttft_report() {
    local label=$1 dir=$2 since=$3
    curl -s "$HOST/sim/requests?since=$since" >"$dir/sim-requests.json"
    python3 - "$label" "$dir" <<'PY'
import json, sys
label, folder = sys.argv[1], sys.argv[2]
sim = {r["id"]: r for r in json.load(open(f"{folder}/sim-requests.json"))
       if r["status"] == "ok" and r["first_token"] is not None}
rows = []
for line in open(f"{folder}/requests.jsonl"):
    r = json.loads(line)
    s = sim.get(r.get("response_id"))
    if r["status"] == "ok" and r["phase"] == "measured" and s is not None:
        rows.append((r["ttft_s"], s["first_token"] - s["arrival"],
                     s["arrival"] - r["sent_at"], r["first_token_at"] - s["first_token"]))
if not rows:
    sys.exit(f"{label}: no request matched the simulator's records")
client, server, arrival, delivery = (sorted(column)[len(column) // 2] * 1000 for column in zip(*rows))
print(f"{label}, {len(rows)} requests, p50:")
print(f"  client TTFT {client:.3f} ms, simulator TTFT {server:.3f} ms, difference {client - server:.3f} ms")
print(f"  send -> simulator arrival {arrival:.3f} ms; simulator sent the first token -> it reached the client {delivery:.3f} ms")
PY
}

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
        ttft_report "c=1024, all cores shared" "$WORK/gen-$C" "$SINCE" >"$WORK/ttft-shared"
    fi
done
[[ -f "$WORK/ttft-shared" ]] && cat "$WORK/ttft-shared"

CPUS=$(nproc)
if command -v taskset >/dev/null && (( CPUS >= 2 )); then
    SIM_CPUS="0-$((CPUS / 2 - 1))"
    CLIENT_CPUS="$((CPUS / 2))-$((CPUS - 1))"
    stop_sim
    start_fast_sim bench "${SIM_BIN:-$BIN}" taskset -c "$SIM_CPUS"
    HOST=${BASE%/v1}
    SINCE=$(date +%s.%N)
    taskset -c "$CLIENT_CPUS" "$BIN" generate --target "$BASE" --concurrency 1024 --duration "${SECONDS_PER_POINT}s" \
        --workload synthetic --isl $ISL --osl $OSL --max-consecutive-errors 0 --seed 1 \
        --output-dir "$WORK/gen-split" >"$WORK/gen-split.json" 2>"$WORK/gen-split.err" || true
    ttft_report "c=1024, simulator on cpus $SIM_CPUS, client on cpus $CLIENT_CPUS" "$WORK/gen-split" "$SINCE"
else
    echo "(no split-core TTFT run: it needs taskset and at least 2 cpus)"
fi
