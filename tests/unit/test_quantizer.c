/* The min-max quantizer and RTN: config validation, known answers (round half to even,
 * zero-point rounding, constant groups, clipping, zero_min1), error bounds per bit width
 * for sym/asym with a partial last group, F16 scales, and fake quant == RTN dequant. */
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/formats/quantizer.h"
#include "test_util.h"

static qd_quant_cfg cfg(int bits, int sym, int64_t gs)
{
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = bits;
    c.sym = sym;
    c.group_size = gs;
    return c;
}

static void test_validate(void)
{
    qd_err e = {0};
    qd_quant_cfg c = qd_quant_cfg_default();
    CHECK_INT(c.bits, 4);
    CHECK_INT(c.sym, 1);
    CHECK_INT(c.group_size, 128);
    CHECK_INT(c.f16_scales, 1);
    CHECK_OK(qd_quant_cfg_validate(&c, &e));
    c.bits = 5;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    CHECK_CONTAINS(e.msg, "bits: 5");
    c = qd_quant_cfg_default();
    c.group_size = 0;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    CHECK_CONTAINS(e.msg, "group_size");
    c = qd_quant_cfg_default();
    c.clip_ratio = 0.0f;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    c = cfg(4, 1, -1);
    CHECK_OK(qd_quant_cfg_validate(&c, &e));
    CHECK_INT(qd_quant_n_groups(&c, 100), 1);
    CHECK_INT(qd_quant_group_len(&c, 100), 100);
    c.group_size = 32;
    CHECK_INT(qd_quant_n_groups(&c, 100), 4);
    CHECK_INT(qd_quant_n_groups(&c, 96), 3);
}

static void test_known_answers(void)
{
    /* asym 2-bit: xmin -1, xmax 2 -> s = 1, z = 1; 0.5 / 1 = 0.5 rounds to 0 (even). */
    qd_quant_cfg c = cfg(2, 0, 4);
    float w[4] = {-1.0f, 0.0f, 0.5f, 2.0f}, s, z;
    qd_quant_params(&c, w, 4, 1, &s, &z);
    CHECK_NEAR(s, 1.0, 0);
    CHECK_NEAR(z, 1.0, 0);
    int want[4] = {0, 1, 1, 3};
    for (int i = 0; i < 4; i++) CHECK_INT(qd_quant_code(w[i], s, z, 3), want[i]);

    /* Round half to even: s = 0.25 (exact in F16), z = 0; 2.5 -> 2, 3.5 -> 4. */
    c = cfg(4, 0, 16);
    float v[16] = {0};
    v[0] = 3.75f;
    qd_quant_params(&c, v, 16, 1, &s, &z);
    CHECK_NEAR(s, 0.25, 0);
    CHECK_NEAR(z, 0.0, 0);
    CHECK_INT(qd_quant_code(0.625f, s, z, 15), 2);
    CHECK_INT(qd_quant_code(0.875f, s, z, 15), 4);
    CHECK_INT(qd_quant_code(-0.625f, s, z, 15), 0);      /* clamped */

    /* The zero point itself rounds half to even: xmin -7.5*s. 4-bit, xmin = -1.5, xmax = 1.5
     * -> s = 0.2, -xmin/s = 7.5 -> 8. */
    c = cfg(4, 0, 2);
    c.f16_scales = 0;
    float u[2] = {-1.5f, 1.5f};
    qd_quant_params(&c, u, 2, 1, &s, &z);
    CHECK_NEAR(s, 0.2, 1e-7);
    CHECK_NEAR(z, 8.0, 0);

    /* Symmetric: zero = 2^(bits-1), range mirrored even when all weights are >= 0. */
    c = cfg(4, 1, 4);
    c.f16_scales = 0;
    float p[4] = {0.0f, 0.5f, 1.0f, 1.5f};
    qd_quant_params(&c, p, 4, 1, &s, &z);
    CHECK_NEAR(s, 3.0 / 15.0, 1e-7);
    CHECK_NEAR(z, 8.0, 0);
    c = cfg(8, 1, 4);
    qd_quant_params(&c, p, 4, 1, &s, &z);
    CHECK_NEAR(z, 128.0, 0);
    c = cfg(3, 1, 4);
    qd_quant_params(&c, p, 4, 1, &s, &z);
    CHECK_NEAR(z, 4.0, 0);

    /* Strided access reads a column. */
    float m[6] = {-2.0f, 9.0f, 0.0f, 9.0f, 2.0f, 9.0f};
    c = cfg(2, 1, 3);
    c.f16_scales = 0;
    qd_quant_params(&c, m, 3, 2, &s, &z);
    CHECK_NEAR(s, 4.0 / 3.0, 1e-6);
}

