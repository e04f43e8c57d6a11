/* GPTAQ for one linear layer (see gptaq.h): the streaming dXXT, and the column loop with
 * GPTAQ's extra term, on the host. The preparation (dead columns, static groups, act
 * order, damping retries, g_idx) is GPTQ's, in the inverse (U) form GPTQModel uses. */
#include "quant/algo/gptaq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend_args.h"
#include "quant/core/clock.h"
#include "quant/core/finite.h"
#include "quant/core/log.h"
#include "quant/formats/quantizer.h"

int qd_gptaq_dxx_init(qd_gptaq_dxx *acc, qd_backend *be, int64_t k, qd_err *err)
{
    if (!acc) return qd_err_set(err, QD_EINVAL, "gptaq: NULL accumulator");
    memset(acc, 0, sizeof *acc);
    if (!be || k <= 0) return qd_err_set(err, QD_EINVAL, "gptaq: NULL backend or %lld features", (long long)k);
    size_t bytes = (size_t)(k * k) * sizeof(float);
    acc->d = qd_backend_alloc(be, bytes);
    if (!acc->d) return qd_err_set(err, QD_ERESOURCE, "gptaq: %s", be->err.msg);
    int rc = be->ops->memset0(be, acc->d, bytes);
    if (rc) {
        qd_backend_free(be, acc->d);
        acc->d = NULL;
        return qd_err_set(err, rc, "gptaq: %s", be->err.msg);
    }
    acc->be = be;
    acc->k = k;
    return 0;
}

void qd_gptaq_dxx_free(qd_gptaq_dxx *acc)
{
    if (!acc) return;
    if (acc->be) {
        qd_backend_free(acc->be, acc->d);
        qd_backend_free(acc->be, acc->diff);
    }
    memset(acc, 0, sizeof *acc);
}

int qd_gptaq_dxx_add_dev(qd_gptaq_dxx *acc, const float *x_fp, const float *x_q, int64_t rows, int64_t ldx,
                         qd_err *err)
{
    if (!acc || !acc->d) return qd_err_set(err, QD_EINVAL, "gptaq: accumulator not initialised");
    if (rows == 0) return 0;
    const int64_t k = acc->k;
    if (rows < 0 || ldx < k || !x_fp || !x_q)
        return qd_err_set(err, QD_EINVAL, "gptaq: bad rows (%lld, ldx %lld, k %lld)", (long long)rows,
                          (long long)ldx, (long long)k);
    qd_backend *be = acc->be;
    if (rows > acc->diff_rows) {
        qd_backend_free(be, acc->diff);
        acc->diff = qd_backend_alloc(be, (size_t)(rows * k) * sizeof(float));
        acc->diff_rows = acc->diff ? rows : 0;
        if (!acc->diff) return qd_err_set(err, QD_ERESOURCE, "gptaq: %s", be->err.msg);
    }
    /* diff = x_fp - x_q, packed [rows, k] */
    int rc = be->ops->copy_2d(be, acc->diff, k, x_q, ldx, rows, k);
    if (!rc) rc = be->ops->scale(be, acc->diff, rows * k, -1.0f);
    if (!rc && ldx == k) rc = be->ops->add(be, acc->diff, x_fp, rows * k);
    for (int64_t r = 0; !rc && ldx != k && r < rows; r++) rc = be->ops->add(be, acc->diff + r * k, x_fp + r * ldx, k);
    /* d = beta d + alpha diff^T x_q: the Hessian's running average (hessian.h) */
    float alpha, beta;
    qd_backend_hessian_weights(acc->n_seen, rows, &alpha, &beta);
    if (!rc) rc = be->ops->gemm(be, 1, 0, k, k, rows, alpha, acc->diff, k, x_q, ldx, beta, acc->d, k);
    if (rc) return qd_err_set(err, rc, "gptaq: %s", be->err.msg);
    acc->n_seen += rows;
    return 0;
}

