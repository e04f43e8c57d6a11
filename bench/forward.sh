#!/usr/bin/env bash
# Forward throughput of the model runtime on the CPU: the two real stories-sized models
# (perplexity windows of 512) and one generated 1B-shaped llama block (hidden 2048,
# intermediate 5632, 32 heads), with the fraction of OpenBLAS SGEMM peak.
#
#   bench/forward.sh [BUILD_DIR] [THREADS]     (defaults: build, 2)
#
# Needs a built libquant.a in BUILD_DIR and ../shared/data for the real models. Prints one
# JSON line per measurement; copy them into bench/results/forward.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
threads="${2:-2}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
bin="$build/forward_bench"

gcc -O2 -std=gnu11 -I"$root" -o "$bin" "$here/forward_bench.c" "$root/startup/runtime_env.c" \
    "$build/libquant.a" "$build/libqadmit.a" "$build/libqjob.a" "$build/libqformats.a" "$build/libqcore.a" \
    $(pkg-config --cflags --libs openblas lapacke libcjson libpcre2-8) -lpthread -lm

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) nproc=$(nproc) threads=$threads"
if [ -d "$data/models" ]; then
    for m in stories260K tiny-llama-c4; do
        "$bin" --model "$data/models/$m" --tokens "$data/goldens/$m.wikitext2.tokens.json" \
               --threads "$threads" --seq 512 --windows 64
    done
else
    echo "# $data absent: skipping the real models" >&2
fi
"$bin" --block --threads "$threads" --seq 512 --batch 4 --reps 3
"$bin" --block --threads "$threads" --seq 2048 --batch 1 --reps 2
