#!/usr/bin/env bash
# bench/ptxas.sh ARCH LOG: compiles each CUDA source of quantd for sm_ARCH alone, with
# warnings as errors and ptxas's per-kernel report (registers, shared memory, stack, spills)
# appended to LOG, one "# SOURCE (sm_ARCH)" header per file. bench/gpu.sh's build step and
# bench/gpu_bundle.sh run it; bench/gpu_report.py ptxas turns LOG into a table.
# Exit status: 0 when every source compiled, 1 otherwise, 2 usage.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bench/ptxas.sh ARCH LOG" >&2; exit 2; }
arch=$1 log=$2
case "$arch" in ''|*[!0-9]*) echo "ptxas.sh: ARCH '$arch' is not a number like 90" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/quantd-ptxas-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
rc=0
: > "$log" || exit 1
for f in "$root"/quant/backend/cuda/*.cu "$root"/quant/kernels/cuda/*.cu; do
    echo "# $f (sm_$arch)" >> "$log"
    nvcc -O3 -std=c++17 -I"$root" -DQUANTD_HAVE_CUDA=1 -gencode "arch=compute_$arch,code=sm_$arch" \
        -Xptxas=-v -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Wno-sign-compare,-Werror \
        -c "$f" -o "$tmp/$(basename "$f").o" >> "$log" 2>&1 || rc=1
done
exit $rc
