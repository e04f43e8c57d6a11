/* One decoder block of the pipeline: capture the inputs of its linears, (AWQ) search and
 * fold the scales, quantize every linear, run the block with the quantized weights to get
 * the next block's inputs, and commit the checkpoint.
 *
 * Order of work, per method:
 *   gptq, true_sequential: for each input group in forward order (q/k/v, o, gate/up, down)
 *     re-run the block up to that group's input with the groups before it already
 *     quantized, accumulate one Hessian shared by the group's linears (so q/k/v share one
 *     act-order g_idx), quantize them;
 *   gptq without true_sequential, rtn: one forward captures every group's Hessian on the
 *     float block, then every linear is quantized;
 *   awq, awq+gptq: first every group's scales are searched on the float block and folded
 *     into the operator before the group (as AutoAWQ: all scales, then clipping, then
 *     quantization), then each group is captured again (after the groups before it were
 *     quantized), clipped (not q/k) and quantized with RTN (awq) or GPTQ (awq+gptq).
 * The Hessian of a group's inputs also gives each layer's relative output error.
 * job.gptaq (gptq only): before any capture the float block runs on the float stream
 * (p->acts_fp, pipeline_gptaq.c), keeping every group's float-model input; each capture
 * pass then pairs its rows with those into the group's dXXT, and GPTAQ replaces GPTQ. */
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"
#include "quant/core/clock.h"
#include "quant/core/log.h"
#include "quant/kernels/kernels.h"
#include "quant/pipeline/acts.h"
#include "quant/pipeline/part.h"
#include "quant/pipeline/wave.h"
#include "quant/core/confine.h"

/* Closes the block's cost record: the checkpoint stage up to now (state.json's own write is
 * the last few milliseconds and is in neither), the whole block from t0, and the experts'
 * routed-token spread. Both figures come from one clock read, so the stages never sum past
 * the block. Returns the block's seconds. */
static double cost_finish(qd_pipeline *p, double t, double t0)
{
    double secs = qd_pipeline_cost_add(p, QD_STAGE_CHECKPOINT, t) - t0;
    p->cost.seconds = secs;
    int ne = (int)qd_model_cfg(p->m)->n_experts;
    if (ne > QD_MAX_EXPERTS) ne = QD_MAX_EXPERTS;
    if (ne > 0 && p->moe_routed_done) {
        int64_t v[QD_MAX_EXPERTS];
        memcpy(v, p->moe_routed, (size_t)ne * sizeof *v);
        qd_block_cost_set_coverage(&p->cost, v, ne);
    }
    return secs;
}

/* ---- quantizing a run of groups ---- */

/* One linear of a run being quantized (part.h): what the lead prepared, and where its
 * parts (its row ranges) are in the run's part list. */
typedef struct lin_job {
    int li, g;                   /* the linear and its input group */
    float *clipped;              /* AWQ: the clipped weight; owned, or NULL */
    int first, n_parts;          /* its parts: run_ctx.parts[first .. first + n_parts) */
    qd_qlinear_aux aux;          /* what its finish reads (borrowed) */
} lin_job;

/* What the linears of one run share while they are quantized. */
typedef struct run_ctx {
    qd_pipeline *p;
    qd_block_weights *bw;
    int block;
    const qd_linear_plan *plans;
    qd_linear_out *outs;
    qd_layer_result *results;
    lin_job *lins;               /* the run's quantized linears, in order */
    int n_lins;
    qd_qpart_in *parts;          /* their parts, in order */
    uint64_t *in_sums;           /* each part's input file checksum (fan-out) */
    int n_parts, cap_parts;
    int fan;                     /* the parts go through files and the fan-out hook */
    float global_scale;          /* NVFP4: the input group being prepared's (group_global_scale) */
    qd_gptaq_dxx *dxx;           /* job.gptaq: each group's dXXT ([QD_MAX_GROUPS]), or NULL */
} run_ctx;

/* A linear's result taken over: the block computes with Q from here on, its packed tensors
 * are kept for the block file, and the result is recorded. */
static int lin_apply(run_ctx *r, const lin_job *lj, qd_qlinear *d, qd_err *err)
{
    qd_pipeline *p = r->p;
    qd_linear_out *lo = &r->outs[lj->li];
    const qd_linear_info *L = qd_model_linear(p->m, lj->li);
    lo->packed = d->packed;
    memset(&d->packed, 0, sizeof d->packed);
    lo->quantized = 1;
    int rc = qd_block_linear_set(p->m, r->bw, lj->li, d->dq.w, NULL, err);
    free(lo->w_eff);
    lo->w_eff = NULL;
    if (rc) return rc;
    r->results[lj->li] = d->res;
    qd_pipeline_report_progress(p, "quantize", r->block, L->name, (double)(lj->li + 1) / qd_model_n_linears(p->m),
                                d->res.rel_error);
    const char *wk = d->res.worker;
    QD_LOG(QD_LOG_INFO, "layer_done", "layer=%s method=%s rel_error=%.5f seconds=%.3f%s%s%s%s", d->res.name,
           d->res.method, d->res.rel_error, d->res.seconds, wk[0] ? " workers=" : "", wk, d->res.note[0] ? " note=" : "",
           d->res.note);
    return 0;
}

/* A linear's row ranges (qd_qpart_row_ranges), or one range when a single scale spans
 * every row (FP8 per tensor): rows quantized apart could not share it. */
static int part_ranges(const qd_pipeline *p, int64_t n, int64_t *starts)
{
    if (p->qcfg.row_block < 0) {
        starts[0] = 0;
        starts[1] = n;
        return 1;
    }
    return qd_qpart_row_ranges(n, starts, QD_PART_MAX_RANGES);
}

/* NVFP4's global scale of input group G: the largest magnitude over the weights of its
 * quantized linears (fused q/k/v, gate/up: vLLM serves them with one global scale), 0
 * for the other scale rules. */
static int group_global_scale(run_ctx *r, const qd_input_group *G, float *out, qd_err *err)
{
    qd_pipeline *p = r->p;
    *out = 0.0f;
    if (p->qcfg.scale_rule != QD_SCALE_FP8_GLOBAL) return 0;
    float amax = 0.0f;
    for (int x = 0; x < G->n_linears; x++) {
        int li = G->linears[x];
        if (!r->plans[li].quantize) continue;
        const qd_linear_info *L = qd_model_linear(p->m, li);
        float *w = malloc((size_t)(L->n * L->k) * sizeof *w);
        if (!w) return qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name);
        int rc = qd_block_linear_get(p->m, r->bw, li, w, NULL, err);
        float a = rc ? 0.0f : qd_quant_amax(w, L->n * L->k);
        free(w);
        if (rc) return rc;
        if (a > amax) amax = a;
    }
    *out = qd_quant_global_scale(amax);
    return 0;
}

/* Prepares linear li of group g (borrowing the group's Hessian acc and the AWQ input xcap):
 * its weight, plan, result record, AWQ clipping, and its parts. A linear left in float is
 * done here; a quantized one is added to r->lins with its parts (*added = 1). */
