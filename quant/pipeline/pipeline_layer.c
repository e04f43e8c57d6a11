/* One linear inside the pipeline: can it be packed, quantize it (RTN or GPTQ), and measure
 * its relative output error from the Hessian of its inputs. */
#include "quant/core/clock.h"
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double qd_pipeline_cost_add(qd_pipeline *p, qd_stage s, double t0)
{
    double t = qd_clock_now_s();
    p->cost.stage[s] += t - t0;
    return t;
}

void qd_pipeline_plan_linear(const qd_pipeline *p, int block, int li, qd_linear_plan *plan)
{
    const qp_job *job = p->job;
    const qd_linear_info *L = qd_model_linear(p->m, li);
    char full[256];
    char prefix[160];
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    snprintf(full, sizeof full, "%s%s", prefix, L->name);
    plan->quantize = 1;
    plan->listed = 0;
    plan->absent = 0;
    plan->why[0] = 0;
    if (!qd_model_block_has_linear(p->m, block, li)) {
        plan->quantize = 0;
        plan->absent = 1;
        /* A hybrid's layer holds one mixer's linears (attention, or a recurrent mixer's). */
        static const char *const kinds[] = {"an attention layer", "a Gated DeltaNet layer", "a Mamba-2 layer",
                                            "a short-convolution layer"};
        int kind = qd_model_cfg(p->m)->layer_mixer[block < QD_CFG_MAX_LAYERS ? block : 0];
        snprintf(plan->why, sizeof plan->why, "not in this layer (%s)",
                 L->layer_mixer >= 0 && kind < 4 ? kinds[kind] : L->expert != -1 ? "a dense layer" : "a MoE layer");
        return;
    }
    for (size_t i = 0; i < job->n_modules_to_not_convert; i++) {
        if (strstr(full, job->modules_to_not_convert[i])) {
            plan->quantize = 0;
            plan->listed = 1;
            snprintf(plan->why, sizeof plan->why, "listed in modules_to_not_convert (\"%s\")", job->modules_to_not_convert[i]);
            return;
        }
    }
    /* Group divisibility and the format's own shape rules (its descriptor). With target_bpw:
     * the plan's group once there is a plan, before it any candidate's that fits. */
    if (job->target_bpw == 0) {
        if (qd_format_misfit(p->fmt, L->n, L->k, job->group_size, plan->why, sizeof plan->why)) plan->quantize = 0;
        return;
    }
    if (p->bpw.n_cand && block >= 0 && block < p->bpw.n_blocks && p->bpw.choice[(size_t)block * p->bpw.n_lin + li] >= 0) {
        qd_quant_cfg c = qd_pipeline_linear_qcfg(p, block, li);
        if (qd_format_misfit(p->fmt, L->n, L->k, c.group_size, plan->why, sizeof plan->why)) plan->quantize = 0;
        return;
    }
    int n_gs = job->n_bpw_group_sizes ? job->n_bpw_group_sizes : 1;
    for (int i = 0; i < n_gs; i++) {
        int64_t gs = job->n_bpw_group_sizes ? job->bpw_group_sizes[i] : job->group_size;
        if (!qd_format_misfit(p->fmt, L->n, L->k, gs, plan->why, sizeof plan->why)) {
            plan->why[0] = 0;
            return;
        }
    }
    plan->quantize = 0;
}

int qd_pipeline_check_plans(const qd_pipeline *p, qd_err *err)
{
    int n_lin = qd_model_n_linears(p->m);
    for (int b = 0; b < p->n_blocks; b++) {
        for (int li = 0; li < n_lin; li++) {
            qd_linear_plan plan;
            qd_pipeline_plan_linear(p, b, li, &plan);
            if (plan.quantize || plan.listed || plan.absent) continue;
            char prefix[160];
            qd_model_block_prefix(p->m, b, prefix, sizeof prefix);
            return qd_err_set(err, QD_EINVAL,
                              "layer %s%s cannot be quantized: %s; choose settings that fit it, or list it in "
                              "modules_to_not_convert to keep it in float",
                              prefix, qd_model_linear(p->m, li)->name, plan.why);
        }
    }
    return 0;
}

void qd_deq_free(qd_deq *d)
{
    if (!d) return;
    if (d->be) qd_backend_free(d->be, d->w);
    else free(d->w);
    d->w = NULL;
    d->be = NULL;
}

qd_gptq_opts qd_pipeline_gptq_opts(const qd_pipeline *p)
{
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant = p->qcfg;
    o.damp_percent = p->job->damp_percent;
    o.desc_act = p->job->desc_act;
    o.static_groups = p->job->static_groups;
    o.stop = p->part_stop;
    return o;
}

/* Moves GPTQ's (or GPTAQ's) codes and dequantized weight out of r into layer and deq, fills
 * res's damping, fallback, seconds and note, and frees what r still holds. */
