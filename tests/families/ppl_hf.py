#!/usr/bin/env python3
"""transformers' perplexity on exactly the token ids quantctl evaluates (issue #16).

    python ppl_hf.py MODEL_DIR IDS_FILE SEQ_LEN MAX_WINDOWS [QUANTCTL_EVAL_JSON]

IDS_FILE is what `quantctl tokenize --model MODEL_DIR --text FILE --bos` writes (a JSON
array or {"tokens": [...]}); `quantctl eval --text` tokenizes the same way (the file as one
string, BOS first when the tokenizer has one). The method is quant/model/eval.h's:
consecutive non-overlapping windows of SEQ_LEN (remainder dropped, no BOS per window), each
an independent forward from position 0, the NLL of tokens 1..SEQ_LEN-1 of each window summed
in double, ppl = exp(sum / (windows * (SEQ_LEN - 1))). MAX_WINDOWS 0 means all.

The model runs in float32 with eager attention. Prints one JSON line; with the JSON line of
`quantctl eval` on the same ids as the fifth argument it also prints the relative
difference and exits 1 when it exceeds 0.1% (the issue's bar).
"""
import json
import math
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    if len(sys.argv) not in (5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    model_dir, ids_file, seq_len, max_w = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(2)
    with open(ids_file) as f:
        d = json.load(f)
    ids = d["tokens"] if isinstance(d, dict) else d
    n_win = len(ids) // seq_len
    if max_w:
        n_win = min(n_win, max_w)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    t0 = time.time()
    total = 0.0
    with torch.no_grad():
        for w in range(n_win):
            x = torch.tensor([ids[w * seq_len:(w + 1) * seq_len]])
            logits = model(x).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
    pred = n_win * (seq_len - 1)
    res = {"ppl": math.exp(total / pred), "mean_nll": total / pred, "windows": n_win, "predicted": pred,
           "seq_len": seq_len, "seconds": round(time.time() - t0, 1), "transformers": transformers.__version__,
           "torch": torch.__version__}
    if len(sys.argv) == 6:
        q = json.loads(open(sys.argv[5]).read().strip().splitlines()[-1])
        if q.get("predicted") != pred:
            print(f"ppl_hf: quantctl predicted {q.get('predicted')} tokens, this run {pred}", file=sys.stderr)
            return 1
        res["quantctl_ppl"] = q["ppl"]
        res["rel_diff"] = abs(q["ppl"] - res["ppl"]) / res["ppl"]
        res["within_0.1%"] = res["rel_diff"] <= 1e-3
    print(json.dumps(res))
    return 0 if res.get("within_0.1%", True) else 1


if __name__ == "__main__":
    sys.exit(main())