static int lin_prepare(run_ctx *r, int g, int li, qd_gptq_hessian *acc, const float *xcap,
                       const qd_row_slices *kcheck, const qd_row_slices *direct, int *added, qd_err *err)
{
    qd_pipeline *p = r->p;
    const qp_job *job = p->job;
    const qd_linear_info *L = qd_model_linear(p->m, li);
    qd_linear_out *o = &r->outs[li];
    int use_gptq = job->method == QP_METHOD_GPTQ || job->method == QP_METHOD_AWQ_GPTQ;
    int use_awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    *added = 0;
    size_t nk = (size_t)(L->n * L->k);
    o->w_eff = malloc(nk * sizeof(float));
    if (L->has_bias) o->bias = malloc((size_t)L->n * sizeof(float));
    if (!o->w_eff || (L->has_bias && !o->bias)) return qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name);
    int rc = qd_block_linear_get(p->m, r->bw, li, o->w_eff, o->bias, err);
    if (rc) return rc;
    qd_layer_result res;
    memset(&res, 0, sizeof res);
    res.routed_tokens = -1;
    res.rel_error_direct = -1;
    char prefix[160];
    qd_model_block_prefix(p->m, r->block, prefix, sizeof prefix);
    snprintf(res.name, sizeof res.name, "%s%s", prefix, L->name);
    res.block = r->block;
    res.n = L->n;
    res.k = L->k;
    if (!r->plans[li].quantize) {
        snprintf(res.method, sizeof res.method, "float");
        snprintf(res.note, sizeof res.note, "%s", r->plans[li].why);
        QD_LOG(QD_LOG_WARN, "layer_left_in_float", "layer=%s reason=\"%s\"", res.name, r->plans[li].why);
        o->w_float = o->w_eff;   /* stored as float; the block keeps computing with it */
        o->weight_modified = use_awq;
        o->bias_modified = use_awq;
        r->results[li] = res;
        return 0;
    }
    snprintf(res.method, sizeof res.method, "%s", r->dxx ? "gptaq" : qp_method_name(job->method));
    /* An expert's coverage: the calibration tokens its router sent it. Calibrated on its
     * routed tokens alone and too few of them, it falls back to RTN (never a Hessian of a
     * handful of rows, or none). */
    int gptq_here = use_gptq;
    res.routed_tokens = L->expert >= 0 ? p->moe_routed[L->expert] : -1;
    if (L->expert >= 0 && !job->moe.calibrate_all_experts &&
        (res.routed_tokens < job->moe.min_tokens || res.routed_tokens == 0)) {
        gptq_here = 0;
        res.fallback = use_gptq;
        snprintf(res.note, sizeof res.note, "expert %d got %lld routed tokens < moe.min_tokens %lld: RTN",
                 L->expert, (long long)res.routed_tokens, (long long)job->moe.min_tokens);
        QD_LOG(QD_LOG_WARN, "moe_expert_starved", "layer=%s routed_tokens=%lld min_tokens=%lld fallback=rtn",
               res.name, (long long)res.routed_tokens, (long long)job->moe.min_tokens);
    }
    /* Fanned out, the linears are reported as they are taken over (lin_apply), in order. */
    if (!r->fan) qd_pipeline_report_progress(p, "quantize", r->block, L->name, (double)li / qd_model_n_linears(p->m), -1);
    lin_job *lj = &r->lins[r->n_lins];
    memset(lj, 0, sizeof *lj);
    lj->li = li;
    lj->g = g;
    /* AWQ clipping (AutoAWQ skips q and k, whose outputs meet in the softmax). */
    const float *wq = o->w_eff;
    if (use_awq && xcap && acc->n_seen > 0 && !strstr(L->name, "q_proj") && !strstr(L->name, "k_proj")) {
        double t = qd_clock_now_s();
        qd_awq_opts ao = qd_awq_opts_default();
        qd_awq_clip clip;
        memset(&clip, 0, sizeof clip);
        /* xcap holds the acc->n_seen rows the Hessian saw (an expert: its routed tokens
         * only), and the Hessian gives the clip guard its errors over all of them. */
        rc = qd_awq_search_clip_h(p->be, &p->qcfg, &ao, r->bw->w[li], L->n, L->k, xcap, acc->n_seen, L->k, acc, NULL,
                                  &clip, err);
        if (!rc) {
            lj->clipped = malloc(nk * sizeof(float));
            if (!lj->clipped) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
            else {
                memcpy(lj->clipped, o->w_eff, nk * sizeof(float));
                rc = qd_awq_apply(NULL, &clip, lj->clipped, L->n, L->k, err);
                wq = lj->clipped;
            }
        }
        qd_awq_clip_free(&clip);
        qd_pipeline_cost_add(p, QD_STAGE_AWQ_SEARCH, t);
        if (rc) { free(lj->clipped); return rc; }
    }
    lj->aux.bias = o->bias;
    lj->aux.w_ref = o->w_eff;
    lj->aux.kx = kcheck->x[g];
    lj->aux.krows = kcheck->rows[g];
    lj->aux.act_amax = acc->x_amax;
    lj->aux.dx = direct->x[g];
    lj->aux.drows = direct->x[g] ? direct->rows[g] : 0;
    /* Its parts: row ranges. */
    int64_t starts[QD_PART_MAX_RANGES + 1];
    int P = part_ranges(p, L->n, starts);
    if (r->n_parts + P > r->cap_parts) {
        int cap = (r->n_parts + P) * 2;
        qd_qpart_in *np = realloc(r->parts, (size_t)cap * sizeof *np);
        if (np) r->parts = np;
        uint64_t *ns = np ? realloc(r->in_sums, (size_t)cap * sizeof *ns) : NULL;
        if (ns) r->in_sums = ns;
        if (!np || !ns) { free(lj->clipped); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
        r->cap_parts = cap;
    }
    lj->first = r->n_parts;
    lj->n_parts = P;
    for (int i = 0; i < P; i++) {
        qd_qpart_in *in = &r->parts[r->n_parts++];
        memset(in, 0, sizeof *in);
        in->linear = li;
        in->gptq = gptq_here;
        in->use_losses = wq == o->w_eff;
        in->r0 = starts[i];
        in->r1 = starts[i + 1];
        in->w = wq + in->r0 * L->k;
        in->w_ref = o->w_eff + in->r0 * L->k;
        in->h = acc;
        in->res = res;
        in->global_scale = r->global_scale;
        if (p->bpw.n_cand) {
            qd_quant_cfg c = qd_pipeline_linear_qcfg(p, r->block, li);
            in->bits = c.bits;
            in->group_size = c.group_size;
        }
        in->dxx = r->dxx && gptq_here ? &r->dxx[g] : NULL;
    }
    r->n_lins++;
    *added = 1;
    return 0;
}

/* Adds a part's seconds per stage to the block's cost, scaled by f (the fan-out's wall time
 * over the parts' sum, so the stages never sum past the block). */
static void cost_add_part(qd_pipeline *p, const qd_qpart_out *o, double f)
{
    for (int s = 0; s < QD_STAGE_COUNT; s++) p->cost.stage[s] += o->stage[s] * f;
}

/* The distinct names of workers[0..n) joined by commas into buf (cap bytes); "+" ends a
 * list that does not fit. */
static void workers_join(char (*workers)[64], int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(workers[i], workers[j]);
        if (seen || !workers[i][0]) continue;
        size_t w = strlen(workers[i]);
        if (len + w + 2 + 1 >= cap) {
            if (len + 2 < cap) { buf[len++] = '+'; buf[len] = 0; }
            return;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? "," : "", workers[i]);
    }
}

/* Finishes linear lj from its parts' outputs and takes it over; workers (or NULL: in
 * memory) names the worker of each part. */
static int lin_finish(run_ctx *r, lin_job *lj, qd_qpart_out *outs, char (*workers)[64], qd_err *err)
{
    double slowest = 0;
    for (int i = 0; i < lj->n_parts; i++)
        if (outs[i].res.seconds > slowest) slowest = outs[i].res.seconds;
    qd_qlinear d;
    int rc = qd_qpart_finish(r->p, r->parts + lj->first, outs, lj->n_parts, &lj->aux, &d, err);
    if (!rc) {
        d.res.n_parts = lj->n_parts;
        d.res.part_seconds_max = lj->n_parts > 1 ? slowest : 0;
        if (workers) workers_join(workers, lj->n_parts, d.res.worker, sizeof d.res.worker);
        rc = lin_apply(r, lj, &d, err);
    }
    qd_qlinear_free(&d);
    free(lj->clipped);
    lj->clipped = NULL;
    return rc;
}

/* The parts directory, opened (made) at the first fan-out. */
static int parts_dir(qd_pipeline *p, qd_err *err)
{
    if (p->parts_fd >= 0) return 0;
    char shown[QD_PATH_MAX + 32];
    snprintf(shown, sizeof shown, "%s/.quantd/parts", p->out_shown);
    return qd_confine_subdir_open(p->ckpt_fd, "parts", 1, &p->parts_fd, NULL, shown, err);
}

/* The factor step of a fan-out (part_factor.c): the Hessians of groups[0..nf) (written
 * already, ks their widths) factored by parts of their own, fdone[j] the output group j's
 * row parts read; and, with nt > 0, trace parts nf.. for the run's parts tix[0..nt) (their
 * rows' error denominators, of group t_group's Hessian, into their den). An output missing,
 * damaged, or made by a backend unlike the lead's is computed here. sums[j] gets part j's
 * input checksum; *t_fac and *t_trace the seconds the parts ran for, split by what they ran. */
