/* The bulk dequantization (qd_kernel_dequant_cpu, quant/kernels/kernel_dequant.c) against
 * the format table's dequant_ref, bit for bit: every format x bit width x group size
 * (incl. -1, one group per row) x act-order g_idx, on random packed data (every bit of
 * qweight and qzeros random, and scales that are any F16 at all: negative, subnormal,
 * Inf and NaN included), with the portable and the AVX2 decoders and 1, 2 and 3 threads
 * (3 splits the columns unevenly). Also: the layers dequant_ref refuses, it refuses. */
#include <stdlib.h>
#include <string.h>

#include "quant/formats/format.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "test_util.h"

/* 416 output columns (52 tiles of 8, 13 blocks of 32) x 512 inputs: enough weights that
 * the decoder starts three threads. */
#define DQ_N 416
#define DQ_K 512

/* Overwrites p's codes, zeros and scales with random bits. */
static void randomize(qd_packed *p, test_rng *r, int any_scale)
{
    const int64_t nqw = p->qweight_shape[0] * p->qweight_shape[1], nqz = p->qzeros_shape[0] * p->qzeros_shape[1];
    for (int64_t i = 0; i < nqw; i++) p->qweight[i] = (int32_t)test_rng_u64(r);
    for (int64_t i = 0; i < nqz; i++) p->qzeros[i] = (int32_t)test_rng_u64(r);
    if (any_scale)
        for (int64_t i = 0; i < p->scales_shape[0] * p->scales_shape[1]; i++)
            p->scales[i] = (uint16_t)test_rng_u64(r);
}

static int64_t count_mismatches(const float *got, const float *want, int64_t n, int64_t k, const char *what)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n * k; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i])) {
            if (bad < 3)
                fprintf(stderr, "  %s: W[%lld][%lld]: bulk %.9g (0x%08x), dequant_ref %.9g\n", what,
                        (long long)(i / k), (long long)(i % k), (double)got[i],
                        (unsigned)((const uint32_t *)got)[i], (double)want[i]);
            bad++;
        }
    return bad;
}

/* One layer through every decoder and thread count. */
static void check_layer(const qd_format *fmt, const qd_packed *p, const char *what)
{
    const int64_t n = p->n, k = p->k;
    float *want = malloc((size_t)(n * k) * sizeof *want), *got = malloc((size_t)(n * k) * sizeof *got);
    qd_err err = {0};
    CHECK_OK(fmt->dequant_ref(p, want, &err));
    static const qd_kcpu_isa isas[] = {QD_KCPU_PORTABLE, QD_KCPU_AUTO};
    for (int ii = 0; ii < 2; ii++)
        for (int nt = 1; nt <= 3; nt++) {
            char label[160];
            snprintf(label, sizeof label, "%s %s %d thread(s)", what, ii ? qd_kernel_cpu_isa_name() : "portable", nt);
            memset(got, 0xA5, (size_t)(n * k) * sizeof *got);   /* so an unwritten weight shows */
            CHECK_OK(qd_kernel_dequant_cpu(fmt, p, got, nt, isas[ii], &err));
            CHECK_INT(count_mismatches(got, want, n, k, label), 0);
        }
    free(want);
    free(got);
}

static void test_every_format(void)
{
    test_rng r;
    test_rng_seed(&r, 19);
    qd_selftest_case cases[QD_SELFTEST_MAX_CASES];
    const int layers = qd_selftest_cases(cases, QD_SELFTEST_MAX_CASES);
    for (int ci = 0; ci < layers; ci++) {
        const qd_selftest_case *t = &cases[ci];
        qd_packed p;
        qd_err err = {0};
        CHECK_OK(qd_selftest_make_layer(t->fmt, t->bits, t->group_size, t->act_order, DQ_N, DQ_K, 23 + (uint64_t)ci,
                                        &p, &err));
        /* Realistic scales first, then any F16 bits at all. */
        for (int any = 0; any < 2; any++) {
            char what[96];
            randomize(&p, &r, any);
            snprintf(what, sizeof what, "%s %d-bit g%lld%s%s", t->fmt->name, t->bits, (long long)t->group_size,
                     t->act_order ? " act-order" : "", any ? " any-scales" : "");
            check_layer(t->fmt, &p, what);
        }
        qd_packed_free(&p);
    }
    /* gptq and gptq_v2 at 4 widths x 4 groups (+3 act-order each), awq_gemm 4-bit x 4,
     * compressed-tensors at its widths. */
    CHECK(layers >= 2 * (16 + 12) + 4 + 4);
}

