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
 * The Hessian of a group's inputs also gives each layer's relative output error. */
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "quant/pipeline/acts.h"
#include "quant/kernels/kernels.h"
#include "quant/tp/tp_pipeline.h"

/* Rows of each input group kept on the host for the per-layer kernel check, and the largest
 * kernel-vs-float error (relative to the output's max) accepted: the CPU kernels accumulate
 * in F32 like the float GEMM; CUDA's tensor-core path rounds x to F16 (~1e-3). */
#define KCHECK_ROWS 64
#define KCHECK_TOL 1e-2

typedef struct capture_ctx {
    qd_pipeline *p;
    int want[QD_MAX_GROUPS];          /* groups whose Hessian to accumulate */
    qd_gptq_hessian *acc[QD_MAX_GROUPS];
    float *xcap;                      /* backend [R, K] capture of group xcap_group, or NULL */
    int xcap_group;
    int64_t xcap_rows;                /* rows captured so far */
    int stop_after;                   /* stop the forward after this group's input (-1: never) */
    int stopped;
    float **slice;                    /* [QD_MAX_GROUPS] host [KCHECK_ROWS, K] or NULL */
    int64_t *slice_rows;
    qd_err *err;
} capture_ctx;

static int capture_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    capture_ctx *c = ud;
    (void)block;
    if (c->want[group] && c->acc[group]) {
        int rc = qd_gptq_hessian_add_dev(c->acc[group], x, rows, g->k, c->err);
        if (rc) return rc;
    }
    if (c->slice && c->want[group] && c->slice[group] && c->slice_rows[group] < KCHECK_ROWS) {
        qd_backend *be = c->p->be;
        int64_t take = KCHECK_ROWS - c->slice_rows[group];
        if (take > rows) take = rows;
        int rc = qd_backend_download(be, c->slice[group] + c->slice_rows[group] * g->k, x, (size_t)(take * g->k) * sizeof(float));
        if (rc) return qd_err_set(c->err, rc, "capture: %s", be->err.msg);
        c->slice_rows[group] += take;
    }
    if (c->xcap && group == c->xcap_group) {
        qd_backend *be = c->p->be;
        int rc = be->ops->copy(be, c->xcap + c->xcap_rows * g->k, x, (size_t)(rows * g->k) * sizeof(float));
        if (rc) return qd_err_set(c->err, rc, "capture: %s", be->err.msg);
        c->xcap_rows += rows;
    }
    if (group == c->stop_after) {
        c->stopped = 1;
        return QD_ECANCELLED;   /* ends this forward early; not an error (see run_batches) */
    }
    return 0;
}

/* Runs the block over every calibration batch: x = p->acts; y (backend, same shape) may be
 * NULL when only the hooks matter. */
static int run_batches(qd_pipeline *p, const qd_block_weights *bw, float *y, capture_ctx *c, qd_err *err)
{
    qd_block_hooks hooks = {.ud = c, .input = capture_input, .override = NULL};
    int64_t rows_per_seq = p->seq_len, hidden = p->hidden;
    for (int64_t s0 = 0; s0 < p->n_seq; s0 += p->batch_seqs) {
        int64_t nb = p->n_seq - s0 < p->batch_seqs ? p->n_seq - s0 : p->batch_seqs;
        const float *x = p->acts + s0 * rows_per_seq * hidden;
        float *out = y ? y + s0 * rows_per_seq * hidden : NULL;
        float *scratch = NULL;
        if (!out) {
            scratch = qd_backend_alloc(p->be, (size_t)(nb * rows_per_seq * hidden) * sizeof(float));
            if (!scratch) return qd_err_set(err, QD_ENOMEM, "block forward: out of memory");
            out = scratch;
        }
        if (c) c->stopped = 0;
        int rc = qd_block_forward(p->m, bw, x, out, nb, rows_per_seq, NULL, c ? &hooks : NULL, err);
        qd_backend_free(p->be, scratch);
        if (rc == QD_ECANCELLED && c && c->stopped) rc = 0;
        if (rc) return rc;
    }
    return 0;
}

static void ctx_init(capture_ctx *c, qd_pipeline *p, qd_err *err)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->stop_after = -1;
    c->xcap_group = -1;
    c->err = err;
}

/* ---- AWQ scale search and folding for one input group ----
 *
 * Each group's scales are scored, as AutoAWQ does, by the error of the module output the
 * group feeds, not by the group's own linear outputs: q/k/v by the attention output
 * (o_proj applied to the attention context, computed by running the block with the
 * candidate q/k/v weights substituted), gate/up by the MLP output down(silu(x Wg^T) *
 * (x Wu^T)). o and down (and OPT's fc1, whose output is followed by a plain activation)
 * keep their own output error. Scoring q/k/v by their own outputs ignores that the
 * softmax and o_proj weigh their errors very unequally, which made AWQ lose to RTN. */

/* Module-loss rows: AutoAWQ scores with all calibration tokens; beyond this many rows the
 * first whole sequences up to the bound are used (the search runs 20 forwards). */
#define AWQ_MODULE_MAX_ROWS ((int64_t)65536)
#define AWQ_CHUNK_ROWS ((int64_t)2048)

