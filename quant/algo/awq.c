/* AWQ scale and clip search (see awq.h for the method and the AutoAWQ correspondence).
 *
 * Matrix products run on the backend; the per-(row, group) and per-row error reductions,
 * which no backend op provides, are done on the host after downloading [N, K] or
 * [chunk, N] blocks. The per-group clip error uses the Gram form
 * err(n, g) = dW[n, g] H_g dW[n, g]^T with H_g = X_g^T X_g over the sampled rows, which is
 * AutoAWQ's sum over tokens of (partial output difference)^2 computed without materialising
 * the [N, tokens, groups] tensor. */
#include "quant/algo/awq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void qd_awq_scales_free(qd_awq_scales *r)
{
    if (!r) return;
    free(r->s);
    free(r->loss);
    memset(r, 0, sizeof *r);
}

void qd_awq_clip_free(qd_awq_clip *c)
{
    if (!c) return;
    free(c->max);
    memset(c, 0, sizeof *c);
}

void qd_awq_result_free(qd_awq_result *r)
{
    if (!r) return;
    qd_awq_scales_free(&r->scales);
    qd_awq_clip_free(&r->clip);
    r->ref_norm2 = 0;
}

/* Copies the backend's reason into err, naming the step that failed. */
static int be_fail(qd_backend *be, int rc, const char *what, qd_err *err)
{
    return qd_err_set(err, rc, "awq: %s: %s", what, be->err.msg);
}

#define BE_TRY(call, what) do { rc = (call); if (rc) { be_fail(be, rc, what, err); goto done; } } while (0)
#define OOM_IF(cond) do { if (cond) { rc = qd_err_set(err, QD_ENOMEM, "awq: out of memory"); goto done; } } while (0)

/* Host copies of the layers' weights for the Gram-form losses; *out (n_layers arrays) is
 * owned by the caller and freed by it whether or not this fails. */
static int awq_weights_to_host(qd_backend *be, const float *const *w, const int64_t *n, int n_layers, int64_t k,
                               float ***out, qd_err *err)
{
    int rc = 0;
    *out = calloc((size_t)n_layers, sizeof **out);
    OOM_IF(!*out);
    for (int i = 0; i < n_layers; i++) {
        (*out)[i] = malloc((size_t)(n[i] * k) * sizeof(float));
        OOM_IF(!(*out)[i]);
        BE_TRY(qd_backend_download(be, (*out)[i], w[i], (size_t)(n[i] * k) * sizeof(float)), "download of W");
    }
done:
    return rc;
}

int qd_awq_x_mean(qd_backend *be, const float *x, int64_t rows, int64_t k, int64_t ldx,
                  float *x_mean, qd_err *err)
{
    if (!x || !x_mean || rows < 1 || k < 1 || ldx < k)
        return qd_err_set(err, QD_EINVAL, "awq: x_mean needs rows >= 1, k >= 1 and ldx >= k");
    /* There is no abs-mean op: download in row chunks and reduce in double on the host. */
    const int64_t chunk = 256;
    int rc = 0;
    double *acc = calloc((size_t)k, sizeof *acc);
    float *buf = malloc((size_t)((chunk - 1) * ldx + k) * sizeof *buf);
    OOM_IF(!acc || !buf);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t rc_rows = rows - r0 < chunk ? rows - r0 : chunk;
        size_t span = (size_t)((rc_rows - 1) * ldx + k) * sizeof *buf;
        BE_TRY(qd_backend_download(be, buf, x + r0 * ldx, span), "download of X");
        for (int64_t r = 0; r < rc_rows; r++)
            for (int64_t c = 0; c < k; c++) acc[c] += fabs((double)buf[r * ldx + c]);
    }
    for (int64_t c = 0; c < k; c++) x_mean[c] = (float)(acc[c] / (double)rows);
done:
    free(acc);
    free(buf);
    return rc;
}

int qd_awq_output_sq_err(qd_backend *be, const float *x, int64_t rows, int64_t ldx, int64_t k,
                         const float *wa, const float *wb, int64_t n, int64_t chunk_rows,
                         double *out, qd_err *err)
{
    if (!x || !wa || !out || rows < 1 || k < 1 || n < 1 || ldx < k || chunk_rows < 1)
        return qd_err_set(err, QD_EINVAL, "awq: output error needs x, wa, positive shapes and ldx >= k");
    int64_t chunk = rows < chunk_rows ? rows : chunk_rows;
    int rc = 0;
    double total = 0;
    float *ya = qd_backend_alloc(be, (size_t)(chunk * n) * sizeof(float));
    float *yb = qd_backend_alloc(be, (size_t)(chunk * n) * sizeof(float));
    if (!ya || !yb) { rc = be_fail(be, QD_ENOMEM, "scratch for outputs", err); goto done; }
    if (!wb) BE_TRY(be->ops->memset0(be, yb, (size_t)(chunk * n) * sizeof(float)), "memset0");
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t m = rows - r0 < chunk ? rows - r0 : chunk;
        double part = 0;
        BE_TRY(be->ops->gemm(be, 0, 1, m, n, k, 1.0f, x + r0 * ldx, ldx, wa, k, 0.0f, ya, n), "gemm X Wa^T");
        if (wb)
            BE_TRY(be->ops->gemm(be, 0, 1, m, n, k, 1.0f, x + r0 * ldx, ldx, wb, k, 0.0f, yb, n), "gemm X Wb^T");
        BE_TRY(be->ops->sq_diff_sum(be, ya, yb, m * n, &part), "sq_diff_sum");
        total += part;
    }
    *out = total;
