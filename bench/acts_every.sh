#!/usr/bin/env bash
# What checkpoint.acts_every saves and what it costs (issue #19): one generated model (BLOCKS
# blocks of hidden 1024, intermediate 2816, BF16) quantized with GPTQ at SAMPLES x SEQ_LEN
# calibration tokens, once per acts_every value given, printing the checkpoint bytes written
# (the report's totals.checkpoint_bytes_written) and the job's CPU seconds; then, for the
# largest value, the job killed (-9) after its last block's commit but one and resumed: the
# seconds the resume spent recomputing the blocks after the last kept activations (its
# resume_replay log line) and whether the output is byte-identical to the uninterrupted one.
#
#   bench/acts_every.sh [BUILD_DIR] [BLOCKS] [SAMPLES] [SEQ_LEN] [EVERY...]
#
# Defaults: build/release, 8 blocks, 16 x 512, acts_every 1 and 4. Results:
# bench/results/acts-every.md.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/release}
NB=${2:-8}
S=${3:-16}
L=${4:-512}
shift $(( $# < 4 ? $# : 4 ))
EVERY=("$@")
[ ${#EVERY[@]} -gt 0 ] || EVERY=(1 4)
Q="$B/quantctl"
[ -x "$Q" ] || { echo "acts_every.sh: $Q not built" >&2; exit 1; }
T=$(mktemp -d /tmp/quantd-bench-acts-XXXXXX)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)}

"$Q" gen-model --out "$T/m" --layers "$NB" --hidden 1024 --intermediate 2816 --heads 16 --kv-heads 16 \
    --max-pos 4096 --vocab 512 --dtype bf16 > /dev/null
python3 -c "import json,random; random.seed(0); json.dump({'tokens':[random.randrange(512) for _ in range($S*$L+4096)]}, open('$T/ids.json','w'))"
job() {   # job OUT EVERY
    cat <<JOB
{"model": "$T/m", "output": "$1", "method": "gptq", "bits": 4, "group_size": 128,
 "calibration": {"path": "$T/ids.json", "samples": $S, "seq_len": $L}, "checkpoint": {"acts_every": $2}}
JOB
}
bytes_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['totals']['checkpoint_bytes_written'])" "$1"; }

echo "model: $NB blocks, hidden 1024, BF16; GPTQ w4 g128 at $S x $L tokens; $(nproc) threads"
echo
echo "| acts_every | checkpoint bytes written | per block | CPU s | wall s |"
echo "|---|---|---|---|---|"
for e in "${EVERY[@]}"; do
    job "$T/out-$e" "$e" > "$T/job-$e.json"
    /usr/bin/time -f "%e %U %S" -o "$T/time-$e" "$Q" quantize "$T/job-$e.json" > "$T/log-$e" 2>&1 ||
        { echo "acts_every.sh: the job failed:" >&2; tail -5 "$T/log-$e" >&2; exit 1; }
    read -r wall usr sys_s < "$T/time-$e"
    b=$(bytes_of "$T/out-$e/quantd_report.json")
    echo "| $e | $b | $((b / NB)) | $(python3 -c "print(round($usr + $sys_s, 1))") | $wall |"
done

# The kill and the resume, for the largest acts_every.
e=${EVERY[-1]}
ref="$T/out-$e"
out="$T/killed"
job "$out" "$e" > "$T/job-kill.json"
"$Q" quantize "$T/job-kill.json" > "$T/log-kill" 2>&1 &
pid=$!
until grep -q "block_done .*block=$((NB - 1))/$NB" "$T/log-kill" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "acts_every.sh: the job ended before block $((NB - 1))" >&2; exit 1; }
    sleep 0.2
done
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
acts=$(ls "$out/.quantd" | grep -c '^acts-' || true)
/usr/bin/time -f "%e %U %S" -o "$T/time-resume" "$Q" quantize "$T/job-kill.json" > "$T/log-resume" 2>&1
read -r wall usr sys_s < "$T/time-resume"
replay=$(grep -o 'resume_replay.*' "$T/log-resume" || echo "resume_replay: none")
same=$(cmp -s "$ref/model.safetensors" "$out/model.safetensors" && echo "byte-identical" || echo "DIFFERENT")
echo
echo "killed after block $((NB - 1)) of $NB with acts_every $e ($acts activation file(s) on disk); resume: wall $wall s, CPU $(python3 -c "print(round($usr + $sys_s, 1))") s"
echo "$replay"
echo "output: $same to the uninterrupted run"
