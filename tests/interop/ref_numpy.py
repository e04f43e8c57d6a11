"""Independent numpy reader for quantd's GPTQ (v1, v2) and AWQ-gemm checkpoints, and a numpy
Llama forward over the dequantized weights.

Why: the Python loaders (transformers + GPTQModel, AutoAWQ, vLLM) may not install or run on
a given CPU; this file re-implements exactly the unpacking those loaders use, so a layout
bug in our writer shows up even without torch. It reads the packed tensors straight from
the safetensors files (its own reader: 8-byte header length, JSON header, raw data) and
never calls quantd code.

Unpacking, as in the loaders' source:
- GPTQ v1 (AutoGPTQ qlinear_cuda_old / GPTQModel TorchQuantLinear): qweight [K*b/32, N]
  is shifted right by wf = [0, b, 2b, ...] along a new axis 1, masked, reshaped to [K, N];
  qzeros [G, N*b/32] likewise along N; v1 adds 1 to the zero field ((z + 1) & mask in the
  torch path, (z & mask) + 1 in vLLM's exllama/marlin kernels: the two agree only when no
  stored field equals mask, which is checked and reported). W[k, n] = scales[g_idx[k], n] *
  (q[k, n] - z[g_idx[k], n]).
- GPTQ v2 (GPTQModel, vLLM checkpoint_format "gptq_v2"): the same without the +1.
- AWQ gemm (AutoAWQ utils/packing_utils.py unpack_awq + reverse_awq_order): qweight [K, N/8]
  shifted by [0, 4, ..., 28] → [K, N], columns reordered with AWQ_REVERSE_ORDER =
  [0, 4, 1, 5, 2, 6, 3, 7] within each run of 8; same for qzeros; W^T[k, n] =
  (q[k, n] - z[k // gs, n]) * s[k // gs, n].

Usage: python ref_numpy.py MODEL_DIR TOKENS_JSON N OUT.f32   (prints one JSON line) """
import json
import os
import re
import struct
import sys

import numpy as np

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
_DT = {"F32": np.float32, "F16": np.float16, "BF16": None, "I32": np.int32, "I64": np.int64,
       "F64": np.float64, "I8": np.int8, "U8": np.uint8, "I16": np.int16}


def st_read(path):
    """Reads every tensor of one safetensors file into numpy arrays (checks offsets)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype=np.uint16, count=(end - b) // 2, offset=base + b)
            arr = (u.astype(np.uint32) << 16).view(np.float32)
        else:
            dt = np.dtype(_DT[e["dtype"]])
            arr = np.frombuffer(buf, dtype=dt, count=(end - b) // dt.itemsize, offset=base + b)
        out[name] = arr.reshape(e["shape"])
    return out


def load_tensors(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    t = {}
    for fn in files:
        t.update(st_read(os.path.join(model_dir, fn)))
    return t


def _shift_unpack(words, bits, axis):
    """Unpacks int32 words into fields along a new axis after `axis` (LSB first)."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    shifts = np.arange(0, 32, bits, dtype=np.int64)
    mask = (1 << bits) - 1
    if axis == 0:   # qweight [K/pack, N] -> [K/pack, pack, N] -> [K, N]
        v = (u[:, None, :] >> shifts[None, :, None]) & mask
        return v.reshape(-1, words.shape[1])
    v = (u[:, :, None] >> shifts[None, None, :]) & mask   # [R, C] -> [R, C, pack] -> [R, C*pack]
    return v.reshape(words.shape[0], -1)


def dequant_gptq(t, prefix, bits, v2, notes):
    """Returns the torch-layout weight [N, K] (float32) of one GPTQ linear."""
    if bits not in (2, 4, 8):
        raise ValueError(f"{prefix}: this reference unpacks 2/4/8-bit GPTQ only, got {bits}")
    qw, qz = t[prefix + ".qweight"], t[prefix + ".qzeros"]
    sc = t[prefix + ".scales"].astype(np.float32)
    g_idx = t[prefix + ".g_idx"].astype(np.int64)
    q = _shift_unpack(qw, bits, 0)                   # [K, N]
    zf = _shift_unpack(qz, bits, 1)                  # [G, N] stored fields
    mask = (1 << bits) - 1
    if v2:
        z = zf
    else:
        z_torch = (zf + 1) & mask                    # AutoGPTQ / GPTQModel torch path
        z_vllm = zf + 1                              # vLLM exllama/marlin kernels
        bad = int(np.count_nonzero(z_torch != z_vllm))
        if bad:
            notes.append(f"{prefix}.qzeros: {bad} v1 zero fields equal {mask} (zero 0), which "
                         "AutoGPTQ and vLLM decode differently")
        z = z_torch
    K, N = q.shape
    if sc.shape[1] != N or g_idx.shape[0] != K:
        raise ValueError(f"{prefix}: scales {sc.shape} / g_idx {g_idx.shape} do not fit qweight [K={K}, N={N}]")
    w = sc[g_idx] * (q[:, :].astype(np.float32) - z[g_idx].astype(np.float32))
    return np.ascontiguousarray(w.T)


