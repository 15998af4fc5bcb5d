#!/usr/bin/env bash
# The HTML report's size and build time: for the demo's run, and for a run of
# about 100,000 requests (a single stage against `sim --profile fast`).
#
# Usage: bench/report.sh [REQUESTS]   (default 100000)
# Env:   BIN  the nyann-bench binary (default target/release/nyann-bench, built first)
# Prints per run: requests recorded, requests.jsonl size, report.html size,
# and the time `nyann-bench report DIR` takes (best of 3).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${1:-100000}
source "$(dirname "$0")/common.sh"
bin_or_build
require_tools report jq

# best_of_3 DIR: the fastest of three `report DIR` runs, in seconds.
best_of_3() {
    local best=
    for _ in 1 2 3; do
        local start end
        start=$(date +%s.%N)
        "$BIN" report -q "$1"
        end=$(date +%s.%N)
        best=$(echo "$end - $start" | bc -l | awk -v b="$best" '{ if (b == "" || $1 < b) print $1; else print b }')
    done
    printf '%.3f' "$best"
}

row() {
    local name=$1 dir=$2
    printf '%-12s %9s %12s %10s %9s\n' "$name" \
        "$(jq .requests_recorded "$dir/summary.json")" \
        "$(du -k "$dir/requests.jsonl" | cut -f1)" \
        "$(du -k "$dir/report.html" | cut -f1)" \
        "$(best_of_3 "$dir")"
}

"$BIN" demo -q --output-dir "$WORK/demo" 2>/dev/null

start_fast_sim report "$BIN"
"$BIN" generate -q --target "$BASE" --concurrency 256 --max-requests "$REQUESTS" --duration 120s \
    --workload synthetic --isl 32 --osl 32 --max-consecutive-errors 0 --seed 1 \
    --output-dir "$WORK/big" >/dev/null
stop_sim

printf '%-12s %9s %12s %10s %9s\n' run requests jsonl_KB report_KB build_s
row demo "$WORK/demo"
row "${REQUESTS}-req" "$WORK/big"
