#!/usr/bin/env bash
# A MoE block's capture passes, two builds interleaved (docs/methods.md, "Mixture of experts"):
# one GPTQ w4 g128 true-sequential job (`quantctl quantize`, one thread) on a generated
# Mixtral-shaped block, ROUNDS times per build, A then B in each round; prints per run the
# block's seconds, its calibrate stage (the capture passes) and passes from
# quantd_report.json, and the first 16 hex digits of model.safetensors' SHA-256 (every run's
# must be the same bytes: the script fails otherwise).
#
#   bench/moe_capture.sh BUILD_A BUILD_B [ROUNDS] [HIDDEN] [INTERMEDIATE] [EXPERTS] [SAMPLES] [SEQ_LEN]
#
# Defaults: 2 rounds, a half-size Mixtral block (hidden 2048, 8 experts of 7168, top 2, 16
# heads, 4 KV heads), 2 x 512 tokens. Results: bench/results/moe-capture.md.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?build A}
B=${2:?build B}
ROUNDS=${3:-2}
H=${4:-2048}
I=${5:-7168}
E=${6:-8}
S=${7:-2}
L=${8:-512}
for b in "$A" "$B"; do [ -x "$b/quantctl" ] || { echo "moe_capture.sh: $b/quantctl not built" >&2; exit 1; }; done
T=$(mktemp -d /tmp/quantd-bench-moe-XXXXXX)
trap 'rm -rf "$T"' EXIT
export QUANTD_THREADS=1 OPENBLAS_NUM_THREADS=1
"$A/quantctl" gen-model --out "$T/m" --layers 1 --hidden "$H" --intermediate "$I" --heads 16 --kv-heads 4 \
    --experts "$E" --vocab 512 --max-pos 4096 --dtype f16 > /dev/null
python3 -c "import json,random; random.seed(0); json.dump({'tokens':[random.randrange(512) for _ in range($S*$L+4096)]}, open('$T/ids.json','w'))"
echo "MoE block: hidden $H, $E experts of $I, top 2; GPTQ w4 g128, $S x $L tokens, one thread"
echo
echo "| round | build | block s | calibrate s | passes | model.safetensors |"
echo "|---|---|---|---|---|---|"
first=""
for r in $(seq 1 "$ROUNDS"); do
    for tag in A B; do
        b=$A; [ "$tag" = B ] && b=$B
        rm -rf "$T/out"
        printf '{"model":"%s","output":"%s","method":"gptq","bits":4,"group_size":128,"backend":"cpu","calibration":{"path":"%s","samples":%d,"seq_len":%d}}' \
            "$T/m" "$T/out" "$T/ids.json" "$S" "$L" > "$T/job.json"
        "$b/quantctl" quantize "$T/job.json" > "$T/log.txt" 2>&1 || { tail -5 "$T/log.txt" >&2; exit 1; }
        sha=$(sha256sum "$T/out/model.safetensors" | cut -c1-16)
        python3 - "$T/out/quantd_report.json" "$r" "$tag" "$sha" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); b = r["blocks"][0]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {b['seconds']:.1f} | {b['stages']['calibrate']:.2f} | {b['forward_passes']} | {sys.argv[4]} |")
PY
        [ -z "$first" ] && first=$sha
        [ "$sha" = "$first" ] || { echo "moe_capture.sh: run $r $tag wrote other bytes" >&2; exit 1; }
    done
done
