#!/usr/bin/env bash
# quantctl check-serving end to end on generated models (no shared data): a symmetric 4-bit
# g128 compressed-tensors checkpoint gets Machete everywhere on Hopper at TP 1 (exit 0) and
# not at TP 4, where a 64-wide shard of o_proj holds no whole 128-group (exit 1, the reason
# named); asymmetric GPTQ does not load (vLLM 0.32's AutoGPTQConfig holds symmetric 4/8-bit
# only; exit 1); Ampere gets Marlin; bad usage exits 2.
# A job's "serve" block: refused before any work at TP 4 (the reason and the fix named, no
# output created), accepted at TP 1 with the kernel per layer in the report; and the
# vllm-hopper profile of quantctl submit. The float schemes (issue #35) on the real tiny-llama-c4
# (hidden 256, head_dim 64) when ../shared/data is there: NVFP4A16 by RTN, served on Blackwell
# by FP4 Marlin (CompressedTensorsW4A16Fp4) at TP 1 and 4, through the job's own serve
# pre-flight too; FP8_DYNAMIC gets CUTLASS FP8 on Hopper and Blackwell and weight-only FP8
# Marlin on Ampere; FP8_BLOCK at TP 4 breaks the 128-wide blocks of o_proj's shards. And the
# vllm-hopper-fp8 and vllm-blackwell profiles.
set -u
. "$(dirname "$0")/cli_common.sh"

"$Q" gen-model --out "$T/m" --layers 1 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --vocab 128 \
    --max-pos 128 > /dev/null || fail "gen-model"
job() {   # NAME FORMAT EXTRA
    echo "{\"model\":\"$T/m\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"format\":\"$2\",\"bits\":4,$3}" > "$T/$1.json"
    "$Q" quantize "$T/$1.json" > "$T/$1.log" 2>&1 || fail "quantize $1: $(tail -2 "$T/$1.log")"
}
job ct compressed-tensors '"group_size":128,"sym":true'
job gptq gptq_v2 '"group_size":128,"sym":false'

"$Q" check-serving "$T/ct" --engine vllm --gpu hopper --tp 1 > "$T/o1"; rc=$?
[ "$rc" = 0 ] || fail "ct tp 1: exit $rc: $(cat "$T/o1")"
[ "$(grep -c ' Machete ' "$T/o1")" = 4 ] || fail "ct tp 1: not Machete for all 4 layers: $(cat "$T/o1")"
grep -q 'qkv_proj (q_proj+k_proj+v_proj)' "$T/o1" || fail "ct tp 1: q/k/v not fused: $(cat "$T/o1")"
"$Q" check-serving "$T/ct" --engine vllm --gpu hopper --tp 4 > "$T/o4"; rc=$?
[ "$rc" = 1 ] || fail "ct tp 4: exit $rc, expected 1"
grep 'o_proj' "$T/o4" | grep -q 'will not load.*load.group' || fail "ct tp 4: o_proj reason: $(cat "$T/o4")"
tail -1 "$T/o4" | grep -q '^FAIL: ' || fail "ct tp 4: summary: $(tail -1 "$T/o4")"
"$Q" check-serving "$T/ct" --engine vllm --gpu ampere --tp 1 > "$T/oa"; rc=$?
[ "$rc" = 0 ] && [ "$(grep -c ' Marlin ' "$T/oa")" = 4 ] || fail "ct ampere: exit $rc: $(cat "$T/oa")"
"$Q" check-serving "$T/gptq" --engine vllm --gpu hopper --tp 1 --json > "$T/og"; rc=$?
[ "$rc" = 1 ] || fail "gptq asym: exit $rc, expected 1"
grep -q '"kernel":"will not load","fast":false' "$T/og" || fail "gptq asym: $(cat "$T/og")"
"$Q" check-serving "$T/gptq" --engine vllm --gpu hopper --tp 1 > "$T/og2"
grep -q 'auto_gptq.type: asymmetric weights' "$T/og2" || fail "gptq asym: the reason: $(cat "$T/og2")"