static int run_factors(run_ctx *r, const int *groups, const int64_t *ks, int nf, int t_group, const int *tix, int nt,
                       qd_fpart_done *fdone, uint64_t *sums, double *t_fac, double *t_trace, qd_err *err)
{
    qd_pipeline *p = r->p;
    const char **names = calloc((size_t)(nf + nt), sizeof *names);
    char (*labels)[96] = nt ? calloc((size_t)nt, 96) : NULL;
    int rc = !names || (nt && !labels) ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    for (int j = 0; j < nf && !rc; j++) {
        rc = qd_fpart_write_in(p->parts_fd, r->block, j, groups[j], ks[j], &sums[j], err);
        names[j] = qd_model_group(p->m, groups[j])->name;
    }
    for (int t = 0; t < nt && !rc; t++) {
        const qd_qpart_in *in = &r->parts[tix[t]];
        rc = qd_tpart_write_in(p->parts_fd, r->block, nf + t, t_group, in, &sums[nf + t], err);
        snprintf(labels[t], 96, "%.60s trace %lld..%lld", in->res.name, (long long)in->r0, (long long)in->r1 - 1);
        names[nf + t] = labels[t];
    }
    double t0 = qd_clock_now_s();
    if (!rc && p->hooks.fanout(p->hooks.ud, r->block, "factor", nf + nt, names))
        rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    double th = qd_clock_now_s() - t0, s_fac = 0, s_trace = 0;
    for (int j = 0; j < nf + nt && !rc; j++) {
        qd_err e2 = {0};
        double secs = 0;
        qd_qpart_in *in = j >= nf ? &r->parts[tix[j - nf]] : NULL;
        int got = in ? qd_tpart_read_out(p->parts_fd, r->block, j, sums[j], p->be, &in->den, NULL, &secs, &e2)
                     : qd_fpart_read_out(p->parts_fd, r->block, j, sums[j], p->be, ks[j], &fdone[j], &e2);
        if (got) {
            /* Never used: computed again, here. */
            QD_LOG(QD_LOG_WARN, "part_recomputed", "job=%s block=%d step=factor part=%d what=\"%s\" why=\"%s\"",
                   p->job->id, r->block, j, names[j], e2.msg);
            double tf = qd_clock_now_s();
            rc = qd_fpart_run_file(p, p->parts_fd, r->block, j, p->hooks.worker, err);
            th += qd_clock_now_s() - tf;
            if (!rc) rc = in ? qd_tpart_read_out(p->parts_fd, r->block, j, sums[j], p->be, &in->den, NULL, &secs, err)
                             : qd_fpart_read_out(p->parts_fd, r->block, j, sums[j], p->be, ks[j], &fdone[j], err);
        }
        if (rc) break;
        if (in) {
            in->den_known = 1;
            s_trace += secs;
        } else {
            s_fac += fdone[j].seconds;
        }
    }
    /* The step's wall time, the factorisations' share the quantize stage's, the traces' the error's. */
    double f = s_fac + s_trace > 0 ? s_trace / (s_fac + s_trace) : 0;
    *t_trace = th * f;
    *t_fac = th - *t_trace;
    free(names);
    free(labels);
    return rc;
}

/* The trace parts of the run's fan-out whose one GPTQ Hessian is h (qd_tpart_pays): the
 * run's parts that read h, into tix (room for r->n_parts); their number, or 0 when they do
 * not pay or a part's rows are not named in the model (qd_qpart_src_find, done here for
 * those parts: *src_done tells the caller). */
static int trace_parts_plan(run_ctx *r, const qd_gptq_hessian *h, int *tix, int *src_done)
{
    qd_pipeline *p = r->p;
    int64_t max_rows = 0;
    int nt = 0;
    for (int i = 0; i < r->n_parts; i++) {
        if (r->parts[i].h != h) continue;
        tix[nt++] = i;
        if (r->parts[i].r1 - r->parts[i].r0 > max_rows) max_rows = r->parts[i].r1 - r->parts[i].r0;
    }
    if (!nt || nt + 1 > QD_PART_MAX_FANOUT || !qd_tpart_pays(p->be, h->k, max_rows, p->trace_parts)) return 0;
    int all = 1;
    for (int t = 0; t < nt; t++) all &= qd_qpart_src_find(p, r->block, &r->parts[tix[t]]);
    *src_done = 1;
    return all ? nt : 0;
}

/* The fan-out of the run's parts (r->fan): every group's Hessian written once (with GPTQ's
 * factorisation of it, made here, or by factor parts when the run has two GPTQ groups or
 * more), every input written, the hook called, every output read back and the linears
 * finished in order; a part whose output is missing or damaged is computed here. */
static int run_fanout(run_ctx *r, qd_err *err)
{
    qd_pipeline *p = r->p;
    double t0 = qd_clock_now_s(), t_factor = 0;
    int rc = parts_dir(p, err);
    /* The run's Hessians, each once, and whether a GPTQ part reads it. */
    const qd_gptq_hessian *hs[QD_MAX_GROUPS];
    int hg[QD_MAX_GROUPS], hgptq[QD_MAX_GROUPS], fidx[QD_MAX_GROUPS];
    int n_h = 0, nf = 0;
    for (int l = 0; l < r->n_lins; l++) {
        const qd_qpart_in *in = &r->parts[r->lins[l].first];
        int j = 0;
        while (j < n_h && hs[j] != in->h) j++;
        if (j == n_h) {
            if (n_h == QD_MAX_GROUPS) return qd_err_set(err, QD_EINVAL, "a fan-out of more than %d groups", QD_MAX_GROUPS);
            hs[n_h] = in->h;
            hg[n_h] = r->lins[l].g;
            hgptq[n_h++] = 0;
        }
        hgptq[j] |= in->gptq;
    }
    for (int j = 0; j < n_h; j++) fidx[j] = hgptq[j] ? nf++ : -1;
    /* One GPTQ Hessian: its factorisation would keep the lead alone; with trace parts it is
     * a part too, beside the parts' error denominators. */
    int t_j = -1, src_done = 0;
    for (int j = 0; j < n_h && nf == 1; j++)
        if (hgptq[j]) t_j = j;
    int *tix = t_j >= 0 ? malloc((size_t)r->n_parts * sizeof *tix) : NULL;
    int nt = tix ? trace_parts_plan(r, hs[t_j], tix, &src_done) : 0;
    int fparts = nf >= 2 || nt > 0;
    /* Each group's Hessian once. GPTQ's factorisation of it once, rather than once per
     * part: the parts of a group (q/k/v, every row range) start from it, as the in-memory
     * run's do; made here one group after another, or, with two groups or more, by parts. */
    for (int j = 0; j < n_h && !rc; j++) {
        qd_gptq_shared sh;
        memset(&sh, 0, sizeof sh);
        int here = hgptq[j] && !fparts;
        double tf = qd_clock_now_s();
        if (here) {
            qd_gptq_opts go = qd_pipeline_gptq_opts(p);
            rc = qd_gptq_shared_make(p->be, &go, hs[j], &sh, err);
            t_factor += qd_clock_now_s() - tf;
        }
        if (!rc) rc = qd_qpart_write_hessian(p->parts_fd, r->block, hg[j], hs[j], here ? &sh : NULL, err);
        qd_gptq_shared_free(&sh);
    }
    qd_fpart_done *fdone = fparts ? calloc((size_t)nf, sizeof *fdone) : NULL;
    uint64_t *fsums = fparts ? calloc((size_t)(nf + nt), sizeof *fsums) : NULL;
    if (!rc && fparts) {
        int fg[QD_MAX_GROUPS];
        int64_t fk[QD_MAX_GROUPS];
        for (int j = 0; j < n_h; j++)
            if (fidx[j] >= 0) { fg[fidx[j]] = hg[j]; fk[fidx[j]] = hs[j]->k; }
        double th = 0, tt = 0, tf = qd_clock_now_s();
        rc = fdone && fsums ? run_factors(r, fg, fk, nf, nt ? hg[t_j] : -1, tix, nt, fdone, fsums, &th, &tt, err)
                            : qd_err_set(err, QD_ENOMEM, "out of memory");
        /* The factorisations' wall time is the quantize step's, the traces' the error's; their
         * files' the checkpoint's. */
        t_factor += th;
        p->cost.stage[QD_STAGE_ERROR] += tt;
        p->cost.stage[QD_STAGE_CHECKPOINT] += qd_clock_now_s() - tf - th - tt;
        t0 += qd_clock_now_s() - tf - th;   /* booked already */
    }
    /* Then the inputs; a linear's weights are freed once its parts hold them (the direct
     * error, a debugging option, keeps its reference). */
    for (int l = 0; l < r->n_lins && !rc; l++) {
        lin_job *lj = &r->lins[l];
        int j = 0;
        while (hs[j] != r->parts[lj->first].h) j++;
        for (int i = lj->first; i < lj->first + lj->n_parts && !rc; i++) {
            if (!src_done || r->parts[i].h != hs[t_j]) qd_qpart_src_find(p, r->block, &r->parts[i]);
            r->parts[i].fac = fparts && fidx[j] >= 0 ? &fdone[fidx[j]] : NULL;
            /* the Hessian file of the group whose Hessian it reads (a twin's: its kind's first) */
            rc = qd_qpart_write_in(p->parts_fd, r->block, i, hg[j], &r->parts[i], &r->in_sums[i], err);
        }
        free(lj->clipped);
        lj->clipped = NULL;
        for (int i = lj->first; i < lj->first + lj->n_parts; i++) r->parts[i].w = r->parts[i].w_ref = NULL;
        if (!lj->aux.drows) {
            free(r->outs[lj->li].w_eff);
            r->outs[lj->li].w_eff = NULL;
            lj->aux.w_ref = NULL;
        }
    }
    double t_write = qd_clock_now_s();
    const char **names = rc ? NULL : calloc((size_t)r->n_parts, sizeof *names);
    if (!rc && !names) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; i < r->n_parts && !rc; i++) names[i] = qd_model_linear(p->m, r->parts[i].linear)->name;
    if (!rc && p->hooks.fanout(p->hooks.ud, r->block, "quantize", r->n_parts, names))
        rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    free(names);
    double t_parts = qd_clock_now_s();
    qd_qpart_out *outs = rc ? NULL : calloc((size_t)r->n_parts, sizeof *outs);
    char (*workers)[64] = rc ? NULL : calloc((size_t)r->n_parts, 64);
    if (!rc && (!outs || !workers)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    double sum = 0;
    for (int i = 0; i < r->n_parts && !rc; i++) {
        const qd_qpart_in *in = &r->parts[i];
        qd_err e2 = {0};
        if (qd_qpart_read_out(p->parts_fd, r->block, i, r->in_sums[i], p->be, in, &outs[i], workers[i], &e2)) {
            /* Never used: computed again, here. */
            QD_LOG(QD_LOG_WARN, "part_recomputed", "job=%s block=%d step=quantize part=%d layer=%s rows=%lld..%lld why=\"%s\"",
                   p->job->id, r->block, i, in->res.name, (long long)in->r0, (long long)in->r1, e2.msg);
            rc = qd_qpart_run_file(p, p->parts_fd, r->block, i, p->hooks.worker, err);
            if (!rc) rc = qd_qpart_read_out(p->parts_fd, r->block, i, r->in_sums[i], p->be, in, &outs[i], workers[i], err);
        }
        if (!rc) for (int s = 0; s < QD_STAGE_COUNT; s++) sum += outs[i].stage[s];
        /* The grid is the job's and the global scale the lead's: neither comes from the file. */
        qd_quant_cfg gc = p->qcfg;
        gc.global_scale = in->global_scale;
        if (!rc) qd_qlayer_set_grid(&outs[i].layer, &gc);
    }
    double t_read = qd_clock_now_s();
    /* The stages get the parts' wall time in proportion to the seconds the parts spent in
     * each; the files' writing and reading are the checkpoint's. */
    double f = sum > 0 ? (t_parts - t_write) / sum : 0;
    for (int i = 0; i < r->n_parts && !rc; i++) cost_add_part(p, &outs[i], f);
    p->cost.stage[QD_STAGE_QUANTIZE] += t_factor;   /* the factorisations, made before the files */
    p->cost.stage[QD_STAGE_CHECKPOINT] += (t_write - t0 - t_factor) + (t_read - t_parts);
    for (int l = 0; l < r->n_lins && !rc; l++) {
        lin_job *lj = &r->lins[l];
        rc = lin_finish(r, lj, outs + lj->first, workers + lj->first, err);
    }
    for (int i = 0; outs && i < r->n_parts; i++) qd_qpart_out_free(&outs[i]);
    free(outs);
    free(workers);
    /* Taken over: this fan-out's files go, so a block's fan-outs never hold the disk
     * together. After a failure they stay until the block commits: a retry of the block
     * keeps the outputs of the inputs it writes again (part_kept). */
    for (int i = 0; !rc && i < r->n_parts; i++) {
        char name[80];
        qd_qpart_name_in(name, sizeof name, r->block, i);
        qd_part_file_remove(p->parts_fd, name);
    }
    if (!rc) qd_part_outputs_remove(p->parts_fd, r->block, "quantize", r->n_parts, r->in_sums);   /* by every maker */
    for (int l = 0; !rc && l < r->n_lins; l++) {
        char name[80];
        qd_qpart_name_hessian(name, sizeof name, r->block, r->lins[l].g);
        qd_part_file_remove(p->parts_fd, name);
    }
    for (int j = 0; !rc && fparts && j < nf + nt; j++) {
        char name[80];
        qd_fpart_name_in(name, sizeof name, r->block, j);
        qd_part_file_remove(p->parts_fd, name);
    }
    if (!rc && fparts) qd_part_outputs_remove(p->parts_fd, r->block, "factor", nf + nt, fsums);
    free(fsums);
    free(tix);
    for (int i = 0; i < r->n_parts; i++) r->parts[i].fac = NULL;
    free(fdone);
    return rc;
}

