#!/usr/bin/env bash
# Every performance figure the project holds itself to, each beside its
# goal (and oha's figure in the same run where oha does the same thing), in
# one run: run it before and after a change, with nothing else on the
# machine, and compare the two tables.
#
#   open-loop lateness   bench/open-loop.sh at 300 and 10,000 req/s
#   memory at c=16,384   generate and oha, 5 s each, peak RSS
#   shared cores         bench/load.sh at c=1024 and 4096: req/s against oha
#   split cores          bench/cpu.sh-style CPU per request, client on its
#                        own half of the cores, against oha's; with the
#                        simulator's CPU per request, the shared-core ratio
#                        that these predict
#   first judgment       bench/policy-cold.sh: `policy describe builtin`, cold
#   judge latency        bench/policy-host.sh: p50 through the async path
#   fleet merge          bench/fleet-merge.sh: 2 workers x 50k records
#                        (FLEET_SIZES="2:100000 8:1000000" adds the 1M case)
#
# Usage: bench/goals.sh
# Env:   BIN        the nyann-bench measured (default: this checkout's, built)
#        SIM_BIN    the simulator's binary (default BIN; pin it across a
#                   before/after pair so that only the client differs)
#        BENCH_BIN  the policy-host benchmark binary (default: this checkout's)
#        REV        the revision whose fleet merge is timed (default: `.`)
#        SECONDS_PER_POINT (default 8)   FLEET_SIZES (default "2:100000")
# Needs: what the scripts it runs need (oha, jq, python3, /usr/bin/time, taskset).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_POINT=${SECONDS_PER_POINT:-8}
source "$(dirname "$0")/common.sh"
require_tools goals jq python3 /usr/bin/time taskset
bin_or_build
SIM_BIN=${SIM_BIN:-$BIN}
if ! command -v oha >/dev/null; then
    echo "goals: installing oha from crates.io (cargo install oha --locked)" >&2
    cargo install oha --locked >&2
fi
OUT="$WORK/out"
mkdir -p "$OUT"
run() { # run NAME COMMAND...: its output shown and kept for the table
    local name=$1
    shift
    echo "== $name" >&2
    "$@" 2>&1 | tee "$OUT/$name" >&2
}

run open-loop env RATES="300 10000" BIN="$BIN" SIM_BIN="$SIM_BIN" bench/open-loop.sh "$SECONDS_PER_POINT"
run shared-cores env CONCURRENCIES="1024 4096" BIN="$BIN" SIM_BIN="$SIM_BIN" bench/load.sh "$SECONDS_PER_POINT"

# Memory at c=16,384 and CPU per request on split cores: one simulator on
# the first half of the cores, the clients on the second half.
CPUS=$(nproc)
SIM_CPUS="0-$((CPUS > 1 ? CPUS / 2 - 1 : 0))"
CLIENT_CPUS="$((CPUS > 1 ? CPUS / 2 : 0))-$((CPUS - 1))"
start_fast_sim goals "$SIM_BIN" taskset -c "$SIM_CPUS"
BODY=$(jq -cn --arg p "$(printf 'word %.0s' $(seq 25) | head -c 128)" \
    '{model:"nyann-sim",messages:[{role:"user",content:$p}],max_tokens:32,stream:true,ignore_eos:true,min_tokens:32}')
# The simulator's CPU time so far, in clock ticks (/proc/PID/stat utime + stime).
sim_ticks() { awk '{ print $14 + $15 }' "/proc/$SIM_PID/stat"; }
# client NAME C: peak RSS (MB), CPU us per request and requests, of generate
# and of oha at concurrency C, and the simulator's CPU us per request of each.
client() {
    local name=$1 c=$2
    sim_ticks >"$WORK/sim-ticks-$name"
    /usr/bin/time -f '%M %U %S' -o "$WORK/time-nyann" taskset -c "$CLIENT_CPUS" "$BIN" generate \
        --target "$BASE" --concurrency "$c" --duration "${SECONDS_PER_POINT}s" --workload synthetic \
        --isl 32 --osl 32 --max-consecutive-errors 0 --seed 1 --output-dir "$WORK/gen-$name" \
        >"$WORK/gen-$name.json" 2>"$WORK/gen-$name.err" || true
    sim_ticks >>"$WORK/sim-ticks-$name"
    /usr/bin/time -f '%M %U %S' -o "$WORK/time-oha" taskset -c "$CLIENT_CPUS" oha -z "${SECONDS_PER_POINT}s" \
        -c "$c" --no-tui --output-format json -m POST -H 'content-type: application/json' -d "$BODY" \
        "$BASE/chat/completions" >"$WORK/oha-$name.json" 2>"$WORK/oha-$name.err" || true
    sim_ticks >>"$WORK/sim-ticks-$name"
    python3 - "$name" "$c" "$WORK" "$(getconf CLK_TCK)" <<'PY'
import json, sys
name, c, work, tick = sys.argv[1], int(sys.argv[2]), sys.argv[3], 1e6 / int(sys.argv[4])
ticks = [int(t) for t in open(f"{work}/sim-ticks-{name}").read().split()]
sim_ticks = {"nyann": ticks[1] - ticks[0], "oha": ticks[2] - ticks[1]}
def line(tool, requests):
    rss, user, system = open(f"{work}/time-{tool}").read().split()[-3:]
    cpu = (float(user) + float(system)) / max(requests, 1) * 1e6
    sim = sim_ticks[tool] * tick / max(requests, 1)
    print(f"{name} {tool} c={c} requests={requests} rss_mb={int(rss) / 1024:.1f} cpu_us_per_request={cpu:.1f}"
          f" sim_cpu_us_per_request={sim:.1f}")
try:
    result = json.load(open(f"{work}/gen-{name}.json"))
    # Every request the process handled, those finishing after the stage too.
    line("nyann", result.get("requests_recorded") or result["totals"]["requests_ok"])
except (OSError, KeyError, ValueError) as err:
    print(f"{name} nyann: no result ({err})")
try:
    oha = json.load(open(f"{work}/oha-{name}.json"))
    line("oha", round(oha["summary"]["requestsPerSec"] * oha["summary"]["total"]))
except (OSError, KeyError, ValueError) as err:
    print(f"{name} oha: no result ({err})")
PY
}
run split-cores client split 1024
run memory client memory 16384
stop_sim

