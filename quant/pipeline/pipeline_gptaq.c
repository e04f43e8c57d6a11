/* GPTAQ's float stream (job.gptaq): beside p->acts, the inputs of the next block in the
 * partly quantized model, the pipeline carries p->acts_fp, the same block's inputs in the
 * float model. Each block first runs its float weights on p->acts_fp (the float pass): the
 * output is the next block's float inputs, and each linear group's input seen on the way
 * is kept; the capture passes over the (partly quantized) block then pair their rows with
 * the kept ones into the group's dXXT (quant/algo/gptaq.h).
 *
 * The float stream is not written to the checkpoint: it depends on the source weights and
 * the calibration ids alone, so a resumed job recomputes it (embedding, then the float
 * blocks before the next one), with the very steps the first run took, and gets the same
 * bytes. That costs one forward per finished block on resume and no disk. */
#include "quant/pipeline/pipeline_internal.h"

#include <stdlib.h>
#include <string.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"
#include "quant/pipeline/acts.h"

int qd_pipeline_gptaq_check(const qd_pipeline *p, qd_err *err)
{
    const qd_model_config *cfg = qd_model_cfg(p->m);
    if (p->be->device >= 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "job.gptaq: runs on the CPU backend only, not on %s (set \"backend\": \"cpu\")",
                          p->be->name ? p->be->name : "this backend");
    if (cfg->n_experts > 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "job.gptaq: not supported for %s (mixture of experts: the experts' routed "
                          "rows differ between the float and the quantized model)", cfg->architecture);
    if (p->qcfg.grid != QD_GRID_INT || (p->qcfg.row_block != 1 && p->qcfg.row_block != 0))
        return qd_err_set(err, QD_EUNSUPPORTED, "job.gptaq: only with integer grids (not the %s grid of this job's scheme)",
                          qd_grid_name(p->qcfg.grid));
    if (p->job->tp > 1 || p->job->layout == QP_LAYOUT_TP_AWARE)
        return qd_err_set(err, QD_EUNSUPPORTED, "job.gptaq: not supported with tp > 1 or layout tp_aware");
    return 0;
}

/* One float block over the float stream: p->acts_fp through bw into y (backend), with c's
 * hooks, as qd_capture_run runs every pass (the same batches, so the same bytes). */
static int float_block_run(qd_pipeline *p, const qd_block_weights *bw, float *y, qd_capture_ctx *c, qd_err *err)
{
    float *acts = p->acts;
    p->acts = p->acts_fp;
    int rc = qd_capture_run(p, bw, QD_BLOCK_ALL, y, c, err);
    p->acts = acts;
    return rc;
}

int qd_pipeline_gptaq_stream_open(qd_pipeline *p, const int32_t *ids, int upto, qd_err *err)
{
    const size_t n = (size_t)(p->n_seq * p->seq_len * p->hidden);
    qd_backend_free(p->be, p->acts_fp);
    p->acts_fp = qd_backend_alloc(p->be, n * sizeof(float));
    if (!p->acts_fp) return qd_err_set(err, QD_ENOMEM, "out of memory for the float stream (%zu bytes)", n * sizeof(float));
    int rc = 0;
    for (int64_t s0 = 0; s0 < p->n_seq && !rc; s0 += p->batch_seqs) {
        int64_t nb = p->n_seq - s0 < p->batch_seqs ? p->n_seq - s0 : p->batch_seqs;
        rc = qd_model_embed(p->m, ids + s0 * p->seq_len, nb, p->seq_len, NULL, p->acts_fp + s0 * p->seq_len * p->hidden,
                            err);
    }
    double t0 = qd_clock_now_s();
    for (int b = 0; b < upto && !rc; b++) {
        qd_block_weights *bw = NULL;
        float *y = qd_backend_alloc(p->be, n * sizeof(float));
        if (!y) rc = qd_err_set(err, QD_ENOMEM, "out of memory for the float stream");
        if (!rc) rc = qd_block_load(p->m, b, &bw, err);
        qd_capture_ctx c;
        qd_capture_init(&c, p, err);
        if (!rc) rc = float_block_run(p, bw, y, &c, err);
        qd_block_free(p->m, bw);
        if (!rc) qd_acts_round(y, n, p->acts_dtype);   /* as the block's commit rounds it */
        if (rc) { qd_backend_free(p->be, y); break; }
        qd_backend_free(p->be, p->acts_fp);
        p->acts_fp = y;
    }
    if (!rc && upto > 0)
        QD_LOG(QD_LOG_INFO, "gptaq_float_stream", "job=%s blocks=%d seconds=%.2f (recomputed on resume)", p->job->id, upto,
               qd_clock_now_s() - t0);
    return rc;
}

int qd_pipeline_gptaq_float_pass(qd_pipeline *p, const qd_block_weights *bw, const qd_linear_plan *plans,
                                 qd_gptaq_capture *gq, float **y_fp, qd_err *err)
{
    const int64_t R = p->n_seq * p->seq_len;
    const size_t n = (size_t)(R * p->hidden);
    memset(gq, 0, sizeof *gq);
    gq->cap = R;
    gq->keeping = 1;
    *y_fp = qd_backend_alloc(p->be, n * sizeof(float));
    if (!*y_fp) return qd_err_set(err, QD_ENOMEM, "out of memory for the float stream");
    for (int g = 0; g < qd_model_n_groups(p->m); g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        if (plans[G->linears[0]].absent) continue;
        gq->keep[g] = qd_backend_alloc(p->be, (size_t)(R * G->k) * sizeof(float));
        if (!gq->keep[g])
            return qd_err_set(err, QD_ENOMEM, "out of memory for %s's float-model inputs [%lld, %lld]", G->name,
                              (long long)R, (long long)G->k);
    }
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    c.gq = gq;
    int rc = float_block_run(p, bw, *y_fp, &c, err);
    for (int g = 0; g < qd_model_n_groups(p->m) && !rc; g++)
        if (gq->keep[g] && gq->rows[g] != R)
            rc = qd_err_set(err, QD_EINVAL, "gptaq: the float pass saw %lld of %lld rows of %s", (long long)gq->rows[g],
                            (long long)R, qd_model_group(p->m, g)->name);
    gq->keeping = 0;
    memset(gq->rows, 0, sizeof gq->rows);
    return rc;
}

void qd_pipeline_gptaq_capture_free(qd_pipeline *p, qd_gptaq_capture *gq, qd_gptaq_dxx *dxx)
{
    if (!gq) return;
    for (int g = 0; g < QD_MAX_GROUPS; g++) {
        qd_backend_free(p->be, gq->keep[g]);
        gq->keep[g] = NULL;
        gq->dxx[g] = NULL;
        if (dxx) qd_gptaq_dxx_free(&dxx[g]);
    }
}
