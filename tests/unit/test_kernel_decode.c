/* The kernels' shared host/device decoders (quant/kernels/kdecode.h), compiled here as
 * host C, against the format table's dequant_ref: for every format x bit width x group
 * size, with trivial g_idx, act-order g_idx and the reordered (exllama) layout, every
 * weight kd_weight decodes must equal the reference bit for bit. Also the block word
 * layout (3-bit straddles), the AWQ interleave and the F16 widening on their own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/dtype.h"
#include "quant/formats/format.h"
#include "quant/kernels/kdecode.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "test_util.h"

static kd_wdesc desc_of(const qd_kmat *m)
{
    kd_wdesc d = {m->qweight, m->qzeros, m->scales,
                  m->layout == QD_KMAT_GPTQ && m->act_order ? m->g_idx : NULL,
                  m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL,
                  m->n, m->k, m->group_size, m->bits, m->zero_offset, m->layout == QD_KMAT_AWQ};
    return d;
}

/* Every weight of m decoded by kdecode equals w_ref[c][feature] (the format's dequant_ref).
 * f16: the reference rounds each product to F16 (compressed-tensors, as its package does);
 * kdecode's F32 product of an integer and an F16 scale is exact, so rounding it once to F16
 * must give the reference's bits. */
static int64_t count_mismatches(const qd_kmat *m, const float *w_ref, int f16, const char *what)
{
    const kd_wdesc d = desc_of(m);
    int64_t bad = 0;
    for (int64_t i = 0; i < m->k; i++) {
        const int64_t f = kd_feature(d.perm, i);
        for (int64_t c = 0; c < m->n; c++) {
            float got = kd_weight(&d, i, c), want = w_ref[c * m->k + f];
            if (f16) got = qd_f32_round_f16(got);
            if (memcmp(&got, &want, sizeof got)) {
                if (bad < 3)
                    fprintf(stderr, "  %s: row %lld col %lld: kdecode %.9g, dequant_ref %.9g\n", what, (long long)i,
                            (long long)c, (double)got, (double)want);
                bad++;
            }
        }
    }
    return bad;
}

static void test_every_format(void)
{
    const int64_t n = 64, k = 256;
    qd_selftest_case cases[QD_SELFTEST_MAX_CASES];
    const int layers = qd_selftest_cases(cases, QD_SELFTEST_MAX_CASES);
    for (int ci = 0; ci < layers; ci++) {
        const qd_format *fmt = cases[ci].fmt;
        const int bits = cases[ci].bits, act = cases[ci].act_order;
        const int64_t gs = cases[ci].group_size;
        qd_packed p;
        qd_kmat view, re;
        qd_err err = {0};
        float *w = malloc((size_t)(n * k) * sizeof *w);
        CHECK_OK(qd_selftest_make_layer(fmt, bits, gs, act, n, k, 11 + (uint64_t)ci, &p, &err));
        CHECK_OK(fmt->dequant_ref(&p, w, &err));
        CHECK_OK(qd_kmat_from_packed(fmt, &p, &view, &err));
        CHECK_INT(view.act_order, act);
        char what[96];
        snprintf(what, sizeof what, "%s %d-bit g%lld %s", fmt->name, bits, (long long)gs, qd_kmat_layout_name(&view));
        CHECK_INT(count_mismatches(&view, w, fmt->f16_products, what), 0);
        if (fmt->has_g_idx && gs > 0) {
            CHECK_OK(qd_kmat_reorder(&view, &re, &err));
            snprintf(what, sizeof what, "%s %d-bit g%lld %s", fmt->name, bits, (long long)gs, qd_kmat_layout_name(&re));
            CHECK_INT(count_mismatches(&re, w, fmt->f16_products, what), 0);
            /* Reordered rows are sorted by group: row i is in group i / gs. */
            for (int64_t i = 0; i < k; i++) CHECK_INT(kd_group(NULL, gs, i), p.g_idx[re.perm[i]]);
            qd_kmat_free(&re);
        }
        qd_packed_free(&p);
        free(w);
    }
    /* gptq and gptq_v2 at 4 widths x 4 groups (+3 act-order each), awq_gemm 4-bit x 4. */
    CHECK(layers >= 2 * (16 + 12) + 4);
}

/* The block layout against the packer: every value of a random block, every width. */
static void test_block_words(void)
{
    test_rng r;
    test_rng_seed(&r, 7);
    static const int bits_all[] = {2, 3, 4, 8};
    for (int bi = 0; bi < 4; bi++) {
        const int b = bits_all[bi];
        int32_t vals[64], words[16];
        for (int i = 0; i < 64; i++) vals[i] = (int32_t)(test_rng_uniform(&r) * (float)(1 << b)) & ((1 << b) - 1);
        qd_pack_bits(b, vals, 64, 1, words, 1);
        for (int i = 0; i < 64; i++) {
            const int blk = i / 32, j = i % 32, w = kd_block_word(b, j);
            const uint32_t lo = (uint32_t)words[blk * b + w];
            const uint32_t hi = w + 1 < b ? (uint32_t)words[blk * b + w + 1] : 0u;
            CHECK_INT(kd_block_value(lo, hi, b, j), vals[i]);
            CHECK_INT(kd_stream_get(words, 1, b, i), vals[i]);
            CHECK_INT(kd_stream_get(words, 1, b, i), qd_bits_get(b, words, 1, i));
        }
    }
    /* The 3-bit straddles: values 10 and 21 cross words 0/1 and 1/2, no other does. */
    for (int j = 0; j < 32; j++) {
        int straddles = kd_block_off(3, j) + 3 > 32;
        CHECK_INT(straddles, j == 10 || j == 21);
    }
    CHECK_INT(kd_block_word(3, 10), 0);
    CHECK_INT(kd_block_word(3, 21), 1);
    CHECK_INT(kd_block_word(3, 31), 2);
}

static void test_awq_order_and_half(void)
{
    /* Channel c of a word sits in nibble 0,4,1,5,2,6,3,7 (AWQ's pack order 0,2,4,6,1,3,5,7). */
    static const int nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int c = 0; c < 16; c++) CHECK_INT(kd_awq_shift(c), 4 * nib[c % 8]);
    /* F16 widening equals the library's for every finite half and the specials. */
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kd_half_to_float((uint16_t)h), b = qd_f16_to_f32((uint16_t)h);
        if (isnan(b) ? !isnan(a) : memcmp(&a, &b, sizeof a) != 0) bad++;
    }
    CHECK_INT(bad, 0);
    /* Groups and features. */
    int32_t g_idx[4] = {2, 0, 1, 0}, perm[4] = {3, 1, 0, 2};
    CHECK_INT(kd_group(g_idx, 2, 0), 2);
    CHECK_INT(kd_group(NULL, 2, 3), 1);
    CHECK_INT(kd_group(NULL, -1, 3), 0);
    CHECK_INT(kd_feature(perm, 0), 3);
    CHECK_INT(kd_feature(NULL, 3), 3);
}

int main(void)
{
    TEST_RUN(test_every_format);
    TEST_RUN(test_block_words);
    TEST_RUN(test_awq_order_and_half);
    return test_finish();
}
