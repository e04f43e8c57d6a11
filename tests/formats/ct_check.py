#!/usr/bin/env python3
"""compressed-tensors output of quantd, checked with the compressed-tensors package itself
and with transformers (issue #17 part 2). Run by hand, not by ctest:

    build/families-venv/bin/python tests/formats/ct_check.py \
        --quantctl build/h3/quantctl --data ../shared/data [--write-evidence] [--tiny]

Needs torch, transformers 5.x and compressed-tensors 0.20 (pip install compressed-tensors).
For each case (stories260K jobs for every method, sym/asym, 4/8 bits, group/channel,
actorder "weight", the MLP left in float and listed in `ignore`; --tiny adds two
tiny-llama-c4 jobs):
  1. quantctl quantize writes the checkpoint with "format": "compressed-tensors";
  2. every packed linear is decompressed with compressed_tensors'
     PackedQuantizationCompressor.decompress (the scheme parsed by its QuantizationConfig)
     and compared with `quantctl dequant` (quantd's own read() + dequant_ref): bit for bit
     (both compute scale * (q - zero) in the scale dtype, F16);
  3. transformers loads the directory on the CPU with CompressedTensorsConfig(dequantize=True)
     and its float32 logits on fixed ids are compared with `quantctl logits` (max |diff| /
     max |logit| <= 1e-4).
--write-evidence stores, per stories260K case, the sha256 of quantd's dequant file and
transformers' logits under tests/data/formats/ct/, which tests/integration/
test_format_ct_evidence.sh re-checks in ctest without Python packages. Exit 1 on any failure.
"""
import argparse, hashlib, json, os, subprocess, sys, tempfile

import numpy as np
import torch
from safetensors.numpy import load_file
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

HERE = os.path.dirname(os.path.abspath(__file__))
EVIDENCE = os.path.join(HERE, "..", "data", "formats", "ct")
IDS = [1, 403, 9, 77, 250, 31, 488, 2]          # 8 ids < 512 (stories260K's vocabulary)

# name, model, method, job extras (group_size is in the extras)
CASES = [
    ("s-gptq-w4-sym-g32", "stories260K", "gptq", {"bits": 4, "group_size": 32, "sym": True}),
    ("s-gptq-w4-asym-g32-actorder", "stories260K", "gptq",
     {"bits": 4, "group_size": 32, "sym": False, "desc_act": True, "static_groups": True}),
    ("s-awq-w4-asym-g32", "stories260K", "awq", {"bits": 4, "group_size": 32, "sym": False}),
    ("s-awqgptq-w8-sym-channel", "stories260K", "awq+gptq", {"bits": 8, "group_size": -1, "sym": True}),
    ("s-rtn-w8-asym-g64", "stories260K", "rtn", {"bits": 8, "group_size": 64, "sym": False}),
]
TINY = [
    ("t-gptq-w4-sym-g128", "tiny-llama-c4", "gptq", {"bits": 4, "group_size": 128, "sym": True}),
    ("t-awq-w4-asym-g64", "tiny-llama-c4", "awq", {"bits": 4, "group_size": 64, "sym": False}),
]


