/* CPU backend quantization ops used by the AWQ search: fake quantization (delegates to the
 * scalar reference quantizer row by row, rows split over the backend's threads, so CPU
 * results are the reference), column scaling (rows split likewise) and the
 * squared-difference reduction. All memory is host memory on this backend. */
#include "quant/backend/cpu/cpu_internal.h"

#include "quant/core/finite.h"
#include "quant/core/parallel.h"
#include "quant/formats/quantizer.h"

/* Rows per share: a row is quantized (or scaled) by one thread exactly as the reference
 * does it, so the result does not depend on the thread count. */
#define QUANT_ROW_GRAIN 16

typedef struct fake_quant_ctx {
    const struct qd_quant_cfg *cfg;
    float *w;
    int64_t k;
    int rc[QD_PARALLEL_MAX_THREADS];
} fake_quant_ctx;

static void finite_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    fake_quant_ctx *c = ctx;
    c->rc[t] = qd_f32_first_nonfinite(c->w + r0 * c->k, (r1 - r0) * c->k) >= 0 ? QD_ENUMERIC : 0;
}

static void fake_quant_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    fake_quant_ctx *c = ctx;
    c->rc[t] = qd_quant_fake_ref(c->cfg, c->w + r0 * c->k, r1 - r0, c->k);
}

static int fake_quant_rc(const fake_quant_ctx *c)
{
    for (int t = 0; t < QD_PARALLEL_MAX_THREADS; t++)
        if (c->rc[t]) return c->rc[t];
    return 0;
}

int cpu_fake_quant(qd_backend *be, const struct qd_quant_cfg *cfg, float *w, int64_t n, int64_t k)
{
    if (!cfg || !w || n < 0 || k < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu fake_quant: null argument or negative shape");
    int rc = qd_quant_cfg_validate(cfg, &be->err);
    if (rc) return rc;
    /* The reference refuses a non-finite weight before it changes anything; checked first
     * over the whole matrix (one pass, split likewise) so that a refusal leaves every row as
     * it was. */
    fake_quant_ctx c = {.cfg = cfg, .w = w, .k = k};
    qd_parallel_for(be->n_threads, n, QUANT_ROW_GRAIN, finite_rows, &c);
    if (fake_quant_rc(&c))
        return qd_err_set(&be->err, QD_ENUMERIC, "cpu fake_quant: weights [%lld, %lld] hold a non-finite value",
                          (long long)n, (long long)k);
    /* NVFP4's global scale is the whole weight's, found once here; rows sharing a scale
     * (row_block) are quantized by one thread. */
    qd_quant_cfg cc = *cfg;
    if (cc.scale_rule == QD_SCALE_FP8_GLOBAL && cc.global_scale == 0.0f)
        cc.global_scale = qd_quant_global_scale(qd_quant_amax(w, n * k));
    c.cfg = &cc;
    qd_parallel_for(cc.row_block == 1 ? be->n_threads : 1, n, QUANT_ROW_GRAIN, fake_quant_rows, &c);
    rc = fake_quant_rc(&c);
    if (rc) return qd_err_set(&be->err, rc, "cpu fake_quant: rows of [%lld, %lld] refused", (long long)n, (long long)k);
    return 0;
}

typedef struct scale_cols_ctx {
    float *w;
    int64_t cols;
    const float *s;
    int inverse;
} scale_cols_ctx;

static void scale_cols_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    scale_cols_ctx *c = ctx;
    (void)t;
    for (int64_t r = r0; r < r1; r++) {
        float *row = c->w + r * c->cols;
        if (c->inverse)
            for (int64_t j = 0; j < c->cols; j++) row[j] /= c->s[j];
        else
            for (int64_t j = 0; j < c->cols; j++) row[j] *= c->s[j];
    }
}

int cpu_scale_cols(qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, int inverse)
{
    if (!w || !s || rows < 0 || cols < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu scale_cols: null argument or negative shape");
    scale_cols_ctx c = {w, cols, s, inverse};
    qd_parallel_for(be->n_threads, rows, QUANT_ROW_GRAIN, scale_cols_rows, &c);
    return 0;
}

int cpu_abs_max(qd_backend *be, const float *x, int64_t n, float *out)
{
    if (!x || !out || n < 0) return qd_err_set(&be->err, QD_EINVAL, "cpu abs_max: null argument or negative length");
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    *out = m;
    return 0;
}

int cpu_sq_diff_sum(qd_backend *be, const float *a, const float *b, int64_t n, double *out)
{
    if (!a || !b || !out || n < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu sq_diff_sum: null argument or negative length");
    /* Four double accumulators: a fixed reduction order, and enough precision that the
     * AWQ search compares candidates by their real difference, not by rounding noise. */
    double acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) {
            double d = (double)a[i + j] - (double)b[i + j];
            acc[j] += d * d;
        }
    for (; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        acc[0] += d * d;
    }
    *out = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    return 0;
}
