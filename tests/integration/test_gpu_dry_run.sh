#!/usr/bin/env bash
# bench/gpu.sh --dry-run, as CI runs it so the script cannot rot before a GPU shows up: it
# reuses this build (no second build), compiles the CUDA sources for sm_90 with the ptxas
# report when nvcc is present, runs the CPU halves of the MoE-shaped job (one small block of
# eight experts) and of the 7B-shaped job on one block at a small calibration and the tiny
# model's perplexity, and of the parts step (one tiny block through quantd on a throwaway
# redis-server with cpu:1 and cpu:2: the same bytes), records every GPU step as skipped with the
# reason, and writes the results file with its summary table into a temporary directory.
# Then the lent-machine path: bench/gpu_bundle.sh --from-build packs this build's programs
# with their libraries, and gpu.sh --lease runs them from the bundle under a stand-in
# nvidia-smi that shows one GPU, so every GPU step's shell code runs (each fails, naming
# the missing device), with two files in --out. Its --budget is kept on a clock of the
# test's own (QUANTD_GPU_CLOCK_FILE), which a stand-in `timeout` moves on as if each bounded
# command took 10 s, cutting off (exit 124, not run) one given less, and records the bound
# each got: the budget's arithmetic is checked on those seconds, and nothing here measures
# or waits for real seconds.
set -u
. "$(dirname "$0")/cli_common.sh"
S="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
steps=build,test,sanitize,selftest,bench,moe,job,parts
command -v nvcc >/dev/null || { echo "note: no nvcc, the build step is left out"; steps=test,sanitize,selftest,bench,moe,job,parts; }

bash "$S/bench/gpu.sh" --dry-run --steps "$steps" --reuse-build "$QUANTD_BUILD_DIR" --results "$T/results" \
    --agree-samples 4 --agree-seq 256 > "$T/out.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { fail "gpu.sh --dry-run exited $rc"; tail -30 "$T/out.log" >&2; }
md=$(ls "$T"/results/gpu-*-dryrun.md 2>/dev/null | head -1)
[ -n "$md" ] || { fail "no results file in $T/results"; ls -R "$T/results" >&2; echo "$fails failure(s)"; exit 1; }
logs="${md%.md}"
has() { grep -q -- "$2" "$1" || fail "$(basename "$1") lacks: $2"; }
has "$md" "^## Summary"
for s in test sanitize selftest bench; do has "$md" "^| $s | skipped | .* | dry run (--dry-run)"; done
has "$md" "kernel_bench compiled, not run"
has "$md" "^| job | pass (CPU half only) |"
has "$md" "CUDA half skipped: dry run"
has "$md" "7B-shaped, 1 blocks, 4 x 256, cpu: seconds per block"
has "$md" "model.layers.0.mlp.down_proj | 0.0"
has "$md" "| float | cpu |"
has "$md" "| gptq-cpu | cpu |"
[ -s "$logs/job-cpu-agree-report.json" ] || fail "the CPU job's report was not kept"
# The MoE step: its CPU half on one block of 256 with 8 experts, every expert's layers in the
# agreement table, the CUDA side named as not run.
has "$md" "^| moe | pass (CPU half only) | .* | CUDA half skipped: dry run"
has "$md" "MoE-shaped, 1 blocks of 256, 8 experts top-2, 4 x 128, cpu: seconds per block"
has "$md" "block_sparse_moe.experts.7.w2 | 0.0[0-9]* | not run |"
has "$md" "MoE, CPU vs CUDA: per-layer relative error difference | not measured (no CUDA run)"
python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["totals"]["blocks"] == 1 and r["totals"]["layers_quantized"] == 28, r["totals"]' \
    "$logs/job-cpu-moe-report.json" || fail "the CPU MoE job is not one block of 4 attention and 8 x 3 expert layers"
python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["totals"]["blocks"] == 1 and r["totals"]["layers_quantized"] == 7, r["totals"]' \
    "$logs/job-cpu-agree-report.json" || fail "the CPU job is not one 7B-shaped block of 7 layers"
