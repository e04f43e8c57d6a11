#!/usr/bin/env bash
# bench/gpu.sh: everything the first GPU minutes should run, as one command (issue #20).
#
#   bench/gpu.sh [--lease] [--dry-run] [--steps build,test,sanitize,selftest,bench,moe,job,parts]
#                [--bundle FILE] [--budget SECONDS] [--build DIR] [--reuse-build DIR]
#                [--results DIR] [--out DIR] [--device cuda:N] [--job-blocks N]
#                [--job-samples N] [--agree-blocks N] [--agree-samples N] [--agree-seq N]
#                [--moe-blocks N] [--moe-hidden N] [--moe-samples N] [--moe-seq N] [--reps N]
#                [--parts-samples N] [--parts-seq N]
#
# On a lent machine of the device tool, one command (made for its 15 minutes of device time,
# machine start included, and its 8 files back from $OUT):
#   bench/gpu_bundle.sh                        # here, first: build/gpu-bundle.tar.gz
#   bench/gpu.sh --lease --out "$OUT"          # there, carrying build/gpu-bundle.tar.gz
# --lease is --bundle build/gpu-bundle.tar.gz --budget 480 --steps
# build,test,selftest,bench,moe,job,parts,sanitize --job-blocks 2 --agree-blocks 1 --agree-samples 8
# --moe-blocks 1 --moe-samples 8 --parts-samples 8 --reps 50; options after it override it.
#
# Steps (each timed; a failure is recorded and the later steps still run; they run in the
# order --steps names them):
#   build     Release build for this GPU's architecture (CMAKE_CUDA_ARCHITECTURES=native,
#             falling back to 90), and ptxas's per-kernel registers / shared memory / spills;
#             with --bundle, no build: the bundle's programs and its ptxas report
#   test      ctest -L gpu (with --bundle: the bundle's test_backend_cuda)
#   sanitize  test_backend_cuda under compute-sanitizer memcheck and racecheck (the
#             shared-memory kernels: GEMV, WMMA GEMM, GPTQ block, norms, attention,
#             reductions all run in it), and memcheck on the quick self-test
#   selftest  quantctl selftest --device cuda:N (full)
#   bench     bench/kernels.sh: 7B and 70B-MLP shapes, batch 1..16, L2 flushed between
#             repetitions, CUDA events, median; against cuBLAS FP16 and the copy bandwidth
#   moe       an MoE-shaped job (gen-model --experts 8 --top-k 2: --moe-blocks Mixtral-style
#             blocks of --moe-hidden, experts 3.5x as wide, head dim 64, 4 query heads per KV
#             head; calibration --moe-samples x --moe-seq), "compute": "f32", on CUDA and on
#             the CPU: seconds per block on each and the per-layer error difference, experts'
#             layers included. Small (default 2 blocks of 1024 at 16 x 512; --lease 1 block at
#             8 x 512), so it fits the budget before the 7B-shaped job.
#   job       a 7B-shaped synthetic job (--job-blocks blocks of Llama-2-7B shape, calibration
#             --job-samples x 2048, a bfloat16 checkpoint) on CUDA with "compute": "f32":
#             seconds per block and per stage, peak GPU memory; the same job with the
#             default compute, auto (bf16 on the tensor cores at compute capability 8.0+,
#             the report's compute says which ran); then CPU vs CUDA
#             agreement: --agree-blocks blocks at --agree-samples x --agree-seq on both
#             backends (per-layer error difference) and perplexity of a tiny model on both
#   parts     the parallel path (docs/parallel.md): one 7B-shaped block (GPTQ w4 g128,
#             calibration --parts-samples x --parts-seq, default 16 x 512) through quantd
#             on a throwaway redis-server (the bundle's with --bundle), with one worker on
#             the device (--workers cuda:N) and with two on it (cuda:N*2): the block's
#             seconds per stage from each report, the parts each worker ran, peak GPU
#             memory, that both model.safetensors are the same bytes, and from the
#             two-worker run's part costs Llama-3-70B's block projected over 8 and 16
#             workers (bench/parts_project.py)
# Results: RESULTS/gpu-<date>-<device>.md with a summary table on top, raw logs in
# RESULTS/gpu-<date>-<device>/ (RESULTS defaults to bench/results). Several invocations on
# the same day and device add to the same file (a step run again replaces its section), so
# the run can be split into several commands (a later command on a fresh machine rebuilds
# first when the build is missing):
#   bench/gpu.sh --steps build,test;  bench/gpu.sh --steps selftest,bench;  bench/gpu.sh --steps job
# --out DIR copies the results file there and the raw logs as one archive,
# gpu-<date>-<device>-logs.tar.gz (two files: a lent machine sends back at most 8);
# bench/gpu_fetch.sh unpacks them into bench/results/.
# --bundle FILE runs the programs of bench/gpu_bundle.sh's archive (built elsewhere, with the
# libraries a lent machine lacks) instead of building; the machine's CUDA libraries are
# looked for where ld.so finds them, then in the CUDA toolkit's and pip's nvidia folders.
# --budget SECONDS ends the run within that many seconds: each long command is bounded by
# what is left, and a step that would start with under 30 seconds left is recorded as
# skipped for the budget (the summary is still written). The budget is kept on the clock
# `date +%s`, or, where QUANTD_GPU_CLOCK_FILE names a file, on the seconds that file holds
# (test_gpu_dry_run moves them by hand, so the budget's arithmetic is tested without
# waiting for real seconds).
#
# --dry-run (or no GPU visible) runs what needs no GPU: the sm_90 compile with the ptxas
# report and the CPU halves of the moe step (one block of 256 at 4 x 128) and the job step
# (default: one block at 8 x 256 tokens), the parts step's comparison on CPU workers
# (cpu:1 vs cpu:2 of one thread each, one block of hidden 256 and MLP 2304 at 4 x 128), and
# records every GPU step as skipped with the reason. With --reuse-build DIR the dry run
# takes quantctl from DIR (an existing build) and compiles only the CUDA sources for the
# report, which is what CI does (tests/integration/test_gpu_dry_run.sh).
#
# Exit status: 0 when no step failed (skipped steps are not failures), 1 otherwise, 2 usage.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
here="$root/bench"

