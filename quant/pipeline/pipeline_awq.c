/* AWQ inside the pipeline: the per-group scale search with module-level objectives and the
 * folding of the chosen scales into the previous operator (see the comment below). */
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"

/* ---- AWQ scale search and folding for one input group ----
 *
 * Each group's scales are scored, as AutoAWQ does, by the error of the module output the
 * group feeds, not by the group's own linear outputs: q/k/v by the attention output
 * (o_proj applied to the attention context, computed by running the block with the
 * candidate q/k/v weights substituted), gate/up by the MLP output down(silu(x Wg^T) *
 * (x Wu^T)). o and down (and OPT's fc1, whose output is followed by a plain activation)
 * keep their own output error. Scoring q/k/v by their own outputs ignores that the
 * softmax and o_proj weigh their errors very unequally, which made AWQ lose to RTN. */

/* The module losses (q/k/v through the attention, gate/up through the MLP) are scored on
 * the first whole calibration sequences holding at least this many tokens (all of them when
 * there are fewer). Each of the 21 candidates runs the module over these rows, so this bound
 * sets AWQ's cost: over every token (AutoAWQ's choice) the search was ~10x GPTQ's time per
 * block on the CPU. x_mean, which forms the candidates, and o_proj's and down_proj's
 * own-output losses (Gram form, awq.c) come from the job's awq.stats_tokens (8192 by
 * default, 0: every token), whose float forward of the block is the other large cost. The
 * chosen scale is insensitive to both subsamples: on tiny-llama-c4 and stories260K (64 x 512
 * tokens) the loss over all tokens of the scale chosen on 2048 differs from the best by a
 * small fraction of AWQ's gain over RTN, and on SmolLM2-135M (128 x 512) statistics from
 * 4096, 8192 or 16384 tokens give the perplexity and KL of every token's
 * (bench/results/awq-speed.md). */
#define AWQ_CHUNK_ROWS ((int64_t)2048)

typedef struct awq_attn_ctx {
    qd_capture_ctx c;                     /* first member: the input hook's user data */
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
    int rc = qd_model_linear_forward(a->p->m, x, rows, a->bw->w[a->o_li], NULL, L->n, g->k, y);
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
    int fused;                         /* Phi-3: one gate_up linear, gate rows then up rows */
    int gelu;                          /* Gemma's tanh-GeGLU instead of SwiGLU */
    float gate_mul;                    /* Falcon-H1: gate_proj's output times this before the activation */
    float *yref;                       /* backend [rows, hidden] float MLP output */
    float *hg, *hu, *y;                /* chunk scratch [chunk, ff] x2, [chunk, hidden] */
} awq_mlp_ctx;

