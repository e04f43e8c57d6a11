"""Compares another implementation's logits with quantd's dequantized forward and prints one
table row; exit status 1 when they disagree.

  python compare.py OURS.f32 THEIRS.f32 KIND TOL LABEL [FLOAT.f32]

OURS and THEIRS are float32 [tokens, vocab] (vocab taken from the shapes; THEIRS may have
fewer rows). KIND "logits" compares raw logits; "logprobs" compares log_softmax of ours with
THEIRS, row i of THEIRS being the distribution after token i+1 (vLLM's prompt_logprobs,
which start at the second token), so it is matched with our row i. Agreement means
max |diff| <= TOL and the same arg-max on at least 95% of rows (fp16 rounding may flip a
near-tie). FLOAT, when given, is the unquantized model's logits: its distance from OURS
("quant effect") shows the size of the change a layout bug would cause, for scale. """
import sys

import numpy as np

ours_p, theirs_p, kind, tol, label = sys.argv[1:6]
tol = float(tol)
vocab = 512
ours = np.fromfile(ours_p, np.float32)
theirs = np.fromfile(theirs_p, np.float32)
# vocab is the same for both; rows = size / vocab.
for v in (512, 32000, 50272, 32768, 128256):
    if ours.size % v == 0 and theirs.size % v == 0:
        vocab = v
        break
ours = ours.reshape(-1, vocab)
theirs = theirs.reshape(-1, vocab)
if kind == "logprobs":
    m = ours.max(1, keepdims=True)
    ours = ours - m - np.log(np.exp(ours - m).sum(1, keepdims=True))
rows = min(len(ours), len(theirs))
a, b = ours[:rows], theirs[:rows]
fin = np.isfinite(b)
d = np.abs(a - b)[fin]
maxd = float(d.max()) if d.size else float("inf")
meand = float(d.mean()) if d.size else float("inf")
top1 = float((a.argmax(1) == b.argmax(1)).mean())
effect = ""
if len(sys.argv) > 6:
    f = np.fromfile(sys.argv[6], np.float32).reshape(-1, vocab)[: len(ours)]
    if kind == "logprobs":
        mf = f.max(1, keepdims=True)
        f = f - mf - np.log(np.exp(f - mf).sum(1, keepdims=True))
    effect = f"{float(np.abs(ours[:rows] - f[:rows]).max()):.3f}"
ok = maxd <= tol and top1 >= 0.95 and fin.all()
print(f"| {label:<44} | {kind:<8} | {rows:>4} | {maxd:>10.2e} | {meand:>10.2e} | {top1:>5.3f} | {tol:>7.0e} | {effect:>7} | {'PASS' if ok else 'FAIL'} |")
sys.exit(0 if ok else 1)
