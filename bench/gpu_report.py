#!/usr/bin/env python3
"""Turns the raw logs of bench/gpu.sh into markdown fragments, headline figures and the
results file. Standard library only (the GPU machine may have nothing else).

    gpu_report.py ptxas   REPORT.txt OUT.md            ptxas -v output -> per-kernel table
    gpu_report.py kernels KERNELS.jsonl OUT.md HEAD.tsv
    gpu_report.py job     TIMED_LOG REPORT.json GPUMEM.log LABEL OUT.md HEAD.tsv
    gpu_report.py agree   CPU_REPORT CUDA_REPORT|- PPL.jsonl OUT.md HEAD.tsv
    gpu_report.py moe     CPU_REPORT CUDA_REPORT|- OUT.md HEAD.tsv
    gpu_report.py parts   WHAT WORKERS1 REPORT1 GPUMEM1 WORKERS2 REPORT2 GPUMEM2 SAME OUT.md HEAD.tsv
    gpu_report.py summary LOGDIR TITLE OUT.md

Every fragment says what it measured; a figure that could not be measured is written as
"not measured" with the reason, never left out silently. HEAD.tsv lines are
key<TAB>value<TAB>goal<TAB>met (met: yes, no or "-"), read by `summary`.
"""
import json
import os
import statistics
import subprocess
import sys

STEPS = ["build", "test", "sanitize", "selftest", "bench", "moe", "job", "parts"]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def head_line(f, key, value, goal="-", met="-"):
    f.write("%s\t%s\t%s\t%s\n" % (key, value, goal, met))


# ---- ptxas ---------------------------------------------------------------------------

def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        res = out.stdout.splitlines()
        if len(res) == len(names):
            return res
    except (OSError, subprocess.CalledProcessError):
        pass
    return names


def cmd_ptxas(report, out_md):
    rows, cur = [], None
    for line in open(report, errors="replace"):
        if "Function properties for" in line:
            cur = {"fn": line.split()[-1], "stack": 0, "sst": 0, "sld": 0}
        elif "bytes stack frame" in line and cur is not None:
            w = line.split()
            cur["stack"], cur["sst"], cur["sld"] = int(w[0]), int(w[4]), int(w[8])
        elif "ptxas info    : Used" in line and cur is not None:
            w = line.replace(",", " ").split()
            cur["regs"] = int(w[w.index("registers") - 1])
            cur["smem"] = int(w[w.index("smem") - 2]) if "smem" in w else 0
            rows.append(cur)
            cur = None
    if not rows:
        write(out_md, "No ptxas report found in %s.\n" % os.path.basename(report))
        return 1
    names = demangle([r["fn"] for r in rows])
    seen, lines = set(), []
    for r, n in sorted(zip(rows, names), key=lambda t: t[1]):
        if n in seen:
            continue
        seen.add(n)
        flag = " **spills**" if r["sst"] or r["sld"] else ""
        short = n if len(n) < 70 else n[:67] + "..."
        lines.append("| `%s` | %d | %d | %d | %d / %d%s |" % (short, r["regs"], r["smem"], r["stack"], r["sst"],
                                                             r["sld"], flag))
    spilling = sum(1 for r in rows if r["sst"] or r["sld"])
    text = ("%d kernels; %d with spill stores or loads.\n\n| kernel | registers | static smem (B) | stack (B) "
            "| spill stores / loads (B) |\n|---|---|---|---|---|\n" % (len(seen), spilling)) + "\n".join(lines) + "\n"
    write(out_md, text)
    return 0


# ---- kernel benchmark ------------------------------------------------------------------

