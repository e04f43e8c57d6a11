#!/usr/bin/env bash
# A mixed-bit output (job.target_bpw) as transformers loads it: tests/data/target_bpw holds
# transformers' logits of the job in result.json (compressed-tensors' own loader, each layer
# decompressed at its config group's bits and group size; tests/families/target_bpw_hf.py
# wrote them with torch, transformers and compressed-tensors). This re-runs the job on the
# same tiny llama and checks that `quantctl logits` (quantd's reader) gives those logits within
# 1e-4 of their largest, without Python packages.
set -u
. "$(dirname "$0")/cli_common.sh"
SRC="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
EV="$SRC/tests/data/target_bpw"
FAM="$SRC/tests/data/families/llama"
[ -f "$EV/result.json" ] && [ -f "$EV/hf-logits.f32" ] || fail "tests/data/target_bpw: result.json or hf-logits.f32 missing"
pin_blas_kernel
python3 - "$EV/result.json" "$FAM" "$T/mix" > "$T/job.json" <<'PY' || fail "cannot read result.json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["pass"] and len(r["config_groups"]) >= 2, r
job = dict(r["job"], model=sys.argv[2], output=sys.argv[3])
print(json.dumps(job))
PY
"$Q" quantize "$T/job.json" > "$T/q.log" 2>&1 || fail "quantize: $(tail -3 "$T/q.log")"
"$Q" logits --model "$T/mix" --tokens "$FAM/ids.json" --out "$T/q.f32" > /dev/null || fail "quantctl logits"
python3 - "$T/q.f32" "$EV/hf-logits.f32" "$T/mix/config.json" "$EV/result.json" <<'PY' || fail "logits or config groups differ from transformers' run"
import json, struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
if len(a) != len(b): sys.exit("%d vs %d bytes" % (len(a), len(b)))
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
rel = max(abs(p - q) for p, q in zip(x, y)) / max(abs(q) for q in y)
print("max |quantd - transformers| / max |logit| = %.2e" % rel)
g = json.load(open(sys.argv[3]))["quantization_config"]["config_groups"]
want = json.load(open(sys.argv[4]))["config_groups"]
got = {k: [v["weights"]["num_bits"], v["weights"]["group_size"], len(v["targets"])] for k, v in g.items()}
if got != want: sys.exit("config groups %s, transformers' run had %s" % (got, want))
sys.exit(0 if rel <= 1e-4 else 1)
PY
[ "$fails" = 0 ] && echo PASS
exit $((fails > 0))
