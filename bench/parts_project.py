#!/usr/bin/env python3
"""One job over many workers, from measured part costs to bigger models (docs/parallel.md).

    bench/parts_project.py timeline DAEMON_LOG [--block N]
    bench/parts_project.py project DENSE_LOG DENSE_REPORT [MOE_LOG MOE_REPORT] [--check-1 SECONDS]
                                   [--moe-1 MOE_REPORT_OF_ONE_WORKER] [--block N]

A quantd daemon log of one block's job (bench/parts.sh or bench/gpu.sh's parts step keep
them) says when each fan-out opened and closed and what each part cost; between fan-outs the
lead works alone. `timeline` prints that: per fan-out its parts' seconds, and each stretch of
the lead alone. `project` turns the measured costs into rates (seconds per unit of work) and
composes, from the same rates, the blocks of Llama-3-70B and DeepSeek-V3 over W workers:
what runs as parts is spread over the workers (list scheduling of equal parts), what the lead
does alone is added as it is. It first composes the measured block itself at 1 and 2 workers,
so its error on the shape it was measured on is printed beside its projections.

The rates are those of the machine the logs come from: CPU workers' logs project CPU workers,
a GPU run's logs (bench/gpu.sh) project GPUs. Work is counted as:
  - a capture pass: per token, the products it runs before its group's input (2 flops a
    weight) and its Hessians (k^2 a row for each group it fills);
  - a GPTQ part: rows x k^2 (its column loop and its error traces);
  - a factorisation: k^3 (one potrf);
  - the lead's merge, pack and kernel check of a linear: n x k;
  - the last forward: per token, the down projection's n x k products.
Python's standard library only.
"""
import json
import math
import re
import sys
from datetime import datetime

ROWS = 2048          # the most rows of a quantize part (docs/parallel.md)
BATCH = 4096         # the tokens of a forward batch
MAX_CPARTS = 16      # the most capture parts of a pass

LINE = re.compile(r"^(\S+Z) \w+ (\w+) (.*)$")


def parse_log(path, block=0):
    """Block `block`'s events (the first's by default): its task start, fan-outs and end."""
    t0 = t_end = None
    fans, cur = [], None
    for raw in open(path, errors="replace"):
        m = LINE.match(raw.strip())
        if not m:
            continue
        ts = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        ev, kv = m.group(2), dict(re.findall(r"(\w+)=(\S+)", m.group(3)))
        if ev == "task_start" and t0 is None and kv.get("block") == str(block):
            t0 = ts
        elif t0 is None:
            continue
        elif ev == "parts_open":
            cur = {"step": kv["step"], "open": ts, "close": None, "n": int(kv["parts"]), "parts": [], "idx": []}
            fans.append(cur)
        elif ev == "part_done" and "lead" in kv and cur is not None and kv.get("step") == cur["step"]:
            cur["parts"].append((float(kv["seconds"]), kv["lead"] == "1"))
            cur["idx"].append(int(kv.get("part", -1)))
        elif ev == "parts_done" and cur is not None:
            cur["close"] = ts
        elif ev == "block_done" and t_end is None:
            t_end = ts
            break
    if t0 is None or t_end is None:
        sys.exit(f"{path}: no task_start or block_done line of block {block}")
    prev = t0
    for f in fans:
        f["before"] = f["open"] - prev
        prev = f["close"] if f["close"] is not None else f["open"]
    return {"t0": t0, "end": t_end, "block": t_end - t0, "fans": fans, "after": t_end - prev}


def timeline(path, block=0):
    lg = parse_log(path, block)
    print(f"block: {lg['block']:.1f} s\n")
    print("| fan-out | step | parts | lead alone before s | wall s | parts' seconds (sum) | longest part s |")
    print("|---|---|---|---|---|---|---|")
    alone = 0.0
    for i, f in enumerate(lg["fans"]):
        secs = [s for s, _ in f["parts"]]
        wall = (f["close"] or f["open"]) - f["open"]
        alone += f["before"]
        print(f"| {i} | {f['step']} | {f['n']} | {f['before']:.2f} | {wall:.2f} | {sum(secs):.2f} | {max(secs, default=0):.2f} |")
    alone += lg["after"]
    print(f"| end | | | {lg['after']:.2f} | | | |")
    print(f"\nthe lead alone: {alone:.1f} s of {lg['block']:.1f} s ({100 * alone / lg['block']:.0f}%)")
    return lg