static void result_take(qd_gptq_result *r, qd_qlayer *layer, qd_deq *deq, qd_layer_result *res)
{
    *layer = r->layer;
    memset(&r->layer, 0, sizeof r->layer);
    deq->w = r->deq;
    deq->be = r->deq_be;
    r->deq = NULL;
    r->deq_be = NULL;
    res->damp = r->damp_percent;
    res->fallback = r->fallback_rtn;
    res->seconds = r->seconds;
    if (r->fallback_rtn)
        snprintf(res->note, sizeof res->note, "Cholesky failed up to damp %.3g: fell back to RTN", r->damp_percent);
    else if (r->damp_retries)
        snprintf(res->note, sizeof res->note, "damping raised to %.3g after %d failed Cholesky tries", r->damp_percent,
                 r->damp_retries);
    qd_gptq_result_free(r);
}

int qd_pipeline_quantize_weight(qd_pipeline *p, const qd_quant_cfg *cfg, int use_gptq, float global_scale, const float *w,
                                int64_t n, int64_t k, const qd_gptq_hessian *h, qd_gptq_shared *shared, qd_qlayer *layer,
                                qd_deq *deq, qd_layer_result *res, double *h_err, qd_err *err)
{
    qd_quant_cfg qc = *cfg;
    if (global_scale > 0.0f) qc.global_scale = global_scale;
    memset(layer, 0, sizeof *layer);
    memset(deq, 0, sizeof *deq);
    *h_err = -1.0;
    if (!use_gptq) {
        double t0 = qd_clock_now_s();
        deq->w = malloc((size_t)(n * k) * sizeof(float));
        if (!deq->w) return qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] layer", (long long)n, (long long)k);
        int rc = qd_rtn_quantize_qlayer(&qc, w, n, k, layer, deq->w, err);
        res->seconds = qd_clock_now_s() - t0;
        if (rc) qd_deq_free(deq);
        return rc;
    }
    qd_gptq_opts o = qd_pipeline_gptq_opts(p);
    o.quant = qc;
    qd_gptq_result r;
    memset(&r, 0, sizeof r);
    int rc = qd_gptq_quantize_shared(p->be, &o, w, n, k, h, shared, &r, err);
    if (rc) return rc;
    *h_err = r.h_err;            /* before result_take clears r */
    result_take(&r, layer, deq, res);
    return 0;
}

int qd_pipeline_quantize_weight_gptaq(qd_pipeline *p, const qd_quant_cfg *cfg, float global_scale, const float *w,
                                      int64_t n, int64_t k, const qd_gptq_hessian *h, const qd_gptaq_dxx *dxx,
                                      qd_qlayer *layer, qd_deq *deq, qd_layer_result *res, double *h_err, qd_err *err)
{
    memset(layer, 0, sizeof *layer);
    memset(deq, 0, sizeof *deq);
    *h_err = -1.0;
    if (!h || !dxx || h->k != k || dxx->k != k || h->n_seen <= 0 || dxx->n_seen != h->n_seen)
        return qd_err_set(err, QD_EINVAL, "gptaq: the Hessian and dXXT of a [%lld, %lld] layer do not match (%lld and %lld rows)",
                          (long long)n, (long long)k, h ? (long long)h->n_seen : 0LL, dxx ? (long long)dxx->n_seen : 0LL);
    qd_gptq_opts o = qd_pipeline_gptq_opts(p);
    o.quant = *cfg;   /* the job's grid, or target_bpw's bits and group for this linear */
    if (global_scale > 0.0f) o.quant.global_scale = global_scale;
    /* Both on the CPU backend (qd_pipeline_gptaq_check): host memory already. */
    qd_gptq_result r;
    int rc = qd_gptaq_quantize_h(p->be, &o, QD_GPTAQ_ALPHA_DEFAULT, w, n, k, h->h, dxx->d, &r, err);
    if (rc) return rc;
    result_take(&r, layer, deq, res);
    return 0;
}

/* <A, B>_F of two k x k matrices (host), in double. */
static double frob_dot(const float *a, const float *b, size_t kk)
{
    double acc = 0;
    for (size_t i = 0; i < kk; i++) acc += (double)a[i] * (double)b[i];
    return acc;
}

int qd_pipeline_rel_error(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                          const qd_gptq_hessian *h, double d_err, double *rel, qd_err *err)
{
    double tr[2];
    int rc = qd_pipeline_rel_traces(p, w, q, n, k, h, d_err, tr, err);
    if (!rc) *rel = qd_pipeline_rel_ratio(tr[0], tr[1]);
    return rc;
}

double qd_pipeline_rel_ratio(double num, double den)
{
    return den > 0 ? sqrt(fmax(num, 0) / den) : 0.0;
}

int qd_pipeline_rel_traces(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                           const qd_gptq_hessian *h, double d_err, double *trace, qd_err *err)
{
    return qd_pipeline_rel_traces_den(p, w, q, n, k, h, d_err, -1.0, trace, err);
}

