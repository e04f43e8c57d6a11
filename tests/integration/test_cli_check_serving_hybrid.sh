#!/usr/bin/env bash
# quantctl check-serving on the hybrids (LFM2, Granite-4.0-H, Falcon-H1): each layer lists the
# linears it holds (a recurrent layer its mixer's in_proj and out_proj, no attention; an
# attention layer no mixer; a Falcon-H1 layer both, and its feed_forward fused as vLLM's
# falcon_h1.py does), the mixers' float parameters never appear as linears, and Mamba-2's
# in_proj and out_proj do not split over a TP that does not divide its heads (vLLM's
# MambaMixer2 asserts).
set -u
. "$(dirname "$0")/cli_common.sh"
D="$(cd "$(dirname "$0")/../data/families" && pwd)"
for f in lfm2 granite4_h falcon_h1; do
    echo "{\"model\":\"$D/$f\",\"output\":\"$T/$f\",\"method\":\"rtn\",\"format\":\"gptq\",\"bits\":4,\"group_size\":32}" > "$T/$f.json"
    "$Q" quantize "$T/$f.json" > "$T/$f.log" 2>&1 || fail "quantize $f: $(tail -2 "$T/$f.log")"
    "$Q" check-serving "$T/$f" --engine vllm --gpu hopper --tp 1 > "$T/$f.o1"
    [ $? -le 1 ] || fail "$f tp 1: bad usage or input: $(cat "$T/$f.o1")"
done
grep -q '^model.layers.0.conv.in_proj ' "$T/lfm2.o1" || fail "lfm2: no conv.in_proj in layer 0: $(cat "$T/lfm2.o1")"
grep -q '^model.layers.0.conv.out_proj ' "$T/lfm2.o1" || fail "lfm2: no conv.out_proj in layer 0"
grep -q '^model.layers.0.self_attn' "$T/lfm2.o1" && fail "lfm2: attention listed in the convolution layer 0"
grep -q '^model.layers.1.self_attn.qkv_proj (q_proj+k_proj+v_proj)' "$T/lfm2.o1" || fail "lfm2: layer 1's q/k/v not fused"
grep -q '^model.layers.1.conv' "$T/lfm2.o1" && fail "lfm2: a mixer listed in the attention layer 1"
grep -q 'conv.conv' "$T/lfm2.o1" && fail "lfm2: the convolution listed as a linear"
[ "$(grep -c '^model.layers' "$T/lfm2.o1")" = 12 ] || fail "lfm2: $(grep -c '^model.layers' "$T/lfm2.o1") rows, expected 12"
grep -q '^model.layers.0.mamba.in_proj ' "$T/granite4_h.o1" || fail "granite4_h: no mamba.in_proj in layer 0"
grep -q '^model.layers.1.mamba' "$T/granite4_h.o1" && fail "granite4_h: a mixer listed in the attention layer 1"
grep -q 'conv1d\|A_log\|dt_bias' "$T/granite4_h.o1" && fail "granite4_h: a float parameter listed as a linear"
[ "$(grep -c '^model.layers' "$T/granite4_h.o1")" = 12 ] || fail "granite4_h: rows: $(cat "$T/granite4_h.o1")"
"$Q" check-serving "$T/granite4_h" --engine vllm --gpu hopper --tp 3 > "$T/g3"; rc=$?
[ "$rc" = 1 ] || fail "granite4_h tp 3: exit $rc, expected 1"
grep '^model.layers.0.mamba.in_proj ' "$T/g3" | grep -q 'will not load' || fail "granite4_h tp 3: in_proj: $(cat "$T/g3")"
for l in 0 1 2; do
    for lin in 'self_attn.qkv_proj (q_proj+k_proj+v_proj)' self_attn.o_proj mamba.in_proj mamba.out_proj \
               'feed_forward.gate_up_proj (gate_proj+up_proj)' feed_forward.down_proj; do
        grep -qF "model.layers.$l.$lin " "$T/falcon_h1.o1" || fail "falcon_h1: no $lin in layer $l: $(cat "$T/falcon_h1.o1")"
    done
done
grep -q 'conv1d\|A_log\|dt_bias\|mamba\.D' "$T/falcon_h1.o1" && fail "falcon_h1: a float parameter listed as a linear"
[ "$(grep -c '^model.layers' "$T/falcon_h1.o1")" = 18 ] || fail "falcon_h1: rows: $(cat "$T/falcon_h1.o1")"
"$Q" check-serving "$T/falcon_h1" --engine vllm --gpu hopper --tp 3 > "$T/f3"; rc=$?
[ "$rc" = 1 ] || fail "falcon_h1 tp 3: exit $rc, expected 1"
grep '^model.layers.0.mamba.in_proj ' "$T/f3" | grep -q 'will not load' || fail "falcon_h1 tp 3: in_proj: $(cat "$T/f3")"
exit $fails
