#!/usr/bin/env bash
# compressed-tensors, quantd's side of the Python proof (issue #17 part 2), without Python
# packages: tests/formats/ct_check.py (run by hand) checked that the compressed-tensors
# package decompresses quantd's output to exactly `quantctl dequant`'s weights and that
# transformers' logits equal `quantctl logits`, and stored per stories260K case the sha256 of
# the dequant file and transformers' logits in tests/data/formats/ct/. This test re-runs
# each job and checks that quantd still decodes to those exact weights (so to what the
# package decompressed) and that its logits are within 1e-4 (max |diff| / max |logit|) of
# transformers'. Skips without ../shared/data.
set -u
. "$(dirname "$0")/cli_common.sh"
D="${QUANTD_SHARED_DATA:-}"
[ -d "$D/models/stories260K" ] && [ -f "$D/text/c4/c4-calib.jsonl" ] || { echo "SKIP: shared data absent"; exit 77; }
SRC="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
EV="$SRC/tests/data/formats/ct"
[ -f "$EV/evidence.json" ] || { fail "$EV/evidence.json missing"; exit 1; }
pin_blas_kernel

python3 - "$EV/evidence.json" "$D" "$T" > "$T/cases" <<'PY' || fail "cannot read evidence.json"
import json, os, sys
ev, data, tmp = sys.argv[1:]
for name, c in sorted(json.load(open(ev))["cases"].items()):
    job = {"id": "ct-" + name, "model": os.path.join(data, "models", c["model"]), "output": os.path.join(tmp, name),
           "method": c["method"], "format": "compressed-tensors", **c["job"], "modules_to_not_convert": ["mlp."]}
    if c["method"] != "rtn":
        job["calibration"] = {"path": os.path.join(data, "text", "c4", "c4-calib.jsonl"), "samples": 8, "seq_len": 64}
    json.dump(job, open(os.path.join(tmp, name + ".json"), "w"))
    json.dump(c["ids"], open(os.path.join(tmp, name + "-ids.json"), "w"))
    print(name, c["dequant_sha256"], c["logits"])
PY
n=0
while read -r name sum logits; do
    n=$((n + 1))
    "$Q" quantize "$T/$name.json" > "$T/$name.log" 2>&1 || { fail "$name: job failed: $(tail -3 "$T/$name.log")"; continue; }
    "$Q" dequant --model "$T/$name" --out "$T/$name-dq.safetensors" > /dev/null || { fail "$name: dequant failed"; continue; }
    got=$(sha256sum < "$T/$name-dq.safetensors" | cut -d' ' -f1)
    [ "$got" = "$sum" ] || fail "$name: quantd's dequantized weights changed ($got, the package decompressed to $sum)"
    "$Q" logits --model "$T/$name" --tokens "$T/$name-ids.json" --out "$T/$name.f32" > /dev/null || { fail "$name: logits failed"; continue; }
    python3 - "$T/$name.f32" "$EV/$logits" "$name" <<'PY' || fail "$name: logits differ from transformers'"
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
if len(a) != len(b): sys.exit("%s: %d vs %d bytes" % (sys.argv[3], len(a), len(b)))
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
rel = max(abs(p - q) for p, q in zip(x, y)) / max(abs(q) for q in y)
print("%s: max |quantd - transformers| / max |logit| = %.2e" % (sys.argv[3], rel))
sys.exit(0 if rel <= 1e-4 else 1)
PY
done < "$T/cases"
[ "$n" -ge 5 ] || fail "only $n cases in evidence.json"
[ "$fails" = 0 ] && echo "PASS: $n compressed-tensors cases"
exit $((fails > 0))
