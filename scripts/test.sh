#!/usr/bin/env bash
# The test command: installs missing Debian packages, builds with AddressSanitizer and
# UBSan, and runs every ctest (unit, integration with a real redis-server, golden tests on
# ../shared/data when present; GPU tests skip without a GPU; bench/gpu.sh --dry-run as
# test_gpu_dry_run). The fault hook is compiled in (QUANTD_FAULT_HOOKS) so test_worker can
# fake a device error.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
BUILD=${QUANTD_TEST_BUILD:-build/test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUANTD_SANITIZE=address,undefined \
      -DQUANTD_CUDA=${QUANTD_CUDA:-AUTO} -DQUANTD_FAULT_HOOKS=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
ctest --test-dir "$BUILD" --output-on-failure -j2 "$@"
