/* The "serve" pre-flight of a job (issue #17 part 3): the layers as this job will write them
 * (format, bits, symmetry, group size, act-order; the ones its plan leaves in float) through
 * the vLLM rule table at the job's serving TP degree, before any work. */
#include "quant/formats/scheme.h"
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <string.h>

static int plan_is_float(void *ud, int block, int li)
{
    qd_linear_plan plan;
    qd_pipeline_plan_linear(ud, block, li, &plan);
    return !plan.quantize;
}

/* job.target_bpw: the plan's bits and group size of a linear. */
static int plan_quant(void *ud, int block, int li, int *bits, int64_t *gs)
{
    const qd_pipeline *p = ud;
    if (!p->bpw.n_cand) return -1;
    qd_quant_cfg c = qd_pipeline_linear_qcfg(p, block, li);
    *bits = c.bits;
    *gs = c.group_size;
    return 0;
}

/* One check at bits and group size gs (or the plan's, with_plan) into p->serving. */
static int check_once(qd_pipeline *p, int bits, int64_t gs, int with_plan, qd_err *err)
{
    const qp_job *job = p->job;
    /* vLLM keeps a g_idx for desc_act GPTQ (has_g_idx = desc_act); static groups are written
     * desc_act false (fmt_gptq.c), and formats that store act-order without one
     * (compressed-tensors' actorder "weight") have none. */
    qd_serving_quant q = {p->fmt->name, bits, job->sym, gs,
                          p->fmt->act_order == QD_FMT_ACT_ORDER_G_IDX && job->desc_act && !job->static_groups,
                          qd_scheme_srv_act(qp_job_scheme(job)), with_plan ? plan_quant : NULL, p, NULL, 0};
    /* target_bpw in GPTQ's format: the rules are written to read as the plan (pipeline_bpw_dynamic.c),
     * and vLLM's GPTQ config builds only 4- and 8-bit layers from them. */
    q.gptq_dynamic = job->target_bpw != 0 && qd_pipeline_bpw_is_dynamic(p);
    int cc = qd_srv_gpu_cc(job->serve.gpu);
    qd_tp_serving_report_free(&p->serving);
    return qd_tp_serving_check(p->m, &q, plan_is_float, p, job->serve.tp, cc, &p->serving, err);
}

int qd_pipeline_check_serving(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    int rc = 0;
    if (job->target_bpw != 0 && !p->bpw.n_cand) {
        /* Before the plan: every candidate must be served fast wherever the plan puts it (the
         * plan gives fused members one choice, so no fused layer mixes them). */
        int nb = job->n_bpw_bits, ng = job->n_bpw_group_sizes ? job->n_bpw_group_sizes : 1;
        for (int b = 2; b <= 8 && !rc; b++) {
            int listed = 0;
            for (int i = 0; i < nb; i++) listed |= job->bpw_bits[i] == b;
            if (!(nb ? listed : (p->fmt->bits_mask >> b) & 1)) continue;
            for (int j = 0; j < ng && !rc; j++) {
                int64_t gs = job->n_bpw_group_sizes ? job->bpw_group_sizes[j] : job->group_size;
                rc = check_once(p, b, gs, 0, err);
                if (!rc && p->serving.n_slow) {
                    const qd_serving_row *r = NULL;
                    for (size_t i = 0; i < p->serving.n && !r; i++)
                        if (!p->serving.rows[i].is_float && !p->serving.rows[i].choice.fast) r = &p->serving.rows[i];
                    return qd_err_set(err, QD_EPREFLIGHT, "serve: candidate %d bits group %lld of target_bpw would not get "
                                      "a fast kernel on %s %s at tp %d; first %s: %s; remove it from bpw_bits or "
                                      "bpw_group_sizes", b, (long long)gs, job->serve.engine, job->serve.gpu,
                                      job->serve.tp, r->name, r->choice.why);
                }
            }
        }
        return rc;
    }
    rc = check_once(p, job->bits, job->group_size, p->bpw.n_cand > 0, err);
    if (rc || !p->serving.n_slow) return rc;
    const qd_serving_row *r = NULL;
    for (size_t i = 0; i < p->serving.n && !r; i++)
        if (!p->serving.rows[i].is_float && !p->serving.rows[i].choice.fast) r = &p->serving.rows[i];
    char fix[384];
    qd_srv_fix_hint(r->choice.why, fix, sizeof fix);
    return qd_err_set(err, QD_EPREFLIGHT, "serve: %zu of %zu layers would not get a fast kernel on %s %s at tp %d; "
                      "first %s: %s; fix: %s", p->serving.n_slow, p->serving.n, job->serve.engine, job->serve.gpu,
                      job->serve.tp, r->name, r->choice.why, fix);
}
