#!/usr/bin/env bash
# AutoAWQ (the reference implementation) on tiny-llama-c4, quantized and evaluated the way
# bench/quality.sh evaluates quantd: AutoAWQ's search exported by bench/autoawq_ref.py, RTN
# zero point g128 by quantctl (AutoAWQ's own last step), WikiText-2 perplexity and KL to FP16.
#
#   bench/autoawq_ref.sh BUILD_DIR [BITS...]        (default bits: 3 4)
#
# The venv comes from tests/interop/requirements-autoawq.txt (the interop target's AutoAWQ
# environment; reused when BUILD_DIR/interop/venv-autoawq exists). Results in
# bench/results/quality-settings.md. Not part of ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: bench/autoawq_ref.sh BUILD_DIR [BITS...]}" && pwd)"; shift
bits=("${@:-3 4}")
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
model="$data/models/tiny-llama-c4"
calib="$data/text/c4/c4-calib.jsonl"
qctl="$build/quantctl"
venv="$build/interop/venv-autoawq"
work="${TMPDIR:-/tmp}/quantd-autoawq.$$"
[ -x "$qctl" ] || { echo "autoawq_ref.sh: $qctl not built" >&2; exit 1; }
[ -d "$model" ] || { echo "autoawq_ref.sh: $model absent" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r "$root/tests/interop/requirements-autoawq.txt"
fi
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
for b in ${bits[@]}; do
    "$venv/bin/python" "$root/bench/autoawq_ref.py" "$model" "$calib" "$work/aa$b" "$b"
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do cp "$model/$f" "$work/aa$b/"; done
    cat >"$work/job$b.json" <<J
{"model": "$work/aa$b", "output": "$work/aa$b-rtn", "method": "rtn", "bits": $b, "group_size": 128, "sym": false, "format": "gptq_v2", "calibration": {"path": "$calib", "samples": 16, "seq_len": 512}, "overwrite": true}
J
    "$qctl" quantize "$work/job$b.json" >/dev/null
    echo "autoawq w$b g128 zero point: $("$qctl" eval --model "$work/aa$b-rtn" --ref-model "$model" \
        --text "$data/text/wikitext-2-raw/wiki.test.raw" --seq-len 512 | tail -1)"
done