typedef struct awq_attn_ctx {
    capture_ctx c;                     /* first member: the input hook's user data */
    qd_pipeline *p;
    const qd_input_group *G;           /* attn_in */
    int g_out;                         /* attn_out group index (stop there) */
    int o_li;                          /* its linear (o_proj / out_proj) */
    const qd_block_weights *bw;
    const float *const *wq;            /* candidate effective q/k/v weights, NULL: float */
    float *yref;                       /* backend [Rs, hidden]: o_proj output of the float block */
    float *ytmp;                       /* backend [batch rows, hidden] scratch */
    float *ysink;                      /* backend [batch rows, hidden]: the forward's y */
    int64_t n_seq;                     /* calibration sequences scored */
    int64_t row0;                      /* rows of the current pass seen so far */
    int ref_pass;                      /* 1: fill yref; 0: accumulate loss */
    double loss;
} awq_attn_ctx;

static int awq_attn_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    awq_attn_ctx *a = ud;
    (void)block;
    if (group != a->g_out) return 0;
    qd_backend *be = a->p->be;
    const qd_linear_info *L = qd_model_linear(a->p->m, a->o_li);
    float *y = a->ref_pass ? a->yref + a->row0 * L->n : a->ytmp;
    int rc = qd_linear_forward(be, x, rows, a->bw->w[a->o_li], NULL, L->n, g->k, y);
    if (rc) return qd_err_set(a->c.err, rc, "awq: %s output: %s", L->name, be->err.msg);
    if (!a->ref_pass) {
        double s = 0;
        rc = be->ops->sq_diff_sum(be, y, a->yref + a->row0 * L->n, rows * L->n, &s);
        if (rc) return qd_err_set(a->c.err, rc, "awq: attention output error: %s", be->err.msg);
        a->loss += s;
    }
    a->row0 += rows;
    a->c.stopped = 1;
    return QD_ECANCELLED;   /* the rest of the block is not needed */
}

static int awq_attn_override(void *ud, int block, int linear, const float **w, const float **b)
{
    awq_attn_ctx *a = ud;
    (void)block;
    (void)b;
    if (!a->wq) return 0;
    for (int j = 0; j < a->G->n_linears; j++)
        if (a->G->linears[j] == linear) *w = a->wq[j];
    return 0;
}

/* Runs the block up to o_proj's input over the first n_seq calibration sequences. */
static int awq_attn_pass(awq_attn_ctx *a, int64_t n_seq, qd_err *err)
{
    qd_pipeline *p = a->p;
    qd_block_hooks hooks = {.ud = a, .input = awq_attn_input, .override = awq_attn_override};
    int64_t hidden = p->hidden;
    a->row0 = 0;
    a->loss = 0;
    for (int64_t s0 = 0; s0 < n_seq; s0 += p->batch_seqs) {
        int64_t nb = n_seq - s0 < p->batch_seqs ? n_seq - s0 : p->batch_seqs;
        const float *x = p->acts + s0 * p->seq_len * hidden;
        /* The forward writes y only after the attention, which the hook stops before. */
        a->c.stopped = 0;
        int rc = qd_block_forward(p->m, a->bw, x, a->ysink, nb, p->seq_len, NULL, &hooks, err);
        if (rc == QD_ECANCELLED && a->c.stopped) rc = 0;
        else if (!rc) rc = qd_err_set(err, QD_EINVAL, "awq: the block never reached the attention output's input");
        if (rc) return rc;
    }
    return 0;
}

static int awq_attn_loss(void *user, qd_backend *be, const float *const *wq, int n_layers, double *loss, qd_err *err)
{
    awq_attn_ctx *a = user;
    (void)be;
    (void)n_layers;
    a->wq = wq;
    a->ref_pass = 0;
    int rc = awq_attn_pass(a, a->n_seq, err);
    a->wq = NULL;
    *loss = a->loss;
    return rc;
}

typedef struct awq_mlp_ctx {
    qd_pipeline *p;
    const qd_block_weights *bw;
    const float *x;                    /* backend [rows, hidden] mlp_in input */
    int64_t rows, hidden, ff;
    int gate_j, up_j;                  /* positions of gate and up in the group */
    int gate_li, up_li, down_li;
    float *yref;                       /* backend [rows, hidden] float MLP output */
    float *hg, *hu, *y;                /* chunk scratch [chunk, ff] x2, [chunk, hidden] */
} awq_mlp_ctx;

/* MLP output for rows [r0, r0+nr) with gate/up weights wg/wu into dst. */
static int awq_mlp_chunk(awq_mlp_ctx *m, const float *wg, const float *wu, int64_t r0, int64_t nr, float *dst, qd_err *err)
{
    qd_backend *be = m->p->be;
    const float *x = m->x + r0 * m->hidden;
    int rc = qd_linear_forward(be, x, nr, wg, m->bw->b[m->gate_li], m->ff, m->hidden, m->hg);
    if (!rc) rc = qd_linear_forward(be, x, nr, wu, m->bw->b[m->up_li], m->ff, m->hidden, m->hu);
    if (!rc) rc = be->ops->silu_mul(be, m->hg, m->hg, m->hu, nr * m->ff);
    if (!rc) rc = qd_linear_forward(be, m->hg, nr, m->bw->w[m->down_li], NULL, m->hidden, m->ff, dst);
    if (rc) return qd_err_set(err, rc, "awq: MLP output: %s", be->err.msg);
    return 0;
}