# ---- shapes ---------------------------------------------------------------------------------

def dense_shape(h, inter, heads, kv, hd=None, n_layers=1, name=""):
    hd = hd or h // heads
    return {"name": name, "h": h, "i": inter, "q": heads * hd, "kv": kv * hd, "layers": n_layers}


def dense_groups(s):
    """True-sequential groups of a dense block: (name, [(n, k) of its linears])."""
    h, i, q, kv = s["h"], s["i"], s["q"], s["kv"]
    return [("qkv", [(q, h), (kv, h), (kv, h)]), ("o", [(h, q)]), ("gate_up", [(i, h), (i, h)]), ("down", [(h, i)])]


def dense_pass_flops(s, g, seq):
    """Per token: a true-sequential pass's products before group g's input, and g's Hessian."""
    h, i, q, kv = s["h"], s["i"], s["q"], s["kv"]
    attn = 2 * (q * h + 2 * kv * h) + 4 * seq * q      # q/k/v, then scores and values
    hess = {"qkv": h * h, "o": q * q, "gate_up": h * h, "down": i * i}[g]
    before = {"qkv": 0, "o": attn, "gate_up": attn + 2 * h * q, "down": 2 * 2 * i * h}[g]
    return before + hess


def parts_of(linears):
    return sum(math.ceil(n / ROWS) for n, _ in linears)


def makespan(n_parts, each, workers):
    return math.ceil(n_parts / workers) * each


# ---- the dense model: rates from a measured true-sequential block ---------------------------

