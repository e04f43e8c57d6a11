#!/usr/bin/env bash
# job.target_bpw on a real trained model, SmolLM2-135M: KL to the float model and the stored
# size of the quantized linears for uniform GPTQ W4 (symmetric, compressed-tensors) at group
# 192 (the largest group that fits every layer: hidden 576 is 64 x 9, no multiple of 128),
# 64 and 32, against mixed-bit jobs at target_bpw 4.25 and 4.5 (candidates 4 and 8 bits x
# groups 32, 64, 192; t-4.25c adds the channel group, -1; t-4.25a is t-4.25 with GPTAQ), and target 3.5 (below every
# candidate compressed-tensors holds: the refusal is recorded). Written to
# bench/results/target-bpw.md.
#
#   bench/target_bpw.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]   (defaults 8, 16, 256)
#
# Calibration and evaluation as bench/schemes.sh: SAMPLES x SEQ_LEN ids of c4-calib.jsonl
# (bench/calib_windows.py, seed 0, style "awq": consecutive rows), the first WINDOWS windows of
# 512 tokens of wiki.test.raw, `quantctl eval --ref-model` (KL(P_float || P_quant) per token,
# top-1 agreement). Size: the bytes of every quantized linear's weight_packed, weight_scale
# and weight_zero_point in the output's safetensors, over their weights (bits per weight).
# A rerun keeps the results made over the same WINDOWS (delete BUILD_DIR/target-bpw-bench).
# BPW_SEED=N (default 0): another calibration draw (calib_windows.py's seed), in its own
# directory BUILD_DIR/target-bpw-bench-sN; BPW_OUT: the results file (default
# bench/results/target-bpw.md).
# BPW_FORMAT (default compressed-tensors): the output format, e.g. gptq (mixed bits written as
# GPTQ `dynamic` overrides); BPW_CANDS: the t- variants' candidates as job JSON (default 4 and
# 8 bits x groups 32, 64, 192); variants u3-gN: uniform 3 bits, group N (a format that holds
# 3 bits). For gptq the size counts qweight, qzeros, scales and g_idx, all the file stores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: bench/target_bpw.sh BUILD_DIR MODEL_DIR [WINDOWS] [SAMPLES] [SEQ_LEN]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="$(cd "$2" && pwd)"
windows="${3:-8}" samples="${4:-16}" seq="${5:-256}"
data="${QUANTD_SHARED_DATA:-$root/../shared/data}"
qctl="$build/quantctl"
seed="${BPW_SEED:-0}"
work="$build/target-bpw-bench"
[ "$seed" = 0 ] || work="$work-s$seed"
fmt="${BPW_FORMAT:-compressed-tensors}"
[ "$fmt" = compressed-tensors ] || work="$work-$fmt"
out="${BPW_OUT:-$here/results/target-bpw.md}"
threads="${BPW_THREADS:-2}"
[ -x "$qctl" ] || { echo "target_bpw.sh: $qctl not built" >&2; exit 1; }
mkdir -p "$work"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads

"$qctl" tokenize --model "$model" --text "$data/text/wikitext-2-raw/wiki.test.raw" --bos --out "$work/wiki.ids.json" >/dev/null
[ -s "$work/calib.ids.json" ] || {
    "$qctl" tokenize --model "$model" --text "$data/text/c4/c4-calib.jsonl" --jsonl --out "$work/c4.ids.json" >/dev/null
    python3 "$here/calib_windows.py" "$work/c4.ids.json" "$samples" "$seq" "$seed" "$work/calib.ids.json"
}
kept() { [ -s "$1" ] && [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['windows'])" "$1")" = "$windows" ]; }

cands="${BPW_CANDS:-\"bpw_bits\": [4, 8], \"bpw_group_sizes\": [32, 64, 192]}"
variants="${BPW_VARIANTS:-u-g192 u-g64 u-g32 t-4.25 t-4.25c t-4.5 t-3.5}"
for tag in $variants; do
    dir="$work/out-$tag"
    if kept "$work/eval-$tag.json"; then echo "$tag: kept" >&2; continue; fi
    rm -rf "$dir"
    bits=4
    case $tag in
    u3-g*) bits=3; extra="\"group_size\": ${tag#u3-g}" ;;
    u-g*) extra="\"group_size\": ${tag#u-g}" ;;
    t-*c) t=${tag#t-}; extra="\"group_size\": 64, \"target_bpw\": ${t%c}, \"bpw_bits\": [4, 8], \"bpw_group_sizes\": [32, 64, 192, -1]" ;;
    t-*a) t=${tag#t-}; extra="\"group_size\": 64, \"target_bpw\": ${t%a}, $cands, \"gptaq\": true" ;;
    t-*) extra="\"group_size\": 64, \"target_bpw\": ${tag#t-}, $cands" ;;
    esac
    echo "{\"model\": \"$model\", \"output\": \"$dir\", \"method\": \"gptq\", \"format\": \"$fmt\", \"bits\": $bits, $extra, \"calibration\": {\"path\": \"$work/calib.ids.json\", \"samples\": $samples, \"seq_len\": $seq, \"style\": \"awq\"}}" > "$work/job-$tag.json"
    t0=$(date +%s.%N)
    if ! "$qctl" quantize --threads "$threads" "$work/job-$tag.json" > "$work/log-$tag.txt" 2>&1; then
        echo "$tag: refused or failed: $(grep -m1 -i 'error\|refused\|fail' "$work/log-$tag.txt" || tail -1 "$work/log-$tag.txt")" >&2
        continue
    fi
    echo "$(date +%s.%N) - $t0" | bc > "$work/seconds-$tag.txt"
    "$qctl" eval --model "$dir" --ref-model "$model" --tokens "$work/wiki.ids.json" --seq-len 512 --max-windows "$windows" \
        --threads "$threads" 2>/dev/null | tail -1 > "$work/eval-$tag.json"
    echo "$tag: $(cat "$work/eval-$tag.json")" >&2