static int awq_mlp_loss(void *user, qd_backend *be, const float *const *wq, int n_layers, double *loss, qd_err *err)
{
    awq_mlp_ctx *m = user;
    (void)n_layers;
    double sum = 0;
    for (int64_t r0 = 0; r0 < m->rows; r0 += AWQ_CHUNK_ROWS) {
        int64_t nr = m->rows - r0 < AWQ_CHUNK_ROWS ? m->rows - r0 : AWQ_CHUNK_ROWS;
        double s = 0;
        int rc = awq_mlp_chunk(m, wq[m->gate_j], wq[m->up_j], r0, nr, m->y, err);
        if (!rc && (rc = be->ops->sq_diff_sum(be, m->y, m->yref + r0 * m->hidden, nr * m->hidden, &s)))
            return qd_err_set(err, rc, "awq: MLP output error: %s", be->err.msg);
        if (rc) return rc;
        sum += s;
    }
    *loss = sum;
    return 0;
}

/* Which module loss applies to group g: 1 attention output, 2 llama MLP output, 0 own. */
static int awq_module_kind(qd_pipeline *p, const qd_input_group *G, int *g_out, int *li_out)
{
    if (!strcmp(G->name, "attn_in")) {
        for (int g = 0; g < qd_model_n_groups(p->m); g++) {
            const qd_input_group *O = qd_model_group(p->m, g);
            if (!strcmp(O->name, "attn_out") && O->n_linears == 1) {
                *g_out = g;
                *li_out = O->linears[0];
                return 1;
            }
        }
        return 0;
    }
    if (!strcmp(G->name, "mlp_in") && G->n_linears == 2 && !strcmp(qd_model_cfg(p->m)->activation, "silu") &&
        qd_model_linear_find(p->m, "mlp.down_proj") >= 0)
        return 2;
    return 0;
}

/* Scale search for group g with the module loss (or the layers' own loss) on the captured
 * input x [R, K]. */
static int awq_search_group(qd_pipeline *p, qd_block_weights *bw, int g, const float *x, int64_t R,
                            const qd_awq_opts *o, const float *const *ws, const int64_t *ns,
                            qd_awq_scales *sc, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    qd_backend *be = p->be;
    int64_t K = G->k, hidden = p->hidden;
    int g_out = -1, o_li = -1;
    int kind = awq_module_kind(p, G, &g_out, &o_li);
    if (kind == 0) return qd_awq_search_scales(be, &p->qcfg, o, ws, ns, G->n_linears, K, x, R, K, sc, err);
    float *x_mean = malloc((size_t)K * sizeof *x_mean);
    if (!x_mean) return qd_err_set(err, QD_ENOMEM, "awq: out of memory");
    int rc = qd_awq_x_mean(be, x, R, K, K, x_mean, err);
    int64_t n_seq = p->n_seq;
    if (n_seq * p->seq_len > AWQ_MODULE_MAX_ROWS) n_seq = AWQ_MODULE_MAX_ROWS / p->seq_len > 0 ? AWQ_MODULE_MAX_ROWS / p->seq_len : 1;
    int64_t rs = n_seq * p->seq_len;
    if (!rc && kind == 1) {
        awq_attn_ctx a;
        memset(&a, 0, sizeof a);
        ctx_init(&a.c, p, err);
        a.p = p;
        a.G = G;
        a.g_out = g_out;
        a.o_li = o_li;
        a.bw = bw;
        a.yref = qd_backend_alloc(be, (size_t)(rs * hidden) * sizeof(float));
        a.n_seq = n_seq;
        a.ytmp = qd_backend_alloc(be, (size_t)(p->batch_seqs * p->seq_len * hidden) * sizeof(float));
        a.ysink = qd_backend_alloc(be, (size_t)(p->batch_seqs * p->seq_len * hidden) * sizeof(float));
        if (!a.yref || !a.ytmp || !a.ysink) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory for the attention outputs");
        if (!rc) {
            a.ref_pass = 1;
            rc = awq_attn_pass(&a, n_seq, err);
        }
        if (!rc) rc = qd_awq_search_scales_cb(be, &p->qcfg, o, ws, ns, G->n_linears, K, x_mean, awq_attn_loss, &a, sc, err);
        qd_backend_free(be, a.yref);
        qd_backend_free(be, a.ytmp);
        qd_backend_free(be, a.ysink);
    } else if (!rc) {
        awq_mlp_ctx m;
        memset(&m, 0, sizeof m);
        m.p = p;
        m.bw = bw;
        m.x = x;
        m.rows = rs;
        m.hidden = K;
        m.down_li = qd_model_linear_find(p->m, "mlp.down_proj");
        m.gate_j = strstr(qd_model_linear(p->m, G->linears[0])->name, "gate") ? 0 : 1;
        m.up_j = 1 - m.gate_j;
        m.gate_li = G->linears[m.gate_j];
        m.up_li = G->linears[m.up_j];
        m.ff = qd_model_linear(p->m, m.gate_li)->n;
        int64_t ch = rs < AWQ_CHUNK_ROWS ? rs : AWQ_CHUNK_ROWS;
        m.yref = qd_backend_alloc(be, (size_t)(rs * K) * sizeof(float));
        m.hg = qd_backend_alloc(be, (size_t)(ch * m.ff) * sizeof(float));
        m.hu = qd_backend_alloc(be, (size_t)(ch * m.ff) * sizeof(float));
        m.y = qd_backend_alloc(be, (size_t)(ch * K) * sizeof(float));
        if (!m.yref || !m.hg || !m.hu || !m.y) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory for the MLP outputs");
        for (int64_t r0 = 0; r0 < rs && !rc; r0 += AWQ_CHUNK_ROWS) {
            int64_t nr = rs - r0 < AWQ_CHUNK_ROWS ? rs - r0 : AWQ_CHUNK_ROWS;
            rc = awq_mlp_chunk(&m, bw->w[m.gate_li], bw->w[m.up_li], r0, nr, m.yref + r0 * K, err);
        }
        if (!rc) rc = qd_awq_search_scales_cb(be, &p->qcfg, o, ws, ns, G->n_linears, K, x_mean, awq_mlp_loss, &m, sc, err);
        qd_backend_free(be, m.yref);
        qd_backend_free(be, m.hg);
        qd_backend_free(be, m.hu);
        qd_backend_free(be, m.y);
    }
    free(x_mean);
    return rc;
}

