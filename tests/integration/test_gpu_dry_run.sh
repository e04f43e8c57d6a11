#!/usr/bin/env bash
# bench/gpu.sh --dry-run, as CI runs it so the script cannot rot before a GPU shows up: it
# reuses this build (no second build), compiles the CUDA sources for sm_90 with the ptxas
# report when nvcc is present, runs the CPU half of the 7B-shaped job on one block at a small
# calibration and the tiny model's perplexity, records every GPU step as skipped with the
# reason, and writes the results file with its summary table into a temporary directory.
set -u
. "$(dirname "$0")/cli_common.sh"
S="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
steps=build,test,selftest,bench,job
command -v nvcc >/dev/null || { echo "note: no nvcc, the build step is left out"; steps=test,selftest,bench,job; }

bash "$S/bench/gpu.sh" --dry-run --steps "$steps" --reuse-build "$QUANTD_BUILD_DIR" --results "$T/results" \
    --agree-samples 4 --agree-seq 256 > "$T/out.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { fail "gpu.sh --dry-run exited $rc"; tail -30 "$T/out.log" >&2; }
md=$(ls "$T"/results/gpu-*-dryrun.md 2>/dev/null | head -1)
[ -n "$md" ] || { fail "no results file in $T/results"; ls -R "$T/results" >&2; echo "$fails failure(s)"; exit 1; }
logs="${md%.md}"
has() { grep -q -- "$2" "$1" || fail "$(basename "$1") lacks: $2"; }
has "$md" "^## Summary"
for s in test selftest bench; do has "$md" "^| $s | skipped | .* | dry run (--dry-run)"; done
has "$md" "kernel_bench compiled, not run"
has "$md" "^| job | pass (CPU half only) |"
has "$md" "CUDA half skipped: dry run"
has "$md" "7B-shaped, 1 blocks, 4 x 256, cpu: seconds per block"
has "$md" "model.layers.0.mlp.down_proj | 0.0"
has "$md" "| float | cpu |"
has "$md" "| gptq-cpu | cpu |"
[ -s "$logs/job-cpu-agree-report.json" ] || fail "the CPU job's report was not kept"
python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["totals"]["blocks"] == 1 and r["totals"]["layers_quantized"] == 7, r["totals"]' \
    "$logs/job-cpu-agree-report.json" || fail "the CPU job is not one 7B-shaped block of 7 layers"
if [ "$steps" = build,test,selftest,bench,job ]; then
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

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_gpu_dry_run: all checks passed"