int qd_gptaq_dxx_download(const qd_gptaq_dxx *acc, float *d_host, qd_err *err)
{
    if (!acc || !acc->d || !d_host) return qd_err_set(err, QD_EINVAL, "gptaq: nothing to download");
    int rc = qd_backend_download(acc->be, d_host, acc->d, (size_t)(acc->k * acc->k) * sizeof(float));
    return rc ? qd_err_set(err, rc, "gptaq: %s", acc->be->err.msg) : 0;
}

/* One run: host arrays in processing order. */
typedef struct gptaq_run {
    qd_backend *be;
    const qd_gptq_opts *o;
    int64_t n, k, gs, G;
    int grouped, static_groups;
    float *wp;                 /* [n, k] W, permuted, dead columns zeroed; updated in place */
    float *u;                  /* [k, k] H's damped inverse's upper Cholesky factor (backend = host) */
    float *p;                  /* [k, k] P = alpha triu(D U^T, 1) U */
    float *t;                  /* [k, k] D permuted, then D U^T */
    float *q;                  /* [n, k] Q, processing order */
    uint8_t *codes;            /* [n, k] processing order */
    float *err1, *w1;          /* [n, B] a block's errors and its W1 after the loop */
    float *scales, *zeros;     /* [G, n] */
    float *hdiag;              /* [k] H's diagonal, dead ones set to 1, original order */
    float *hw, *hwp;           /* scale search (else NULL): H's own diagonal [k], in original and
                                  in processing order (gptq.c weights its search alike) */
    int64_t *perm;
    int32_t *col_group;
} gptaq_run;

static void gptaq_run_free(gptaq_run *g)
{
    qd_backend *be = g->be;
    if (be) {
        qd_backend_free(be, g->wp);
        qd_backend_free(be, g->u);
        qd_backend_free(be, g->p);
        qd_backend_free(be, g->t);
        qd_backend_free(be, g->err1);
        qd_backend_free(be, g->w1);
    }
    free(g->q);
    free(g->codes);
    free(g->scales);
    free(g->zeros);
    free(g->hdiag);
    free(g->hw);
    free(g->hwp);
    free(g->perm);
    free(g->col_group);
}

static int gptaq_check(qd_backend *be, const qd_gptq_opts *o, double alpha, const float *w, int64_t n, int64_t k,
                       const float *h, const float *dxxt, qd_err *err)
{
    if (!be || !w || !h || !dxxt) return qd_err_set(err, QD_EINVAL, "gptaq: NULL backend, weights, Hessian or dXXT");
    if (be->device >= 0)
        return qd_err_set(err, QD_EINVAL, "gptaq: runs on the CPU backend only, not on %s", be->name ? be->name : "this backend");
    int rc = qd_gptq_opts_validate(o, err);
    if (rc) return rc;
    if (o->quant.row_block != 1 && o->quant.row_block != 0)
        return qd_err_set(err, QD_EINVAL, "gptaq: scales shared across rows (row_block %lld) are not supported",
                          (long long)o->quant.row_block);
    if (!isfinite(alpha) || alpha < 0.0)
        return qd_err_set(err, QD_EINVAL, "gptaq: alpha %g is not a finite value >= 0", alpha);
    if (n <= 0 || k <= 0)
        return qd_err_set(err, QD_EINVAL, "gptaq: weight shape [%lld, %lld] must be positive", (long long)n, (long long)k);
    const struct { const float *a; int64_t len; const char *what; } arr[3] = {
        {w, n * k, "weight"}, {h, k * k, "Hessian"}, {dxxt, k * k, "dXXT"}};
    for (int i = 0; i < 3; i++) {
        int64_t j = qd_f32_first_nonfinite(arr[i].a, arr[i].len);
        if (j >= 0) return qd_err_set(err, QD_ENUMERIC, "gptaq: %s entry %lld is not finite", arr[i].what, (long long)j);
    }
    return 0;
}