done:
    if (ya) qd_backend_free(be, ya);
    if (yb) qd_backend_free(be, yb);
    return rc;
}

/* Per-row squared output error ||X wa[r]^T - X wb[r]^T||^2 for every row r of [n, k]
 * weights, into the host array per_row [n]. */
static int awq_row_sq_err(qd_backend *be, const float *x, int64_t rows, int64_t ldx, int64_t k,
                          const float *wa, const float *wb, int64_t n, int64_t chunk_rows,
                          double *per_row, qd_err *err)
{
    int64_t chunk = rows < chunk_rows ? rows : chunk_rows;
    int rc = 0;
    float *ya = qd_backend_alloc(be, (size_t)(chunk * n) * sizeof(float));
    float *yb = qd_backend_alloc(be, (size_t)(chunk * n) * sizeof(float));
    float *ha = malloc((size_t)(chunk * n) * sizeof *ha), *hb = malloc((size_t)(chunk * n) * sizeof *hb);
    if (!ya || !yb) { rc = be_fail(be, QD_ENOMEM, "scratch for row errors", err); goto done; }
    OOM_IF(!ha || !hb);
    memset(per_row, 0, (size_t)n * sizeof *per_row);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t m = rows - r0 < chunk ? rows - r0 : chunk;
        BE_TRY(be->ops->gemm(be, 0, 1, m, n, k, 1.0f, x + r0 * ldx, ldx, wa, k, 0.0f, ya, n), "gemm X Wa^T");
        BE_TRY(be->ops->gemm(be, 0, 1, m, n, k, 1.0f, x + r0 * ldx, ldx, wb, k, 0.0f, yb, n), "gemm X Wb^T");
        BE_TRY(qd_backend_download(be, ha, ya, (size_t)(m * n) * sizeof *ha), "download outputs");
        BE_TRY(qd_backend_download(be, hb, yb, (size_t)(m * n) * sizeof *hb), "download outputs");
        for (int64_t t = 0; t < m; t++)
            for (int64_t c = 0; c < n; c++) {
                double d = (double)ha[t * n + c] - (double)hb[t * n + c];
                per_row[c] += d * d;
            }
    }
done:
    if (ya) qd_backend_free(be, ya);
    if (yb) qd_backend_free(be, yb);
    free(ha);
    free(hb);
    return rc;
}

/* ---- output errors in Gram form ----
 * ||X D^T||^2 over the rows of X equals sum_r D[r] H D[r]^T with H = X^T X, so once H is
 * formed (rows * k^2 / 2 flops, once) each candidate costs an [n, k] x [k, k] product
 * instead of an [rows, k] x [k, n] one: fewer flops whenever rows > k, the same value up to
 * float rounding. H is held as the GPTQ accumulator holds it, (2 / rows) X^T X, so a caller
 * that already has that Hessian for the same rows (the pipeline) passes it in. D = Wa - Wb
 * is formed on the host before the product, not as Wa H - Wb H, which would cancel. Where
 * only the total is wanted (the scale search) on a host backend, it is <H, D^T D>_F with
 * D^T D by the Hessian's own symmetric rank-n update: n k^2 / 2 multiply-adds instead of the
 * product's n k^2 (the per-layer error's trick, pipeline_layer.c). */
typedef struct awq_gram {
    const qd_gptq_hessian *h;     /* borrowed, or &own */
    qd_gptq_hessian own;
    double scale;                 /* rows / 2: H's quadratic forms back to sums over rows */
    int64_t k;
    float *d, *dh;                /* backend [max_n, k]: D and D H */
    float *hd, *hdh;              /* host [max_n, k] */
    float *dtd;                   /* host backends: [k, k] (2 / n) D^T D, allocated by the
                                   * first total-only error (never by the clip guard's) */
} awq_gram;

static void awq_gram_free(qd_backend *be, awq_gram *g)
{
    qd_gptq_hessian_free(&g->own);
    if (g->d) qd_backend_free(be, g->d);
    if (g->dh) qd_backend_free(be, g->dh);
    if (g->dtd) qd_backend_free(be, g->dtd);
    free(g->hd);
    free(g->hdh);
    memset(g, 0, sizeof *g);
}

