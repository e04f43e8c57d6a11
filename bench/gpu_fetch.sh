#!/usr/bin/env bash
# bench/gpu_fetch.sh DIR [RESULTS]: puts what bench/gpu.sh --out left in DIR (the files a lent
# machine sent back: gpu-<date>-<device>.md and gpu-<date>-<device>-logs.tar.gz) into
# RESULTS (default bench/results), the logs unpacked into their folder beside the results
# file, as a run on this machine would have left them. A later `bench/gpu.sh` command,
# carried with the working tree, then adds to the same results file.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bench/gpu_fetch.sh DIR [RESULTS]" >&2; exit 2; }
src=$1
results=${2:-"$(cd "$(dirname "$0")" && pwd)/results"}
[ -d "$src" ] || { echo "gpu_fetch.sh: $src is not a folder" >&2; exit 2; }
mkdir -p "$results"
n=0
for md in "$src"/gpu-*.md; do
    [ -f "$md" ] || continue
    cp "$md" "$results/"
    echo "gpu_fetch.sh: $results/$(basename "$md")"
    n=$((n + 1))
done
for t in "$src"/gpu-*-logs.tar.gz; do
    [ -f "$t" ] || continue
    tar -xzf "$t" -C "$results"
    echo "gpu_fetch.sh: $results/$(basename "${t%-logs.tar.gz}")/ ($(tar -tzf "$t" | grep -vc '/$') files)"
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "gpu_fetch.sh: no gpu-*.md or gpu-*-logs.tar.gz in $src" >&2; exit 1; }
