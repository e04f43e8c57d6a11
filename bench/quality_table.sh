#!/usr/bin/env bash
# The integer quality table on a real model (SmolLM2-135M): quantd's methods and options beside
# llm-compressor's, on the same calibration ids, over several calibration draws, every output
# evaluated by the same `quantctl eval --ref-model` (KL to the float model per token, top-1
# agreement, perplexity). Optional bench, never part of the build or ctest.
#
#   bench/quality_table.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]   (defaults 8, 16, 256)
#
# BUILD_DIR: a Release quantctl; MODEL_DIR: float32 SmolLM2-135M (bench/schemes.sh says how).
# TABLE_SEEDS (default "0 1 2 3"): the calibration draws, each SAMPLES windows of SEQ_LEN tokens
# of c4-calib.jsonl cut by bench/calib_windows.py with quantd's seeded sampler; both tools read
# the same id file in the same order (quantd with style "awq").
# TABLE_VARIANTS: a list of rows, each TOOL:METHOD:BITS:GROUP:SYM[:EXTRA]
#   q:...  quantd; METHOD rtn, gptq, awq, awq+gptq; SYM sym or zp; EXTRA: job fields
#          name=value joined by commas (JSON values: desc_act=true,static_groups=true,
#          scale_search='"mse"')
#   l:...  llm-compressor 0.14 ($LLMC_VENV, default BUILD_DIR/llmc-venv): METHOD rtn or gptq;
#          EXTRA for gptq the actorder: none, static, or default (not named; 0.14 resolves it to
#          static); 0.14 refuses "group" ("has been removed")
# Each output is compressed-tensors pack-quantized; "MB" is the size of its safetensors files
# (the float embeddings are the same in every row). Widths compressed-tensors' loaders do not
# read packed (3 bits): quantd writes format gptq, llm-compressor's weights are saved
# fake-quantized in float (their MB is a float model's, not a 3-bit one's). Results: BUILD_DIR/quality-table/ (one
# eval file per row and draw, kept across reruns with the same WINDOWS) and
# $TABLE_OUT (default bench/results/quality-table.md): per row the mean over the draws and
# the spread (min-max).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/quality_table.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-8}" samples="${4:-16}" seq="${5:-256}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
work="$build/quality-table"
out="${TABLE_OUT:-$here/results/quality-table.md}"
llmc="${LLMC_VENV:-$build/llmc-venv}"
threads="${TABLE_THREADS:-2}"
seeds="${TABLE_SEEDS:-0 1 2 3}"
variants="${TABLE_VARIANTS:-q:rtn:4:64:sym q:gptq:4:64:sym:desc_act=false q:gptq:4:64:sym:desc_act=true,static_groups=true l:gptq:4:64:sym:none l:gptq:4:64:sym:default}"
[ -x "$qctl" ] || { echo "quality_table.sh: $qctl not built" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "quality_table.sh: $model has no config.json" >&2; exit 1; }
mkdir -p "$work"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

[ -s "$work/wiki.ids.json" ] || "$qctl" tokenize --model "$model" --text "$data/text/wikitext-2-raw/wiki.test.raw" --bos --out "$work/wiki.ids.json" >/dev/null
[ -s "$work/c4.ids.json" ] || "$qctl" tokenize --model "$model" --text "$data/text/c4/c4-calib.jsonl" --jsonl --out "$work/c4.ids.json" >/dev/null
kept() { [ -s "$1" ] && [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['windows'])" "$1")" = "$windows" ]; }
kept "$work/eval-fp.json" || "$qctl" eval --model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 \
    --max-windows "$windows" --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-fp.json"

