#!/usr/bin/env bash
# Byte-identical output of the formats that existed before the format descriptor took over
# every piece of format knowledge (issue #17 part 1): four jobs on stories260K (GPTQ v1 sym
# with act-order, GPTQ v1 asym (zero_min1), RTN into gptq_v2 asym 3-bit, AWQ into awq_gemm,
# the MLP left in float), and the sha256 of what each writes: model.safetensors,
# quantize_config.json and config.json without its dtype lines (those belong to the dtype
# work, not to the format). The expected sums in tests/data/formats/golden.sha256 were
# written by the code before the move (tests/data/formats/README.md says how to regenerate
# them, and when that is legitimate). Skips without ../shared/data.
set -u
. "$(dirname "$0")/cli_common.sh"
D="${QUANTD_SHARED_DATA:-}"
M="$D/models/stories260K"
C="$D/text/c4/c4-calib.jsonl"
[ -d "$M" ] && [ -f "$C" ] || { echo "SKIP: $M or $C absent"; exit 77; }
SRC="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
GOLD="$SRC/tests/data/formats/golden.sha256"
pin_blas_kernel

cal="\"calibration\": {\"path\": \"$C\", \"samples\": 8, \"seq_len\": 64}"
keep="\"modules_to_not_convert\": [\"mlp.\"]"
job() {   # NAME EXTRA
    printf '{"id": "g-%s", "model": "%s", "output": "%s/%s", "group_size": 32, %s, %s, %s}\n' \
        "$1" "$M" "$T" "$1" "$cal" "$keep" "$2" > "$T/$1.json"
    "$Q" quantize "$T/$1.json" > "$T/$1.log" 2>&1 || { fail "job $1 failed: $(tail -3 "$T/$1.log")"; return; }
    # The first progress line knows the block count and that no block has started (#19).
    grep -m1 '^progress' "$T/$1.log" | grep -q 'stage=load block=0/[1-9]' \
        || fail "job $1: first progress line is '$(grep -m1 '^progress' "$T/$1.log")', not block=0/N" >&2
    for f in model.safetensors quantize_config.json; do
        echo "$(sha256sum < "$T/$1/$f" | cut -d' ' -f1)  $1/$f"
    done
    echo "$(grep -v -E '^\s*"(torch_)?dtype":' "$T/$1/config.json" | sha256sum | cut -d' ' -f1)  $1/config.json-without-dtype"
}
{
    # act-order, column order and min-max named: the sums predate act-order with static
    # groups and the scale search as gptq's defaults
    job gptq-sym-act '"method": "gptq", "format": "gptq", "bits": 4, "desc_act": true, "static_groups": false, "scale_search": "minmax"'
    job gptq-asym '"method": "gptq", "format": "gptq", "bits": 4, "sym": false, "desc_act": false, "scale_search": "minmax"'
    job rtn-v2-asym3 '"method": "rtn", "format": "gptq_v2", "bits": 3, "sym": false'
    job awq-gemm '"method": "awq", "format": "awq_gemm", "bits": 4'
} > "$T/got.sha256"
if [ "${QUANTD_GOLDEN_WRITE:-0}" = 1 ]; then
    cp "$T/got.sha256" "$GOLD" && echo "wrote $GOLD"
    exit 0
fi
[ -f "$GOLD" ] || { fail "$GOLD missing"; exit 1; }
diff -u "$GOLD" "$T/got.sha256" || fail "output differs from the pre-descriptor golden sums"
[ "$fails" = 0 ] && echo "PASS: $(wc -l < "$GOLD") files byte-identical"
exit $((fails > 0))
