#!/usr/bin/env bash
# Quantization quality on tiny-llama-c4: WikiText-2 perplexity of FP16, RTN, GPTQ, AWQ and
# AWQ+GPTQ at 4 and 3 bits, group size 128 (the layout of the AWQ paper's Table 5), written
# to bench/results/quality.md.
#
#   bench/quality.sh [BUILD_DIR] [WINDOWS]    (defaults: build, 64)
#
# BUILD_DIR must hold a quantctl built with -DCMAKE_BUILD_TYPE=Release. Eval uses the first
# WINDOWS windows of 512 tokens of the tokenized wiki.test.raw (the golden token file holds
# 64 windows; the whole file is ~1000 windows and would take well over 10 minutes on 2 cores
# for the 9 models). Calibration: 64 samples x 512 tokens of c4-calib.jsonl, AWQ-style
# blocks for awq/awq+gptq, random windows for gptq (the job defaults for each method).
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
samples=64
seqlen=512

[ -x "$qctl" ] || { echo "quality.sh: $qctl not built" >&2; exit 1; }
[ -d "$model" ] || { echo "quality.sh: $model absent" >&2; exit 1; }
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

ppl_of() {   # ppl_of MODEL_DIR -> prints perplexity
    "$qctl" eval --model "$1" --tokens "$tokens" --seq-len 512 --max-windows "$windows" 2>/dev/null |
        tail -1 | python3 -c 'import json,sys; print("%.2f" % json.loads(sys.stdin.read())["ppl"])'
}

quant() {    # quant METHOD BITS -> prints "ppl seconds"
    local meth="$1" bits="$2" dir="$work/$1-$2"
    local job="$work/job-$1-$2.json"
    local cal=""
    [ "$meth" = rtn ] || cal=", \"calibration\": {\"path\": \"$calib\", \"samples\": $samples, \"seq_len\": $seqlen}"
    printf '{"model": "%s", "output": "%s", "method": "%s", "bits": %s, "group_size": 128, "format": "gptq"%s, "overwrite": true}\n' \
        "$model" "$dir" "$meth" "$bits" "$cal" > "$job"
    local t0 t1
    t0=$(date +%s.%N)
    "$qctl" quantize "$job" > "$work/log-$1-$2.txt" 2>&1 || { echo "quality.sh: $meth $bits bits failed:" >&2; tail -5 "$work/log-$1-$2.txt" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$(ppl_of "$dir") $(python3 -c "print('%.0f' % ($t1 - $t0))")"
}

fp=$(ppl_of "$model")
declare -A ppl secs
for bits in 4 3; do
    for meth in rtn gptq awq awq+gptq; do
        read -r p s < <(quant "$meth" "$bits")
        ppl[$meth-$bits]=$p
        secs[$meth-$bits]=$s
        echo "$meth w${bits}g128: ppl $p (${s} s)" >&2
    done
done

{
    echo "# Quantization quality: tiny-llama-c4, WikiText-2"
    echo
    echo "Date: 2026-11-22. Produced by \`bench/quality.sh $build $windows\`."
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs available (lscpu: $(lscpu | sed -n 's/^CPU(s): *//p' | head -1) CPUs), CPU backend, 2 threads."
    echo
    echo "Perplexity (lower is better) on the first $windows windows of 512 tokens of WikiText-2"
    echo "wiki.test.raw (the token file \`goldens/tiny-llama-c4.wikitext2.tokens.json\`; the whole"
    echo "file is ~1000 windows, too slow for 9 models on 2 cores), as in the AWQ paper's Table 5"
    echo "(INT4/INT3, g128). Quantize time in seconds in parentheses."
    echo
    echo "| PPL ↓ | FP16 | INT4 g128 | INT3 g128 |"
    echo "|---|---|---|---|"
    echo "| FP16 | $fp | - | - |"
    for meth in rtn gptq awq awq+gptq; do
        name=$(echo "$meth" | tr a-z A-Z)
        echo "| $name | - | ${ppl[$meth-4]} (${secs[$meth-4]} s) | ${ppl[$meth-3]} (${secs[$meth-3]} s) |"
    done
    echo
    echo "Calibration: $samples samples x $seqlen tokens of \`text/c4/c4-calib.jsonl\`, seed 0;"
    echo "style \`gptq\` (random windows) for gptq, \`awq\` (documents concatenated and cut) for awq"
    echo "and awq+gptq (job defaults). RTN/GPTQ symmetric, AWQ/AWQ+GPTQ asymmetric (job defaults);"
    echo "GPTQ damp 0.01, no act-order, true_sequential. Format gptq (v1) for all."
    echo
    echo "Commands (job JSON passed to \`quantctl quantize JOB\`, then"
    echo "\`quantctl eval --model OUT --tokens $tokens --seq-len 512 --max-windows $windows\`):"
    echo
    echo '```'
    for bits in 4 3; do for meth in rtn gptq awq awq+gptq; do cat "$work/job-$meth-$bits.json"; done; done
    echo '```'
} > "$out"
echo "wrote $out" >&2
