#!/usr/bin/env bash
# The latency of one judgment of the built-in policy, synchronous
# (`judge_blocking`) and through the async path `generate` uses
# (`Policy::judge`), side by side for several builds of the policy host
# benchmark (crates/policy-host/benches/policy.rs; e.g. a build from before
# a change and one from after). Runs are interleaved, build after build, so
# a change in the machine's load hits them alike.
#
# Usage: bench/policy-host.sh [BENCH_BIN...]
#        (default: this checkout's benchmark, built first; a bench binary
#        is target/release/deps/policy-<hash>, as cargo prints it)
#        RUNS=N (default 7) runs per build, of 2000 judgments each.
# Prints per build: the median over the runs of each run's p50, in
# microseconds, and its ratio to the first build's.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -eq 0 ]]; then
    bin=$(cargo test --release -p nyann-policy-host --bench policy --no-run 2>&1 |
        sed -n 's/.*Executable benches\/policy.rs (\(.*\))/\1/p')
    [[ -n "$bin" ]] || { echo "policy-host: cannot build the benchmark" >&2; exit 1; }
    set -- "$bin"
fi
source "$(dirname "$0")/common.sh"
require_tools policy-host python3
RUNS=${RUNS:-7}

for ((run = 0; run < RUNS; run++)); do
    for i in $(seq $#); do
        # `judge`: the judge latencies only (builds that predate the
        # argument run everything, judge latencies included).
        "${!i}" judge | sed "s/^/$i /" >>"$WORK/out"
    done
done

python3 - "$WORK/out" "$@" <<'EOF'
import re, statistics, sys
out, bins = sys.argv[1], sys.argv[2:]
p50 = {}
for line in open(out):
    m = re.match(r"(\d+) judge.*builtin, (sync|async): +p50 ([\d.]+) ms", line)
    if m:
        p50.setdefault((int(m[1]), m[2]), []).append(float(m[3]) * 1000)
runs = len(p50[(1, "sync")])
print(f"judge p50 of the built-in, median of {runs} runs of 2000 judgments, us (ratio to the first build)")
first = {c: statistics.median(p50[(1, c)]) for c in ("sync", "async")}
for i, b in enumerate(bins, 1):
    cells = []
    for c in ("sync", "async"):
        m = statistics.median(p50[(i, c)])
        cells.append(f"{c} {m:6.0f} ({m / first[c]:.2f}x)")
    print(f"  {'  '.join(cells)}  {b}")
EOF
