#!/usr/bin/env bash
# quantd links no numeric library (docs/architecture.md, "Admission"): of the library it
# links libqadmit and what is below it, never libquant, so among the shared libraries it
# needs (readelf -d) there is no OpenBLAS, LAPACKE, BLAS, LAPACK, gfortran, PCRE2 or CUDA
# library. (A call of libquant's code from the daemon fails its link before this runs.) The
# test builds are where a libquant link shows: GCC on Debian links with --as-needed, which
# would drop the unused libraries, except when a sanitizer is on.
# Usage: test_daemon_link.sh [SOURCE_DIR]; the binary checked is $QUANTD_BUILD_DIR/quantd.
# Skips (77) where there is none, or no readelf.
set -u
build=${QUANTD_BUILD_DIR:-}
bin=$build/quantd
[ -n "$build" ] && [ -x "$bin" ] || { echo "SKIP: no quantd in QUANTD_BUILD_DIR (${build:-unset})"; exit 77; }
command -v readelf >/dev/null || { echo "SKIP: readelf needed"; exit 77; }
fails=0
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
[ -n "$needed" ] || { echo "FAIL: test_daemon_link: readelf found no NEEDED entry in $bin" >&2; exit 1; }
bad=$(printf '%s\n' "$needed" | grep -E '^lib(openblas|lapacke|lapack|blas|gfortran|pcre2|cuda|cudart|cublas|cublasLt|cusolver|cusparse|nvJitLink)[.-]')
if [ -n "$bad" ]; then
    echo "FAIL: test_daemon_link: $bin needs $(echo $bad) (it must link libqadmit, not libquant)" >&2
    fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "test_daemon_link: quantd needs $(echo $needed)"
exit $((fails > 0))