static int awq_group_scales(qd_pipeline *p, qd_block_weights *bw, int block, int g,
                            const qd_linear_plan *plans, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    qd_backend *be = p->be;
    int n_q = 0;
    for (int j = 0; j < G->n_linears; j++) n_q += plans[G->linears[j]].quantize;
    if (n_q == 0) return 0;
    if (G->prev_kind == QD_PREV_NONE) return 0;
    if (G->prev_kind == QD_PREV_LINEAR) {
        const qd_linear_info *prev = qd_model_linear(p->m, G->prev_index);
        if (prev->n != G->k) {
            if (!p->st.awq_note[0])
                snprintf(p->st.awq_note, sizeof p->st.awq_note,
                         "%s -> %s scaling skipped: shapes differ under grouped-query attention (as AutoAWQ)",
                         prev->name, qd_model_linear(p->m, G->linears[0])->name);
            return 0;
        }
    }
    int64_t R = p->n_seq * p->seq_len, K = G->k;
    float *x = qd_backend_alloc(be, (size_t)(R * K) * sizeof(float));
    if (!x) return qd_err_set(err, QD_ENOMEM, "awq: out of memory for [%lld, %lld] activations", (long long)R, (long long)K);
    capture_ctx c;
    ctx_init(&c, p, err);
    c.xcap = x;
    c.xcap_group = g;
    c.stop_after = g;
    int rc = run_batches(p, bw, NULL, &c, err);
    const float *ws[QD_MAX_GROUP_LINEARS];
    int64_t ns[QD_MAX_GROUP_LINEARS];
    float *host = NULL;
    qd_awq_scales sc;
    memset(&sc, 0, sizeof sc);
    for (int j = 0; j < G->n_linears && !rc; j++) {
        const qd_linear_info *L = qd_model_linear(p->m, G->linears[j]);
        ns[j] = L->n;
        ws[j] = bw->w[G->linears[j]];   /* backend memory owned by the block */
    }
    if (!rc) {
        qd_awq_opts o = qd_awq_opts_default();
        /* AutoAWQ's duo scaling: measured lower perplexity than the paper's x_mean^alpha
         * (tiny-llama-c4 w3g128: 29.86 vs 30.06), see bench/results/quality.md. */
        o.duo_scaling = 1;
        rc = awq_search_group(p, bw, g, x, R, &o, ws, ns, &sc, err);
    }
    if (!rc && sc.best_alpha > 0) {
        /* Fold: the layers' input channels *= s, the previous operator's outputs /= s. */
        host = malloc((size_t)K * sizeof(float) * 2);
        if (!host) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory");
        for (int j = 0; j < G->n_linears && !rc; j++) {
            rc = be->ops->scale_cols(be, bw->w[G->linears[j]], ns[j], K, sc.s, 0);
            if (rc) rc = qd_err_set(err, rc, "awq: %s", be->err.msg);
        }
        if (!rc && G->prev_kind == QD_PREV_NORM) {
            float *nw = host, *nb = host + K;
            int has_b = qd_model_norm_has_bias(p->m);
            rc = qd_block_norm_get(p->m, bw, G->prev_index, nw, has_b ? nb : NULL, err);
            for (int64_t i = 0; i < K && !rc; i++) { nw[i] /= sc.s[i]; if (has_b) nb[i] /= sc.s[i]; }
            if (!rc) rc = qd_block_norm_set(p->m, bw, G->prev_index, nw, has_b ? nb : NULL, err);
        } else if (!rc && G->prev_kind == QD_PREV_LINEAR) {
            const qd_linear_info *prev = qd_model_linear(p->m, G->prev_index);
            float *pw = malloc((size_t)(prev->n * prev->k) * sizeof(float));
            float *pb = prev->has_bias ? host : NULL;
            if (!pw) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory");
            if (!rc) rc = qd_block_linear_get(p->m, bw, G->prev_index, pw, pb, err);
            for (int64_t r = 0; r < prev->n && !rc; r++) {
                for (int64_t cix = 0; cix < prev->k; cix++) pw[r * prev->k + cix] /= sc.s[r];
                if (pb) pb[r] /= sc.s[r];
            }
            if (!rc) rc = qd_block_linear_set(p->m, bw, G->prev_index, pw, pb, err);
            free(pw);
        }
        QD_LOG(QD_LOG_DEBUG, "awq_scales", "block=%d group=%s alpha=%.2f loss=%.4g rtn_loss=%.4g", block, G->name,
               sc.best_alpha, sc.best_loss, sc.rtn_loss);
    }
    free(host);
    qd_awq_scales_free(&sc);
    qd_backend_free(be, x);
    return rc;
}