def cmd_kernels(jsonl, out_md, head_tsv):
    recs, copy, dev, gptq = [], None, None, []
    for line in open(jsonl, errors="replace"):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "copy_gbps" in r:
            copy = r["copy_gbps"]
        elif "device" in r and "sm" in r:
            dev = r
        elif "gptq_layer" in r:
            gptq.append(r)
        elif "kernel" in r:
            recs.append(r)
    out = []
    if dev:
        out.append("Device %s (sm %s, %d SMs, L2 %.0f MiB flushed with %.0f MiB before each repetition), median of "
                   "%d repetitions timed with CUDA events.\n" % (dev["device"], dev["sm"], dev["sms"],
                                                                 dev["l2_bytes"] / 2**20, dev["flush_bytes"] / 2**20,
                                                                 dev["reps"]))
    out.append("Measured copy bandwidth (device to device, read + write): %s.\n" %
               ("%.1f GB/s" % copy if copy else "not measured"))
    out.append("| shape K x N | batch | kernel | us | GB/s | of copy | vs cuBLAS FP16 |\n|---|---|---|---|---|---|---|")
    for r in recs:
        out.append("| %s | %d | %s | %.2f | %.1f | %s | %s |" % (
            r["shape"], r["batch"], r["kernel"], r["us"], r["gbps"],
            "%.0f%%" % (100 * r["frac_copy"]) if "frac_copy" in r else "-",
            "%.2fx" % r["speedup_vs_f16"] if "speedup_vs_f16" in r else "-"))
    if gptq:
        out.append("\nGPTQ quantization of one layer on the device (Hessian given):\n")
        out.append("| layer K x N | seconds | column loop seconds |\n|---|---|---|")
        for g in gptq:
            out.append("| %s | %.3f | %.3f |" % (g["gptq_layer"], g["seconds"], g["loop_seconds"]))
    write(out_md, "\n".join(out) + "\n")
    b1 = [r for r in recs if r["batch"] == 1 and r["kernel"] == "gptq"]
    with open(head_tsv, "a") as f:
        if not b1:
            head_line(f, "GEMV batch 1 (gptq w4 g128) vs cuBLAS FP16", "not measured", ">= 3.5x", "no")
            return 1
        sp = [r["speedup_vs_f16"] for r in b1 if "speedup_vs_f16" in r]
        fr = [r["frac_copy"] for r in b1 if "frac_copy" in r]
        if sp:
            head_line(f, "GEMV batch 1 (gptq w4 g128) vs cuBLAS FP16, min / median of %d shapes" % len(sp),
                      "%.2fx / %.2fx" % (min(sp), statistics.median(sp)), ">= 3.5x", "yes" if min(sp) >= 3.5 else "no")
        if fr:
            head_line(f, "GEMV batch 1 fraction of copy bandwidth, min / median",
                      "%.0f%% / %.0f%%" % (100 * min(fr), 100 * statistics.median(fr)), ">= 70%",
                      "yes" if min(fr) >= 0.70 else "no")
        if copy:
            head_line(f, "device copy bandwidth", "%.1f GB/s" % copy)
        re = {r["shape"]: r["us"] for r in recs if r["batch"] == 1 and r["kernel"] == "gptq-reordered"}
        ratios = [re[r["shape"]] / r["us"] for r in b1 if r["shape"] in re]
        if ratios:
            head_line(f, "reordered act-order / plain layout time at batch 1, max", "%.3f" % max(ratios), "<= 1.05",
                      "yes" if max(ratios) <= 1.05 else "no")
    return 0


# ---- a job ---------------------------------------------------------------------------

def parse_progress(timed_log):
    """[(t, stage, block)] from lines '<epoch> progress stage=S block=b/n ...'."""
    ev = []
    for line in open(timed_log, errors="replace"):
        w = line.split()
        if len(w) < 3 or w[1] != "progress":
            continue
        kv = dict(x.split("=", 1) for x in w[2:] if "=" in x)
        try:
            ev.append((float(w[0]), kv.get("stage", "?"), int(kv.get("block", "0/0").split("/")[0])))
        except ValueError:
            continue
    return ev


