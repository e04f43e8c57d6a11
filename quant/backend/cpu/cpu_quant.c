/* CPU backend quantization ops used by the AWQ search: fake quantization (delegates to the
 * scalar reference quantizer so CPU results are the reference), column scaling and the
 * squared-difference reduction. All memory is host memory on this backend. */
#include "quant/backend/cpu/cpu_internal.h"

#include "quant/formats/quantizer.h"

int cpu_fake_quant(qd_backend *be, const struct qd_quant_cfg *cfg, float *w, int64_t n, int64_t k)
{
    if (!cfg || !w || n < 0 || k < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu fake_quant: null argument or negative shape");
    int rc = qd_quant_cfg_validate(cfg, &be->err);
    if (rc) return rc;
    rc = qd_quant_fake_ref(cfg, w, n, k);
    if (rc) return qd_err_set(&be->err, rc, "cpu fake_quant: weights [%lld, %lld] hold a non-finite value",
                              (long long)n, (long long)k);
    return 0;
}

int cpu_scale_cols(qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, int inverse)
{
    if (!w || !s || rows < 0 || cols < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu scale_cols: null argument or negative shape");
    for (int64_t r = 0; r < rows; r++) {
        float *row = w + r * cols;
        if (inverse)
            for (int64_t c = 0; c < cols; c++) row[c] /= s[c];
        else
            for (int64_t c = 0; c < cols; c++) row[c] *= s[c];
    }
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
