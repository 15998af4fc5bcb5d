#!/usr/bin/env bash
# Open-loop send precision: how late `nyann-bench generate` sends a request
# of a Poisson stage after the instant its schedule gave it (`sent_at -
# scheduled_at` of every request sent), at a few rates, with the simulator
# (`sim --profile fast`) on the first half of the cores and the client on the
# second half, as a client and a server on different hosts are. Prints per
# rate the requests sent, the lateness p50/p99/max in ms, and the client's
# CPU use (user+sys over the wall time, in % of one core), which shows what
# a precise clock costs while the load is light, and the steal time of the
# client's cores (% of their time the hypervisor ran another guest: on a
# shared VM, 1% of steal in millisecond slices delays about 1% of the sends
# by milliseconds, which no program can avoid and p99 shows).
#
# Usage: bench/open-loop.sh [SECONDS_PER_POINT]   (default 8)
# Env:   RATES="10 300 10000"   BIN (a nyann-bench to measure instead of
#        building one)   SIM_BIN (the simulator's binary, default BIN)
# Needs: python3, /usr/bin/time (apt-get install time), taskset (util-linux)
# Targets: lateness p50 <= 0.1 ms and p99 <= 0.5 ms at 300 and 10,000 req/s.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_POINT=${1:-8}
RATES=${RATES:-"10 300 10000"}

source "$(dirname "$0")/common.sh"
require_tools open-loop python3 /usr/bin/time taskset
bin_or_build

CPUS=$(nproc)
SIM_CPUS="0-$(( CPUS > 1 ? CPUS / 2 - 1 : 0 ))"
CLIENT_CPUS="$(( CPUS > 1 ? CPUS / 2 : 0 ))-$((CPUS - 1))"
start_fast_sim open-loop "${SIM_BIN:-$BIN}" taskset -c "$SIM_CPUS"
echo "simulator: $BASE (profile fast, cpus $SIM_CPUS), client on cpus $CLIENT_CPUS, ${SECONDS_PER_POINT}s per rate" >&2

printf '%8s %9s %12s %12s %12s %10s %7s\n' rate sent late_p50_ms late_p99_ms late_max_ms client_cpu% steal%
for RATE in $RATES; do
    read -r STEAL0 TOTAL0 < <(cpu_ticks "$CLIENT_CPUS")
    /usr/bin/time -f '%U %S %e' -o "$WORK/time-$RATE" \
        taskset -c "$CLIENT_CPUS" "$BIN" generate --target "$BASE" --mode poisson --rate "$RATE" \
        --duration "${SECONDS_PER_POINT}s" --workload synthetic --isl 32 --osl 4 --max-inflight 4096 \
        --max-consecutive-errors 0 --seed 1 --output-dir "$WORK/gen-$RATE" \
        >"$WORK/gen-$RATE.json" 2>"$WORK/gen-$RATE.err" || true
    read -r STEAL1 TOTAL1 < <(cpu_ticks "$CLIENT_CPUS")
    STEAL=$(awk -v s=$((STEAL1 - STEAL0)) -v t=$((TOTAL1 - TOTAL0)) 'BEGIN { printf "%.2f", (t > 0 ? 100 * s / t : 0) }')
    python3 - "$RATE" "$WORK/gen-$RATE/requests.jsonl" "$WORK/time-$RATE" "$STEAL" <<'PY'
import json, sys
rate, records, timing, steal = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
late = sorted(
    (r["sent_at"] - r["scheduled_at"]) * 1000
    for r in map(json.loads, open(records))
    if r.get("scheduled_at") is not None and r.get("sent_at") and r["status"] != "dropped"
)
if not late:
    sys.exit(f"open-loop: rate {rate}: no request was sent")
user, system, wall = map(float, open(timing).read().split()[-3:])
pick = lambda q: late[min(len(late) - 1, int(q * len(late)))]
print(f"{rate:>8} {len(late):>9} {pick(0.5):>12.3f} {pick(0.99):>12.3f} {late[-1]:>12.3f} {100 * (user + system) / wall:>10.1f} {steal:>7.2f}")
PY
done