/* ---- quantizing one group ---- */

static int quantize_group(qd_pipeline *p, qd_block_weights *bw, int block, int g,
                          const qd_linear_plan *plans, qd_gptq_hessian *acc, const float *xcap,
                          const float *kslice, int64_t kslice_rows, qd_linear_out *outs, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    const qp_job *job = p->job;
    int use_gptq = job->method == QP_METHOD_GPTQ || job->method == QP_METHOD_AWQ_GPTQ;
    int use_awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    int64_t R = p->n_seq * p->seq_len;
    char prefix[160];
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    int rc = 0;
    for (int j = 0; j < G->n_linears && !rc; j++) {
        int li = G->linears[j];
        const qd_linear_info *L = qd_model_linear(p->m, li);
        qd_linear_out *o = &outs[li];
        size_t nk = (size_t)(L->n * L->k);
        o->w_eff = malloc(nk * sizeof(float));
        if (L->has_bias) o->bias = malloc((size_t)L->n * sizeof(float));
        if (!o->w_eff || (L->has_bias && !o->bias)) return qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name);
        rc = qd_block_linear_get(p->m, bw, li, o->w_eff, o->bias, err);
        if (rc) return rc;
        qd_layer_result res;
        memset(&res, 0, sizeof res);
        snprintf(res.name, sizeof res.name, "%s%s", prefix, L->name);
        res.block = block;
        res.n = L->n;
        res.k = L->k;
        if (!plans[li].quantize) {
            snprintf(res.method, sizeof res.method, "float");
            snprintf(res.note, sizeof res.note, "%s", plans[li].why);
            QD_LOG(QD_LOG_WARN, "layer_left_in_float", "layer=%s reason=\"%s\"", res.name, plans[li].why);
            o->w_float = o->w_eff;   /* stored as float; the block keeps computing with it */
            o->weight_modified = use_awq;
            o->bias_modified = use_awq;
            rc = qd_state_add_layer(&p->st, &res);
            continue;
        }
        snprintf(res.method, sizeof res.method, "%s", qp_method_name(job->method));
        qd_pipeline_report_progress(p, "quantize", block, L->name, (double)li / qd_model_n_linears(p->m), -1);
        /* AWQ clipping (AutoAWQ skips q and k, whose outputs meet in the softmax). */
        float *wq = o->w_eff;
        float *clipped = NULL;
        if (use_awq && xcap && !strstr(L->name, "q_proj") && !strstr(L->name, "k_proj")) {
            qd_awq_opts ao = qd_awq_opts_default();
            qd_awq_clip clip;
            memset(&clip, 0, sizeof clip);
            rc = qd_awq_search_clip(p->be, &p->qcfg, &ao, bw->w[li], L->n, L->k, xcap, R, L->k, NULL, &clip, err);
            if (!rc) {
                clipped = malloc(nk * sizeof(float));
                if (!clipped) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
                else {
                    memcpy(clipped, o->w_eff, nk * sizeof(float));
                    rc = qd_awq_apply(NULL, &clip, clipped, L->n, L->k, err);
                    wq = clipped;
                }
            }
            qd_awq_clip_free(&clip);
            if (rc) return rc;
        }
        float *deq = malloc(nk * sizeof(float));
        if (!deq) { free(clipped); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
        qd_qlayer layer;
        rc = qd_pipeline_quantize_weight(p, use_gptq, wq, L->n, L->k, acc, &layer, deq, &res, err);
        free(clipped);
        if (rc) { free(deq); return qd_err_prefix(err, "%s", res.name); }
        if (o->bias) {
            layer.bias = malloc((size_t)L->n * sizeof(float));
            if (!layer.bias) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
            else memcpy(layer.bias, o->bias, (size_t)L->n * sizeof(float));
        }
        if (!rc) rc = p->fmt->check(&layer, err);
        if (!rc) rc = p->fmt->pack(&layer, &o->packed, err);
        qd_qlayer_free(&layer);
        if (rc) { free(deq); return qd_err_prefix(err, "%s", res.name); }
        o->quantized = 1;
        /* The error is measured against the weight before clipping (clipping is part of
         * the quantization error). */
        rc = qd_pipeline_rel_error(p, o->w_eff, deq, L->n, L->k, acc, &res.rel_error, err);
        if (rc) { free(deq); return rc; }
        if (!isfinite(res.rel_error)) { free(deq); return qd_err_set(err, QD_ENUMERIC, "%s: quantization error is not finite", res.name); }
        if (job->kernel_check && kslice && kslice_rows > 0) {
            /* The packed weights through the dequantizing kernel vs the float matmul of
             * what they decode to, on real inputs of this layer. */
            rc = qd_kernel_check_layer(p->be, p->fmt, &o->packed, kslice, kslice_rows, &res.kernel_max_err, err);
            if (rc) { free(deq); return qd_err_prefix(err, "%s: kernel check", res.name); }
            res.kernel_checked = 1;
            if (!(res.kernel_max_err <= KCHECK_TOL)) {
                free(deq);
                return qd_err_set(err, QD_EBACKEND, "%s: kernel check failed: the %s kernel differs from the reference by %.3g (relative), over %.0e",
                                  res.name, p->be->name, res.kernel_max_err, KCHECK_TOL);
            }
        }
        free(o->w_eff);
        o->w_eff = deq;
        rc = qd_block_linear_set(p->m, bw, li, deq, NULL, err);
        if (!rc) rc = qd_state_add_layer(&p->st, &res);
        qd_pipeline_report_progress(p, "quantize", block, L->name, (double)(li + 1) / qd_model_n_linears(p->m), res.rel_error);
        QD_LOG(QD_LOG_INFO, "layer_done", "layer=%s method=%s rel_error=%.5f seconds=%.3f%s%s", res.name, res.method,
               res.rel_error, res.seconds, res.note[0] ? " note=" : "", res.note);
    }
    return rc;
}

