# Shared by the benchmark scripts (sourced, not run): tool checks, a work
# directory removed on exit, and a fast-profile simulator on an ephemeral
# loopback port, stopped on exit.

# require_tools NAME TOOL...: fail with an install hint when a tool is missing.
require_tools() {
    local name=$1 tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "$name: $tool is missing (apt-get install ${tool##*/})" >&2; exit 1; }
    done
}

# bin_or_build: BIN as given (another build to measure), else this
# checkout's nyann-bench, built first.
bin_or_build() {
    if [[ -z "${BIN:-}" ]]; then
        BIN="${CARGO_TARGET_DIR:-target}/release/nyann-bench"
        cargo build --release -p nyann-bench >&2
    fi
}

WORK=$(mktemp -d)
SIM_PID=
cleanup() {
    stop_sim
    rm -rf "$WORK"
}
trap cleanup EXIT

# cpu_ticks FIRST-LAST: the steal and total jiffies of those cores, summed
# (/proc/stat). Two readings around a run give the share of its time the
# hypervisor gave the cores' time to another guest: a delay no program can
# avoid, which shows in latency tails.
cpu_ticks() {
    awk -v first="${1%-*}" -v last="${1#*-}" '
        $1 ~ /^cpu[0-9]+$/ && substr($1, 4) + 0 >= first && substr($1, 4) + 0 <= last {
            for (i = 2; i <= NF; i++) total += $i
            steal += $9
        }
        END { print steal + 0, total + 0 }' /proc/stat
}

# The load tools and the simulator hold thousands of connections.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# start_fast_sim NAME BINARY [COMMAND...]: start `BINARY sim --profile fast`
# (prefixed with COMMAND, for example `taskset -c 0`) and set BASE to its
# OpenAI base URL (http://127.0.0.1:PORT/v1).
start_fast_sim() {
    local name=$1 binary=$2
    shift 2
    "$@" "$binary" sim --profile fast --port 0 >"$WORK/sim.out" 2>"$WORK/sim.err" &
    SIM_PID=$!
    wait_for_sim "$name"
}

# start_sim NAME BINARY SIM_FLAGS...: start `BINARY sim --port 0 SIM_FLAGS...`
# and set BASE as start_fast_sim does.
start_sim() {
    local name=$1 binary=$2
    shift 2
    "$binary" sim --port 0 "$@" >"$WORK/sim.out" 2>"$WORK/sim.err" &
    SIM_PID=$!
    wait_for_sim "$name"
}

# wait_for_sim NAME: wait until the simulator printed its endpoint; set BASE.
wait_for_sim() {
    local name=$1
    for _ in $(seq 100); do
        grep -q '^endpoint ' "$WORK/sim.out" 2>/dev/null && break
        sleep 0.1
    done
    BASE=$(awk '/^endpoint /{print $2}' "$WORK/sim.out")
    [[ -n "$BASE" ]] || { echo "$name: the simulator did not start:" >&2; cat "$WORK/sim.err" >&2; exit 1; }
}

# stop_sim: stop the simulator start_fast_sim or start_sim started.
stop_sim() {
    if [[ -n "$SIM_PID" ]]; then kill "$SIM_PID" 2>/dev/null || true; wait "$SIM_PID" 2>/dev/null || true; fi
    SIM_PID=
}