static void test_constant_group(void)
{
    float w[8] = {0}, s, z;
    for (int sym = 0; sym <= 1; sym++)
        for (int bits = 2; bits <= 8; bits++) {
            if (bits > 4 && bits < 8) continue;
            qd_quant_cfg c = cfg(bits, sym, 8);
            int maxq = (1 << bits) - 1;
            qd_quant_params(&c, w, 8, 1, &s, &z);
            CHECK_NEAR(s, qd_f32_round_f16(2.0f / maxq), 0);   /* xmin -1, xmax +1 */
            CHECK(s > 0);
            CHECK_NEAR(qd_quant_dequant(qd_quant_code(0.0f, s, z, maxq), s, z), 0.0, 0);
        }
    /* A nonzero constant group is not degenerate (the range holds 0): exact at the top. */
    float k[8];
    for (int i = 0; i < 8; i++) k[i] = 0.5f;
    qd_quant_cfg c = cfg(4, 0, 8);
    qd_quant_params(&c, k, 8, 1, &s, &z);
    CHECK_NEAR(z, 0.0, 0);
    CHECK_NEAR(qd_quant_dequant(qd_quant_code(0.5f, s, z, 15), s, z), 0.5, s / 2);
}

static void test_clip(void)
{
    test_rng r;
    test_rng_seed(&r, 7);
    float w[64], s1, z1, s2, z2;
    test_fill_normal(&r, w, 64, 1.0f);
    qd_quant_cfg c = cfg(4, 1, 64);
    c.f16_scales = 0;
    qd_quant_params(&c, w, 64, 1, &s1, &z1);
    c.clip_ratio = 0.5f;
    qd_quant_params(&c, w, 64, 1, &s2, &z2);
    CHECK_NEAR(s2, 0.5 * s1, 1e-6 * s1);
    CHECK_NEAR(z2, z1, 0);
    c.clip_ratio = 1.5f;
    CHECK_ERR(qd_quant_cfg_validate(&c, NULL));
}

static void test_zero_min1(void)
{
    float w[16], s, z;
    for (int i = 0; i < 16; i++) w[i] = 0.1f + 0.06f * i;         /* all positive: z would be 0 */
    for (int bits = 2; bits <= 8; bits *= 2) {
        int maxq = (1 << bits) - 1;
        qd_quant_cfg c = cfg(bits, 0, 16);
        qd_quant_params(&c, w, 16, 1, &s, &z);
        CHECK_NEAR(z, 0.0, 0);
        c.zero_min1 = 1;
        qd_quant_params(&c, w, 16, 1, &s, &z);
        CHECK_NEAR(z, 1.0, 0);
        CHECK(s * (maxq - 1) >= w[15]);                          /* xmax still reachable */
        CHECK_NEAR(qd_f32_round_f16(s), s, 0);
        for (int i = 0; i < 16; i++) {
            float d = qd_quant_dequant(qd_quant_code(w[i], s, z, maxq), s, z);
            CHECK(fabsf(d - w[i]) <= 0.5f * s * 1.0001f);
        }
    }
    /* Groups that already have z >= 1 are unchanged. */
    float v[4] = {-1.0f, 0.0f, 0.5f, 2.0f}, s0, z0;
    qd_quant_cfg c = cfg(2, 0, 4);
    qd_quant_params(&c, v, 4, 1, &s0, &z0);
    c.zero_min1 = 1;
    qd_quant_params(&c, v, 4, 1, &s, &z);
    CHECK_NEAR(s, s0, 0);
    CHECK_NEAR(z, z0, 0);
}

