#!/usr/bin/env bash
# quantctl check-serving end to end on generated models (no shared data): a symmetric 4-bit
# g128 compressed-tensors checkpoint gets Machete everywhere on Hopper at TP 1 (exit 0) and
# not at TP 4, where a 64-wide shard of o_proj holds no whole 128-group (exit 1, the reason
# named); asymmetric GPTQ gets Exllama (exit 1); Ampere gets Marlin; bad usage exits 2.
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
grep -q '"kernel":"Exllama","fast":false' "$T/og" || fail "gptq asym: $(cat "$T/og")"

expect2() { "$Q" check-serving "$@" > /dev/null 2> "$T/err"; local rc=$?; [ "$rc" = 2 ] || fail "check-serving $*: exit $rc, expected 2"; }
expect2 "$T/ct" --engine sglang --gpu hopper --tp 1
expect2 "$T/ct" --engine vllm --gpu volta --tp 1
expect2 "$T/ct" --engine vllm --gpu hopper --tp 0
expect2 "$T/m" --engine vllm --gpu hopper --tp 1
grep -q 'not a quantized checkpoint' "$T/err" || fail "float model: $(cat "$T/err")"
[ "$fails" = 0 ] && echo PASS
exit $((fails > 0))
