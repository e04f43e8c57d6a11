"""AutoAWQ's own AWQ search (scales + clip) on a HF checkpoint, exported unquantized.

    python bench/autoawq_ref.py MODEL_DIR CALIB.jsonl OUT_DIR BITS

Runs AutoAWQ's quantize() with export_compatible=True: the weights come out scaled and
clipped, the norms divided, nothing packed (AutoAWQ's GEMM packer only takes 4 bits).
Round-to-nearest zero point g128 on OUT_DIR is then exactly AutoAWQ's final quantization
step; bench/autoawq_ref.sh does that with quantctl and evaluates. float32, 2 threads, the
texts of CALIB.jsonl (one {"text": ...} per line) as calibration data.
"""
import json
import sys
import time

import torch
from awq import AutoAWQForCausalLM
from transformers import AutoTokenizer

model_dir, calib, out_dir, bits = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(2)
texts = [json.loads(line)["text"] for line in open(calib) if line.strip()]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoAWQForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
t = time.time()
model.quantize(tok, quant_config={"w_bit": bits, "q_group_size": 128, "zero_point": True, "version": "GEMM"},
               calib_data=texts, export_compatible=True, max_calib_samples=128, max_calib_seq_len=512)
print(f"autoawq search seconds {time.time() - t:.1f}", file=sys.stderr)
model.save_quantized(out_dir)
# The export is float weights: drop the quantization_config AutoAWQ wrote, so loaders (and
# quantctl) read it as the plain checkpoint it is.
cfg_path = f"{out_dir}/config.json"
cfg = json.load(open(cfg_path))
cfg.pop("quantization_config", None)
json.dump(cfg, open(cfg_path, "w"), indent=2)