static int gptaq_alloc(gptaq_run *g, qd_gptq_result *out, qd_err *err)
{
    const int64_t n = g->n, k = g->k, B = g->o->block_size < k ? g->o->block_size : k;
    qd_backend *be = g->be;
    const size_t kk = (size_t)(k * k) * sizeof(float);
    g->wp = qd_backend_alloc(be, (size_t)(n * k) * sizeof(float));
    g->u = qd_backend_alloc(be, kk);
    g->p = qd_backend_alloc(be, kk);
    g->t = qd_backend_alloc(be, kk);
    g->err1 = qd_backend_alloc(be, (size_t)(n * B) * sizeof(float));
    g->w1 = qd_backend_alloc(be, (size_t)(n * B) * sizeof(float));
    g->q = malloc((size_t)(n * k) * sizeof(float));
    g->codes = malloc((size_t)(n * k));
    g->scales = calloc((size_t)(g->G * n), sizeof(float));
    g->zeros = calloc((size_t)(g->G * n), sizeof(float));
    g->hdiag = malloc((size_t)k * sizeof(float));
    g->perm = malloc((size_t)k * sizeof(int64_t));
    g->col_group = malloc((size_t)k * sizeof(int32_t));
    out->deq = malloc((size_t)(n * k) * sizeof(float));
    if (!g->wp || !g->u || !g->p || !g->t || !g->err1 || !g->w1 || !g->q || !g->codes || !g->scales || !g->zeros ||
        !g->hdiag || !g->perm || !g->col_group || !out->deq)
        return qd_err_set(err, QD_ENOMEM, "gptaq: out of memory for a [%lld, %lld] layer", (long long)n, (long long)k);
    if (g->o->quant.scale_search == QD_SCALE_SEARCH_MSE) {
        g->hw = malloc((size_t)k * sizeof(float));
        g->hwp = malloc((size_t)k * sizeof(float));
        if (!g->hw || !g->hwp) return qd_err_set(err, QD_ENOMEM, "gptaq: out of memory");
    }
    return 0;
}

/* Dead columns, the processing order, W permuted with dead columns zeroed, static groups'
 * (or the single group's) parameters, and each column's group: as gptq.c's gptq_prepare. */
static void gptaq_prepare(gptaq_run *g, const float *w, const float *h, qd_gptq_result *out)
{
    const qd_quant_cfg *c = &g->o->quant;
    const int64_t n = g->n, k = g->k, gs = g->gs;
    if (g->hw)
        for (int64_t i = 0; i < k; i++) g->hw[i] = h[i * k + i];
    if (!g->grouped) {      /* one group over K: found on the weights as given */
        for (int64_t r = 0; r < n; r++) qd_quant_params_w(c, w + r * k, k, 1, g->hw, &g->scales[r], &g->zeros[r]);
        qd_quant_params_rows(c, g->scales, n, 1);
    }
    for (int64_t i = 0; i < k; i++) {
        g->hdiag[i] = h[i * k + i];
        if (g->hdiag[i] == 0.0f) {
            g->hdiag[i] = 1.0f;
            out->dead_columns++;
        }
    }
    if (g->o->desc_act) qd_gptq_act_order_perm(g->hdiag, k, g->perm);
    else for (int64_t i = 0; i < k; i++) g->perm[i] = i;
    if (g->hwp)
        for (int64_t j = 0; j < k; j++) g->hwp[j] = g->hw[g->perm[j]];
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            int64_t src = g->perm[j];
            g->wp[r * k + j] = h[src * k + src] == 0.0f ? 0.0f : w[r * k + src];
        }
    if (g->static_groups) {
        /* On W with dead columns zeroed, original order: wp unpermuted into q (scratch). */
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) g->q[r * k + g->perm[j]] = g->wp[r * k + j];
        for (int64_t r = 0; r < n; r++)
            for (int64_t gi = 0; gi < g->G; gi++) {
                int64_t k0 = gi * gs, len = k - k0 < gs ? k - k0 : gs;
                qd_quant_params_w(c, g->q + r * k + k0, len, 1, g->hw ? g->hw + k0 : NULL, &g->scales[gi * n + r],
                                  &g->zeros[gi * n + r]);
            }
        qd_quant_params_rows(c, g->scales, n, g->G);
    }
    for (int64_t j = 0; j < k; j++)
        g->col_group[j] = !g->grouped ? 0 : g->static_groups ? (int32_t)(g->perm[j] / gs) : (int32_t)(j / gs);
}

