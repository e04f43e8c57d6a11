#!/usr/bin/env bash
# FP8-block source checkpoints, quantd's side of the torch proof (issue #35), without Python:
# tests/formats/fp8_source.py (run by hand) built DeepSeek-V3- and Qwen3-shaped FP8
# checkpoints with torch's float8_e4m3fn from transformers' tiny checkpoints, checked that
# `quantctl gen-model --fp8-from` writes the same bytes and that `quantctl dequant` of them
# equals torch's weight.to(float32) * scale bit for bit, and stored both sha256 sums per case
# in tests/data/fp8/fp8_source.sha256. This test rebuilds each checkpoint with quantctl and
# checks both sums, so the reading still decodes to exactly torch's weights.
set -u
. "$(dirname "$0")/cli_common.sh"
SRC="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
EV="$SRC/tests/data/fp8/fp8_source.sha256"
[ -f "$EV" ] || { fail "$EV missing"; exit 1; }
n=0
while read -r name family bn bk fp8_sum dq_sum; do
    case "$name" in ''|'#'*) continue ;; esac
    n=$((n + 1))
    "$Q" gen-model --fp8-from "$SRC/tests/data/families/$family" --fp8-block "${bn}x${bk}" --out "$T/$name" \
        > "$T/$name.log" 2>&1 || { fail "$name: gen-model failed: $(tail -3 "$T/$name.log")"; continue; }
    got=$(sha256sum < "$T/$name/model.safetensors" | cut -d' ' -f1)
    [ "$got" = "$fp8_sum" ] || fail "$name: the FP8 checkpoint is not torch's ($got, torch wrote $fp8_sum)"
    "$Q" dequant --model "$T/$name" --out "$T/$name-dq.safetensors" > "$T/$name.dq.log" 2>&1 ||
        { fail "$name: dequant failed: $(tail -3 "$T/$name.dq.log")"; continue; }
    got=$(sha256sum < "$T/$name-dq.safetensors" | cut -d' ' -f1)
    [ "$got" = "$dq_sum" ] || fail "$name: quantd's dequantized weights changed ($got, torch's are $dq_sum)"
done < "$EV"
[ "$n" -ge 3 ] || fail "only $n cases in $EV"
# The float twin (--dequant-out) holds torch's weights too: its dequant file is the same.
"$Q" gen-model --fp8-from "$SRC/tests/data/families/qwen3" --fp8-block 48x40 --out "$T/q8" --dequant-out "$T/q32" \
    > /dev/null 2>&1 || fail "gen-model --dequant-out failed"
"$Q" dequant --model "$T/q32" --out "$T/q32-dq.safetensors" > /dev/null 2>&1 || fail "dequant of the twin failed"
want=$(awk '$1 == "qwen3-48x40" { print $6 }' "$EV")
got=$(sha256sum < "$T/q32-dq.safetensors" 2>/dev/null | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "the F32 twin's weights are not torch's ($got vs $want)"
# MXFP4 experts are gpt-oss's (read as test_model_families' gpt_oss_mxfp4 shows); on another
# architecture the quant_method is refused by name, not read as something else.
mkdir -p "$T/mxfp4"
cat > "$T/mxfp4/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "vocab_size": 256, "intermediate_size": 64,
 "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}}
JSON
out=$("$Q" dequant --model "$T/mxfp4" --out "$T/mxfp4.safetensors" 2>&1) && fail "MXFP4 on a Llama was accepted"
case "$out" in
*'quant_method "mxfp4"'*"is read for GptOssForCausalLM only"*) ;;
*) fail "MXFP4 refusal: $out" ;;
esac
[ "$fails" = 0 ] && echo "PASS: $n FP8-block cases equal torch's, MXFP4 refused outside gpt-oss"
exit $((fails > 0))
