#!/usr/bin/env bash
# Quantization quality on tiny-llama-c4: WikiText-2 perplexity of FP16, RTN, GPTQ, AWQ and
# AWQ+GPTQ at 4 and 3 bits, group size 128 (the layout of the AWQ paper's Table 5), written
# to bench/results/quality.md.
#
#   bench/quality.sh [BUILD_DIR] [WINDOWS]    (defaults: build, 64)
#
# BUILD_DIR must hold a quantctl built with -DCMAKE_BUILD_TYPE=Release. WINDOWS is a number
# (the first WINDOWS windows of 512 tokens of the tokenized wiki.test.raw, from the golden
# token file of 64 windows) or "full" (the whole wiki.test.raw: 1580 windows, 807,380
# predicted tokens, the way the goldens were computed; about 3 minutes per model on 2
# cores, twice that with the KL columns). Calibration: the job defaults (128 samples; 512
# tokens, the model's context), AWQ-style blocks of seed-shuffled documents for awq and
# awq+gptq, random windows for gptq and rtn; GPTQ with act-order (desc_act). RTN, GPTQ
# and AWQ run symmetric and asymmetric (zero point), AWQ+GPTQ with a zero point (AWQ's
# default): the AWQ paper compares at equal quantizer settings. Besides perplexity, every
# quantized model is compared token by token with the FP16 model on the same windows
# (quantctl eval --ref-model): mean KL(P_fp16 || P_quant) and top-1 agreement, which
# measure how faithfully a method keeps the model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
windows="${2:-64}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
model="$data/models/tiny-llama-c4"
tokens="$data/goldens/tiny-llama-c4.wikitext2.tokens.json"
calib="$data/text/c4/c4-calib.jsonl"
work="${TMPDIR:-/tmp}/quantd-quality.$$"
out="$here/results/quality.md"
samples=128
seqlen=512

[ -x "$qctl" ] || { echo "quality.sh: $qctl not built" >&2; exit 1; }
[ -d "$model" ] || { echo "quality.sh: $model absent" >&2; exit 1; }
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

if [ "$windows" = full ]; then
    evalsrc=(--text "$data/text/wikitext-2-raw/wiki.test.raw")
    evaldesc="the whole WikiText-2 wiki.test.raw (1580 windows of 512 tokens, BOS once at the start; the goldens' method)"
else
    evalsrc=(--tokens "$tokens" --max-windows "$windows")
    evaldesc="the first $windows windows of 512 tokens of WikiText-2 wiki.test.raw (the token file \`goldens/tiny-llama-c4.wikitext2.tokens.json\`)"
fi
ppl_of() {   # ppl_of MODEL_DIR -> prints perplexity
    "$qctl" eval --model "$1" "${evalsrc[@]}" --seq-len 512 2>/dev/null |
        tail -1 | python3 -c 'import json,sys; print("%.3f" % json.loads(sys.stdin.read())["ppl"])'
}
cmp_of() {   # cmp_of MODEL_DIR -> prints "ppl kl top1" against the FP16 model
    "$qctl" eval --model "$1" --ref-model "$model" "${evalsrc[@]}" --seq-len 512 2>/dev/null |
        tail -1 | python3 -c 'import json,sys; r = json.loads(sys.stdin.read()); print("%.3f %.5f %.2f" % (r["ppl"], r["kl_mean"], 100 * r["top1_agree"]))'
}

quant() {    # quant METHOD BITS SYM -> prints "ppl kl top1 seconds"
    local meth="$1" bits="$2" sym="$3" dir="$work/$1-$2-$3"
    local job="$work/job-$1-$2-$3.json"
    local cal=", \"calibration\": {\"path\": \"$calib\", \"samples\": $samples, \"seq_len\": $seqlen}"
    local act=""
    case "$meth" in gptq|awq+gptq) act=', "desc_act": true' ;; esac
    printf '{"model": "%s", "output": "%s", "method": "%s", "bits": %s, "group_size": 128, "sym": %s%s, "format": "gptq_v2"%s, "overwrite": true}\n' \
        "$model" "$dir" "$meth" "$bits" "$sym" "$act" "$cal" > "$job"
    local t0 t1
    t0=$(date +%s.%N)
    "$qctl" quantize "$job" > "$work/log-$1-$2-$3.txt" 2>&1 || { echo "quality.sh: $meth $bits bits failed:" >&2; tail -5 "$work/log-$1-$2-$3.txt" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$(cmp_of "$dir") $(python3 -c "print('%.0f' % ($t1 - $t0))")"
}

