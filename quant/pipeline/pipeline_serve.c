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

int qd_pipeline_check_serving(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    /* vLLM keeps a g_idx for desc_act GPTQ (has_g_idx = desc_act); static groups are written
     * desc_act false (fmt_gptq.c), and formats that store act-order without one
     * (compressed-tensors' actorder "weight") have none. */
    qd_serving_quant q = {p->fmt->name, job->bits, job->sym, job->group_size,
                          p->fmt->act_order == QD_FMT_ACT_ORDER_G_IDX && job->desc_act && !job->static_groups,
                          qd_scheme_srv_act(qp_job_scheme(job))};
    int cc = qd_srv_gpu_cc(job->serve.gpu);
    qd_tp_serving_report_free(&p->serving);
    int rc = qd_tp_serving_check(p->m, &q, plan_is_float, p, job->serve.tp, cc, &p->serving, err);
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
