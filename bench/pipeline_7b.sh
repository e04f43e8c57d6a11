#!/usr/bin/env bash
# Where a 7B job's time goes (issue #19): runs a generated Llama-2-7B-shaped model (hidden
# 4096, intermediate 11008, 32 heads, F16) of BLOCKS blocks through `quantctl quantize` and
# prints, per block, the seconds of every stage from quantd_report.json (load, calibrate,
# awq_search, quantize, pack, error, kernel_check, forward, checkpoint), the forward passes
# over the calibration tokens and the checkpoint bytes written; then the extrapolation to a
# 32-block 7B job at this calibration and at the GPTQ default of 128 x 2048 tokens (the
# token-bound stages, calibrate, forward and the activations' share of checkpoint, scale with
# the token count; the rest is per weight). The process's CPU seconds (user + system) are
# printed too: on a shared machine they move less than the wall clock.
#
#   bench/pipeline_7b.sh [BUILD_DIR] [BLOCKS] [SAMPLES] [SEQ_LEN] [METHOD] [BACKEND]
#
# Defaults: build/release, 2 blocks, 8 x 2048 tokens, gptq (true_sequential), cpu. JOB_EXTRA
# adds keys to the job, e.g. JOB_EXTRA='"compute": "bf16", "checkpoint": {"acts_every": 1}'.
# Results of dated runs: bench/results/pipeline-7b.md.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/release}
NB=${2:-2}
S=${3:-8}
L=${4:-2048}
M=${5:-gptq}
BE=${6:-cpu}
Q="$B/quantctl"
[ -x "$Q" ] || { echo "pipeline_7b.sh: $Q not built" >&2; exit 1; }
T=$(mktemp -d /tmp/quantd-bench-7b-XXXXXX)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)}

"$Q" gen-model --out "$T/m" --layers "$NB" --hidden 4096 --intermediate 11008 --heads 32 --kv-heads 32 \
    --max-pos 4096 --vocab 512 --dtype f16 > /dev/null
python3 -c "import json,random; random.seed(0); json.dump({'tokens':[random.randrange(512) for _ in range($S*$L+4096)]}, open('$T/ids.json','w'))"
cat > "$T/job.json" <<JOB
{"model": "$T/m", "output": "$T/out", "method": "$M", "bits": 4, "group_size": 128, ${JOB_EXTRA:+$JOB_EXTRA,}
 "calibration": {"path": "$T/ids.json", "samples": $S, "seq_len": $L}}
JOB
/usr/bin/time -f "%e %M %U %S" -o "$T/time" "$Q" quantize "$T/job.json" --backend "$BE" > "$T/log" 2>&1 ||
    { echo "pipeline_7b.sh: the job failed:" >&2; tail -5 "$T/log" >&2; exit 1; }
read -r wall kb usr sys_s < "$T/time"
cpu=$(python3 -c "print(round($usr + $sys_s, 1))")
python3 - "$T/out/quantd_report.json" "$NB" "$S" "$L" "$M" "$BE" "$wall" "$kb" "$cpu" <<'PY'
import json, sys
rep, nb, s, l, m, be, wall, kb, cpu = sys.argv[1:]
r = json.load(open(rep))
nb, s, l = int(nb), int(s), int(l)
stages = ["load", "calibrate", "awq_search", "quantize", "pack", "error", "kernel_check", "forward", "checkpoint"]
blocks = r.get("blocks")
if not blocks:   # a build from before the per-stage costs: whole-block seconds only
    print(f"7B-shaped ({nb} blocks), {m}, {s} x {l} tokens, backend {be}: wall {wall} s, CPU {cpu} s, block seconds "
          f"{r['totals']['block_seconds']:.1f}, peak RSS {int(kb) // 1024} MiB (no per-stage costs in this build)")
    sys.exit(0)
print(f"7B-shaped ({nb} blocks), {m}, {s} x {l} tokens, backend {be}: wall {wall} s, CPU {cpu} s, peak RSS {int(kb) // 1024} MiB\n")
print("| block | " + " | ".join(stages) + " | total | passes | checkpoint MB |")
print("|---|" + "---|" * (len(stages) + 3))
for b in blocks:
    st = b["stages"]
    print(f"| {b['block']} | " + " | ".join(f"{st[k]:.1f}" for k in stages) +
          f" | {b['seconds']:.1f} | {b['forward_passes']} | {b['bytes_written'] / 1e6:.0f} |")
# Per-block means; the token-bound part scales with the calibration size.
mean = {k: sum(b["stages"][k] for b in blocks) / len(blocks) for k in stages}
secs = sum(b["seconds"] for b in blocks) / len(blocks)
tok_bound = mean["calibrate"] + mean["forward"] + mean["checkpoint"]
rest = secs - tok_bound
scale = 128 * 2048 / (s * l)
print(f"\nper block: {secs:.1f} s, of which token-bound (calibrate + forward + checkpoint) {tok_bound:.1f} s")
print(f"32-block 7B job at {s} x {l}: {32 * secs / 60:.1f} min")
print(f"32-block 7B job at 128 x 2048 (token-bound x {scale:g}): {32 * (rest + tok_bound * scale) / 60:.1f} min")
res = r.get("resources")
if res:
    e, mm, ra = res["estimate"], res["measured"], res["ratio"]
    gib = lambda b: b / 2**30
    print(f"estimate: RAM {gib(e['peak_ram_bytes']):.2f} GiB against a measured peak RSS of "
          f"{gib(mm['peak_rss_bytes']):.2f} GiB ({ra['ram']}x); disk {gib(e['disk_bytes']):.2f} GiB against "
          f"{gib(mm['peak_disk_bytes']):.2f} GiB ({ra['disk']}x)")
PY