/* U: H permuted, dead diagonal 1, damped by damp_percent of the mean diagonal, through the
 * backend's chol_inverse_upper; x10 per failed try. *factored = 0 when every try failed. */
static int gptaq_factor(gptaq_run *g, const float *h, qd_gptq_result *out, int *factored, qd_err *err)
{
    qd_backend *be = g->be;
    const qd_gptq_opts *o = g->o;
    const int64_t k = g->k;
    double mean = 0.0;
    for (int64_t j = 0; j < k; j++) mean += g->hdiag[g->perm[j]];
    mean /= (double)k;
    *factored = 0;
    for (int attempt = 0; attempt <= o->max_damp_retries; attempt++) {
        double pct = o->damp_percent * pow(10.0, attempt);
        float damp = (float)(pct * mean);
        for (int64_t i = 0; i < k; i++) {
            const float *src = h + g->perm[i] * k;
            float *row = g->u + i * k;
            for (int64_t j = 0; j < k; j++) row[j] = src[g->perm[j]];
            row[i] = g->hdiag[g->perm[i]] + damp;
        }
        out->damp_percent = pct;
        out->damp = damp;
        out->damp_retries = attempt;
        int rc = be->ops->chol_inverse_upper(be, g->u, k);
        if (rc == 0) { *factored = 1; return 0; }
        if (rc != QD_ENUMERIC) return qd_err_set(err, rc, "gptaq: %s", be->err.msg);
        QD_LOG(QD_LOG_WARN, "gptaq damping retry", "n=%lld k=%lld damp_percent=%g reason=\"%s\"", (long long)g->n,
               (long long)k, pct, be->err.msg);
    }
    return 0;
}

/* Rows per panel of P's products (gptaq_make_p). */
#define GPTAQ_PANEL 128

/* P = alpha triu(Dp U^T, 1) U with Dp = dXXT permuted (rows and columns), dead columns of
 * dXXT zeroed (GPTQModel zeroes dXXT[:, dead]). */
static int gptaq_make_p(gptaq_run *g, const float *h, const float *dxxt, double alpha, qd_err *err)
{
    qd_backend *be = g->be;
    const int64_t k = g->k;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) {
            int64_t a = g->perm[i], b = g->perm[j];
            g->p[i * k + j] = h[b * k + b] == 0.0f ? 0.0f : dxxt[a * k + b];
        }
    /* t = Dp U^T with its strictly upper part kept, then p = alpha t U, by row panels
     * [a, a + GPTAQ_PANEL): U is upper triangular, so a panel's rows of t past column a
     * need only U[a:, a:] (t's entries at or left of the diagonal are dropped anyway), and
     * t's rows being zero left of a, p's rows are zero there and need only U[a:, a:] too.
     * A third of two full k x k x k products. */
    int rc = 0;
    for (int64_t a = 0; a < k && !rc; a += GPTAQ_PANEL) {
        int64_t rows = k - a < GPTAQ_PANEL ? k - a : GPTAQ_PANEL;
        rc = be->ops->gemm(be, 0, 1, rows, k - a, k - a, 1.0f, g->p + a * k + a, k, g->u + a * k + a, k, 0.0f,
                           g->t + a * k + a, k);
    }
    if (rc) return qd_err_set(err, rc, "gptaq: %s", be->err.msg);
    for (int64_t i = 0; i < k; i++) memset(g->t + i * k, 0, (size_t)(i + 1) * sizeof(float));
    for (int64_t a = 0; a < k && !rc; a += GPTAQ_PANEL) {
        int64_t rows = k - a < GPTAQ_PANEL ? k - a : GPTAQ_PANEL;
        for (int64_t i = a; i < a + rows; i++) memset(g->p + i * k, 0, (size_t)a * sizeof(float));
        rc = be->ops->gemm(be, 0, 0, rows, k - a, k - a, (float)alpha, g->t + a * k + a, k, g->u + a * k + a, k, 0.0f,
                           g->p + a * k + a, k);
    }
    return rc ? qd_err_set(err, rc, "gptaq: %s", be->err.msg) : 0;
}