/* h: the caller's (2 / rows) X^T X over exactly x's rows, or NULL to form it from x. */
static int awq_gram_init(qd_backend *be, awq_gram *g, const qd_gptq_hessian *h, const float *x, int64_t rows,
                         int64_t ldx, int64_t k, int64_t max_n, qd_err *err)
{
    int rc = 0;
    memset(g, 0, sizeof *g);
    g->k = k;
    if (h) {
        if (!h->h || h->k != k || h->n_seen != rows) {
            rc = qd_err_set(err, QD_EINVAL, "awq: the Hessian given (%lld features, %lld rows) is not X's (%lld, %lld)",
                            (long long)(h ? h->k : 0), (long long)(h ? h->n_seen : 0), (long long)k, (long long)rows);
            goto done;
        }
        g->h = h;
    } else {
        rc = qd_gptq_hessian_init(&g->own, be, k, err);
        if (!rc) rc = qd_gptq_hessian_add_dev(&g->own, x, rows, ldx, err);
        if (rc) { qd_err_prefix(err, "awq: X^T X"); goto done; }
        g->h = &g->own;
    }
    g->scale = (double)g->h->n_seen / 2.0;
    g->d = qd_backend_alloc(be, (size_t)(max_n * k) * sizeof(float));
    g->dh = qd_backend_alloc(be, (size_t)(max_n * k) * sizeof(float));
    if (!g->d || !g->dh) { rc = be_fail(be, QD_ENOMEM, "scratch for the Gram form", err); goto done; }
    g->hd = malloc((size_t)(max_n * k) * sizeof *g->hd);
    g->hdh = malloc((size_t)(max_n * k) * sizeof *g->hdh);
    OOM_IF(!g->hd || !g->hdh);
done:
    if (rc) awq_gram_free(be, g);
    return rc;
}

/* ||X (Wa - Wb)^T||^2 over X's rows: per output row into per_row [n] (may be NULL) and in
 * total into *total. wa backend [n, k]; wb host [n, k]. */
static int awq_gram_err(qd_backend *be, awq_gram *g, const float *wa, const float *wb_host, int64_t n,
                        double *per_row, double *total, qd_err *err)
{
    const int64_t k = g->k;
    size_t bytes = (size_t)(n * k) * sizeof(float);
    int rc = 0;
    BE_TRY(qd_backend_download(be, g->hd, wa, bytes), "download of W");
    for (int64_t i = 0; i < n * k; i++) g->hd[i] -= wb_host[i];
    if (!per_row && be->device < 0 && !g->dtd) {
        g->dtd = qd_backend_alloc(be, (size_t)(k * k) * sizeof(float));
        if (!g->dtd) { rc = be_fail(be, QD_ENOMEM, "scratch for D^T D", err); goto done; }
    }
    if (!per_row && g->dtd) {
        /* tr(D H D^T) = <H, D^T D>; both symmetric: the upper triangle twice, the diagonal once.
         * dtd = (2 / n) D^T D, H = (2 / rows) X^T X. */
        BE_TRY(be->ops->hessian_accum(be, g->dtd, k, g->hd, n, k, 0), "D^T D");
        const float *h = g->h->h;
        double off = 0, diag = 0;
        for (int64_t r = 0; r < k; r++) {
            const float *a = h + r * k, *b = g->dtd + r * k;
            diag += (double)a[r] * (double)b[r];
            for (int64_t c = r + 1; c < k; c++) off += (double)a[c] * (double)b[c];
        }
        *total = (2.0 * off + diag) * g->scale * ((double)n / 2.0);
        return 0;
    }
    BE_TRY(qd_backend_upload(be, g->d, g->hd, bytes), "upload of dW");
    BE_TRY(be->ops->gemm(be, 0, 0, n, k, k, 1.0f, g->d, k, g->h->h, k, 0.0f, g->dh, k), "gemm dW H");
    BE_TRY(qd_backend_download(be, g->hdh, g->dh, bytes), "download of dW H");
    double sum = 0;
    for (int64_t r = 0; r < n; r++) {
        double e = 0;
        const float *a = g->hd + r * k, *b = g->hdh + r * k;
        for (int64_t c = 0; c < k; c++) e += (double)a[c] * (double)b[c];
        e *= g->scale;
        if (per_row) per_row[r] = e;
        sum += e;
    }
    *total = sum;
done:
    return rc;
}

/* AutoAWQ's w_mean: |W| normalised by each (row, group) max, averaged over the rows of all
 * layers. Needs the weights on the host. */
static int awq_w_mean(qd_backend *be, const qd_quant_cfg *cfg, const float *const *w, const int64_t *n,
                      int n_layers, int64_t k, float *w_mean, qd_err *err)
{
    int rc = 0;
    int64_t gl = qd_quant_group_len(cfg, k), total_rows = 0;
    double *acc = calloc((size_t)k, sizeof *acc);
    float *row = malloc((size_t)k * sizeof *row);
    OOM_IF(!acc || !row);
    for (int i = 0; i < n_layers; i++)
        for (int64_t r = 0; r < n[i]; r++) {
            BE_TRY(qd_backend_download(be, row, w[i] + r * k, (size_t)k * sizeof *row), "download of W");
            for (int64_t g0 = 0; g0 < k; g0 += gl) {
                int64_t len = k - g0 < gl ? k - g0 : gl;
                float mx = 0;
                for (int64_t c = g0; c < g0 + len; c++) mx = fabsf(row[c]) > mx ? fabsf(row[c]) : mx;
                for (int64_t c = g0; c < g0 + len; c++) acc[c] += fabsf(row[c]) / (mx + 1e-6f);
            }
            total_rows++;
        }
    for (int64_t c = 0; c < k; c++) w_mean[c] = (float)(acc[c] / (double)total_rows);
done:
    free(acc);
    free(row);
    return rc;
}

