/* AWQ's scale for a MoE block's shared input (see pipeline_internal.h): the experts' gate and
 * up (and a shared expert's) all read post_attention_layernorm's output, as the router does,
 * so one scale serves them all, as in AutoAWQ's Mixtral recipe. It is scored on what the
 * MoE half computes: the residual stream after the attention over the first
 * AWQ_SEARCH_TOKENS tokens goes through the MLP half with every candidate's fake-quantized
 * gate/up weights (the router and the down projections in float) and is compared with the
 * float half's output. */
#include "quant/pipeline/pipeline_internal.h"

#include <stdlib.h>
#include <string.h>

#include "quant/core/log.h"

typedef struct awq_moe_ctx {
    qd_pipeline *p;
    const qd_block_weights *bw;
    int *lis;                          /* the searched linears: every expert's gate and up */
    int n_lin;
    const float *const *wq;            /* candidate weights of lis[], NULL: float */
    int g_in;                          /* the first expert's input group: its rows are captured */
    float *mid;                        /* backend [rs, hidden]: the residual stream after attention */
    float *xin;                        /* backend [rs, hidden]: the experts' normed input */
    float *yref;                       /* backend [rs, hidden]: the float MLP half's output */
    float *ytmp;                       /* backend [batch rows, hidden] */
    int64_t n_seq, rs, row0;
    int ref_pass;
    double loss;
    qd_err *err;
} awq_moe_ctx;

static int moe_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    awq_moe_ctx *a = ud;
    (void)block;
    if (!a->ref_pass || group != a->g_in || a->row0 + rows > a->rs) return 0;
    qd_backend *be = a->p->be;
    int rc = be->ops->copy(be, a->xin + a->row0 * g->k, x, (size_t)(rows * g->k) * sizeof(float));
    if (rc) return qd_err_set(a->err, rc, "awq: experts' input: %s", be->err.msg);
    a->row0 += rows;
    return 0;
}

static int moe_override(void *ud, int block, int linear, const float **w, const float **b)
{
    awq_moe_ctx *a = ud;
    (void)block;
    (void)b;
    for (int j = 0; a->wq && j < a->n_lin; j++)
        if (a->lis[j] == linear) *w = a->wq[j];
    return 0;
}

/* The MLP half over the scored sequences: into yref (ref_pass) or against it (loss). */
static int moe_pass(awq_moe_ctx *a, qd_err *err)
{
    qd_pipeline *p = a->p;
    qd_backend *be = p->be;
    qd_block_hooks hooks = {.ud = a, .input = moe_input, .override = moe_override};
    a->row0 = 0;
    a->loss = 0;
    for (int64_t s0 = 0; s0 < a->n_seq; s0 += p->batch_seqs) {
        int64_t nb = a->n_seq - s0 < p->batch_seqs ? a->n_seq - s0 : p->batch_seqs;
        size_t off = (size_t)(s0 * p->seq_len * p->hidden), n = (size_t)(nb * p->seq_len * p->hidden);
        float *y = a->ref_pass ? a->yref + off : a->ytmp;
        int rc = qd_block_forward_part(p->m, a->bw, QD_BLOCK_MLP, a->mid + off, y, nb, p->seq_len, NULL, &hooks, err);
        if (rc) return rc;
        if (!a->ref_pass) {
            double s = 0;
            if ((rc = be->ops->sq_diff_sum(be, y, a->yref + off, (int64_t)n, &s)))
                return qd_err_set(err, rc, "awq: MoE output error: %s", be->err.msg);
            a->loss += s;
        }
    }
    return 0;
}

static int moe_loss(void *user, qd_backend *be, const float *const *wq, int n_layers, double *loss, qd_err *err)
{
    awq_moe_ctx *a = user;
    (void)be;
    (void)n_layers;
    a->wq = wq;
    int rc = moe_pass(a, err);
    a->wq = NULL;
    *loss = a->loss;
    return rc;
}

