#!/usr/bin/env bash
# The documentation as a product (README.md, docs/*.md, bench/README.md; links also in
# proto/*.md and quant/job/*.md), checked without building anything; tests/docs_blocks.py does the reading:
#   - README.md is at most 200 lines; the rest lives in docs/;
#   - no development history (issue numbers, sessions, "found by these tests") and no table
#     cell over 600 characters;
#   - every relative link names a file of the tree, and every #anchor a heading;
#   - every shell block says whether a test runs it (```sh run, or ```sh norun=REASON with a
#     known reason), every command of a run block says what its output must contain, and
#     every block is valid shell. tests/integration/test_docs_commands.sh runs the run blocks.
# Usage: test_docs_lint.sh [SOURCE_DIR]
set -u
src=${1:-${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
command -v python3 >/dev/null || { echo "SKIP: python3 needed"; exit 77; }
[ -f "$src/README.md" ] || { echo "test_docs_lint: no README.md under $src" >&2; exit 2; }
fails=0
for check in style links lint; do
    if ! python3 "$src/tests/docs_blocks.py" "$check" "$src"; then
        echo "FAIL: test_docs_lint: $check (the lines above)" >&2
        fails=$((fails + 1))
    fi
done
[ "$fails" -eq 0 ] && echo "test_docs_lint: README.md $(wc -l <"$src/README.md") lines; links, history, table cells and shell blocks in order"
exit $((fails > 0))
