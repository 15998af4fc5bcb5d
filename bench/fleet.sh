#!/usr/bin/env bash
# Scale-out benchmark, against `nyann-bench sim --profile fast`:
#
# 1. Coordination cost per stage boundary with 8 local workers: a sweep of
#    STAGES short stages without a stop condition (no signal read, no
#    policy: the coordination alone). Each worker records, per measured
#    stage, the time from sending its statistics to receiving the decision
#    (fleet.json); per stage, the shortest of those waits is the last
#    reporter's: from the last worker's stage end to the decision reaching
#    it. Prints p50 and p99 over the stages (an upper bound: when the
#    leader itself finished its stage last, its own drain is included).
# 2. Fleet throughput: one stage at concurrency C, one worker alone vs two
#    workers (each pinned to its own core with taskset), req/s and the ratio.
#
# Usage: bench/fleet.sh   Env: STAGES (default 40), C (default 256),
#        SECONDS_PER_POINT (default 10), BIN (a nyann-bench binary; default:
#        build target/release/nyann-bench)
# Needs: jq, python3, taskset.
# Target: coordination p50 <= 50 ms (plus the signal read and the judge when
#         a stop condition is set); 2 workers > 1 worker when the client is
#         the bottleneck.
# The machine may be shared: run it twice and compare.
set -euo pipefail
cd "$(dirname "$0")/.."

STAGES=${STAGES:-40}
C=${C:-256}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-10}
source "$(dirname "$0")/common.sh"
require_tools bench jq python3 taskset
bin_or_build
CORES=$(nproc)

start_fast_sim fleet "$BIN"
echo "simulator: $BASE (profile fast, every core); $CORES cores" >&2

# run_fleet N DIR SCENARIO [PIN...]: runs N workers (worker I pinned to core
# PIN[I] when given) and waits for all of them.
run_fleet() {
    local n=$1 dir=$2 scenario=$3
    shift 3
    local pins=("$@") pids=() prefix
    mkdir -p "$dir"
    prefix=()
    [[ ${#pins[@]} -gt 0 ]] && prefix=(taskset -c "${pins[0]}")
    "${prefix[@]}" "$BIN" -q generate --config "$scenario" --workers "$n" --worker-index 0 \
        --coordinator-listen 127.0.0.1:0 --target "$BASE" --output-dir "$dir/w0" --seed 1 \
        >"$dir/w0.out" 2>"$dir/w0.err" &
    pids+=($!)
    local addr=
    for _ in $(seq 300); do
        addr=$(awk '/^coordinator listening on /{print $4}' "$dir/w0.err")
        [[ -n "$addr" ]] && break
        sleep 0.1
    done
    [[ -n "$addr" ]] || { echo "fleet: the leader did not start:" >&2; cat "$dir/w0.err" >&2; exit 1; }
    for i in $(seq 1 $((n - 1))); do
        prefix=()
        [[ ${#pins[@]} -gt $i ]] && prefix=(taskset -c "${pins[$i]}")
        "${prefix[@]}" "$BIN" -q generate --workers "$n" --worker-index "$i" --coordinator "$addr" \
            --target "$BASE" --output-dir "$dir/w$i" >"$dir/w$i.out" 2>"$dir/w$i.err" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
}

echo "== coordination cost: 8 workers, $STAGES stages of 300 ms at 8 streams" >&2
cat >"$WORK/boundaries.star" <<STAR
scenario(
    workload = workload("synthetic", isl=32, osl=8),
    stages = [stage("300ms", concurrency=8) for _ in range($STAGES)],
)
STAR
run_fleet 8 "$WORK/coord" "$WORK/boundaries.star"
python3 - "$WORK/coord/w0/fleet.json" <<'PY'
import json, sys
fleet = json.load(open(sys.argv[1]))
per_step = {}
for worker, waits in fleet["decision_waits"]:
    for step, seconds in waits:
        per_step.setdefault(step, []).append(seconds)
last = sorted(min(v) for v in per_step.values())
first = sorted(max(v) for v in per_step.values())
q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] * 1000
print(f"stage boundaries: {len(last)}; workers reporting: {len(fleet['decision_waits'])}")
print(f"last reporter's wait for the decision: p50 {q(last, .5):.1f} ms, p99 {q(last, .99):.1f} ms")
print(f"first reporter's wait (includes the others' drains): p50 {q(first, .5):.1f} ms, p99 {q(first, .99):.1f} ms")
PY

echo "== throughput: 1 worker vs 2 workers, c=$C for ${SECONDS_PER_POINT}s" >&2
cat >"$WORK/one.star" <<STAR
scenario(
    workload = workload("synthetic", isl=32, osl=32),
    stages = [stage("${SECONDS_PER_POINT}s", concurrency=$C)],
)
STAR
taskset -c 0 "$BIN" -q generate --config "$WORK/one.star" --target "$BASE" --output-dir "$WORK/single" --seed 1 >/dev/null 2>"$WORK/single.err"
single=$(jq '.totals.requests_per_second' "$WORK/single/summary.json")
if [[ "$CORES" -ge 2 ]]; then
    run_fleet 2 "$WORK/pair" "$WORK/one.star" 0 1
    layout="worker 0 on core 0, worker 1 on core 1, the simulator on every core"
else
    run_fleet 2 "$WORK/pair" "$WORK/one.star"
    layout="one core: nothing pinned"
fi
pair=$(jq '.totals.requests_per_second' "$WORK/pair/w0/summary.json")
echo "1 worker (core 0): $(printf %.0f "$single") req/s"
echo "2 workers ($layout): $(printf %.0f "$pair") req/s"
python3 -c "print(f'ratio 2/1: {$pair / $single:.2f}')"
