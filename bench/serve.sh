#!/usr/bin/env bash
# Run-service benchmark: `nyann-bench serve` over a database of 10,000
# finished runs, against the simulator. Prints the latency of listing the
# runs (the newest 1,000, as GET /api/v1/runs answers), of one run's detail
# and of a plan (a bounded child compile each), and the service's resident
# memory at idle and with 100 runs queued on one target (one running).
#
# Usage: bench/serve.sh [REQUESTS]   (default 50 of each kind)
# Env:   BIN: a nyann-bench binary to measure instead of building one
#        CARGO_TARGET_DIR (default target)
# Needs: python3 (its sqlite3 module fills the database), curl.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=${1:-50}
FINISHED=10000
QUEUED=100

source "$(dirname "$0")/common.sh"
require_tools bench python3 curl
bin_or_build
start_fast_sim serve "$BIN"

TOKEN=bench-token
python3 - "$WORK" "$BASE" "$TOKEN" <<'PY'
import hashlib, sys
work, base, token = sys.argv[1:]
open(f"{work}/targets.toml", "w").write(
    f'[targets.sim]\nurl = "{base}"\n'
    'bounds = { max_concurrency = 4, max_stage_duration_s = 900, max_total_duration_s = 900 }\n')
digest = hashlib.sha256(token.encode()).hexdigest()
open(f"{work}/tokens.toml", "w").write(
    f'[[tokens]]\nname = "bench"\nsha256 = "{digest}"\nscope = "admin"\n')
PY

SERVE_PID=
stop_serve() {
    if [[ -n "$SERVE_PID" ]]; then
        kill -INT "$SERVE_PID" 2>/dev/null || true
        wait "$SERVE_PID" 2>/dev/null || true
        SERVE_PID=
    fi
}
trap 'stop_serve; cleanup' EXIT

# start_serve: the service on an ephemeral port; sets URL.
start_serve() {
    "$BIN" serve --listen 127.0.0.1:0 --data-dir "$WORK/data" \
        --targets "$WORK/targets.toml" --tokens "$WORK/tokens.toml" \
        >"$WORK/serve.out" 2>"$WORK/serve.err" &
    SERVE_PID=$!
    for _ in $(seq 200); do
        grep -q '^listening on ' "$WORK/serve.out" 2>/dev/null && break
        sleep 0.1
    done
    URL=$(awk '/^listening on /{print $3}' "$WORK/serve.out")
    [[ -n "$URL" ]] || { echo "bench: the service did not start:" >&2; cat "$WORK/serve.err" >&2; exit 1; }
}

rss_mb() { awk '/^VmRSS/{printf "%.1f", $2 / 1024}' "/proc/$SERVE_PID/status"; }

# The database is created by a first start, then filled with finished runs
# (rows as the service writes them, with no run directory behind them; a
# brief each, as a stopped sweep's, when the service keeps one).
start_serve
stop_serve
python3 - "$WORK/data/runs.db" "$FINISHED" <<'PY'
import json, sqlite3, sys, time
db, count = sys.argv[1], int(sys.argv[2])
now = int(time.time() * 1000)
plan = json.dumps({"stages": [{"index": i, "concurrency": 2 ** i, "duration_s": 60.0} for i in range(6)]})
with sqlite3.connect(db) as conn:
    # A service that keeps each run's brief (what a list shows) gets one.
    columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    brief = "brief" in columns
    def row(i):
        values = (f"r-bench-{i:05}", f"nightly {i}", now - i * 60000, now - i * 60000 + 1000,
                  now - i * 60000 + 50000, f"/nonexistent/{i}", plan)
        if brief:
            values += (json.dumps({"stages_run": 5, "stages_skipped": 1, "stopped_at": "#4 c=16",
                                   "capacity": ["#3 c=8"],
                                   "report_html": f"/api/v1/runs/r-bench-{i:05}/report.html"}),)
        return values
    conn.executemany(
        "INSERT INTO runs (id, target, label, policy, status, submitted_by, created_ms, "
        "started_ms, finished_ms, dir, exit_code, request, plan" + (", brief" if brief else "") + ") "
        "VALUES (?, 'sim', ?, 'builtin', 'completed', 'bench', ?, ?, ?, ?, 0, '{}', ?" + (", ?" if brief else "") + ")",
        [row(i) for i in range(count)])
PY
start_serve
echo "service: $URL, $FINISHED finished runs in its database, $REQUESTS requests per figure" >&2
sleep 2
echo "idle RSS: $(rss_mb) MB"

python3 - "$URL" "$TOKEN" "$REQUESTS" <<'PY'
import json, statistics, sys, time, urllib.request
url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request) as answer:
        payload = answer.read()
    return time.perf_counter() - start, payload
def report(what, path, body=None):
    times = []
    for _ in range(n):
        took, payload = call(path, body)
        times.append(took * 1000)
    times.sort()
    print(f"{what}: p50 {statistics.median(times):.1f} ms, p90 {times[int(len(times) * 0.9) - 1]:.1f} ms, "
          f"{len(payload) / 1024:.0f} KiB")
report("list (newest 1,000 of 10,000)", "/api/v1/runs")
report("one run's detail", "/api/v1/runs/r-bench-05000")
scenario = ('scenario(workload=workload("faker"), stages=[stage("10s", concurrency=c) '
            'for c in [1, 2, 4]])')
report("plan (child compile)", "/api/v1/plan", {"target": "sim", "scenario": scenario})
PY

# 100 runs on one target: one runs (a long stage at concurrency 1), the
# rest wait in its queue.
python3 - "$URL" "$TOKEN" "$QUEUED" <<'PY'
import json, sys, urllib.request
url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
scenario = 'scenario(workload=workload("faker", isl=32, osl=32), stages=[stage("600s", concurrency=1)])'
for i in range(n):
    body = json.dumps({"target": "sim", "scenario": scenario, "label": f"queued {i}"}).encode()
    request = urllib.request.Request(url + "/api/v1/runs", data=body, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json"})
    urllib.request.urlopen(request).read()
PY
sleep 3
queued=$(curl -s -H "authorization: Bearer $TOKEN" "$URL/api/v1/runs" |
    python3 -c 'import json, sys; print(sum(r["status"] == "queued" for r in json.load(sys.stdin)["runs"]))')
echo "RSS with $queued runs queued and one running: $(rss_mb) MB"