/* v[c] <- mean of v over c's tie class, in place. */
static int awq_tie_average(const int32_t *tie, int64_t k, float *v)
{
    double *sum = calloc((size_t)k, sizeof *sum);
    int64_t *cnt = calloc((size_t)k, sizeof *cnt);
    if (!sum || !cnt) { free(sum); free(cnt); return QD_ENOMEM; }
    for (int64_t c = 0; c < k; c++) { sum[tie[c]] += v[c]; cnt[tie[c]]++; }
    for (int64_t c = 0; c < k; c++) v[c] = (float)(sum[tie[c]] / (double)cnt[tie[c]]);
    free(sum);
    free(cnt);
    return 0;
}

/* The candidate scales of one alpha, normalised as AutoAWQ does. */
static void awq_candidate(const float *x_mean, const float *w_mean, int64_t k, float alpha, float *s)
{
    float mx = 0, mn = INFINITY;
    for (int64_t c = 0; c < k; c++) {
        float v = powf(x_mean[c], alpha);
        if (w_mean) v = v / (powf(w_mean[c], 1.0f - alpha) + 1e-4f);
        if (!(v >= 1e-4f)) v = 1e-4f;                  /* also catches NaN */
        s[c] = v;
        if (v > mx) mx = v;
        if (v < mn) mn = v;
    }
    float norm = (float)sqrt((double)mx * (double)mn);
    for (int64_t c = 0; c < k; c++) {
        s[c] = s[c] / norm;
        if (!isfinite(s[c])) s[c] = 1.0f;              /* overflowing scales stay unscaled */
    }
}

static int check_common(const qd_quant_cfg *cfg, const qd_awq_opts *o, int64_t k, qd_err *err)
{
    int rc = qd_quant_cfg_validate(cfg, err);
    if (!rc) rc = qd_awq_opts_validate(o, err);
    if (!rc && k < 1) rc = qd_err_set(err, QD_EINVAL, "awq: in_features %lld must be positive", (long long)k);
    return rc;
}

int qd_awq_search_scales_cb(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                            const float *const *w, const int64_t *n, int n_layers, int64_t k,
                            const float *x_mean, qd_awq_loss_fn fn, void *user,
                            qd_awq_scales *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_common(cfg, o, k, err);
    if (rc) return rc;
    if (!w || !n || n_layers < 1 || !x_mean || !fn)
        return qd_err_set(err, QD_EINVAL, "awq: scale search needs layers, x_mean and a loss");
    for (int i = 0; i < n_layers; i++)
        if (!w[i] || n[i] < 1)
            return qd_err_set(err, QD_EINVAL, "awq: layer %d has no weights or %lld rows", i, (long long)n[i]);
    for (int64_t c = 0; o->tie && c < k; c++)
        if (o->tie[c] < 0 || o->tie[c] >= k)
            return qd_err_set(err, QD_EINVAL, "awq: tie class %d of channel %lld is outside 0..%lld", (int)o->tie[c],
                              (long long)c, (long long)(k - 1));

    float *s = malloc((size_t)k * sizeof *s), *best = malloc((size_t)k * sizeof *best);
    float *w_mean = NULL, *s_dev = NULL, *x_tied = NULL;
    float **wq = calloc((size_t)n_layers, sizeof *wq);
    double *loss = calloc((size_t)o->n_grid, sizeof *loss);
    OOM_IF(!s || !best || !wq || !loss);
    if (o->duo_scaling) {
        w_mean = malloc((size_t)k * sizeof *w_mean);
        OOM_IF(!w_mean);
        rc = awq_w_mean(be, cfg, w, n, n_layers, k, w_mean, err);
        if (rc) goto done;
    }
    if (o->tie) {
        x_tied = malloc((size_t)k * sizeof *x_tied);
        OOM_IF(!x_tied);
        memcpy(x_tied, x_mean, (size_t)k * sizeof *x_tied);
        OOM_IF(awq_tie_average(o->tie, k, x_tied));
        OOM_IF(w_mean && awq_tie_average(o->tie, k, w_mean));
        x_mean = x_tied;
    }
    s_dev = qd_backend_alloc(be, (size_t)k * sizeof *s_dev);
    if (!s_dev) { rc = be_fail(be, QD_ENOMEM, "scales buffer", err); goto done; }
    for (int i = 0; i < n_layers; i++) {
        wq[i] = qd_backend_alloc(be, (size_t)(n[i] * k) * sizeof(float));
        if (!wq[i]) { rc = be_fail(be, QD_ENOMEM, "candidate weights", err); goto done; }
    }
    /* Without duo scaling alpha 0 is s = 1 (plain RTN). With it, alpha 0 is not the identity
     * (AutoAWQ's grid has no identity), so s = 1 is scored first as one more candidate: a
     * group the search cannot improve keeps its weights, and the chosen scales never raise
     * the calibration loss above RTN's. */
    double id_loss = 0;
    const int try_identity = o->duo_scaling;
    int best_i = -1;
    for (int a = try_identity ? -1 : 0; a < o->n_grid; a++) {
        float alpha = a < 0 ? 0.0f : (float)a / (float)o->n_grid;
        if (a < 0) for (int64_t c = 0; c < k; c++) s[c] = 1.0f;
        else awq_candidate(x_mean, w_mean, k, alpha, s);
        BE_TRY(qd_backend_upload(be, s_dev, s, (size_t)k * sizeof *s), "upload of scales");
        for (int i = 0; i < n_layers; i++) {
            size_t bytes = (size_t)(n[i] * k) * sizeof(float);
            BE_TRY(be->ops->copy(be, wq[i], w[i], bytes), "copy of W");
            BE_TRY(be->ops->scale_cols(be, wq[i], n[i], k, s_dev, 0), "W diag(s)");
            BE_TRY(be->ops->fake_quant(be, cfg, wq[i], n[i], k), "fake quantization");
            BE_TRY(be->ops->scale_cols(be, wq[i], n[i], k, s_dev, 1), "Q(W diag(s)) diag(s)^-1");
        }
        double *la = a < 0 ? &id_loss : &loss[a];
        rc = fn(user, be, (const float *const *)wq, n_layers, la, err);
        if (rc) { qd_err_prefix(err, "awq: loss at alpha %.2f", (double)alpha); goto done; }
        if (!isfinite(*la)) {
            rc = qd_err_set(err, QD_ENUMERIC, "awq: loss at alpha %.2f is not finite", (double)alpha);
            goto done;
        }
        if (a >= 0 && (best_i < 0 || loss[a] < loss[best_i])) {
            best_i = a;
            memcpy(best, s, (size_t)k * sizeof *s);
        }
    }
    /* The identity also wins ties: then there is nothing to fold. */
    out->identity = try_identity ? id_loss <= loss[best_i] : best_i == 0;
    if (try_identity && out->identity)
        for (int64_t c = 0; c < k; c++) best[c] = 1.0f;
    out->k = k;
    out->s = best;
    best = NULL;
    out->n_grid = o->n_grid;
    out->loss = loss;
    loss = NULL;
    out->best_alpha = (float)best_i / (float)o->n_grid;
    out->rtn_loss = try_identity ? id_loss : out->loss[0];
    out->best_loss = out->identity ? out->rtn_loss : out->loss[best_i];
done:
    if (wq)
        for (int i = 0; i < n_layers; i++)
            if (wq[i]) qd_backend_free(be, wq[i]);
    if (s_dev) qd_backend_free(be, s_dev);
    free(wq);
    free(s);
    free(best);
    free(w_mean);
    free(x_tied);
    free(loss);
    return rc;
}

