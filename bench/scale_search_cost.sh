#!/usr/bin/env bash
# What the scale search costs GPTQ on 7B-shaped layers: `quantctl layer` (act-order, static
# groups, 4-bit sym group 128, the job default's settings) with --scale-search minmax and
# mse, interleaved (the order flips every round), on layers from `quantctl gen-layer`
# (2048 calibration rows): 4096x4096 (q/k/v/o), 11008x4096 (gate/up), 4096x11008 (down).
# Prints one markdown row per run (the layer's quantization seconds, not the Hessian's, and
# its relative output error), then the median seconds of each. Optional bench, not ctest.
#
#   bench/scale_search_cost.sh BUILD_DIR [ROUNDS] [THREADS]   (defaults 3, 1)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/scale_search_cost.sh BUILD_DIR [ROUNDS] [THREADS]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
rounds="${2:-3}" threads="${3:-1}"
qctl="$build/quantctl"
work="$build/scale-search-cost"
[ -x "$qctl" ] || { echo "scale_search_cost.sh: $qctl not built" >&2; exit 1; }
mkdir -p "$work"
export QUANTD_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
shapes="4096x4096 11008x4096 4096x11008"
for s in $shapes; do
    [ -s "$work/$s/X.safetensors" ] || "$qctl" gen-layer --n "${s%x*}" --k "${s#*x}" --rows 2048 --seed 1 --out "$work/$s" >/dev/null
done
echo "| round | layer | scale_search | seconds | rel. output error |"
echo "|---|---|---|---|---|"
: > "$work/runs.txt"
for r in $(seq 1 "$rounds"); do
    order="minmax mse"
    [ $((r % 2)) = 0 ] && order="mse minmax"
    for s in $shapes; do
        for ss in $order; do
            line=$("$qctl" layer --weight "$work/$s/W.safetensors" --inputs "$work/$s/X.safetensors" --method gptq \
                --bits 4 --group-size 128 --sym --desc-act --static-groups --scale-search "$ss" \
                --out "$work/out.safetensors" | tail -1)
            sec=$(python3 -c 'import json,sys; print("%.2f" % json.loads(sys.argv[1])["seconds"])' "$line")
            rel=$(python3 -c 'import json,sys; print("%.5f" % json.loads(sys.argv[1])["rel_output_error"])' "$line")
            echo "| $r | $s | $ss | $sec | $rel |"
            echo "$s $ss $sec" >> "$work/runs.txt"
        done
    done
done
echo
echo "| layer | minmax s (median) | mse s (median) | mse / minmax |"
echo "|---|---|---|---|"
python3 - "$work/runs.txt" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    s, ss, sec = line.split()
    runs.setdefault(s, {}).setdefault(ss, []).append(float(sec))
for s, d in runs.items():
    a, b = statistics.median(d["minmax"]), statistics.median(d["mse"])
    print("| %s | %.2f | %.2f | %.2fx |" % (s, a, b, b / a))
PY