def cmd_job(timed_log, report, gpumem, label, out_md, head_tsv):
    ev = parse_progress(timed_log)
    stages, blocks = {}, {}
    for (t0, st, b), (t1, _, _) in zip(ev, ev[1:]):
        stages[st] = stages.get(st, 0.0) + (t1 - t0)
        blocks[b] = blocks.get(b, 0.0) + (t1 - t0)
    wall = ev[-1][0] - ev[0][0] if len(ev) > 1 else None
    rep = None
    try:
        rep = json.load(open(report))
    except (OSError, ValueError):
        pass
    peak = None
    try:
        vals = [int(x.split()[0]) for x in open(gpumem) if x.strip() and x.split()[0].isdigit()]
        peak = max(vals) if vals else None
    except OSError:
        pass
    out = ["**%s**\n" % label]
    if rep:
        tot = rep.get("totals", {})
        nb = tot.get("blocks") or 1
        out.append("Report: compute %s, %d blocks, %d layers quantized, block seconds %.1f (%.2f s per block), mean / max layer "
                   "relative error %.5f / %.5f, wall of the last run %.1f s.\n" % (
                       rep.get("compute", "not recorded"), nb, tot.get("layers_quantized", 0), tot.get("block_seconds", 0),
                       tot.get("block_seconds", 0) / nb, tot.get("mean_rel_error", 0), tot.get("max_rel_error", 0),
                       tot.get("wall_seconds_last_run", 0)))
    else:
        out.append("No report (the job failed; see the log).\n")
    out.append("Peak GPU memory (nvidia-smi memory.used, the whole device, sampled every 0.5 s): %s.\n" %
               ("%d MiB" % peak if peak is not None else "not measured"))
    if stages:
        out.append("Seconds per stage (from the job's timestamped progress lines):\n")
        out.append("| stage | seconds |\n|---|---|")
        for st, s in sorted(stages.items(), key=lambda t: -t[1]):
            out.append("| %s | %.2f |" % (st, s))
        out.append("\n| block | seconds |\n|---|---|")
        for b in sorted(blocks):
            out.append("| %d | %.2f |" % (b, blocks[b]))
    write(out_md, "\n".join(out) + "\n")
    with open(head_tsv, "a") as f:
        if rep:
            tot = rep.get("totals", {})
            per = tot.get("block_seconds", 0) / (tot.get("blocks") or 1)
            seven_b = "cuda" in label and label.startswith("7B-shaped")
            goal, met = ("<= 4 s (7B in 2 minutes)", "yes" if per <= 4.0 else "no") if seven_b else ("-", "-")
            head_line(f, "%s: seconds per block" % label, "%.2f" % per, goal, met)
        else:
            head_line(f, "%s: seconds per block" % label, "not measured (job failed)", "-", "no")
        if peak is not None:
            head_line(f, "%s: peak GPU memory" % label, "%d MiB" % peak)
    return 0 if rep else 1


def layer_table(cpu, cuda, out):
    """Appends the per-layer CPU vs CUDA table to out; returns (CPU layers by name, differences)."""
    out.append("| layer | CPU rel. error | CUDA rel. error | relative difference |\n|---|---|---|---|")
    diffs = []
    cl = {l["name"]: l for l in cpu.get("layers", [])}
    ul = {l["name"]: l for l in cuda.get("layers", [])} if cuda else {}
    for name, l in cl.items():
        a = l.get("rel_error")
        b = ul.get(name, {}).get("rel_error") if cuda else None
        d = abs(a - b) / a if (a and b is not None) else None
        if d is not None:
            diffs.append(d)
        out.append("| %s | %s | %s | %s |" % (name, "%.6f" % a if a is not None else "-",
                                              "%.6f" % b if b is not None else "not run",
                                              "%.2e" % d if d is not None else "-"))
    return cl, diffs


