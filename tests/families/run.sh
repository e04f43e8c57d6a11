#!/usr/bin/env bash
# Regenerates the forward-parity goldens in tests/data/families/ (issue #16): tiny random
# models of each supported-or-wanted architecture, built and run by transformers itself, with
# their logits on fixed token ids. test_model_families (a unit ctest, no Python) compares
# quantd's CPU forward with them.
#
#   bash tests/families/run.sh BUILD_DIR [FAMILY...]
#
# Never run at build or ctest time: it installs torch and transformers from PyPI into
# BUILD_DIR/families-venv (once; a stamp holds the requirements the venv was built from, so
# a change to requirements.txt rebuilds it) and rewrites the committed goldens. With FAMILY
# names only those directories are regenerated.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
if [ $# -lt 1 ]; then echo "usage: bash tests/families/run.sh BUILD_DIR [FAMILY...]" >&2; exit 2; fi
mkdir -p "$1" || exit 1
BUILD=$(cd "$1" && pwd)
shift
VENV=$BUILD/families-venv
REQ=$HERE/requirements.txt
OUT=$SRC/tests/data/families
PY=${PYTHON:-python3}
LOG=$BUILD/families-pip.log

stamp=$(sha256sum <"$REQ" | cut -c1-16)
if [ ! -f "$VENV/.families-stamp" ] || [ "$(cat "$VENV/.families-stamp")" != "$stamp" ]; then
    echo "families: creating $VENV from $REQ (log: $LOG)"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV" >"$LOG" 2>&1 \
       || ! "$VENV/bin/pip" install -q --upgrade pip >>"$LOG" 2>&1 \
       || ! "$VENV/bin/pip" install -r "$REQ" >>"$LOG" 2>&1; then
        echo "families: pip install failed; last lines:"; tail -5 "$LOG"; exit 1
    fi
    echo "$stamp" >"$VENV/.families-stamp"
fi
mkdir -p "$OUT"
"$VENV/bin/python" "$HERE/make_goldens.py" "$OUT" "$@" || exit 1
du -sh "$OUT"
