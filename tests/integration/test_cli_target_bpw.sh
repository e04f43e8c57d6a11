#!/usr/bin/env bash
# job.target_bpw end to end through quantctl on a generated model: a mixed-bit
# compressed-tensors output (4 and 8 bits, groups 64 and 128) is read by `quantctl eval`
# (quantd's reader takes each layer's bits and group from its tensors), `quantctl
# check-serving` names a kernel for every layer (Machete on Hopper, Marlin on Ampere, fused
# q/k/v and gate/up one scheme each) and says the bits are mixed; a job's "serve" block puts
# the plan's kernels in the report; the report lists each layer's bits and why; format gptq
# writes a 3/4-bit mix as `dynamic` rules (read back by quantd, each rule as vLLM's re.match
# reads it, 3-bit rows reported as not loading in vLLM); a format that cannot hold mixed
# bits is refused by name.
set -u
. "$(dirname "$0")/cli_common.sh"

"$Q" gen-model --out "$T/m" --layers 2 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --vocab 128 \
    --max-pos 128 > /dev/null || fail "gen-model"
cands='"target_bpw":5.0,"bpw_bits":[4,8],"bpw_group_sizes":[64,128]'
echo "{\"model\":\"$T/m\",\"output\":\"$T/mix\",\"method\":\"rtn\",\"format\":\"compressed-tensors\",\"bits\":4,\"group_size\":128,$cands,\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\"}}" > "$T/mix.json"
"$Q" quantize "$T/mix.json" > "$T/mix.log" 2>&1 || fail "quantize mix: $(tail -2 "$T/mix.log")"
python3 - "$T/mix" <<'PY' || fail "mixed output: config groups / report"
import json, sys, collections
d = sys.argv[1]
q = json.load(open(d + "/config.json"))["quantization_config"]
g = q["config_groups"]
assert len(g) >= 2, g
schemes = {(v["weights"]["num_bits"], v["weights"]["group_size"]) for v in g.values()}
assert len({b for b, _ in schemes}) == 2, schemes          # 4 and 8 bits both used
named = [t for v in g.values() for t in v["targets"]]
assert len(named) == len(set(named)) == 14, named          # 2 blocks x 7 linears, each once
r = json.load(open(d + "/quantd_report.json"))
b = r["bpw"]
assert b["bpw"] <= 5.0 and len(b["layers"]) == 14 and all(l["why"] for l in b["layers"]), b
assert all(l["kernel"] != "float" for l in r["serving"]["layers"]), r["serving"]
PY
python3 -c 'import json, random; random.seed(1); print(json.dumps([random.randrange(128) for _ in range(64)]))' > "$T/ids.json"
"$Q" eval --model "$T/mix" --ref-model "$T/m" --tokens "$T/ids.json" --seq-len 32 > "$T/ev" 2>&1 || fail "eval mix: $(tail -2 "$T/ev")"
grep -q '"kl_mean"' "$T/ev" || fail "eval mix: no KL: $(tail -2 "$T/ev")"
"$Q" check-serving "$T/mix" --engine vllm --gpu hopper --tp 1 > "$T/o1"; rc=$?
[ "$rc" = 0 ] || fail "check-serving hopper: exit $rc: $(cat "$T/o1")"
[ "$(grep -c ' Machete ' "$T/o1")" = 8 ] || fail "check-serving hopper: not Machete for all 8 layers: $(cat "$T/o1")"
tail -1 "$T/o1" | grep -q '^OK: format compressed-tensors, mixed bits and group sizes per layer' || fail "summary: $(tail -1 "$T/o1")"
"$Q" check-serving "$T/mix" --engine vllm --gpu ampere --tp 1 > "$T/oa"; rc=$?
[ "$rc" = 0 ] && [ "$(grep -c ' Marlin ' "$T/oa")" = 8 ] || fail "check-serving ampere: exit $rc: $(cat "$T/oa")"
# GPTQ's format: a 3/4-bit mix as `dynamic` rules, read back by quantd; check-serving says
# which rows vLLM builds (4-bit: Machete on Hopper) and which will not load (3-bit).
echo "{\"model\":\"$T/m\",\"output\":\"$T/g\",\"method\":\"rtn\",\"format\":\"gptq\",\"bits\":4,\"group_size\":128,\"target_bpw\":3.8,\"bpw_bits\":[3,4],\"bpw_group_sizes\":[64,128]}" > "$T/g.json"
"$Q" quantize "$T/g.json" > "$T/g.log" 2>&1 || fail "quantize gptq mix: $(tail -2 "$T/g.log")"
python3 - "$T/g" <<'PY' || fail "gptq mixed output: dynamic / report"
import json, re, sys
d = sys.argv[1]
q = json.load(open(d + "/config.json"))["quantization_config"]
r = json.load(open(d + "/quantd_report.json"))["bpw"]
assert q["bits"] == 4 and r["bpw"] <= 3.8, (q["bits"], r["bpw"])
def rule(name):  # vLLM's get_dynamic_override: the first rule whose regex re.match-es
    for k, v in q.get("dynamic", {}).items():
        if k.startswith("-:"):
            if re.match(k[2:], name): return None
        elif re.match(k[2:] if k.startswith("+:") else k, name):
            return v.get("bits", q["bits"]), v.get("group_size", q["group_size"])
    return q["bits"], q["group_size"]
