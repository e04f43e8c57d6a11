#!/usr/bin/env python3
"""Quantized round trip per family (issue #16): quantd's packed output, read back and
dequantized in Python, put into transformers' own model, gives the logits `quantctl logits
--model OUT` gives.

    python roundtrip.py QUANTCTL FAMILIES_DIR WORK_DIR [--md FILE] [FAMILY...]

For every directory of FAMILIES_DIR (tests/data/families, the forward-parity goldens of
make_goldens.py; new ones are picked up as they appear) or only the FAMILY names given:

 1. `quantctl logits --model FAMILY --tokens ids.json` on the float checkpoint. A family
    whose forward quantctl refuses is SKIP, with quantctl's message: quantd does not
    support it yet, so there is nothing to round-trip.
 2. Three 4-bit jobs with `quantctl quantize` (group 32, calibration 16 x 32 random ids
    below the vocabulary, seed 0): GPTQ with act-order, symmetric, format gptq (v1: zero
    minus one, an act-order g_idx); GPTQ with a zero point, format gptq_v2; AWQ with a zero
    point, format awq_gemm (AWQ's scales folded into the norms and linears before it); gpt-oss
    also GPTQ in compressed-tensors (its experts in vLLM's w13_*/w2_* layout, split back here
    into gate/up/down: w13's even rows are the gate's, the odd ones the up projection's).
 3. `quantctl logits --model OUT` (quantd's dequantized forward).
 4. The output is read with the safetensors library; every `<prefix>.qweight` is unpacked
    here, written from ../shared/ref/formats.md (GPTQ: along K, b bits per field, least
    significant first, v1 zeros stored minus one, W[k][n] = s[g][n] * (q - z) with
    g = g_idx[k]; AWQ gemm: along N with the nibble order 0 2 4 6 1 3 5 7, W[k][n] =
    (q - z) * s[k / group][n]), transposed to the nn.Linear [N, K] weight; every other
    tensor (embeddings, norms folded by AWQ, biases, lm_head) is taken as stored. The
    output's config.json, less its quantization_config, builds transformers' model
    (from_config, float32, eager attention); load_state_dict must use every tensor and
    miss none but a tied lm_head. Its logits on ids.json are compared with step 3's:
    rel = max|hf - quantd| / max|quantd| must be <= 1e-4.

`q-effect` is rel of the quantized logits against the float checkpoint's: the size of the
change quantization makes, which a packing or folding bug would be of the order of. The
config's `dtype` and `torch_dtype` are also checked to be equal. Exit status 1 on any FAIL.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

TOL = 1e-4
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
JOBS = [
    ("gptq", {"method": "gptq", "desc_act": True, "format": "gptq"}),
    ("gptq_v2 asym", {"method": "gptq", "sym": False, "format": "gptq_v2"}),
    ("awq", {"method": "awq", "format": "awq_gemm"}),
]
# gpt-oss also in compressed-tensors, whose experts quantd writes in vLLM's per-expert layout
# (mlp.experts.N.w13_weight_packed/_scale/_bias with gate and up rows interleaved, w2_*).
GPT_OSS_JOBS = [("ct", {"method": "gptq", "format": "compressed-tensors"})]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


def read_f32(path, vocab):
    return np.fromfile(path, dtype="<f4").reshape(-1, vocab)


def rel_err(a, ref):
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def unpack_rows(words, bits):
    """[R, C] int32 words packed along rows -> [R * 32/bits, C] codes."""
    if 32 % bits:
        raise ValueError(f"{bits}-bit unpacking is not written here (only 2, 4, 8)")
    w = words.astype(np.uint32)
    per = 32 // bits
    out = np.empty((w.shape[0] * per, w.shape[1]), dtype=np.int64)
    for j in range(per):
        out[j::per] = (w >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1)
    return out


def unpack_cols(words, bits):
    """[R, C] int32 words packed along columns -> [R, C * 32/bits] codes."""
    return unpack_rows(words.T, bits).T


def dequant_gptq(t, prefix, qc):
    bits = qc["bits"]
    q = unpack_rows(t[prefix + ".qweight"], bits)                 # [K, N]
    z = unpack_cols(t[prefix + ".qzeros"], bits)                  # [G, N]
    if qc.get("checkpoint_format", "gptq") == "gptq":
        z = z + 1                                                 # v1 stores zero - 1
    s = t[prefix + ".scales"].astype(np.float32)                  # [G, N]
    g = t[prefix + ".g_idx"].astype(np.int64)                     # [K]
    w = s[g] * (q - z[g]).astype(np.float32)                      # [K, N]
    return w.T


def dequant_awq(t, prefix, qc):
    if qc["bits"] != 4:
        raise ValueError(f"awq gemm is 4-bit only, config says {qc['bits']}")
    def unpack(words):
        w = words.astype(np.uint32)
        out = np.empty((w.shape[0], w.shape[1] * 8), dtype=np.int64)
        for i in range(8):
            out[:, AWQ_ORDER[i]::8] = (w >> np.uint32(4 * i)) & np.uint32(15)
        return out
    q = unpack(t[prefix + ".qweight"])                           # [K, N]
    z = unpack(t[prefix + ".qzeros"])                            # [G, N]
    s = t[prefix + ".scales"].astype(np.float32)                 # [G, N]
    gs = qc["group_size"] if qc["group_size"] > 0 else q.shape[0]
    g = np.arange(q.shape[0]) // gs
    w = (q - z[g]).astype(np.float32) * s[g]
    return w.T


def dequant_ct(t, packed, scale, qc):
    """compressed-tensors pack-quantized, symmetric: weight_packed [N, K b/32] (each row an
    LSB-first stream of codes u = q + 2^(b-1)) and weight_scale [N, G]; W = scale * q, each
    product rounded to F16 as the package computes it. Returns [N, K]."""
    w = qc["config_groups"]["group_0"]["weights"]
    if not w["symmetric"]:
        raise ValueError("compressed-tensors with zero points is not unpacked here")
    bits = w["num_bits"]
    q = unpack_cols(t[packed], bits) - (1 << (bits - 1))                     # [N, K]
    s = t[scale].astype(np.float32)                                          # [N, G]
    g = np.arange(q.shape[1]) // (q.shape[1] // s.shape[1])
    return (q.astype(np.float32) * s[:, g]).astype(np.float16).astype(np.float32)


def split_w13(sd):
    """gpt-oss's experts in vLLM's layout: w13's rows 2f are gate_proj's row f, 2f + 1 up_proj's,
    w2 is down_proj; named back as per-expert linears (fuse_gpt_oss stacks them)."""
    for key in [k for k in sd if k.endswith((".w13_weight", ".w13_bias", ".w2_weight", ".w2_bias"))]:
        base, last = key.rsplit(".", 1)
        v = sd.pop(key)
        kind = "weight" if last.endswith("weight") else "bias"
        if last.startswith("w13"):
            sd[f"{base}.gate_proj.{kind}"], sd[f"{base}.up_proj.{kind}"] = v[0::2].clone(), v[1::2].clone()
        else:
            sd[f"{base}.down_proj.{kind}"] = v


def fuse_experts(sd, want):
    """transformers 5 holds a mixture-of-experts layer's experts as two 3-D parameters,
    `experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) and `experts.down_proj`
    [E, H, I], and converts the checkpoint's per-expert linears when it loads a directory;
    load_state_dict does not, so this does the same stacking. Mixtral's checkpoint names
    (block_sparse_moe.gate, experts.N.w1/w3/w2 = gate/up/down) become the module's names
    (mlp.gate, experts.N.gate_proj/up_proj/down_proj) first, and ERNIE 4.5's
    mlp.moe_statics.e_score_correction_bias its module's mlp.gate.moe_statics (as
    transformers' conversion_mapping renames them). Granite-4's module keeps the name
    block_sparse_moe (experts.N.gate_proj/up_proj/down_proj stack the same way), and its
    checkpoint's router.layer is the module's router (conversion_mapping's "granitemoe")."""
    granite = any(".block_sparse_moe.experts." in k for k in want)
    for key in [k for k in sd if granite and k.endswith(".block_sparse_moe.router.layer.weight")]:
        sd[key.replace(".router.layer.", ".router.")] = sd.pop(key)
    for key in [k for k in sd if ".block_sparse_moe." in k and not granite]:
        new = key.replace(".block_sparse_moe.", ".mlp.")
        for old, name in ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")):
            new = new.replace(old, name)
        sd[new] = sd.pop(key)
    for key in [k for k in sd if ".mlp.moe_statics." in k]:
        sd[key.replace(".mlp.moe_statics.", ".mlp.gate.moe_statics.")] = sd.pop(key)
    for key in sorted(want):
        if key in sd or not key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        base = key[: -len("gate_up_proj")] if key.endswith("gate_up_proj") else key[: -len("down_proj")]
        e, parts = 0, []
        while f"{base}{e}.down_proj.weight" in sd:
            if key.endswith("gate_up_proj"):
                parts.append(torch.cat([sd.pop(f"{base}{e}.gate_proj.weight"), sd.pop(f"{base}{e}.up_proj.weight")], 0))
            else:
                parts.append(sd[f"{base}{e}.down_proj.weight"])
            e += 1
        if parts:
            sd[key] = torch.stack(parts)
    for key in [k for k in sd if ".experts." in k and k.endswith(".down_proj.weight")]:
        base = key[: key.index(".experts.") + len(".experts.")]
        if base + "down_proj" in sd:
            del sd[key]


def rename_keys(sd, want):
    """transformers 5 renames some checkpoint keys as it loads a directory
    (conversion_mapping.py's WeightRenaming), which load_state_dict does not: GPT-NeoX's
    embed_out is the module's lm_head; PhiMoE's mlp.gate (block_sparse_moe.gate, made mlp.gate by
    fuse_experts) is the module's mlp.router."""
    for old, new in (("embed_out.", "lm_head."),):
        for key in [k for k in sd if k.startswith(old) and k not in want]:
            sd[new + key[len(old):]] = sd.pop(key)
    for key in [k for k in sd if ".mlp.gate." in k and k not in want]:
        if key.replace(".mlp.gate.", ".mlp.router.") in want:
            sd[key.replace(".mlp.gate.", ".mlp.router.")] = sd.pop(key)


def fuse_gpt_oss(sd, want):
    """gpt-oss's experts are 3-D parameters with the input dimension first: gate_up_proj
    [E, H, 2I] with the gate and up columns interleaved (gate = [..., ::2], up = [..., 1::2]),
    gate_up_proj_bias [E, 2I] interleaved the same way, down_proj [E, I, H], down_proj_bias
    [E, H]. quantd writes each expert's gate_proj, up_proj, down_proj as linears [N, K] with
    biases; this puts them back."""
    for key in sorted(want):
        if not key.endswith("experts.gate_up_proj_bias") or key in sd:
            continue
        base = key[: -len("gate_up_proj_bias")]
        gu, gub, dn, dnb = [], [], [], []
        e = 0
        while f"{base}{e}.down_proj.weight" in sd:
            g, u = sd.pop(f"{base}{e}.gate_proj.weight"), sd.pop(f"{base}{e}.up_proj.weight")     # [I, H]
            w = torch.empty(g.shape[1], 2 * g.shape[0])
            w[:, 0::2], w[:, 1::2] = g.t(), u.t()
            gu.append(w)
            gb, ub = sd.pop(f"{base}{e}.gate_proj.bias"), sd.pop(f"{base}{e}.up_proj.bias")
            b = torch.empty(2 * gb.shape[0])
            b[0::2], b[1::2] = gb, ub
            gub.append(b)
            dn.append(sd.pop(f"{base}{e}.down_proj.weight").t())                                 # [I, H]
            dnb.append(sd.pop(f"{base}{e}.down_proj.bias"))
            e += 1
        if e:
            sd[base + "gate_up_proj"], sd[base + "gate_up_proj_bias"] = torch.stack(gu), torch.stack(gub)
            sd[base + "down_proj"], sd[base + "down_proj_bias"] = torch.stack(dn), torch.stack(dnb)


def fuse_llama4(sd, want):
    """Llama 4's experts are 3-D parameters with the input dimension first and no biases:
    feed_forward.experts.gate_up_proj [E, H, 2I] with the gate columns first, then the up
    columns (Llama4TextExperts' chunk(2)), down_proj [E, I, H]. quantd writes each expert's
    gate_proj, up_proj, down_proj as linears [N, K]; this puts them back."""
    for key in sorted(want):
        if not key.endswith("feed_forward.experts.gate_up_proj") or key in sd:
            continue
        base = key[: -len("gate_up_proj")]
        gu, dn = [], []
        e = 0
        while f"{base}{e}.down_proj.weight" in sd:
            g, u = sd.pop(f"{base}{e}.gate_proj.weight"), sd.pop(f"{base}{e}.up_proj.weight")     # [I, H]
            gu.append(torch.cat([g.t(), u.t()], 1))
            dn.append(sd.pop(f"{base}{e}.down_proj.weight").t())                                 # [I, H]
            e += 1
        if e:
            sd[base + "gate_up_proj"], sd[base + "down_proj"] = torch.stack(gu), torch.stack(dn)


def hf_logits(out_dir, ids):
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.pop("quantization_config")
    if cfg.get("dtype") != cfg.get("torch_dtype"):
        raise ValueError(f"config.json: dtype {cfg.get('dtype')!r} != torch_dtype {cfg.get('torch_dtype')!r}")
    t = {}
    for f in sorted(os.listdir(out_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out_dir, f), framework="pt") as sf:
                for k in sf.keys():
                    v = sf.get_tensor(k)
                    t[k] = v.float().numpy() if v.is_floating_point() else v.numpy()
    sd = {}
    main = "weight_packed" if qc["quant_method"] == "compressed-tensors" else "qweight"
    prefixes = [k[: -len(main)] for k in t if k.endswith(main)]          # "<module>." or "<expert>.w13_"
    packed = set()
    for p in prefixes:
        if qc["quant_method"] == "compressed-tensors":
            w = dequant_ct(t, p + "weight_packed", p + "weight_scale", qc)
            packed.update(p + s for s in ("weight_packed", "weight_scale", "weight_shape"))
            sd[p + "weight"] = torch.from_numpy(np.ascontiguousarray(w))
            continue
        p = p[:-1]
        if qc["quant_method"] == "gptq":
            w = dequant_gptq(t, p, qc)
            packed.update(p + s for s in (".qweight", ".qzeros", ".scales", ".g_idx"))
        elif qc["quant_method"] == "awq":
            w = dequant_awq(t, p, qc)
            packed.update(p + s for s in (".qweight", ".qzeros", ".scales"))
        else:
            raise ValueError(f"quant_method {qc['quant_method']!r} is not gptq, awq or compressed-tensors")
        sd[p + ".weight"] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    for k, v in t.items():
        if k not in packed:
            sd[k] = torch.from_numpy(np.ascontiguousarray(v)).float()
    split_w13(sd)
    if "text_config" in cfg:
        return vlm_logits(cfg, sd, ids) + (len(prefixes), qc)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        config = AutoConfig.from_pretrained(tmp)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    fuse_gpt_oss(sd, set(model.state_dict()))
    fuse_llama4(sd, set(model.state_dict()))
    fuse_experts(sd, set(model.state_dict()))
    rename_keys(sd, set(model.state_dict()))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    bad_missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if unexpected or bad_missing:
        raise ValueError(f"state dict: unexpected {unexpected}, missing {bad_missing}")
    if tied:
        model.tie_weights()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    return logits, len(prefixes), qc


def vlm_logits(cfg, sd, ids):
    """A vision-language output: the dequantized state dict under the names it is stored
    with (the Hub's layouts: model.layers + visual, language_model.model + vision_tower, ...)
    is saved with the config and read by the ConditionalGeneration class's from_pretrained,
    which maps those names as it maps any checkpoint's; every tensor must be used and none
    missing (but a tied lm_head)."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        if cfg.get("model_type") == "llama4":
            # No conversion mapping stacks Llama 4's per-expert linears on load: stack them here.
            want = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp)).state_dict()
            fuse_llama4(sd, set(want))
        save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(tmp, "model.safetensors"))
        model, info = AutoModelForImageTextToText.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                                                  output_loading_info=True)
    tied = getattr(model.config, "tie_word_embeddings", False)
    bad_missing = [m for m in info["missing_keys"] if not (tied and m == "lm_head.weight")]
    if info["unexpected_keys"] or bad_missing or info.get("mismatched_keys"):
        raise ValueError(f"state dict: unexpected {info['unexpected_keys']}, missing {bad_missing}, "
                         f"mismatched {info.get('mismatched_keys')}")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    return (logits,)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("quantctl")
    ap.add_argument("families")
    ap.add_argument("work")
    ap.add_argument("--md", help="write the results as markdown to this file")
    ap.add_argument("family", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    names = a.family or sorted(d for d in os.listdir(a.families)
                               if os.path.isfile(os.path.join(a.families, d, "config.json")))
    os.makedirs(a.work, exist_ok=True)
    rows, failed = [], 0
    for name in names:
        src = os.path.join(a.families, name)
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        tcfg = cfg.get("text_config") or cfg   # vision-language models: the text tower's
        vocab = tcfg["vocab_size"]
        ids_path = os.path.join(src, "ids.json")
        with open(ids_path) as f:
            d = json.load(f)
        ids = d["tokens"] if isinstance(d, dict) else d
        fdir = os.path.join(a.work, name)
        shutil.rmtree(fdir, ignore_errors=True)
        os.makedirs(fdir)
        rc, msg = run([a.quantctl, "logits", "--model", src, "--tokens", ids_path, "--out", os.path.join(fdir, "float.f32")])
        if rc:
            line = (msg.splitlines()[-1] if msg else f"exit {rc}").replace(os.path.abspath(a.families) + "/", "")
            rows.append((name, "-", None, None, "SKIP", f"quantctl refuses the float model: {line}"))
            print(f"{name:16s} SKIP  {line}", flush=True)
            continue
        fl = read_f32(os.path.join(fdir, "float.f32"), vocab)
        seq = min(32, tcfg.get("max_position_embeddings", 32))
        calib = np.random.default_rng(0).integers(0, vocab, size=16 * seq * 2).tolist()
        with open(os.path.join(fdir, "calib.json"), "w") as f:
            json.dump(calib, f)
        for tag, spec in JOBS + (GPT_OSS_JOBS if tcfg.get("model_type") == "gpt_oss" else []):
            out = os.path.join(fdir, tag.replace(" ", "-"))
            job = dict(model=os.path.abspath(src), output=os.path.abspath(out), bits=4, group_size=32,
                       calibration={"path": os.path.abspath(os.path.join(fdir, "calib.json")), "samples": 16,
                                    "seq_len": seq}, overwrite=True, **spec)
            jpath = out + ".job.json"
            with open(jpath, "w") as f:
                json.dump(job, f)
            rc, msg = run([a.quantctl, "quantize", jpath])
            if rc:
                failed += 1
                line = msg.splitlines()[-1] if msg else f"exit {rc}"
                rows.append((name, tag, None, None, "FAIL", f"quantize: {line}"))
                print(f"{name:16s} {tag:13s} FAIL  quantize: {line}", flush=True)
                continue
            rc, msg = run([a.quantctl, "logits", "--model", out, "--tokens", ids_path, "--out", out + ".f32"])
            if rc:
                failed += 1
                rows.append((name, tag, None, None, "FAIL", f"quantctl logits: {msg.splitlines()[-1]}"))
                print(f"{name:16s} {tag:13s} FAIL  logits: {msg}", flush=True)
                continue
            ql = read_f32(out + ".f32", vocab)
            try:
                hl, n_packed, qc = hf_logits(out, ids)
            except Exception as e:  # a loader or layout error is this check failing
                failed += 1
                rows.append((name, tag, None, None, "FAIL", " ".join(f"{type(e).__name__}: {e}".split())))
                print(f"{name:16s} {tag:13s} FAIL  {type(e).__name__}: {e}", flush=True)
                continue
            rel = rel_err(hl, ql)
            eff = rel_err(ql, fl)
            ok = rel <= TOL and n_packed > 0
            failed += not ok
            note = f"{n_packed} packed linears"
            rows.append((name, tag, rel, eff, "PASS" if ok else "FAIL", note))
            print(f"{name:16s} {tag:13s} {'PASS' if ok else 'FAIL'}  rel {rel:.2e}  q-effect {eff:.3f}  ({note})", flush=True)
    if a.md:
        with open(a.md, "w") as f:
            f.write("# Quantized round trip per family (transformers)\n\n")
            f.write(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {cpu_name()}, "
                    f"{os.cpu_count()} CPUs, CPU backend. transformers {transformers.__version__}, torch {torch.__version__}.\n\n")
            f.write("Command: `bash tests/families/run.sh BUILD roundtrip` (= `python tests/families/roundtrip.py "
                    "BUILD/quantctl tests/data/families BUILD/families-roundtrip --md bench/results/families-roundtrip.md`).\n\n")
            f.write("Each family's tiny checkpoint (tests/data/families) is quantized by `quantctl quantize` at 4 bits, group 32\n"
                    "(calibration 16 x 32 random ids); the packed output is unpacked in Python (tests/families/roundtrip.py,\n"
                    "from ../shared/ref/formats.md), loaded into transformers' model for the output's config.json, and its\n"
                    "float32 eager logits on the family's 64 ids compared with `quantctl logits --model OUT`.\n"
                    f"rel = max|transformers - quantd| / max|quantd|, bar {TOL:g}. q-effect: the same measure between the\n"
                    "quantized and the float checkpoint's logits (what a packing or folding error would be of the order of).\n\n")
            f.write("| family | job | rel | q-effect | result | note |\n|---|---|---|---|---|---|\n")
            for name, tag, rel, eff, res, note in rows:
                f.write(f"| {name} | {tag} | {'' if rel is None else f'{rel:.2e}'} | {'' if eff is None else f'{eff:.3f}'} | {res} | {note} |\n")
    n_pass = sum(r[4] == "PASS" for r in rows)
    n_skip = sum(r[4] == "SKIP" for r in rows)
    print(f"{n_pass} passed, {failed} failed, {n_skip} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
