#!/usr/bin/env python3
"""Reference GPTQ timing in PyTorch, for bench/gptq_layer.sh.

A re-implementation of the reference algorithm (IST-DASLab gptq.py: add_batch and
fasterquant; AutoGPTQ's act-order handling) in plain torch on the CPU, timing the same scope
as quantd's `seconds`: damping, cholesky -> cholesky_inverse -> cholesky(upper), and the
blocked column loop with lazy updates, given H. The Hessian accumulation (add_batch) is
timed separately.

    ref_gptq.py W.safetensors X.safetensors [--bits 4] [--group-size 128] [--sym]
                [--desc-act] [--threads 2] [--block-size 128]

Prints one JSON line: hessian_seconds, gptq_seconds, rel_output_error, and the options.
Needs torch, numpy and safetensors (pip install torch numpy safetensors).
"""
import argparse
import json
import math
import time

import torch
from safetensors.torch import load_file


def quantize(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


class MinMax:
    """Per-output-row min-max parameters, as the reference Quantizer(perchannel=True)."""

    def __init__(self, bits, sym):
        self.maxq = torch.tensor(2 ** bits - 1)
        self.sym = sym

    def find_params(self, x):
        tmp = torch.zeros(x.shape[0])
        xmin = torch.minimum(x.min(1)[0], tmp)
        xmax = torch.maximum(x.max(1)[0], tmp)
        if self.sym:
            xmax = torch.maximum(torch.abs(xmin), xmax)
            neg = xmin < 0
            if torch.any(neg):
                xmin[neg] = -xmax[neg]
        both = (xmin == 0) & (xmax == 0)
        xmin[both] = -1
        xmax[both] = +1
        self.scale = ((xmax - xmin) / self.maxq).unsqueeze(1)
        if self.sym:
            self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2)
        else:
            self.zero = torch.round(-xmin / self.scale.squeeze(1)).unsqueeze(1)

    def quantize(self, x):
        return quantize(x, self.scale, self.zero, self.maxq)


def add_batch(H, nsamples, inp):
    tmp = inp.shape[0]
    inp = inp.t()
    H *= nsamples / (nsamples + tmp)
    nsamples += tmp
    inp = math.sqrt(2 / nsamples) * inp.float()
    H += inp.matmul(inp.t())
    return H, nsamples


def fasterquant(W, H, quantizer, blocksize=128, percdamp=0.01, groupsize=-1, actorder=False):
    W = W.clone().float()
    columns = W.shape[1]
    quantizer.find_params(W)
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    if actorder:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)
        W = W[:, perm]
        H = H[perm][:, perm]
        invperm = torch.argsort(perm)
    Q = torch.zeros_like(W)
    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    H = torch.linalg.cholesky(H, upper=True)
    Hinv = H
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]
            if groupsize != -1 and (i1 + i) % groupsize == 0:
                quantizer.find_params(W[:, (i1 + i):(i1 + i + groupsize)])
            q = quantizer.quantize(w.unsqueeze(1)).flatten()
            Q1[:, i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        Q[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    if actorder:
        Q = Q[:, invperm]
    return Q, float(damp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weight")
    ap.add_argument("inputs")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--sym", action="store_true")
    ap.add_argument("--desc-act", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=1,
                    help="run fasterquant this many times in the process; gptq_seconds is the best, "
                         "gptq_first_seconds the first")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W = next(iter(load_file(a.weight).values())).float()
    X = next(iter(load_file(a.inputs).values())).float()
    n, k = W.shape

    t0 = time.perf_counter()
    H = torch.zeros((k, k))
    H, ns = add_batch(H, 0, X)
    t_hess = time.perf_counter() - t0

    times = []
    for _ in range(max(1, a.reps)):
        t0 = time.perf_counter()
        Q, damp = fasterquant(W, H, MinMax(a.bits, a.sym), a.block_size, a.damp, a.group_size, a.desc_act)
        times.append(time.perf_counter() - t0)
    t_gptq = min(times)

    ref = X @ W.t()
    rel = float(torch.linalg.norm(ref - X @ Q.t()) / torch.linalg.norm(ref))
    print(json.dumps({"impl": "torch-reference", "torch": torch.__version__, "threads": a.threads,
                      "n": n, "k": k, "rows": X.shape[0], "bits": a.bits, "group_size": a.group_size,
                      "sym": a.sym, "desc_act": a.desc_act, "hessian_seconds": round(t_hess, 4),
                      "gptq_seconds": round(t_gptq, 4), "gptq_first_seconds": round(times[0], 4),
                      "reps": len(times), "damp": damp, "rel_output_error": rel}))


if __name__ == "__main__":
    main()
