/* The per-layer relative output error of the report, computed from the Hessian the job
 * already holds (tr(D H D^T) / tr(W H W^T) through A^T A, no second pass over the inputs),
 * equals the direct ||(W - Q) X^T|| / ||W X^T|| over the inputs within float tolerance, for
 * square, wide and tall layers and for Hessians accumulated in several chunks. */
#include <math.h>
#include <stdlib.h>

#include "quant/pipeline/pipeline_internal.h"
#include "test_util.h"

static void check_shape(qd_backend *be, int64_t n, int64_t k, int64_t rows, float noise)
{
    test_rng r;
    test_rng_seed(&r, (uint64_t)(n * 131 + k));
    float *w = malloc((size_t)(n * k) * sizeof *w), *q = malloc((size_t)(n * k) * sizeof *q);
    float *x = malloc((size_t)(rows * k) * sizeof *x);
    test_fill_normal(&r, w, (size_t)(n * k), 1.0f);
    test_fill_normal(&r, x, (size_t)(rows * k), 1.0f);
    for (int64_t i = 0; i < n * k; i++) q[i] = w[i] + noise * test_rng_normal(&r);
    /* A few input features much larger than the rest, as real activations have. */
    for (int64_t t = 0; t < rows; t++) x[t * k + 3] *= 20.0f;
    qd_err err = {0};
    qd_gptq_hessian h;
    CHECK_OK(qd_gptq_hessian_init(&h, be, k, &err));
    for (int64_t r0 = 0; r0 < rows; r0 += 37) CHECK_OK(qd_gptq_hessian_add(&h, x + r0 * k, rows - r0 < 37 ? rows - r0 : 37, &err));
    qd_pipeline p;
    memset(&p, 0, sizeof p);
    p.be = be;
    double rel = -1;
    CHECK_OK(qd_pipeline_rel_error(&p, w, q, n, k, &h, -1.0, &rel, &err));
    double num = 0, den = 0;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < n; i++) {
            double yd = 0, yw = 0;
            for (int64_t j = 0; j < k; j++) {
                yd += ((double)w[i * k + j] - q[i * k + j]) * x[t * k + j];
                yw += (double)w[i * k + j] * x[t * k + j];
            }
            num += yd * yd;
            den += yw * yw;
        }
    double direct = sqrt(num / den);
    CHECK_NEAR(rel, direct, 1e-4 * direct);
    /* A numerator given (GPTQ's column losses) is used as is; only the denominator's pass
     * runs. num here is ||D X^T||^2 in the Hessian's scale (H = 2/rows X^T X). */
    double rel2 = -1;
    CHECK_OK(qd_pipeline_rel_error(&p, w, q, n, k, &h, num * 2.0 / (double)rows, &rel2, &err));
    CHECK_NEAR(rel2, direct, 1e-4 * direct);
    qd_gptq_hessian_free(&h);
    free(w); free(q); free(x);
}

int main(void)
{
    qd_err err = {0};
    qd_backend *be = NULL;
    CHECK_OK(qd_backend_cpu_open(2, NULL, &be, &err));
    if (!be) return test_finish();
    check_shape(be, 64, 64, 300, 0.05f);
    check_shape(be, 40, 96, 250, 0.01f);    /* k > n (a down projection's shape) */
    check_shape(be, 128, 32, 200, 0.2f);    /* n > k */
    check_shape(be, 16, 48, 90, 1e-3f);     /* tiny errors */
    qd_backend_close(be);
    return test_finish();
}
