# Sourced by the quantctl end-to-end tests: $Q (the quantctl under test, from
# QUANTD_BUILD_DIR), skips (exit 77) without it or python3, a temporary directory $T removed
# on exit, fail() counting failures into $fails, and pin_blas_kernel for byte-exact sums.
Q="${QUANTD_BUILD_DIR:?QUANTD_BUILD_DIR must point at the build directory}/quantctl"
[ -x "$Q" ] || { echo "SKIP: $Q not built"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 needed to read quantctl's JSON output"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# pin_blas_kernel: for tests that compare output bytes with sums written on another machine.
# OpenBLAS picks its GEMM kernel per CPU, and the kernels sum in different orders, so the
# block forward's activations differ in their last bits from one CPU to another (AWQ's
# folded norms carry them into the output). Pinned to the Haswell kernel (AVX2 + FMA: every
# x86-64 machine we run on), the bytes are the same everywhere. Skips (77) where it cannot.
pin_blas_kernel() {
    if [ "$(uname -m)" != x86_64 ] || ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
        echo "SKIP: byte-exact sums need OpenBLAS's Haswell kernel (x86-64 with AVX2 and FMA)"; exit 77
    fi
    export OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1
}
