#!/bin/sh
# Builds client_slo.wasm with this repository's Python kit
# (policies/sdk-python: its nyann_policy.py and pinned componentize-py) and
# WIT (wit/0.5).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$here/../../../..
WIT_DIR=${WIT_DIR:-$repo/wit/0.5} exec "$repo/policies/sdk-python/build.sh" "$here/app.py" "${1:-$here/client_slo.wasm}"