/* A K that is not a multiple of 8 (awq_gemm with one group per row): the tile tail. */
static void test_awq_ragged_k(void)
{
    const qd_format *fmt = qd_format_find("awq_gemm");
    CHECK(fmt != NULL);
    if (!fmt) return;
    qd_packed p;
    qd_err err = {0};
    test_rng r;
    test_rng_seed(&r, 5);
    int rc = qd_selftest_make_layer(fmt, 4, -1, 0, 64, 300, 3, &p, &err);
    if (rc) {   /* the format may refuse such a K; then there is no tail to test */
        fprintf(stderr, "  awq_gemm [64, 300]: %s (skipped)\n", err.msg);
        return;
    }
    randomize(&p, &r, 1);
    check_layer(fmt, &p, "awq_gemm 4-bit g-1 K 300");
    qd_packed_free(&p);
}

/* What the reference refuses, the bulk decoder refuses. */
static void test_refusals(void)
{
    for (size_t f = 0; f < qd_format_count(); f++) {
        const qd_format *fmt = qd_format_at(f);
        if (fmt->kernel == QD_FMT_KERNEL_FLOAT) continue;   /* test_kernels_float covers their refusals */
        qd_packed p;
        qd_err err = {0};
        CHECK_OK(qd_selftest_make_layer(fmt, 4, 128, 0, 64, 256, 7, &p, &err));
        float *w = malloc((size_t)(64 * 256) * sizeof *w);
        p.qweight_shape[0]--;
        CHECK_ERR(fmt->dequant_ref(&p, w, &err));
        CHECK_ERR(qd_kernel_dequant_cpu(fmt, &p, w, 2, QD_KCPU_AUTO, &err));
        p.qweight_shape[0]++;
        p.scales_shape[1]--;
        CHECK_ERR(fmt->dequant_ref(&p, w, &err));
        CHECK_ERR(qd_kernel_dequant_cpu(fmt, &p, w, 2, QD_KCPU_AUTO, &err));
        p.scales_shape[1]++;
        p.bits = 5;
        CHECK_ERR(fmt->dequant_ref(&p, w, &err));
        CHECK_ERR(qd_kernel_dequant_cpu(fmt, &p, w, 2, QD_KCPU_AUTO, &err));
        p.bits = 4;
        /* One group more than K needs, shapes to match: awq_gemm refuses it, gptq decodes
         * and never reads the extra group; the bulk decoder must do the same. */
        p.n_groups++;
        p.qzeros_shape[0]++;
        p.scales_shape[0]++;
        const int64_t nqz = p.qzeros_shape[0] * p.qzeros_shape[1], nsc = p.scales_shape[0] * p.scales_shape[1];
        p.qzeros = realloc(p.qzeros, (size_t)nqz * sizeof *p.qzeros);
        p.scales = realloc(p.scales, (size_t)nsc * sizeof *p.scales);
        for (int64_t i = nqz - p.qzeros_shape[1]; i < nqz; i++) p.qzeros[i] = 0x11111111;
        for (int64_t i = nsc - p.scales_shape[1]; i < nsc; i++) p.scales[i] = 0x3c00;
        float *w2 = malloc((size_t)(64 * 256) * sizeof *w2);
        int rc_ref = fmt->dequant_ref(&p, w, &err), rc_bulk = qd_kernel_dequant_cpu(fmt, &p, w2, 2, QD_KCPU_AUTO, &err);
        CHECK_INT(rc_bulk < 0, rc_ref < 0);
        if (!rc_ref && !rc_bulk) CHECK_INT(count_mismatches(w2, w, 64, 256, fmt->name), 0);
        free(w2);
        p.n_groups--;
        p.qzeros_shape[0]--;
        p.scales_shape[0]--;
        if (p.g_idx) {
            p.g_idx[3] = (int32_t)p.n_groups;
            CHECK_ERR(fmt->dequant_ref(&p, w, &err));
            CHECK_ERR(qd_kernel_dequant_cpu(fmt, &p, w, 2, QD_KCPU_AUTO, &err));
        }
        free(w);
        qd_packed_free(&p);
    }
}

int main(void)
{
    TEST_RUN(test_every_format);
    TEST_RUN(test_awq_ragged_k);
    TEST_RUN(test_refusals);
    return test_finish();
}