# The parts step: one tiny block through quantd with one CPU worker and with two, the same
# bytes, the second worker running parts; the GPU half named as skipped.
if command -v redis-server > /dev/null && command -v redis-cli > /dev/null; then
    has "$md" "^| parts | pass (CPU half only) | .* | GPU half skipped: dry run"
    [ -s "$logs/parts-2-cpu.md" ] || fail "the parts step wrote no section for its CPU half"
    has "$logs/parts-2-cpu.md" "byte-identical: yes, identical bytes"
    has "$logs/parts-2-cpu.md" "| \*\*quantize step\*\* | [0-9.]* | [0-9.]* |"
    has "$logs/parts-1-cuda.md" "was skipped: dry run"
    has "$md" "CPU workers of one thread: outputs byte-identical | identical bytes | identical | yes |"
    python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["totals"]["blocks"] == 1 and r["totals"]["layers_quantized"] == 7, r["totals"]' \
        "$logs/parts-cpu-2-report.json" || fail "the parts step's cpu:2 job is not one block of 7 layers"
    python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert any("cpu-1" in l.get("worker", "") for l in r["layers"]), [l.get("worker") for l in r["layers"]]' \
        "$logs/parts-cpu-2-report.json" || fail "no part of the cpu:2 job ran in the second worker"
else
    echo "note: no redis-server, the parts step is skipped"
    has "$md" "^| parts | skipped | .* | no redis-server"
fi
if [ "$steps" = build,test,sanitize,selftest,bench,moe,job,parts ]; then
    has "$md" "^| build | pass |"
    has "$md" "k_gptq_gemv<4, 1>"
    has "$md" "k_gemm_wmma"
    has "$logs/ptxas.log" "for 'sm_90'"
fi
# Bad options are refused before anything runs.
bash "$S/bench/gpu.sh" --steps build,nope > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "'nope' is not one of" "$T/err" || fail "an unknown step: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu.sh" --device gpu0 > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "is not cuda:N" "$T/err" || fail "a bad device: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu.sh" --bundle "$T/none.tar.gz" > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "gpu_bundle.sh" "$T/err" || fail "a missing bundle: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu.sh" --moe-hidden 100 > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "is not a multiple of 256" "$T/err" || fail "a bad --moe-hidden: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu.sh" --budget 5m > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "is not a number of seconds" "$T/err" || fail "a bad budget: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu_bundle.sh" --arch sm90 > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "is not a number like 90" "$T/err" || fail "gpu_bundle.sh, a bad --arch: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu_bundle.sh" --from-build "$T" --out "$T/x.tar.gz" > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 1 ] && grep -q "has no quantctl" "$T/err" && [ ! -e "$T/x.tar.gz" ] || fail "gpu_bundle.sh, a build without programs: exit $rc, $(cat "$T/err")"
mkdir -p "$T/empty"
bash "$S/bench/gpu_fetch.sh" "$T/empty" "$T/r0" > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 1 ] && grep -q "no gpu-\*.md" "$T/err" || fail "gpu_fetch.sh, nothing to fetch: exit $rc, $(cat "$T/err")"
bash "$S/bench/gpu_fetch.sh" "$T/nowhere" > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "is not a folder" "$T/err" || fail "gpu_fetch.sh, a missing folder: exit $rc, $(cat "$T/err")"

# ---- the lent-machine path: a bundle, a stand-in GPU, a budget, two files back ----
if [ -x "$QUANTD_BUILD_DIR/tests/test_backend_cuda" ]; then
    bash "$S/bench/gpu_bundle.sh" --from-build "$QUANTD_BUILD_DIR" --out "$T/bundle.tar.gz" > "$T/bundle.log" 2>&1 \
        || { fail "gpu_bundle.sh --from-build failed"; cat "$T/bundle.log" >&2; }
    tar -tzf "$T/bundle.tar.gz" > "$T/bundle.list" 2>/dev/null
    for f in ./MANIFEST ./bin/quantctl ./bin/test_backend_cuda ./lib/libcjson.so.1 ./lib/libopenblas.so.0 \
             ./bin/quantd ./bin/quantd-worker ./redis/redis-server ./redis/redis-cli; do
        grep -qx -- "$f" "$T/bundle.list" || fail "the bundle lacks $f"
    done
    # The bundle's Redis runs on its own libraries (as gpu.sh runs it: LD_LIBRARY_PATH=lib).
    mkdir -p "$T/unpacked" && tar -xzf "$T/bundle.tar.gz" -C "$T/unpacked"
    grep -q "^redis:   Redis server v=" "$T/unpacked/MANIFEST" || fail "the bundle's MANIFEST names no Redis version"
    LD_LIBRARY_PATH="$T/unpacked/lib" "$T/unpacked/redis/redis-server" --version | grep -q "^Redis server v=" \
        || fail "the bundle's redis-server does not run as a server"
    grep -qE '/lib(c\.so|cudart|stdc\+\+)' "$T/bundle.list" && fail "the bundle carries glibc, CUDA or libstdc++"
    mkdir -p "$T/fake"
    cat > "$T/fake/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA Stand-in (UUID: GPU-0)" ;;
  *query-gpu=name,memory.total*) echo "NVIDIA Stand-in, 81559 MiB, 1980 MHz" ;;
  *query-gpu=name*) echo "NVIDIA Stand-in" ;;
  *compute_cap*) echo "9.0" ;;
  *driver_version*) echo "0.0" ;;
  *memory.used*) echo "0" ;;
