#!/usr/bin/env bash
# Dequantizing-kernel benchmark: packed 4-bit g128 gptq (plain, naive act-order, exllama
# reordered) and awq_gemm kernels on Llama-2-7B shapes (4096x4096, 4096x11008, 11008x4096)
# and Llama-2-70B MLP shapes (8192x28672, 28672x8192), batch 1..16, against cuBLAS FP16 on
# the GPU (CUDA events after warm-up, L2 flushed before each repetition, median) and against
# the device's measured copy bandwidth, plus the GPTQ time of a 4096x4096 and an 8192x28672
# layer on the GPU. bench/gpu.sh runs it as its bench step.
#
#   bench/kernels.sh [BUILD_DIR] [DEVICE] [SHAPES] [MAX_BATCH] [REPS]
#     defaults: build  cuda:0 if a GPU is visible else cpu  all (GPU) / small (CPU)  16  100
#
# BUILD_DIR must hold libquant.a; a CUDA build (-DQUANTD_CUDA=ON) is needed for cuda:N.
# Prints one JSON line per measurement; copy them into bench/results/kernels.md.
# KERNELS_BIN=FILE runs that kernel_bench, built before (bench/gpu_bundle.sh's, on a machine
# that cannot build it), instead of compiling one; BUILD_DIR then only needs quantctl.
# KERNELS_LDFLAGS adds link flags to the compile (gpu_bundle.sh's RPATH).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
lib="$build/libquant.a"
if [ -n "${KERNELS_BIN:-}" ]; then
    [ -x "$KERNELS_BIN" ] || { echo "kernels.sh: KERNELS_BIN $KERNELS_BIN is not a program" >&2; exit 2; }
    bin=$KERNELS_BIN
    have_cuda=1
else
    [ -f "$lib" ] || { echo "kernels.sh: $lib not found (build libquant first)" >&2; exit 2; }
    cuda_home="${CUDA_HOME:-/usr/local/cuda}"
    bin="$build/kernel_bench"
    cflags=(-O2 -std=gnu11 -Wall -Werror -I"$root")
    libs=("$lib" "$build/libqadmit.a" "$build/libqjob.a" "$build/libqformats.a" "$build/libqcore.a"
           $(pkg-config --cflags --libs openblas lapacke libcjson libpcre2-8) -lpthread -lm)
    # A sanitized libquant (the test build) needs the same sanitizers at link time.
    san=$(sed -n 's/^QUANTD_SANITIZE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)
    [ -z "$san" ] || cflags+=(-fsanitize="$san")
    if nm -C "$lib" 2>/dev/null | grep -q " T qd_kcuda_matmul"; then
        cflags+=(-DQUANTD_HAVE_CUDA=1 -I"$cuda_home/include")
        libs+=(-L"$cuda_home/lib64" -lcublas -lcusolver -lcudart -lstdc++ -Wl,-rpath,"$cuda_home/lib64")
        have_cuda=1
    else
        have_cuda=0
    fi
    gcc "${cflags[@]}" -o "$bin" "$here/kernel_bench.c" "$root/startup/runtime_env.c" "${libs[@]}" ${KERNELS_LDFLAGS:-}
fi
# bench/gpu.sh --dry-run only checks that the benchmark still compiles.
[ "${KERNELS_COMPILE_ONLY:-0}" = 1 ] && { echo "kernels.sh: compiled $bin"; exit 0; }

device="${2:-}"
if [ -z "$device" ]; then
    if [ "$have_cuda" = 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        device=cuda:0
    else
        device=cpu
    fi
fi
if [ "$device" = cpu ]; then shapes="${3:-small}"; else shapes="${3:-all}"; fi
max_batch="${4:-16}"
reps="${5:-100}"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) device=$device shapes=$shapes max_batch=$max_batch reps=$reps"
if [ "$device" = cpu ]; then
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) nproc=$(nproc)"
else
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
    "$build/quantctl" selftest --device "$device" --quick 2>/dev/null || true
fi
extra=()
[ "$device" != cpu ] && extra+=(--gptq)
"$bin" --device "$device" --shapes "$shapes" --max-batch "$max_batch" --reps "$reps" "${extra[@]}"