run policy-cold env RUNS=5 bench/policy-cold.sh "$BIN"
run judge bench/policy-host.sh ${BENCH_BIN:+"$BENCH_BIN"}
run fleet-merge env RUNS=1 SIZES="${FLEET_SIZES:-2:100000}" bench/fleet-merge.sh "${REV:-.}"

python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
text = lambda name: open(f"{out}/{name}").read()
rows = []
def row(figure, measured, goal, met, peer=""):
    rows.append((figure, measured, peer, goal, "yes" if met else "NO"))

for m in re.finditer(r"^ +(\d+) +\d+ +([\d.]+) +([\d.]+) +[\d.]+ +([\d.]+) +([\d.]+)$", text("open-loop"), re.M):
    rate, p50, p99, cpu, steal = m[1], float(m[2]), float(m[3]), m[4], m[5]
    row(f"open-loop lateness p50, {rate} req/s", f"{p50:.3f} ms", "<= 0.1 ms", p50 <= 0.1, f"client cpu {cpu}%")
    row(f"open-loop lateness p99, {rate} req/s", f"{p99:.3f} ms", "<= 0.5 ms", p99 <= 0.5, f"steal {steal}%")
for m in re.finditer(r"^ +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", text("shared-cores"), re.M):
    c, oha, ours, ratio, rss = m[1], float(m[2]), float(m[3]), float(m[4]), m[5]
    row(f"shared cores c={c}: req/s", f"{ours:.0f} ({ratio:.2f}x oha)", ">= 0.95x oha", ratio >= 0.95, f"oha {oha:.0f}")
clients = {}
for m in re.finditer(r"^(\w+) (nyann|oha) c=(\d+) requests=(\d+) rss_mb=([\d.]+) cpu_us_per_request=([\d.]+)"
                     r" sim_cpu_us_per_request=([\d.]+)$", text("split-cores") + text("memory"), re.M):
    clients[(m[1], m[2])] = (float(m[5]), float(m[6]), float(m[7]))
if ("split", "nyann") in clients:
    ours, sim_ours = clients[("split", "nyann")][1:]
    oha, sim_oha = clients.get(("split", "oha"), (0, 0, 0))[1:]
    row("split cores c=1024: CPU per request", f"{ours:.1f} us", "< oha's", oha == 0 or ours < oha, f"oha {oha:.1f} us")
    # On shared cores, throughput goes as 1 / (the simulator's CPU per
    # request + the client's): the ratio to oha those figures predict.
    if oha:
        sim = (sim_ours + sim_oha) / 2
        predicted = (sim + oha) / (sim + ours)
        row("shared cores, ratio the CPU per request predicts", f"{predicted:.2f}x oha", ">= 0.95x oha",
            predicted >= 0.95, f"simulator {sim:.1f} us/request")
if ("memory", "nyann") in clients:
    ours, oha = clients[("memory", "nyann")][0], clients.get(("memory", "oha"), (0, 0))[0]
    row("peak RSS at c=16,384", f"{ours:.0f} MB", "<= 128 MB", ours <= 128, f"oha {oha:.0f} MB")
m = re.search(r"cold +([\d.]+)", text("policy-cold"))
if m:
    row("policy describe builtin, cold", f"{float(m[1]):.1f} ms", "<= 50 ms", float(m[1]) <= 50)
m = re.search(r"async +(\d+)", text("judge"))
if m:
    row("judge p50 through the async path", f"{m[1]} us", "<= 100 us", int(m[1]) <= 100)
for m in re.finditer(r"^(\d+) workers, ([\d,]+) records.*\n +build 1 +\S+: +([\d.]+) s .*peak RSS +([\d.]+) MiB", text("fleet-merge"), re.M):
    row(f"fleet merge, {m[1]} workers x {m[2]} records", f"{float(m[3]):.2f} s, {float(m[4]):.1f} MiB",
        "streamed: RSS flat", float(m[4]) < 64)

width = [max(len(r[i]) for r in rows + [("figure", "measured", "peer", "goal", "met")]) for i in range(5)]
for r in [("figure", "measured", "peer", "goal", "met")] + rows:
    print("  ".join(cell.ljust(w) for cell, w in zip(r, width)).rstrip())
PY