/* The built-in loss: sum over layers of ||X Wq_i^T - X W_i^T||^2, with W_i X cached when it
 * fits in opts.ref_cache_bytes. */
typedef struct awq_lin_ctx {
    const float *x;
    int64_t rows, ldx, k, chunk;
    const float *const *w;
    const int64_t *n;
    float **yref;             /* per layer [rows, n_i] backend, or NULL when not cached */
    float *ya, *yb;           /* [chunk, max n] backend scratch */
    awq_gram *gram;           /* the Gram form instead (rows > k), or NULL */
    float **w_host;           /* with gram: per layer host copy of W [n_i, k] */
} awq_lin_ctx;

static int awq_lin_loss(void *user, qd_backend *be, const float *const *wq, int n_layers,
                        double *loss, qd_err *err)
{
    awq_lin_ctx *c = user;
    double total = 0;
    int rc = 0;
    for (int i = 0; i < n_layers && c->gram; i++) {
        double part = 0;
        rc = awq_gram_err(be, c->gram, wq[i], c->w_host[i], c->n[i], NULL, &part, err);
        if (rc) return rc;
        total += part;
    }
    for (int i = 0; i < n_layers && !c->gram; i++) {
        int64_t ni = c->n[i];
        for (int64_t r0 = 0; r0 < c->rows; r0 += c->chunk) {
            int64_t m = c->rows - r0 < c->chunk ? c->rows - r0 : c->chunk;
            const float *xr = c->x + r0 * c->ldx;
            const float *ref;
            double part = 0;
            BE_TRY(be->ops->gemm(be, 0, 1, m, ni, c->k, 1.0f, xr, c->ldx, wq[i], c->k, 0.0f, c->ya, ni),
                   "gemm X Wq^T");
            if (c->yref) {
                ref = c->yref[i] + r0 * ni;
            } else {
                BE_TRY(be->ops->gemm(be, 0, 1, m, ni, c->k, 1.0f, xr, c->ldx, c->w[i], c->k, 0.0f, c->yb, ni),
                       "gemm X W^T");
                ref = c->yb;
            }
            BE_TRY(be->ops->sq_diff_sum(be, c->ya, ref, m * ni, &part), "sq_diff_sum");
            total += part;
        }
    }
    *loss = total;
done:
    return rc;
}

