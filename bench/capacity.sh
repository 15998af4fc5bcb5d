#!/usr/bin/env bash
# What a capacity search costs and finds against a fine sweep
# (docs/scenarios.md, "The capacity between two levels"): against the twin
# of the reference vLLM (`sim --profile vllm-cpu-ref`) and the queueing rule
# the reference run used (waiting p50 8, TTFT p99 1 s, KV rule off), runs
# the fine sweep [8, 12, ..., 32], the coarse grid [8, 32, 128] with
# refine=4, and the same with confirm=1 (a close call judged again), and
# prints where each says the server congests and how much load each sent.
#
# Usage: bench/capacity.sh [SECONDS_PER_STAGE]   (default 10)
# Env:   SEED (default 1), BIN (a nyann-bench binary instead of building one),
#        CARGO_TARGET_DIR (default target)
# Needs: cargo, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_STAGE=${1:-10}
SEED=${SEED:-1}

source "$(dirname "$0")/common.sh"
bin_or_build
require_tools capacity python3

# sweep NAME LEVELS EXTRA: one run against a fresh twin (no run inherits
# another's cache or queue).
sweep() {
    local name=$1 levels=$2 extra=$3
    start_sim capacity "$BIN" --profile vllm-cpu-ref --seed "$SEED"
    local metrics
    metrics=$(awk '/^metrics aggregate /{print $3}' "$WORK/sim.out")
    cat >"$WORK/$name.star" <<STAR
scenario(
    workload = workload("synthetic", isl=60, osl=128),
    stages = until_congested(
        [stage("${SECONDS_PER_STAGE}s", concurrency=c) for c in [$levels]],
        waiting_requests_p50=8, ttft_p99="1s", kv_cache_usage=1.0, preemptions=1000000,$extra
    ),
)
STAR
    "$BIN" generate --config "$WORK/$name.star" --target "$BASE" --scrape "aggregate=$metrics" \
        --seed "$SEED" --output-dir "$WORK/$name" -q >/dev/null
    stop_sim
}

echo "capacity: twin vllm-cpu-ref (seed $SEED), ${SECONDS_PER_STAGE}s per stage" >&2
sweep fine "8, 12, 16, 20, 24, 28, 32" ""
sweep refined "8, 32, 128" " refine=4,"
sweep confirmed "8, 32, 128" " refine=4, confirm=1,"

python3 - "$WORK/fine" "$WORK/refined" "$WORK/confirmed" <<'PY'
import json, sys
print("| run | stages with load | load seconds | not congested | congested | judged levels |")
print("|---|---|---|---|---|---|")
names = ["fine [8..32 by 4]", "grid [8, 32, 128], refine=4", "the same, confirm=1"]
for name, path in zip(names, sys.argv[1:]):
    summary = json.load(open(f"{path}/summary.json"))
    ran = [s for s in summary["stages"] if s["status"] == "measured"]
    seconds = sum(s["end_unix"] - s["start_unix"] for s in ran)
    verdicts = " ".join(
        f"{s['concurrency']}{'!' if s['annotation']['congestion']['verdict']['congested'] else ''}"
        for s in ran)
    sweep = summary["conclusion"]["sweeps"][0]
    if "capacity" in sweep:
        clean, congested = sweep["capacity"].get("clean"), sweep["capacity"]["congested"]
    else:
        clean, congested = sweep.get("knee"), sweep.get("congested")
    level = lambda s: f"c={s['concurrency']}" if s else "-"
    print(f"| {name} | {len(ran)} | {seconds:.0f} | {level(clean)} | {level(congested)} | {verdicts} |")
print("(! = judged congested)")
print()
print("| run | c | waiting p50 | server TTFT p99 | output tok/s |")
print("|---|---|---|---|---|")
for name, path in zip(["fine", "refined", "confirmed"], sys.argv[1:]):
    for s in json.load(open(f"{path}/summary.json"))["stages"]:
        if s["status"] != "measured":
            continue
        role = s["annotation"]["congestion"]["roles"][0]
        search = " (search)" if s.get("search") else ""
        print(f"| {name} | {s['concurrency']}{search} | {role['waiting_requests_p50']:g} "
              f"| {role['ttft_p99_seconds']:.2f} s | {s['client']['output_tokens_per_second']:,.0f} |")
PY
