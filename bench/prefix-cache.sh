#!/usr/bin/env bash
# The simulator's prefix cache under conversation_pool load
# (docs/simulator.md, "The prefix cache"): for each pool size, a fresh
# `nyann-bench sim` (default profile) with the cache on and off, one
# closed-loop conversation_pool stage of multi-turn chats against it, and
# then the stage's first-turn and later-turn TTFT p50 (stages.json) and the
# server's hit rate (vllm:prefix_cache_hits_total /
# vllm:prefix_cache_queries_total). A pool larger than the KV cache (224
# blocks of 16 tokens) evicts conversations before they come back: the hit
# rate falls and later turns slow down.
#
# Usage: bench/prefix-cache.sh [SECONDS] [POOL_SIZES]   (default 8, "4 8 16 32")
# Env:   SEED (default 1), CONCURRENCY (default 4), BIN (a nyann-bench
#        binary instead of building one), CARGO_TARGET_DIR (default target)
# Needs: cargo, python3, curl.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${1:-8}
POOL_SIZES=${2:-4 8 16 32}
SEED=${SEED:-1}
CONCURRENCY=${CONCURRENCY:-4}

source "$(dirname "$0")/common.sh"
bin_or_build
require_tools prefix-cache python3 curl

echo "| pool | cache | first-turn TTFT p50 | later-turn TTFT p50 | later turns | hit rate | output tok/s |"
echo "|---|---|---|---|---|---|---|"
for pool in $POOL_SIZES; do
    for cache in on off; do
        flags=(--seed "$SEED")
        [[ $cache == off ]] && flags+=(--no-enable-prefix-caching)
        start_sim prefix-cache "$BIN" "${flags[@]}"
        cat >"$WORK/pool.star" <<STAR
scenario(
    workload = workload("synthetic", isl=128, osl=32, turns=6, subsequent_isl=32),
    stages = [stage("${SECONDS_PER_RUN}s", mode="conversation_pool", concurrency=${CONCURRENCY},
                    conversation_pool_size=${pool})],
)
STAR
        rm -rf "$WORK/run"
        "$BIN" generate --config "$WORK/pool.star" --target "$BASE" --seed "$SEED" \
            --output-dir "$WORK/run" -q >/dev/null 2>"$WORK/generate.err" \
            || { cat "$WORK/generate.err" >&2; exit 1; }
        curl -sf "${BASE%/v1}/metrics" >"$WORK/metrics.txt"
        stop_sim
        python3 - "$WORK/run/stages.json" "$WORK/metrics.txt" "$pool" "$cache" <<'PY'
import json, sys
stage = json.load(open(sys.argv[1]))["stages"][0]
counters = {}
for line in open(sys.argv[2]):
    for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        if line.startswith(name + "{"):
            counters[name] = float(line.rsplit(" ", 1)[1])
hits, queries = counters["vllm:prefix_cache_hits_total"], counters["vllm:prefix_cache_queries_total"]
d = stage["detail"]
rate = f"{hits / queries:.0%}" if queries else "0 (no queries)"
print(f"| {sys.argv[3]} | {sys.argv[4]} | {d['first_turn_ttft_p50_seconds'] * 1e3:.1f} ms "
      f"| {d['later_turn_ttft_p50_seconds'] * 1e3:.1f} ms | {d['later_turns_ok']} | {rate} "
      f"| {stage['client']['output_tokens_per_second']:,.0f} |")
PY
    done
done