/* MLP output for rows [r0, r0+nr) with gate/up weights wg/wu into dst. */
static int awq_mlp_chunk(awq_mlp_ctx *m, const float *wg, const float *wu, int64_t r0, int64_t nr, float *dst, qd_err *err)
{
    qd_backend *be = m->p->be;
    const float *x = m->x + r0 * m->hidden;
    const float *bg = m->bw->b[m->gate_li], *bu = m->bw->b[m->up_li];
    if (m->fused) {
        /* wg is the whole [2 FF, hidden] gate_up_proj: its up half follows the gate half. */
        wu = wg + m->ff * m->hidden;
        bu = bg ? bg + m->ff : NULL;
    }
    int rc = qd_model_linear_forward(m->p->m, x, nr, wg, bg, m->ff, m->hidden, m->hg);
    if (!rc) rc = qd_model_linear_forward(m->p->m, x, nr, wu, bu, m->ff, m->hidden, m->hu);
    if (!rc && m->gate_mul != 1.0f) rc = be->ops->scale(be, m->hg, nr * m->ff, m->gate_mul);
    if (!rc) rc = m->gelu ? be->ops->gelu_tanh_mul(be, m->hg, m->hg, m->hu, nr * m->ff)
                          : be->ops->silu_mul(be, m->hg, m->hg, m->hu, nr * m->ff);
    if (!rc) rc = qd_model_linear_forward(m->p->m, m->hg, nr, m->bw->w[m->down_li], NULL, m->hidden, m->ff, dst);
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
                /* Phi's parallel block: fc1 shares q/k/v's input group, and the attention
                 * output would not score it; such a group keeps its own outputs' error. */
                for (int j = 0; j < G->n_linears; j++)
                    if (G->linears[j] > O->linears[0]) return 0;
                *g_out = g;
                *li_out = O->linears[0];
                return 1;
            }
        }
        return 0;
    }
    /* The gated MLP of the llama family: gate and up (or Phi-3's fused gate_up), then down
     * (the mlp_out group's linear), with SwiGLU or Gemma's tanh-GeGLU. A plain MLP's fc1
     * (StarCoder2, GPT-NeoX), as OPT's, keeps its own outputs' error. */
    const qd_model_config *mc = qd_model_cfg(p->m);
    if (!strcmp(G->name, "mlp_in") && qd_model_mlp_gated(p->m) && (G->n_linears == 2 || G->n_linears == 1) &&
        (!strcmp(mc->activation, "silu") || !strcmp(mc->activation, "gelu_pytorch_tanh"))) {
        for (int g = 0; g < qd_model_n_groups(p->m); g++) {
            const qd_input_group *O = qd_model_group(p->m, g);
            if (!strcmp(O->name, "mlp_out") && O->n_linears == 1) {
                *li_out = O->linears[0];
                return 2;
            }
        }
    }
    return 0;
}

/* What the search of one group needs from the calibration pass: x_mean over every row, and
 * by kind: the Gram matrix of its input (own loss, kind 0, from the one-pass capture), or
 * its input's rows (kind 0 from a group's own capture; kind 2: at least the subsample). */
typedef struct awq_inputs {
    const float *x_mean;               /* host [K] */
    const qd_gptq_hessian *h;          /* kind 0: (2 / rows) X^T X, or NULL: use x */
    const float *x;                    /* backend [rows, K] */
    int64_t rows;
} awq_inputs;