def cmd_moe(cpu_report, cuda_report, out_md, head_tsv):
    """The MoE-shaped job on both backends: every layer, the experts' included, compared."""
    cpu = json.load(open(cpu_report)) if os.path.exists(cpu_report) else None
    cuda = json.load(open(cuda_report)) if cuda_report != "-" and os.path.exists(cuda_report) else None
    out = []
    if cpu is None:
        out.append("The CPU MoE job left no report (it failed or ran out of time: see job-cpu-moe.log), so no layer "
                   "is compared.\n")
    cl, diffs = layer_table(cpu or {}, cuda, out)
    ex = []
    if cuda:
        ul = {l["name"]: l for l in cuda.get("layers", [])}
        for name, l in cl.items():
            a, b = l.get("rel_error"), ul.get(name, {}).get("rel_error")
            if ".experts." in name and a and b is not None:
                ex.append(abs(a - b) / a)
    write(out_md, "\n".join(out) + "\n")
    with open(head_tsv, "a") as f:
        if diffs:
            m = max(diffs)
            head_line(f, "MoE, CPU vs CUDA: largest per-layer relative error difference", "%.2e" % m, "<= 1e-2",
                      "yes" if m <= 1e-2 else "no")
            if ex:
                head_line(f, "MoE, CPU vs CUDA: largest over the %d expert layers" % len(ex), "%.2e" % max(ex), "<= 1e-2",
                          "yes" if max(ex) <= 1e-2 else "no")
        else:
            why = "no CPU run" if not cl else "no CUDA run"
            head_line(f, "MoE, CPU vs CUDA: per-layer relative error difference", "not measured (%s)" % why, "<= 1e-2",
                      "-")
    return 0 if cpu is not None else 1


def cmd_agree(cpu_report, cuda_report, ppl_jsonl, out_md, head_tsv):
    out, ok = [], True
    # A job that failed or ran out of time leaves no report: that side is "not run", never a crash.
    cpu = json.load(open(cpu_report)) if os.path.exists(cpu_report) else None
    cuda = json.load(open(cuda_report)) if cuda_report != "-" and os.path.exists(cuda_report) else None
    if cpu is None:
        ok = False
        out.append("The CPU job left no report (it failed or ran out of time: see job-cpu-agree.log), so no layer "
                   "is compared.\n")
        cpu = {}
    cl, diffs = layer_table(cpu, cuda, out)
    ppl = []
    if os.path.exists(ppl_jsonl):
        for line in open(ppl_jsonl):
            line = line.strip()
            if line.startswith("{"):
                try:
                    ppl.append(json.loads(line))
                except ValueError:
                    pass
    if ppl:
        out.append("\nPerplexity of the tiny generated model (random weights: the value itself means nothing, the "
                   "agreement does):\n")
        out.append("| model | evaluated on | ppl |\n|---|---|---|")
        for p in ppl:
            out.append("| %s | %s | %.6f |" % (p.get("label", "?"), p.get("backend", "?"), p.get("ppl", float("nan"))))
    write(out_md, "\n".join(out) + "\n")
    with open(head_tsv, "a") as f:
        if diffs:
            m = max(diffs)
            head_line(f, "CPU vs CUDA: largest per-layer relative error difference", "%.2e" % m, "<= 1e-2",
                      "yes" if m <= 1e-2 else "no")
        else:
            why = "no CPU run" if not cl else "no CUDA run"
            head_line(f, "CPU vs CUDA: per-layer relative error difference", "not measured (%s)" % why, "<= 1e-2",
                      "-")
        byl = {}
        for p in ppl:
            byl.setdefault(p.get("label"), {})[p.get("backend")] = p.get("ppl")
        for lab, d in byl.items():
            if "cpu" in d and any(k.startswith("cuda") for k in d):
                c = [v for k, v in d.items() if k.startswith("cuda")][0]
                rel = abs(c - d["cpu"]) / d["cpu"]
                head_line(f, "tiny model ppl, %s: CPU %.4f vs CUDA %.4f" % (lab, d["cpu"], c), "%.2e relative" % rel,
                          "<= 1e-3", "yes" if rel <= 1e-3 else "no")
        if len(byl.get("gptq-cpu", {})) and len(byl.get("gptq-cuda", {})):
            a, b = byl["gptq-cpu"].get("cpu"), byl["gptq-cuda"].get("cpu")
            if a and b:
                rel = abs(a - b) / a
                head_line(f, "tiny model quantized on CPU vs on CUDA (both evaluated on the CPU): ppl %.4f vs %.4f" %
                          (a, b), "%.2e relative" % rel, "<= 1e-2", "yes" if rel <= 1e-2 else "no")
    return 0 if ok else 1