usage() { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" | sed 's/^# \{0,1\}//'; }

all_steps="build test sanitize selftest bench moe job parts"
dry=0 steps="build,test,sanitize,selftest,bench,moe,job,parts" build="" reuse="" results="$root/bench/results" outdir=""
device="cuda:0" job_blocks=4 job_samples=128 agree_blocks="" agree_samples="" agree_seq="" reps=100
moe_blocks="" moe_hidden="" moe_samples="" moe_seq="" parts_samples="" parts_seq=""
bundle="" budget=0 lease=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1; shift; continue ;;
        --lease)
            lease=1 steps="build,test,selftest,bench,moe,job,parts,sanitize" budget=480 job_blocks=2 agree_blocks=1 agree_samples=8 reps=50
            moe_blocks=1 moe_samples=8 parts_samples=8
            shift; continue ;;
        -h|--help) usage; exit 0 ;;
    esac
    [ $# -ge 2 ] || { echo "gpu.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --steps) steps=$2 ;;
        --build) build=$2 ;;
        --reuse-build) reuse=$2 ;;
        --results) results=$2 ;;
        --out) outdir=$2 ;;
        --device) device=$2 ;;
        --job-blocks) job_blocks=$2 ;;
        --job-samples) job_samples=$2 ;;
        --agree-blocks) agree_blocks=$2 ;;
        --agree-samples) agree_samples=$2 ;;
        --agree-seq) agree_seq=$2 ;;
        --reps) reps=$2 ;;
        --moe-blocks) moe_blocks=$2 ;;
        --moe-hidden) moe_hidden=$2 ;;
        --moe-samples) moe_samples=$2 ;;
        --moe-seq) moe_seq=$2 ;;
        --parts-samples) parts_samples=$2 ;;
        --parts-seq) parts_seq=$2 ;;
        --bundle) bundle=$2 ;;
        --budget) budget=$2 ;;
        *) echo "gpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift 2
done
for s in ${steps//,/ }; do
    case " $all_steps " in *" $s "*) ;; *) echo "gpu.sh: --steps: '$s' is not one of ${all_steps// /, }" >&2; exit 2 ;; esac
done
[ "$lease" = 0 ] || [ -n "$bundle" ] || bundle="$root/build/gpu-bundle.tar.gz"
case "$budget" in ''|*[!0-9]*) echo "gpu.sh: --budget '$budget' is not a number of seconds" >&2; exit 2 ;; esac
if [ -n "$bundle" ]; then
    [ -f "$bundle" ] || { echo "gpu.sh: --bundle $bundle not found (make it with bench/gpu_bundle.sh, and carry it)" >&2; exit 2; }
    [ -z "$reuse" ] || { echo "gpu.sh: --bundle and --reuse-build exclude each other" >&2; exit 2; }
    bundle=$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")
fi
# The agreement run's defaults: 2 blocks at 16 x 2048 on a GPU machine (the CPU half fits the
# time budget on 16 cores); one block at 8 x 256 without a GPU (the dry run, CI).
if [ "$dry" = 1 ]; then d_blocks=1 d_samples=8 d_seq=256; else d_blocks=2 d_samples=16 d_seq=2048; fi
agree_blocks=${agree_blocks:-$d_blocks} agree_samples=${agree_samples:-$d_samples} agree_seq=${agree_seq:-$d_seq}
# The MoE step's: 2 blocks of hidden 1024 at 16 x 512 on a GPU machine, one of 256 at 4 x 128 without.
if [ "$dry" = 1 ]; then d_blocks=1 d_hidden=256 d_samples=4 d_seq=128; else d_blocks=2 d_hidden=1024 d_samples=16 d_seq=512; fi
moe_blocks=${moe_blocks:-$d_blocks} moe_hidden=${moe_hidden:-$d_hidden} moe_samples=${moe_samples:-$d_samples} moe_seq=${moe_seq:-$d_seq}
# The parts step's: 16 x 512 on a GPU machine, 4 x 128 without (its CPU half, on a tiny block).
if [ "$dry" = 1 ]; then d_samples=4 d_seq=128; else d_samples=16 d_seq=512; fi
parts_samples=${parts_samples:-$d_samples} parts_seq=${parts_seq:-$d_seq}
for v in "$job_blocks" "$job_samples" "$agree_blocks" "$agree_samples" "$agree_seq" "$reps" \
         "$moe_blocks" "$moe_hidden" "$moe_samples" "$moe_seq" "$parts_samples" "$parts_seq"; do
    case "$v" in ''|*[!0-9]*) echo "gpu.sh: '$v' is not a positive number" >&2; exit 2 ;; esac
    [ "$v" -gt 0 ] || { echo "gpu.sh: counts must be positive" >&2; exit 2; }
done
[ $((moe_hidden % 256)) = 0 ] || { echo "gpu.sh: --moe-hidden $moe_hidden is not a multiple of 256 (64-wide heads, 4 per KV head)" >&2; exit 2; }
case "$device" in cuda:[0-9]*) ;; *) echo "gpu.sh: --device '$device' is not cuda:N" >&2; exit 2 ;; esac
[ -z "$reuse" ] || [ -x "$reuse/quantctl" ] || { echo "gpu.sh: --reuse-build $reuse has no quantctl" >&2; exit 2; }
command -v python3 >/dev/null || { echo "gpu.sh: python3 is needed for the reports" >&2; exit 2; }

# The budget's clock (see --budget): real seconds, or the ones a test sets.
clock_s() { if [ -n "${QUANTD_GPU_CLOCK_FILE:-}" ]; then cat "$QUANTD_GPU_CLOCK_FILE"; else date +%s; fi; }
t_start=$(clock_s)
# ---- the machine ------------------------------------------------------------------------
gpu=0 why_skip=""
devnum=${device#cuda:}
if [ "$dry" = 1 ]; then
    why_skip="dry run (--dry-run)"
elif ! command -v nvidia-smi >/dev/null; then
    why_skip="no GPU visible (nvidia-smi not found)"
elif ! nvidia-smi -L 2>/dev/null | grep -q "^GPU $devnum:"; then
    why_skip="no GPU visible ($device not listed by nvidia-smi -L)"
else
    gpu=1
fi
if [ "$gpu" = 1 ]; then
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$devnum" | head -1)
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i "$devnum" 2>/dev/null | head -1 | tr -d '. ')
    slug=$(echo "$gpu_name" | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/[^a-z0-9]\{1,\}/-/g; s/-$//')
else
    gpu_name="none" cc="" slug="dryrun"
fi
arch=${cc:-90}
case "$arch" in *[!0-9]*|'') arch=90 ;; esac
[ "$gpu" = 1 ] || arch=90
[ -n "$build" ] || build="$root/build/gpu-release"
day=$(date -u +%Y-%m-%d)
name="gpu-$day-$slug"
mkdir -p "$results" || exit 2
results=$(cd "$results" && pwd)
L="$results/$name"
mkdir -p "$L"
md="$results/$name.md"
W=$(mktemp -d "${TMPDIR:-/tmp}/quantd-gpu-XXXXXX")
trap 'rm -rf "$W"' EXIT
ncpu=$(nproc 2>/dev/null || echo 2)
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$ncpu}

