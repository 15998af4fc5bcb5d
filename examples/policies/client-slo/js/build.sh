#!/bin/sh
# Builds client_slo.wasm with this repository's JavaScript kit
# (policies/sdk-js: its nyann_policy.js and pinned tools) and WIT (wit/0.5).
# ENGINE=starlingmonkey builds it with SpiderMonkey instead of QuickJS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$here/../../../..
WIT_DIR=${WIT_DIR:-$repo/wit/0.5} exec "$repo/policies/sdk-js/build.sh" "$here/policy.js" "${1:-$here/client_slo.wasm}"
