#!/usr/bin/env python3
"""FP8-block source checkpoints (DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8: F8_E4M3 `weight` with
F32 `weight_scale_inv` blocks), quantd's reading checked against torch (issue #35). Run by
hand, not by ctest:

    build/ct-venv/bin/python tests/formats/fp8_source.py --quantctl build/hR/quantctl [--write-evidence]

Needs torch (float8_e4m3fn), safetensors and numpy. For each case (transformers' tiny
DeepSeek-V3 and Qwen3 from tests/data/families, blocks that do not divide every shape):
  1. torch makes the FP8-block checkpoint: per block, scale = amax(|w|) / 448 in float32 (1
     for an all-zero block), weight = (w / scale).to(torch.float8_e4m3fn); every other tensor
     (embeddings, norms, the router) as it is; config.json gains quantization_config
     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
     "weight_block_size": [bn, bk]}, as DeepSeek-V3's;
  2. `quantctl gen-model --fp8-from SRC --fp8-block BNxBK` (what the C test test_model_fp8
     quantizes) writes the same model.safetensors, byte for byte;
  3. `quantctl dequant` of torch's checkpoint (the loader's own decoding) equals torch's
     `weight.to(torch.float32) * scale` (the scale expanded over its block) bit for bit, for
     every linear.
--write-evidence stores per case the sha256 of the FP8 model.safetensors and of quantctl's
dequant file in tests/data/fp8/fp8_source.sha256, which tests/integration/
test_fp8_source.sh re-checks in ctest without Python. Exit 1 on any failure.
"""
import argparse, hashlib, json, os, shutil, subprocess, sys, tempfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = os.path.join(HERE, "..", "data", "families")
EVIDENCE = os.path.join(HERE, "..", "data", "fp8", "fp8_source.sha256")

# name, family, block rows, block columns
CASES = [
    ("deepseek_v3-32x48", "deepseek_v3", 32, 48),
    ("deepseek_v3-128x128", "deepseek_v3", 128, 128),
    ("qwen3-48x40", "qwen3", 48, 40),
]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


def is_linear(name, t):
    # The block linears quantd quantizes: 2-D under model.layers, the MoE router excepted
    # (DeepSeek keeps mlp.gate in BF16, as its released checkpoints do).
    return name.startswith("model.layers.") and name.endswith(".weight") and t.dim() == 2 \
        and not name.endswith("mlp.gate.weight")


def fp8_blocks(w, bn, bk):
    n, k = w.shape
    sn, sk = -(-n // bn), -(-k // bk)
    codes = torch.empty((n, k), dtype=torch.float8_e4m3fn)
    scale = torch.empty((sn, sk), dtype=torch.float32)
    for i in range(sn):
        for j in range(sk):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            amax = blk.abs().amax()
            s = amax / 448.0 if amax > 0 else torch.tensor(1.0, dtype=torch.float32)
            scale[i, j] = s
            codes[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (blk / s).to(torch.float8_e4m3fn)
    return codes, scale


def torch_dequant(codes, scale, bn, bk):
    n, k = codes.shape
    full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return codes.to(torch.float32) * full


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantctl", required=True)
    ap.add_argument("--write-evidence", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fp8_source.")
    fails, lines = 0, []
    try:
        for name, family, bn, bk in CASES:
            src = os.path.join(FAMILIES, family)
            tdir, qdir = os.path.join(tmp, name + "-torch"), os.path.join(tmp, name + "-quantd")
            os.makedirs(tdir)
            tensors = load_file(os.path.join(src, "model.safetensors"))
            out, ref = {}, {}
            for tn, t in tensors.items():
                if not is_linear(tn, t):
                    out[tn] = t
                    continue
                codes, scale = fp8_blocks(t.to(torch.float32), bn, bk)
                out[tn], out[tn + "_scale_inv"] = codes, scale
                ref[tn] = torch_dequant(codes, scale, bn, bk)
            save_file(out, os.path.join(tdir, "model.safetensors"), metadata={"format": "pt"})
            cfg = json.load(open(os.path.join(src, "config.json")))
            cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": [bn, bk]}
            json.dump(cfg, open(os.path.join(tdir, "config.json"), "w"), indent=2)
            # 2. quantd's own FP8 conversion: the same file.
            run([a.quantctl, "gen-model", "--fp8-from", src, "--fp8-block", "%dx%d" % (bn, bk), "--out", qdir])
            t_sum, q_sum = sha256(os.path.join(tdir, "model.safetensors")), sha256(os.path.join(qdir, "model.safetensors"))
            if t_sum != q_sum:
                print("FAIL %s: quantctl gen-model --fp8-from wrote other bytes than torch (%s vs %s)" % (name, q_sum, t_sum))
                fails += 1
            # 3. quantd's dequantization of torch's checkpoint against torch's.
            dq = os.path.join(tmp, name + "-dq.safetensors")
            run([a.quantctl, "dequant", "--model", tdir, "--out", dq])
            got = load_file(dq)
            bad = [tn for tn in ref if tn not in got or not torch.equal(got[tn].view(torch.int32), ref[tn].view(torch.int32))]
            extra = [tn for tn in got if tn not in ref]
            if bad or extra or not ref:
                print("FAIL %s: %d of %d linears differ from torch's (%s), %d not FP8 in torch's" %
                      (name, len(bad), len(ref), ", ".join(bad[:3]), len(extra)))
                fails += 1
            else:
                print("ok   %s: %d linears dequantized bit for bit as torch's weight.to(float32) * scale" % (name, len(ref)))
            lines.append("%s %s %d %d %s %s" % (name, family, bn, bk, t_sum, sha256(dq)))
        if a.write_evidence and not fails:
            os.makedirs(os.path.dirname(EVIDENCE), exist_ok=True)
            with open(EVIDENCE, "w") as f:
                f.write("# case family block_rows block_columns sha256(FP8 model.safetensors made by torch) "
                        "sha256(quantctl dequant of it); written by tests/formats/fp8_source.py (torch %s)\n"
                        % torch.__version__)
                f.write("\n".join(lines) + "\n")
            print("wrote", os.path.relpath(EVIDENCE))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