# ---- the bundle: programs built elsewhere -----------------------------------------------------
# Unpacked into the scratch folder; where ld.so does not find a CUDA library its programs
# need, the CUDA toolkit's and pip's nvidia folders go on LD_LIBRARY_PATH (the bundle's own
# libraries come through its RPATH, so nothing of it reaches other programs).
bundle_note=""
if [ -n "$bundle" ]; then
    mkdir -p "$W/bundle" && tar -xzf "$bundle" -C "$W/bundle" || { echo "gpu.sh: cannot unpack $bundle" >&2; exit 2; }
    missing() {
        { ldd "$W"/bundle/bin/*; [ ! -d "$W/bundle/redis" ] || LD_LIBRARY_PATH="$W/bundle/lib" ldd "$W"/bundle/redis/*; } 2>/dev/null \
            | awk '/not found/{print $1}' | sort -u | xargs
    }
    miss=$(missing)
    if [ -n "$miss" ]; then
        extra=""
        for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
                 $(python3 -c 'import glob, os, nvidia; [print(d) for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))]' 2>/dev/null); do
            [ -d "$d" ] && extra="${extra:+$extra:}$d"
        done
        export LD_LIBRARY_PATH="$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        bundle_note="LD_LIBRARY_PATH=$extra (ld.so alone missed: $miss)"
        miss=$(missing)
    fi
    [ -z "$miss" ] || bundle_note="${bundle_note:+$bundle_note; }still not found: $miss (every step that runs them fails)"
fi

# ---- the time budget ----------------------------------------------------------------------------
# left: seconds of --budget left (a large number without one); tlimit N: N, or less to end
# 20 s before the budget (what writing the summary needs), at least 1.
left() { if [ "$budget" -gt 0 ]; then echo $((t_start + budget - $(clock_s))); else echo 1000000; fi; }
tlimit() { local l; l=$(( $(left) - 20 )); [ "$l" -lt "$1" ] || l=$1; [ "$l" -ge 1 ] || l=1; echo "$l"; }

{
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:     $(uname -n), $ncpu CPUs, $(uname -sr)"
    echo "gpu:      $gpu_name${cc:+ (compute capability ${cc:0:1}.${cc:1})}"
    echo "driver:   $( [ "$gpu" = 1 ] && nvidia-smi --query-gpu=driver_version --format=csv,noheader -i "$devnum" | head -1 || echo -)"
    echo "nvcc:     $(command -v nvcc >/dev/null && nvcc --version | tail -1 || echo 'not found')"
    echo "commit:   $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "os:       $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version 2>/dev/null | head -1)"
    if [ -n "$bundle" ]; then
        echo "bundle:   $(basename "$bundle"), built $(sed -n 's/^date: *//p' "$W/bundle/MANIFEST") at $(sed -n 's/^commit: *//p' "$W/bundle/MANIFEST")" \
             "on $(sed -n 's/^host: *//p' "$W/bundle/MANIFEST"); needs $(sed -n 's/^needs: *//p' "$W/bundle/MANIFEST")"
        [ -z "$bundle_note" ] || echo "          $bundle_note"
    fi
    [ "$budget" = 0 ] || echo "budget:   ${budget} s"
} > "$L/machine.txt"
# Every invocation that added to this results file, in order.
echo "$(date -u +%H:%M:%SZ)  bench/gpu.sh $( [ "$dry" = 1 ] && echo '--dry-run ')$( [ -n "$bundle" ] && echo "--bundle $(basename "$bundle") ")$( [ "$budget" = 0 ] || echo "--budget $budget ")--steps $steps" >> "$L/runs.txt"

# ---- step bookkeeping ---------------------------------------------------------------------
failed=0
now() { date +%s.%N; }
# run_step NAME FUNCTION: runs it in a subshell; 0 pass, 77 skipped (reason in $L/NAME.note),
# 78 passed what it could without a GPU, anything else fail (reason in $L/NAME.note).
run_step() {
    local step=$1 fn=$2 t0 rc secs note status
    rm -f "$L/$step.note" "$L/headline-$step.tsv" "$L/$step"-*.md
    echo "== $step"
    t0=$(now)
    if [ "$(left)" -lt 30 ]; then
        echo "not started: $(left) s of the --budget of $budget s were left" > "$L/$step.note"; rc=77
    else
        ( "$fn" ); rc=$?
    fi
    secs=$(python3 -c "print('%.1f' % ($(now) - $t0))")
    note=$(sed 's/\t/ /g' "$L/$step.note" 2>/dev/null | paste -sd';' - | sed 's/;/; /g')
    case $rc in
        0) status=pass ;;
        77) status=skipped ;;
        78) status="pass (CPU half only)" ;;
        *) status=FAIL; failed=1; [ -n "$note" ] || note="exit $rc (see $name/$step*.log)" ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$step" "$status" "$secs" "$note" "$(date -u +%H:%M:%S)" >> "$L/steps.tsv"
    echo "   $status in ${secs}s${note:+: $note}"
}
note() { echo "$*" >> "$L/$step_name.note"; }
skip() { note "$*"; exit 77; }
fail() { note "$*"; exit 1; }
qbin() { if [ -n "$bundle" ]; then echo "$W/bundle/bin"; elif [ -n "$reuse" ]; then echo "$reuse"; else echo "$build"; fi; }
tbin() { if [ -n "$bundle" ]; then echo "$W/bundle/bin/test_backend_cuda"; else echo "$build/tests/test_backend_cuda"; fi; }

# Timestamps each line (the job's progress lines become per-stage seconds).
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }

ensure_build() {   # the GPU steps need the Release build; build it when a fresh machine lacks it
    [ -x "$(qbin)/quantctl" ] && [ -x "$(tbin)" ] && return 0
    [ -z "$bundle" ] || fail "the bundle lacks quantctl or test_backend_cuda"
    echo "   (no build in $build: running the build step first)"
    ( step_name=build; run_step build step_build )
    [ -x "$build/quantctl" ] || fail "the build this step needs failed (see build.log)"
}