# ---- one block over one and two workers ------------------------------------------------

QUANTIZE_STEP = ("quantize", "pack", "error", "kernel_check")


def peak_mib(gpumem):
    try:
        vals = [int(x.split()[0]) for x in open(gpumem) if x.strip() and x.split()[0].isdigit()]
    except OSError:
        return None
    return max(vals) if vals else None


def cmd_parts(what, w1, report1, gpumem1, w2, report2, gpumem2, same, out_md, head_tsv):
    """The same one-block job through quantd with WORKERS1 and WORKERS2: the block's seconds
    per stage from each report, the parts each worker ran, peak GPU memory, the bytes."""
    runs = []
    for w, rp, gm in ((w1, report1, gpumem1), (w2, report2, gpumem2)):
        try:
            rep = json.load(open(rp))
        except (OSError, ValueError):
            rep = None
        runs.append((w, rep, peak_mib(gm)))
    out = ["**%s**\n" % what]
    for w, rep, _ in runs:
        if rep is None:
            out.append("`--workers %s`: no report (the job failed or ran out of time; see its daemon log).\n" % w)
    ok = [r for r in runs if r[1] and r[1].get("blocks")]
    if ok:
        stages = []
        for _, rep, _ in ok:
            for st in rep["blocks"][0].get("stages", {}):
                if st not in stages:
                    stages.append(st)
        cols = [("`%s`" % w) if rep and rep.get("blocks") else "`%s` (not run)" % w for w, rep, _ in runs]
        out.append("Seconds of the block, per stage (the report's `blocks[0].stages`); the quantize step is quantize + "
                   "pack + error + kernel_check, the stages the parts spread over the workers:\n")
        out.append("| stage | %s | %s |\n|---|---|---|" % tuple(cols))

        def cell(rep, f):
            return "%.2f" % f(rep) if rep and rep.get("blocks") else "-"
        out.append("| **block** | %s | %s |" % tuple(cell(r, lambda x: x["blocks"][0]["seconds"]) for _, r, _ in runs))
        out.append("| **quantize step** | %s | %s |" % tuple(
            cell(r, lambda x: sum(x["blocks"][0]["stages"].get(k, 0) for k in QUANTIZE_STEP)) for _, r, _ in runs))
        for st in stages:
            out.append("| %s | %s | %s |" % ((st,) + tuple(cell(r, lambda x, st=st: x["blocks"][0]["stages"].get(st, 0))
                                                          for _, r, _ in runs)))
        out.append("\nThe workers that ran each linear's parts (the report's `layers[].worker`; \"in the lead\": its "
                   "parts were computed in memory, not handed out):\n")
        out.append("| layer | `%s` | `%s` |\n|---|---|---|" % (w1, w2))
        names = []
        for _, rep, _ in ok:
            for l in rep.get("layers", []):
                if l["name"] not in names:
                    names.append(l["name"])
        by = [{l["name"]: l for l in (rep or {}).get("layers", [])} for _, rep, _ in runs]

        def who(l):
            if l is None:
                return "-"
            n = l.get("parts", 1)
            return "%s%s" % (l.get("worker", "in the lead"), " (%d parts)" % n if n > 1 else "")
        for n in names:
            out.append("| %s | %s | %s |" % (n, who(by[0].get(n)), who(by[1].get(n))))
    if any(p is not None for _, _, p in runs):
        out.append("\nPeak GPU memory (nvidia-smi memory.used, the whole device, sampled every 0.5 s): %s.\n" % ", ".join(
            "`%s` %s" % (w, "%d MiB" % p if p is not None else "not measured") for w, _, p in runs))
    else:
        out.append("\nPeak GPU memory: not measured (no nvidia-smi samples).\n")
    out.append("Outputs (`model.safetensors`) byte-identical: %s.\n" % {
        "yes": "yes, identical bytes", "no": "**no, they differ**"}.get(same, "not compared (a run left no output)"))
    write(out_md, "\n".join(out) + "\n")
    with open(head_tsv, "a") as f:
        if len(ok) == 2:
            q = [sum(r["blocks"][0]["stages"].get(k, 0) for k in QUANTIZE_STEP) for _, r, _ in runs]
            b = [r["blocks"][0]["seconds"] for _, r, _ in runs]
            head_line(f, "%s: quantize step seconds, %s / %s" % (what, w1, w2), "%.2f / %.2f (%.2fx)" % (
                q[0], q[1], q[0] / q[1] if q[1] > 0 else 0))
            head_line(f, "%s: block seconds, %s / %s" % (what, w1, w2), "%.2f / %.2f" % (b[0], b[1]))
        else:
            head_line(f, "%s: quantize step seconds, %s / %s" % (what, w1, w2), "not measured (a job failed)", "-", "no")
        head_line(f, "%s: outputs byte-identical" % what, {"yes": "identical bytes", "no": "different bytes"}.get(
            same, "not compared"), "identical", "yes" if same == "yes" else "no")
        if any(p is not None for _, _, p in runs):
            head_line(f, "%s: peak GPU memory, %s / %s" % (what, w1, w2), " / ".join(
                "%d MiB" % p if p is not None else "-" for _, _, p in runs))
    return 0 if len(ok) == 2 and same == "yes" else 1


