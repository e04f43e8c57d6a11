#!/usr/bin/env bash
# kill -9 at random instants of a real job, restart until it finishes: the output must be
# byte-identical to an uninterrupted run (the checkpoint contract of quant/pipeline).
# Uses $QUANTD_BUILD_DIR/quantctl and tiny-llama-c4 from $QUANTD_SHARED_DATA (skipped when absent).
set -u
Q="${QUANTD_BUILD_DIR:-}/quantctl"
D="${QUANTD_SHARED_DATA:-}"
[ -x "$Q" ] || { echo "SKIP: quantctl not built (QUANTD_BUILD_DIR=${QUANTD_BUILD_DIR:-unset})"; exit 77; }
M="$D/models/tiny-llama-c4"
C="$D/text/c4/c4-calib.jsonl"
[ -n "$D" ] && [ -d "$M" ] && [ -f "$C" ] || { echo "SKIP: no shared data (QUANTD_SHARED_DATA=${D:-unset})"; exit 77; }
T=$(mktemp -d)
PID=""
trap '[ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

job() {   # job OUT: a gptq job spec into $T/OUT.json
    cat >"$T/$1.json" <<JSON
{"id":"kill-$1","model":"$M","output":"$T/$1","method":"gptq","bits":4,"group_size":128,
 "calibration":{"path":"$C","samples":16,"seq_len":128,"seed":7},"backend":"cpu"}
JSON
}
next_block() { sed -n 's/.*"next_block"[^0-9]*\([0-9]*\).*/\1/p' "$1/.quantd/state.json" 2>/dev/null | head -1; }

job ref
start=$(date +%s%N)
"$Q" quantize "$T/ref.json" --threads 2 >"$T/ref.log" 2>&1 || fail "uninterrupted run: $(tail -3 "$T/ref.log")"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ -s "$T/ref/model.safetensors" ] || fail "no model.safetensors in the uninterrupted run"
echo "uninterrupted run: ${ms} ms"

job run
RANDOM=$$
kills=0
for attempt in $(seq 1 20); do
    "$Q" quantize "$T/run.json" --threads 2 >"$T/run.log" 2>&1 &
    PID=$!
    # Kill at a random instant after the run has made progress past where it resumed from.
    before=$(next_block "$T/run")
    target=$(( ${before:-0} + RANDOM % 2 ))
    delay_ms=$(( RANDOM % 150 ))
    killed=0
    while kill -0 "$PID" 2>/dev/null; do
        nb=$(next_block "$T/run")
        if [ $kills -lt 4 ] && [ -n "$nb" ] && [ "$nb" -ge "$target" ]; then
            sleep "0.$(printf '%03d' $delay_ms)"
            if kill -9 "$PID" 2>/dev/null; then killed=1; kills=$((kills + 1)); echo "killed at next_block=$(next_block "$T/run") (attempt $attempt)"; fi
            break
        fi
        sleep 0.02
    done
    wait "$PID" 2>/dev/null; rc=$?
    PID=""
    if [ $killed = 0 ]; then
        [ $rc = 0 ] || fail "run exited $rc: $(tail -3 "$T/run.log")"
        break
    fi
done
[ -s "$T/run/model.safetensors" ] || fail "the killed-and-restarted job never finished"
[ $kills -ge 1 ] || fail "the job was never killed mid-run (too fast to interrupt?)"
cmp "$T/ref/model.safetensors" "$T/run/model.safetensors" || fail "model.safetensors differs after $kills kills"
cmp "$T/ref/config.json" "$T/run/config.json" || fail "config.json differs"
[ ! -e "$T/run/.quantd" ] || fail ".quantd left behind"
echo "OK: byte-identical after $kills kill(s)"