row_label() {  # row_label METHOD:SYM -> "GPTQ | zero point"
    local q=symmetric
    [ "${1#*:}" = false ] && q="zero point"
    echo "$(echo "${1%%:*}" | tr a-z A-Z) | $q"
}

fp=$(ppl_of "$model")
declare -A ppl kl top secs
echo "fp16: ppl $fp" >&2
variants="rtn:true rtn:false gptq:true gptq:false awq:true awq:false awq+gptq:false"
for bits in 4 3; do
    for v in $variants; do
        meth=${v%%:*} sym=${v#*:}
        read -r p d t s < <(quant "$meth" "$bits" "$sym")
        ppl[$v-$bits]=$p kl[$v-$bits]=$d top[$v-$bits]=$t secs[$v-$bits]=$s
        echo "$meth sym=$sym w${bits}g128: ppl $p, KL $d, top-1 $t% (${s} s)" >&2
    done
done

{
    echo "# Quantization quality: tiny-llama-c4, WikiText-2"
    echo
    echo "Date: $(date -u +%F). Produced by \`bench/quality.sh $build $windows\`."
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs available (lscpu: $(lscpu | sed -n 's/^CPU(s): *//p' | head -1) CPUs), CPU backend, 2 threads."
    echo
    echo "Perplexity (lower is better) on $evaldesc, laid out as the AWQ paper's Table 5"
    echo "(INT4/INT3, g128), with the quantize time in seconds in parentheses; then, on the same"
    echo "windows, each quantized model against the FP16 one: mean KL(P_fp16 || P_quant) per token"
    echo "(nats, lower is better) and the share of tokens whose most likely next token is the"
    echo "FP16 model's (higher is better)."
    echo
    echo "| PPL ↓ | quantizer | INT4 g128 | INT3 g128 |"
    echo "|---|---|---|---|"
    echo "| FP16 | - | $fp | $fp |"
    for v in $variants; do
        echo "| $(row_label "$v") | ${ppl[$v-4]} (${secs[$v-4]} s) | ${ppl[$v-3]} (${secs[$v-3]} s) |"
    done
    echo
    echo "| KL to FP16 ↓ / top-1 agreement ↑ | quantizer | INT4 g128 | INT3 g128 |"
    echo "|---|---|---|---|"
    for v in $variants; do
        echo "| $(row_label "$v") | ${kl[$v-4]} / ${top[$v-4]}% | ${kl[$v-3]} / ${top[$v-3]}% |"
    done
    echo
    echo "Calibration: $samples samples x $seqlen tokens of \`text/c4/c4-calib.jsonl\`, seed 0;"
    echo "style \`gptq\` (random windows) for gptq and rtn (rtn only uses it for its error report),"
    echo "\`awq\` (documents shuffled with the seed, concatenated and cut) for awq and awq+gptq (job"
    echo "defaults). GPTQ damp 0.01,"
    echo "act-order (desc_act), true_sequential. Format gptq_v2 for all (no v1 zero-point constraint)."
    echo
    echo "Commands (job JSON passed to \`quantctl quantize JOB\`, then \`quantctl eval --model OUT"
    echo "--ref-model $model ${evalsrc[*]} --seq-len 512\`):"
    echo
    echo '```'
    for bits in 4 3; do for v in $variants; do cat "$work/job-${v%%:*}-$bits-${v#*:}.json"; done; done
    echo '```'
    echo
    echo "How to read these numbers, and the other calibration settings measured (sample counts,"
    echo "act-order, damping, static groups): [quality-settings.md](quality-settings.md)."
} > "$out"
echo "wrote $out" >&2