# ---- build ----------------------------------------------------------------------------------
ptxas_report() {   # compiles each CUDA source for sm_$arch with ptxas -v (bench/ptxas.sh)
    local rc=0
    bash "$here/ptxas.sh" "$arch" "$L/ptxas.log" || rc=1
    python3 "$here/gpu_report.py" ptxas "$L/ptxas.log" "$L/build-2-ptxas.md" || rc=1
    return $rc
}

step_build() {
    if [ -n "$bundle" ]; then
        { echo "No build here: the programs come from \`$(basename "$bundle")\` (bench/gpu_bundle.sh), whose MANIFEST says:"
          echo; echo '```'; sed -n '/^files:/q;p' "$W/bundle/MANIFEST"; echo '```'
          [ -z "$bundle_note" ] || { echo; echo "Libraries: $bundle_note."; }; } > "$L/build-1-how.md"
        if [ -f "$W/bundle/ptxas.log" ]; then
            cp "$W/bundle/ptxas.log" "$L/ptxas.log"
            python3 "$here/gpu_report.py" ptxas "$L/ptxas.log" "$L/build-2-ptxas.md" || fail "the bundle's ptxas report could not be read"
        else
            echo "The bundle has no ptxas report (packed with --from-build)." >> "$L/build-1-how.md"
        fi
        [ ! -f "$L/build-2-ptxas.md" ] || ! grep -q "\*\*spills\*\*" "$L/build-2-ptxas.md" || note "some kernels spill registers (see the ptxas table)"
        [[ "$bundle_note" != *"still not found"* ]] || fail "$bundle_note"
        return 0
    fi
    command -v nvcc >/dev/null || fail "nvcc not found: the CUDA code cannot be built here"
    if [ -n "$reuse" ] && [ "$gpu" = 0 ]; then
        echo "Dry run with --reuse-build: the programs come from \`$reuse\`; the CUDA sources were compiled" \
             "for sm_$arch alone, with warnings as errors, for the ptxas report." > "$L/build-1-how.md"
    else
        local archs=native fallback=""
        [ "$gpu" = 1 ] || archs=90
        if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQUANTD_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=$archs -DQUANTD_CUDA_PTXAS_REPORT=ON > "$L/configure.log" 2>&1; then
            [ "$archs" = native ] || fail "cmake configure failed (configure.log; a machine without quantd's libraries, as a lent one: bench/gpu_bundle.sh on a machine that has them, then --bundle or --lease here)"
            fallback=" (native failed, see configure.log; fell back to 90)"
            rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
            cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQUANTD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
                -DQUANTD_CUDA_PTXAS_REPORT=ON >> "$L/configure.log" 2>&1 || fail "cmake configure failed (configure.log; a machine without quantd's libraries, as a lent one: bench/gpu_bundle.sh on a machine that has them, then --bundle or --lease here)"
            arch=90
        fi
        cmake --build "$build" -j"$ncpu" > "$L/build.log" 2>&1 || fail "build failed (build.log)"
        echo "Release build in \`$build\`, CUDA architectures \`$archs\`$fallback; \`build.log\` keeps ptxas's" \
             "report as the build printed it." > "$L/build-1-how.md"
    fi
    ptxas_report || fail "the sm_$arch compile or its ptxas report failed (ptxas.log)"
    grep -q "\*\*spills\*\*" "$L/build-2-ptxas.md" && note "some kernels spill registers (see the ptxas table)"
    return 0
}

# ---- GPU tests ------------------------------------------------------------------------------
# sanitize NAME SECONDS ARGS...: one compute-sanitizer run into test-NAME.log.
sanitize() {
    local name=$1 secs=$2 rc; shift 2
    timeout "$secs" "$cs" --error-exitcode 3 "$@" > "$L/test-$name.log" 2>&1; rc=$?
    case $rc in
        0) return 0 ;;
        124) note "compute-sanitizer $name timed out after ${secs}s (test-$name.log)" ;;
        3) note "compute-sanitizer $name reported errors (test-$name.log)" ;;
        *) note "compute-sanitizer $name: the program failed with exit $rc (test-$name.log)" ;;
    esac
    return 1
}
step_test() {
    [ "$gpu" = 1 ] || skip "$why_skip"
    ensure_build
    local rc=0 r
    if [ -n "$bundle" ]; then
        # No ctest tree here: the one GPU test, run as ctest would (exit 77: skipped).
        timeout "$(tlimit 600)" "$(tbin)" > "$L/test-ctest.log" 2>&1; r=$?
        case $r in
            0) echo "100% tests passed, 0 tests failed out of 1 (test_backend_cuda from the bundle)" >> "$L/test-ctest.log" ;;
            77) rc=1; note "a GPU test skipped although $device is visible" ;;
            124) rc=1; note "test_backend_cuda timed out (test-ctest.log)" ;;
            *) rc=1; note "test_backend_cuda failed with exit $r"
               echo "0% tests passed, 1 tests failed out of 1 (test_backend_cuda from the bundle)" >> "$L/test-ctest.log" ;;
        esac
    else
        timeout "$(tlimit 900)" ctest --test-dir "$build" -L gpu --output-on-failure > "$L/test-ctest.log" 2>&1 || { rc=1; note "ctest -L gpu failed"; }
        if grep -q "No tests were found" "$L/test-ctest.log"; then rc=1; note "no test carries the gpu label"; fi
        if grep -qE "\*\*\*Skipped|Not Run" "$L/test-ctest.log"; then rc=1; note "a GPU test skipped although $device is visible"; fi
    fi
    {
        echo "| check | result |"
        echo "|---|---|"
        echo "| ctest -L gpu | $(grep -E 'tests passed|tests failed' "$L/test-ctest.log" | tail -1) |"
    } > "$L/test-1-results.md"
    return $rc
}