int qd_pipeline_awq_moe_input(qd_pipeline *p, qd_block_weights *bw, int block, qd_err *err)
{
    qd_model *m = p->m;
    if (!qd_model_block_is_moe(m, block)) return 0;
    qd_backend *be = p->be;
    const int64_t K = p->hidden;
    awq_moe_ctx a;
    memset(&a, 0, sizeof a);
    a.p = p;
    a.bw = bw;
    a.err = err;
    a.g_in = -1;
    a.n_seq = (AWQ_SEARCH_TOKENS + p->seq_len - 1) / p->seq_len;
    if (a.n_seq > p->n_seq) a.n_seq = p->n_seq;
    a.rs = a.n_seq * p->seq_len;
    int nl = qd_model_n_linears(m), rc = 0;
    a.lis = malloc((size_t)nl * sizeof *a.lis);
    const float **ws = malloc((size_t)nl * sizeof *ws);
    int64_t *ns = malloc((size_t)nl * sizeof *ns);
    float *x_mean = malloc((size_t)K * sizeof *x_mean);
    size_t rows_bytes = (size_t)(a.rs * K) * sizeof(float);
    a.mid = qd_backend_alloc(be, rows_bytes);
    a.xin = qd_backend_alloc(be, rows_bytes);
    a.yref = qd_backend_alloc(be, rows_bytes);
    a.ytmp = qd_backend_alloc(be, (size_t)(p->batch_seqs * p->seq_len * K) * sizeof(float));
    if (!a.lis || !ws || !ns || !x_mean || !a.mid || !a.xin || !a.yref || !a.ytmp) {
        rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory for the MoE input search");
        goto out;
    }
    /* Every expert's gate and up: the linears of the expert input groups (two each; down's
     * group has one, whose fold is its own or, gpt-oss's, none). */
    for (int li = 0; li < nl; li++) {
        const qd_linear_info *L = qd_model_linear(m, li);
        const qd_input_group *G = qd_model_group(m, L->group);
        if (L->expert == -1 || G->n_linears != 2 || !qd_model_block_has_linear(m, block, li)) continue;
        if (a.g_in < 0 && L->expert >= 0) a.g_in = L->group;
        a.lis[a.n_lin] = li;
        ws[a.n_lin] = bw->w[li];
        ns[a.n_lin] = L->n;
        a.n_lin++;
    }
    if (a.n_lin == 0 || a.g_in < 0) goto out;
    /* The residual stream after the attention (already folded: the same function). */
    for (int64_t s0 = 0; s0 < a.n_seq && !rc; s0 += p->batch_seqs) {
        int64_t nb = a.n_seq - s0 < p->batch_seqs ? a.n_seq - s0 : p->batch_seqs;
        size_t off = (size_t)(s0 * p->seq_len * K);
        rc = qd_block_forward_part(m, bw, QD_BLOCK_ATTN, p->acts + off, a.mid + off, nb, p->seq_len, NULL, NULL, err);
    }
    /* The float half's output and the experts' input: every row reaches every expert's hooks
     * for this pass (the output still mixes only the routed experts). */
    qd_model_set_moe_calibrate_all(m, 1);
    a.ref_pass = 1;
    if (!rc) rc = moe_pass(&a, err);
    a.ref_pass = 0;
    qd_model_set_moe_calibrate_all(m, p->job->moe.calibrate_all_experts);
    if (!rc && a.row0 != a.rs)
        rc = qd_err_set(err, QD_EINVAL, "awq: the experts' input hook saw %lld of %lld rows", (long long)a.row0, (long long)a.rs);
    if (!rc) rc = qd_awq_x_mean(be, a.xin, a.rs, K, K, x_mean, err);
    qd_awq_scales sc;
    memset(&sc, 0, sizeof sc);
    if (!rc) {
        qd_awq_opts o = qd_awq_opts_default();
        o.duo_scaling = 1;
        rc = qd_awq_search_scales_cb(be, &p->qcfg, &o, ws, ns, a.n_lin, K, x_mean, moe_loss, &a, &sc, err);
    }
    if (!rc && !sc.identity) rc = qd_pipeline_fold(p, bw, -1, sc.s, K, err);
    if (!rc)
        QD_LOG(QD_LOG_DEBUG, "awq_scales", "block=%d group=experts.in linears=%d alpha=%.2f identity=%d loss=%.4g rtn_loss=%.4g",
               block, a.n_lin, sc.best_alpha, sc.identity, sc.best_loss, sc.rtn_loss);
    qd_awq_scales_free(&sc);
out:
    qd_backend_free(be, a.mid);
    qd_backend_free(be, a.xin);
    qd_backend_free(be, a.yref);
    qd_backend_free(be, a.ytmp);
    free(a.lis);
    free(ws);
    free(ns);
    free(x_mean);
    return rc;
}
