#!/usr/bin/env bash
# GPTAQ against plain GPTQ on a real trained model, SmolLM2-135M: integer w4 g64 and w3 g64
# (symmetric, format gptq), each with and without job.gptaq, on two calibration draws
# (bench/calib_windows.py seeds 0 and 1). Quality: KL(P_float || P_quant) per token, top-1
# agreement and perplexity on the first WINDOWS windows of 512 tokens of wiki.test.raw
# (`quantctl eval --ref-model`); cost: the job's wall seconds and the report's measured peak
# resident set. Written to bench/results/gptaq.md.
#
#   bench/gptaq.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]   (defaults 8, 16, 256)
#
# BUILD_DIR: a Release quantctl (CPU). MODEL_DIR: the float32 SmolLM2-135M directory (see
# bench/schemes.sh). Raw eval lines go to BUILD_DIR/gptaq-bench/; a rerun keeps the results
# already there (delete the folder to redo).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/gptaq.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-8}" samples="${4:-16}" seq="${5:-256}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
work="$build/gptaq-bench"
out="$here/results/gptaq.md"
threads="${GPTAQ_THREADS:-1}"
[ -x "$qctl" ] || { echo "gptaq.sh: $qctl not built" >&2; exit 1; }
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
[ -s "$work/eval-fp.json" ] || "$qctl" eval --model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 \
    --max-windows "$windows" --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-fp.json"

variants="${GPTAQ_VARIANTS:-4:0:0 4:0:1 3:0:0 3:0:1 4:1:0 4:1:1 3:1:0 3:1:1}"   # bits:seed:gptaq
for v in $variants; do
    IFS=: read -r bits seed gq <<< "$v"
    tag="w${bits}g64-s$seed-$([ "$gq" = 1 ] && echo gptaq || echo gptq)"
    dir="$work/out-$tag"
    if [ -s "$work/eval-$tag.json" ]; then echo "$tag: kept" >&2; continue; fi
    rm -rf "$dir"
    g=false; [ "$gq" = 1 ] && g=true
    echo "{\"model\": \"$model\", \"output\": \"$dir\", \"method\": \"gptq\", \"bits\": $bits, \"group_size\": 64, \"sym\": true,
 \"format\": \"gptq\", \"gptaq\": $g, \"backend\": \"cpu\",
 \"calibration\": {\"path\": \"$work/calib-$seed.ids.json\", \"samples\": $samples, \"seq_len\": $seq, \"style\": \"awq\"}}" \
        > "$work/job-$tag.json"
    t0=$(date +%s.%N)
    "$qctl" quantize --threads "$threads" "$work/job-$tag.json" > "$work/log-$tag.txt" 2>&1 || { echo "$tag: quantize failed" >&2; continue; }
    echo "$(date +%s.%N) - $t0" | bc > "$work/seconds-$tag.txt"
    "$qctl" eval --model "$dir" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 --max-windows "$windows" \
        --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-$tag.json"
    echo "$tag: $(cat "$work/eval-$tag.json")" >&2
done

# The cost, back to back on draw 1 at w4 (CPU seconds and the largest resident set by
# /usr/bin/time; the outputs must be the bytes of the runs above: the jobs are deterministic).
for tag in w4g64-s1-gptq w4g64-s1-gptaq; do
    [ -s "$work/ttime-$tag.txt" ] && continue
    [ -s "$work/job-$tag.json" ] || continue
    sed "s#out-$tag#time-$tag#" "$work/job-$tag.json" > "$work/tjob-$tag.json"
    rm -rf "$work/time-$tag"
    /usr/bin/time -f "wall %e user %U sys %S maxrss_kb %M" "$qctl" quantize --threads "$threads" "$work/tjob-$tag.json" \
        > "$work/tlog-$tag.txt" 2> "$work/ttime-$tag.txt"
    cmp -s "$work/time-$tag/model.safetensors" "$work/out-$tag/model.safetensors" || echo "$tag: not the same bytes" >&2
done