/* The Hessian group groups[j]'s linears read: acc[g], or, where it is bit for bit the
 * Hessian of the run's first group of its kind (twins, qd_model_group_same_input: a MoE
 * block's experts' gate/up, each a copy of one sum), that group's. GPTQ then factors it once
 * for all of them (qd_gptq_shared keys on the accumulator), and a fan-out writes it and its
 * factor once. Compared on the CPU only (a device's would have to be downloaded); not with
 * qd_pipeline_set_twins(p, 0). */
static qd_gptq_hessian *run_hessian(qd_pipeline *p, int block, const int *groups, int j, qd_gptq_hessian *acc)
{
    int g = groups[j];
    int kind = qd_model_group_same_input(p->m, block, g);
    if (p->no_twins || p->be->device >= 0 || !acc[g].h) return &acc[g];
    for (int i = 0; i < j; i++) {
        const qd_gptq_hessian *a = &acc[groups[i]], *b = &acc[g];
        if (qd_model_group_same_input(p->m, block, groups[i]) != kind || !a->h) continue;
        if (a->k == b->k && a->n_seen == b->n_seen && a->bf16 == b->bf16 && a->x_amax == b->x_amax &&
            !memcmp(a->h, b->h, (size_t)(a->k * a->k) * sizeof(float)))
            return &acc[groups[i]];
        break;   /* the kind's first differs: g's stands alone */
    }
    return &acc[g];
}

/* The linears of groups `groups` (n_groups of them), each group's Hessian in acc[g] (AWQ:
 * one group, whose input rows are gx): quantized in memory one after another (GPTQ factors
 * a group's Hessian once for all of its parts, qd_gptq_shared), or, with a fan-out hook and
 * more than one part to do, spread over the workers. Either way the bytes are the same. */
static int quantize_run(qd_pipeline *p, qd_block_weights *bw, int block, const int *groups, int n_groups,
                        const qd_linear_plan *plans, qd_gptq_hessian *acc, qd_gptaq_dxx *dxx, const float *gx,
                        const qd_row_slices *kcheck, const qd_row_slices *direct, qd_linear_out *outs,
                        qd_layer_result *results, qd_err *err)
{
    run_ctx r;
    memset(&r, 0, sizeof r);
    r.p = p;
    r.bw = bw;
    r.block = block;
    r.plans = plans;
    r.outs = outs;
    r.results = results;
    r.dxx = dxx;
    int n_quant = 0, n_parts = 0;
    int64_t starts[QD_PART_MAX_RANGES + 1];
    for (int j = 0; j < n_groups; j++) {
        const qd_input_group *G = qd_model_group(p->m, groups[j]);
        if (plans[G->linears[0]].absent) continue;
        for (int x = 0; x < G->n_linears; x++)
            if (plans[G->linears[x]].quantize) {
                n_quant++;
                n_parts += part_ranges(p, qd_model_linear(p->m, G->linears[x])->n, starts);
            }
    }
    /* GPTAQ's parts read a dXXT that the part files do not carry: they run here. */
    r.fan = p->hooks.fanout && n_parts > 1 && n_parts <= QD_PART_MAX_FANOUT && !dxx;
    r.lins = calloc(n_quant ? (size_t)n_quant : 1, sizeof *r.lins);
    if (!r.lins) return qd_err_set(err, QD_ENOMEM, "out of memory");
    int rc = 0;
    /* A group's factor is kept for the next group while that one reads the same Hessian. */
    qd_gptq_shared shared;
    memset(&shared, 0, sizeof shared);
    qd_gptq_hessian *h_next = NULL;   /* run_hessian of group j + 1, found in iteration j */
    for (int j = 0; j < n_groups && !rc; j++) {
        int g = groups[j];
        const qd_input_group *G = qd_model_group(p->m, g);
        qd_gptq_hessian *h = h_next ? h_next : run_hessian(p, block, groups, j, acc);
        h_next = NULL;
        if (plans[G->linears[0]].absent) continue;   /* a group of linears this block does not have */
        if (j + 1 < n_groups) h_next = run_hessian(p, block, groups, j + 1, acc);
        int keep = h_next == h;   /* the factor, for the next */
        rc = group_global_scale(&r, G, &r.global_scale, err);
        for (int x = 0; x < G->n_linears && !rc; x++) {
            int added = 0;
            rc = lin_prepare(&r, g, G->linears[x], h, j == 0 ? gx : NULL, kcheck, direct, &added, err);
            if (rc || !added || r.fan) continue;
            /* In memory, at once: the same computation the parts run. */
            lin_job *lj = &r.lins[r.n_lins - 1];
            qd_qpart_out *po = calloc((size_t)lj->n_parts, sizeof *po);
            if (!po) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
            for (int i = 0; i < lj->n_parts && !rc; i++) {
                qd_qpart_in *in = &r.parts[lj->first + i];
                /* the factor freed as soon as its last part is done, before the merge and pack */
                in->shared_last = !keep && x == G->n_linears - 1 && i == lj->n_parts - 1;
                rc = qd_qpart_compute(p, in, &shared, &po[i], err);
                if (!rc) cost_add_part(p, &po[i], 1.0);
            }
            if (!rc) rc = lin_finish(&r, lj, po, NULL, err);
            for (int i = 0; po && i < lj->n_parts; i++) qd_qpart_out_free(&po[i]);
            free(po);
        }
        if (!keep) qd_gptq_shared_free(&shared);
    }
    qd_gptq_shared_free(&shared);
    if (!rc && r.fan && r.n_parts) rc = run_fanout(&r, err);
    for (int i = 0; i < r.n_lins; i++) free(r.lins[i].clipped);
    free(r.lins);
    free(r.parts);
    free(r.in_sums);
    return rc;
}