bits = set()
for l in r["layers"]:
    n = l["name"]
    assert rule(n) == (l["bits"], l["group_size"]), (n, rule(n), l)
    fused = re.sub(r"self_attn\.[qkv]_proj$", "self_attn.qkv_proj", re.sub(r"mlp\.(gate|up)_proj$", "mlp.gate_up_proj", n))
    assert rule(fused) == (l["bits"], l["group_size"]), (fused, l)
    bits.add(l["bits"])
assert bits == {3, 4}, bits
PY
"$Q" eval --model "$T/g" --ref-model "$T/m" --tokens "$T/ids.json" --seq-len 32 > "$T/evg" 2>&1 || fail "eval gptq mix: $(tail -2 "$T/evg")"
grep -q '"kl_mean"' "$T/evg" || fail "eval gptq mix: no KL: $(tail -2 "$T/evg")"
"$Q" check-serving "$T/g" --engine vllm --gpu hopper --tp 1 > "$T/og"; rc=$?
[ "$rc" = 1 ] || fail "check-serving gptq mix: exit $rc (3-bit rows do not load): $(cat "$T/og")"
grep -q "will not load: vLLM's GPTQ config builds 4- and 8-bit symmetric layers only" "$T/og" || fail "check-serving gptq: no 3-bit refusal: $(cat "$T/og")"
grep -q ' Machete ' "$T/og" || fail "check-serving gptq: no 4-bit row on Machete: $(cat "$T/og")"
grep -q 'matched against its own name' "$T/og" && fail "check-serving gptq: a rule reads otherwise for vLLM: $(cat "$T/og")"
tail -1 "$T/og" | grep -q '^FAIL: format gptq, mixed bits and group sizes per layer' || fail "gptq summary: $(tail -1 "$T/og")"
# refused by name
echo "{\"model\":\"$T/m\",\"output\":\"$T/a\",\"method\":\"rtn\",\"format\":\"awq_gemm\",\"bits\":4,\"group_size\":128,\"target_bpw\":4.5}" > "$T/a.json"
"$Q" quantize "$T/a.json" > "$T/a.log" 2>&1 && fail "awq_gemm target_bpw: the job ran"
grep -q 'job.target_bpw: format awq_gemm cannot hold mixed bits' "$T/a.log" || fail "awq_gemm target_bpw: $(tail -2 "$T/a.log")"
[ "$fails" = 0 ] && echo PASS
exit $((fails > 0))
