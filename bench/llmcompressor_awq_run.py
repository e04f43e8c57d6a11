"""llm-compressor's AWQ on a float model with given calibration ids, beside quantd's AWQ
(issue #19: AWQ's cost against GPTQ's and against llm-compressor's AWQ on the same ids).

    python bench/llmcompressor_awq_run.py MODEL IDS.json SAMPLES SEQ_LEN OUT THREADS

IDS.json as for bench/llmcompressor_run.py (SAMPLES rows of SEQ_LEN ids, file order, batch
size 1). Recipe, llm-compressor 0.14's form: AWQModifier (duo scaling, grid 20, its default
mappings) then QuantizationModifier: W4A16 int, asymmetric, group 64, every Linear but
lm_head. Output: compressed-tensors pack-quantized, plus the model's tokenizer files.
Prints one JSON line of stage seconds.
"""
import json, os, shutil, sys, time

t_start = time.time()
model_dir, ids_path, samples, seq_len, out, threads = sys.argv[1:7]
samples, seq_len, threads = int(samples), int(seq_len), int(threads)

import torch
torch.set_num_threads(threads)
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
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

model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
t_load = time.time()

recipe = [
    AWQModifier(duo_scaling=True),
    QuantizationModifier(
        config_groups={"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                        "group_size": 64, "dynamic": False},
        }},
        ignore=["lm_head"]),
]
oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=seq_len,
        num_calibration_samples=samples, shuffle_calibration_samples=False,
        batch_size=1, pipeline="sequential")
t_quant = time.time()

model.save_pretrained(out, save_compressed=True)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "vocab.json", "merges.txt"):
    if os.path.exists(os.path.join(model_dir, f)) and not os.path.exists(os.path.join(out, f)):
        shutil.copy(os.path.join(model_dir, f), out)
t_save = time.time()
print(json.dumps({"import": round(t_import - t_start, 1), "load": round(t_load - t_import, 1),
                  "quantize": round(t_quant - t_load, 1), "save": round(t_save - t_quant, 1),
                  "total": round(t_save - t_start, 1)}))