def dense_rates(lg, report):
    job = report["job"]
    cal = job["calibration"]
    tokens = cal["samples"] * cal["seq_len"]
    L = {l["name"].rsplit(".", 1)[-1]: l for l in report["layers"]}
    s = dense_shape(L["q_proj"]["k"], L["gate_proj"]["n"], 1, 1)
    s["q"], s["kv"] = L["q_proj"]["n"], L["k_proj"]["n"]
    groups = dense_groups(s)
    quants = [f for f in lg["fans"] if f["step"] == "quantize"]
    if len(quants) != len(groups) or not job.get("true_sequential", True):
        sys.exit("project: the dense log must be a true-sequential block with one quantize fan-out a group")
    r = {"shape": s, "tokens": tokens, "seq": cal["seq_len"], "measured": lg["block"], "groups": {},
         "ctx_s": 0.0, "ctx_n": 0}
    fans = lg["fans"]
    for gi, (g, lin) in enumerate(groups):
        qi = fans.index(quants[gi])
        # Trace parts (the builds since ee16f07): a factor fan-out before the quantize step,
        # its part 0 the factorisation, the others each row part's error denominator.
        fac = fans[qi - 1] if qi > 0 and fans[qi - 1]["step"] == "factor" else None
        ci = qi - 2 if fac else qi - 1
        cap = fans[ci] if ci >= 0 and fans[ci]["step"] == "capture" else None
        k = lin[0][1]
        qsecs = [x for x, _ in quants[gi]["parts"]]
        # after this quantize step: the lead's merge, pack, kernel check (and state files)
        # until the next fan-out, or to the block's end for the last group (with its forward).
        nxt = fans[qi + 1]["before"] if qi + 1 < len(fans) else None
        work_nk = sum(n * kk for n, kk in lin)
        e = {
            "cap_s": sum(x for x, _ in cap["parts"]) if cap else 0.0,
            "cap_n": cap["n"] if cap else 0,
            "cap_flops": tokens * dense_pass_flops(s, g, cal["seq_len"]),
            "pre_s": quants[gi]["before"],            # factor, the Hessians' sums or merges, input files
            "k3": float(k) ** 3,
            "part_s": sum(qsecs) / len(qsecs),        # with trace parts, GPTQ's alone
            "part_work": min(ROWS, lin[0][0]) * float(k) ** 2,
            "post_s": nxt if nxt is not None else 0.0,
            "nk": work_nk,
            "trace": fac is not None,
        }
        if fac:
            tr = [x for (x, _), i in zip(fac["parts"], fac["idx"]) if i != 0]
            e["pre_s"] += fac["before"]              # the Hessians' merges and files, in the lead
            e["fac_s"] = sum(x for (x, _), i in zip(fac["parts"], fac["idx"]) if i == 0)
            e["trace_s"] = sum(tr) / len(tr) if tr else 0.0
        # The residual stream after the attention from the kept context cut into capture
        # parts (the builds since 612adba): a capture fan-out between the output projection's
        # quantize step and the gate/up pass's.
        if g == "o" and qi + 2 < len(fans) and fans[qi + 1]["step"] == "capture" and fans[qi + 2]["step"] == "capture":
            ctx = fans[qi + 1]
            r["ctx_s"], r["ctx_n"] = sum(x for x, _ in ctx["parts"]), ctx["n"]
            e["post_s"] += fans[qi + 2]["before"]
        r["groups"][g] = e
    # Per unit of work: a factorisation (k^3), a trace (rows k^2), GPTQ with and without the
    # trace (rows k^2); from the groups that measured each.
    tg = [e for e in r["groups"].values() if e["trace"]]
    ng = [e for e in r["groups"].values() if not e["trace"] and e["pre_s"] > 0]
    r["trace_rate"] = sum(e["trace_s"] / e["part_work"] for e in tg) / len(tg) if tg else None
    r["fac_rate"] = (sum(e["fac_s"] / e["k3"] for e in tg) / len(tg) if tg else
                     sum(e["pre_s"] / e["k3"] for e in ng) / len(ng))
    # the block's load (before a first capture fan-out; before a first quantize step the
    # stretch is that group's: its pass and factorisation in the lead)
    r["first_s"] = fans[0]["before"] if fans[0]["step"] == "capture" else 0.0
    # The last forward: a capture fan-out after the last quantize step (the down projection
    # on the kept activation, cut), else in the lead with the commit, after the last step.
    last = fans.index(quants[-1])
    fwd = fans[last + 1] if last + 1 < len(fans) and fans[last + 1]["step"] == "capture" else None
    r["fwd_s"] = sum(x for x, _ in fwd["parts"]) if fwd else 0.0
    r["fwd_n"] = fwd["n"] if fwd else 0
    r["end_s"] = lg["after"]
    r["end_work"] = tokens * s["h"] * s["i"]
    r["params"] = sum(n * k for _, lin in groups for n, k in lin)
    return r


