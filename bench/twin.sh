#!/usr/bin/env bash
# The simulator as a twin of the reference vLLM (docs/simulator.md):
# sweeps `nyann-bench sim --profile PROFILE` the way the reference server was
# swept (closed loop, streaming chat, synthetic prompts of isl 60, osl 128,
# one stage per level, server signals scraped from /metrics every second)
# and prints every level next to what the real vLLM 0.32 measured (30 s per
# level there; preemptions are compared per second).
#
# Usage: bench/twin.sh [PROFILE] [SECONDS_PER_LEVEL]   (default vllm-cpu-ref, 10)
# Env:   SEED (default 1), BIN (a nyann-bench binary instead of building one),
#        CARGO_TARGET_DIR (default target)
# Needs: cargo, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${1:-vllm-cpu-ref}
SECONDS_PER_LEVEL=${2:-10}
SEED=${SEED:-1}

source "$(dirname "$0")/common.sh"
bin_or_build
require_tools twin python3

start_sim twin "$BIN" --profile "$PROFILE" --seed "$SEED"
METRICS=$(awk '/^metrics aggregate /{print $3}' "$WORK/sim.out")
echo "twin: $BASE (profile $PROFILE, seed $SEED), ${SECONDS_PER_LEVEL}s per level" >&2

# Every level is judged (so its server signals are read) and none stops.
cat >"$WORK/sweep.star" <<STAR
scenario(
    workload = workload("synthetic", isl=60, osl=128),
    stages = until_congested(
        [stage("${SECONDS_PER_LEVEL}s", concurrency=c) for c in [1, 4, 8, 12, 16, 24, 32, 64]],
        waiting_requests_p50=100000, ttft_p99="1h",
    ),
)
STAR
"$BIN" generate --config "$WORK/sweep.star" --target "$BASE" --scrape "aggregate=$METRICS" \
    --policy-mode monitor --seed "$SEED" --output-dir "$WORK/run" -q >/dev/null

python3 - "$WORK/run/stages.json" "$SECONDS_PER_LEVEL" <<'PY'
import json, sys
# The reference vLLM, per level: output tok/s, waiting p50, server TTFT p99 (s),
# KV usage max, preemptions per 30 s level.
real = {1: (357, 0, 0.024, 0.11, 0), 4: (1241, 0, 0.035, 0.41, 0), 8: (1824, 0, 0.087, 0.79, 0),
        12: (2405, 0, 0.19, 1.0, 174), 16: (1905, 4, 0.67, 1.0, 333), 24: (1949, 13, 2.36, 1.0, 320),
        32: (1867, 18, 2.47, 1.0, 330), 64: (2159, 50, 4.97, 1.0, 394)}
stages, seconds = json.load(open(sys.argv[1]))["stages"], float(sys.argv[2])
print("| c | twin output tok/s | real | twin waiting p50 | real | twin server TTFT p99 | real | twin KV max | real | twin preemptions/s | real |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in stages:
    if s["status"] != "measured":
        continue
    role = s["annotation"]["congestion"]["roles"][0]
    c = s["concurrency"]
    tok, wait, ttft, kv, pre = real[c]
    print(f"| {c} | {s['client']['output_tokens_per_second']:,.0f} | {tok:,} "
          f"| {role['waiting_requests_p50']:g} | {wait} "
          f"| {role['ttft_p99_seconds']:.3g} s | {ttft} s "
          f"| {role['kv_cache_usage_max']:.2f} | {kv} "
          f"| {role['preemptions'] / seconds:.1f} | {pre / 30:.1f} |")
PY
