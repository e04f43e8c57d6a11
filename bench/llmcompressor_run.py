"""llm-compressor's GPTQ on a float model with given calibration ids (bench/llmcompressor.sh).

    python bench/llmcompressor_run.py MODEL IDS.json SAMPLES SEQ_LEN OUT THREADS TARGETS [DTYPE]

IDS.json: a flat JSON array of SAMPLES * SEQ_LEN token ids (the exact ids the quantd job
reads), cut into SAMPLES rows of SEQ_LEN, fed in file order (no shuffle, batch size 1, no
padding). GPTQModifier: W4A16 int, symmetric, group 64, actorder None, dampening 0.01,
block_size 128, every Linear but lm_head. TARGETS: "layer" (llm-compressor's default
sequential pipeline: one decoder layer a subgraph, every linear of a layer calibrated on
the layer's input before any of them is quantized) or "linear" (sequential_targets
["Linear"]: each linear its own subgraph, calibrated on the outputs of the already
quantized ones before it: quantd's true_sequential), or "awq": llm-compressor's AWQ instead
of GPTQ, for AWQ's cost beside quantd's (bench/results/awq-speed.md): AWQModifier (duo
scaling, grid 20, its default mappings) then QuantizationModifier, W4A16 int, asymmetric,
group 64; or "scheme:NAME:rtn" / "scheme:NAME:gptq": a compressed-tensors preset (FP8_DYNAMIC,
NVFP4A16, MXFP4A16, ...) through QuantizationModifier or GPTQModifier (actorder None,
dampening 0.01), every Linear but lm_head (bench/schemes.sh); or "gptq:BITS:GROUP:SYM:ACTORDER" /
"rtn:BITS:GROUP:SYM" (SYM sym or asym, ACTORDER none, static, weight, or default: not
named, as a user's recipe leaves it): int weights
of any width and group, GPTQ true-sequential (bench/quality_table.sh). DTYPE: the dtype the model is loaded and run in, float32 (default) or bfloat16
(torch runs bf16 matrix products on AMX where the CPU has it; GPTQ's Hessian is still
accumulated in float32 from the bf16 activations). Output: compressed-tensors
pack-quantized, plus the model's tokenizer files; for int widths other than 4 and 8 (which
neither vLLM nor quantd reads packed) a float checkpoint of the fake-quantized weights.
Prints one JSON line of stage seconds.
"""
import json, os, shutil, sys, time

t_start = time.time()
model_dir, ids_path, samples, seq_len, out, threads, targets = sys.argv[1:8]
dtype_name = sys.argv[8] if len(sys.argv) > 8 else "float32"
samples, seq_len, threads = int(samples), int(seq_len), int(threads)

import torch
torch.set_num_threads(threads)
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
from llmcompressor.modifiers.transform.awq import AWQModifier
from llmcompressor.pipelines.cache import IntermediatesCache
# llm-compressor 0.14's AWQ pins its cached activations before each grid search, which needs
# a CUDA driver ("Found no NVIDIA driver"): on a CPU-only machine pinning only fails, and it
# is a transfer optimisation with no effect on the result, so it is skipped.
if not torch.cuda.is_available():
    IntermediatesCache.pin_memory = lambda self, *a, **k: None
t_import = time.time()

ids = json.load(open(ids_path))
if isinstance(ids, dict): ids = ids["tokens"]
assert len(ids) == samples * seq_len, (len(ids), samples, seq_len)
rows = [ids[i * seq_len:(i + 1) * seq_len] for i in range(samples)]
ds = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seq_len for _ in rows]})

if dtype_name not in ("float32", "bfloat16"):
    sys.exit("DTYPE must be float32 or bfloat16")
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name))
t_load = time.time()

def weights(symmetric):
    return {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group",
            "group_size": 64, "actorder": None, "dynamic": False}

recipe = GPTQModifier(
    config_groups={"group_0": {
        "targets": ["Linear"],
        "weights": weights(True),
    }},
    ignore=["lm_head"], dampening_frac=0.01, block_size=128, actorder=None)
kw = {}
if targets == "linear":
    kw["sequential_targets"] = ["Linear"]
elif targets == "awq":
    recipe = [AWQModifier(duo_scaling=True),
              QuantizationModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights(False)}},
                                   ignore=["lm_head"])]
