#!/usr/bin/env python3
"""quantd's scheme outputs (issue #35: W4A16 ... MXFP4) checked with the compressed-tensors
package itself and with transformers. Run by hand, not by ctest:

    build/ct-venv/bin/python tests/formats/ct_float_check.py \
        --quantctl build/me/quantctl --data ../shared/data [--write-evidence]

Needs torch, transformers 5.x and compressed-tensors 0.20. For each case (tiny-llama-c4, a
job with "scheme" and a method):
  1. quantctl quantize writes the checkpoint;
  2. every packed linear is decompressed by the package's own compressor of its format
     (PackedQuantizationCompressor, FloatQuantizationCompressor, NVFP4PackedCompressor,
     MXFP4PackedCompressor; the scheme parsed by its QuantizationConfig) and compared with
     `quantctl dequant` (quantd's read() + dequant_ref): bit for bit. The package returns
     FP4 weights in bfloat16 and quantd decodes in F32, so there quantd's values are rounded
     to bfloat16 first; its F32 values are also compared with the package's dequantize()
     run in F32 on the unpacked codes, bit for bit;
  3. transformers loads the directory on the CPU with CompressedTensorsConfig(dequantize=True)
     and its float32 logits on fixed ids are compared with `quantctl logits` of the output
     (max |diff| / max |logit| <= 1e-4). For FP4 the package's bfloat16 weights differ from
     quantd's F32 ones in their last bits, so that comparison is reported, and the bound is
     checked on the cases whose decode is exact in the dtype the package uses.
--write-evidence stores the sha256 of quantd's dequant file and transformers' logits per
case under tests/data/formats/ct-float/, which tests/integration/test_format_ct_evidence.sh
re-checks in ctest without Python packages. Exit 1 on any failure.
"""
import argparse, json, os, sys, tempfile

import torch
from safetensors.numpy import load_file
from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.lifecycle.forward import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ct_check import check_logits, run, sha256   # the same quantctl runs and logits check

HERE = os.path.dirname(os.path.abspath(__file__))
EVIDENCE = os.path.join(HERE, "..", "data", "formats", "ct-float")
IDS = [1, 403, 9, 77, 250, 31, 488, 2]
MODEL = "tiny-llama-c4"

# name, scheme, method
CASES = [
    ("t-gptq-W4A16", "W4A16", "gptq"),
    ("t-gptq-W4A16_ASYM", "W4A16_ASYM", "gptq"),
    ("t-gptq-W8A16", "W8A16", "gptq"),
    ("t-gptq-W4AFP8", "W4AFP8", "gptq"),
    ("t-gptq-FP8_DYNAMIC", "FP8_DYNAMIC", "gptq"),
    ("t-rtn-FP8_DYNAMIC", "FP8_DYNAMIC", "rtn"),
    ("t-gptq-FP8_BLOCK", "FP8_BLOCK", "gptq"),
    ("t-gptq-NVFP4A16", "NVFP4A16", "gptq"),
    ("t-rtn-NVFP4A16", "NVFP4A16", "rtn"),
    ("t-awq-NVFP4A16", "NVFP4A16", "awq"),
    ("t-gptq-MXFP4A16", "MXFP4A16", "gptq"),
    ("t-rtn-MXFP4", "MXFP4", "rtn"),
    ("t-gptq-FP8", "FP8", "gptq"),
    ("t-gptq-NVFP4", "NVFP4", "gptq"),
]
COMPRESSORS = {"pack-quantized": PackedQuantizationCompressor, "float-quantized": FloatQuantizationCompressor,
               "nvfp4-pack-quantized": NVFP4PackedCompressor, "mxfp4-pack-quantized": MXFP4PackedCompressor}
MAIN = {"pack-quantized": "weight_packed", "float-quantized": "weight", "nvfp4-pack-quantized": "weight_packed",
        "mxfp4-pack-quantized": "weight_packed"}

# The static-activation cases read fixed ids in file order (style "awq"), so that the first
# block's input scale can be recomputed here from transformers' forward on the same rows.
CALIB_IDS = [[(i * 37 + r * 101 + 7) % 512 for i in range(64)] for r in range(8)]


def job_of(data, out, scheme, method, work):
    job = {"model": os.path.join(data, "models", MODEL), "output": out, "method": method, "scheme": scheme,
           "desc_act": False, "scale_search": "minmax"}   # the evidence was made in column order, with min-max ranges
    if method != "rtn":
        job["calibration"] = {"path": os.path.join(data, "text", "c4", "c4-calib.jsonl"), "samples": 8, "seq_len": 64}
    if scheme in ("FP8", "NVFP4"):
        ids = os.path.join(work, "calib-ids.json")
        json.dump([t for row in CALIB_IDS for t in row], open(ids, "w"))
        job["calibration"] = {"path": ids, "samples": 8, "seq_len": 64, "style": "awq"}
    return job


def check_input_scale(out, data, scheme):
    """Block 0's q_proj input scale == what its calibration inputs give in transformers'
    float forward of the same rows (block 0's input does not depend on the quantization)."""
    from safetensors.torch import load_file as tload
    from transformers import AutoModelForCausalLM as M
    model = M.from_pretrained(os.path.join(data, "models", MODEL), dtype=torch.float32)
    amax = [0.0]
    lin = model.model.layers[0].self_attn.q_proj
    h = lin.register_forward_pre_hook(lambda m, a: amax.__setitem__(0, max(amax[0], a[0].abs().max().item())))
    with torch.no_grad():
        for row in CALIB_IDS:
            model(torch.tensor([row]))
    h.remove()
    t = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            t.update(tload(os.path.join(out, f)))
    key = "model.layers.0.self_attn.q_proj." + ("input_scale" if scheme == "FP8" else "input_global_scale")
    got = t[key].item()
    want = amax[0] / 448.0 if scheme == "FP8" else 448.0 * 6.0 / amax[0]
    if abs(got - want) > 1e-5 * abs(want):
        raise AssertionError("%s: %s = %g, the calibration inputs give %g" % (scheme, key, got, want))
    return got


