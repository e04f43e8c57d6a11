#!/usr/bin/env bash
# End-to-end pipeline benchmark (issue 4): seconds and peak RSS of `quantctl quantize` for
# each method on the real models in ../shared/data, and seconds per block of a generated
# 7B-shaped block (hidden 4096, intermediate 11008, 32 heads) on the CPU.
#
#   bench/pipeline.sh [BUILD_DIR] [SAMPLES] [BLOCK_SAMPLES]
#
# SAMPLES calibration sequences of 512 tokens for the real models (default 64); the 7B block
# gets BLOCK_SAMPLES sequences of 2048 tokens (default 8: a full 128 x 2048 set is 16x the
# forward work, so its time per block scales about linearly from this). Writes a markdown
# table to stdout; bench/results/pipeline.md holds a dated run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/release}
S=${2:-64}
BS=${3:-8}
Q="$B/quantctl"
D=${QUANTD_SHARED_DATA:-$PWD/../shared/data}
T=$(mktemp -d /tmp/quantd-bench-pipeline-XXXXXX)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)}

run() {   # run NAME JOBJSON -> prints "seconds peak_rss_mib"
    local name=$1 json=$2
    echo "$json" > "$T/$name.json"
    /usr/bin/time -f "%e %M" -o "$T/$name.time" "$Q" quantize "$T/$name.json" > "$T/$name.log" 2>&1 ||
        { echo "FAILED: $name (see log below)" >&2; tail -5 "$T/$name.log" >&2; return 1; }
    read -r secs kb < "$T/$name.time"
    echo "$secs $((kb / 1024))"
}

echo "| model | method | format | calibration | seconds | peak RSS (MiB) |"
echo "|---|---|---|---|---|---|"
if [ -d "$D/models" ]; then
    for model in tiny-llama-c4 stories260K; do
        for m in rtn gptq awq awq+gptq; do
            fmt=gptq; [ "$m" = awq ] && fmt=awq_gemm
            calib="\"calibration\": {\"path\": \"$D/text/c4/c4-calib.jsonl\", \"samples\": $S, \"seq_len\": 512}"
            # stories260K's MLP (172 wide) fits no group of 32: the job must list it to keep it in float.
            keep=""; [ "$model" = stories260K ] && keep="\"modules_to_not_convert\": [\"mlp.\"], "
            r=$(run "$model-$m" "{\"model\": \"$D/models/$model\", \"output\": \"$T/out-$model-$m\", \"method\": \"$m\", \"bits\": 4, \"group_size\": 32, \"format\": \"$fmt\", $keep$calib}")
            echo "| $model | $m | $fmt | ${S} x 512 | ${r% *} | ${r#* } |"
        done
    done
else
    echo "(../shared/data absent: real-model rows skipped)"
fi

# A generated 7B-shaped block (one layer) with random calibration ids.
"$Q" gen-model --out "$T/b7" --layers 1 --hidden 4096 --intermediate 11008 --heads 32 --kv-heads 32 \
    --max-pos 4096 --vocab 512 --dtype f16 > /dev/null
python3 -c "import json,random; random.seed(0); json.dump({'tokens':[random.randrange(512) for _ in range($BS*2048+4096)]}, open('$T/ids.json','w'))"
for m in rtn gptq; do
    r=$(run "b7-$m" "{\"model\": \"$T/b7\", \"output\": \"$T/out-b7-$m\", \"method\": \"$m\", \"bits\": 4, \"group_size\": 128, \"calibration\": {\"path\": \"$T/ids.json\", \"samples\": $BS, \"seq_len\": 2048}}")
    blk=$(python3 -c "import json; r=json.load(open('$T/out-b7-$m/quantd_report.json')); print('%.1f' % r['totals']['block_seconds'])")
    echo "| 7B-shaped block (1 layer) | $m | gptq | ${BS} x 2048 | ${r% *} (block: $blk) | ${r#* } |"
done
