#!/usr/bin/env bash
# Algorithms 2 (naive) and 3 (TP-aware) of the seed paper (003) on its Llama-70B
# (8192, 28672, 8192) and Granite-20B (6144, 24576, 6144) MLP shapes, M = 1, 2, 4, 8, 16,
# TP = 1, 2, 4, 8 ranks emulated on one device (bench/tp_bench.c says what is measured and
# what is modelled). Prints one JSON line per point; bench/results/tp_aware.md holds a run.
#
#   bench/tp_aware.sh [--device cpu] [--m 1,2,4,8,16] [--reps 3] [--link-gbps 300]
#                     [--hop-us 2] [--hbm-gbps 3350]
# Only --device cpu exists today; the flag is there so a CUDA kernel can slot in later.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${TMPDIR:-/tmp}/tp_bench.$$"
gcc -O3 -march=native -std=gnu11 -I"$here/.." -o "$bin" "$here/tp_bench.c" "$here/../quant/core/clock.c" -lm
trap 'rm -f "$bin"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) nproc=$(nproc) args: $*"
for shape in 8192,28672,8192 6144,24576,6144; do
    "$bin" --shape "$shape" --tp 1,2,4,8 "$@"
done