/* 1 when the block's input groups are its attention groups followed by its MLP groups (every
 * family's order): then the true-sequential passes after the attention groups are quantized
 * start from the kept residual stream instead of re-running the attention. */
static int block_splits_in_halves(const qd_model *m)
{
    int ng = qd_model_n_groups(m), n_attn = 0;
    while (n_attn < ng && qd_model_group_part(m, n_attn) == QD_BLOCK_ATTN) n_attn++;
    for (int g = n_attn; g < ng; g++)
        if (qd_model_group_part(m, g) != QD_BLOCK_MLP) return 0;
    return n_attn > 0 && n_attn < ng;
}

/* The order in which the block's groups are captured and quantized, and how many go
 * together. Dense blocks: one group at a time, in order. True-sequential (not AWQ): groups
 * of one wave (every expert's gate/up, then every expert's down) read inputs that none of
 * the others' weights change, so capturing them together gives each the Hessian it would
 * get alone, in one pass instead of one per group; a run stops where its wave does, and a
 * wave whose Hessians pass p->wave_bytes goes in the fewest runs that fit, of even sizes
 * (wave.h: the experts a few at a time). AWQ keeps one group per pass: its clipping search
 * holds the group's whole input. wave_order fills order[] with the groups this block has
 * (DeepSeek: a dense layer has no experts), sorted by (wave, index) when sequential, and
 * returns their count; wave_run returns the length of the run starting at order[i]. */
static int wave_order(const qd_model *m, const qd_linear_plan *plans, int sequential, int *order)
{
    int ng = qd_model_n_groups(m), n = 0;
    int max_wave = 0;
    for (int g = 0; g < ng; g++)
        if (qd_model_group(m, g)->wave > max_wave) max_wave = qd_model_group(m, g)->wave;
    for (int w = 0; w <= (sequential ? max_wave : 0); w++)
        for (int g = 0; g < ng; g++) {
            const qd_input_group *G = qd_model_group(m, g);
            if ((!sequential || G->wave == w) && !plans[G->linears[0]].absent) order[n++] = g;
        }
    return n;
}

static int wave_run(const qd_model *m, const int *order, int i, int n_order, int together, uint64_t budget)
{
    if (!together) return 1;
    uint64_t bytes[QD_MAX_GROUPS];
    int wave = qd_model_group(m, order[i])->wave, n = 0;
    for (int j = i; j < n_order && qd_model_group(m, order[j])->wave == wave; j++) {
        int64_t k = qd_model_group(m, order[j])->k;
        bytes[n++] = (uint64_t)(k * k) * sizeof(float);
    }
    return qd_wave_take(bytes, n, budget);
}

static void outs_free(qd_linear_out *outs, int n)
{
    for (int i = 0; i < n; i++) {
        qd_packed_free(&outs[i].packed);
        if (outs[i].w_float != outs[i].w_eff) free(outs[i].w_float);
        free(outs[i].w_eff);
        free(outs[i].bias);
    }
}

/* ---- one block's run, phase by phase ---- */

/* What the phases of one block's run share (qd_pipeline_run_block_impl). The arrays are per
 * linear and per group (hundreds with experts): on the heap, owned here. */
typedef struct block_run {
    qd_pipeline *p;
    int block;
    double t0;                   /* monotonic seconds at the block's start */
    double t;                    /* the start of the stage being timed now */
    int nl, ng;                  /* the model's linears and input groups */
    int use_awq, sequential;
    qd_linear_plan *plans;       /* [QD_MAX_LINEARS] */
    qd_linear_out *outs;         /* [QD_MAX_LINEARS] */
    qd_gptq_hessian *acc;        /* [QD_MAX_GROUPS] */
    qd_row_slices *kcheck, *direct;
    qd_layer_result *results;    /* [QD_MAX_LINEARS] */
    int *order;                  /* [QD_MAX_GROUPS]: the groups this block has, in capture order */
    int n_order;
    int norm_modified[QD_MAX_NORMS];
    qd_block_weights *bw;
    /* True-sequential in halves (plan_halves). */
    int halves, mid_ready;
    int o_group, keep_ctx;       /* the output projection's group; keep its input in p->mid */
    int64_t ko;
    float *ctx;                  /* the attention's context, in p->mid (not owned), or NULL */
    int d_group, keep_act, act_ready;   /* the down projection's group; keep its input in act */
    int64_t kd;
    float *act;                  /* backend [calib_rows, kd]: the MLP's activation, or NULL; owned */
    int64_t calib_rows;
    float *y;                    /* backend: the next block's inputs until committed; owned */
    /* job.gptaq (pipeline_gptaq.c): the float pass's kept inputs, each group's dXXT and the
     * next block's float inputs until committed; owned, else NULL. */
    qd_gptaq_capture *gq;
    qd_gptaq_dxx *dxx;           /* [QD_MAX_GROUPS] */
    float *y_fp;
    int old_acts, wrote_acts;    /* the state's activation block before this one; a new file written */
    /* Passes cut into capture parts (part_capture.c): the cut (n_cut 0: none) and the state
     * files of the linears quantized so far. */
    int64_t cut[QD_CPART_MAX + 1];
    int n_cut;
    qd_cpart_state cst;
} block_run;

/* Allocates the run's arrays, loads the block's weights, plans its linears and makes room for
 * the kernel check's and the direct error's input rows. On failure the caller goes straight
 * to block_end: nothing was committed or recorded. */
static int block_begin(block_run *b, qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    memset(b, 0, sizeof *b);
    b->p = p;
    b->block = p->st.next_block;
    b->t0 = qd_clock_now_s();
    b->nl = qd_model_n_linears(p->m);
    b->ng = qd_model_n_groups(p->m);
    b->use_awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    b->sequential = b->use_awq || (job->method == QP_METHOD_GPTQ && job->true_sequential);
    b->plans = calloc(QD_MAX_LINEARS, sizeof *b->plans);
    b->outs = calloc(QD_MAX_LINEARS, sizeof *b->outs);
    b->acc = calloc(QD_MAX_GROUPS, sizeof *b->acc);
    b->kcheck = calloc(1, sizeof *b->kcheck);
    b->direct = calloc(1, sizeof *b->direct);
    b->results = calloc(QD_MAX_LINEARS, sizeof *b->results);
    b->order = calloc(QD_MAX_GROUPS, sizeof *b->order);
    if (job->gptaq) {
        b->gq = calloc(1, sizeof *b->gq);
        b->dxx = calloc(QD_MAX_GROUPS, sizeof *b->dxx);
    }
    b->old_acts = p->st.acts_block;
    memset(p->moe_routed, 0, sizeof p->moe_routed);
    p->moe_routed_done = 0;
    qd_pipeline_folds_clear(p);
    memset(&p->cost, 0, sizeof p->cost);
    p->cost.block = b->block;
    int rc = 0;
    if (!b->plans || !b->outs || !b->acc || !b->kcheck || !b->direct || !b->results || !b->order ||
        (job->gptaq && (!b->gq || !b->dxx)))
        rc = qd_err_set(err, QD_ENOMEM, "out of memory for block %d", b->block);
    if (!rc) {
        b->kcheck->cap = job->kernel_check ? job->kernel_check_rows : 0;
        b->direct->cap = job->error_direct_rows;
    }
    if (!rc && qd_pipeline_report_progress(p, "load", b->block, NULL, 0.0, -1)) rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    b->t = qd_clock_now_s();
    if (!rc) rc = qd_block_load(p->m, b->block, &b->bw, err);
    b->t = qd_pipeline_cost_add(p, QD_STAGE_LOAD, b->t);
    if (rc) return rc;
    for (int li = 0; li < b->nl; li++) qd_pipeline_plan_linear(p, b->block, li, &b->plans[li]);
    /* Input rows kept for the kernel check and the direct error, for the groups this block
     * has (a DeepSeek dense layer has no experts). */
    for (int g = 0; g < b->ng && !rc; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        if (b->plans[G->linears[0]].absent) continue;
        if (b->kcheck->cap && !(b->kcheck->x[g] = malloc((size_t)(b->kcheck->cap * G->k) * sizeof(float))))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory for kernel-check inputs");
        if (b->direct->cap && !(b->direct->x[g] = malloc((size_t)(b->direct->cap * G->k) * sizeof(float))))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory for error_direct_rows inputs (%lld x %lld)",
                            (long long)b->direct->cap, (long long)G->k);
    }
    /* Passes over the block cut into parts over the workers where that pays: not AWQ's (its
     * folds change norms and biases too) nor GPTAQ's (two streams). */
    if (!rc && !b->use_awq && !b->gq) b->n_cut = qd_cpart_plan(p, b->block, b->cut);
    return rc;
}