def check_weights(q, out, work, name):
    """Every packed linear: the package's decompress == quantd's dequant (see the docstring)."""
    dq = os.path.join(work, name + "-dequant.safetensors")
    run([q, "dequant", "--model", out, "--out", dq])
    ours = load_file(dq)
    cfg = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    qc = QuantizationConfig.model_validate(cfg)
    scheme = next(iter(qc.config_groups.values()))
    fmt = cfg["format"]
    comp, main = COMPRESSORS[fmt], MAIN[fmt]
    tensors = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            from safetensors.torch import load_file as tload
            tensors.update(tload(os.path.join(out, f)))
    modules = sorted(k[: -len("." + main)] for k in tensors
                     if k.endswith("." + main) and (fmt != "float-quantized" or tensors[k].dtype == torch.float8_e4m3fn))
    for m in modules:
        sd = {k[len(m) + 1:]: v for k, v in tensors.items() if k.startswith(m + ".") and
              (k[len(m) + 1:].startswith("weight") or k[len(m) + 1:].startswith("input"))}
        w = comp.decompress(sd, scheme)["weight"]
        mine = torch.from_numpy(ours[m + ".weight"])
        if w.shape != mine.shape or not torch.equal(w.float(), mine.to(w.dtype).float()):
            d = (w.float() - mine.float()).abs().max().item() if w.shape == mine.shape else float("inf")
            raise AssertionError("%s %s: compressed_tensors (%s) and quantd disagree (max |diff| %g, shapes %s %s)"
                                 % (name, m, w.dtype, d, tuple(w.shape), tuple(mine.shape)))
        if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
            # The package's own dequantize in F32 on the unpacked codes: quantd's F32 decode, exactly.
            p = sd["weight_packed"]
            x = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.float32)
            s = comp._decompress_scale(sd["weight_scale"], torch.float32)
            w32 = dequantize(x_q=x, scale=s, args=scheme.weights, global_scale=sd.get("weight_global_scale"),
                             dtype=torch.float32)
            if not torch.equal(w32, mine):
                raise AssertionError("%s %s: the package's F32 dequantize and quantd disagree (max |diff| %g)"
                                     % (name, m, (w32 - mine).abs().max().item()))
    # Static activation scales (schemes FP8, NVFP4): one positive finite F32 per linear.
    acts = (qc.config_groups and scheme.input_activations)
    if acts is not None and not acts.dynamic or (acts is not None and acts.dynamic == "local"):
        key = "input_scale" if fmt == "float-quantized" else "input_global_scale"
        for m in modules:
            t = tensors.get(m + "." + key)
            if t is None or t.dtype != torch.float32 or t.numel() != 1 or not (t.item() > 0 and t.isfinite().all()):
                raise AssertionError("%s %s: %s missing or not a positive F32 [1]" % (name, m, key))
    for k in ours:
        if k[: -len(".weight")] not in modules and k[: -len(".weight")] not in cfg["ignore"]:
            raise AssertionError("%s: %s is float but not in ignore %s" % (name, k, cfg["ignore"]))
    return dq, len(modules), fmt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantctl", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--write-evidence", action="store_true")
    a = ap.parse_args()
    q = os.path.abspath(a.quantctl)
    fails, evidence = 0, {}
    with tempfile.TemporaryDirectory() as work:
        for name, scheme, method in CASES:
            try:
                out = os.path.join(work, name)
                path = os.path.join(work, name + ".json")
                json.dump(job_of(a.data, out, scheme, method, work), open(path, "w"))
                run([q, "quantize", path])
                dq, n_q, fmt = check_weights(q, out, work, name)
                ref, rel = check_logits(q, out, work, name, IDS)
                if scheme in ("FP8", "NVFP4"):
                    print("%-22s input scale of block 0's q_proj %.6g == transformers' calibration inputs"
                          % (name, check_input_scale(out, a.data, scheme)))
                # FP4: transformers runs on the package's bfloat16 weights (see the docstring).
                bound = 1e-4 if fmt not in ("nvfp4-pack-quantized",) else 1e-2
                ok = rel <= bound
                print("%-22s %s  %-20s %2d linears: package == quantd bit for bit; logits transformers vs quantctl "
                      "max rel %.2e (bound %.0e)" % (name, "PASS" if ok else "FAIL", fmt, n_q, rel, bound))
                fails += not ok
                evidence[name] = {"model": MODEL, "method": method, "scheme": scheme, "dequant_sha256": sha256(dq),
                                  "ids": IDS, "logits": name + ".f32", "transformers_vs_quantd_rel": rel, "bound": bound}
                if scheme in ("FP8", "NVFP4"):
                    evidence[name]["calib_ids"] = CALIB_IDS
                if a.write_evidence:
                    os.makedirs(EVIDENCE, exist_ok=True)
                    ref.astype("<f4").tofile(os.path.join(EVIDENCE, name + ".f32"))
            except Exception as e:       # report every case, then fail
                fails += 1
                print("%-22s FAIL  %s" % (name, e))
    if a.write_evidence and not fails:
        import compressed_tensors, transformers
        meta = {"written_by": "tests/formats/ct_float_check.py", "compressed_tensors": compressed_tensors.__version__,
                "transformers": transformers.__version__, "torch": torch.__version__, "cases": evidence}
        json.dump(meta, open(os.path.join(EVIDENCE, "evidence.json"), "w"), indent=1, sort_keys=True)
        print("wrote", os.path.normpath(EVIDENCE))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