/* One block [i1, i2) for row r: dynamic group parameters from wp as it stands, then the
 * column loop on the row's copy of the block (gptaq.h). */
static void gptaq_block_row(gptaq_run *g, int64_t r, int64_t i1, int64_t i2, int64_t B)
{
    const qd_quant_cfg *c = &g->o->quant;
    const int64_t n = g->n, k = g->k, gs = g->gs;
    float *wr = g->wp + r * k, *w1 = g->w1 + r * B, *er = g->err1 + r * B;
    if (g->grouped && !g->static_groups)
        for (int64_t j = (i1 + gs - 1) / gs * gs; j < i2; j += gs) {
            int64_t len = j + gs <= k ? gs : k - j, gi = g->col_group[j];
            qd_quant_params_w(c, wr + j, len, 1, g->hwp ? g->hwp + j : NULL, &g->scales[gi * n + r],
                              &g->zeros[gi * n + r]);
        }
    for (int64_t j = i1; j < i2; j++) w1[j - i1] = wr[j];
    for (int64_t j = i1; j < i2; j++) {
        const int64_t gi = g->col_group[j];
        const float s = g->scales[gi * n + r], z = g->zeros[gi * n + r];
        const float x = w1[j - i1], d = g->u[j * k + j];
        const int code = qd_quant_code_cfg(c, x, s, z);
        const float qv = qd_quant_dequant_cfg(c, code, s, z);
        const float e = (x - qv) / d;
        const float *ur = g->u + j * k, *pr = g->p + j * k;
        for (int64_t cc = j + 1; cc < i2; cc++) w1[cc - i1] -= e * ur[cc] - x * pr[cc];
        w1[j - i1] = x - e * d;           /* P[j][j] = 0 */
        er[j - i1] = e;
        g->q[r * k + j] = qv;
        g->codes[r * k + j] = (uint8_t)code;
    }
}

static int gptaq_loop(gptaq_run *g, qd_err *err)
{
    qd_backend *be = g->be;
    const int64_t n = g->n, k = g->k, B = g->o->block_size < k ? g->o->block_size : k;
    for (int64_t i1 = 0; i1 < k; i1 += B) {
        int64_t i2 = i1 + B < k ? i1 + B : k;
        for (int64_t r = 0; r < n; r++) gptaq_block_row(g, r, i1, i2, B);
        if (i2 == k) break;
        /* W[:, i2:] -= Err1 U[i1:i2, i2:] - W1 P[i1:i2, i2:] */
        int rc = be->ops->gemm(be, 0, 0, n, k - i2, i2 - i1, -1.0f, g->err1, B, g->u + i1 * k + i2, k, 1.0f,
                               g->wp + i2, k);
        if (!rc) rc = be->ops->gemm(be, 0, 0, n, k - i2, i2 - i1, 1.0f, g->w1, B, g->p + i1 * k + i2, k, 1.0f,
                                    g->wp + i2, k);
        if (rc) return qd_err_set(err, rc, "gptaq: trailing update after block [%lld, %lld): %s", (long long)i1,
                                  (long long)i2, be->err.msg);
    }
    return 0;
}

