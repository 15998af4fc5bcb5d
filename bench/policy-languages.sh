#!/usr/bin/env bash
# The client-slo policy in Rust, Python and JavaScript (QuickJS, the JS
# kit's default, and StarlingMonkey) side by side: component size, first
# load (compiling it, into an empty code cache), cached load and judge
# latency, with this checkout's policy host (crates/policy-host/benches).
#
# Usage: bench/policy-languages.sh
#   Needs the tools the kits pin: componentize-py 0.25.1 (on PATH, or
#   installed by the kit's build.sh), node/npm ($NYANN_JS_TOOLS or installed
#   by the kit's build.sh); ENGINES="quickjs" skips StarlingMonkey.
# The first load is one run per component (a Python one compiles for 10-20
# s): run on a quiet machine, and compare rows of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
source "$(dirname "$0")/common.sh"
require_tools policy-languages node

bin=$(cargo test --release -p nyann-policy-host --bench policy --no-run 2>&1 |
    sed -n 's/.*Executable benches\/policy.rs (\(.*\))/\1/p')
[[ -n "$bin" ]] || { echo "policy-languages: cannot build the benchmark" >&2; exit 1; }
# As `policy new`'s crates build (small components load fast).
cargo build --release -q --target wasm32-wasip2 -p client-slo-policy \
    --config 'profile.release.opt-level="s"' --config 'profile.release.lto=true' \
    --config 'profile.release.strip=true'
rust=${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/client_slo_policy.wasm
examples=examples/policies/client-slo
"$examples/python/build.sh" "$WORK/client_slo_py.wasm" >&2
components=("rust=$rust" "python=$WORK/client_slo_py.wasm")
for engine in ${ENGINES:-quickjs starlingmonkey}; do
    ENGINE=$engine "$examples/js/build.sh" "$WORK/client_slo_$engine.wasm" >&2
    components+=("js-$engine=$WORK/client_slo_$engine.wasm")
done
"$bin" languages "${components[@]}"