# job.serve pre-flight
echo "{\"model\":\"$T/m\",\"output\":\"$T/s4\",\"method\":\"rtn\",\"format\":\"compressed-tensors\",\"bits\":4,\"group_size\":128,\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":4}}" > "$T/s4.json"
"$Q" quantize "$T/s4.json" > "$T/s4.log" 2>&1 && fail "serve tp 4: the job ran"
grep -q 'serve: .*o_proj: will not load: load.group.*fix: a group_size that divides' "$T/s4.log" || fail "serve tp 4: $(tail -2 "$T/s4.log")"
[ -e "$T/s4" ] && fail "serve tp 4: the refused job created its output"
sed 's/"tp":4/"tp":1/; s/s4/s1/' "$T/s4.json" > "$T/s1.json"
"$Q" quantize "$T/s1.json" > "$T/s1.log" 2>&1 || fail "serve tp 1: $(tail -2 "$T/s1.log")"
python3 -c 'import json,sys; s = json.load(open(sys.argv[1]))["serving"]; assert s["tp"] == 1 and len(s["layers"]) == 4 and all(l["kernel"] == "Machete" for l in s["layers"]), s' \
    "$T/s1/quantd_report.json" || fail "serve tp 1: report"
# the profile
"$Q" submit --profile vllm-hopper --model "$T/m" --output "$T/p" --method rtn --print > "$T/prof" || fail "profile --print"
python3 -c 'import json,sys; j = json.load(open(sys.argv[1])); assert (j["format"], j["bits"], j["group_size"], j["sym"], j["serve"]) == ("compressed-tensors", 4, 128, True, {"engine": "vllm", "gpu": "hopper", "tp": 1}), j' \
    "$T/prof" || fail "profile fields: $(cat "$T/prof")"
echo '{"group_size": 64}' > "$T/g64.json"
"$Q" submit "$T/g64.json" --profile vllm-hopper --model "$T/m" --output "$T/p" --method rtn --print | grep -q '"group_size":64' \
    || fail "profile: the file's field does not win"
"$Q" submit --profile nope --model "$T/m" --output "$T/p" --method rtn --print 2> "$T/err" && fail "unknown profile accepted"
grep -q "'nope' is not a profile (vllm-hopper, vllm-hopper-fp8, vllm-blackwell)" "$T/err" || fail "unknown profile: $(cat "$T/err")"
"$Q" submit --profile vllm-blackwell --model "$T/m" --output "$T/p" --calib "$T/calib.jsonl" --print > "$T/prof" || fail "vllm-blackwell --print"
python3 -c 'import json,sys; j = json.load(open(sys.argv[1])); assert (j["scheme"], j["method"], j["format"], j["bits"], j["group_size"], j["serve"]) == ("NVFP4A16", "gptq", "nvfp4-pack-quantized", 4, 16, {"engine": "vllm", "gpu": "blackwell", "tp": 1}), j' \
    "$T/prof" || fail "vllm-blackwell fields: $(cat "$T/prof")"
"$Q" submit --profile vllm-hopper-fp8 --model "$T/m" --output "$T/p" --method rtn --print > "$T/prof" || fail "vllm-hopper-fp8 --print"
python3 -c 'import json,sys; j = json.load(open(sys.argv[1])); assert (j["scheme"], j["format"], j["bits"], j["serve"]["gpu"]) == ("FP8_DYNAMIC", "float-quantized", 8, "hopper"), j' \
    "$T/prof" || fail "vllm-hopper-fp8 fields: $(cat "$T/prof")"
"$Q" submit --profile vllm-hopper-fp8 --model "$T/m" --output "$T/p" --method rtn --bits 4 --print > /dev/null 2> "$T/err" \
    && fail "vllm-hopper-fp8 with bits 4 accepted"
grep -q 'contradicts scheme FP8_DYNAMIC' "$T/err" || fail "vllm-hopper-fp8 bits 4: $(cat "$T/err")"

