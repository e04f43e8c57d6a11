#!/usr/bin/env bash
# quantctl layer / gen-layer end to end: every method and format writes the tensors the
# format promises, the JSON report is the last stdout line and GPTQ beats RTN on LLM-like
# inputs; bad input exits 2 with one line naming the problem.
set -u
. "$(dirname "$0")/cli_common.sh"

# json FIELD < report-line: prints the field (Python repr for bools: True/False)
json() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
# tensors FILE: "name:dtype:shape" per tensor, sorted, one line
tensors() {
    python3 - "$1" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
print(" ".join(sorted(f"{k}:{v['dtype']}:{'x'.join(map(str, v['shape']))}" for k, v in h.items() if k != "__metadata__")))
EOF
}
# write_st FILE NAME DTYPE SHAPE(comma) VALUES(python expr): a small safetensors file
write_st() {
    python3 - "$@" <<'EOF'
import json, struct, sys
path, name, dt, shape, expr = sys.argv[1:6]
shape = [int(s) for s in shape.split(",")]
vals = eval(expr)
data = struct.pack(f"<{len(vals)}f", *vals)
hdr = json.dumps({name: {"dtype": dt, "shape": shape, "data_offsets": [0, len(data)]}}, separators=(",", ":")).encode()
hdr += b" " * (-len(hdr) % 8)
open(path, "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
EOF
}
# expect_usage NAME PATTERN -- ARGS: exit 2, exactly one stderr line containing PATTERN
expect_usage() {
    local what="$1" pat="$2"; shift 3
    "$Q" "$@" >"$T/out" 2>"$T/err"; local rc=$?
    [ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($(cat "$T/err"))"
    [ "$(wc -l <"$T/err")" = 1 ] || fail "$what: stderr is not one line: $(cat "$T/err")"
    grep -q -- "$pat" "$T/err" || fail "$what: stderr lacks '$pat': $(cat "$T/err")"
}

"$Q" layer --help | grep -q -- "--desc-act" || fail "layer --help"
"$Q" gen-layer --help | grep -q -- "--rows" || fail "gen-layer --help"

"$Q" gen-layer --n 128 --k 256 --rows 512 --seed 7 --out "$T/d" >"$T/gen" || fail "gen-layer"
[ -s "$T/d/W.safetensors" ] && [ -s "$T/d/X.safetensors" ] || fail "gen-layer files"
[ "$(tensors "$T/d/W.safetensors")" = "weight:F32:128x256" ] || fail "W tensor: $(tensors "$T/d/W.safetensors")"
[ "$(tensors "$T/d/X.safetensors")" = "inputs:F32:512x256" ] || fail "X tensor: $(tensors "$T/d/X.safetensors")"
W="$T/d/W.safetensors"; X="$T/d/X.safetensors"

run() {   # run NAME ARGS...: runs layer, keeps the last stdout line in $T/NAME.json
    local name="$1"; shift
    "$Q" layer --weight "$W" --inputs "$X" --out "$T/$name.safetensors" "$@" >"$T/$name.stdout" 2>"$T/$name.stderr" \
        || { fail "$name: exit $? ($(cat "$T/$name.stderr"))"; return 1; }
    tail -n 1 "$T/$name.stdout" >"$T/$name.json"
}

run rtn --method rtn --bits 4 --group-size 64
run gptq --method gptq --bits 4 --group-size 64
run gptq_act --method gptq --bits 4 --group-size 64 --desc-act
run gptq_static --method gptq --bits 3 --group-size 64 --desc-act --static-groups --sym --format gptq_v2
run gptq_8 --method gptq --bits 8 --group-size -1 --damp 0.05
run awq --method awq --bits 4 --group-size 64
run ct --method gptq --bits 4 --group-size 64 --format compressed-tensors

for r in rtn gptq gptq_act gptq_static gptq_8 awq; do
    for key in rel_output_error rel_weight_error seconds damp fallback bits group_size method format; do
        json "$key" <"$T/$r.json" >/dev/null 2>&1 || fail "$r: report lacks $key: $(cat "$T/$r.json")"
    done
done
e_rtn=$(json rel_output_error <"$T/rtn.json"); e_gptq=$(json rel_output_error <"$T/gptq.json")
e_act=$(json rel_output_error <"$T/gptq_act.json"); e_awq=$(json rel_output_error <"$T/awq.json")
python3 -c "import sys; a,b,c,d=map(float,sys.argv[1:]); sys.exit(0 if b < 0.8*a and c < 0.8*a and d < a and 0 < b else 1)" \
    "$e_rtn" "$e_gptq" "$e_act" "$e_awq" || fail "errors not ordered: rtn $e_rtn gptq $e_gptq act $e_act awq $e_awq"
[ "$(json fallback <"$T/gptq.json")" = False ] || fail "gptq fell back"
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - 0.05) < 1e-12 else 1)" "$(json damp_percent <"$T/gptq_8.json")" \
    || fail "gptq_8: damp_percent not 0.05"