int qd_awq_search_scales(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                         const float *const *w, const int64_t *n, int n_layers, int64_t k,
                         const float *x, int64_t rows, int64_t ldx, qd_awq_scales *out,
                         qd_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_common(cfg, o, k, err);
    if (rc) return rc;
    if (!x || rows < 1 || ldx < k || !w || !n || n_layers < 1)
        return qd_err_set(err, QD_EINVAL, "awq: scale search needs X with rows >= 1, ldx >= k, and layers");
    awq_lin_ctx c = {.x = x, .rows = rows, .ldx = ldx, .k = k, .w = w, .n = n,
                     .chunk = rows < o->chunk_rows ? rows : o->chunk_rows};
    awq_gram gram;
    memset(&gram, 0, sizeof gram);
    int64_t max_n = 0, sum_n = 0;
    for (int i = 0; i < n_layers; i++) {
        if (n[i] < 1) return qd_err_set(err, QD_EINVAL, "awq: layer %d has %lld rows", i, (long long)n[i]);
        max_n = n[i] > max_n ? n[i] : max_n;
        sum_n += n[i];
    }
    float *x_mean = malloc((size_t)k * sizeof *x_mean);
    OOM_IF(!x_mean);
    rc = qd_awq_x_mean(be, x, rows, k, ldx, x_mean, err);
    if (rc) goto done;
    if (o->gram && rows > k) {
        /* Each candidate then costs sum_n * k^2 flops instead of rows * sum_n * k. */
        rc = awq_gram_init(be, &gram, NULL, x, rows, ldx, k, max_n, err);
        if (rc) goto done;
        c.gram = &gram;
        rc = awq_weights_to_host(be, w, n, n_layers, k, &c.w_host, err);
        if (rc) goto done;
    } else {
        c.ya = qd_backend_alloc(be, (size_t)(c.chunk * max_n) * sizeof(float));
        c.yb = qd_backend_alloc(be, (size_t)(c.chunk * max_n) * sizeof(float));
        if (!c.ya || !c.yb) { rc = be_fail(be, QD_ENOMEM, "scratch for outputs", err); goto done; }
    }
    if (!c.gram && (double)rows * (double)sum_n * sizeof(float) <= (double)o->ref_cache_bytes) {
        c.yref = calloc((size_t)n_layers, sizeof *c.yref);
        OOM_IF(!c.yref);
        for (int i = 0; i < n_layers; i++) {
            c.yref[i] = qd_backend_alloc(be, (size_t)(rows * n[i]) * sizeof(float));
            if (!c.yref[i]) { rc = be_fail(be, QD_ENOMEM, "cache of W X", err); goto done; }
            BE_TRY(be->ops->gemm(be, 0, 1, rows, n[i], k, 1.0f, x, ldx, w[i], k, 0.0f, c.yref[i], n[i]),
                   "gemm X W^T");
        }
    }
    rc = qd_awq_search_scales_cb(be, cfg, o, w, n, n_layers, k, x_mean, awq_lin_loss, &c, out, err);
done:
    if (c.yref) {
        for (int i = 0; i < n_layers; i++)
            if (c.yref[i]) qd_backend_free(be, c.yref[i]);
        free(c.yref);
    }
    if (c.ya) qd_backend_free(be, c.ya);
    if (c.yb) qd_backend_free(be, c.yb);
    if (c.w_host)
        for (int i = 0; i < n_layers; i++) free(c.w_host[i]);
    free(c.w_host);
    awq_gram_free(be, &gram);
    free(x_mean);
    return rc;
}

int qd_awq_search_scales_h(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                           const float *const *w, const int64_t *n, int n_layers, int64_t k,
                           const float *x_mean, const qd_gptq_hessian *h, qd_awq_scales *out,
                           qd_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_common(cfg, o, k, err);
    if (rc) return rc;
    if (!x_mean || !h || !w || !n || n_layers < 1)
        return qd_err_set(err, QD_EINVAL, "awq: scale search needs x_mean, a Hessian and layers");
    awq_lin_ctx c = {.k = k, .w = w, .n = n};
    awq_gram gram;
    memset(&gram, 0, sizeof gram);
    int64_t max_n = 0;
    for (int i = 0; i < n_layers; i++) {
        if (!w[i] || n[i] < 1) return qd_err_set(err, QD_EINVAL, "awq: layer %d has no weights or %lld rows", i, (long long)n[i]);
        max_n = n[i] > max_n ? n[i] : max_n;
    }
    rc = awq_gram_init(be, &gram, h, NULL, h->n_seen, k, k, max_n, err);
    if (rc) return rc;
    c.gram = &gram;
    rc = awq_weights_to_host(be, w, n, n_layers, k, &c.w_host, err);
    if (rc) goto done;
    rc = qd_awq_search_scales_cb(be, cfg, o, w, n, n_layers, k, x_mean, awq_lin_loss, &c, out, err);
done:
    if (c.w_host)
        for (int i = 0; i < n_layers; i++) free(c.w_host[i]);
    free(c.w_host);
    awq_gram_free(be, &gram);
    return rc;
}

/* dst = clamp(ws, -bound, bound) per (row, group). */
static void awq_clamp(const float *ws, const float *bound, int64_t n, int64_t k, int64_t gl,
                      int64_t ng, float *dst)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++) {
            float b = bound[r * ng + c / gl], v = ws[r * k + c];
            dst[r * k + c] = v > b ? b : v < -b ? -b : v;
        }
}

/* Uploads the clamped scaled weight, fake-quantizes it and divides by s: the effective
 * weight in the original input space. */