# The float schemes on the real tiny-llama-c4 (hidden 256, 4 layers: 16 fused linears).
D="${QUANTD_SHARED_DATA:-}"
TL="$D/models/tiny-llama-c4"
if [ -f "$TL/config.json" ]; then
    fjob() {   # NAME SCHEME EXTRA
        echo "{\"model\":\"$TL\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"scheme\":\"$2\"$3}" > "$T/$1.json"
        "$Q" quantize "$T/$1.json" > "$T/$1.log" 2>&1 || fail "quantize $1: $(tail -2 "$T/$1.log")"
    }
    fjob nv NVFP4A16 ',"serve":{"engine":"vllm","gpu":"blackwell","tp":1}'
    python3 -c 'import json,sys; s = json.load(open(sys.argv[1]))["serving"]; assert len(s["layers"]) == 16 and all(l["kernel"] == "Marlin" for l in s["layers"]), s' \
        "$T/nv/quantd_report.json" || fail "nvfp4a16 serve blackwell: report"
    for tp in 1 4; do
        "$Q" check-serving "$T/nv" --engine vllm --gpu blackwell --tp $tp > "$T/ob$tp"; rc=$?
        [ "$rc" = 0 ] || fail "nvfp4a16 blackwell tp $tp: exit $rc: $(tail -3 "$T/ob$tp")"
        [ "$(grep -c ' Marlin .*CompressedTensorsW4A16Fp4.*FP4 Marlin, weight-only' "$T/ob$tp")" = 16 ] ||
            fail "nvfp4a16 blackwell tp $tp: not FP4 Marlin for all 16 layers: $(head -3 "$T/ob$tp")"
        tail -1 "$T/ob$tp" | grep -q "^OK: format nvfp4-pack-quantized, 4-bit, symmetric, group 16; vllm on blackwell at tp $tp: 0 of 16" ||
            fail "nvfp4a16 blackwell tp $tp: summary: $(tail -1 "$T/ob$tp")"
    done
    "$Q" check-serving "$T/nv" --engine vllm --gpu blackwell --tp 1 --json | grep -c '"kernel":"Marlin","fast":true' | grep -qx 16 ||
        fail "nvfp4a16 blackwell --json"
    fjob f8 FP8_DYNAMIC ''
    "$Q" check-serving "$T/f8" --engine vllm --gpu hopper --tp 1 > "$T/of"; rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c ' CUTLASS FP8 .*CompressedTensorsW8A8Fp8' "$T/of")" = 16 ] || fail "fp8 hopper: exit $rc: $(head -3 "$T/of")"
    "$Q" check-serving "$T/f8" --engine vllm --gpu blackwell --tp 2 > "$T/of"; rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c ' CUTLASS FP8 ' "$T/of")" = 16 ] || fail "fp8 blackwell tp 2: exit $rc: $(head -3 "$T/of")"
    "$Q" check-serving "$T/f8" --engine vllm --gpu ampere --tp 1 > "$T/of"; rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c ' Marlin .*CompressedTensorsW8A16Fp8.*FP8 Marlin, weight-only' "$T/of")" = 16 ] ||
        fail "fp8 ampere: exit $rc: $(head -3 "$T/of")"
    fjob fb FP8_BLOCK ''
    "$Q" check-serving "$T/fb" --engine vllm --gpu hopper --tp 1 > "$T/of"; rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c ' block FP8 ' "$T/of")" = 16 ] || fail "fp8 block hopper tp 1: exit $rc: $(head -3 "$T/of")"
    "$Q" check-serving "$T/fb" --engine vllm --gpu hopper --tp 4 > "$T/of"; rc=$?
    [ "$rc" = 1 ] || fail "fp8 block hopper tp 4: exit $rc, expected 1"
    grep 'o_proj' "$T/of" | head -1 | grep -q 'will not load: load.fp8_block_k: a shard of 64 input features' ||
        fail "fp8 block tp 4: o_proj reason: $(grep o_proj "$T/of" | head -1)"
    # The activations a checkpoint declares: W4AFP8 is CutlassW4A8 on Hopper and does not
    # load elsewhere; its job's pre-flight on Ampere refuses it before any work.
    fjob w48 W4AFP8 ''
    "$Q" check-serving "$T/w48" --engine vllm --gpu hopper --tp 1 > "$T/ow"; rc=$?
    [ "$rc" = 0 ] && [ "$(grep -c ' CutlassW4A8 ' "$T/ow")" = 16 ] || fail "w4afp8 hopper: exit $rc: $(head -3 "$T/ow")"
    "$Q" check-serving "$T/w48" --engine vllm --gpu ampere --tp 1 > "$T/ow"; rc=$?
    [ "$rc" = 1 ] && [ "$(grep -c 'will not load: no compressed-tensors scheme matches int4 weights with FP8 activations' "$T/ow")" = 16 ] ||
        fail "w4afp8 ampere: exit $rc: $(head -3 "$T/ow")"
    echo "{\"model\":\"$TL\",\"output\":\"$T/w48a\",\"method\":\"rtn\",\"scheme\":\"W4AFP8\",\"serve\":{\"engine\":\"vllm\",\"gpu\":\"ampere\",\"tp\":1}}" > "$T/w48a.json"
    "$Q" quantize "$T/w48a.json" > "$T/w48a.log" 2>&1 && fail "w4afp8 serve ampere: the job ran"
    grep -q 'int4 weights with FP8 activations' "$T/w48a.log" || fail "w4afp8 serve ampere: $(tail -2 "$T/w48a.log")"
else
    echo "note: shared data absent, the float-scheme checks on tiny-llama-c4 skipped"
fi