/* Scale search for group g with the module loss (or the layers' own loss). */
static int awq_search_group(qd_pipeline *p, qd_block_weights *bw, int g, const awq_inputs *in,
                            const qd_awq_opts *o, const float *const *ws, const int64_t *ns,
                            qd_awq_scales *sc, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    qd_backend *be = p->be;
    int64_t K = G->k, hidden = p->hidden;
    int g_out = -1, o_li = -1;
    int kind = awq_module_kind(p, G, &g_out, &o_li);
    if (kind == 0 && in->h)
        return qd_awq_search_scales_h(be, &p->qcfg, o, ws, ns, G->n_linears, K, in->x_mean, in->h, sc, err);
    if (kind == 0) return qd_awq_search_scales(be, &p->qcfg, o, ws, ns, G->n_linears, K, in->x, in->rows, K, sc, err);
    const float *x_mean = in->x_mean;
    int rc = 0;
    int64_t n_seq = (AWQ_SEARCH_TOKENS + p->seq_len - 1) / p->seq_len;
    if (n_seq > p->n_seq) n_seq = p->n_seq;
    int64_t rs = n_seq * p->seq_len;
    if (kind == 1) {
        awq_attn_ctx a;
        memset(&a, 0, sizeof a);
        qd_capture_init(&a.c, p, err);
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
    } else {
        awq_mlp_ctx m;
        memset(&m, 0, sizeof m);
        m.p = p;
        m.bw = bw;
        m.x = in->x;
        m.rows = rs < in->rows ? rs : in->rows;
        rs = m.rows;
        m.hidden = K;
        m.down_li = o_li;
        m.fused = G->n_linears == 1;
        m.gelu = !strcmp(qd_model_cfg(p->m)->activation, "gelu_pytorch_tanh");
        /* Falcon-H1's gate multiplier (its down multiplier scales the loss alike for every
         * candidate, so it is left out). */
        m.gate_mul = qd_model_cfg(p->m)->layout == QD_LAYOUT_FALCON_H1 ? qd_model_cfg(p->m)->falcon.mlp_gate : 1.0f;
        m.gate_j = m.fused || strstr(qd_model_linear(p->m, G->linears[0])->name, "gate") ? 0 : 1;
        m.up_j = m.fused ? 0 : 1 - m.gate_j;
        m.gate_li = G->linears[m.gate_j];
        m.up_li = G->linears[m.up_j];
        m.ff = qd_model_linear(p->m, m.gate_li)->n / (m.fused ? 2 : 1);
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
    return rc;
}

/* Whether group g gets scales (some linear quantized, an operator to fold into, and for a
 * previous linear of other width: grouped-query attention), recording how v -> o was
 * treated; *tie (owned by the caller, NULL when none) ties o_proj's channels per KV head. */
static int awq_group_wanted(qd_pipeline *p, int g, const qd_linear_plan *plans, int32_t **tie, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    *tie = NULL;
    int n_q = 0;
    for (int j = 0; j < G->n_linears; j++) n_q += plans[G->linears[j]].quantize;
    if (n_q == 0) return 0;
    if (G->prev_kind == QD_PREV_NONE) return 0;
    int64_t K = G->k, rep = 1;
    const qd_model_config *mc = qd_model_cfg(p->m);
    if (G->prev_kind == QD_PREV_LINEAR) {
        const qd_linear_info *prev = qd_model_linear(p->m, G->prev_index);
        if (G->prev_rows != G->k) {
            /* Grouped-query attention: v_proj's output channel (kv, d) feeds o_proj's input
             * channels (h, d) of the heads h = kv * rep .. kv * rep + rep - 1 (HF's
             * repeat_kv). One scale per KV channel keeps the fold exact. */
            int gqa = mc->n_kv_heads > 0 && mc->n_heads % mc->n_kv_heads == 0 &&
                      G->prev_rows == mc->n_kv_heads * mc->head_dim && G->k == mc->n_heads * mc->head_dim;
            if (gqa) rep = mc->n_heads / mc->n_kv_heads;
            if (!p->st.awq_note[0]) {
                if (gqa)
                    snprintf(p->st.awq_note, sizeof p->st.awq_note,
                             "%s -> %s scaled with one scale per KV channel (grouped-query attention, %lld heads per KV head)",
                             prev->name, qd_model_linear(p->m, G->linears[0])->name, (long long)rep);
                else
                    snprintf(p->st.awq_note, sizeof p->st.awq_note, "%s -> %s scaling skipped: shapes differ (%lld, %lld)",
                             prev->name, qd_model_linear(p->m, G->linears[0])->name, (long long)G->prev_rows, (long long)G->k);
            }
            if (!gqa) return 0;
        }
    }
    if (rep > 1) {
        *tie = malloc((size_t)K * sizeof **tie);
        if (!*tie) return qd_err_set(err, QD_ENOMEM, "awq: out of memory");
        for (int64_t c = 0; c < K; c++) {
            int64_t h = c / mc->head_dim, d = c % mc->head_dim;
            (*tie)[c] = (int32_t)((h / rep) * mc->head_dim + d);
        }
    }
    return 1;
}

/* Searches group g's scales from its inputs (in->rows 0: an expert no token reached, left
 * unscaled) and folds them: the layers' input channels *= s, the previous operator's
 * outputs /= s. */
static int awq_group_search_fold(qd_pipeline *p, qd_block_weights *bw, int block, int g, const int32_t *tie,
                                 const awq_inputs *in, qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    const float *ws[QD_MAX_GROUP_LINEARS];
    int64_t ns[QD_MAX_GROUP_LINEARS];
    for (int j = 0; j < G->n_linears; j++) {
        ns[j] = qd_model_linear(p->m, G->linears[j])->n;
        ws[j] = bw->w[G->linears[j]];   /* backend memory owned by the block */
    }
    qd_awq_scales sc;
    memset(&sc, 0, sizeof sc);
    qd_awq_opts o = qd_awq_opts_default();
    /* AutoAWQ's duo scaling: measured lower perplexity than the paper's x_mean^alpha
     * (tiny-llama-c4 w3g128: 29.86 vs 30.06), see bench/results/quality.md. */
    o.duo_scaling = 1;
    o.tie = tie;
    double t0 = qd_clock_now_s();
    int rc = 0;
    /* An expert's groups see only its routed tokens unless every token is sent through
     * every expert (moe.calibrate_all_experts); with none, nothing to search. */
    if (in->rows == 0) sc.identity = 1;
    else rc = awq_search_group(p, bw, g, in, &o, ws, ns, &sc, err);
    double t1 = qd_clock_now_s();
    if (!rc && !sc.identity) rc = qd_pipeline_fold(p, bw, g, sc.s, G->k, err);
    if (!rc)
        QD_LOG(QD_LOG_DEBUG, "awq_scales",
               "block=%d group=%s alpha=%.2f identity=%d loss=%.4g rtn_loss=%.4g seconds=%.3f", block, G->name,
               sc.best_alpha, sc.identity, sc.best_loss, sc.rtn_loss, t1 - t0);
    qd_awq_scales_free(&sc);
    return rc;
}

/* An expert's group: its own capture of the rows routed to it (their Gram matrices would
 * not all fit at once), then the search on those rows. */
static int awq_expert_group_scales(qd_pipeline *p, qd_block_weights *bw, int block, int g, const int32_t *tie,
                                   qd_err *err)
{
    const qd_input_group *G = qd_model_group(p->m, g);
    qd_backend *be = p->be;
    int64_t R = p->n_seq * p->seq_len, K = G->k;
    float *x = qd_backend_alloc(be, (size_t)(R * K) * sizeof(float));
    float *x_mean = malloc((size_t)K * sizeof *x_mean);
    if (!x || !x_mean) {
        qd_backend_free(be, x);
        free(x_mean);
        return qd_err_set(err, QD_ENOMEM, "awq: out of memory for [%lld, %lld] activations", (long long)R, (long long)K);
    }
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    c.xcap = x;
    c.xcap_group = g;
    c.stop_after = g;
    double t0 = qd_clock_now_s();
    int rc = qd_capture_run(p, bw, QD_BLOCK_ALL, NULL, &c, err);
    double t1 = qd_clock_now_s();
    if (!rc && c.xcap_rows > 0) rc = qd_awq_x_mean(be, x, c.xcap_rows, K, K, x_mean, err);
    awq_inputs in = {.x_mean = x_mean, .x = x, .rows = c.xcap_rows};
    QD_LOG(QD_LOG_DEBUG, "awq_capture", "block=%d group=%s rows=%lld seconds=%.3f", block, G->name,
           (long long)c.xcap_rows, t1 - t0);
    if (!rc) rc = awq_group_search_fold(p, bw, block, g, tie, &in, err);
    qd_backend_free(be, x);
    free(x_mean);
    return rc;
}

int qd_pipeline_awq_block_scales(qd_pipeline *p, qd_block_weights *bw, int block, const qd_linear_plan *plans,
                                 qd_err *err)
{
    const int ng = qd_model_n_groups(p->m);
    qd_backend *be = p->be;
    int64_t n_seq = (AWQ_SEARCH_TOKENS + p->seq_len - 1) / p->seq_len;
    if (n_seq > p->n_seq) n_seq = p->n_seq;
    /* Per group, on the heap (hundreds with experts). */
    int32_t **tie = calloc((size_t)ng, sizeof *tie);
    int *wanted = calloc((size_t)ng, sizeof *wanted);
    qd_gptq_hessian *h = calloc((size_t)ng, sizeof *h);
    float **x_mean = calloc((size_t)ng, sizeof *x_mean);
    float *xmlp = NULL;
    int rc = 0;
    if (!tie || !wanted || !h || !x_mean) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory");
    for (int g = 0; g < ng && !rc; g++) {
        if (plans[qd_model_group(p->m, g)->linears[0]].absent) continue;   /* not in this block */
        rc = awq_group_wanted(p, g, plans, &tie[g], err);
        if (rc > 0) wanted[g] = 1, rc = 0;
    }
    /* One pass over the float block, on the first awq.stats_tokens calibration tokens,
     * collects what every dense (non-expert) group's search needs: |x| sums for x_mean, the
     * Gram matrix of the own-loss groups' inputs, the MLP group's first rows. Folding a group's scales leaves the later groups' inputs as they
     * were (up to rounding), so they are the inputs each would see captured after the folds
     * before it; AutoAWQ likewise searches every group on one capture of the layer. */
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    int last = -1;
    for (int g = 0; g < ng && !rc; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        if (!wanted[g] || qd_model_linear(p->m, G->linears[0])->expert >= 0) continue;
        int g_out, li_out;
        int kind = awq_module_kind(p, G, &g_out, &li_out);
        c.absum[g] = calloc((size_t)G->k, sizeof(double));
        if (!c.absum[g]) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory");
        if (!rc && kind == 0) {
            rc = qd_gptq_hessian_init(&h[g], be, G->k, err);
            c.want[g] = 1;
            c.acc[g] = &h[g];
        }
        if (!rc && kind == 2) {
            xmlp = qd_backend_alloc(be, (size_t)(n_seq * p->seq_len * G->k) * sizeof(float));
            if (!xmlp) rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory for the MLP inputs");
            c.xcap = xmlp;
            c.xcap_group = g;
            c.xcap_max = n_seq * p->seq_len;
        }
        last = g;
    }
    double t0 = qd_clock_now_s();
    if (!rc && last >= 0) {
        c.stop_after = last;
        int64_t st = p->job->awq.stats_tokens;
        c.n_seq_max = st > 0 ? (st + p->seq_len - 1) / p->seq_len : 0;
        rc = qd_capture_run(p, bw, QD_BLOCK_ALL, NULL, &c, err);
    }
    if (!rc && last >= 0)
        QD_LOG(QD_LOG_DEBUG, "awq_capture", "block=%d group=dense rows=%lld seconds=%.3f", block,
               (long long)c.absum_rows[last], qd_clock_now_s() - t0);
    int moe_input_done = 0;
    for (int g = 0; g < ng && !rc; g++) {
        if (!wanted[g]) continue;
        const qd_input_group *G = qd_model_group(p->m, g);
        if (qd_model_linear(p->m, G->linears[0])->expert >= 0) {
            /* The experts' shared input first (AutoAWQ's order: attention, the MoE input,
             * then each expert's down), on its own capture of the MLP half. */
            if (!moe_input_done && p->job->moe.awq_shared_input && (rc = qd_pipeline_awq_moe_input(p, bw, block, err)))
                break;
            moe_input_done = 1;
            rc = awq_expert_group_scales(p, bw, block, g, tie[g], err);
            continue;
        }
        x_mean[g] = malloc((size_t)G->k * sizeof(float));
        if (!x_mean[g]) { rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory"); break; }
        int64_t rows = c.absum_rows[g];
        for (int64_t k = 0; k < G->k; k++) x_mean[g][k] = rows > 0 ? (float)(c.absum[g][k] / (double)rows) : 0.0f;
        awq_inputs in = {.x_mean = x_mean[g], .h = h[g].h ? &h[g] : NULL, .x = g == c.xcap_group ? xmlp : NULL,
                         .rows = g == c.xcap_group ? c.xcap_rows : rows};
        rc = awq_group_search_fold(p, bw, block, g, tie[g], &in, err);
    }
    for (int g = 0; g < ng; g++) {
        if (tie) free(tie[g]);
        if (h) qd_gptq_hessian_free(&h[g]);
        if (x_mean) free(x_mean[g]);
        free(c.absum[g]);
    }
    qd_backend_free(be, xmlp);
    free(tie);
    free(wanted);
    free(h);
    free(x_mean);
    return rc;
}
