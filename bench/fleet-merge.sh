#!/usr/bin/env bash
# The fleet leader's merge of its workers' records (`merge::write`), timed
# for several builds side by side on the same synthetic records
# (crates/fleet/examples/merge_bench.rs: the shape of a real
# `requests.jsonl`, about 680 bytes a record): 2 workers x 50k records,
# then 8 workers x 125k (1M). Runs are interleaved, build after build, so a
# change in the machine's load hits them alike. Each build's merged
# `requests.jsonl` is checked against the first build's: the same records,
# in the same order, as JSON values (and whether the bytes are the same).
#
# Usage: bench/fleet-merge.sh [REV...]
#        REV: a git revision whose crates to build the example against
#        (this checkout's example is used, so revisions from before it
#        work); `.` is this checkout as it is. Default: d47576d (main before
#        the merge streamed) and `.`.
#        RUNS=N (default 3) merges per build and size;
#        SIZES="WORKERS:RECORDS ..." (default "2:100000 8:1000000").
# Prints per size and build: the median wall time of the merge, its peak
# RSS (VmHWM) and their ratios to the first build's. Needs ~3 GB in $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source "$(dirname "$0")/common.sh"
require_tools fleet-merge python3 tar
RUNS=${RUNS:-3}
SIZES=${SIZES:-"2:100000 8:1000000"}
[[ $# -gt 0 ]] || set -- d47576d .
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
EXAMPLE=crates/fleet/examples/merge_bench.rs

# Each revision's crates, with this checkout's example, built into the
# shared target directory (the third-party crates are built once); the
# binary is copied out before the next build replaces it.
bins=()
for rev in "$@"; do
    i=${#bins[@]}
    if [[ "$rev" == . ]]; then
        src=$PWD
    else
        src="$WORK/src-$i"
        mkdir -p "$src"
        git archive "$rev" | tar -x -C "$src"
        mkdir -p "$src/$(dirname "$EXAMPLE")"
        cp "$EXAMPLE" "$src/$EXAMPLE"
    fi
    (cd "$src" && CARGO_TARGET_DIR=$TARGET cargo build --release -q -p nyann-fleet --example merge_bench)
    cp "$TARGET/release/examples/merge_bench" "$WORK/merge_bench-$i"
    bins+=("$WORK/merge_bench-$i")
done

for size in $SIZES; do
    workers=${size%%:*}
    records=${size##*:}
    data="$WORK/data-$workers"
    "${bins[-1]}" gen "$data" "$workers" "$records"
    for ((run = 0; run < RUNS; run++)); do
        for i in "${!bins[@]}"; do
            rm -rf "$WORK/out-$i"
            "${bins[$i]}" merge "$data" "$workers" "$WORK/out-$i" | sed "s/^/$size $i /" >>"$WORK/times"
        done
    done
    for i in "${!bins[@]}"; do
        [[ $i -eq 0 ]] && continue
        echo "$size build $((i + 1)) against build 1: $("${bins[-1]}" compare "$WORK/out-0/requests.jsonl" "$WORK/out-$i/requests.jsonl")"
    done
    echo "$size input: $(du -sh "$data" | cut -f1)"
    rm -rf "$data" "$WORK"/out-*
done

python3 - "$WORK/times" "$@" <<'EOF'
import re, statistics, sys
times, revs = sys.argv[1], sys.argv[2:]
runs = {}
for line in open(times):
    m = re.match(r"(\S+) (\d+) merge seconds=([\d.]+) records=(\d+) peak_rss_kib=(\d+)", line)
    if m:
        runs.setdefault((m[1], int(m[2])), []).append((float(m[3]), int(m[5]), int(m[4])))
sizes = list(dict.fromkeys(s for s, _ in runs))
for size in sizes:
    workers, records = size.split(":")
    print(f"{workers} workers, {int(records):,} records: median of {len(runs[(size, 0)])} merges (ratio to build 1)")
    first = None
    for i, rev in enumerate(revs):
        t = statistics.median(r[0] for r in runs[(size, i)])
        rss = max(r[1] for r in runs[(size, i)]) / 1024
        merged = runs[(size, i)][0][2]
        first = first or (t, rss)
        print(f"  build {i + 1} {rev:>10}: {t:7.3f} s ({t / first[0]:.2f}x)  peak RSS {rss:6.1f} MiB ({rss / first[1]:.2f}x)  {merged} records")
EOF