int qd_pipeline_rel_traces_den(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                               const qd_gptq_hessian *h, double d_err, double den, double *trace, qd_err *err)
{
    /* tr(A H A^T) = <H, A^T A>_F: A^T A by a symmetric rank-n update (the Hessian's own
     * op) costs n k^2 flops, half of the GEMM A H; the 2/n it scales by cancels in the ratio. */
    qd_backend *be = p->be;
    size_t nk = (size_t)(n * k), kk = (size_t)(k * k);
    int on_host = be->device < 0;
    int diff = d_err < 0;   /* D = W - Q is formed here only without GPTQ's losses */
    int last = den >= 0 ? 1 : 2;   /* the denominator's pass, unless it is known */
    if (!diff && last == 1) {
        trace[0] = d_err * 2.0 / (double)n;
        trace[1] = den;
        return 0;
    }
    /* On the host the backend reads W where it is; D, or a device's copy, needs a buffer. */
    float *a = on_host ? NULL : qd_backend_alloc(be, nk * sizeof(float));
    float *s = qd_backend_alloc(be, kk * sizeof(float));
    float *tmp = diff || !on_host ? malloc(nk * sizeof(float)) : NULL;
    float *hh = on_host ? h->h : malloc(kk * sizeof(float));
    float *sh = on_host ? s : malloc(kk * sizeof(float));
    int rc = 0;
    if ((!on_host && !a) || !s || ((diff || !on_host) && !tmp) || !hh || !sh) {
        rc = qd_err_set(err, QD_ENOMEM, "rel error: out of memory for [%lld, %lld]", (long long)n, (long long)k);
        goto out;
    }
    if (!on_host && (rc = qd_backend_download(be, hh, h->h, kk * sizeof(float)))) goto be_err;
    double tr[2] = {d_err * 2.0 / (double)n, den};   /* D = W - Q, then W; hessian_accum's scale */
    for (int pass = diff ? 0 : 1; pass < last; pass++) {
        const float *src = w;
        if (pass == 0 || !on_host) {
            for (size_t i = 0; i < nk; i++) tmp[i] = pass == 0 ? w[i] - q[i] : w[i];
            src = tmp;
        }
        if (!on_host) {
            if ((rc = qd_backend_upload(be, a, src, nk * sizeof(float)))) goto be_err;
            src = a;
        }
        if ((rc = be->ops->hessian_accum(be, s, k, src, n, k, 0))) goto be_err;
        if (!on_host && (rc = qd_backend_download(be, sh, s, kk * sizeof(float)))) goto be_err;
        tr[pass] = frob_dot(hh, sh, kk);
    }
    trace[0] = tr[0];
    trace[1] = tr[1];
    goto out;
be_err:
    rc = qd_err_set(err, rc, "rel error: %s", be->err.msg);
out:
    free(tmp);
    if (!on_host) { free(hh); free(sh); }
    qd_backend_free(be, a);
    qd_backend_free(be, s);
    return rc;
}

int qd_pipeline_rel_error_direct(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                                 const float *x, int64_t rows, double *rel, qd_err *err)
{
    qd_backend *be = p->be;
    size_t nk = (size_t)(n * k), rn = (size_t)(rows * n);
    float *xd = qd_backend_alloc(be, (size_t)(rows * k) * sizeof(float));
    float *wd = qd_backend_alloc(be, nk * sizeof(float));
    float *yd = qd_backend_alloc(be, rn * sizeof(float));
    float *tmp = malloc((nk > rn ? nk : rn) * sizeof(float));
    int rc = 0;
    if (!xd || !wd || !yd || !tmp) {
        rc = qd_err_set(err, QD_ENOMEM, "direct error: out of memory for [%lld, %lld] outputs", (long long)rows, (long long)n);
        goto out;
    }
    if ((rc = qd_backend_upload(be, xd, x, (size_t)(rows * k) * sizeof(float)))) goto be_err;
    double sum[2] = {0, 0};   /* ||(W - Q) X^T||^2, then ||W X^T||^2 */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nk; i++) tmp[i] = pass == 0 ? w[i] - q[i] : w[i];
        if ((rc = qd_backend_upload(be, wd, tmp, nk * sizeof(float)))) goto be_err;
        /* Y [rows, n] = X [rows, k] . W^T */
        if ((rc = be->ops->gemm(be, 0, 1, rows, n, k, 1.0f, xd, k, wd, k, 0.0f, yd, n))) goto be_err;
        if ((rc = qd_backend_download(be, tmp, yd, rn * sizeof(float)))) goto be_err;
        for (size_t i = 0; i < rn; i++) sum[pass] += (double)tmp[i] * tmp[i];
    }
    *rel = sum[1] > 0 ? sqrt(sum[0] / sum[1]) : 0.0;
    goto out;
be_err:
    rc = qd_err_set(err, rc, "direct error: %s", be->err.msg);
out:
    free(tmp);
    qd_backend_free(be, xd);
    qd_backend_free(be, wd);
    qd_backend_free(be, yd);
    return rc;
}
