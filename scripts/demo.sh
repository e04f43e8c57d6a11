#!/usr/bin/env bash
# The demo: starts a throwaway redis-server and quantd on loopback, pushes a quantization
# job with `redis-cli LPUSH qjobs`, shows its progress until it is done, then prints where
# the output is and its report. The model is ../shared/data/models/tiny-llama-c4 (GPTQ with
# C4 calibration) when present, else a small generated llama (RTN).
# Usage: scripts/demo.sh [BUILD_DIR]   (default build/release)
set -euo pipefail
BUILD=$(cd "${1:-build/release}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for x in quantd quantd-worker quantctl; do
    [ -x "$BUILD/$x" ] || { echo "demo: $BUILD/$x is missing; build first" >&2; exit 2; }
done
command -v redis-server >/dev/null || { echo "demo: redis-server is not installed (scripts/deps.sh)" >&2; exit 2; }
DIR=${QUANTD_DEMO_DIR:-$(mktemp -d /tmp/quantd-demo-XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

# A random loopback port; another one when it is taken (redis-server exits at once), and up to
# 30 s for it to answer on a loaded machine.
up=0
for _ in 1 2 3 4 5; do
    PORT=$((20000 + RANDOM % 30000))
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 &
    RPID=$!
    for _ in $(seq 300); do
        redis-cli -p "$PORT" PING >/dev/null 2>&1 && { up=1; break; }
        kill -0 "$RPID" 2>/dev/null || break
        sleep 0.1
    done
    [ "$up" = 1 ] && break
    kill "$RPID" 2>/dev/null || true
    wait "$RPID" 2>/dev/null || true
done
[ "$up" = 1 ] || { echo "demo: redis-server did not start (last log: $DIR/redis.log)" >&2; tail -5 "$DIR/redis.log" >&2; exit 1; }
PIDS+=("$RPID")

SHARED="$ROOT/../shared/data"
if [ -d "$SHARED/models/tiny-llama-c4" ] && [ -f "$SHARED/text/c4/c4-calib.jsonl" ]; then
    MODEL=$(cd "$SHARED/models/tiny-llama-c4" && pwd)
    CALIB=$(cd "$SHARED/text/c4" && pwd)/c4-calib.jsonl
    JOB="{\"id\":\"demo\",\"model\":\"$MODEL\",\"output\":\"$DIR/out\",\"method\":\"gptq\",\"bits\":4,\"group_size\":128,\"calibration\":{\"path\":\"$CALIB\",\"samples\":16,\"seq_len\":128},\"backend\":\"cpu\"}"
    ALLOW=(--allow-root "$DIR" --allow-root "$MODEL" --allow-root "$(dirname "$CALIB")")
    echo "model: $MODEL (GPTQ 4-bit, group 128, C4 calibration)"
else
    "$BUILD/quantctl" gen-model --out "$DIR/model" --layers 8 --hidden 256 >/dev/null
    JOB="{\"id\":\"demo\",\"model\":\"$DIR/model\",\"output\":\"$DIR/out\",\"method\":\"rtn\",\"bits\":4,\"group_size\":32,\"backend\":\"cpu\"}"
    ALLOW=(--allow-root "$DIR")
    echo "model: generated 8-layer llama in $DIR/model (RTN 4-bit, group 32)"
fi

"$BUILD/quantd" --redis "redis://127.0.0.1:$PORT" --node demo "${ALLOW[@]}" --workers cpu:1 >"$DIR/quantd.log" 2>&1 &
QPID=$!
PIDS+=($QPID)
echo "redis on 127.0.0.1:$PORT, quantd pid $QPID (log: $DIR/quantd.log)"
echo "\$ redis-cli -p $PORT LPUSH qjobs '$JOB'"
redis-cli -p "$PORT" LPUSH qjobs "$JOB" >/dev/null

last=""
for _ in $(seq 6000); do
    IFS=$'\t' read -r state stage block blocks progress err < <(redis-cli -p "$PORT" --no-raw HMGET qjob:demo state stage block blocks progress error |
        sed 's/^[0-9]*) //; s/^"//; s/"$//; s/(nil)//' | paste -sd $'\t')
    line="state=$state stage=$stage block=$((${block:--1} + 1))/${blocks:-?} progress=$(awk -v p="${progress:-0}" 'BEGIN { printf "%.0f", p * 100 }')%"
    [ "$line" != "$last" ] && echo "  $line" && last=$line
    case "$state" in
    done) break ;;
    failed|cancelled) echo "demo: the job ended $state: $err" >&2; exit 1 ;;
    esac
    kill -0 "$QPID" 2>/dev/null || { echo "demo: quantd exited; see $DIR/quantd.log" >&2; exit 1; }
    sleep 0.1
done
echo "output: $DIR/out"
ls -1 "$DIR/out"
echo "report summary:"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r.get("totals", r), indent=2))' "$DIR/out/quantd_report.json" 2>/dev/null ||
    head -c 1500 "$DIR/out/quantd_report.json"
kill -TERM "$QPID"; wait "$QPID" 2>/dev/null || true