/* ---- the block file: every tensor of block i as the output will hold it ---- */

typedef struct blockfile {
    st_writer *w;
    void **bufs;       /* converted copies to free after writing */
    size_t n_bufs, cap_bufs;
} blockfile;

static void *bf_keep(blockfile *b, void *ptr)
{
    if (!ptr) return NULL;
    if (b->n_bufs == b->cap_bufs) {
        size_t cap = b->cap_bufs ? 2 * b->cap_bufs : 32;
        void **nb = realloc(b->bufs, cap * sizeof *nb);
        if (!nb) { free(ptr); return NULL; }
        b->bufs = nb;
        b->cap_bufs = cap;
    }
    b->bufs[b->n_bufs++] = ptr;
    return ptr;
}

/* Adds host F32 data converted to dtype (F32, F16 or BF16). */
static int bf_add_f32(blockfile *b, const char *name, qd_dtype dtype, int ndim, const int64_t *shape,
                      const float *src, size_t n, qd_err *err)
{
    if (dtype != QD_DTYPE_F32 && dtype != QD_DTYPE_F16 && dtype != QD_DTYPE_BF16) dtype = QD_DTYPE_F32;
    void *buf = bf_keep(b, malloc(n * qd_dtype_size(dtype) + 1));
    if (!buf) return qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_convert_from_f32(dtype, src, buf, n);
    return st_writer_add(b->w, name, dtype, ndim, shape, buf, err);
}

