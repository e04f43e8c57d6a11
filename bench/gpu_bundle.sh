#!/usr/bin/env bash
# bench/gpu_bundle.sh: the programs bench/gpu.sh runs on a lent GPU machine, built here, with
# the shared libraries that machine lacks, in one archive to carry to it.
#
#   bench/gpu_bundle.sh [--out FILE] [--build DIR] [--arch N] [--from-build DIR]
#       defaults: --out build/gpu-bundle.tar.gz, --build build/gpu-bundle-build, --arch 90
#
# Why: the lent machines (the device tool's KINDS.md) run an image with the CUDA 13 toolkit,
# PyTorch, CMake and ninja but none of quantd's Debian libraries (OpenBLAS/LAPACKE, cJSON,
# hiredis, PCRE2), and reach no package registry, so quantd cannot be built there. A lease is
# 15 minutes of device time in all, machine start included: the build is done here instead.
#
# What: a Release build with CMAKE_CUDA_ARCHITECTURES=N (90: the H100 and H200, sm_90 machine
# code and compute_90 PTX), its programs linked with the RPATH $ORIGIN/../lib (DT_RPATH, so
# it also serves the libraries' own dependencies), and in the archive:
#   bin/quantctl, bin/test_backend_cuda, bin/kernel_bench, bin/quantd, bin/quantd-worker
#   redis/redis-server, redis/redis-cli
#              this machine's (from PATH, /usr/bin on Debian), for the parts step's throwaway
#              server: the lent machine has none. Packed as they are, without an RPATH, so
#              they sit apart from bin/ and gpu.sh runs them with LD_LIBRARY_PATH=lib
#   lib/       every library ldd resolves for them but glibc's, libstdc++/libgcc_s and CUDA's
#              own (cudart, cuBLAS/cuBLASLt, cuSOLVER, cuSPARSE, nvJitLink: the lent machine's
#              toolkit has those, for its own driver)
#   ptxas.log  bench/ptxas.sh's per-kernel report for sm_N (the build step's table)
#   MANIFEST   commit, date, host, nvcc, the newest glibc symbol needed, sha256 of each file
# bench/gpu.sh --bundle FILE unpacks it and runs these programs instead of building.
# --from-build DIR packs DIR's quantctl, tests/test_backend_cuda, and kernel_bench, quantd and
# quantd-worker (when there) as they are, and this machine's redis-server and redis-cli, with no build, no RPATH and no ptxas report: what test_gpu_dry_run
# uses to check the packing and gpu.sh's side of it on this machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="$root/build/gpu-bundle.tar.gz" build="$root/build/gpu-bundle-build" arch=90 from="" built=0
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "gpu_bundle.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --out) out=$2 ;;
        --build) build=$2 ;;
        --arch) arch=$2 ;;
        --from-build) from=$2 ;;
        *) echo "gpu_bundle.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
    shift 2
done
case "$arch" in ''|*[!0-9]*) echo "gpu_bundle.sh: --arch '$arch' is not a number like 90" >&2; exit 2 ;; esac

if [ -z "$from" ]; then
    command -v nvcc >/dev/null || { echo "gpu_bundle.sh: nvcc not found: the CUDA code cannot be built" >&2; exit 1; }
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQUANTD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DQUANTD_SANITIZE= -DQUANTD_FAULT_HOOKS=OFF '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' \
        -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags > /dev/null
    cmake --build "$build" -j"$(nproc)" --target quantctl test_backend_cuda quantd quantd-worker > "$build/bundle-build.log" 2>&1 \
        || { tail -30 "$build/bundle-build.log" >&2; echo "gpu_bundle.sh: the build failed ($build/bundle-build.log)" >&2; exit 1; }
    KERNELS_COMPILE_ONLY=1 KERNELS_LDFLAGS='-Wl,--disable-new-dtags,-rpath,$ORIGIN/../lib' \
        bash "$here/kernels.sh" "$build" > /dev/null
    from=$build built=1
