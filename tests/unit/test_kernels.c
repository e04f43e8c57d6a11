/* Dequantizing matmul kernels: the scalar reference against the format table's
 * dequant_ref, then the CPU kernel (portable and AVX2, GEMV and GEMM paths) against the
 * reference for every format, bit width, group size and layout, the exllama reorder, the
 * per-layer kernel check and the quick self-test on the CPU backend. */
#include <stdlib.h>

#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "test_util.h"

/* |a - b| <= 5e-5 * mag + 1e-5 * |b|, the self-test's f32 tolerance. */
static int close_enough(const float *a, const float *b, const double *mag, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= 5e-5 * mag[i] + 1e-5 * fabs((double)b[i]))) { *where = i; return 0; }
    }
    return 1;
}

static void random_x(test_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = test_rng_normal(r);
        x[i] = v >= 0 ? v + 0.01f : v - 0.01f;
    }
}

/* The reference reads the packed tensors exactly as dequant_ref decodes them. */
static void test_ref_matches_dequant(void)
{
    const char *fmts[] = {"gptq", "gptq_v2", "awq_gemm"};
    test_rng r;
    test_rng_seed(&r, 11);
    for (int f = 0; f < 3; f++) {
        const qd_format *fmt = qd_format_find(fmts[f]);
        for (int act = 0; act < (fmt->has_g_idx ? 2 : 1); act++) {
            const int64_t n = 64, k = 128, M = 3;
            qd_packed p;
            qd_err err = {0};
            CHECK_OK(qd_selftest_make_layer(fmt, 4, 32, act, n, k, 5 + f, &p, &err));
            qd_kmat m;
            CHECK_OK(qd_kmat_from_packed(fmt, &p, &m, &err));
            CHECK_INT(m.act_order, act);
            float *w = malloc(n * k * sizeof *w), *x = malloc(M * k * sizeof *x);
            float *y = malloc(M * n * sizeof *y);
            CHECK_OK(fmt->dequant_ref(&p, w, &err));
            random_x(&r, x, M * k);
            CHECK_OK(qd_kernel_matmul_ref(&m, x, M, y, NULL, &err));
            double worst = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t c = 0; c < n; c++) {
                    double acc = 0;
                    for (int64_t j = 0; j < k; j++) acc += (double)x[i * k + j] * w[c * k + j];
                    double d = fabs(acc - y[i * n + c]);
                    if (d > worst) worst = d;
                }
            CHECK_NEAR(worst, 0.0, 1e-5);
            free(w); free(x); free(y);
            qd_packed_free(&p);
        }
    }
}

/* One layer through every CPU variant and path, for several batch sizes. */
static void check_layer_variants(const qd_format *fmt, int bits, int64_t gs, int act, int reorder,
                                 int64_t n, int64_t k, uint64_t seed)
{
    qd_packed p;
    qd_err err = {0};
    if (qd_selftest_make_layer(fmt, bits, gs, act, n, k, seed, &p, &err)) {
        TEST_FAIL_("make_layer %s %d-bit g%lld: %s", fmt->name, bits, (long long)gs, err.msg);
        return;
    }
    qd_kmat view, re, *m = &view;
    CHECK_OK(qd_kmat_from_packed(fmt, &p, &view, &err));
    if (reorder) {
        CHECK_OK(qd_kmat_reorder(&view, &re, &err));
        m = &re;
    }
    static const int64_t Ms[] = {1, 2, 7, 8, 9, 20};
    const int have_avx2 = !strcmp(qd_kernel_cpu_isa_name(), "avx2");
    test_rng r;
    test_rng_seed(&r, seed);
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        int64_t M = Ms[mi];
        float *x = malloc(M * k * sizeof *x), *ref = malloc(M * n * sizeof *ref), *y = malloc(M * n * sizeof *y);
        double *mag = malloc(M * n * sizeof *mag);
        random_x(&r, x, M * k);
        CHECK_OK(qd_kernel_matmul_ref(m, x, M, ref, mag, &err));
        for (int isa = QD_KCPU_PORTABLE; isa <= (have_avx2 ? QD_KCPU_AVX2 : QD_KCPU_PORTABLE); isa++)
            for (int path = QD_KPATH_AUTO; path <= QD_KPATH_GEMM; path++) {
                for (int64_t i = 0; i < M * n; i++) y[i] = NAN;
                CHECK_OK(qd_kernel_matmul_cpu(m, x, M, y, (qd_kpath)path, (qd_kcpu_isa)isa, &err));
                size_t at = 0;
                if (!close_enough(y, ref, mag, M * n, &at))
                    TEST_FAIL_("%s %d-bit g%lld %s isa %d path %d M=%lld: y[%zu] = %.8g, ref %.8g", fmt->name, bits,
                               (long long)gs, qd_kmat_layout_name(m), isa, path, (long long)M, at, y[at], ref[at]);
                test_checks++;
            }
        free(x); free(ref); free(y); free(mag);
    }
    if (reorder) qd_kmat_free(&re);
    qd_packed_free(&p);
}

static void test_cpu_all_formats(void)
{
    static const int bits[] = {2, 3, 4, 8};
    static const int64_t groups[] = {32, 128, -1};
    uint64_t seed = 100;
    for (size_t f = 0; f < qd_format_count(); f++) {
        const qd_format *fmt = qd_format_at(f);
        for (int b = 0; b < 4; b++) {
            if (!(fmt->bits_mask & (1u << bits[b]))) continue;
            for (int g = 0; g < 3; g++) {
                check_layer_variants(fmt, bits[b], groups[g], 0, 0, 64, 256, seed++);
                if (fmt->has_g_idx && groups[g] > 0) {
                    check_layer_variants(fmt, bits[b], groups[g], 1, 0, 64, 256, seed++);
                    check_layer_variants(fmt, bits[b], groups[g], 1, 1, 64, 256, seed++);
                }
            }
        }
    }
    /* AWQ with a K that is not a multiple of 32 (one group): the tile tail. */
    check_layer_variants(qd_format_find("awq_gemm"), 4, -1, 0, 0, 24, 72, seed++);
}