def dense_block(r, t, tokens, seq, shards, workers):
    """Seconds of one true-sequential block of shape t over `workers`, from rates r: the
    capture parts, the quantize parts, and what the lead does alone."""
    c = {"capture": 0.0, "quantize": 0.0, "factor": 0.0, "lead": 0.0, "forward": 0.0}
    c["lead"] = r["first_s"] * (t["h"] * (t["q"] + t["i"])) / (r["shape"]["h"] * (r["shape"]["q"] + r["shape"]["i"]))
    cparts = shards if shards > 1 else min(MAX_CPARTS, max(1, tokens // BATCH))
    for g, lin in dense_groups(t):
        e = r["groups"][g]
        k = lin[0][1]
        # the capture pass: its parts where the measured block cut it, else the lead's
        pass_work = tokens * dense_pass_flops(t, g, seq)
        one = min(ROWS, lin[0][0]) * float(k) ** 2   # a row part's work
        # GPTQ's share of a row part and its trace's (a trace part's where the build had them)
        tr_rate = r["trace_rate"] or 0.0
        gptq_rate = e["part_s"] / e["part_work"] - (0.0 if e["trace"] else tr_rate)
        # trace parts where the measured build has them and the rule (qd_tpart_pays) holds
        traced = r["trace_rate"] is not None and workers > 1 and k > 3 * max(min(ROWS, n) for n, _ in lin)
        fac = r["fac_rate"] * float(k) ** 3
        if e["cap_n"] and r["trace_rate"] is None:
            c["capture"] += makespan(cparts, e["cap_s"] * pass_work / e["cap_flops"] / cparts, workers)
            c["factor"] += e["pre_s"] * float(k) ** 3 / e["k3"]    # the factorisation, the Hessians' merge
        elif e["cap_n"]:
            c["capture"] += makespan(cparts, e["cap_s"] * pass_work / e["cap_flops"] / cparts, workers)
            # the lead's Hessian merges and files before the step (k^2), then the factorisation:
            # a part beside the traces (list-scheduled), or the lead's
            merges = e["pre_s"] if e["trace"] else max(0.0, e["pre_s"] - r["fac_rate"] * e["k3"])
            c["factor"] += merges * float(k) ** 2 / e["k3"] ** (2 / 3)
            if traced:
                loads = [fac] + [0.0] * (workers - 1)
                for x in [tr_rate * min(ROWS, n) * float(k) ** 2 for n, _ in lin for _ in range(math.ceil(n / ROWS))]:
                    loads[loads.index(min(loads))] += x
                c["factor"] += max(loads)
            else:
                c["factor"] += fac
        else:
            c["lead"] += e["pre_s"] * pass_work / e["cap_flops"]  # the pass (and factorisation) in the lead
        each = (gptq_rate if traced else gptq_rate + tr_rate) * one
        c["quantize"] += makespan(parts_of(lin), each, workers)
        if g != "down" or r["fwd_n"]:   # the lead's merge, pack and kernel check, its state files
            c["lead"] += e["post_s"] * sum(n * kk for n, kk in lin) / e["nk"]
        if g == "o" and r["ctx_n"]:       # the residual stream from the context, as capture parts
            c["capture"] += makespan(cparts, r["ctx_s"] * tokens * t["h"] * t["q"] /
                                     (r["tokens"] * r["shape"]["h"] * r["shape"]["q"]) / cparts, workers)
    fwd_work = tokens * t["h"] * t["i"] / r["end_work"]
    if r["fwd_n"]:   # the last forward's parts, then the commit
        c["capture"] += makespan(cparts, r["fwd_s"] * fwd_work / cparts, workers)
        c["lead"] += r["end_s"] * sum(n * k for _, lin in dense_groups(t) for n, k in lin) / r["params"]
    else:            # the last forward in the lead, with the commit
        c["forward"] = r["end_s"] * fwd_work
    c["total"] = sum(c.values())
    return c


# ---- the MoE model: rates from a measured MoE block ------------------------------------------

WAVE_BYTES = 4 << 30  # the Hessians of one capture pass over experts (QD_WAVE_HESSIAN_BYTES)


def moe_shape(name, h, attn_groups, attn_linears, e_inter, n_exp, topk, shared=0, n_layers=1):
    """attn_groups: (k, flops of the linears before it) of each attention input group, in order."""
    return {"name": name, "h": h, "attn_groups": attn_groups, "attn": attn_linears, "ei": e_inter,
            "ne": n_exp + shared, "routed": n_exp, "topk": topk + shared, "layers": n_layers}


def moe_capture_work(s, seq, all_experts, even=True, twins=True):
    """Per token, the true-sequential passes of a MoE block: (the lead's: the attention
    groups' passes, each running the attention up to its group, and the residual stream
    after the attention, once; the experts' passes: per pass, its experts, the router's work
    and its experts' work). An expert pass starts from that residual stream: a gate/up pass
    runs the router and fills its experts' Hessians, a down pass also runs its experts' gate
    and up. all_experts (moe.calibrate_all_experts, the default): every expert's hooks see
    every token; else the top-k routed to it. even: the build's waves (wave_sizes). twins
    (the builds since the experts' gate/up Hessians are summed once, all_experts only): a
    gate/up pass sums one Hessian, in the lead (its parts would each sum it again); each
    pass is (experts, router work, experts' work, cut by experts)."""
    h, ei, ne, tk = s["h"], s["ei"], s["ne"], s["topk"]
    seen = ne if all_experts else tk
    lead = sum(before + k * k for k, before in s["attn_groups"])
    lead += sum(2 * n * k for n, k in s["attn"]) + 4 * seq * s["attn"][-1][1]
    router = 2 * h * s["routed"]
    one = twins and all_experts
    waves = [(n, router, (1 if one else n / ne * seen) * h * h, not one) for n in wave_sizes(ne, h, even)]
    waves += [(n, router, n / ne * seen * (4 * h * ei + ei * ei), True) for n in wave_sizes(ne, ei, even)]
    return lead, waves


def moe_capture_total(s, seq, all_experts, even=True, twins=True):
    lead, waves = moe_capture_work(s, seq, all_experts, even, twins)
    return lead + sum(r + e for _, r, e, _ in waves)


def moe_block_shape_of(report):
    layers = report["layers"]
    exp = [l for l in layers if ".experts." in l["name"]]
    attn = [l for l in layers if ".experts." not in l["name"]]
    gate = [l for l in exp if l["name"].endswith(("gate_proj", "w1"))]
    h, ei = gate[0]["k"], gate[0]["n"]
    lin = [(l["n"], l["k"]) for l in attn]
    q = lin[0]
    groups = [(h, 0), (lin[-1][1], sum(2 * n * k for n, k in lin[:-1]))]
    return moe_shape("measured", h, groups, lin, ei, len(gate), 2)


def moe_rates(lg, report, dense, report1=None):
    cal = report["job"]["calibration"]
    tokens = cal["samples"] * cal["seq_len"]
    s = moe_block_shape_of(report)
    fac_s = sum(x for f in lg["fans"] if f["step"] == "factor" for x, _ in f["parts"])
    fac_k3 = s["ne"] * (float(s["h"]) ** 3 + float(s["ei"]) ** 3)
    gptq_s = sum(x for f in lg["fans"] if f["step"] == "quantize" for x, _ in f["parts"])
    gptq_w = sum(l["n"] * float(l["k"]) ** 2 for l in report["layers"])
    st = report["blocks"][0]["stages"]
    file_bytes = 4.0 * s["ne"] * (s["h"] ** 2 + s["ei"] ** 2)   # each expert's Hessian and factor triangles
    all_experts = report["job"].get("moe", {}).get("calibrate_all_experts", True)
    caps = [f for f in lg["fans"] if f["step"] == "capture"]
    even = waves_even(caps, s)
    # A build with twins cuts only the down passes (every expert seeing every token).
    twins = bool(caps) and all_experts and len(caps) == len(wave_sizes(s["ne"], s["ei"], even))
    lead_w, waves = moe_capture_work(s, cal["seq_len"], all_experts, even, twins)
    # In memory (a block whose experts' passes ran in the lead, or report1, the same block on
    # one worker): one rate, the calibrate stage over all the passes. Cut by experts (capture
    # fan-outs): the parts' rate from their seconds (each part runs the router; their files
    # and block loads included); without report1, the lead's passes at that rate too.
    total = tokens * moe_capture_total(s, cal["seq_len"], all_experts, even, twins)
    cap_rate = part_rate = st["calibrate"] / total
    if caps:
        part_w = sum(min(n, MAX_CPARTS) * r + e for n, r, e, c in waves if c)
        part_rate = sum(x for f in caps for x, _ in f["parts"]) / (tokens * part_w)
        cap_rate = report1["blocks"][0]["stages"]["calibrate"] / total if report1 else part_rate
    return {"cap_rate": cap_rate, "part_rate": part_rate, "cut": bool(caps), "all_experts": all_experts, "even": even, "twins": twins,
            "fac_rate": fac_s / fac_k3, "gptq_rate": gptq_s / gptq_w, "file_rate": st["checkpoint"] / file_bytes,
            "lead_rate": dense_lead_rate(dense), "measured": lg["block"], "shape": s, "tokens": tokens,
            "seq": cal["seq_len"], "lead_alone": lg["block"] - sum((f["close"] or f["open"]) - f["open"] for f in lg["fans"])}


def dense_lead_rate(r):
    """Seconds per weight of the lead's merge, pack and kernel check (the measured stretches
    after the quantize steps that end in another fan-out)."""
    s = sum(e["post_s"] for g, e in r["groups"].items() if g != "down")
    w = sum(e["nk"] for g, e in r["groups"].items() if g != "down")
    return s / w


def wave_sizes(n, k, even=True):
    """The experts of each pass over n experts' groups of width k: the fewest passes the
    Hessian budget allows, of even sizes (quant/pipeline/wave.h); not even: each pass as
    full as the budget allows, in turn (the builds before 071ba10, whose logs are measured
    blocks too)."""
    per = max(1, WAVE_BYTES // (k * k * 4))
    passes = -(-n // per)
    if not even:
        return [min(per, n - i) for i in range(0, n, per)]
    return [n // passes + (1 if i < n % passes else 0) for i in range(passes)]


def waves_even(caps, s):
    """Whether a measured block's expert passes (its capture fan-outs, one part an expert
    up to MAX_CPARTS) were cut evenly; True when none was cut (the passes' split does not
    change their total work)."""
    def parts(even):
        return [min(n, MAX_CPARTS) for k in (s["h"], s["ei"]) for n in wave_sizes(s["ne"], k, even)]
    seen = [len(f["parts"]) for f in caps]
    return not (seen and seen == parts(False) and seen != parts(True))


def moe_block(m, s, tokens, seq, workers, cut=True):
    """One MoE block of shape s over `workers`: the attention groups' capture passes in the
    lead; each experts' pass cut by experts (cut: at most MAX_CPARTS parts, each running the
    router and its experts, at the parts' rate; else in the lead); the files in the lead
    (at the measured block's rate per byte of its Hessians); each wave's
    factorisations and GPTQ rows as parts (a fan-out a wave: the gate/up projections of its
    experts, then their down projections); the attention groups' factorisations and every
    linear's merge and pack in the lead."""
    h, ei, ne = s["h"], s["ei"], s["ne"]
    lead_w, waves = moe_capture_work(s, seq, m["all_experts"], m["even"], m["twins"])
    one = m["twins"] and m["all_experts"]   # the gate/up Hessian once a pass, and its factor
    cap = m["cap_rate"] * tokens * lead_w
    n_gu = len(wave_sizes(ne, h, m["even"])) if one else ne
    files = m["file_rate"] * 4.0 * (n_gu * h * h + ne * ei * ei + sum(k * k for k, _ in s["attn_groups"]))
    for n, router, work, cut_by in waves:
        if not cut or not cut_by or workers == 1:
            cap += m["cap_rate"] * tokens * (router + work)
            continue
        p = min(n, MAX_CPARTS)
        cap += makespan(p, m["part_rate"] * tokens * (router + work / p), workers)
    fac = m["fac_rate"] * sum(float(k) ** 3 for k, _ in s["attn_groups"])
    gptq = 0.0

    def step(parts):   # one fan-out of parts' seconds over the workers
        return max(sum(parts) / workers, max(parts)) if parts else 0.0

    for n, k, rows_of in [(w, h, (ei, ei)) for w in wave_sizes(ne, h, m["even"])] + [(w, ei, (h,)) for w in wave_sizes(ne, ei, m["even"])]:
        fac += makespan(1 if one and k == h else n, m["fac_rate"] * float(k) ** 3, workers)
        gptq += step([m["gptq_rate"] * min(ROWS, r) * float(k) ** 2
                      for _ in range(n) for r in rows_of for _ in range(math.ceil(r / ROWS))])
    attn = [m["gptq_rate"] * min(ROWS, n) * float(k) ** 2 for n, k in s["attn"] for _ in range(math.ceil(n / ROWS))]
    gptq += step(attn)
    lin = s["attn"] + [(ei, h), (ei, h), (h, ei)] * ne
    lead = m["lead_rate"] * sum(n * k for n, k in lin)
    n_parts = len(attn) + ne * (2 * math.ceil(ei / ROWS) + math.ceil(h / ROWS))
    return {"capture": cap, "files": files, "factor": fac, "gptq": gptq, "lead": lead, "parts": n_parts,
            "total": cap + files + fac + gptq + lead}


def dsv3_shape():
    """DeepSeek-V3's MoE layer: MLA attention (q_a, kv_a from the hidden state; q_b; kv_b; o),
    256 routed experts of 2048 and one shared, top 8."""
    h = 7168
    attn = [(1536, h), (576, h), (24576, 1536), (32768, 512), (h, 16384)]
    groups = [(h, 0), (1536, 2 * (1536 + 576) * h), (512, 2 * (1536 + 576) * h),
              (16384, 2 * ((1536 + 576) * h + 24576 * 1536 + 32768 * 512))]
    return moe_shape("DeepSeek-V3", h, groups, attn, 2048, 256, 8, shared=1, n_layers=58)


def project(argv):
    dlog, drep = argv[0], argv[1]
    mlog = mrep = None
    check1 = moe1 = None
    rest = argv[2:]
    if "--moe-1" in rest:
        i = rest.index("--moe-1")
        moe1 = json.load(open(rest[i + 1]))
        rest = rest[:i] + rest[i + 2:]
    block = 0
    if "--block" in rest:
        i = rest.index("--block")
        block = int(rest[i + 1])
        rest = rest[:i] + rest[i + 2:]
    if "--check-1" in rest:
        i = rest.index("--check-1")
        check1 = float(rest[i + 1])
        rest = rest[:i] + rest[i + 2:]
    if len(rest) >= 2:
        mlog, mrep = rest[0], rest[1]
    lg = parse_log(dlog, block)
    rep = json.load(open(drep))
    r = dense_rates(lg, rep)
    s = r["shape"]
    shards = rep["job"]["calibration"].get("shards", 1)
    print(f"## Measured: one block of hidden {s['h']}, MLP {s['i']}, {r['tokens']} tokens, shards {shards}\n")
    print("| workers | composed s | measured s |")
    print("|---|---|---|")
    c1 = dense_block(r, s, r["tokens"], r["seq"], shards, 1)["total"]
    for w, meas in ((1, check1), (2, r["measured"])):
        got = dense_block(r, s, r["tokens"], r["seq"], shards, w)["total"]
        print(f"| {w} | {got:.1f} | {meas:.1f} |" if meas else f"| {w} | {got:.1f} | - |")
    # The parts' costs were measured with two workers sharing the machine and through the
    # files: one worker in memory takes `mem` of that.
    mem = check1 / c1 if check1 else 1.0
    print(f"\nOne worker in memory / the parts' costs composed at one worker: {mem:.2f}\n")
    tokens = 128 * 2048
    l70 = dense_shape(8192, 28672, 64, 8, n_layers=80, name="Llama-3-70B")
    print(f"## Llama-3-70B (80 blocks), {tokens} tokens (128 x 2048), GPTQ w4 g128 true-sequential\n")
    print("| workers | shards | capture parts s | quantize parts s | factorisations, merges s | other lead s | last forward s (lead) | one block s | the model h |")
    print("|---|---|---|---|---|---|---|---|---|")
    b1 = dense_block(r, l70, tokens, 2048, 1, 1)["total"] * mem
    print(f"| 1, in memory | 1 | | | | | | {b1:.0f} | {b1 * l70['layers'] / 3600:.1f} |")
    for w, sh in ((8, 8), (16, 16)):
        b = dense_block(r, l70, tokens, 2048, sh, w)
        print(f"| {w} | {sh} | {b['capture']:.0f} | {b['quantize']:.0f} | {b['factor']:.0f} | {b['lead']:.0f} | "
              f"{b['forward']:.0f} | {b['total']:.0f} | {b['total'] * l70['layers'] / 3600:.1f} |")
    print()
    if mlog:
        m = moe_rates(parse_log(mlog), json.load(open(mrep)), r, moe1)
        ms = m["shape"]
        print(f"## Measured: one MoE block of hidden {ms['h']}, {ms['ne']} experts of {ms['ei']}, {m['tokens']} tokens\n")
        print("rates: capture %.3g s a flop (in the lead), %.3g (in parts), factor %.3g s per k^3, GPTQ %.3g s per "
              "row k^2, files %.3g s a byte, lead %.3g s a weight\n" % (m["cap_rate"], m["part_rate"], m["fac_rate"],
                                                                      m["gptq_rate"], m["file_rate"], m["lead_rate"]))
        b = moe_block(m, ms, m["tokens"], m["seq"], 2, m["cut"])
        print(f"composed at 2 workers: {b['total']:.0f} s (measured {m['measured']:.0f} s; the lead alone "
              f"{m['lead_alone']:.0f} s of it; its experts' passes {'cut by experts' if m['cut'] else 'in the lead'})\n")
        if not m["even"] or not m["twins"]:
            be = moe_block(dict(m, even=True, twins=True), ms, m["tokens"], m["seq"], 2, m["cut"])
            print(f"its waves cut evenly, the experts' gate/up Hessian summed once (the builds since 071ba10 and the "
                  f"twins): {be['total']:.0f} s at 2 workers\n")
        mem_moe = 1.0
        if moe1:
            # as for the dense block: one worker in memory takes mem_moe of the parts' costs composed
            b1 = moe_block(m, ms, m["tokens"], m["seq"], 1)
            mem_moe = moe1["blocks"][0]["seconds"] / b1["total"]
            print(f"composed at 1 worker: {b1['total']:.0f} s (measured in memory {moe1['blocks'][0]['seconds']:.0f} s: "
                  f"{mem_moe:.2f} of it)\n")
        ds = dsv3_shape()
        print(f"## DeepSeek-V3 ({ds['layers']} MoE layers of its 61), {tokens} tokens, GPTQ w4 g128\n")
        print("| experts' hooks see | workers | capture s | files s (lead) | factor s | GPTQ s | merge, pack s (lead) | one layer s | 58 layers h |")
        print("|---|---|---|---|---|---|---|---|---|")
        for all_experts in (True, False):
            seen = "every token" if all_experts else "their routed tokens"
            d = moe_block(dict(m, all_experts=all_experts, even=True, twins=True), ds, tokens, 2048, 1)
            t1 = d["total"] * mem_moe
            print(f"| {seen} | 1, in memory | | | | | | {t1:.0f} | {t1 * ds['layers'] / 3600:.1f} |")
            for w in (8, 16):
                d = moe_block(dict(m, all_experts=all_experts, even=True, twins=True), ds, tokens, 2048, w)
                print(f"| {seen} | {w} | {d['capture']:.0f} | {d['files']:.0f} | {d['factor']:.0f} | {d['gptq']:.0f} | "
                      f"{d['lead']:.0f} | {d['total']:.0f} | {d['total'] * ds['layers'] / 3600:.1f} |")


def main():
    try:
        if len(sys.argv) in (3, 5) and sys.argv[1] == "timeline" and (len(sys.argv) == 3 or sys.argv[3] == "--block"):
            timeline(sys.argv[2], int(sys.argv[4]) if len(sys.argv) == 5 else 0)
        elif len(sys.argv) >= 4 and sys.argv[1] == "project":
            project(sys.argv[2:])
        else:
            sys.exit(__doc__)
    except (OSError, ValueError) as e:   # a file not there or not JSON, a timestamp or number unlike quantd's
        sys.exit(f"parts_project: {e}")
    except (KeyError, IndexError, TypeError, StopIteration, ZeroDivisionError) as e:
        sys.exit(f"parts_project: not a log and report of one block's job as bench/parts.sh keeps them "
                 f"({type(e).__name__}: {e})")


if __name__ == "__main__":
    main()