static int awq_effective(qd_backend *be, const qd_quant_cfg *cfg, const float *host, const float *s_dev,
                         int64_t n, int64_t k, float *dev, qd_err *err)
{
    int rc = 0;
    BE_TRY(qd_backend_upload(be, dev, host, (size_t)(n * k) * sizeof(float)), "upload of W");
    BE_TRY(be->ops->fake_quant(be, cfg, dev, n, k), "fake quantization");
    if (s_dev) BE_TRY(be->ops->scale_cols(be, dev, n, k, s_dev, 1), "Q(W diag(s)) diag(s)^-1");
done:
    return rc;
}

int qd_awq_search_clip(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                       const float *w, int64_t n, int64_t k, const float *x, int64_t rows,
                       int64_t ldx, const float *s, qd_awq_clip *out, qd_err *err)
{
    return qd_awq_search_clip_h(be, cfg, o, w, n, k, x, rows, ldx, NULL, s, out, err);
}

int qd_awq_search_clip_h(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                         const float *w, int64_t n, int64_t k, const float *x, int64_t rows,
                         int64_t ldx, const qd_gptq_hessian *h, const float *s, qd_awq_clip *out,
                         qd_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_common(cfg, o, k, err);
    if (rc) return rc;
    if (!w || n < 1 || !x || rows < 1 || ldx < k)
        return qd_err_set(err, QD_EINVAL, "awq: clip search needs W, X with rows >= 1 and ldx >= k");
    const int64_t gl = qd_quant_group_len(cfg, k), ng = qd_quant_n_groups(cfg, k), nk = n * k;
    const int64_t step = rows / o->clip_n_tokens > 1 ? rows / o->clip_n_tokens : 1;
    const int64_t rs = (rows + step - 1) / step;
    int n_ratio = (int)(o->clip_max_shrink * (float)o->clip_n_grid);
    if (n_ratio < 1) n_ratio = 1;                       /* ratio 1 (no clipping) is always tried */

    float *wh = malloc((size_t)nk * sizeof *wh), *ws = malloc((size_t)nk * sizeof *ws);
    float *wc = malloc((size_t)nk * sizeof *wc), *mh = malloc((size_t)nk * sizeof *mh);
    float *org = malloc((size_t)(n * ng) * sizeof *org), *bound = malloc((size_t)(n * ng) * sizeof *bound);
    float *best = malloc((size_t)(n * ng) * sizeof *best);
    double *best_err = malloc((size_t)(n * ng) * sizeof *best_err);
    double *e_clip = malloc((size_t)n * sizeof *e_clip), *e_none = malloc((size_t)n * sizeof *e_none);
    float *s_dev = NULL, *xs = NULL, *hb = NULL, *mref = NULL, *we = NULL, *m = NULL, *wnc = NULL;
    awq_gram gram;
    memset(&gram, 0, sizeof gram);
    OOM_IF(!wh || !ws || !wc || !mh || !org || !bound || !best || !best_err || !e_clip || !e_none);

    BE_TRY(qd_backend_download(be, wh, w, (size_t)nk * sizeof *wh), "download of W");
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++) ws[r * k + c] = s ? wh[r * k + c] * s[c] : wh[r * k + c];
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < ng; g++) {
            float mx = 0;
            for (int64_t c = g * gl; c < k && c < (g + 1) * gl; c++)
                mx = fabsf(ws[r * k + c]) > mx ? fabsf(ws[r * k + c]) : mx;
            org[r * ng + g] = mx;
            best[r * ng + g] = mx;
            best_err[r * ng + g] = INFINITY;
        }

    size_t nkb = (size_t)nk * sizeof(float);
    xs = qd_backend_alloc(be, (size_t)(rs * k) * sizeof(float));
    hb = qd_backend_alloc(be, (size_t)(ng * gl * gl) * sizeof(float));
    mref = qd_backend_alloc(be, nkb);
    we = qd_backend_alloc(be, nkb);
    m = qd_backend_alloc(be, nkb);
    wnc = qd_backend_alloc(be, nkb);
    if (s) s_dev = qd_backend_alloc(be, (size_t)k * sizeof(float));
    if (!xs || !hb || !mref || !we || !m || !wnc || (s && !s_dev)) {
        rc = be_fail(be, QD_ENOMEM, "clip search buffers", err);
        goto done;
    }
    if (s) BE_TRY(qd_backend_upload(be, s_dev, s, (size_t)k * sizeof(float)), "upload of scales");
    /* The sampled rows (every step-th, as AutoAWQ) and their per-group Gram blocks. */
    for (int64_t t = 0; t < rs; t++)
        BE_TRY(be->ops->copy(be, xs + t * k, x + t * step * ldx, (size_t)k * sizeof(float)), "copy of X rows");
    for (int64_t g = 0; g < ng; g++) {
        int64_t g0 = g * gl, len = k - g0 < gl ? k - g0 : gl;
        BE_TRY(be->ops->gemm(be, 1, 0, len, len, rs, 1.0f, xs + g0, k, xs + g0, k, 0.0f, hb + g * gl * gl, gl),
               "gemm X_g^T X_g");
        BE_TRY(be->ops->gemm(be, 0, 0, n, len, len, 1.0f, w + g0, k, hb + g * gl * gl, gl, 0.0f, mref + g0, k),
               "gemm W_g H_g");
    }
    for (int i = 0; i < n_ratio; i++) {
        float ratio = 1.0f - (float)i / (float)o->clip_n_grid;
        for (int64_t j = 0; j < n * ng; j++) bound[j] = org[j] * ratio;
        awq_clamp(ws, bound, n, k, gl, ng, wc);
        rc = awq_effective(be, cfg, wc, s_dev, n, k, we, err);
        if (rc) goto done;
        /* m = We_g H_g - W_g H_g = dW_g H_g, so err(n, g) = <m[n, g], dW[n, g]>. */
        BE_TRY(be->ops->copy(be, m, mref, nkb), "copy");
        for (int64_t g = 0; g < ng; g++) {
            int64_t g0 = g * gl, len = k - g0 < gl ? k - g0 : gl;
            BE_TRY(be->ops->gemm(be, 0, 0, n, len, len, 1.0f, we + g0, k, hb + g * gl * gl, gl, -1.0f, m + g0, k),
                   "gemm dW_g H_g");
        }
        BE_TRY(qd_backend_download(be, wc, we, nkb), "download of We");
        BE_TRY(qd_backend_download(be, mh, m, nkb), "download of dW H");
        for (int64_t r = 0; r < n; r++)
            for (int64_t g = 0; g < ng; g++) {
                double e = 0;
                for (int64_t c = g * gl; c < k && c < (g + 1) * gl; c++)
                    e += (double)mh[r * k + c] * ((double)wc[r * k + c] - (double)wh[r * k + c]);
                if (e < best_err[r * ng + g]) {
                    best_err[r * ng + g] = e;
                    best[r * ng + g] = bound[r * ng + g];
                }
            }
    }
    /* Guard on all calibration rows: a row keeps its clipping only if it helps that row. */
    rc = awq_effective(be, cfg, ws, s_dev, n, k, wnc, err);
    if (rc) goto done;
    awq_clamp(ws, best, n, k, gl, ng, wc);
    rc = awq_effective(be, cfg, wc, s_dev, n, k, we, err);
    if (!rc && (h || (o->gram && rows > k))) {
        /* The per-row errors through X^T X (the caller's Hessian when given). */
        double tot;
        rc = awq_gram_init(be, &gram, h, x, rows, ldx, k, n, err);
        if (!rc) rc = awq_gram_err(be, &gram, wnc, wh, n, e_none, &tot, err);
        if (!rc) rc = awq_gram_err(be, &gram, we, wh, n, e_clip, &tot, err);
    } else {
        if (!rc) rc = awq_row_sq_err(be, x, rows, ldx, k, wnc, w, n, o->chunk_rows, e_none, err);
        if (!rc) rc = awq_row_sq_err(be, x, rows, ldx, k, we, w, n, o->chunk_rows, e_clip, err);
    }
    if (rc) goto done;
    for (int64_t r = 0; r < n; r++) {
        out->loss_noclip += e_none[r];
        if (e_clip[r] > e_none[r]) {
            memcpy(best + r * ng, org + r * ng, (size_t)ng * sizeof *best);
            out->rows_reverted++;
            out->loss_clip += e_none[r];
        } else {
            out->loss_clip += e_clip[r];
        }
    }
    out->n = n;
    out->k = k;
    out->group_len = gl;
    out->n_groups = ng;
    out->max = best;
    best = NULL;