static void test_bounds(void)
{
    const int64_t n = 16, k = 100;                      /* gs 32: last group has 4 values */
    test_rng r;
    test_rng_seed(&r, 42);
    float *w = malloc(n * k * sizeof *w), *deq = malloc(n * k * sizeof *deq);
    float *deq2 = malloc(n * k * sizeof *deq2);
    uint8_t *q = malloc(n * k);
    float scales[4 * 16], zeros[4 * 16];
    test_fill_normal(&r, w, n * k, 0.05f);
    w[3] = 0.9f;                                          /* an outlier in row 0 group 0 */
    int bitsv[4] = {2, 3, 4, 8};
    for (int bi = 0; bi < 4; bi++)
        for (int sym = 0; sym <= 1; sym++) {
            qd_quant_cfg c = cfg(bitsv[bi], sym, 32);
            int maxq = (1 << c.bits) - 1;
            qd_err e = {0};
            CHECK_OK(qd_rtn_quantize(&c, w, n, k, q, scales, zeros, deq, &e));
            int in_range_bad = 0, any_bad = 0, f16_bad = 0, layout_bad = 0;
            for (int64_t row = 0; row < n; row++)
                for (int64_t i = 0; i < k; i++) {
                    int64_t g = i / 32;
                    float s = scales[g * n + row], z = zeros[g * n + row];
                    float v = w[row * k + i], d = deq[row * k + i];
                    float raw = rintf(v / s) + z;
                    if (qd_f32_round_f16(s) != s) f16_bad++;
                    if (d != qd_quant_dequant(q[row * k + i], s, z)) layout_bad++;
                    if (raw >= 0 && raw <= maxq && fabsf(v - d) > 0.5f * s * 1.0001f) in_range_bad++;
                    /* clamping at the ends costs at most one step more than rounding */
                    if (fabsf(v - d) > s * 1.0001f) any_bad++;
                }
            CHECK_INT(in_range_bad, 0);
            CHECK_INT(any_bad, 0);
            CHECK_INT(f16_bad, 0);
            CHECK_INT(layout_bad, 0);
            /* Fake quant is the same computation in place. */
            memcpy(deq2, w, n * k * sizeof *w);
            CHECK_OK(qd_quant_fake_ref(&c, deq2, n, k));
            CHECK(memcmp(deq2, deq, n * k * sizeof *w) == 0);
            /* More bits, less error (RMS), sym or not. */
            double err = 0;
            for (int64_t i = 0; i < n * k; i++) err += (w[i] - deq[i]) * (w[i] - deq[i]);
            static double prev[2];
            if (bi > 0) CHECK(err < prev[sym]);
            prev[sym] = err;
        }
    /* group -1: one group per row */
    qd_quant_cfg c = cfg(4, 0, -1);
    CHECK_OK(qd_rtn_quantize(&c, w, n, k, q, scales, zeros, NULL, NULL));
    float s, z;
    qd_quant_params(&c, w + 5 * k, k, 1, &s, &z);
    CHECK_NEAR(scales[5], s, 0);
    CHECK_NEAR(zeros[5], z, 0);
    /* Non-finite weights are refused. */
    qd_err e = {0};
    w[7] = NAN;
    CHECK_INT(qd_rtn_quantize(&c, w, n, k, q, NULL, NULL, NULL, &e), QD_ENUMERIC);
    CHECK_INT(qd_quant_fake_ref(&c, w, n, k), QD_ENUMERIC);
    c.bits = 7;
    CHECK_INT(qd_rtn_quantize(&c, w, n, k, q, NULL, NULL, NULL, &e), QD_EINVAL);
    free(w); free(deq); free(deq2); free(q);
}

int main(void)
{
    TEST_RUN(test_validate);
    TEST_RUN(test_known_answers);
    TEST_RUN(test_constant_group);
    TEST_RUN(test_clip);
    TEST_RUN(test_zero_min1);
    TEST_RUN(test_bounds);
    return test_finish();
}
