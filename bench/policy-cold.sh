#!/usr/bin/env bash
# The first policy judgment on a new machine: how long `policy describe
# builtin` takes with an empty compiled-code cache (cold: the built-in is
# compiled, unless the binary ships its code precompiled) and with the
# cache filled (warm), side by side for several binaries (e.g. a build from
# before a change and one from after). Runs are interleaved, binary after
# binary, so a change in the machine's load hits them alike.
#
# Usage: bench/policy-cold.sh [BIN...]
#        (default: $CARGO_TARGET_DIR/release/nyann-bench, built first)
#        RUNS=N (default 9) runs per binary and case.
# Prints per binary: the median wall milliseconds cold and warm, and each
# median as a ratio to the first binary's.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR=${CARGO_TARGET_DIR:-target}
if [[ $# -eq 0 ]]; then
    cargo build --release -p nyann-bench >&2
    set -- "$TARGET_DIR/release/nyann-bench"
fi
source "$(dirname "$0")/common.sh"
require_tools policy-cold python3
RUNS=${RUNS:-9}

# run_ms BIN CACHE_DIR: wall milliseconds of one `policy describe builtin`
# with its cache under CACHE_DIR (NYANN_BENCH_CACHE_DIR beats HOME and
# XDG_CACHE_HOME).
run_ms() {
    local start end
    start=$(date +%s%N)
    NYANN_BENCH_CACHE_DIR=$2 "$1" policy describe builtin >/dev/null
    end=$(date +%s%N)
    echo $(((end - start) / 1000))
}

for ((run = 0; run < RUNS; run++)); do
    for i in $(seq $#); do
        bin=${!i}
        cache="$WORK/cache-$i-$run"
        echo "$i cold $(run_ms "$bin" "$cache")" >>"$WORK/times"
        echo "$i warm $(run_ms "$bin" "$cache")" >>"$WORK/times"
        rm -rf "$cache"
    done
done

python3 - "$WORK/times" "$@" <<'EOF'
import statistics, sys
times, bins = sys.argv[1], sys.argv[2:]
us = {}
for line in open(times):
    i, case, t = line.split()
    us.setdefault((int(i), case), []).append(int(t))
print(f"policy describe builtin, {len(us[(1, 'cold')])} runs each, median ms (ratio to the first binary)")
first = {c: statistics.median(us[(1, c)]) for c in ("cold", "warm")}
for i, b in enumerate(bins, 1):
    cells = []
    for c in ("cold", "warm"):
        m = statistics.median(us[(i, c)])
        cells.append(f"{c} {m / 1000:7.1f} ({m / first[c]:.2f}x)")
    print(f"  {'  '.join(cells)}  {b}")
EOF
