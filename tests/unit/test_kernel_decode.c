/* The kernels' shared host/device decoders (quant/kernels/kdecode.h), compiled here as
 * host C, against the format table's dequant_ref: for every format x bit width x group
 * size, with trivial g_idx, act-order g_idx and the reordered (exllama) layout, every
 * weight kd_weight decodes must equal the reference bit for bit. Also the block word
 * layout (3-bit straddles), the AWQ interleave and the F16 widening on their own. The
 * float grids' decoders too: every FP8 and FP4 code against quant/core's minifloat
 * decoders, the code and scale lookup of the float layout, and kd_float_weight against
 * every float format's dequant_ref (and the quantizer's decode for layers built by hand). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/dtype.h"
#include "quant/core/minifloat.h"
#include "quant/formats/format.h"
#include "quant/formats/quantizer.h"
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

/* ---- Float grids ------------------------------------------------------------------- */

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

/* kdecode's exact decoders (the CUDA kernels' and the CPU kernels') against quant/core's
 * minifloat ones, every code, bit for bit (the NaN codes included: the same 0x7fc00000). */
static void test_float_values(void)
{
    int64_t bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        const float a = kd_fp8_e4m3_value(b), want = qd_fp8_e4m3_to_f32((uint8_t)b);
        if (memcmp(&a, &want, sizeof a)) {
            if (bad < 3) fprintf(stderr, "  fp8 0x%02x: kdecode %.9g, minifloat %.9g\n", b, (double)a, (double)want);
            bad++;
        }
    }
    for (uint32_t c = 0; c < 16; c++) {
        const float a = kd_fp4_e2m1_value(c), want = qd_fp4_e2m1_to_f32((uint8_t)c);
        if (memcmp(&a, &want, sizeof a)) {
            if (bad < 3) fprintf(stderr, "  fp4 %u: kdecode %.9g, minifloat %.9g\n", c, (double)a, (double)want);
            bad++;
        }
        CHECK(same_float(kd_float_value(1, c), want));
    }
    CHECK_INT(bad, 0);
    CHECK(kd_float_value(0, 0x7e) == 448.0f);
    CHECK(kd_float_value(0, 0x01) == 0x1p-9f);
    CHECK(signbit(kd_float_value(0, 0x80)) && signbit(kd_float_value(1, 8)));
    /* Only the high bits of a code beyond its width are ignored by the FP4 decoder. */
    CHECK(kd_fp4_e2m1_value(0x17) == 6.0f);
}

/* The float layout's code and scale lookup on a small hand-made weight: FP4 nibbles (even
 * k low), rows sharing a scale row, a global scale dividing in F32 before the product. */
static void test_float_lookup(void)
{
    /* W [3, 4], FP4, groups of 2, row_block 2: scale rows {0, 1} -> 0, row 2 -> 1. */
    const uint8_t codes[6] = {0x21, 0x7f, 0x00, 0x98, 0x5a, 0x43};
    const float sc[4] = {448.0f, 2.0f, 0.5f, 6.0f};
    kd_fdesc d = {codes, sc, 3, 4, 2, 2, 2, 3.0f, 1, 1};
    CHECK_INT(kd_float_code(&d, 0, 0), 1);
    CHECK_INT(kd_float_code(&d, 0, 1), 2);
    CHECK_INT(kd_float_code(&d, 0, 2), 15);
    CHECK_INT(kd_float_code(&d, 0, 3), 7);
    CHECK_INT(kd_float_code(&d, 1, 3), 9);
    CHECK_INT(kd_float_code(&d, 2, 1), 5);
    CHECK(kd_float_scale(&d, 1, 3) == 2.0f / 3.0f);
    CHECK(kd_float_scale(&d, 2, 0) == 0.5f / 3.0f);
    /* value(code) * (s / gs), in that order and in F32 (not value * s / gs). */
    const float s = 448.0f / 3.0f;
    CHECK(same_float(kd_float_weight(&d, 0, 0), 0.5f * s));
    CHECK(same_float(kd_float_weight(&d, 0, 2), -6.0f * (2.0f / 3.0f)));
    d.global = 0;
    CHECK(kd_float_scale(&d, 2, 3) == 6.0f);
    /* One group and one scale row. */
    d.gs = -1;
    d.row_block = -1;
    d.n_groups = 1;
    CHECK(kd_float_scale(&d, 2, 3) == 448.0f);
}

/* Every float format of the table: kd_float_weight equals its dequant_ref bit for bit, on
 * each layer its pack holds (qd_selftest_float_cases); the layouts built by hand against
 * the quantizer's own decode, qd_quant_dequant_cfg, which the rule is. */
static void test_float_every_format(void)
{
    qd_selftest_fcase fc[QD_SELFTEST_MAX_FCASES];
    const int nf = qd_selftest_float_cases(fc, QD_SELFTEST_MAX_FCASES);
    CHECK(nf >= 6);
    for (int i = 0; i < nf; i++) {
        const int64_t n = 40, k = 256;
        qd_packed p;
        qd_kmat m;
        qd_err err = {0};
        CHECK_OK(qd_selftest_make_float_layer(&fc[i], n, k, 70 + (uint64_t)i, &p, &err));
        CHECK_OK(fc[i].fmt ? qd_kmat_from_packed(fc[i].fmt, &p, &m, &err) : qd_kmat_from_float(&p, &m, &err));
        const kd_fdesc d = {m.fcodes, m.fscales, m.n, m.k, m.group_size, m.n_groups, m.row_block, m.global_scale,
                            m.grid == QD_GRID_FP4_E2M1, m.scale_rule == QD_SCALE_FP8_GLOBAL};
        float *w = malloc((size_t)(n * k) * sizeof *w);
        if (fc[i].fmt) {
            CHECK_OK(fc[i].fmt->dequant_ref(&p, w, &err));
        } else {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.grid = p.grid;
            c.scale_rule = p.scale_rule;
            c.global_scale = p.global_scale;
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++) {
                    const int64_t row = p.row_block > 0 ? r / p.row_block : 0;
                    const int64_t g = p.group_size > 0 ? j / p.group_size : 0;
                    w[r * k + j] = qd_quant_dequant_cfg(&c, (int)kd_float_code(&d, r, j),
                                                        p.fscales[row * p.fscales_shape[1] + g], 0.0f);
                }
        }
        int64_t bad = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++)
                if (!same_float(kd_float_weight(&d, r, j), w[r * k + j])) {
                    if (bad < 3)
                        fprintf(stderr, "  %s %s W[%lld][%lld]: kdecode %.9g, reference %.9g\n",
                                fc[i].fmt ? fc[i].fmt->name : "by-hand", fc[i].name, (long long)r, (long long)j,
                                (double)kd_float_weight(&d, r, j), (double)w[r * k + j]);
                    bad++;
                }
        CHECK_INT(bad, 0);
        free(w);
        qd_packed_free(&p);
    }
}

int main(void)
{
    TEST_RUN(test_every_format);
    TEST_RUN(test_block_words);
    TEST_RUN(test_awq_order_and_half);
    TEST_RUN(test_float_values);
    TEST_RUN(test_float_lookup);
    TEST_RUN(test_float_every_format);
    return test_finish();
}
