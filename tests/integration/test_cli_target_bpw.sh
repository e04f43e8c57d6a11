#!/usr/bin/env bash
# job.target_bpw end to end through quantctl on a generated model: a mixed-bit
# compressed-tensors output (4 and 8 bits, groups 64 and 128) is read by `quantctl eval`
# (quantd's reader takes each layer's bits and group from its tensors), `quantctl
# check-serving` names a kernel for every layer (Machete on Hopper, Marlin on Ampere, fused
# q/k/v and gate/up one scheme each) and says the bits are mixed; a job's "serve" block puts
# the plan's kernels in the report; the report lists each layer's bits and why; a format
# that cannot hold mixed bits is refused by name.
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
# refused by name
echo "{\"model\":\"$T/m\",\"output\":\"$T/g\",\"method\":\"rtn\",\"format\":\"gptq\",\"bits\":4,\"group_size\":128,\"target_bpw\":4.5}" > "$T/g.json"
"$Q" quantize "$T/g.json" > "$T/g.log" 2>&1 && fail "gptq target_bpw: the job ran"
grep -q 'job.target_bpw: format gptq cannot hold mixed bits' "$T/g.log" || fail "gptq target_bpw: $(tail -2 "$T/g.log")"
[ "$fails" = 0 ] && echo PASS
exit $((fails > 0))
