#!/usr/bin/env bash
# The scale search (job.scale_search "mse") against min-max on a real trained model,
# SmolLM2-135M: KL to the float model, top-1 agreement and WikiText-2 perplexity of GPTQ
# (w4 g64 sym; act-order + static groups; int3 g64) and RTN (w4 g64 sym and zero-point),
# each on two calibration draws (bench/calib_windows.py seeds 0 and 1; RTN reads none).
# Written to bench/results/scale-search.md.
#
#   bench/scale_search.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]   (defaults 8, 16, 256)
#
# BUILD_DIR: a Release quantctl; MODEL_DIR: the float32 SmolLM2-135M directory (as
# bench/schemes.sh). SCALE_SEARCH_VARIANTS overrides the list of TAG:METHOD:BITS:SYM:DESC_ACT:
# STATIC:SEARCH:SEED; SCALE_SEARCH_QCTL_<name> (e.g. a quantctl built with another exponent)
# runs the variants whose SEARCH is <name> with that binary and the job's scale_search mse.
# Raw eval lines go to BUILD_DIR/scale-search-bench/; a rerun keeps results made over the
# same WINDOWS (delete the folder to redo).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/scale_search.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-8}" samples="${4:-16}" seq="${5:-256}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
work="$build/scale-search-bench"
out="$here/results/scale-search.md"
threads="${SCALE_SEARCH_THREADS:-2}"
[ -x "$qctl" ] || { echo "scale_search.sh: $qctl not built" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "scale_search.sh: $model has no config.json" >&2; exit 1; }
mkdir -p "$work"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads

[ -s "$work/wiki.ids.json" ] || "$qctl" tokenize --model "$model" --text "$data/text/wikitext-2-raw/wiki.test.raw" --bos \
    --out "$work/wiki.ids.json" >/dev/null
[ -s "$work/c4.ids.json" ] || "$qctl" tokenize --model "$model" --text "$data/text/c4/c4-calib.jsonl" --jsonl \
    --out "$work/c4.ids.json" >/dev/null
for seed in 0 1; do
    [ -s "$work/calib-$seed.ids.json" ] || python3 "$here/calib_windows.py" "$work/c4.ids.json" "$samples" "$seq" "$seed" \
        "$work/calib-$seed.ids.json"
done
kept() { [ -s "$1" ] && [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['windows'])" "$1")" = "$windows" ]; }
kept "$work/eval-fp.json" || "$qctl" eval --model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 \
    --max-windows "$windows" --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-fp.json"

# In the order that decides first: seed 0's GPTQ pairs, RTN, GPTQ's reference exponent 2.4
# (when SCALE_SEARCH_QCTL_mse24 names a quantctl built with search_norm 2.4), then seed 1.
g() { echo "gptq-w4g64-s$1-$2:gptq:4:true:false:false:$2:$1 gptq-w4g64-act-static-s$1-$2:gptq:4:true:true:true:$2:$1 gptq-w3g64-s$1-$2:gptq:3:true:false:false:$2:$1"; }
default_variants="$(g 0 minmax) $(g 0 mse)"
for s in minmax mse; do
    default_variants+=" rtn-w4g64-sym-$s:rtn:4:true:false:false:$s:0 rtn-w4g64-zp-$s:rtn:4:false:false:false:$s:0"
    default_variants+=" rtn-w3g64-sym-$s:rtn:3:true:false:false:$s:0"