python3 - "$work" "$out" "$windows" "$samples" "$seq" "$variants" "$(uname -n)" "$(nproc)" "$threads" <<'PY'
import json, os, sys, datetime
work, out, windows, samples, seq, variants, host, ncpu, threads = sys.argv[1:]
fp = json.load(open(os.path.join(work, "eval-fp.json")))
rows, raw = [], []
for v in variants.split():
    bits, seed, gq = v.split(":")
    tag = "w%sg64-s%s-%s" % (bits, seed, "gptaq" if gq == "1" else "gptq")
    p = os.path.join(work, "eval-%s.json" % tag)
    if not os.path.exists(p) or not os.path.getsize(p):
        rows.append("| w%s g64 sym | %s | %s | - | - | - | - | - | not run |" % (bits, seed, "gptaq" if gq == "1" else "gptq")); continue
    e = json.load(open(p))
    raw.append("%s: %s" % (tag, json.dumps(e)))
    sec = float(open(os.path.join(work, "seconds-%s.txt" % tag)).read())
    rep = json.load(open(os.path.join(work, "out-%s" % tag, "quantd_report.json")))
    rss = rep["resources"]["measured"]["peak_rss_bytes"] / 2**20
    st = rep["totals"]["stage_seconds"]
    rows.append("| w%s g64 sym | %s | %s | %.3f | %.5f | %.2f%% | %.0f | %.0f | %.0f |" % (
        bits, seed, "GPTAQ" if gq == "1" else "GPTQ", e["ppl"], e["kl_mean"], 100 * e["top1_agree"], sec,
        st.get("calibrate", 0), rss))
with open(out, "w") as f:
    f.write("# GPTAQ against GPTQ: SmolLM2-135M, WikiText-2\n\n")
    f.write("Date: %s. Machine: %s, %s CPUs shared with other builds (seconds are indicative, one thread). "
            "Produced by `bench/gptaq.sh BUILD BUILD/smollm2/SmolLM2-135M %s %s %s` (BUILD: a Release build, CPU backend).\n\n"
            % (datetime.date.today(), host, ncpu, windows, samples, seq))
    f.write("Jobs: method gptq, format gptq, symmetric, group 64, true-sequential (the default), calibration %s x %s ids of "
            "c4-calib.jsonl drawn by bench/calib_windows.py with seed 0 or 1 (style awq: the windows in order), with "
            "`\"gptaq\": false` or `true`. Evaluation: the first %s windows of 512 tokens of wiki.test.raw; KL is mean "
            "KL(P_float || P_quant) per token in nats, top-1 the share of positions whose most likely token is the float "
            "model's (`quantctl eval --ref-model`). Peak RSS is the report's measured peak resident set of the job.\n\n"
            % (samples, seq, windows))
    f.write("| grid | draw | method | PPL | KL to float | top-1 | job seconds | calibrate seconds | peak RSS MiB |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    f.write("| float | - | - | %.3f | - | - | - | - | - |\n" % fp["ppl"])
    f.write("\n".join(rows) + "\n\n")
    kl = {}
    for v in variants.split():
        bits, seed, gq = v.split(":")
        p = os.path.join(work, "eval-w%sg64-s%s-%s.json" % (bits, seed, "gptaq" if gq == "1" else "gptq"))
        if os.path.exists(p) and os.path.getsize(p): kl[(bits, seed, gq)] = json.load(open(p))["kl_mean"]
    summ = []
    for bits in ("4", "3"):
        for seed in ("0", "1"):
            if (bits, seed, "0") in kl and (bits, seed, "1") in kl:
                summ.append("w%s draw %s: KL %.4f -> %.4f (%+.0f%%)" % (bits, seed, kl[(bits, seed, "0")], kl[(bits, seed, "1")],
                            100 * (kl[(bits, seed, "1")] / kl[(bits, seed, "0")] - 1)))
    if summ:
        f.write("GPTAQ against GPTQ, KL to float per draw: " + "; ".join(summ) + ".\n\n")
    cost = []
    for tag in ("w4g64-s1-gptq", "w4g64-s1-gptaq"):
        p = os.path.join(work, "ttime-%s.txt" % tag)
        if os.path.exists(p):
            v = open(p).read().strip().splitlines()[-1].split()
            d = dict(zip(v[0::2], v[1::2]))
            cost.append("| %s | %s | %.1f | %.0f |" % (tag, d["wall"], float(d["user"]) + float(d["sys"]), int(d["maxrss_kb"]) / 1024))
    if cost:
        f.write("The cost, the two w4 draw-1 jobs run again back to back (`/usr/bin/time`; their outputs are the bytes "
                "of the runs above):\n\n| job | wall s | CPU s | max RSS MiB |\n|---|---|---|---|\n" + "\n".join(cost) + "\n\n")
    f.write("Raw `quantctl eval` lines:\n\n```\nfp: %s\n%s\n```\n" % (json.dumps(fp), "\n".join(raw)))
print("wrote", out)
PY
