#!/usr/bin/env bash
# The demo: quantizes a generated 1024x1024 linear layer with GPTQ (4 bits, group 128,
# act-order) and with RTN, packs both as GPTQ checkpoints, and prints their reports.
set -euo pipefail
BUILD=${1:-build/release}
Q="$BUILD/quantctl"
OUT=${QUANTD_DEMO_DIR:-$(mktemp -d /tmp/quantd-demo-XXXXXX)}
"$Q" gen-layer --n 1024 --k 1024 --rows 2048 --seed 1 --out "$OUT"
echo "== GPTQ w4 g128 act-order"
"$Q" layer --weight "$OUT/W.safetensors" --inputs "$OUT/X.safetensors" --method gptq --bits 4 \
     --group-size 128 --sym --desc-act --format gptq --out "$OUT/gptq.safetensors" | tail -n 1
echo "== RTN w4 g128"
"$Q" layer --weight "$OUT/W.safetensors" --inputs "$OUT/X.safetensors" --method rtn --bits 4 \
     --group-size 128 --sym --format gptq --out "$OUT/rtn.safetensors" | tail -n 1
echo "outputs in $OUT"
