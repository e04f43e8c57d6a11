#!/usr/bin/env bash
# AWQ's time per block against GPTQ's, and AWQ's quality, before and after a change
# (issue #19): bench/results/awq-speed.md.
#
#   bench/awq_speed.sh BUILD_AFTER [BUILD_BEFORE] [REPS] [SAMPLES] [WINDOWS]
#                                               (defaults: none, 3, 64, 64)
#
# Each BUILD holds a quantctl built with -DCMAKE_BUILD_TYPE=Release. Per model
# (tiny-llama-c4, stories260K) and repetition the jobs run interleaved: GPTQ (after's
# build), AWQ after, AWQ before, so that the load of a shared machine falls on all of them
# alike. Per job: the mean of the block_done seconds (wall clock per block, the blocks' own
# work: capture, scale search, clip, quantization, next inputs, checkpoint) and the job's user
# CPU seconds. Jobs: 4 bits, group 32, awq_gemm for AWQ, gptq for GPTQ, calibration SAMPLES x
# 512 tokens of c4-calib.jsonl with each method's default style and seed 0; stories260K keeps
# its MLP (172 wide, no group of 32) in float, as bench/pipeline.sh. Quality: the last
# repetition's AWQ outputs against the float model on the first WINDOWS windows of 512
# tokens of WikiText-2 (the goldens' token files), `quantctl eval --ref-model`: perplexity,
# mean KL(P_float || P_awq) per token and top-1 agreement. OPENBLAS_NUM_THREADS defaults to 2.
# AWQ_SPEED_MODELS (default "tiny-llama-c4 stories260K") picks the models, AWQ_SPEED_BEFORE_REPS
# (default REPS) how many repetitions also run the before build (it is the slow one); the
# quality rows use the last repetition that ran both.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: bench/awq_speed.sh BUILD_AFTER [BUILD_BEFORE] [REPS] [SAMPLES] [WINDOWS]" >&2; exit 2; }
after="$(cd "$1" && pwd)/quantctl"
before=""
[ -n "${2:-}" ] && before="$(cd "$2" && pwd)/quantctl"
reps="${3:-3}"
samples="${4:-64}"
windows="${5:-64}"
models="${AWQ_SPEED_MODELS:-tiny-llama-c4 stories260K}"
before_reps="${AWQ_SPEED_BEFORE_REPS:-$reps}"
[ "$before_reps" -gt "$reps" ] && before_reps=$reps
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-2}"
work="$(mktemp -d /tmp/quantd-awq-speed-XXXXXX)"
trap 'rm -rf "$work"' EXIT

job() {   # job QUANTCTL NAME MODEL METHOD -> prints "per_block_mean user_cpu"
    local q=$1 name=$2 model=$3 meth=$4 fmt=gptq keep=""
    [ "$meth" = awq ] && fmt=awq_gemm
    [ "$model" = stories260K ] && keep='"modules_to_not_convert": ["mlp."], '
    printf '{"model": "%s", "output": "%s", "method": "%s", "bits": 4, "group_size": 32, "format": "%s", %s"overwrite": true, "calibration": {"path": "%s", "samples": %s, "seq_len": 512}}\n' \
        "$data/models/$model" "$work/out-$name" "$meth" "$fmt" "$keep" "$data/text/c4/c4-calib.jsonl" "$samples" > "$work/$name.json"
    /usr/bin/time -f "%U" -o "$work/$name.time" "$q" quantize "$work/$name.json" > "$work/$name.log" 2>&1 ||
        { echo "awq_speed.sh: job $name failed:" >&2; tail -5 "$work/$name.log" >&2; exit 1; }
    local blk
    blk=$(grep -o 'block_done .* seconds=[0-9.]*' "$work/$name.log" | sed 's/.*seconds=//' |
        awk '{s += $1; n++} END {printf "%.2f", s / n}')
    echo "$blk $(cat "$work/$name.time")"
}

quality() {   # quality MODEL OUT_DIR -> prints "ppl kl top1"
    "$after" eval --model "$2" --ref-model "$data/models/$1" --tokens "$data/goldens/$1.wikitext2.tokens.json" \
        --max-windows "$windows" --seq-len 512 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; r = json.loads(sys.stdin.read()); print("%.4f %.5f %.2f" % (r["ppl"], r["kl_mean"], 100 * r["top1_agree"]))'
}

echo "| model | repetition | GPTQ s/block | AWQ after s/block | AWQ before s/block | GPTQ CPU s | AWQ after CPU s | AWQ before CPU s |"
echo "|---|---|---|---|---|---|---|---|"
for model in $models; do
    for r in $(seq 1 "$reps"); do
        g=$(job "$after" "$model-gptq-$r" "$model" gptq)
        a=$(job "$after" "$model-awq-after-$r" "$model" awq)
        b="- -"
        [ -n "$before" ] && [ "$r" -le "$before_reps" ] && b=$(job "$before" "$model-awq-before-$r" "$model" awq)
        echo "| $model | $r | ${g% *} | ${a% *} | ${b% *} | ${g#* } | ${a#* } | ${b#* } |"
    done
done
echo
echo "| model | AWQ build | PPL | KL to float | top-1 agreement (%) |"
echo "|---|---|---|---|---|"
q=$reps
[ -n "$before" ] && q=$before_reps
for model in $models; do
    echo "| $model | after | $(quality "$model" "$work/out-$model-awq-after-$q" | sed 's/ / | /g') |"
    [ -n "$before" ] && [ "$q" -ge 1 ] && echo "| $model | before | $(quality "$model" "$work/out-$model-awq-before-$q" | sed 's/ / | /g') |"
done