/* One pass of the block over every calibration batch (qd_capture_run(p, b->bw, half, y, c)),
 * cut into capture parts when the block's passes are and this one pays (it runs a linear);
 * the same bytes either way. */
/* A pass (or the last forward) cut into b's capture parts, the block as the lead holds it
 * (its state files and the linears quantized so far set into spec here): the parts' files'
 * seconds go to the checkpoint stage, not the pass's. c NULL: a forward no hook watches
 * (the parts record nothing). */
static int cut_run(block_run *b, qd_cpart_spec spec, qd_capture_ctx *c, qd_err *err)
{
    qd_pipeline *p = b->p;
    int quantized[QD_MAX_LINEARS] = {0};
    for (int li = 0; li < b->nl; li++) quantized[li] = b->outs[li].quantized;
    spec.st = &b->cst;
    spec.quantized = quantized;
    qd_capture_ctx none;
    if (!c) {
        qd_capture_init(&none, p, err);
        c = &none;
    }
    double t_files = 0;
    int rc = parts_dir(p, err);
    if (!rc) rc = qd_cpart_run(p, b->bw, b->block, b->cut, b->n_cut, &spec, c, &t_files, err);
    p->cost.stage[QD_STAGE_CHECKPOINT] += t_files;
    b->t += t_files;
    return rc;
}

static int pass_run(block_run *b, qd_block_part half, float *y, qd_capture_ctx *c, qd_err *err)
{
    qd_pipeline *p = b->p;
    int present[QD_MAX_GROUPS] = {0};
    for (int g = 0; g < b->ng; g++) present[g] = !b->plans[qd_model_group(p->m, g)->linears[0]].absent;
    /* With shards a part also sums its shard's Hessians: every pass that fills one pays. */
    int sums = 0;
    for (int g = 0; c && g < b->ng; g++) sums |= c->want[g] && c->acc[g];
    int pays = qd_cpart_pass_pays(p, present, half, c ? c->stop_after : -1) || (p->n_shards > 1 && sums);
    /* A MoE block's pass over its experts is cut by them instead (its batches are not). */
    if (qd_cpart_experts_pay(p, b->block, half, y, c)) {
        qd_cpart_spec spec = {.half = half, .x = p->mid, .experts = 1};
        return cut_run(b, spec, c, err);
    }
    if (!b->n_cut || !pays) return qd_capture_run(p, b->bw, half, y, c, err);
    qd_cpart_spec spec = {.half = half, .x = half == QD_BLOCK_MLP ? p->mid : p->acts, .y = y};
    return cut_run(b, spec, c, err);
}

/* The next block's inputs from the kept MLP activation (qd_capture_out_from_act): as capture
 * parts, each the down projection on its batches' rows, where the block's passes are cut. */
static int forward_from_act(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    if (!b->n_cut) return qd_capture_out_from_act(p, b->bw, b->act, b->kd, b->y, err);
    qd_cpart_spec spec = {.half = QD_BLOCK_MLP, .x = b->act, .y = b->y, .act_width = b->kd};
    return cut_run(b, spec, NULL, err);
}

/* The residual stream after the attention from the kept context (qd_capture_mid_from_ctx),
 * in place in p->mid: as capture parts, each the output projection on its batches' rows,
 * where the block's passes are cut. */
static int mid_from_ctx(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    if (!b->n_cut) return qd_capture_mid_from_ctx(p, b->bw, b->ctx, b->ko, err);
    qd_cpart_spec spec = {.half = QD_BLOCK_MLP, .x = b->ctx, .y = p->mid, .ctx_width = b->ko};
    return cut_run(b, spec, NULL, err);
}

/* job.gptaq: the next pass pairs its rows of group g with the float pass's into g's dXXT. */
static int gptaq_attach(block_run *b, qd_capture_ctx *c, int g, qd_err *err)
{
    if (!b->gq) return 0;
    qd_pipeline *p = b->p;
    int rc = qd_gptaq_dxx_init(&b->dxx[g], p->be, qd_model_group(p->m, g)->k, err);
    if (rc) return rc;
    b->gq->dxx[g] = &b->dxx[g];
    b->gq->rows[g] = 0;
    c->gq = b->gq;
    return 0;
}

/* After the pass: every calibration row of group g was paired (the Hessian saw as many). */
static int gptaq_detach(block_run *b, int g, int rc, qd_err *err)
{
    if (!b->gq || !b->gq->dxx[g]) return rc;
    b->gq->dxx[g] = NULL;
    if (!rc && (b->gq->rows[g] != b->gq->cap || b->dxx[g].n_seen != b->acc[g].n_seen))
        rc = qd_err_set(err, QD_EINVAL, "gptaq: %s paired %lld of %lld calibration rows with the float model's",
                        qd_model_group(b->p->m, g)->name, (long long)b->gq->rows[g], (long long)b->gq->cap);
    return rc;
}

/* AWQ: every group's scales searched on the float block and folded, before any capture. */
static int block_awq_scales(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    int rc = qd_pipeline_awq_block_scales(p, b->bw, b->block, b->plans, err);
    /* A MoE block's experts' shared input scale lives in post_attention_layernorm. */
    if (p->job->moe.awq_shared_input && qd_model_block_is_moe(p->m, b->block)) b->norm_modified[1] = 1;
    for (int g = 0; g < b->ng && !rc; g++) {
        if (b->plans[qd_model_group(p->m, g)->linears[0]].absent) continue;
        const qd_input_group *G = qd_model_group(p->m, g);
        if (G->prev_kind == QD_PREV_NORM) b->norm_modified[G->prev_index] = 1;
    }
    b->t = qd_pipeline_cost_add(p, QD_STAGE_AWQ_SEARCH, b->t);
    /* Linears that fed a later group's scales changed too. */
    for (int g = 0; g < b->ng; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        for (int j = 0; j < G->n_linears; j++) b->outs[G->linears[j]].weight_modified = 1;
    }
    return rc;
}

/* Not true-sequential: one forward of the float block captures every group's Hessian. */
static int block_capture_all(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    int rc = 0;
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    c.kcheck = b->kcheck;
    c.direct = b->direct;
    for (int g = 0; g < b->ng && !rc; g++) {
        if (b->plans[qd_model_group(p->m, g)->linears[0]].absent) continue;
        rc = qd_gptq_hessian_init(&b->acc[g], p->be, qd_model_group(p->m, g)->k, err);
        b->acc[g].bf16 = p->compute == QP_COMPUTE_BF16;
        c.want[g] = 1;
        c.acc[g] = &b->acc[g];
        if (!rc) rc = gptaq_attach(b, &c, g, err);
    }
    if (!rc) rc = qd_pipeline_report_progress(p, "calibrate", b->block, NULL, 0.0, -1) ? QD_ECANCELLED : 0;
    if (!rc) rc = pass_run(b, QD_BLOCK_ALL, NULL, &c, err);
    for (int g = 0; g < b->ng; g++) rc = gptaq_detach(b, g, rc, err);
    b->t = qd_pipeline_cost_add(p, QD_STAGE_CALIBRATE, b->t);
    return rc;
}

/* The capture order, and what the true-sequential passes keep between the block's halves.
 * rc: the run's result so far (the order is made either way, the residual stream only
 * while it is 0). */