elif targets.startswith("scheme:"):
    _, preset, how = targets.split(":")
    if how == "rtn":
        recipe = QuantizationModifier(targets=["Linear"], scheme=preset, ignore=["lm_head"])
    else:
        recipe = GPTQModifier(targets=["Linear"], scheme=preset, ignore=["lm_head"], dampening_frac=0.01,
                              block_size=128, actorder=None)
elif targets.startswith("gptq:") or targets.startswith("rtn:"):
    # "gptq:BITS:GROUP:sym|asym:ACTORDER" (ACTORDER none, static, group, weight) or
    # "rtn:BITS:GROUP:sym|asym": the quality table's rows (bench/quality_table.sh); GPTQ as
    # above (dampening 0.01, block 128), each linear its own subgraph (true-sequential).
    f = targets.split(":")
    how, bits, group, sym = f[0], int(f[1]), int(f[2]), f[3] == "sym"
    w = dict(weights(sym), num_bits=bits, group_size=group)
    if how == "rtn":
        recipe = QuantizationModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": w}},
                                      ignore=["lm_head"])
    else:
        # "default": actorder left unset, as a user who does not name it gets it (0.14's
        # GPTQModifier then resolves it to static)
        extra = {} if f[4] == "default" else {"actorder": None if f[4] == "none" else f[4]}
        if f[4] != "default": w["actorder"] = extra["actorder"]
        recipe = GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": w}},
                              ignore=["lm_head"], dampening_frac=0.01, block_size=128, **extra)
        kw["sequential_targets"] = ["Linear"]
elif targets != "layer":
    sys.exit("TARGETS must be layer, linear, awq, scheme:NAME:rtn|gptq, gptq:BITS:GROUP:SYM:ACTORDER or rtn:BITS:GROUP:SYM")
oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=seq_len,
        num_calibration_samples=samples, shuffle_calibration_samples=False,
        batch_size=1, pipeline="sequential", **kw)
t_quant = time.time()

def save_dense(model, out):
    """Widths pack-quantized holds but neither vLLM nor quantd reads (3 bits): each quantized
    linear's weight replaced by its fake-quantized values (compressed-tensors' own
    fake_quantize, what the frozen model computes with), saved as a float checkpoint with the
    source's tensor names and config, so `quantctl eval` reads exactly the weights llm-compressor
    chose. Static groups only (a non-trivial weight_g_idx is refused)."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from safetensors import safe_open
    from safetensors.torch import save_file
    with torch.no_grad():
        for name, m in model.named_modules():
            s = getattr(m, "quantization_scheme", None)
            if s is None or s.weights is None:
                continue
            gi = getattr(m, "weight_g_idx", None)
            if gi is not None and not torch.equal(gi, torch.arange(gi.numel(), device=gi.device) // s.weights.group_size):
                sys.exit("%s: weight_g_idx is not static groups; dense save refused" % name)
            m.weight.data = fake_quantize(m.weight, m.weight_scale, getattr(m, "weight_zero_point", None), s.weights)
    sd = model.state_dict()
    keys = []
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, f), "pt") as h:
                keys += list(h.keys())
    os.makedirs(out, exist_ok=True)
    save_file({k: sd[k].detach().to(torch.float32).contiguous().clone() for k in keys},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(model_dir, "config.json"), out)

packed_bits = targets.startswith(("gptq:", "rtn:")) and int(targets.split(":")[1]) not in (4, 8)
if packed_bits:
    save_dense(model, out)
else:
    model.save_pretrained(out, save_compressed=True)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "vocab.json", "merges.txt"):
    if os.path.exists(os.path.join(model_dir, f)) and not os.path.exists(os.path.join(out, f)):
        shutil.copy(os.path.join(model_dir, f), out)
t_save = time.time()
print(json.dumps({"import_s": round(t_import - t_start, 2), "load_s": round(t_load - t_import, 2),
                  "oneshot_s": round(t_quant - t_load, 2), "save_s": round(t_save - t_quant, 2),
                  "total_s": round(t_save - t_start, 2), "threads": torch.get_num_threads(),
                  "targets": targets, "dtype": dtype_name}))