esac
SMI
    chmod +x "$T/fake/nvidia-smi"
    # timeout LIMIT CMD...: records "clock LIMIT CMD"; each command takes 10 s of the test's
    # clock: given as much, it runs (with no real limit), given less, the clock moves on by
    # LIMIT and it is cut off as timeout would, exit 124, without running.
    cat > "$T/fake/timeout" <<'TIMEOUT'
#!/bin/sh
limit=$1; shift
now=$(cat "$QUANTD_GPU_CLOCK_FILE")
echo "$now $limit $(basename "$1")" >> "$FAKE_TIMEOUT_LOG"
if [ "$limit" -lt 10 ]; then echo $((now + limit)) > "$QUANTD_GPU_CLOCK_FILE"; exit 124; fi
echo $((now + 10)) > "$QUANTD_GPU_CLOCK_FILE"
exec "$@"
TIMEOUT
    chmod +x "$T/fake/timeout"
    echo 1000 > "$T/clock"
    : > "$T/timeouts.log"
    # Every GPU step fails at once (one block for the 7B-shaped CUDA job, whose model is made
    # before it fails); the MoE step's CUDA job fails and its CPU job runs (one block of 256 at
    # 1 x 64); the budget of 80 s cuts the job step short after its first CUDA job (the CPU
    # agreement run is cut off, not run) and leaves sanitize too little to start.
    PATH="$T/fake:$PATH" QUANTD_GPU_CLOCK_FILE="$T/clock" FAKE_TIMEOUT_LOG="$T/timeouts.log" \
        bash "$S/bench/gpu.sh" --lease --bundle "$T/bundle.tar.gz" --budget 80 --results "$T/lease" \
        --out "$T/out" --job-blocks 1 --job-samples 1 --agree-samples 1 --agree-seq 64 \
        --moe-hidden 256 --moe-samples 1 --moe-seq 64 > "$T/lease.log" 2>&1; rc=$?
    [ "$rc" = 1 ] || fail "gpu.sh --lease on a stand-in GPU exited $rc, not 1 (every GPU step fails there)"
    # Each bounded command got what was left of the budget less the 20 s the summary keeps
    # (at least 1 s): started at second 1000 + k, it ends by 1060, and nothing by more than 1080.
    n_bounded=$(wc -l < "$T/timeouts.log")
    [ "$n_bounded" -ge 8 ] || fail "only $n_bounded bounded commands in the lease run: $(xargs < "$T/timeouts.log")"
    # The MoE step (before the job step) runs its CUDA job at 30 s and its CPU job at 40 s.
    grep -q "^1030 30 quantctl$" "$T/timeouts.log" || fail "the MoE CUDA job did not start at 30 s: $(xargs < "$T/timeouts.log")"
    grep -q "^1040 20 quantctl$" "$T/timeouts.log" || fail "the MoE CPU job did not start at 40 s: $(xargs < "$T/timeouts.log")"
    grep -q "^1050 10 quantctl$" "$T/timeouts.log" || fail "the first 7B CUDA job did not get the last 10 s: $(xargs < "$T/timeouts.log")"
    grep -q "^10[56][0-9] 1 quantctl$" "$T/timeouts.log" || fail "no job was cut off by the budget: $(xargs < "$T/timeouts.log")"
    while read -r at limit cmd; do
        want=$(( 1060 - at )); [ "$want" -ge 1 ] || want=1
        [ "$limit" = "$want" ] || fail "$cmd started at budget second $((at - 1000)) got timeout $limit, not $want"
        [ $((at + limit)) -le 1080 ] || fail "$cmd may run past the budget: second $((at - 1000)) + $limit"
    done < "$T/timeouts.log"
    grep -q "^1000 60 test_backend_cuda$" "$T/timeouts.log" || fail "the test step was not the first bounded command, at 60 s"
    lmd=$(ls "$T"/lease/gpu-*-stand-in.md 2>/dev/null | head -1)
    if [ -z "$lmd" ]; then
        fail "no results file from the lease run"; tail -20 "$T/lease.log" >&2
    else
        llogs="${lmd%.md}"
        has "$lmd" "^bundle:   bundle.tar.gz, built "
        has "$lmd" "^budget:   80 s"
        has "$lmd" "^| build | pass |"
        has "$lmd" "No build here: the programs come from"
        has "$lmd" "^| test | FAIL | .* | a GPU test skipped although cuda:0 is visible"
        has "$lmd" "^| selftest | FAIL |"
        has "$lmd" "^| bench | FAIL |"
        has "$lmd" "^| job | FAIL |"
        has "$lmd" "^| moe | FAIL | .* | the CUDA MoE job failed"
        has "$llogs/job-cuda-moe.log" "CUDA device\|no CUDA support"
        has "$lmd" "MoE-shaped, 1 blocks of 256, 8 experts top-2, 1 x 64, cpu: seconds per block"
        [ -s "$llogs/job-cpu-moe-report.json" ] || fail "the lease run's CPU MoE job left no report"
        # Started when less than 30 s were left: skipped for the budget, not run.
        has "$lmd" "^| parts | skipped | .* | not started: $((1080 - $(cat "$T/clock"))) s of the --budget of 80 s were left"
        has "$lmd" "^| sanitize | skipped | .* | not started: $((1080 - $(cat "$T/clock"))) s of the --budget of 80 s were left"
        # Each names what is missing: the device, or (a build without CUDA) the support.
        has "$llogs/selftest.log" "CUDA device\|no CUDA support"
        has "$llogs/job-cuda-7b.log" "CUDA device\|no CUDA support"
        has "$llogs/bench-kernels.log" "CUDA device\|no CUDA support"
        # Two files for --out, the logs as one archive that gpu_fetch.sh puts back.
        n=$(ls "$T/out" | wc -l)
        [ "$n" = 2 ] || fail "--out holds $n files, not 2: $(ls "$T/out" | xargs)"
        mkdir -p "$T/fetched"
        bash "$S/bench/gpu_fetch.sh" "$T/out" "$T/fetched" > /dev/null || fail "gpu_fetch.sh failed"
        [ -s "$T/fetched/$(basename "$llogs")/steps.tsv" ] && [ -s "$T/fetched/$(basename "$lmd")" ] \
            || fail "gpu_fetch.sh did not put back the results file and its logs"
    fi
    # A budget too small for any step: each is recorded as skipped, none runs.
    echo 1000 > "$T/clock"
    : > "$T/timeouts.log"
    PATH="$T/fake:$PATH" QUANTD_GPU_CLOCK_FILE="$T/clock" FAKE_TIMEOUT_LOG="$T/timeouts.log" \
        bash "$S/bench/gpu.sh" --bundle "$T/bundle.tar.gz" --budget 20 --steps test,job --results "$T/tiny" > /dev/null 2>&1
    [ ! -s "$T/timeouts.log" ] || fail "a step ran with a budget of 20 s: $(xargs < "$T/timeouts.log")"
    tmd=$(ls "$T"/tiny/gpu-*.md 2>/dev/null | head -1)
    if [ -n "$tmd" ]; then
        has "$tmd" "^| test | skipped | .* | not started: 20 s of the --budget of 20 s were left"
        has "$tmd" "^| job | skipped | .* | not started: 20 s of the --budget of 20 s were left"
    else
        fail "no results file from the run with a 20 s budget"
    fi
else
    echo "note: no test_backend_cuda in this build (no nvcc): the bundle checks are left out"
fi

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_gpu_dry_run: all checks passed"