static int plan_halves(block_run *b, int rc, qd_err *err)
{
    qd_pipeline *p = b->p;
    /* True-sequential: once the attention groups are quantized, the residual stream after
     * the attention (p->mid) no longer changes; it is computed once, by the pass that
     * captures the first MLP group, and the later passes and the final forward start from it. */
    b->halves = b->sequential && block_splits_in_halves(p->m);
    b->n_order = wave_order(p->m, b->plans, b->sequential, b->order);   /* the groups this block has */
    if (!rc && b->halves) {
        p->mid = qd_backend_alloc(p->be, (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float));
        if (!p->mid) rc = qd_err_set(err, QD_ENOMEM, "out of memory for the block's residual stream");
    }
    /* GPTQ true-sequential in halves: the pass that captures the output projection's input
     * keeps that input (the attention's context) in p->mid, and once the projection is
     * quantized the residual stream after the attention is computed from it in place
     * (qd_capture_mid_from_ctx), so the first MLP pass does not re-run the attention half
     * (its projections, RoPE and attention). Only where the context is as wide as the
     * hidden size (Llama, Mistral 7B, Qwen3-8B, Phi; not Gemma 2, Qwen3-4B or Mistral Nemo,
     * which re-run it), so no buffer is added to the memory peak. AWQ too: its scales are
     * all folded before the first pass, and the kept context is also the input its clip
     * search reads for the output projection (no copy of its own). */
    b->o_group = qd_model_block_attn_out_group(p->m, b->block);   /* a hybrid's recurrent layer: its out_proj */
    b->ko = qd_model_group(p->m, b->o_group)->k;
    b->calib_rows = p->n_seq * p->seq_len;
    b->keep_ctx = b->halves && b->ko == p->hidden;
    for (int j = 0, seen = 0; j < b->n_order; j++) {   /* the context is final once no attention group follows */
        if (b->order[j] == b->o_group) seen = 1;
        else if (seen && qd_model_group_part(p->m, b->order[j]) == QD_BLOCK_ATTN) b->keep_ctx = 0;
    }
    /* Likewise at the block's end: a dense block's down capture keeps its input (the MLP's
     * activation) when the job's estimate counted it (keep_mlp_act: up to QD_MLP_KEEP_BYTES,
     * or more on a machine with the memory, qd_pipeline_mlp_keep_decide), and the final
     * forward is then the quantized down projection on it (qd_capture_out_from_act) instead
     * of the MLP half again. The down group must be the last one quantized. On a GPU it
     * stays within QD_MLP_KEEP_BYTES: the estimate counts host memory, and a large one that
     * fit the device could leave no room for the next block's inputs. The estimate has AWQ
     * keep it always: it is the input its down capture holds for the clip search anyway,
     * counted in the estimate's AWQ term, and now held to the block's end. */
    b->d_group = qd_model_mlp_out_group(p->m);
    b->kd = b->d_group >= 0 ? qd_model_group(p->m, b->d_group)->k : 0;
    b->keep_act = b->halves && b->d_group >= 0 && !qd_model_block_is_moe(p->m, b->block) && b->n_order > 0 &&
                  b->order[b->n_order - 1] == b->d_group && p->est.keep_mlp_act && !p->no_mlp_keep &&
                  (p->be->device < 0 || (uint64_t)(b->calib_rows * b->kd) * sizeof(float) <= QD_MLP_KEEP_BYTES);
    return rc;
}

/* True-sequential: one capture pass for the groups order[i .. i+run), over the block with
 * the groups before them quantized. *xcap gets the copy of an AWQ group's input this pass
 * made (the caller frees it), *gx the input its clip search reads (that copy, or the kept
 * context or activation). */
static int capture_pass(block_run *b, int i, int run, float **xcap, const float **gx, qd_err *err)
{
    qd_pipeline *p = b->p;
    const int *order = b->order;
    int g = order[i];
    const qd_input_group *G = qd_model_group(p->m, g);
    int rc = 0;
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    c.kcheck = b->kcheck;
    c.direct = b->direct;
    for (int j = i; j < i + run && !rc; j++) {
        rc = qd_gptq_hessian_init(&b->acc[order[j]], p->be, qd_model_group(p->m, order[j])->k, err);
        b->acc[order[j]].bf16 = p->compute == QP_COMPUTE_BF16;
        c.want[order[j]] = 1;
        c.acc[order[j]] = &b->acc[order[j]];
        if (order[j] > c.stop_after) c.stop_after = order[j];
        if (!rc) rc = gptaq_attach(b, &c, order[j], err);
    }
    for (int j = i; j < i + run && b->keep_ctx && !b->ctx && !rc; j++) {
        if (order[j] != b->o_group) continue;
        b->ctx = p->mid;
        c.xcap = b->ctx;
        c.xcap_group = b->o_group;
    }
    for (int j = i; j < i + run && b->keep_act && !b->act && !rc; j++) {
        if (order[j] != b->d_group) continue;
        b->act = qd_backend_alloc(p->be, (size_t)(b->calib_rows * b->kd) * sizeof(float));
        if (!b->act) b->keep_act = 0;   /* no room: the final forward re-runs the MLP half */
        c.xcap = b->act;
        c.xcap_group = b->act ? b->d_group : -1;
    }
    /* AWQ's clip search reads the group's input: the kept context or activation when this
     * pass keeps one (AWQ captures one group a pass), else a copy of its own. */
    if (b->use_awq && !rc && c.xcap) {
        *gx = c.xcap;
    } else if (b->use_awq && !rc) {
        int64_t R = p->n_seq * p->seq_len;
        *xcap = qd_backend_alloc(p->be, (size_t)(R * G->k) * sizeof(float));
        if (!*xcap) rc = qd_err_set(err, QD_ENOMEM, "out of memory for [%lld, %lld] activations", (long long)R, (long long)G->k);
        c.xcap = *xcap;
        c.xcap_group = g;
        *gx = *xcap;
    }
    if (!rc) rc = qd_pipeline_report_progress(p, "calibrate", b->block, G->name, (double)i / b->n_order, -1) ? QD_ECANCELLED : 0;
    qd_block_part part = QD_BLOCK_ALL;
    if (b->halves && qd_model_group_part(p->m, g) == QD_BLOCK_MLP && !b->mid_ready && b->ctx) {
        /* every earlier group is quantized: the output projection's input is final */
        if (!rc) rc = mid_from_ctx(b, err);
        if (!rc) b->mid_ready = 1;
        b->ctx = NULL;
        b->keep_ctx = 0;
    }
    if (b->halves && qd_model_group_part(p->m, g) == QD_BLOCK_MLP) part = b->mid_ready ? QD_BLOCK_MLP : QD_BLOCK_ATTN;
    if (!rc) rc = pass_run(b, part, NULL, &c, err);
    for (int j = i; j < i + run; j++) rc = gptaq_detach(b, order[j], rc, err);
    if (!rc && part == QD_BLOCK_ATTN) b->mid_ready = 1;
    if (!rc && c.xcap && (c.xcap == b->ctx || c.xcap == b->act)) {
        if (c.xcap_rows != b->calib_rows)
            rc = qd_err_set(err, QD_EINVAL, "block %d: the pass keeping %s's input saw %lld of %lld rows", b->block,
                            qd_model_group(p->m, c.xcap_group)->name, (long long)c.xcap_rows, (long long)b->calib_rows);
        else if (c.xcap == b->act)
            b->act_ready = 1;
    }
    b->t = qd_pipeline_cost_add(p, QD_STAGE_CALIBRATE, b->t);
    return rc;
}

/* Every group in capture order, a wave's run of them at a time: captured (true-sequential)
 * and quantized. */
static int quantize_groups(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    int rc = 0;
    for (int i = 0; i < b->n_order && !rc;) {
        /* order[i .. i+run) together */
        /* Not true-sequential: every group's Hessian is there from the one capture, and all
         * the block's linears can go out as parts at once. */
        int run = !b->sequential && p->hooks.fanout ? b->n_order - i
                  : wave_run(p->m, b->order, i, b->n_order, b->sequential && !b->use_awq, p->wave_bytes);
        float *xcap = NULL;
        const float *gx = NULL;   /* the current AWQ group's input rows: xcap, or the kept ctx or act */
        if (b->sequential) rc = capture_pass(b, i, run, &xcap, &gx, err);
        if (!rc) rc = quantize_run(p, b->bw, b->block, b->order + i, run, b->plans, b->acc, b->gq ? b->dxx : NULL, gx,
                                   b->kcheck, b->direct, b->outs, b->results, err);
        for (int j = i; j < i + run; j++) {
            int g = b->order[j];
            qd_gptq_hessian_free(&b->acc[g]);
            if (!b->gq) continue;
            /* Done with: the group's dXXT and its float-model inputs. */
            qd_gptaq_dxx_free(&b->dxx[g]);
            qd_backend_free(p->be, b->gq->keep[g]);
            b->gq->keep[g] = NULL;
        }
        b->t = qd_clock_now_s();   /* quantize_run booked its own stages */
        qd_backend_free(p->be, xcap);
        i += run;
    }
    return rc;
}