done:
    free(wh); free(ws); free(wc); free(mh); free(org); free(bound); free(best);
    free(best_err); free(e_clip); free(e_none);
    awq_gram_free(be, &gram);
    float *devs[] = {s_dev, xs, hb, mref, we, m, wnc};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++)
        if (devs[i]) qd_backend_free(be, devs[i]);
    return rc;
}

int qd_awq_apply(const float *s, const qd_awq_clip *clip, float *w, int64_t n, int64_t k, qd_err *err)
{
    if (!w || n < 1 || k < 1) return qd_err_set(err, QD_EINVAL, "awq: apply needs a weight");
    if (clip && (clip->n != n || clip->k != k || !clip->max || clip->group_len < 1))
        return qd_err_set(err, QD_ESHAPE, "awq: clip result for [%lld, %lld] does not fit weight [%lld, %lld]",
                          (long long)clip->n, (long long)clip->k, (long long)n, (long long)k);
    if (s)
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < k; c++) w[r * k + c] *= s[c];
    if (clip)
        awq_clamp(w, clip->max, n, k, clip->group_len, clip->n_groups, w);
    return 0;
}

int qd_awq_linear(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o, const float *w,
                  int64_t n, int64_t k, const float *x, int64_t rows, int64_t ldx,
                  qd_awq_result *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    const float *ws[1] = {w};
    int64_t ns[1] = {n};
    int rc = qd_awq_search_scales(be, cfg, o, ws, ns, 1, k, x, rows, ldx, &out->scales, err);
    if (!rc) rc = qd_awq_output_sq_err(be, x, rows, ldx, k, w, NULL, n, o->chunk_rows, &out->ref_norm2, err);
    if (!rc && o->clip)
        rc = qd_awq_search_clip(be, cfg, o, w, n, k, x, rows, ldx, out->scales.s, &out->clip, err);
    if (rc) qd_awq_result_free(out);
    return rc;
}