# The float schemes: GPTQ and AWQ below RTN on every grid, the scheme's format written.
for s in FP8_DYNAMIC FP8_BLOCK NVFP4A16 MXFP4A16; do
    run "rtn_$s" --method rtn --scheme "$s"
    run "gptq_$s" --method gptq --scheme "$s"
    run "awq_$s" --method awq --scheme "$s"
    python3 -c "import sys; a,b,c=map(float,sys.argv[1:]); sys.exit(0 if 0 < b < 0.8*a and c < a else 1)" \
        "$(json rel_output_error <"$T/rtn_$s.json")" "$(json rel_output_error <"$T/gptq_$s.json")" \
        "$(json rel_output_error <"$T/awq_$s.json")" || fail "$s: errors not ordered: $(cat "$T/rtn_$s.json" "$T/gptq_$s.json")"
done
[ "$(json format <"$T/gptq_NVFP4A16.json")" = nvfp4-pack-quantized ] || fail "NVFP4A16 format"
[ "$(tensors "$T/gptq_FP8_DYNAMIC.safetensors" | grep -c 'weight:F8_E4M3:128x256')" = 1 ] || fail "FP8 weight tensor: $(tensors "$T/gptq_FP8_DYNAMIC.safetensors")"
[ "$(json format <"$T/awq.json")" = awq_gemm ] || fail "awq default format"
[ "$(json format <"$T/gptq.json")" = gptq ] || fail "gptq default format"

[ "$(tensors "$T/ct.safetensors")" = "weight_packed:I32:128x32 weight_scale:F16:128x4 weight_shape:I64:2 weight_zero_point:I32:16x4" ] \
    || fail "compressed-tensors tensors: $(tensors "$T/ct.safetensors")"
[ "$(tensors "$T/gptq.safetensors")" = "g_idx:I32:256 qweight:I32:32x128 qzeros:I32:4x16 scales:F16:4x128" ] \
    || fail "gptq tensors: $(tensors "$T/gptq.safetensors")"
[ "$(tensors "$T/gptq_static.safetensors")" = "g_idx:I32:256 qweight:I32:24x128 qzeros:I32:4x12 scales:F16:4x128" ] \
    || fail "gptq 3-bit tensors: $(tensors "$T/gptq_static.safetensors")"
[ "$(tensors "$T/gptq_8.safetensors")" = "g_idx:I32:256 qweight:I32:64x128 qzeros:I32:1x32 scales:F16:1x128" ] \
    || fail "gptq 8-bit tensors: $(tensors "$T/gptq_8.safetensors")"
[ "$(tensors "$T/awq.safetensors")" = "input_scales:F32:256 qweight:I32:256x16 qzeros:I32:4x16 scales:F16:4x128" ] \
    || fail "awq tensors: $(tensors "$T/awq.safetensors")"