def dequant_awq(t, prefix, group_size):
    """Returns the torch-layout weight [N, K] (float32) of one AWQ gemm linear."""
    qw, qz = t[prefix + ".qweight"], t[prefix + ".qzeros"]
    sc = t[prefix + ".scales"].astype(np.float32)
    iw = _shift_unpack(qw, 4, 1)                     # [K, N] in packed order
    iz = _shift_unpack(qz, 4, 1)                     # [G, N]
    order = np.arange(iw.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
    iw, iz = iw[:, order], iz[:, order]
    K = iw.shape[0]
    g = np.arange(K) // group_size
    w = (iw.astype(np.float32) - iz[g].astype(np.float32)) * sc[g]
    return np.ascontiguousarray(w.T)


class Llama:
    """Llama forward in float32 (float64 accumulation for the norms)."""

    def __init__(self, model_dir):
        self.cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.t = load_tensors(model_dir)
        self.notes = []
        qc = self.cfg.get("quantization_config")
        self.w = {}
        for name in list(self.t):
            if name.endswith(".weight"):
                self.w[name[:-7]] = self.t[name].astype(np.float32)
        if qc:
            skip = [re.compile(k[2:]) for k in (qc.get("dynamic") or {}) if k.startswith("-:")]
            prefixes = sorted({n[: -len(".qweight")] for n in self.t if n.endswith(".qweight")})
            for p in prefixes:
                if any(r.match(p) for r in skip):
                    raise ValueError(f"{p}: packed, but config.dynamic says it stays in float")
                if qc["quant_method"] == "gptq":
                    v2 = qc.get("checkpoint_format", "gptq") == "gptq_v2"
                    self.w[p] = dequant_gptq(self.t, p, qc["bits"], v2, self.notes)
                elif qc["quant_method"] == "awq":
                    if qc.get("version", "gemm") != "gemm" or qc["bits"] != 4:
                        raise ValueError("only AWQ version gemm at 4 bits is unpacked here")
                    self.w[p] = dequant_awq(self.t, p, qc["group_size"])
                else:
                    raise ValueError(f"unknown quant_method {qc['quant_method']}")
        self.quant_layers = len([n for n in self.t if n.endswith(".qweight")])

    def _norm(self, x, w):
        eps = self.cfg.get("rms_norm_eps", 1e-6)
        x64 = x.astype(np.float64)
        r = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
        return (r * w).astype(np.float32)

    def forward(self, ids):
        c = self.cfg
        H, nh = c["hidden_size"], c["num_attention_heads"]
        nkv = c.get("num_key_value_heads", nh)
        hd = c.get("head_dim") or H // nh
        T = len(ids)
        x = self.w["model.embed_tokens"][np.asarray(ids)]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        ang = np.outer(np.arange(T, dtype=np.float64), inv)
        cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)
        sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)

        def rope(v):   # v [heads, T, hd], rotate-half (HF Llama)
            h2 = hd // 2
            rot = np.concatenate([-v[..., h2:], v[..., :h2]], -1)
            return v * cos + rot * sin

        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for L in range(c["num_hidden_layers"]):
            p = f"model.layers.{L}."
            h = self._norm(x, self.w[p + "input_layernorm"])
            q = (h @ self.w[p + "self_attn.q_proj"].T).reshape(T, nh, hd).transpose(1, 0, 2)
            k = (h @ self.w[p + "self_attn.k_proj"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            v = (h @ self.w[p + "self_attn.v_proj"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            q, k = rope(q), rope(k)
            rep = nh // nkv
            k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(T, nh * hd)
            x = x + a @ self.w[p + "self_attn.o_proj"].T
            h = self._norm(x, self.w[p + "post_attention_layernorm"])
            g = h @ self.w[p + "mlp.gate_proj"].T
            u = h @ self.w[p + "mlp.up_proj"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.w[p + "mlp.down_proj"].T
        x = self._norm(x, self.w["model.norm"])
        head = self.w.get("lm_head", self.w["model.embed_tokens"])
        return (x @ head.T).astype(np.float32)


def main():
    model_dir, tok_path, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ids = json.load(open(tok_path))
    if isinstance(ids, dict):
        ids = ids.get("tokens") or ids.get("ids") or ids["input_ids"]
    m = Llama(model_dir)
    logits = m.forward(ids[:n])
    logits.tofile(out)
    print(json.dumps({"quant_layers": m.quant_layers, "notes": m.notes, "shape": list(logits.shape)}))


if __name__ == "__main__":
    main()
