#!/usr/bin/env bash
# compressed-tensors, quantd's side of the Python proof, without Python packages:
# tests/formats/ct_check.py (issue #17) and tests/formats/ct_float_check.py (the schemes,
# issue #35), run by hand, checked that the compressed-tensors package decompresses quantd's
# output to exactly `quantctl dequant`'s weights and that transformers' logits equal
# `quantctl logits`, and stored per case the sha256 of the dequant file and transformers'
# logits in tests/data/formats/ct/ and ct-float/. This test re-runs each job and checks that
# quantd still decodes to those exact weights (so to what the package decompressed) and that
# its logits are within the case's bound (1e-4 of max |logit|, 1e-2 for NVFP4, whose
# package decompresses to bfloat16) of transformers'. Skips without ../shared/data.
set -u
. "$(dirname "$0")/cli_common.sh"
D="${QUANTD_SHARED_DATA:-}"
[ -d "$D/models/stories260K" ] && [ -d "$D/models/tiny-llama-c4" ] && [ -f "$D/text/c4/c4-calib.jsonl" ] ||
    { echo "SKIP: shared data absent"; exit 77; }
SRC="${QUANTD_SOURCE_DIR:?QUANTD_SOURCE_DIR must point at the source tree}"
for ev in ct ct-float; do
    [ -f "$SRC/tests/data/formats/$ev/evidence.json" ] || fail "tests/data/formats/$ev/evidence.json missing"
done
pin_blas_kernel

python3 - "$SRC/tests/data/formats" "$D" "$T" > "$T/cases" <<'PY' || fail "cannot read evidence.json"
import json, os, sys
evdir, data, tmp = sys.argv[1:]
for ev in ("ct", "ct-float"):
    for name, c in sorted(json.load(open(os.path.join(evdir, ev, "evidence.json")))["cases"].items()):
        job = {"id": "ct-" + name, "model": os.path.join(data, "models", c["model"]), "output": os.path.join(tmp, name),
               "method": c["method"]}
        if "scheme" in c:
            job["scheme"] = c["scheme"]
        else:
            job.update({"format": "compressed-tensors", **c["job"], "modules_to_not_convert": ["mlp."]})
        job.setdefault("desc_act", False)   # as ct_check.py and ct_float_check.py run them: column order unless named
        job.setdefault("scale_search", "minmax")   # likewise: min-max unless named
        if c["method"] != "rtn":
            job["calibration"] = {"path": os.path.join(data, "text", "c4", "c4-calib.jsonl"), "samples": 8, "seq_len": 64}
        if "calib_ids" in c:      # fixed ids in file order (the static activation scales' cases)
            ids = os.path.join(tmp, name + "-calib.json")
            json.dump([t for row in c["calib_ids"] for t in row], open(ids, "w"))
            job["calibration"] = {"path": ids, "samples": len(c["calib_ids"]), "seq_len": len(c["calib_ids"][0]),
                                  "style": "awq"}
        json.dump(job, open(os.path.join(tmp, name + ".json"), "w"))
        json.dump(c["ids"], open(os.path.join(tmp, name + "-ids.json"), "w"))
        print(name, c["dequant_sha256"], os.path.join(evdir, ev, c["logits"]), c.get("bound", 1e-4))
PY
n=0
while read -r name sum logits bound; do
    n=$((n + 1))
    "$Q" quantize "$T/$name.json" > "$T/$name.log" 2>&1 || { fail "$name: job failed: $(tail -3 "$T/$name.log")"; continue; }
    "$Q" dequant --model "$T/$name" --out "$T/$name-dq.safetensors" > /dev/null || { fail "$name: dequant failed"; continue; }
    got=$(sha256sum < "$T/$name-dq.safetensors" | cut -d' ' -f1)
    [ "$got" = "$sum" ] || fail "$name: quantd's dequantized weights changed ($got, the package decompressed to $sum)"
    "$Q" logits --model "$T/$name" --tokens "$T/$name-ids.json" --out "$T/$name.f32" > /dev/null || { fail "$name: logits failed"; continue; }
    python3 - "$T/$name.f32" "$logits" "$name" "$bound" <<'PY' || fail "$name: logits differ from transformers'"
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
if len(a) != len(b): sys.exit("%s: %d vs %d bytes" % (sys.argv[3], len(a), len(b)))
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
rel = max(abs(p - q) for p, q in zip(x, y)) / max(abs(q) for q in y)
print("%s: max |quantd - transformers| / max |logit| = %.2e" % (sys.argv[3], rel))
sys.exit(0 if rel <= float(sys.argv[4]) else 1)
PY
done < "$T/cases"
[ "$n" -ge 19 ] || fail "only $n cases in the two evidence.json"
[ "$fails" = 0 ] && echo "PASS: $n compressed-tensors cases"
exit $((fails > 0))