# act-order g_idx: each of the 4 groups has 64 members and the order is not k / 64
python3 - "$T/gptq_act.safetensors" <<'EOF' || fail "act-order g_idx"
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
o = h["g_idx"]["data_offsets"]; g = struct.unpack("<256i", b[8 + n + o[0]:8 + n + o[1]])
assert sorted(g.count(i) for i in range(4)) == [64] * 4, g
assert list(g) != [i // 64 for i in range(256)]
EOF
# deterministic: the same run writes the same bytes
run gptq_again --method gptq --bits 4 --group-size 64 --desc-act
cmp -s "$T/gptq_act.safetensors" "$T/gptq_again.safetensors" || fail "gptq not deterministic"

# F16 / BF16 inputs and FILE:NAME selection
"$Q" gen-layer --n 64 --k 128 --rows 256 --dtype f16 --out "$T/h" >/dev/null || fail "gen-layer f16"
"$Q" layer --weight "$T/h/W.safetensors:weight" --inputs "$T/h/X.safetensors:inputs" --method gptq --bits 4 \
    --group-size 32 --out "$T/h/q.safetensors" >"$T/h.out" 2>&1 || fail "f16 layer: $(cat "$T/h.out")"
"$Q" gen-layer --n 64 --k 128 --rows 256 --dtype bf16 --out "$T/b" >/dev/null || fail "gen-layer bf16"
"$Q" layer --weight "$T/b/W.safetensors" --inputs "$T/b/X.safetensors" --method rtn --bits 2 --group-size 32 \
    --out "$T/b/q.safetensors" >"$T/b.out" 2>&1 || fail "bf16 layer: $(cat "$T/b.out")"

# bad input: exit 2 and one line naming the problem
B=(--weight "$W" --inputs "$X" --method gptq --bits 4 --group-size 64 --out "$T/bad.safetensors")
expect_usage "missing file" "nope.safetensors" -- layer --weight "$T/nope.safetensors" --inputs "$X" --method gptq --bits 4 --group-size 64 --out "$T/x.st"
expect_usage "bits 5" "bits: 5" -- layer "${B[@]}" --bits 5
expect_usage "group size 0" "group-size" -- layer "${B[@]}" --group-size 0
expect_usage "unknown option" "--frobnicate" -- layer "${B[@]}" --frobnicate
expect_usage "unknown method" "sparsegpt" -- layer "${B[@]}" --method sparsegpt
expect_usage "missing --out" "--out" -- layer --weight "$W" --inputs "$X" --method gptq --bits 4 --group-size 64
expect_usage "awq_gemm 3 bits" "awq_gemm" -- layer "${B[@]}" --method awq --bits 3 --format awq_gemm
expect_usage "compressed-tensors act-order" "needs --static-groups" -- layer "${B[@]}" --desc-act --format compressed-tensors
expect_usage "unknown format" "compressed-tensors" -- layer "${B[@]}" --format gguf
expect_usage "damp 2" "damp" -- layer "${B[@]}" --damp 2
expect_usage "float format without scheme" "use --scheme" -- layer "${B[@]}" --format nvfp4-pack-quantized
expect_usage "scheme with bits" "sets --bits" -- layer "${B[@]}" --scheme FP8_DYNAMIC
expect_usage "unknown scheme" "'W3A16' is not a scheme" -- layer --weight "$W" --inputs "$X" --method rtn --scheme W3A16 --out "$T/x.st"
"$Q" gen-layer --n 128 --k 192 --rows 64 --out "$T/k" >/dev/null
expect_usage "K mismatch" "192 features" -- layer --weight "$W" --inputs "$T/k/X.safetensors" --method gptq --bits 4 --group-size 64 --out "$T/x.st"
write_st "$T/rank1.safetensors" weight F32 256 "[0.5]*256"
expect_usage "wrong rank" "rank 1" -- layer --weight "$T/rank1.safetensors" --inputs "$X" --method gptq --bits 4 --group-size 64 --out "$T/x.st"
write_st "$T/nan.safetensors" inputs F32 4,256 "[0.1]*1000 + [float('nan')] + [0.2]*23"
expect_usage "non-finite inputs" "not finite" -- layer --weight "$W" --inputs "$T/nan.safetensors" --method gptq --bits 4 --group-size 64 --out "$T/x.st"
write_st "$T/inf.safetensors" weight F32 128,256 "[0.01]*300 + [float('inf')] + [0.01]*(128*256-301)"
expect_usage "non-finite weight" "not finite" -- layer --weight "$T/inf.safetensors" --inputs "$X" --method rtn --bits 4 --group-size 64 --out "$T/x.st"
expect_usage "no such tensor" "no tensor named 'w2'" -- layer --weight "$W:w2" --inputs "$X" --method rtn --bits 4 --group-size 64 --out "$T/x.st"
expect_usage "gen-layer no size" "--n" -- gen-layer --out "$T/z"
[ -e "$T/bad.safetensors" ] && fail "a failed run left an output file"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_cli_layer: all checks passed"