fi
[ -x "$from/quantctl" ] || { echo "gpu_bundle.sh: $from has no quantctl" >&2; exit 1; }
[ -x "$from/tests/test_backend_cuda" ] || { echo "gpu_bundle.sh: $from has no tests/test_backend_cuda" >&2; exit 1; }
if [ "$built" = 1 ] && { [ ! -x "$from/quantd" ] || [ ! -x "$from/quantd-worker" ]; }; then
    echo "gpu_bundle.sh: the build made no quantd or quantd-worker" >&2; exit 1
fi
redis_server=$(command -v redis-server || true) redis_cli=$(command -v redis-cli || true)
[ -n "$redis_server" ] && [ -n "$redis_cli" ] \
    || { echo "gpu_bundle.sh: no redis-server or redis-cli here (apt-get install redis-server): the parts step needs them" >&2; exit 1; }

stage=$(mktemp -d "${TMPDIR:-/tmp}/quantd-bundle-XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/redis"
cp "$from/quantctl" "$from/tests/test_backend_cuda" "$stage/bin/"
for f in kernel_bench quantd quantd-worker; do [ ! -x "$from/$f" ] || cp "$from/$f" "$stage/bin/"; done
# Under their own names: Debian's redis-server is a link to redis-check-rdb, which serves
# when called redis-server.
cp -L "$redis_server" "$stage/redis/redis-server"
cp -L "$redis_cli" "$stage/redis/redis-cli"
# The libraries: what ldd resolves, less what every Linux or the lent machine's CUDA has.
ldd "$stage"/bin/* "$stage"/redis/* | awk '/=> \//{print $1, $3}' | sort -u | while read -r soname path; do
    case "$soname" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libutil.so.*|libresolv.so.*) ;;
        libstdc++.so.*|libgcc_s.so.*) ;;
        libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libcusolver.so.*|libcusparse.so.*|libnvJitLink.so.*) ;;
        *) [ -e "$stage/lib/$soname" ] || cp -L "$path" "$stage/lib/$soname" ;;
    esac
done
if ldd "$stage"/bin/* | grep -q "not found" || LD_LIBRARY_PATH="$stage/lib" ldd "$stage"/redis/* | grep -q "not found"; then
    { ldd "$stage"/bin/*; LD_LIBRARY_PATH="$stage/lib" ldd "$stage"/redis/*; } | grep "not found" >&2
    echo "gpu_bundle.sh: a library of the programs is not found here" >&2; exit 1
fi
if [ "$built" = 1 ]; then
    bash "$here/ptxas.sh" "$arch" "$stage/ptxas.log" || { echo "gpu_bundle.sh: the sm_$arch ptxas report failed ($stage/ptxas.log)" >&2; exit 1; }
fi
glibc=$(for f in "$stage"/bin/* "$stage"/redis/* "$stage"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
{
    echo "commit:  $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:    $(uname -n), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "nvcc:    $(command -v nvcc >/dev/null && nvcc --version | tail -1 || echo 'not found')"
    echo "from:    $from$( [ "$built" = 1 ] && echo " (Release, CUDA architectures $arch, RPATH \$ORIGIN/../lib)" || echo ' (packed as built)')"
    echo "needs:   $glibc or newer"
    echo "redis:   $("$redis_server" --version | cut -d' ' -f1-3) ($redis_server, $redis_cli; run with LD_LIBRARY_PATH=lib)"
    echo "files:"
    (cd "$stage" && find bin redis lib -type f | sort | xargs sha256sum | sed 's/^/  /')
} > "$stage/MANIFEST"
mkdir -p "$(dirname "$out")"
tar -czf "$out.tmp" -C "$stage" . && mv "$out.tmp" "$out"
echo "gpu_bundle.sh: $out ($(du -h "$out" | cut -f1)): $(cd "$stage" && echo bin/* redis/*), $(ls "$stage/lib" | wc -l) libraries, needs $glibc"