/* Every linear of the block quantized (or left in float), its result added to the state. */
static int block_quantize(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    int rc = 0;
    if (b->use_awq) rc = block_awq_scales(b, err);
    if (!rc && b->gq) {
        /* GPTAQ: the float block on the float stream, before any of it is quantized. */
        rc = qd_pipeline_gptaq_float_pass(p, b->bw, b->plans, b->gq, &b->y_fp, err);
        b->t = qd_pipeline_cost_add(p, QD_STAGE_CALIBRATE, b->t);
    }
    if (!rc && !b->sequential) rc = block_capture_all(b, err);
    rc = plan_halves(b, rc, err);
    if (!rc) rc = quantize_groups(b, err);
    /* The layers' results in the block's own order (groups, then their linears). */
    for (int g = 0; g < b->ng && !rc; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        for (int j = 0; j < G->n_linears && !rc; j++)
            if (!b->plans[G->linears[j]].absent && qd_state_add_layer(&p->st, &b->results[G->linears[j]]))
                rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    for (int g = 0; g < b->ng; g++) qd_gptq_hessian_free(&b->acc[g]);
    return rc;
}

/* The next block's inputs (b->y), computed by the quantized block: from the kept MLP
 * activation where there is one, else the block (or its MLP half) again. */
static int block_forward(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    int rc = qd_pipeline_report_progress(p, "forward", b->block, NULL, 1.0, -1) ? QD_ECANCELLED : 0;
    size_t bytes = (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float);
    if (!rc) {
        b->y = qd_backend_alloc(p->be, bytes);
        if (!b->y) rc = qd_err_set(err, QD_ENOMEM, "out of memory for the next block's inputs");
    }
    if (!rc && b->act_ready && b->mid_ready) rc = forward_from_act(b, err);
    else if (!rc) rc = pass_run(b, b->mid_ready ? QD_BLOCK_MLP : QD_BLOCK_ALL, b->y, NULL, err);
    qd_backend_free(p->be, b->act);
    b->act = NULL;
    b->t = qd_pipeline_cost_add(p, QD_STAGE_FORWARD, b->t);
    return rc;
}

/* The commit's files before state.json: the block's tensors and (AWQ) its folds, once the
 * hooks allow the commit. */
static int commit_block_files(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    char path[QD_PATH_MAX + 64];
    int rc = qd_pipeline_report_progress(p, "checkpoint", b->block, NULL, 1.0, -1) ? QD_ECANCELLED : 0;
    if (!rc && p->hooks.before_commit && p->hooks.before_commit(p->hooks.ud, b->block))
        rc = qd_err_set(err, QD_ECANCELLED, "block %d: checkpoint commit refused (lease lost or cancelled)", b->block);
    if (!rc) {
        snprintf(path, sizeof path, "%s/block-%03d.safetensors", p->ckpt_dir, b->block);
        rc = qd_pipeline_write_block_file(p, b->bw, b->block, b->outs, b->norm_modified, path, err);
        if (!rc) p->cost.bytes_written += qd_fs_file_size(path);
        /* The AWQ scales a resumed job needs to redo this block's forward. */
        snprintf(path, sizeof path, "%s/folds-%03d.safetensors", p->ckpt_dir, b->block);
        if (!rc && b->use_awq) rc = qd_pipeline_folds_write(p, path, err);
        if (!rc && b->use_awq) p->cost.bytes_written += qd_fs_file_size(path);
    }
    return rc;
}

/* The next block's inputs, rounded to the activations' dtype whether or not they are
 * written (a resumed run reads back, or recomputes, exactly what this run goes on with),
 * then written when job.checkpoint says so. On the CPU backend they are host memory
 * already. Nothing after the last block. */
static int commit_next_inputs(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    if (b->block + 1 >= p->n_blocks) return 0;
    char path[QD_PATH_MAX + 64];
    int rc = 0;
    size_t n = (size_t)(p->n_seq * p->seq_len * p->hidden);
    /* The float stream too (host: GPTAQ runs on the CPU), as a resumed job recomputes it. */
    if (b->y_fp) qd_acts_round(b->y_fp, n, p->acts_dtype);
    int on_host = p->be->device < 0;
    float *host = on_host ? b->y : malloc(n * sizeof(float));
    if (!host) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc && !on_host) rc = qd_backend_download(p->be, host, b->y, n * sizeof(float));
    if (!rc) qd_acts_round(host, n, p->acts_dtype);
    if (!rc && !on_host) rc = qd_backend_upload(p->be, b->y, host, n * sizeof(float));
    b->wrote_acts = (b->block + 1) % qp_job_acts_every(p->job) == 0;
    snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, b->block + 1);
    if (!rc && b->wrote_acts) rc = qd_acts_write(path, host, p->n_seq * p->seq_len, p->hidden, p->acts_dtype, err);
    if (!rc && b->wrote_acts) p->cost.bytes_written += qd_fs_file_size(path);
    if (!on_host) free(host);
    return rc;
}

/* The commit point: state.json names the new block (and activation file); then the older
 * activation file goes and the next inputs become the pipeline's. */
static int commit_state(block_run *b, qd_err *err)
{
    qd_pipeline *p = b->p;
    char path[QD_PATH_MAX + 64];
    /* The checkpoint's largest moment: the new block and activation files are there, the
     * older activation file not removed yet. */
    qd_pipeline_sample_peaks(p);
    double secs = cost_finish(p, b->t, b->t0);
    p->st.seconds += secs;
    p->st.next_block = b->block + 1;
    if (b->wrote_acts) p->st.acts_block = b->block + 1;
    if (p->hooks.fence) p->st.fence = p->hooks.fence;
    snprintf(path, sizeof path, "%s/state.json", p->ckpt_dir);
    int rc = qd_state_add_block_cost(&p->st, &p->cost) ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    if (!rc) rc = qd_state_save(path, &p->st, err);
    if (!rc) {
        snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, b->old_acts);
        if (b->wrote_acts) remove(path);   /* the state no longer points at it */
        /* The block's part files are needed no more (they were its resume points). */
        if (p->parts_fd >= 0) qd_part_files_remove(p->parts_fd, NULL);
        qd_backend_free(p->be, p->acts);
        p->acts = b->y;
        b->y = NULL;
        if (b->y_fp) {
            qd_backend_free(p->be, p->acts_fp);
            p->acts_fp = b->y_fp;
            b->y_fp = NULL;
        }
        p->block_seconds_sum += secs;
        p->blocks_this_run++;
        QD_LOG(QD_LOG_INFO, "block_done", "job=%s block=%d/%d seconds=%.2f forward_passes=%d bytes_written=%llu",
               p->job->id, b->block + 1, p->n_blocks, secs, p->cost.forward_passes,
               (unsigned long long)p->cost.bytes_written);
    }
    return rc;
}

/* A block that failed after its weights were loaded: nothing of it stays committed. */
static void block_rollback(block_run *b)
{
    qd_pipeline *p = b->p;
    if (b->wrote_acts) {
        /* Not committed: the new file is nobody's (the state still names the old one). */
        char path[QD_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, b->block + 1);
        remove(path);
    }
    /* The state in memory says what the one on disk says. */
    p->st.next_block = b->block;
    p->st.acts_block = b->old_acts;
    /* Drop the layers this failed block added, so a retry does not list them twice. */
    while (p->st.n_layers && p->st.layers[p->st.n_layers - 1].block == b->block) p->st.n_layers--;
}

static void block_end(block_run *b)
{
    qd_pipeline *p = b->p;
    qd_backend_free(p->be, b->y);
    qd_backend_free(p->be, b->y_fp);
    qd_pipeline_gptaq_capture_free(p, b->gq, b->dxx);
    free(b->gq);
    free(b->dxx);
    qd_backend_free(p->be, b->act);
    qd_backend_free(p->be, p->mid);
    p->mid = NULL;
    for (int g = 0; g < b->ng && b->kcheck && b->direct; g++) {
        free(b->kcheck->x[g]);
        free(b->direct->x[g]);
    }
    if (b->outs) outs_free(b->outs, b->nl);
    qd_block_free(p->m, b->bw);
    free(b->plans); free(b->outs); free(b->acc); free(b->kcheck); free(b->direct); free(b->results); free(b->order);
}

int qd_pipeline_run_block_impl(qd_pipeline *p, qd_err *err)
{
    block_run b;
    int rc = block_begin(&b, p, err);
    if (!rc) {
        rc = block_quantize(&b, err);
        if (!rc) rc = block_forward(&b, err);
        /* Commit: block tensors, next inputs, then state.json. */
        if (!rc) rc = commit_block_files(&b, err);
        if (!rc) rc = commit_next_inputs(&b, err);
        if (!rc) rc = commit_state(&b, err);
        if (rc) block_rollback(&b);
    }
    block_end(&b);
    return rc;
}