step_sanitize() {
    [ "$gpu" = 1 ] || skip "$why_skip"
    ensure_build
    local rc=0 t
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)   # global: sanitize() reads it
    [ -x "$cs" ] || fail "compute-sanitizer not found"
    # Each bounded (and by the budget): a timeout is reported as such.
    sanitize memcheck "$(tlimit 240)" --tool memcheck --leak-check full "$(tbin)" || rc=1
    sanitize racecheck "$(tlimit 240)" --tool racecheck "$(tbin)" || rc=1
    sanitize memcheck-selftest "$(tlimit 120)" --tool memcheck "$(qbin)/quantctl" selftest --device "$device" --quick || rc=1
    {
        echo "| check | result |"
        echo "|---|---|"
        for t in memcheck racecheck memcheck-selftest; do
            [ -f "$L/test-$t.log" ] && echo "| compute-sanitizer $t | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/test-$t.log" | tail -1) |"
        done
    } > "$L/sanitize-1-results.md"
    return $rc
}

# ---- self-test ----------------------------------------------------------------------------------
step_selftest() {
    [ "$gpu" = 1 ] || skip "$why_skip"
    ensure_build
    local rc=0
    timeout "$(tlimit 900)" "$(qbin)/quantctl" selftest --device "$device" > "$L/selftest.log" 2>&1 || rc=1
    local last
    last=$(grep -E "^selftest " "$L/selftest.log" | tail -1)
    { echo '```'; echo "${last:-no summary line (see selftest.log)}"; grep -m5 MISMATCH "$L/selftest.log"; echo '```'; } \
        > "$L/selftest-1-summary.md"
    [ -n "$last" ] || last="selftest not measured (no summary line)"
    printf 'kernel self-test (full)\t%s\t0 failures\t%s\n' "${last#selftest }" "$([ $rc = 0 ] && echo yes || echo no)" \
        > "$L/headline-selftest.tsv"
    [ $rc = 0 ] || fail "kernel cases failed or the self-test could not run (selftest.log)"
}

# ---- kernel benchmark ---------------------------------------------------------------------------
step_bench() {
    if [ "$gpu" = 0 ]; then
        # Keep the benchmark compiling: build it against the library the other steps use.
        [ -f "$(qbin)/libquant.a" ] || skip "$why_skip"
        KERNELS_COMPILE_ONLY=1 bash "$here/kernels.sh" "$(qbin)" > "$L/bench-compile.log" 2>&1 \
            || fail "bench/kernel_bench.c no longer compiles (bench-compile.log)"
        skip "$why_skip; kernel_bench compiled, not run"
    fi
    ensure_build
    local kb=""; [ -z "$bundle" ] || kb="$(qbin)/kernel_bench"
    KERNELS_BIN=$kb timeout "$(tlimit 900)" bash "$here/kernels.sh" "$(qbin)" "$device" all 16 "$reps" > "$L/bench-kernels.jsonl" 2> "$L/bench-kernels.log" \
        || { note "kernels.sh failed (bench-kernels.log)"; }
    python3 "$here/gpu_report.py" kernels "$L/bench-kernels.jsonl" "$L/bench-1-kernels.md" "$L/headline-bench.tsv" \
        || fail "no batch-1 measurement (bench-kernels.log)"
    [ ! -s "$L/bench.note" ] || exit 1
}

# ---- the 7B-shaped job, and CPU vs CUDA -------------------------------------------------------
gen_7b() {   # gen_7b DIR LAYERS [DTYPE, default f16]
    "$Q" gen-model --out "$1" --layers "$2" --hidden 4096 --intermediate 11008 --heads 32 --kv-heads 32 \
        --max-pos 4096 --vocab 512 --dtype "${3:-f16}" --seed 7 > /dev/null
}
gen_ids() {  # gen_ids FILE COUNT VOCAB
    python3 -c "import json,random,sys; random.seed(0); json.dump({'tokens':[random.randrange($3) for _ in range($2)]}, open(sys.argv[1],'w'))" "$1"
}
# run_job LABEL MODEL IDS SAMPLES SEQ BACKEND [EXTRA]: quantizes (GPTQ w4 g128) into
# $W/out-LABEL; EXTRA is more job keys (', "compute": "bf16"').
run_job() {
    local label=$1 model=$2 ids=$3 samples=$4 seq=$5 be=$6 extra=${7:-} mon=""
    local bk=cpu; [ "$be" = cpu ] || bk=cuda
    echo "{\"model\": \"$model\", \"output\": \"$W/out-$label\", \"method\": \"gptq\", \"bits\": 4, \"group_size\": 128," \
         "\"backend\": \"$bk\", \"calibration\": {\"path\": \"$ids\", \"samples\": $samples, \"seq_len\": $seq}$extra}" > "$W/$label.json"
    cp "$W/$label.json" "$L/job-$label.json"
    : > "$L/job-$label-gpumem.log"
    if [ "$bk" = cuda ]; then
        ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$devnum" 2>/dev/null; sleep 0.5; done ) \
            > "$L/job-$label-gpumem.log" & mon=$!
    fi
    timeout "$(tlimit 1800)" "$Q" quantize "$W/$label.json" --backend "$be" 2>&1 | stamp > "$L/job-$label.log"
    local rc=${PIPESTATUS[0]}
    [ -z "$mon" ] || kill "$mon" 2>/dev/null
    cp "$W/out-$label/quantd_report.json" "$L/job-$label-report.json" 2>/dev/null
    return "$rc"
}

