#!/usr/bin/env bash
# One block's quantize step over several workers (docs/parallel.md): runs one job through
# quantd with --workers cpu:1 and cpu:N (each worker one thread: QUANTD_THREADS=1,
# OPENBLAS_NUM_THREADS=1), ROUNDS times interleaved (1 first in each round), on a throwaway
# redis-server, and prints per run the block's wall seconds and its stages from
# quantd_report.json, the quantize step's wall seconds (quantize + pack + error +
# kernel_check), the parts each worker ran, and the seconds the part files cost (the
# checkpoint stage minus the commit's own, which the 1-worker run measures). Every run's
# model.safetensors must be the same bytes: the script fails otherwise.
#
#   bench/parts.sh [BUILD_DIR] [SHAPE] [N] [ROUNDS] [SAMPLES] [SEQ_LEN]
#
# SHAPE: 7b (a Llama-2-7B-shaped block: hidden 4096, intermediate 11008, 32 heads) or
# mixtral (a Mixtral-8x7B-shaped block: intermediate 14336, 8 kv heads, 8 experts, top 2).
# Defaults: build/release, 7b, 2, 2 rounds, 16 x 512 tokens; GPTQ w4 g128 true-sequential.
# PARTS_LAYERS (default 1) blocks in the model: with 2 or more, a row per block (the first
# block pays each process's first touch of its memory, the later ones do not, as in a job of
# many blocks). PARTS_JOB_EXTRA (default empty) is added to the job's JSON, e.g. ',"true_sequential":false';
# PARTS_CALIB_EXTRA to its calibration object, e.g. ',"shards":2'. PARTS_KEEP=DIR keeps each
# run's daemon log and report there (TAG-daemon.log, TAG-report.json, TAG the run's label) for
# bench/parts_project.py, and the first 16 hex digits of its model.safetensors' SHA-256
# (TAG-model.sha256: runs of two builds compared). PARTS_SKIP_1=1 runs the N-worker runs
# only (an A/B of builds whose 1-worker runs are the same code).
# Results: bench/results/parts.md.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/release}
SHAPE=${2:-7b}
N=${3:-2}
ROUNDS=${4:-2}
S=${5:-16}
L=${6:-512}
for x in quantd quantd-worker quantctl; do [ -x "$B/$x" ] || { echo "parts.sh: $B/$x not built" >&2; exit 1; }; done
command -v redis-server >/dev/null || { echo "parts.sh: no redis-server" >&2; exit 1; }
T=$(mktemp -d /tmp/quantd-bench-parts-XXXXXX)
RP=; DP=
cleanup() { [ -n "$DP" ] && kill -9 "$DP" 2>/dev/null; [ -n "$RP" ] && kill -9 "$RP" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
export QUANTD_THREADS=1 OPENBLAS_NUM_THREADS=1
case "$SHAPE" in
    7b) G=(--hidden 4096 --intermediate 11008 --heads 32 --kv-heads 32) ;;
    mixtral) G=(--hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --experts 8) ;;
    *) echo "parts.sh: SHAPE is 7b or mixtral" >&2; exit 1 ;;
esac
"$B/quantctl" gen-model --out "$T/m" --layers "${PARTS_LAYERS:-1}" "${G[@]}" --max-pos 4096 --vocab 512 --dtype f16 > /dev/null
python3 -c "import json,random; random.seed(0); json.dump({'tokens':[random.randrange(512) for _ in range($S*$L+4096)]}, open('$T/ids.json','w'))"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no > "$T/redis.log" 2>&1 &
RP=$!
until redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG; do sleep 0.1; done

run() {   # run WORKERS TAG: one job on a fresh daemon with cpu:WORKERS
    local w=$1 tag=$2 out="$T/out-$2"
    "$B/quantd" --redis "redis://127.0.0.1:$PORT" --workers "cpu:$w" --allow-root "$T" --node "bench-$tag" \
        > "$T/d-$tag.log" 2>&1 &
    DP=$!
    local job
    job=$(printf '{"model":"%s","output":"%s","method":"gptq","bits":4,"group_size":128,"calibration":{"path":"%s","samples":%d,"seq_len":%d%s}%s}' \
          "$T/m" "$out" "$T/ids.json" "$S" "$L" "${PARTS_CALIB_EXTRA:-}" "${PARTS_JOB_EXTRA:-}")
    redis-cli -p "$PORT" LPUSH qjobs "$job" > /dev/null
    local i=0
    until [ -f "$out/quantd_report.json" ] && ! [ -d "$out/.quantd" ]; do
        sleep 1; i=$((i + 1))
        [ $i -lt 7200 ] || { echo "parts.sh: the job did not finish" >&2; tail -5 "$T/d-$tag.log" >&2; exit 1; }
        kill -0 "$DP" 2>/dev/null || { echo "parts.sh: quantd exited" >&2; tail -5 "$T/d-$tag.log" >&2; exit 1; }
    done
    kill "$DP"; wait "$DP" 2>/dev/null || true; DP=
    if [ -n "${PARTS_KEEP:-}" ]; then
        mkdir -p "$PARTS_KEEP"
        cp "$T/d-$tag.log" "$PARTS_KEEP/$tag-daemon.log"
        cp "$out/quantd_report.json" "$PARTS_KEEP/$tag-report.json"
        sha256sum < "$out/model.safetensors" | cut -c1-16 > "$PARTS_KEEP/$tag-model.sha256"
    fi
    python3 - "$out/quantd_report.json" "$w" "$tag" <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1])); w, tag = sys.argv[2], sys.argv[3]
for bi, b in enumerate(r["blocks"]):
    st = b["stages"]
    q = sum(st[k] for k in ("quantize", "pack", "error", "kernel_check"))
    by = collections.Counter(l.get("worker", "in memory") for l in r["layers"] if l.get("block", 0) == bi)
    label = tag if len(r["blocks"]) == 1 else f"{tag} b{bi}"
    print(f"| {label} | {w} | {b['seconds']:.1f} | {st['calibrate']:.1f} | {q:.1f} | {st['forward']:.1f} | "
          f"{st['checkpoint']:.2f} | " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + " |")
PY
    FIRST=${FIRST:-$out}
    cmp "$out/model.safetensors" "$FIRST/model.safetensors" ||
        { echo "parts.sh: $tag's output differs from the first run's" >&2; exit 1; }
}

echo "$SHAPE-shaped block, GPTQ w4 g128, $S x $L tokens, workers of 1 thread${PARTS_JOB_EXTRA:+, job extra: $PARTS_JOB_EXTRA}${PARTS_CALIB_EXTRA:+, calibration extra: $PARTS_CALIB_EXTRA}"
echo
echo "| run | workers | block s | calibrate s | quantize step s | forward s | checkpoint s | linears by worker |"
echo "|---|---|---|---|---|---|---|---|"
for r in $(seq 1 "$ROUNDS"); do
    [ -n "${PARTS_SKIP_1:-}" ] || run 1 "r$r-1"
    [ "$N" = 1 ] || run "$N" "r$r-$N"
done
