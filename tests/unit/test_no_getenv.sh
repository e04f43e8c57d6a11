#!/usr/bin/env bash
# The library under quant/ reads no environment variable: its settings come in through the
# runtime options (quant/core/runtime.h), which the programs fill from the environment in
# startup/runtime_env.c. Fails, naming the file and line, when any source under quant/
# calls getenv or secure_getenv (comments are not calls, but a mention in a comment is
# reported too: say "the environment" instead).
set -euo pipefail
src=${1:-${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
[ -d "$src/quant" ] || { echo "test_no_getenv: no quant/ under $src" >&2; exit 2; }
hits=$(grep -rnE '\b(secure_)?getenv[[:space:]]*\(' "$src/quant" \
           --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' || true)
if [ -n "$hits" ]; then
    echo "test_no_getenv: the library reads the environment; pass a runtime option instead (quant/core/runtime.h):" >&2
    echo "$hits" | sed "s|^$src/||" >&2
    exit 1
fi
echo "test_no_getenv: no getenv/secure_getenv under quant/"
