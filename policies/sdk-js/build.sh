#!/bin/sh
# Builds this JavaScript policy into a WebAssembly component.
#
#   ./build.sh [POLICY.js [OUT.wasm]]    default: policy.js -> policy.wasm
#
# ENGINE=quickjs (the default): componentize-qjs 0.4.5, QuickJS, the engine
#   of jco 1.35's `--backend qjs`, built with `--sync` (no component-model
#   async ABI, which nyann-bench does not run): a 1.5 MiB component that
#   compiles in ~3 s on its first load and judges in ~0.6 ms.
# ENGINE=starlingmonkey: @bytecodealliance/componentize-js 0.23.0
#   (SpiderMonkey), built without its HTTP client (`-d http fetch-event`):
#   12 MiB, ~20 s to compile on the first load, ~1.5 ms a judgment.
#
# The tools are pinned here and installed once with npm into node_modules/
# here, or taken from $NYANN_JS_TOOLS/node_modules when that holds the
# pinned versions. The WIT is wit/ here unless $WIT_DIR says otherwise.
set -eu
QJS_VERSION=0.4.5
SM_VERSION=0.23.0
kit=$(cd "$(dirname "$0")" && pwd)
wit=${WIT_DIR:-$kit/wit}
engine=${ENGINE:-quickjs}
src=${1:-$kit/policy.js}
out=${2:-$kit/policy.wasm}
case $out in /*) ;; *) out=$(pwd)/$out ;; esac

# The version of npm package $1 installed under $2/node_modules, if any.
installed() {
    node -e 'try { console.log(require(process.argv[1] + "/node_modules/" + process.argv[2] + "/package.json").version) } catch (_) {}' "$2" "$1"
}

# $1 package, $2 version: the directory whose node_modules has it, installed
# here when neither $NYANN_JS_TOOLS nor this directory has it.
tools_for() {
    if [ -n "${NYANN_JS_TOOLS:-}" ] && [ "$(installed "$1" "$NYANN_JS_TOOLS")" = "$2" ]; then
        echo "$NYANN_JS_TOOLS"
        return
    fi
    if [ "$(installed "$1" "$kit")" != "$2" ]; then
        echo "installing $1@$2 into $kit/node_modules (once)" >&2
        (cd "$kit" && npm install --no-save --no-audit --no-fund --loglevel=error "$1@$2" >&2)
    fi
    echo "$kit"
}

# The policy imports ./nyann_policy.js: build next to a copy of the SDK when
# its directory has none.
src_dir=$(cd "$(dirname "$src")" && pwd)
if [ ! -f "$src_dir/nyann_policy.js" ]; then
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp "$src_dir"/*.js "$stage/"
    cp "$kit/nyann_policy.js" "$stage/"
    src_dir=$stage
fi
entry=$src_dir/$(basename "$src")

case $engine in
quickjs)
    tools=$(tools_for componentize-qjs "$QJS_VERSION")
    "$tools/node_modules/.bin/componentize-qjs" --wit "$wit" --js "$entry" \
        --world congestion-policy --sync --output "$out" >/dev/null
    ;;
starlingmonkey)
    tools=$(tools_for @bytecodealliance/componentize-js "$SM_VERSION")
    "$tools/node_modules/.bin/componentize-js" "$entry" --wit "$wit" \
        --world-name congestion-policy --disable http fetch-event --out "$out" >/dev/null
    ;;
*)
    echo "error: ENGINE=$engine; use quickjs or starlingmonkey" >&2
    exit 2
    ;;
esac
echo "built $out ($(wc -c <"$out") bytes, $engine)"