static int write_block_file(qd_pipeline *p, qd_block_weights *bw, int block, qd_linear_out *outs,
                            const int *norm_modified, const char *path, qd_err *err)
{
    const st_model *sm = qd_model_tensors(p->m);
    char prefix[160], name[320];
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    size_t plen = strlen(prefix);
    blockfile b = {0};
    /* tp_aware jobs: reorder the MLP pair now, after the forward used the plain weights. */
    int rc = qd_tp_layout_apply_block(p, block, outs, err);
    if (rc) return rc;
    rc = st_writer_init(&b.w);
    if (rc) return qd_err_set(err, rc, "out of memory");
    int nl = qd_model_n_linears(p->m);
    /* Packed and modified tensors first; remember which source names they replace. */
    for (int li = 0; li < nl && !rc; li++) {
        const qd_linear_info *L = qd_model_linear(p->m, li);
        qd_linear_out *o = &outs[li];
        if (o->quantized) {
            qd_packed *pk = &o->packed;
            snprintf(name, sizeof name, "%s%s.qweight", prefix, L->name);
            rc = st_writer_add(b.w, name, QD_DTYPE_I32, 2, pk->qweight_shape, pk->qweight, err);
            snprintf(name, sizeof name, "%s%s.qzeros", prefix, L->name);
            if (!rc) rc = st_writer_add(b.w, name, QD_DTYPE_I32, 2, pk->qzeros_shape, pk->qzeros, err);
            snprintf(name, sizeof name, "%s%s.scales", prefix, L->name);
            if (!rc) rc = st_writer_add(b.w, name, QD_DTYPE_F16, 2, pk->scales_shape, pk->scales, err);
            if (!rc && pk->g_idx) {
                snprintf(name, sizeof name, "%s%s.g_idx", prefix, L->name);
                rc = st_writer_add(b.w, name, QD_DTYPE_I32, 1, &pk->g_idx_len, pk->g_idx, err);
            }
            if (!rc && pk->bias) {
                snprintf(name, sizeof name, "%s%s.bias", prefix, L->name);
                rc = st_writer_add(b.w, name, QD_DTYPE_F16, 1, &pk->bias_len, pk->bias, err);
            }
        } else {
            snprintf(name, sizeof name, "%s%s.weight", prefix, L->name);
            const st_tensor *src = st_model_find(sm, name);
            if (!src) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
            if (o->weight_modified) {
                int64_t shape[2] = {L->n, L->k};
                rc = bf_add_f32(&b, name, src->dtype, 2, shape, o->w_float, (size_t)(L->n * L->k), err);
            } else {
                rc = st_writer_add(b.w, name, src->dtype, src->ndim, src->shape, src->data, err);
            }
            if (!rc && L->has_bias) {
                snprintf(name, sizeof name, "%s%s.bias", prefix, L->name);
                src = st_model_find(sm, name);
                if (!src) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
                if (o->bias_modified && o->bias)
                    rc = bf_add_f32(&b, name, src->dtype, 1, &L->n, o->bias, (size_t)L->n, err);
                else
                    rc = st_writer_add(b.w, name, src->dtype, src->ndim, src->shape, src->data, err);
            }
        }
    }
    /* Norms changed by AWQ folding. */
    for (int ni = 0; ni < QD_MAX_NORMS && !rc; ni++) {
        if (!norm_modified[ni]) continue;
        int64_t hidden = p->hidden;
        float *wv = bf_keep(&b, malloc((size_t)hidden * sizeof(float) * 2));
        if (!wv) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
        int has_b = qd_model_norm_has_bias(p->m);
        rc = qd_block_norm_get(p->m, bw, ni, wv, has_b ? wv + hidden : NULL, err);
        for (int part = 0; part < 1 + has_b && !rc; part++) {
            snprintf(name, sizeof name, "%s%s.%s", prefix, qd_model_norm_name(p->m, ni), part ? "bias" : "weight");
            const st_tensor *src = st_model_find(sm, name);
            if (!src) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
            rc = bf_add_f32(&b, name, src->dtype, 1, &hidden, wv + part * hidden, (size_t)hidden, err);
        }
    }
    /* Every other tensor of the block is copied bit-exactly. */
    for (size_t i = 0; i < st_model_count(sm) && !rc; i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        if (strncmp(t->name, prefix, plen) != 0) continue;
        const char *rest = t->name + plen;
        int taken = 0;
        for (int li = 0; li < nl && !taken; li++) {
            const char *ln = qd_model_linear(p->m, li)->name;
            size_t l = strlen(ln);
            if (strncmp(rest, ln, l) == 0 && (!strcmp(rest + l, ".weight") || !strcmp(rest + l, ".bias"))) taken = 1;
        }
        for (int ni = 0; ni < QD_MAX_NORMS && !taken; ni++) {
            if (!norm_modified[ni]) continue;
            const char *nn = qd_model_norm_name(p->m, ni);
            size_t l = strlen(nn);
            if (strncmp(rest, nn, l) == 0 && rest[l] == '.') taken = 1;
        }
        if (!taken) rc = st_writer_add(b.w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
    }
    if (!rc) rc = st_writer_write(b.w, path, err);
    st_writer_free(b.w);
    for (size_t i = 0; i < b.n_bufs; i++) free(b.bufs[i]);
    free(b.bufs);
    return rc;
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

int qd_pipeline_run_block_impl(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    int block = p->st.next_block;
    double t0 = qd_pipeline_now();
    int nl = qd_model_n_linears(p->m), ng = qd_model_n_groups(p->m);
    int use_awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    int sequential = use_awq || (job->method == QP_METHOD_GPTQ && job->true_sequential);
    qd_linear_plan plans[QD_MAX_LINEARS];
    qd_linear_out outs[QD_MAX_LINEARS];
    qd_gptq_hessian acc[QD_MAX_GROUPS];
    int norm_modified[QD_MAX_NORMS] = {0};
    memset(outs, 0, sizeof outs);
    memset(acc, 0, sizeof acc);
    qd_block_weights *bw = NULL;
    float *xcap = NULL, *y = NULL;
    float *kslice[QD_MAX_GROUPS] = {0};
    int64_t kslice_rows[QD_MAX_GROUPS] = {0};
    if (job->kernel_check) {
        for (int g = 0; g < ng; g++) {
            kslice[g] = malloc((size_t)(KCHECK_ROWS * qd_model_group(p->m, g)->k) * sizeof(float));
            if (!kslice[g]) {
                for (int h = 0; h < g; h++) free(kslice[h]);
                return qd_err_set(err, QD_ENOMEM, "out of memory for kernel-check inputs");
            }
        }
    }
    int rc = qd_pipeline_report_progress(p, "load", block, NULL, 0.0, -1);
    if (rc) rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    if (!rc) rc = qd_block_load(p->m, block, &bw, err);
    if (rc) {
        for (int g = 0; g < ng; g++) free(kslice[g]);
        return rc;
    }
    for (int li = 0; li < nl; li++) qd_pipeline_plan_linear(p, block, li, &plans[li]);

    if (use_awq) {
        for (int g = 0; g < ng && !rc; g++) {
            rc = awq_group_scales(p, bw, block, g, plans, err);
            const qd_input_group *G = qd_model_group(p->m, g);
            if (!rc && G->prev_kind == QD_PREV_NORM) norm_modified[G->prev_index] = 1;
        }
        /* Linears that fed a later group's scales changed too. */
        for (int g = 0; g < ng; g++) {
            const qd_input_group *G = qd_model_group(p->m, g);
            for (int j = 0; j < G->n_linears; j++) outs[G->linears[j]].weight_modified = 1;
        }
    }
    if (!rc && !sequential) {
        capture_ctx c;
        ctx_init(&c, p, err);
        c.slice = kslice;
        c.slice_rows = kslice_rows;
        for (int g = 0; g < ng && !rc; g++) {
            rc = qd_gptq_hessian_init(&acc[g], p->be, qd_model_group(p->m, g)->k, err);
            c.want[g] = 1;
            c.acc[g] = &acc[g];
        }
        if (!rc) rc = qd_pipeline_report_progress(p, "calibrate", block, NULL, 0.0, -1) ? QD_ECANCELLED : 0;
        if (!rc) rc = run_batches(p, bw, NULL, &c, err);
    }
    for (int g = 0; g < ng && !rc; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        if (sequential) {
            capture_ctx c;
            ctx_init(&c, p, err);
            c.slice = kslice;
            c.slice_rows = kslice_rows;
            rc = qd_gptq_hessian_init(&acc[g], p->be, G->k, err);
            c.want[g] = 1;
            c.acc[g] = &acc[g];
            c.stop_after = g;
            if (use_awq && !rc) {
                int64_t R = p->n_seq * p->seq_len;
                xcap = qd_backend_alloc(p->be, (size_t)(R * G->k) * sizeof(float));
                if (!xcap) rc = qd_err_set(err, QD_ENOMEM, "out of memory for [%lld, %lld] activations", (long long)R, (long long)G->k);
                c.xcap = xcap;
                c.xcap_group = g;
            }
            if (!rc) rc = qd_pipeline_report_progress(p, "calibrate", block, G->name, (double)g / ng, -1) ? QD_ECANCELLED : 0;
            if (!rc) rc = run_batches(p, bw, NULL, &c, err);
        }
        if (!rc) rc = quantize_group(p, bw, block, g, plans, &acc[g], xcap, kslice[g], kslice_rows[g], outs, err);
        qd_backend_free(p->be, xcap);
        xcap = NULL;
        qd_gptq_hessian_free(&acc[g]);
    }
    for (int g = 0; g < ng; g++) qd_gptq_hessian_free(&acc[g]);
    /* The next block's inputs, computed by the quantized block. */
    if (!rc) {
        rc = qd_pipeline_report_progress(p, "forward", block, NULL, 1.0, -1) ? QD_ECANCELLED : 0;
        size_t bytes = (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float);
        if (!rc) {
            y = qd_backend_alloc(p->be, bytes);
            if (!y) rc = qd_err_set(err, QD_ENOMEM, "out of memory for the next block's inputs");
        }
        if (!rc) rc = run_batches(p, bw, y, NULL, err);
    }
    /* Commit: block tensors, next inputs, then state.json. */
    char path[QD_PATH_MAX + 64];
    if (!rc) {
        rc = qd_pipeline_report_progress(p, "checkpoint", block, NULL, 1.0, -1) ? QD_ECANCELLED : 0;
        if (!rc && p->hooks.before_commit && p->hooks.before_commit(p->hooks.ud, block))
            rc = qd_err_set(err, QD_ECANCELLED, "block %d: checkpoint commit refused (lease lost or cancelled)", block);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/block-%03d.safetensors", p->ckpt_dir, block);
        rc = write_block_file(p, bw, block, outs, norm_modified, path, err);
    }
    if (!rc && block + 1 < p->n_blocks) {
        size_t n = (size_t)(p->n_seq * p->seq_len * p->hidden);
        float *host = malloc(n * sizeof(float));
        if (!host) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        if (!rc) rc = qd_backend_download(p->be, host, y, n * sizeof(float));
        snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, block + 1);
        if (!rc) rc = qd_acts_write(path, host, p->n_seq * p->seq_len, p->hidden, err);
        free(host);
    }
    if (!rc) {
        double secs = qd_pipeline_now() - t0;
        p->st.seconds += secs;
        p->st.next_block = block + 1;
        if (p->hooks.fence) p->st.fence = p->hooks.fence;
        snprintf(path, sizeof path, "%s/state.json", p->ckpt_dir);
        rc = qd_state_save(path, &p->st, err);
        if (!rc) {
            snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, block);
            remove(path);
            qd_backend_free(p->be, p->acts);
            p->acts = y;
            y = NULL;
            p->block_seconds_sum += secs;
            p->blocks_this_run++;
            QD_LOG(QD_LOG_INFO, "block_done", "job=%s block=%d/%d seconds=%.2f", job->id, block + 1, p->n_blocks, secs);
        }
    }
    if (rc) {
        /* Drop the layers this failed block added, so a retry does not list them twice. */
        while (p->st.n_layers && p->st.layers[p->st.n_layers - 1].block == block) p->st.n_layers--;
    }
    qd_backend_free(p->be, y);
    for (int g = 0; g < ng; g++) free(kslice[g]);
    outs_free(outs, nl);
    qd_block_free(p->m, bw);
    return rc;
}
