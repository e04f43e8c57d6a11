#!/usr/bin/env python3
"""Optional evidence (needs vLLM installed; not run by the tests): reads a quantd GPTQ output
made with target_bpw and asks vLLM's own code what it builds for every layer.

    python bench/gptq_dynamic_vllm.py OUTPUT_DIR

For each block and each layer vLLM makes of a llama-style model (self_attn.qkv_proj,
self_attn.o_proj, mlp.gate_up_proj, mlp.down_proj), vLLM's get_dynamic_override on its own
prefix gives the bits and group size it builds the layer with; they must equal what quantd's
report says of every member (q/k/v; gate/up). override_config then builds the layer's config
as get_linear_quant_method does: whether that raises (a width vLLM's GPTQ config does not
hold) is counted per bit width. Prints one JSON line; exit 1 on any disagreement."""
import collections
import copy
import json
import sys

from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
from vllm.model_executor.layers.quantization.utils.gptq_utils import get_dynamic_override, override_config

d = sys.argv[1]
q = json.load(open(d + "/config.json"))["quantization_config"]
rep = {l["name"]: (l["bits"], l["group_size"]) for l in json.load(open(d + "/quantd_report.json"))["bpw"]["layers"]}
cfg = AutoGPTQConfig.from_config(q)
fused = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
         "self_attn.o_proj": ["self_attn.o_proj"],
         "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
         "mlp.down_proj": ["mlp.down_proj"]}
blocks = sorted({int(n.split(".")[2]) for n in rep})
bad, loads, refuses = [], collections.Counter(), collections.Counter()
for b in blocks:
    for layer, members in fused.items():
        prefix = "model.layers.%d.%s" % (b, layer)
        got = (get_dynamic_override(cfg, prefix, "bits", cfg.weight_bits),
               get_dynamic_override(cfg, prefix, "group_size", cfg.group_size))
        for m in members:
            want = rep["model.layers.%d.%s" % (b, m)]
            if got != want:
                bad.append((prefix, got, m, want))
        c = copy.deepcopy(cfg)
        try:
            override_config(c, prefix)
            loads[got[0]] += 1
        except ValueError:
            refuses[got[0]] += 1
print(json.dumps({"layers": sum(loads.values()) + sum(refuses.values()), "disagree": len(bad),
                  "builds_by_bits": dict(loads), "raises_by_bits": dict(refuses),
                  "top_level": [q["bits"], q["group_size"]], "rules": len(q.get("dynamic", {}))}))
for x in bad[:10]:
    print("disagree:", x)
sys.exit(1 if bad else 0)