# vLLM serves OLMo 2/3 through its Transformers backend, whose fusers give it qkv_proj and
# gate_up_proj as its own GLM-4 and EXAONE 4 have them.
FAM="${QUANTD_SOURCE_DIR:-$(dirname "$0")/../..}/tests/data/families"
for f in olmo2 glm4 exaone4; do
    echo "{\"model\":\"$FAM/$f\",\"output\":\"$T/$f\",\"method\":\"rtn\",\"format\":\"compressed-tensors\",\"bits\":4,\"group_size\":32,\"sym\":true}" > "$T/$f.json"
    "$Q" quantize "$T/$f.json" > "$T/$f.log" 2>&1 || { fail "quantize $f: $(tail -2 "$T/$f.log")"; continue; }
    "$Q" check-serving "$T/$f" --engine vllm --gpu hopper --tp 1 > "$T/$f.o"
done
grep -q 'qkv_proj (q_proj+k_proj+v_proj)' "$T/olmo2.o" && grep -q 'gate_up_proj (gate_proj+up_proj)' "$T/olmo2.o" \
    || fail "olmo2: q/k/v and gate/up not fused: $(cat "$T/olmo2.o")"
grep -q 'qkv_proj (q_proj+k_proj+v_proj)' "$T/glm4.o" && grep -q 'model.layers.0.mlp.gate_up_proj ' "$T/glm4.o" \
    || fail "glm4: $(cat "$T/glm4.o")"
grep -q 'qkv_proj (q_proj+k_proj+v_proj)' "$T/exaone4.o" && grep -q 'gate_up_proj (gate_proj+up_proj)' "$T/exaone4.o" \
    || fail "exaone4: $(cat "$T/exaone4.o")"

expect2() { "$Q" check-serving "$@" > /dev/null 2> "$T/err"; local rc=$?; [ "$rc" = 2 ] || fail "check-serving $*: exit $rc, expected 2"; }
expect2 "$T/ct" --engine sglang --gpu hopper --tp 1
expect2 "$T/ct" --engine vllm --gpu volta --tp 1
grep -q "'volta' is not one of hopper, ampere, blackwell" "$T/err" || fail "--gpu volta: $(cat "$T/err")"
expect2 "$T/ct" --engine vllm --gpu hopper --tp 0
expect2 "$T/m" --engine vllm --gpu hopper --tp 1
grep -q 'not a quantized checkpoint' "$T/err" || fail "float model: $(cat "$T/err")"
# Phi's parallel block: q/k/v and fc1 are one input group (one norm, one Hessian), but vLLM's
# Transformers backend serves them as two column-parallel linears (fused qkv_proj, fc1 alone).
PHI="$(cd "$(dirname "$0")/../data/families/phi2" && pwd)"
echo "{\"model\":\"$PHI\",\"output\":\"$T/phi\",\"method\":\"rtn\",\"format\":\"gptq\",\"bits\":4,\"group_size\":32}" > "$T/phi.json"
"$Q" quantize "$T/phi.json" > "$T/phi.log" 2>&1 || fail "quantize phi2: $(tail -2 "$T/phi.log")"
"$Q" check-serving "$T/phi" --engine vllm --gpu ampere --tp 1 > "$T/op"
grep -q '^model.layers.0.self_attn.qkv_proj (q_proj+k_proj+v_proj) ' "$T/op" || fail "phi2: q/k/v not one fused linear: $(cat "$T/op")"
grep -q '^model.layers.0.mlp.fc1 ' "$T/op" || fail "phi2: fc1 not its own linear: $(cat "$T/op")"
[ "$(grep -c '^model.layers.0.' "$T/op")" = 4 ] || fail "phi2: 4 linears per layer expected: $(cat "$T/op")"
# Cohere2's parallel block likewise: q/k/v and gate/up one group, served as qkv_proj and
# gate_up_proj (vllm/model_executor/models/commandr.py).
CO="$(cd "$(dirname "$0")/../data/families/cohere2" && pwd)"
echo "{\"model\":\"$CO\",\"output\":\"$T/co\",\"method\":\"rtn\",\"format\":\"gptq\",\"bits\":4,\"group_size\":32}" > "$T/co.json"
"$Q" quantize "$T/co.json" > "$T/co.log" 2>&1 || fail "quantize cohere2: $(tail -2 "$T/co.log")"
"$Q" check-serving "$T/co" --engine vllm --gpu ampere --tp 1 > "$T/oc"
grep -q '^model.layers.0.self_attn.qkv_proj (q_proj+k_proj+v_proj) ' "$T/oc" || fail "cohere2: qkv_proj: $(cat "$T/oc")"
grep -q '^model.layers.0.mlp.gate_up_proj (gate_proj+up_proj) ' "$T/oc" || fail "cohere2: gate_up_proj: $(cat "$T/oc")"
[ "$fails" = 0 ] && echo PASS
exit $((fails > 0))
