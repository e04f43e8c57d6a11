/* One linear inside the pipeline: can it be packed, quantize it (RTN or GPTQ), and measure
 * its relative output error from the Hessian of its inputs. */
#include "quant/core/clock.h"
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    plan->why[0] = 0;
    for (size_t i = 0; i < job->n_modules_to_not_convert; i++) {
        if (strstr(full, job->modules_to_not_convert[i])) {
            plan->quantize = 0;
            plan->listed = 1;
            snprintf(plan->why, sizeof plan->why, "listed in modules_to_not_convert (\"%s\")", job->modules_to_not_convert[i]);
            return;
        }
    }
    /* Group divisibility and the format's own shape rules (its descriptor). */
    if (qd_format_misfit(p->fmt, L->n, L->k, job->group_size, plan->why, sizeof plan->why)) plan->quantize = 0;
}

int qd_pipeline_check_plans(const qd_pipeline *p, qd_err *err)
{
    int n_lin = qd_model_n_linears(p->m);
    for (int b = 0; b < p->n_blocks; b++) {
        for (int li = 0; li < n_lin; li++) {
            qd_linear_plan plan;
            qd_pipeline_plan_linear(p, b, li, &plan);
            if (plan.quantize || plan.listed) continue;
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

int qd_pipeline_quantize_weight(qd_pipeline *p, int use_gptq, const float *w, int64_t n, int64_t k,
                                const qd_gptq_hessian *h, qd_qlayer *layer, float *deq,
                                qd_layer_result *res, qd_err *err)
{
    memset(layer, 0, sizeof *layer);
    if (!use_gptq) {
        double t0 = qd_clock_now_s();
        int rc = qd_rtn_quantize_qlayer(&p->qcfg, w, n, k, layer, deq, err);
        res->seconds = qd_clock_now_s() - t0;
        return rc;
    }
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant = p->qcfg;
    o.damp_percent = p->job->damp_percent;
    o.desc_act = p->job->desc_act;
    o.static_groups = p->job->static_groups;
    qd_gptq_result r;
    memset(&r, 0, sizeof r);
    int rc = qd_gptq_quantize(p->be, &o, w, n, k, h, &r, err);
    if (rc) return rc;
    *layer = r.layer;
    memset(&r.layer, 0, sizeof r.layer);
    memcpy(deq, r.deq, (size_t)(n * k) * sizeof(float));
    res->damp = r.damp_percent;
    res->fallback = r.fallback_rtn;
    res->seconds = r.seconds;
    if (r.fallback_rtn)
        snprintf(res->note, sizeof res->note, "Cholesky failed up to damp %.3g: fell back to RTN", r.damp_percent);
    else if (r.damp_retries)
        snprintf(res->note, sizeof res->note, "damping raised to %.3g after %d failed Cholesky tries", r.damp_percent, r.damp_retries);
    qd_gptq_result_free(&r);
    return 0;
}

int qd_pipeline_rel_error(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                          const qd_gptq_hessian *h, double *rel, qd_err *err)
{
    qd_backend *be = p->be;
    size_t nk = (size_t)(n * k);
    float *d = qd_backend_alloc(be, nk * sizeof(float) * 2);
    float *dh = qd_backend_alloc(be, nk * sizeof(float));
    int rc = 0;
    if (!d || !dh) { rc = qd_err_set(err, QD_ENOMEM, "rel error: out of memory for [%lld, %lld]", (long long)n, (long long)k); goto out; }
    float *wd = d + nk;
    float *tmp = malloc(nk * sizeof(float));
    if (!tmp) { rc = qd_err_set(err, QD_ENOMEM, "rel error: out of memory"); goto out; }
    for (size_t i = 0; i < nk; i++) tmp[i] = w[i] - q[i];
    rc = qd_backend_upload(be, d, tmp, nk * sizeof(float));
    if (!rc) rc = qd_backend_upload(be, wd, w, nk * sizeof(float));
    free(tmp);
    if (rc) { rc = qd_err_set(err, rc, "rel error: %s", be->err.msg); goto out; }
    /* tr(D H D^T) = sum(D .* (D H)); same for W. sq_diff_sum(a, 0) would need a zero
     * buffer, so the two traces are formed as dot products on the host. */
    double num = 0, den = 0;
    float *dh_host = malloc(nk * sizeof(float));
    if (!dh_host) { rc = qd_err_set(err, QD_ENOMEM, "rel error: out of memory"); goto out; }
    for (int pass = 0; pass < 2 && !rc; pass++) {
        const float *a = pass == 0 ? d : wd;
        rc = be->ops->gemm(be, 0, 0, n, k, k, 1.0f, a, k, h->h, k, 0.0f, dh, k);
        if (!rc) rc = qd_backend_download(be, dh_host, dh, nk * sizeof(float));
        if (rc) { rc = qd_err_set(err, rc, "rel error: %s", be->err.msg); break; }
        const float *src = pass == 0 ? NULL : w;
        double acc = 0;
        for (size_t i = 0; i < nk; i++) {
            double a_i = pass == 0 ? (double)w[i] - (double)q[i] : (double)src[i];
            acc += a_i * (double)dh_host[i];
        }
        if (pass == 0) num = acc; else den = acc;
    }
    free(dh_host);
    if (!rc) *rel = den > 0 ? sqrt(fmax(num, 0) / den) : 0.0;
out:
    qd_backend_free(be, d);
    qd_backend_free(be, dh);
    return rc;
}