/* Q and codes unpermuted into out, g_idx, and the groups' parameters (finite, positive). */
static int gptaq_collect(gptaq_run *g, qd_gptq_result *out, qd_err *err)
{
    const int64_t n = g->n, k = g->k, G = g->G, gs = g->gs;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            out->deq[r * k + g->perm[j]] = g->q[r * k + j];
            out->layer.q[r * k + g->perm[j]] = g->codes[r * k + j];
        }
    for (int64_t j = 0; j < k; j++)
        out->layer.g_idx[g->perm[j]] = !g->grouped ? 0 : g->static_groups ? (int32_t)(g->perm[j] / gs) : (int32_t)(j / gs);
    for (int64_t i = 0; i < G * n; i++) {
        if (!isfinite(g->scales[i]) || !(g->scales[i] > 0.0f))
            return qd_err_set(err, QD_ENUMERIC, "gptaq: scale of group %lld, row %lld is %g", (long long)(i / n),
                              (long long)(i % n), (double)g->scales[i]);
        out->layer.scales[i] = g->scales[i];
        out->layer.zeros[i] = (int32_t)lrintf(g->zeros[i]);
    }
    /* A W1 P term can push an updated weight far out; no output is ever non-finite. */
    int64_t bad = qd_f32_first_nonfinite(out->deq, n * k);
    if (bad >= 0) return qd_err_set(err, QD_ENUMERIC, "gptaq: dequantized weight %lld is not finite", (long long)bad);
    return 0;
}

int qd_gptaq_quantize_h(qd_backend *be, const qd_gptq_opts *o, double alpha, const float *w, int64_t n, int64_t k,
                        const float *h, const float *dxxt, qd_gptq_result *out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "gptaq: NULL result");
    memset(out, 0, sizeof *out);
    int rc = gptaq_check(be, o, alpha, w, n, k, h, dxxt, err);
    if (rc) return rc;
    qd_gptq_opts own;
    if (o->quant.scale_rule == QD_SCALE_FP8_GLOBAL && o->quant.global_scale == 0.0f) {
        own = *o;
        own.quant.global_scale = qd_quant_global_scale(qd_quant_amax(w, n * k));
        o = &own;
    }
    const double t0 = qd_clock_now_s();
    gptaq_run g;
    memset(&g, 0, sizeof g);
    g.be = be;
    g.o = o;
    g.n = n;
    g.k = k;
    g.gs = qd_quant_group_len(&o->quant, k);
    g.grouped = o->quant.group_size > 0;
    g.static_groups = g.grouped && o->static_groups;
    rc = qd_qlayer_alloc(&out->layer, n, k, o->quant.bits, o->quant.sym, o->quant.group_size, 0, err);
    if (!rc) {
        qd_qlayer_set_grid(&out->layer, &o->quant);
        g.G = out->layer.n_groups;
        rc = gptaq_alloc(&g, out, err);
    }
    int factored = 0;
    if (!rc) {
        gptaq_prepare(&g, w, h, out);
        rc = gptaq_factor(&g, h, out, &factored, err);
    }
    if (!rc && !factored) {
        /* No damping makes H^-1 factorisable: plain GPTQ decides (its own retries, then RTN). */
        QD_LOG(QD_LOG_WARN, "gptaq falls back to gptq", "n=%lld k=%lld tries=%d", (long long)n, (long long)k,
               o->max_damp_retries + 1);
        gptaq_run_free(&g);
        qd_gptq_result_free(out);
        return qd_gptq_quantize_h(be, o, w, n, k, h, out, err);
    }
    if (!rc) rc = gptaq_make_p(&g, h, dxxt, alpha, err);
    if (!rc) rc = gptaq_loop(&g, err);
    if (!rc) rc = gptaq_collect(&g, out, err);
    gptaq_run_free(&g);
    if (rc) {
        qd_gptq_result_free(out);
        return rc;
    }
    out->h_err = -1.0;
    out->seconds = qd_clock_now_s() - t0;
    return 0;
}
