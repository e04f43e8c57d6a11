#!/usr/bin/env python3
"""A mixed-bit output (job.target_bpw) through transformers' own compressed-tensors loader:
quantd quantizes a family's tiny checkpoint with target_bpw (4 and 8 bits, groups 32 and 64:
one config group per choice, naming its modules), transformers loads the output with
CompressedTensorsConfig(run_compressed=False) (the package decompresses every layer at the
bits and group size its config group says, into float weights), and its logits on the
family's ids are compared with `quantctl logits --model OUT` (quantd's reader, which takes
each layer's bits and group size from its tensors): rel = max|hf - quantd| / max|quantd|
must be <= 1e-4. The checkpoint's scales are F16 and compressed-tensors dequantizes in the
scale's dtype, as vLLM's kernels and quantd do (one F16 rounding of each scale * (q - z));
transformers loading in float32 casts the scales to float32 first, so its products are not
rounded: each quantized weight is rounded to F16 here before the forward, so the comparison
sees the decode, not that dtype (the rel without it is recorded too: on this tiny random
model, which quantization moves by ~50% of its logits, it is ~4e-3, as for a uniform output).

    python target_bpw_hf.py QUANTCTL FAMILY_DIR WORK_DIR [--evidence DIR]

DIR (tests/data/target_bpw) receives result.json (the job, the config groups, the logits'
rel, the package versions) and hf-logits.f32 (transformers' logits): the tree keeps the
evidence, and tests/integration/test_target_bpw_evidence.sh re-runs the job and compares
`quantctl logits` with those logits without Python packages. The job is RTN (no
calibration): its codes do not depend on the BLAS kernel's summation order.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers
import compressed_tensors
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

TOL = 1e-4


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}: {(p.stdout + p.stderr).strip()[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("quantctl")
    ap.add_argument("family")
    ap.add_argument("work")
    ap.add_argument("--evidence")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    src = os.path.abspath(a.family)
    cfg = json.load(open(os.path.join(src, "config.json")))
    vocab = cfg["vocab_size"]
    ids_path = os.path.join(src, "ids.json")
    d = json.load(open(ids_path))
    ids = d["tokens"] if isinstance(d, dict) else d
    out = os.path.abspath(os.path.join(a.work, "mixed"))
    job = dict(model=src, output=out, method="rtn", format="compressed-tensors", bits=4, group_size=32,
               target_bpw=5.0, bpw_bits=[4, 8], bpw_group_sizes=[32, 64], overwrite=True)
    jpath = out + ".job.json"
    json.dump(job, open(jpath, "w"))
    run([a.quantctl, "quantize", jpath])
    run([a.quantctl, "logits", "--model", out, "--tokens", ids_path, "--out", out + ".f32"])
    ql = np.fromfile(out + ".f32", dtype="<f4").reshape(-1, vocab)
    run([a.quantctl, "logits", "--model", src, "--tokens", ids_path, "--out", out + ".float.f32"])
    fl = np.fromfile(out + ".float.f32", dtype="<f4").reshape(-1, vocab)

    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    groups = {k: [v["weights"]["num_bits"], v["weights"]["group_size"], len(v["targets"])]
              for k, v in qc["config_groups"].items()}
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                 quantization_config=CompressedTensorsConfig(run_compressed=False))
    model.eval()
    with torch.no_grad():
        raw = model(torch.tensor([ids])).logits[0].float().numpy()
        for g in qc["config_groups"].values():
            for name in g["targets"]:
                w = model.get_submodule(name).weight
                w.data = w.data.half().float()
        hl = model(torch.tensor([ids])).logits[0].float().numpy()
    rel = float(np.abs(hl - ql).max() / max(np.abs(ql).max(), 1e-30))
    rel_raw = float(np.abs(raw - ql).max() / max(np.abs(ql).max(), 1e-30))
    q_effect = float(np.abs(ql - fl).max() / max(np.abs(fl).max(), 1e-30))
    bits = collections.Counter(b for b, _, n in groups.values() for _ in range(n))
    res = {
        "family": os.path.basename(src.rstrip("/")),
        "job": {k: v for k, v in job.items() if k not in ("model", "output", "overwrite")},
        "config_groups": groups,
        "linears_by_bits": {str(k): v for k, v in sorted(bits.items())},
        "logits_rel_hf_vs_quantd": rel,
        "logits_rel_hf_vs_quantd_without_f16_rounding": rel_raw,
        "logits_rel_quantized_vs_float": q_effect,
        "tolerance": TOL,
        "pass": rel <= TOL and len(groups) >= 2,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "compressed_tensors": compressed_tensors.__version__},
    }
    print(json.dumps(res, indent=1))
    if a.evidence:
        os.makedirs(a.evidence, exist_ok=True)
        hl.astype("<f4").tofile(os.path.join(a.evidence, "hf-logits.f32"))
        with open(os.path.join(a.evidence, "result.json"), "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