done

python3 - "$work" "$out" "$windows" "$samples" "$seq" "$variants" "$(uname -n)" "$(nproc)" "$seed" "$fmt" <<'PY'
import json, os, struct, sys, datetime, glob, collections
work, out, windows, samples, seq, variants, host, ncpu, seed, fmt = sys.argv[1:]

def linear_bytes(d):
    """Bytes of the packed linears' tensors and their weight count (from weight_shape)."""
    nbytes, weights = 0, 0
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            base = 8 + n
            for name, t in hdr.items():
                if name == "__metadata__": continue
                a, b = t["data_offsets"]
                if name.endswith((".weight_packed", ".weight_scale", ".weight_zero_point", ".qweight", ".qzeros",
                                  ".scales", ".g_idx")): nbytes += b - a
                if name.endswith(".g_idx"):
                    # GPTQ: K from g_idx, N from scales [G, N].
                    weights += t["shape"][0] * hdr[name[:-len("g_idx")] + "scales"]["shape"][1]
                if name.endswith(".weight_shape"):
                    fh.seek(base + a)
                    r, c = struct.unpack("<qq", fh.read(16))
                    weights += r * c
    return nbytes, weights

rows, raw = [], []
base_kl = {}
for tag in variants.split():
    p = os.path.join(work, "eval-%s.json" % tag)
    if not os.path.exists(p) or not os.path.getsize(p):
        log = os.path.join(work, "log-%s.txt" % tag)
        why = ""
        if os.path.exists(log):
            lines = [l.strip() for l in open(log) if "target_bpw" in l or "error" in l.lower()]
            why = lines[-1] if lines else ""
        rows.append("| %s | - | - | - | - | - | refused: %s |" % (tag, why.replace("|", "/")[:300]))
        continue
    e = json.load(open(p)); raw.append("%s: %s" % (tag, json.dumps(e)))
    d = os.path.join(work, "out-%s" % tag)
    nb, nw = linear_bytes(d)
    rep = json.load(open(os.path.join(d, "quantd_report.json")))
    mix = ""
    if "bpw" in rep:
        c = collections.Counter("%db g%d" % (l["bits"], l["group_size"]) for l in rep["bpw"]["layers"])
        mix = ", ".join("%s: %d" % kv for kv in sorted(c.items()))
    else:
        mix = "uniform"
    base_kl[tag] = e["kl_mean"]
    sec = open(os.path.join(work, "seconds-%s.txt" % tag)).read().strip()
    rows.append("| %s | %.5f | %.3f | %.2f%% | %d | %.4f | %s (%.0f s) |" % (tag, e["kl_mean"], e["ppl"], 100 * e["top1_agree"],
                nb, 8.0 * nb / nw, mix, float(sec)))
with open(out, "w") as f:
    f.write("# target_bpw: mixed bits per layer on SmolLM2-135M\n\n")
    f.write("Date: %s. Machine: %s, %s CPUs shared with other builds (seconds are not a speed measurement). "
            "Produced by `%sbench/target_bpw.sh BUILD BUILD/smollm2/SmolLM2-135M %s %s %s` (BUILD: a Release build).\n\n"
            % (datetime.date.today(), host, ncpu, "" if seed == "0" else "BPW_SEED=%s " % seed, windows, samples, seq))
    f.write("Format: %s. " % fmt)
    f.write("Every row: GPTQ, 4-bit symmetric (u3-: 3-bit), compressed-tensors pack-quantized unless the format says otherwise, the same %s x %s calibration ids of "
            "c4-calib.jsonl (bench/calib_windows.py, seed %s); KL is mean KL(P_float || P_quant) per token in nats over "
            "the first %s windows of 512 tokens of wiki.test.raw (`quantctl eval --ref-model`). u-gN: uniform group N; "
            "t-X: `target_bpw` X with candidates 4 and 8 bits x groups 32, 64, 192 (t-Xc: and -1, one group per row). Bytes: the quantized linears' "
            "weight_packed + weight_scale (F16) tensors; bpw: those bits over the linears' weights.\n\n" % (samples, seq, seed, windows))
    f.write("| job | KL to float | PPL | top-1 | linear bytes | bpw | layers (seconds) |\n|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n\n")
    if "u-g192" in base_kl:
        for t in ("t-4.25", "t-4.25c", "t-4.5"):
            if t in base_kl:
                f.write("- %s: KL %.1f%% below uniform g192's.\n" % (t, 100 * (1 - base_kl[t] / base_kl["u-g192"])))
    f.write("\nRaw `quantctl eval` lines:\n\n```\n" + "\n".join(raw) + "\n```\n")
print("wrote", out)
PY
