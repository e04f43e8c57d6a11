/* The CPU backend's quantization ops (cpu_quant.c, through be->ops) against the scalar
 * reference: fake_quant gives the bits of qd_quant_fake_ref on every row whatever the thread
 * count (rows split over 1, 2 and 3 threads, a row count no share divides), scale_cols the
 * bits of a plain loop, and a non-finite weight is refused with every row left as it was. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/formats/quantizer.h"
#include "test_util.h"

static test_rng rng;

static float *randn(size_t n, float s)
{
    float *p = malloc(n * sizeof *p);
    test_fill_normal(&rng, p, n, s);
    return p;
}

static void test_fake_quant_bits(void)
{
    const int64_t N = 203, K = 96;
    float *w = randn((size_t)(N * K), 0.5f), *ref = malloc((size_t)(N * K) * 4), *got = malloc((size_t)(N * K) * 4);
    for (int threads = 1; threads <= 3; threads++) {
        qd_backend *be = NULL;
        qd_err err = {0};
        CHECK_OK(qd_backend_cpu_open(threads, NULL, &be, &err));
        if (!be) continue;
        for (int bits = 3; bits <= 4; bits++)
            for (int sym = 0; sym <= 1; sym++)
                for (int gs = 0; gs < 2; gs++) {
                    qd_quant_cfg c = qd_quant_cfg_default();
                    c.bits = bits;
                    c.sym = sym;
                    c.group_size = gs ? 32 : -1;
                    memcpy(ref, w, (size_t)(N * K) * 4);
                    memcpy(got, w, (size_t)(N * K) * 4);
                    CHECK_OK(qd_quant_fake_ref(&c, ref, N, K));
                    CHECK_OK(be->ops->fake_quant(be, &c, got, N, K));
                    CHECK(memcmp(ref, got, (size_t)(N * K) * 4) == 0);
                }
        /* A NaN in the last row: refused, and no row changed (the check precedes the work). */
        qd_quant_cfg c = qd_quant_cfg_default();
        memcpy(got, w, (size_t)(N * K) * 4);
        got[(N - 1) * K + 5] = NAN;
        CHECK_INT(be->ops->fake_quant(be, &c, got, N, K), QD_ENUMERIC);
        CHECK(memcmp(got, w, (size_t)((N - 1) * K) * 4) == 0);
        /* scale_cols, both directions, against the loop. */
        float *s = randn((size_t)K, 1.0f);
        for (int64_t j = 0; j < K; j++) s[j] = 0.5f + fabsf(s[j]);
        for (int inv = 0; inv <= 1; inv++) {
            memcpy(got, w, (size_t)(N * K) * 4);
            for (int64_t r = 0; r < N; r++)
                for (int64_t j = 0; j < K; j++) ref[r * K + j] = inv ? w[r * K + j] / s[j] : w[r * K + j] * s[j];
            CHECK_OK(be->ops->scale_cols(be, got, N, K, s, inv));
            CHECK(memcmp(ref, got, (size_t)(N * K) * 4) == 0);
        }
        free(s);
        qd_backend_close(be);
    }
    free(w);
    free(ref);
    free(got);
}

int main(void)
{
    test_rng_seed(&rng, 7);
    TEST_RUN(test_fake_quant_bits);
    return test_finish();
}