# ---- the results file ----------------------------------------------------------------

def cmd_summary(logdir, title, out_md):
    status = {}
    path = os.path.join(logdir, "steps.tsv")
    if os.path.exists(path):
        for line in open(path):
            w = line.rstrip("\n").split("\t")
            if len(w) >= 4:
                status[w[0]] = w       # the last run of a step wins
    heads = []
    for step in STEPS:
        p = os.path.join(logdir, "headline-%s.tsv" % step)
        if os.path.exists(p):
            heads += [l.rstrip("\n").split("\t") for l in open(p) if l.strip()]
    out = ["# %s\n" % title]
    meta = os.path.join(logdir, "machine.txt")
    runs = os.path.join(logdir, "runs.txt")
    if os.path.exists(meta):
        text = open(meta).read().strip()
        if os.path.exists(runs):
            text += "\nruns:\n" + "\n".join("  " + l.rstrip() for l in open(runs) if l.strip())
        out.append("```\n" + text + "\n```\n")
    out.append("## Summary\n\n| step | result | seconds | when (UTC) | note |\n|---|---|---|---|---|")
    for step in STEPS:
        w = status.get(step)
        if w:
            out.append("| %s | %s | %s | %s | %s |" % (step, w[1], w[2], w[4] if len(w) > 4 else "", w[3]))
        else:
            out.append("| %s | not run | - | - | |" % step)
    out.append("\n| figure | value | goal | met |\n|---|---|---|---|")
    if heads:
        for h in heads:
            h += ["-"] * (4 - len(h))
            out.append("| %s | %s | %s | %s |" % tuple(h[:4]))
    else:
        out.append("| (no figures yet: the GPU steps have not run) | | | |")
    out.append("\nRaw logs: `%s/`.\n" % os.path.basename(logdir.rstrip("/")))
    for step in STEPS:
        frags = sorted(f for f in os.listdir(logdir) if f.startswith(step + "-") and f.endswith(".md"))
        if not frags and step not in status:
            continue
        out.append("## %s\n" % step)
        w = status.get(step)
        if w and w[1] != "pass":
            out.append("Result: **%s** (%s).\n" % (w[1], w[3]))
        for fr in frags:
            out.append(open(os.path.join(logdir, fr)).read().rstrip() + "\n")
    write(out_md, "\n".join(out) + "\n")
    return 0


def main(argv):
    cmds = {"ptxas": (cmd_ptxas, 2), "kernels": (cmd_kernels, 3), "job": (cmd_job, 6), "agree": (cmd_agree, 5),
            "moe": (cmd_moe, 4), "parts": (cmd_parts, 10), "summary": (cmd_summary, 3)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        sys.stderr.write(__doc__)
        return 2
    return cmds[argv[1]][0](*argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