# ---- an MoE-shaped job, CPU vs CUDA ------------------------------------------------------------
# Experts on the device: routing on the host, each expert's rows gathered and its output
# scatter-added there (docs/gpu.md). CUDA first, so a short budget measures the device side.
step_moe() {
    if [ "$gpu" = 1 ]; then ensure_build; fi
    Q="$(qbin)/quantctl"
    [ -x "$Q" ] || fail "no quantctl in $(qbin) (run the build step, or pass --reuse-build or --bundle)"
    local rc=0 cuda_report=- heads=$((moe_hidden / 64))
    local what="MoE-shaped, $moe_blocks blocks of $moe_hidden, 8 experts top-2, $moe_samples x $moe_seq"
    "$Q" gen-model --out "$W/mmoe" --layers "$moe_blocks" --hidden "$moe_hidden" --intermediate $((moe_hidden * 7 / 2)) \
        --heads "$heads" --kv-heads $((heads / 4)) --experts 8 --top-k 2 --max-pos 4096 --vocab 512 --seed 11 > /dev/null \
        || fail "gen-model of the MoE-shaped model failed"
    gen_ids "$W/ids-moe.json" $((moe_samples * moe_seq + 4096)) 512
    if [ "$gpu" = 1 ]; then
        run_job cuda-moe "$W/mmoe" "$W/ids-moe.json" "$moe_samples" "$moe_seq" "$device" ', "compute": "f32"' \
            || { rc=1; note "the CUDA MoE job failed (job-cuda-moe.log)"; }
        python3 "$here/gpu_report.py" job "$L/job-cuda-moe.log" "$L/job-cuda-moe-report.json" "$L/job-cuda-moe-gpumem.log" \
            "$what, cuda" "$L/moe-1-cuda.md" "$L/headline-moe.tsv" || rc=1
        cuda_report="$L/job-cuda-moe-report.json"
    else
        echo "The CUDA MoE job was skipped: $why_skip." > "$L/moe-1-cuda.md"
        note "CUDA half skipped: $why_skip"
    fi
    run_job cpu-moe "$W/mmoe" "$W/ids-moe.json" "$moe_samples" "$moe_seq" cpu ', "compute": "f32"' \
        || { rc=1; note "the CPU MoE job failed (job-cpu-moe.log)"; }
    python3 "$here/gpu_report.py" job "$L/job-cpu-moe.log" "$L/job-cpu-moe-report.json" "$L/job-cpu-moe-gpumem.log" \
        "$what, cpu" "$L/moe-2-cpu.md" "$L/headline-moe.tsv" || rc=1
    python3 "$here/gpu_report.py" moe "$L/job-cpu-moe-report.json" "$cuda_report" "$L/moe-3-agreement.md" \
        "$L/headline-moe.tsv" || rc=1
    rm -rf "$W/mmoe" "$W/out-cuda-moe" "$W/out-cpu-moe"
    [ "$gpu" = 1 ] || { [ $rc = 0 ] && exit 78; }
    return $rc
}

step_job() {
    if [ "$gpu" = 1 ]; then ensure_build; fi
    Q="$(qbin)/quantctl"
    [ -x "$Q" ] || fail "no quantctl in $(qbin) (run the build step, or pass --reuse-build or --bundle)"
    local rc=0 cuda_report=-
    if [ "$gpu" = 1 ]; then
        # A bfloat16 checkpoint, as users bring: the job in f32 first, then with the default
        # "compute" (auto), which on compute capability 8.0+ runs its products in bf16.
        gen_7b "$W/m7b" "$job_blocks" bf16 || fail "gen-model of the 7B-shaped model failed"
        gen_ids "$W/ids-job.json" $((job_samples * 2048 + 4096)) 512
        if run_job cuda-7b "$W/m7b" "$W/ids-job.json" "$job_samples" 2048 "$device" ', "compute": "f32"'; then :; else
            rc=1; note "the CUDA job failed (job-cuda-7b.log)"; fi
        python3 "$here/gpu_report.py" job "$L/job-cuda-7b.log" "$L/job-cuda-7b-report.json" "$L/job-cuda-7b-gpumem.log" \
            "7B-shaped, $job_blocks blocks, $job_samples x 2048, cuda" "$L/job-1-cuda.md" "$L/headline-job.tsv" || rc=1
        rm -rf "$W/out-cuda-7b"
        # The same job with the default "compute": auto, bf16 here (the report's compute says
        # what ran): its products on the tensor cores.
        if run_job cuda-7b-bf16 "$W/m7b" "$W/ids-job.json" "$job_samples" 2048 "$device"; then :; else
            rc=1; note "the CUDA job with the default compute failed (job-cuda-7b-bf16.log)"; fi
        python3 "$here/gpu_report.py" job "$L/job-cuda-7b-bf16.log" "$L/job-cuda-7b-bf16-report.json" "$L/job-cuda-7b-bf16-gpumem.log" \
            "7B-shaped, $job_blocks blocks, $job_samples x 2048, cuda, compute auto" "$L/job-1b-cuda-bf16.md" "$L/headline-job.tsv" || rc=1
        rm -rf "$W/m7b" "$W/out-cuda-7b-bf16"
    else
        echo "The CUDA job (${job_blocks} blocks at ${job_samples} x 2048) was skipped: $why_skip." > "$L/job-1-cuda.md"
        note "CUDA half skipped: $why_skip"
    fi
    # CPU vs CUDA on the same blocks and calibration.
    gen_7b "$W/magree" "$agree_blocks" || fail "gen-model of the agreement model failed"
    gen_ids "$W/ids-agree.json" $((agree_samples * agree_seq + 4096)) 512
    run_job cpu-agree "$W/magree" "$W/ids-agree.json" "$agree_samples" "$agree_seq" cpu || { rc=1; note "the CPU job failed (job-cpu-agree.log)"; }
    python3 "$here/gpu_report.py" job "$L/job-cpu-agree.log" "$L/job-cpu-agree-report.json" "$L/job-cpu-agree-gpumem.log" \
        "7B-shaped, $agree_blocks blocks, $agree_samples x $agree_seq, cpu" "$L/job-2-cpu.md" "$L/headline-job.tsv" || rc=1
    if [ "$gpu" = 1 ]; then
        run_job cuda-agree "$W/magree" "$W/ids-agree.json" "$agree_samples" "$agree_seq" "$device" || { rc=1; note "the CUDA agreement job failed"; }
        python3 "$here/gpu_report.py" job "$L/job-cuda-agree.log" "$L/job-cuda-agree-report.json" "$L/job-cuda-agree-gpumem.log" \
            "7B-shaped, $agree_blocks blocks, $agree_samples x $agree_seq, cuda (agreement run)" "$L/job-3-cuda-agree.md" "$L/headline-job.tsv" || rc=1
        cuda_report="$L/job-cuda-agree-report.json"
    fi
    rm -rf "$W/magree" "$W/out-cpu-agree" "$W/out-cuda-agree"
    # A tiny model: its float forward on both backends, and quantized on both (evaluated on the CPU).
    "$Q" gen-model --out "$W/tiny" --seed 3 --layers 2 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 \
        --vocab 256 --max-pos 256 > /dev/null || fail "gen-model of the tiny model failed"
    gen_ids "$W/ids-tiny.json" 8192 256
    : > "$L/job-ppl.jsonl"
    local b bes="cpu"; [ "$gpu" = 1 ] && bes="cpu $device"
    for b in $bes; do
        "$Q" eval --model "$W/tiny" --tokens "$W/ids-tiny.json" --seq-len 128 --backend "$b" 2>> "$L/job-ppl.log" \
            | sed 's/^{/{"label":"float",/' >> "$L/job-ppl.jsonl" || { rc=1; note "eval of the float tiny model on $b failed"; }
        local tb=cpu; [ "$b" = cpu ] || tb=cuda
        run_job "tiny-$tb" "$W/tiny" "$W/ids-tiny.json" 32 128 "$b" || { rc=1; note "quantizing the tiny model on $b failed"; }
        "$Q" eval --model "$W/out-tiny-$tb" --tokens "$W/ids-tiny.json" --seq-len 128 --backend cpu 2>> "$L/job-ppl.log" \
            | sed "s/^{/{\"label\":\"gptq-$tb\",/" >> "$L/job-ppl.jsonl" || { rc=1; note "eval of the tiny model quantized on $b failed"; }
    done
    python3 "$here/gpu_report.py" agree "$L/job-cpu-agree-report.json" "$cuda_report" "$L/job-ppl.jsonl" \
        "$L/job-4-agreement.md" "$L/headline-job.tsv" || rc=1
    [ "$gpu" = 1 ] || { [ $rc = 0 ] && exit 78; }
    return $rc
}

