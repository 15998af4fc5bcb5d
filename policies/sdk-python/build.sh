#!/bin/sh
# Builds this Python policy into a WebAssembly component with componentize-py
# 0.25.1 (pinned: another version may generate other bindings).
#
#   ./build.sh [APP.py [OUT.wasm]]   the component (default: app.py -> policy.wasm)
#   ./build.sh test                  the rules' unit tests (test_*.py), natively
#
# componentize-py is $COMPONENTIZE_PY when set, else the one on PATH when it
# is the pinned version, else it is installed once into .venv here (python3
# -m venv, pip). The WIT is wit/ here unless $WIT_DIR says otherwise.
set -eu
VERSION=0.25.1
kit=$(cd "$(dirname "$0")" && pwd)
wit=${WIT_DIR:-$kit/wit}

tool=${COMPONENTIZE_PY:-}
if [ -z "$tool" ]; then
    if command -v componentize-py >/dev/null 2>&1 &&
        [ "$(componentize-py --version 2>/dev/null)" = "componentize-py $VERSION" ]; then
        tool=componentize-py
    else
        tool=$kit/.venv/bin/componentize-py
        if [ "$("$tool" --version 2>/dev/null || true)" != "componentize-py $VERSION" ]; then
            echo "installing componentize-py $VERSION into $kit/.venv (once)" >&2
            python3 -m venv "$kit/.venv"
            "$kit/.venv/bin/pip" install --quiet "componentize-py==$VERSION"
        fi
    fi
fi
found=$("$tool" --version 2>/dev/null || true)
if [ "$found" != "componentize-py $VERSION" ]; then
    echo "error: $tool is \"$found\"; this policy builds with componentize-py $VERSION" >&2
    exit 1
fi

if [ "${1:-}" = test ]; then
    # The generated bindings make the SDK importable natively (Python 3.11+);
    # the host's `log` then writes to stderr.
    "$tool" -d "$wit" -w congestion-policy bindings "$kit/.bindings" >/dev/null
    cd "$kit"
    PYTHONPATH="$kit/.bindings:$kit" exec python3 -m unittest discover -p 'test_*.py'
fi

app=${1:-$kit/app.py}
out=${2:-$kit/policy.wasm}
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
app_dir=$(cd "$(dirname "$app")" && pwd)
module=$(basename "$app" .py)
cd "$app_dir"
# The app's directory and the kit's (nyann_policy.py) are on the path.
"$tool" -d "$wit" -w congestion-policy componentize -p "$app_dir" -p "$kit" "$module" -o "$out" >/dev/null
echo "built $out ($(wc -c <"$out") bytes)"
