#!/usr/bin/env bash
# GPTQ benchmark on the CPU, 4096 calibration rows, 4-bit, group 128, OpenBLAS on $THREADS
# threads. Layers by their nn.Linear weight shape [N, K] (as `quantctl layer` takes them):
# 4096x4096 (a 7B attention projection), 4096x11008 (down_proj: K = 11008) and 11008x4096
# (gate/up_proj: N = 11008). SHAPES="4096x4096" runs a subset.
#
#   bench/gptq_layer.sh                      # uses $QUANTD_BUILD_DIR or ./build
#   THREADS=2 REPS=3 PYTHON=/path/to/python bench/gptq_layer.sh
#
# Reports: SGEMM peak (bench/sgemm_peak.c), then per layer the Hessian accumulation
# seconds and GFLOP/s, GPTQ's quantization proper (damping, Cholesky, column loop), the
# lazy trailing-update GEMMs and the Cholesky replayed alone, each as a fraction of the
# SGEMM peak, and the reference GPTQ in PyTorch (bench/ref_gptq.py) on the same data and
# threads when `import torch` works in $PYTHON. Best of $REPS processes; inside each
# process both implementations quantize the layer $IN_REPS times (default 3): "first" is
# the first call (cold: fresh pages, library start-up), "warm" the best later call (what
# every layer after the first of a job sees). Not part of ctest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${QUANTD_BUILD_DIR:-$ROOT/build}
DATA=${BENCH_DATA:-/tmp/quantd-bench}
PY=${PYTHON:-python3}
THREADS=${THREADS:-2}
REPS=${REPS:-1}
IN_REPS=${IN_REPS:-3}
OUT=${BENCH_OUT:-$DATA/results.jsonl}

[ -f "$BUILD/libquant.a" ] && [ -x "$BUILD/quantctl" ] || cmake --build "$BUILD" --target quant quantctl
mkdir -p "$BUILD/bench" "$DATA"
LIBS="$(pkg-config --libs openblas lapacke libcjson) -lm -lpthread"
CFLAGS="-O2 $(pkg-config --cflags openblas lapacke)"
cc $CFLAGS -I"$ROOT" -o "$BUILD/bench/sgemm_peak" "$ROOT/bench/sgemm_peak.c" "$ROOT/quant/core/clock.c" $LIBS
cc $CFLAGS -I"$ROOT" -o "$BUILD/bench/gptq_bench" "$ROOT/bench/gptq_bench.c" "$ROOT/startup/runtime_env.c" \
    "$BUILD/libquant.a" "$BUILD/libqadmit.a" "$BUILD/libqjob.a" "$BUILD/libqformats.a" "$BUILD/libqcore.a" $LIBS

SHAPES=${SHAPES:-4096x4096 4096x11008 11008x4096}
for shape in $SHAPES; do
    n=${shape%x*}; k=${shape#*x}
    [ -f "$DATA/$shape/W.safetensors" ] || "$BUILD/quantctl" gen-layer --n "$n" --k "$k" --rows 4096 --seed 1 --out "$DATA/$shape" >/dev/null
done

have_torch=0
if "$PY" -c 'import torch, safetensors' 2>/dev/null; then have_torch=1; else echo "note: no torch in $PY: the reference is skipped" >&2; fi

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads $THREADS, load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$OUT"
best() {  # best KEY CMD...: runs CMD $REPS times, keeps the JSON line with the smallest KEY
    local key=$1; shift
    for _ in $(seq "$REPS"); do "$@"; done | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print(json.dumps(min(rows, key=lambda r: r[sys.argv[1]])))' "$key"
}
best seconds "$BUILD/bench/sgemm_peak" 4096 "$THREADS" 3 | sed 's/^{/{"what":"sgemm",/' | tee -a "$OUT"
for shape in $SHAPES; do
    for act in "" "--desc-act"; do
        [ -n "$act" ] && [ "$shape" != 4096x4096 ] && continue
        best gptq_seconds "$BUILD/bench/gptq_bench" "$DATA/$shape/W.safetensors" "$DATA/$shape/X.safetensors" \
            --bits 4 --group-size 128 --threads "$THREADS" --reps "$IN_REPS" $act | sed 's/^{/{"what":"quantd",/' | tee -a "$OUT"
        if [ "$have_torch" = 1 ]; then
            best gptq_seconds "$PY" "$ROOT/bench/ref_gptq.py" "$DATA/$shape/W.safetensors" "$DATA/$shape/X.safetensors" \
                --bits 4 --group-size 128 --sym --threads "$THREADS" --reps "$IN_REPS" $act | sed 's/^{/{"what":"reference",/' | tee -a "$OUT"
        fi
    done
done

python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peak = next(r["gflops"] for r in rows if r["what"] == "sgemm")
print(f"\nSGEMM peak {peak:.1f} GFLOP/s")
print("| layer (N x K) | act-order | quantd GPTQ s warm (first) | Hessian s (GFLOP/s, % peak) | lazy GEMMs s (GFLOP/s, % peak) | Cholesky s | in-block s | GPTQ / (GEMMs + Cholesky) | reference s warm (first) | speed-up warm (first) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["what"] != "quantd":
        continue
    ref = next((x for x in rows if x["what"] == "reference" and x["n"] == r["n"] and x["k"] == r["k"] and x["desc_act"] == r["desc_act"]), None)
    ratio = r["gptq_seconds"] / (r["lazy_gemm_seconds"] + r["chol_seconds"])
    print(f"| {r['n']} x {r['k']} | {r['desc_act']} | {r['gptq_seconds']:.2f} ({r['gptq_first_seconds']:.2f}) | {r['hessian_seconds']:.2f} "
          f"({r['hessian_gflops']:.0f}, {100 * r['hessian_gflops'] / peak:.0f}%) | {r['lazy_gemm_seconds']:.2f} "
          f"({r['lazy_gemm_gflops']:.0f}, {100 * r['lazy_gemm_gflops'] / peak:.0f}%) | {r['chol_seconds']:.2f} | "
          f"{r['block_kernel_seconds']:.2f} | {ratio:.2f} | "
          + (f"{ref['gptq_seconds']:.2f} ({ref['gptq_first_seconds']:.2f}) | {ref['gptq_seconds'] / r['gptq_seconds']:.1f}x "
             f"({ref['gptq_first_seconds'] / r['gptq_first_seconds']:.1f}x) |" if ref else "- | - |"))
EOF