# ---- one block's quantize step over one and two workers of the device ---------------------------
# docs/parallel.md: the daemon spreads a block's quantize step over its workers as parts. The
# same job through quantd twice, on a throwaway redis-server: one worker on the device, then
# two on the same device (--workers cuda:N*2; each its own process and context, so the GPU
# works on one worker's part while the other's host side runs). The outputs must be the same
# bytes. Without a GPU, the same comparison on CPU workers (cpu:1 vs cpu:2, one thread each)
# at a tiny size, so this code runs on every CI run.
# predis NAME ARGS...: runs redis-server or redis-cli: the bundle's when it carries them (packed
# without an RPATH: their libraries through LD_LIBRARY_PATH, for them alone), else the system's.
predis() {
    local n=$1; shift
    if [ -n "$bundle" ] && [ -x "$W/bundle/redis/$n" ]; then
        env LD_LIBRARY_PATH="$W/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$W/bundle/redis/$n" "$@"
    else
        env "$n" "$@"
    fi
}
parts_stop() {   # ends the run's quantd and memory sampler (those it started, by pid)
    [ -z "${pmon:-}" ] || kill "$pmon" 2>/dev/null
    [ -z "${pdp:-}" ] || { kill -TERM "$pdp" 2>/dev/null; wait "$pdp" 2>/dev/null; }
    pmon="" pdp=""
}
parts_end() {    # the step's exit: that, and its redis-server
    parts_stop
    [ -z "${prp:-}" ] || { kill "$prp" 2>/dev/null; wait "$prp" 2>/dev/null; }
    prp=""
}
# parts_run LABEL WORKERS BACKEND MODEL IDS SAMPLES SEQ: one GPTQ w4 g128 job through a fresh
# quantd with --workers WORKERS; its output in $W/out-parts-LABEL, its daemon log, job,
# report and GPU memory samples in $L/parts-LABEL*. Waits (polling, bounded by the budget)
# for the job to end; a worker that refuses (no device, a failed self-test) ends it at once.
parts_run() {
    local label=$1 workers=$2 bk=$3 model=$4 ids=$5 samples=$6 seq=$7 out="$W/out-parts-$1" lim i=0 state="" why nw
    echo "{\"id\": \"gpu-parts-$label\", \"model\": \"$model\", \"output\": \"$out\", \"method\": \"gptq\", \"bits\": 4," \
         "\"group_size\": 128, \"backend\": \"$bk\", \"calibration\": {\"path\": \"$ids\", \"samples\": $samples, \"seq_len\": $seq}}" \
        > "$L/parts-$label-job.json"
    : > "$L/parts-$label-gpumem.log"
    if [ "$bk" = cuda ]; then
        ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$devnum" 2>/dev/null; sleep 0.5; done ) \
            > "$L/parts-$label-gpumem.log" & pmon=$!
    fi
    "$(qbin)/quantd" --redis "redis://127.0.0.1:$pport" --workers "$workers" --allow-root "$W" --node "gpu-parts-$label" \
        > "$L/parts-$label-daemon.log" 2>&1 & pdp=$!
    # Every worker ready before the job comes: a job that ends before its helpers have
    # started runs every part on the lead, and the comparison shows nothing.
    case "$workers" in *\*[0-9]*) nw=${workers##*\*} ;; cpu:[0-9]*) nw=${workers#cpu:} ;; *) nw=1 ;; esac
    lim=$(( $(tlimit 120) * 2 ))
    while [ "$(grep -c worker_ready "$L/parts-$label-daemon.log")" -lt "$nw" ] \
          && ! grep -q worker_refused "$L/parts-$label-daemon.log"; do   # a refusal: the loop below says why
        kill -0 "$pdp" 2>/dev/null && [ $i -lt "$lim" ] || { parts_stop; note "the $workers job: its $nw workers did not start (parts-$label-daemon.log)"; return 1; }
        sleep 0.5; i=$((i + 1))
    done
    i=0
    predis redis-cli -p "$pport" LPUSH qjobs "$(cat "$L/parts-$label-job.json")" > /dev/null \
        || { parts_stop; note "the $workers job: redis-cli LPUSH failed"; return 1; }
    lim=$(( $(tlimit 900) * 2 ))   # polls of 0.5 s
    while [ $i -lt "$lim" ]; do
        state=$(predis redis-cli -p "$pport" HGET "qjob:gpu-parts-$label" state 2>/dev/null)
        case "$state" in done|failed|cancelled) break ;; esac
        kill -0 "$pdp" 2>/dev/null || { state="quantd exited"; break; }
        why=$(sed -n 's/.*worker_refused.*why="\([^"]*\)".*/\1/p' "$L/parts-$label-daemon.log" | head -1)
        [ -z "$why" ] || { state="a worker refused: $why"; break; }
        sleep 0.5; i=$((i + 1))
    done
    [ $i -lt "$lim" ] || state="not finished within $((lim / 2)) s"
    [ "$state" = done ] || [ "$state" != failed ] || state="failed: $(predis redis-cli -p "$pport" HGET "qjob:gpu-parts-$label" error 2>/dev/null)"
    parts_stop
    cp "$out/quantd_report.json" "$L/parts-$label-report.json" 2>/dev/null
    [ "$state" = done ] || { note "the $workers job: $state (parts-$label-daemon.log)"; return 1; }
}
# parts_pair WHAT LABEL1 WORKERS1 LABEL2 WORKERS2 BACKEND MODEL IDS SAMPLES SEQ OUT.md: both
# runs, the bytes compared, the section written.
parts_pair() {
    local what=$1 l1=$2 w1=$3 l2=$4 w2=$5 bk=$6 model=$7 ids=$8 samples=$9 seq=${10} md=${11} rc=0 same=-
    parts_run "$l1" "$w1" "$bk" "$model" "$ids" "$samples" "$seq" || rc=1
    parts_run "$l2" "$w2" "$bk" "$model" "$ids" "$samples" "$seq" || rc=1
    if [ -f "$W/out-parts-$l1/model.safetensors" ] && [ -f "$W/out-parts-$l2/model.safetensors" ]; then
        if cmp "$W/out-parts-$l1/model.safetensors" "$W/out-parts-$l2/model.safetensors" > "$L/parts-$l2-cmp.log" 2>&1; then
            same=yes
        else
            same=no rc=1; note "$w1 and $w2 wrote different bytes (parts-$l2-cmp.log)"
        fi
    fi
    python3 "$here/gpu_report.py" parts "$what" "$w1" "$L/parts-$l1-report.json" "$L/parts-$l1-gpumem.log" \
        "$w2" "$L/parts-$l2-report.json" "$L/parts-$l2-gpumem.log" "$same" "$md" "$L/headline-parts.tsv" || rc=1
    rm -rf "$W/out-parts-$l1" "$W/out-parts-$l2"
    return $rc
}
step_parts() {
    if [ "$gpu" = 1 ]; then ensure_build; fi
    Q="$(qbin)/quantctl"
    local x rc=0
    for x in quantctl quantd quantd-worker; do
        [ -x "$(qbin)/$x" ] || fail "no $x in $(qbin) (run the build step, or pass --reuse-build or --bundle)"
    done
    if ! { [ -n "$bundle" ] && [ -x "$W/bundle/redis/redis-server" ]; } && ! { command -v redis-server && command -v redis-cli; } > /dev/null; then
        [ "$gpu" = 1 ] || skip "no redis-server or redis-cli here (bench/gpu_bundle.sh packs them)"
        fail "no redis-server or redis-cli in the bundle or on PATH (a bundle of bench/gpu_bundle.sh carries them)"
    fi
    pmon="" pdp="" prp=""
    trap parts_end EXIT
    pport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$W/redis"
    # Not through predis: a function in the background is a subshell, whose pid is not the server's.
    if [ -n "$bundle" ] && [ -x "$W/bundle/redis/redis-server" ]; then
        env LD_LIBRARY_PATH="$W/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$W/bundle/redis/redis-server" \
            --port "$pport" --bind 127.0.0.1 --dir "$W/redis" --save '' --appendonly no > "$L/parts-redis.log" 2>&1 & prp=$!
    else
        redis-server --port "$pport" --bind 127.0.0.1 --dir "$W/redis" --save '' --appendonly no > "$L/parts-redis.log" 2>&1 & prp=$!
    fi
    for x in $(seq 50); do predis redis-cli -p "$pport" ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
    predis redis-cli -p "$pport" ping 2>/dev/null | grep -q PONG || fail "redis-server did not answer on port $pport (parts-redis.log)"
    if [ "$gpu" = 1 ]; then
        gen_7b "$W/mparts" 1 || fail "gen-model of the 7B-shaped block failed"
        gen_ids "$W/ids-parts.json" $((parts_samples * parts_seq + 4096)) 512
        parts_pair "7B-shaped block, GPTQ w4 g128, $parts_samples x $parts_seq, one vs two workers on $device" \
            cuda-1 "$device" cuda-2 "$device*2" cuda "$W/mparts" "$W/ids-parts.json" "$parts_samples" "$parts_seq" \
            "$L/parts-1-cuda.md" || rc=1
        rm -rf "$W/mparts"
        # From the two-worker run's part costs on the GPU: Llama-3-70B's block over 8 and 16
        # workers (bench/parts_project.py; the MoE half needs a MoE run's log, which this step
        # does not make).
        local b1
        b1=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["blocks"][0]["seconds"])' \
             "$L/parts-cuda-1-report.json" 2>/dev/null) || b1=""
        { echo "### Projections from the part costs of the two-worker run on $device (bench/parts_project.py)"; echo
          python3 "$here/parts_project.py" project "$L/parts-cuda-2-daemon.log" "$L/parts-cuda-2-report.json" \
              ${b1:+--check-1 "$b1"}; } > "$L/parts-3-projection.md" 2>&1 ||
            note "the projection from the GPU's part costs failed (parts-3-projection.md)"
        return $rc
    fi
    # The CPU half: gate/up of 2304 rows are 2 parts each (at most 2048 rows a part), so
    # the second worker has parts to take; one thread a worker.
    "$Q" gen-model --out "$W/mparts" --layers 1 --hidden 256 --intermediate 2304 --heads 4 --kv-heads 4 \
        --vocab 256 --max-pos 256 --seed 5 > /dev/null || fail "gen-model of the tiny model failed"
    gen_ids "$W/ids-parts.json" $((parts_samples * parts_seq + 4096)) 256
    QUANTD_THREADS=1 OPENBLAS_NUM_THREADS=1 parts_pair \
        "tiny block (hidden 256, MLP 2304), GPTQ w4 g128, $parts_samples x $parts_seq, CPU workers of one thread" \
        cpu-1 cpu:1 cpu-2 cpu:2 cpu "$W/mparts" "$W/ids-parts.json" "$parts_samples" "$parts_seq" "$L/parts-2-cpu.md" || rc=1
    rm -rf "$W/mparts"
    echo "The GPU comparison (one vs two workers on $device, a 7B-shaped block) was skipped: $why_skip." > "$L/parts-1-cuda.md"
    note "GPU half skipped: $why_skip"
    [ $rc = 0 ] && exit 78
    return $rc
}

# ---- run -------------------------------------------------------------------------------------------
for s in ${steps//,/ }; do
    step_name=$s; run_step "$s" "step_$s"
done
python3 "$here/gpu_report.py" summary "$L" "quantd on the GPU: $gpu_name ($day)" "$md" || failed=1
if [ -n "$outdir" ]; then
    # Two files: a lent machine sends back at most 8 (bench/gpu_fetch.sh unpacks them).
    mkdir -p "$outdir" && cp "$md" "$outdir"/ && tar -czf "$outdir/$name-logs.tar.gz" -C "$results" "$name" || failed=1
fi
echo "results: $md"
sed -n '/^## Summary/,/^Raw logs/p' "$md"
exit $failed