/* The reorder sorts rows by group, stably, and the permuted layout gives the same y. */
static void test_reorder_layout(void)
{
    const qd_format *fmt = qd_format_find("gptq");
    qd_packed p;
    qd_err err = {0};
    CHECK_OK(qd_selftest_make_layer(fmt, 4, 32, 1, 32, 128, 42, &p, &err));
    qd_kmat v, re;
    CHECK_OK(qd_kmat_from_packed(fmt, &p, &v, &err));
    CHECK_OK(qd_kmat_reorder(&v, &re, &err));
    CHECK_INT(re.layout, QD_KMAT_GPTQ_REORDERED);
    int sorted = 1;
    for (int64_t i = 0; i < 128; i++) {
        if (p.g_idx[re.perm[i]] != i / 32) sorted = 0;
        if (i % 32 && re.perm[i] <= re.perm[i - 1]) sorted = 0;    /* stable within a group */
    }
    CHECK(sorted);
    /* Codes move with their rows. */
    CHECK_INT(qd_bits_get(4, re.qweight + 5, 32, 17), qd_bits_get(4, p.qweight + 5, 32, re.perm[17]));
    qd_kmat_free(&re);
    CHECK(re.qweight == NULL);
    /* A trivial g_idx cannot be act-order; unequal groups are refused. */
    CHECK_INT(v.act_order, 1);
    p.g_idx[0] = p.g_idx[127];
    CHECK_OK(qd_kmat_from_packed(fmt, &p, &v, &err));
    CHECK_ERR(qd_kmat_reorder(&v, &re, &err));
    CHECK_CONTAINS(err.msg, "group");
    qd_packed_free(&p);
}

static void test_bad_inputs(void)
{
    qd_err err = {0};
    qd_kmat m;
    memset(&m, 0, sizeof m);
    float x[4] = {1, 2, 3, 4}, y[4];
    CHECK_ERR(qd_kernel_matmul_ref(&m, x, 1, y, NULL, &err));
    CHECK_CONTAINS(err.msg, "missing");
    qd_packed p;
    CHECK_OK(qd_selftest_make_layer(qd_format_find("gptq_v2"), 4, 32, 0, 32, 64, 3, &p, &err));
    CHECK_OK(qd_kmat_from_packed(qd_format_find("gptq_v2"), &p, &m, &err));
    m.bits = 5;
    CHECK_ERR(qd_kernel_matmul_cpu(&m, x, 1, y, QD_KPATH_AUTO, QD_KCPU_AUTO, &err));
    CHECK_CONTAINS(err.msg, "5-bit");
    qd_packed_free(&p);
    qd_kmat_free(NULL);
}

/* The pipeline's per-layer check on the CPU backend: tiny error for a good layer against
 * the format's reference decode and against given weights equal to it, a large one when
 * the given weights differ from what was packed; no input rows is an error. */
static void test_check_layer(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    const qd_format *fmt = qd_format_find("awq_gemm");
    qd_packed p;
    CHECK_OK(qd_selftest_make_layer(fmt, 4, 64, 0, 64, 128, 9, &p, &err));
    test_rng r;
    test_rng_seed(&r, 3);
    float x[4 * 128];
    random_x(&r, x, 4 * 128);
    double rel = 1;
    CHECK_OK(qd_kernel_check_layer(be, fmt, &p, NULL, x, 4, &rel, &err));
    CHECK(rel < 1e-5);
    CHECK_ERR(qd_kernel_check_layer(be, fmt, &p, NULL, x, 0, &rel, &err));
    /* Given the weights the layer must decode to (the pipeline passes the quantizer's Q):
     * the same result when they are what it decodes to, a large error when one output
     * channel's weights differ from what was packed (a packing error). */
    float *wref = malloc(sizeof(float) * 64 * 128);
    CHECK_OK(fmt->dequant_ref(&p, wref, &err));
    rel = 1;
    CHECK_OK(qd_kernel_check_layer(be, fmt, &p, wref, x, 4, &rel, &err));
    CHECK(rel < 1e-5);
    for (int64_t c = 0; c < 128; c++) wref[5 * 128 + c] = -wref[5 * 128 + c];
    CHECK_OK(qd_kernel_check_layer(be, fmt, &p, wref, x, 4, &rel, &err));
    CHECK(rel > 0.1);
    free(wref);
    qd_packed_free(&p);
    qd_backend_close(be);
}

static void test_selftest_quick_cpu(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    qd_selftest_report rep;
    int rc = qd_selftest_run(be, 1, NULL, &rep, &err);
    CHECK_OK(rc);
    if (rc) fprintf(stderr, "selftest: %s\n", err.msg);
    CHECK(rep.cases > 50);
    CHECK_INT(rep.failures, 0);
    CHECK(rep.copy_gbps > 0.1);
    CHECK(rep.gemv_gbps > 0.01);
    qd_backend_close(be);
}

int main(void)
{
    TEST_RUN(test_ref_matches_dequant);
    TEST_RUN(test_cpu_all_formats);
    TEST_RUN(test_reorder_layout);
    TEST_RUN(test_bad_inputs);
    TEST_RUN(test_check_layer);
    TEST_RUN(test_selftest_quick_cpu);
    return test_finish();
}