for seed in $seeds; do
    ids="$work/calib-s$seed-${samples}x$seq.ids.json"
    [ -s "$ids" ] || python3 "$here/calib_windows.py" "$work/c4.ids.json" "$samples" "$seq" "$seed" "$ids"
    for v in $variants; do
        IFS=: read -r tool meth bits group sym extra <<< "$v"
        tag="$(echo "$v" | tr ':=,+' '__.p' | tr -d '"')-s$seed-${samples}x$seq"
        dir="$work/out-$tag"
        if kept "$work/eval-$tag.json"; then continue; fi
        rm -rf "$dir"
        t0=$(date +%s.%N)
        if [ "$tool" = l ]; then
            [ -x "$llmc/bin/python" ] || { echo "$v: skipped (no llm-compressor venv at $llmc)" >&2; continue; }
            spec="$meth:$bits:$group:$([ "$sym" = sym ] && echo sym || echo asym)"
            [ "$meth" = gptq ] && spec="$spec:${extra:-none}"
            "$llmc/bin/python" "$here/llmcompressor_run.py" "$model" "$ids" "$samples" "$seq" "$dir" "$threads" "$spec" \
                > "$work/log-$tag.txt" 2>&1 || { echo "$v seed $seed: llm-compressor failed" >&2; continue; }
        else
            fields=""
            if [ -n "$extra" ]; then
                IFS=, read -ra kv <<< "$extra"
                for f in "${kv[@]}"; do fields="$fields, \"${f%%=*}\": ${f#*=}"; done
            fi
            fmt=compressed-tensors
            case "$bits" in 4|8) ;; *) fmt=gptq ;; esac
            cal=""
            [ "$meth" = rtn ] || cal=", \"calibration\": {\"path\": \"$ids\", \"samples\": $samples, \"seq_len\": $seq, \"style\": \"awq\"}"
            echo "{\"model\": \"$model\", \"output\": \"$dir\", \"method\": \"$meth\", \"bits\": $bits, \"group_size\": $group, \"sym\": $([ "$sym" = sym ] && echo true || echo false), \"format\": \"$fmt\"$fields$cal}" > "$work/job-$tag.json"
            "$qctl" quantize --threads "$threads" "$work/job-$tag.json" > "$work/log-$tag.txt" 2>&1 || { echo "$v seed $seed: quantize failed (log-$tag.txt)" >&2; continue; }
        fi
        echo "$(date +%s.%N) - $t0" | bc > "$work/seconds-$tag.txt"
        du -cb "$dir"/*.safetensors | tail -1 | cut -f1 > "$work/bytes-$tag.txt"
        "$qctl" eval --model "$dir" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 --max-windows "$windows" \
            --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-$tag.json"
        echo "$v seed $seed: $(cat "$work/eval-$tag.json")" >&2
    done
done

python3 - "$work" "$out" "$windows" "$samples" "$seq" "$variants" "$seeds" "$(uname -n)" "$(getconf _NPROCESSORS_ONLN)" <<'PY'
import json, os, sys, datetime
work, out, windows, samples, seq, variants, seeds, host, ncpu = sys.argv[1:]
seeds = seeds.split()
fp = json.load(open(os.path.join(work, "eval-fp.json")))
def tag(v, s):
    return v.translate(str.maketrans(":=,+", "__.p")).replace('"', '') + "-s%s-%sx%s" % (s, samples, seq)
def describe(v):
    f = v.split(":")
    tool = "quantd" if f[0] == "q" else "llm-compressor"
    extra = f[5] if len(f) > 5 else ""
    if f[0] == "l" and f[1] == "gptq": extra = "actorder " + (extra or "none")
    return tool, f[1], "int%s g%s %s" % (f[2], f[3], "sym" if f[4] == "sym" else "zero point"), extra.replace(",", ", ")
rows, raw = [], []
for v in variants.split():
    ev = []
    for s in seeds:
        p = os.path.join(work, "eval-%s.json" % tag(v, s))
        if os.path.exists(p) and os.path.getsize(p):
            e = json.load(open(p)); ev.append((s, e))
            sec = open(os.path.join(work, "seconds-%s.txt" % tag(v, s))).read().strip()
            mb = int(open(os.path.join(work, "bytes-%s.txt" % tag(v, s))).read()) / 1e6
            raw.append("%s seed %s: %s seconds=%.0f MB=%.3f" % (v, s, json.dumps(e), float(sec), mb))
    tool, meth, grid, extra = describe(v)
    if not ev:
        rows.append("| %s | %s | %s | %s | not run | - | - | - | - |" % (tool, meth, grid, extra)); continue
    kl = [e["kl_mean"] for _, e in ev]; ppl = [e["ppl"] for _, e in ev]; t1 = [e["top1_agree"] for _, e in ev]
    mb = int(open(os.path.join(work, "bytes-%s.txt" % tag(v, ev[0][0]))).read()) / 1e6
    dense = v.split(":")[0] == "l" and v.split(":")[2] not in ("4", "8")   # saved fake-quantized in float
    rows.append("| %s | %s | %s | %s | %.4f | %.4f-%.4f | %.2f | %.2f%% | %s | %s |" % (
        tool, meth, grid, extra, sum(kl) / len(kl), min(kl), max(kl), sum(ppl) / len(ppl), 100 * sum(t1) / len(t1),
        "(float)" if dense else "%.3f" % mb, len(ev)))
with open(out, "w") as f:
    f.write("# Integer quality table: quantd and llm-compressor on SmolLM2-135M\n\n")
    f.write("Date: %s. Machine: %s, %s CPUs shared with other builds. Produced by `TABLE_SEEDS=\"%s\" "
            "TABLE_VARIANTS=\"%s\" bench/quality_table.sh BUILD BUILD/smollm2/SmolLM2-135M %s %s %s` "
            "(BUILD: a Release build; llm-compressor 0.14 from bench/llmcompressor_setup.sh).\n\n"
            % (datetime.date.today(), host, ncpu, " ".join(seeds), variants, windows, samples, seq))
    f.write("Evaluation: the first %s windows of 512 tokens of wiki.test.raw, KL(P_float || P_quant) per token in "
            "nats, top-1 agreement, perplexity (float: %.3f), all by `quantctl eval --ref-model`, for both tools' "
            "outputs. Calibration: %s x %s ids of c4-calib.jsonl per draw (bench/calib_windows.py, the seed is the "
            "draw), the same ids in the same order for both tools. KL: the mean over the draws and the spread "
            "(min-max); MB: the output's safetensors bytes (float embeddings included, the same in every row).\n\n"
            % (windows, fp["ppl"], samples, seq))
    f.write("| tool | method | grid | options | KL | KL spread | PPL | top-1 | MB | draws |\n|---|---|---|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n\nRaw `quantctl eval` lines:\n\n```\nfp: %s\n%s\n```\n" % (json.dumps(fp), "\n".join(raw)))
print("wrote", out)
PY