done
[ -z "${SCALE_SEARCH_QCTL_mse24:-}" ] || default_variants+=" gptq-w4g64-s0-mse24:gptq:4:true:false:false:mse24:0 gptq-w4g64-act-static-s0-mse24:gptq:4:true:true:true:mse24:0 gptq-w3g64-s0-mse24:gptq:3:true:false:false:mse24:0 rtn-w4g64-sym-mse24:rtn:4:true:false:false:mse24:0 rtn-w4g64-zp-mse24:rtn:4:false:false:false:mse24:0 rtn-w3g64-sym-mse24:rtn:3:true:false:false:mse24:0"
default_variants+=" $(g 1 minmax) $(g 1 mse)"
variants="${SCALE_SEARCH_VARIANTS:-$default_variants}"
for v in $variants; do
    IFS=: read -r tag meth bits sym act static search seed <<< "$v"
    dir="$work/out-$tag"
    if kept "$work/eval-$tag.json"; then echo "$tag: kept" >&2; continue; fi
    rm -rf "$dir"
    bin="$qctl" js="$search"
    alt="SCALE_SEARCH_QCTL_$search"
    if [ -n "${!alt:-}" ]; then bin="${!alt}" js=mse; fi
    cal=""
    [ "$meth" = rtn ] || cal=", \"calibration\": {\"path\": \"$work/calib-$seed.ids.json\", \"samples\": $samples, \"seq_len\": $seq, \"style\": \"awq\"}"
    echo "{\"model\": \"$model\", \"output\": \"$dir\", \"method\": \"$meth\", \"bits\": $bits, \"group_size\": 64, \"sym\": $sym, \"desc_act\": $act, \"static_groups\": $static, \"scale_search\": \"$js\", \"format\": \"gptq_v2\"$cal}" > "$work/job-$tag.json"
    t0=$(date +%s.%N)
    "$bin" quantize --threads "$threads" "$work/job-$tag.json" > "$work/log-$tag.txt" 2>&1 || { echo "$tag: quantize failed" >&2; continue; }
    echo "$(date +%s.%N) - $t0" | bc > "$work/seconds-$tag.txt"
    "$qctl" eval --model "$dir" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 --max-windows "$windows" \
        --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-$tag.json"
    rm -rf "$dir"
    echo "$tag: $(cat "$work/seconds-$tag.txt") s $(cat "$work/eval-$tag.json")" >&2
done

python3 - "$work" "$out" "$windows" "$samples" "$seq" "$variants" "$(uname -n)" "$(nproc)" <<'PY'
import json, os, sys, datetime
work, out, windows, samples, seq, variants, host, ncpu = sys.argv[1:]
fp = json.load(open(os.path.join(work, "eval-fp.json")))
def load(tag):
    p = os.path.join(work, "eval-%s.json" % tag)
    if not os.path.exists(p) or not os.path.getsize(p): return None
    e = json.load(open(p))
    sp = os.path.join(work, "seconds-%s.txt" % tag)
    e["seconds"] = float(open(sp).read()) if os.path.exists(sp) else float("nan")
    return e
rows = []
for v in variants.split():
    tag, meth, bits, sym, act, static, search, seed = v.split(":")
    e = load(tag)
    cfg = "w%s g64 %s%s" % (bits, "sym" if sym == "true" else "zero-point", ", act-order + static groups" if act == "true" else "")
    cal = "none" if meth == "rtn" else "%s x %s, seed %s" % (samples, seq, seed)
    if e is None:
        rows.append("| %s | %s | %s | %s | - | - | - | - |" % (meth, cfg, cal, search)); continue
    rows.append("| %s | %s | %s | %s | %.3f | %.5f | %.2f%% | %.0f |" % (meth, cfg, cal, search, e["ppl"], e["kl_mean"],
                100 * e["top1_agree"], e["seconds"]))
with open(out, "w") as f:
    f.write("# Scale search (job.scale_search) on SmolLM2-135M\n\n")
    f.write("Date: %s. Machine: %s, %s CPUs shared with other builds (seconds are wall time on a loaded machine, "
            "the whole `quantctl quantize` job). Produced by `bench/scale_search.sh BUILD BUILD/smollm2/SmolLM2-135M %s %s %s` "
            "(BUILD: a Release build).\n\n" % (datetime.date.today(), host, ncpu, windows, samples, seq))
    f.write("Evaluation: the first %s windows of 512 tokens of wiki.test.raw; KL is mean KL(P_float || P_quant) per "
            "token in nats, top-1 the share of positions whose most likely token is the float model's (`quantctl eval "
            "--ref-model`). Calibration: %s x %s ids of c4-calib.jsonl (bench/calib_windows.py with the seed shown). "
            "Format gptq_v2, group 64.\n\n" % (windows, samples, seq))
    f.write("scale_search mse is quantd's (the error's exponent 2); mse24 is the same search with GPTQ's reference "
            "exponent 2.4 (a quantctl built with search_norm 2.4, SCALE_SEARCH_QCTL_mse24).\n\n")
    f.write("| method | settings | calibration | scale_search | PPL | KL to float | top-1 | seconds |\n|---|---|---|---|---|---|---|---|\n")
    f.write("| float | - | - | - | %.3f | - | - | - |\n" % fp["ppl"])
    f.write("\n".join(rows) + "\n\nRaw `quantctl eval` lines:\n\n```\n")
    f.write("fp: %s\n" % json.dumps(fp))
    for v in variants.split():
        tag = v.split(":")[0]
        p = os.path.join(work, "eval-%s.json" % tag)
        if os.path.exists(p) and os.path.getsize(p): f.write("%s: %s\n" % (tag, open(p).read().strip()))
    f.write("```\n")
print("wrote", out)
PY