# quantctl with OpenBLAS's GEMM kernel pinned as test_format_ct_evidence.sh pins it
# (pin_blas_kernel in tests/integration/cli_common.sh), so the evidence's sums hold on
# every CPU: another kernel changes the last bits of the activations, which AWQ's folded
# F32 norms carry into the output.
QUANTCTL_ENV = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OPENBLAS_NUM_THREADS="1")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=QUANTCTL_ENV)
    if r.returncode:
        raise RuntimeError("%s: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    return r.stdout


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def quantize(q, data, work, name, model, method, extra):
    out = os.path.join(work, name)
    job = {"id": "ct-" + name, "model": os.path.join(data, "models", model), "output": out, "method": method,
           "format": "compressed-tensors", **extra}
    job.setdefault("desc_act", False)   # the evidence was made in column order unless a case names act-order
    job.setdefault("scale_search", "minmax")   # and with min-max ranges unless a case names the search
    if model == "stories260K":
        job["modules_to_not_convert"] = ["mlp."]     # 172 is no multiple of 32: left in float
    if method != "rtn":
        job["calibration"] = {"path": os.path.join(data, "text", "c4", "c4-calib.jsonl"), "samples": 8, "seq_len": 64}
    path = os.path.join(work, name + ".json")
    json.dump(job, open(path, "w"))
    run([q, "quantize", path])
    return out


def check_weights(q, out, work, name):
    """Every packed linear: compressed_tensors' decompress == quantd's dequant (at F16)."""
    dq = os.path.join(work, name + "-dequant.safetensors")
    run([q, "dequant", "--model", out, "--out", dq])
    ours = load_file(dq)
    cfg = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    qc = QuantizationConfig.model_validate(cfg)
    scheme = next(iter(qc.config_groups.values()))
    tensors = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            tensors.update({k: torch.from_numpy(v) for k, v in load_file(os.path.join(out, f)).items()})
    modules = sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))
    worst, n_float = 0.0, 0
    for m in modules:
        sd = {k[len(m) + 1:]: v for k, v in tensors.items() if k.startswith(m + ".") and k[len(m) + 1:].startswith("weight_")}
        w = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
        mine = torch.from_numpy(ours[m + ".weight"])
        if w.shape != mine.shape or not torch.equal(w.float(), mine):
            d = (w.float() - mine.float()).abs().max().item() if w.shape == mine.shape else float("inf")
            raise AssertionError("%s %s: compressed_tensors and quantd disagree (max |diff| %g, shapes %s %s)"
                                 % (name, m, d, tuple(w.shape), tuple(mine.shape)))
        worst = max(worst, w.float().abs().max().item())
    for k in ours:
        if k[: -len(".weight")] not in modules:
            n_float += 1
            if k[: -len(".weight")] not in cfg["ignore"]:
                raise AssertionError("%s: %s is float but not in ignore %s" % (name, k, cfg["ignore"]))
    return dq, len(modules), n_float, worst


def check_logits(q, out, work, name, ids):
    tok = os.path.join(work, name + "-ids.json")
    json.dump(ids, open(tok, "w"))
    lf = os.path.join(work, name + "-logits.f32")
    run([q, "logits", "--model", out, "--tokens", tok, "--out", lf])
    ours = np.fromfile(lf, dtype="<f4")
    model = AutoModelForCausalLM.from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True),
                                                 dtype=torch.float32, device_map="cpu")
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    ours = ours.reshape(ref.shape)
    rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
    return ref, rel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantctl", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--write-evidence", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    q = os.path.abspath(a.quantctl)
    fails = 0
    evidence = {}
    with tempfile.TemporaryDirectory() as work:
        for name, model, method, extra in CASES + (TINY if a.tiny else []):
            try:
                out = quantize(q, a.data, work, name, model, method, extra)
                dq, n_q, n_f, worst = check_weights(q, out, work, name)
                ref, rel = check_logits(q, out, work, name, IDS)
                ok = rel <= 1e-4
                print("%-28s %s  linears packed %2d, float %2d (in ignore)  weights: package == quantd, bit for bit "
                      "(max |w| %.3g)  logits: transformers vs quantctl max rel %.2e" % (name, "PASS" if ok else "FAIL", n_q, n_f, worst, rel))
                if not ok:
                    fails += 1
                if model == "stories260K":
                    evidence[name] = {"model": model, "method": method, "job": extra, "dequant_sha256": sha256(dq),
                                      "ids": IDS, "logits": name + ".f32", "transformers_vs_quantd_rel": rel}
                    if a.write_evidence:
                        os.makedirs(EVIDENCE, exist_ok=True)
                        ref.astype("<f4").tofile(os.path.join(EVIDENCE, name + ".f32"))
            except Exception as e:       # report every case, then fail
                fails += 1
                print("%-30s FAIL  %s" % (name, e))
    if a.write_evidence and not fails:
        import compressed_tensors, transformers
        meta = {"written_by": "tests/formats/ct_check.py", "compressed_tensors": compressed_tensors.__version__,
                "transformers": transformers.__version__, "torch": torch.__version__, "cases": evidence}
        json.dump(meta, open(os.path.join(EVIDENCE, "evidence.json"), "w"), indent=1, sort_keys=True)
        print("wrote", os.path.normpath(EVIDENCE))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
