#!/usr/bin/env bash
# How long one congestion check takes when Prometheus accepts connections
# but never answers, with --settle-wait 0s (no probe first): the bound the
# check's fail-fast gives (about one --prometheus-timeout per check, where
# it used to cost one per round of parallel queries: 50 s at the defaults
# with two roles). Runs crates/signals/examples/hanging_prometheus.rs.
#
# Usage: bench/hanging-prometheus.sh [TIMEOUT] [DEPLOY_NAME]   (defaults 10s, m-decode)
# Prints: roles, signal errors, timeout, queries sent, check seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --examples >&2
"${CARGO_TARGET_DIR:-target}/release/examples/hanging_prometheus" "${1:-10s}" "${2:-m-decode}"
