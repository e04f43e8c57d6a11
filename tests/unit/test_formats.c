/* The format table: pack/unpack round trips for every format and bit width (3-bit
 * included) with random codes, the symmetric qzeros words of formats.md checked exactly,
 * each format's dequant_ref against qd_qlayer_dequant_ref, the awq interleave on one
 * hand-computed word, and the refusals (partial groups, N not a multiple of 32, awq 3-bit,
 * v1 zero 0, awq with act-order g_idx). */
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/formats/format.h"
#include "quant/formats/quantizer.h"
#include "test_util.h"

/* A layer with random codes, zeros and F16 scales; act_order shuffles g_idx. */
static void make_layer(qd_qlayer *l, int64_t n, int64_t k, int bits, int sym, int64_t gs,
                       int act_order, int zero_min, test_rng *r)
{
    qd_err e = {0};
    CHECK_OK(qd_qlayer_alloc(l, n, k, bits, sym, gs, 1, &e));
    int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < n * k; i++) l->q[i] = (uint8_t)(test_rng_u64(r) % (maxq + 1));
    for (int64_t i = 0; i < l->n_groups * n; i++) {
        l->zeros[i] = sym ? (maxq + 1) / 2 : zero_min + (int32_t)(test_rng_u64(r) % (maxq + 1 - zero_min));
        l->scales[i] = qd_f32_round_f16(0.001f + 0.01f * test_rng_uniform(r));
    }
    for (int64_t i = 0; i < n; i++) l->bias[i] = qd_f32_round_f16(test_rng_normal(r));
    if (act_order)
        for (int64_t i = k - 1; i > 0; i--) {            /* shuffle keeps group sizes equal */
            int64_t j = (int64_t)(test_rng_u64(r) % (uint64_t)(i + 1));
            int32_t t = l->g_idx[i]; l->g_idx[i] = l->g_idx[j]; l->g_idx[j] = t;
        }
}

static int layers_equal(const qd_qlayer *a, const qd_qlayer *b)
{
    if (a->n != b->n || a->k != b->k || a->bits != b->bits || a->n_groups != b->n_groups) return 0;
    if (memcmp(a->q, b->q, a->n * a->k)) return 0;
    if (memcmp(a->scales, b->scales, a->n_groups * a->n * sizeof(float))) return 0;
    if (memcmp(a->zeros, b->zeros, a->n_groups * a->n * sizeof(int32_t))) return 0;
    if (memcmp(a->g_idx, b->g_idx, a->k * sizeof(int32_t))) return 0;
    if ((a->bias == NULL) != (b->bias == NULL)) return 0;
    if (a->bias && memcmp(a->bias, b->bias, a->n * sizeof(float))) return 0;
    return a->sym == b->sym;
}

static void test_table(void)
{
    CHECK_INT(qd_format_count(), 7);
    /* The job spec's enum names the first three entries by position. */
    CHECK(qd_format_at(0) == qd_format_find("gptq"));
    CHECK(qd_format_at(1) == qd_format_find("gptq_v2"));
    CHECK(qd_format_at(2) == qd_format_find("awq_gemm"));
    CHECK(qd_format_find("compressed-tensors") != NULL);
    CHECK(qd_format_find("exl2") == NULL);
    CHECK(qd_format_find("float-quantized") && qd_format_find("nvfp4-pack-quantized") &&
          qd_format_find("mxfp4-pack-quantized"));
    CHECK(qd_format_at(7) == NULL);
    /* Every descriptor is complete: each piece of format knowledge has its entry. */
    for (size_t i = 0; i < qd_format_count(); i++) {
        const qd_format *f = qd_format_at(i);
        CHECK(f->name && f->summary && f->quant_method && f->main_tensor && f->bits_mask);
        CHECK(f->check && f->pack && f->unpack && f->dequant_ref && f->tensors && f->read && f->quant_config &&
              f->detect && (f->misfit || f->grid != QD_GRID_INT));
        CHECK(f->channel_groups || f->channel_why);
        CHECK(f->act_order != QD_FMT_ACT_ORDER_STATIC || f->act_order_why);
        CHECK_INT(qd_format_index(f), (long long)i);
    }
    for (size_t i = 0; i < qd_format_count(); i++) CHECK(qd_format_find(qd_format_at(i)->name) == qd_format_at(i));
    CHECK_INT(qd_format_find("gptq")->zero_offset, 1);
    CHECK_INT(qd_format_find("gptq_v2")->zero_offset, 0);
    CHECK_INT(qd_format_find("awq_gemm")->bits_mask, 1 << 4);
    CHECK_INT(qd_format_find("awq_gemm")->has_g_idx, 0);
}

static void test_bits_roundtrip(void)
{
    test_rng r;
    test_rng_seed(&r, 3);
    int bitsv[4] = {2, 3, 4, 8};
    int32_t vals[256], back[256], words[64 * 3];
    for (int bi = 0; bi < 4; bi++) {
        int b = bitsv[bi];
        for (int i = 0; i < 256; i++) vals[i] = (int32_t)(test_rng_u64(&r) % (1u << b));
        /* stride 3 on the words exercises wstride */
        memset(words, 0, sizeof words);
        qd_pack_bits(b, vals, 64, 1, words, 3);
        qd_unpack_bits(b, words, 64, 3, back, 1);
        CHECK(memcmp(vals, back, 64 * sizeof *vals) == 0);
        for (int i = 0; i < 64; i++) CHECK_INT(qd_bits_get(b, words, 3, i), vals[i]);
        /* stride on the values */
        qd_pack_bits(b, vals, 32, 2, words, 1);
        qd_unpack_bits(b, words, 32, 1, back, 2);
        for (int i = 0; i < 32; i++) CHECK_INT(back[2 * i], vals[2 * i]);
    }
    /* 3-bit layout of formats.md: v10 straddles words 0/1, v21 words 1/2. */
    int32_t v[32] = {0};
    v[10] = 5;                                  /* 0b101 */
    v[21] = 6;                                  /* 0b110 */
    v[0] = 7;
    v[11] = 1;
    v[22] = 3;
    int32_t w3[3];
    qd_pack_bits(3, v, 32, 1, w3, 1);
    CHECK_INT((uint32_t)w3[0], 0x40000007u);    /* v0 = 7 at bits 0-2; low 2 bits of v10 (01) at 30-31 */
    CHECK_INT((uint32_t)w3[1], 0x00000003u);    /* bit 0 = bit 2 of v10 (1); v11 = 1 at bit 1; bit 31 = bit 0 of v21 (0) */
    CHECK_INT((uint32_t)w3[2], 0x0000000Fu);    /* bits 0-1 = bits 1-2 of v21 (11); v22 = 3 at bits 2-4 */
}

static void test_sym_zero_words(void)
{
    struct { const char *fmt; int bits; uint32_t w[3]; } cases[] = {
        {"gptq", 4, {0x77777777u}}, {"gptq", 8, {0x7F7F7F7Fu}}, {"gptq", 2, {0x55555555u}},
        {"gptq", 3, {0xDB6DB6DBu, 0xB6DB6DB6u, 0x6DB6DB6Du}},
        {"gptq_v2", 4, {0x88888888u}}, {"gptq_v2", 8, {0x80808080u}}, {"gptq_v2", 2, {0xAAAAAAAAu}},
        {"gptq_v2", 3, {0x24924924u, 0x49249249u, 0x92492492u}},
    };
    test_rng r;
    test_rng_seed(&r, 11);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        qd_qlayer l;
        qd_packed p = {0};
        qd_err e = {0};
        make_layer(&l, 64, 64, cases[ci].bits, 1, 32, 0, 0, &r);
        const qd_format *f = qd_format_find(cases[ci].fmt);
        CHECK_OK(f->pack(&l, &p, &e));
        int nw = cases[ci].bits == 3 ? 3 : 1, bad = 0;
        CHECK_INT(p.qzeros_shape[0], 2);
        CHECK_INT(p.qzeros_shape[1], 64 * cases[ci].bits / 32);
        for (int64_t i = 0; i < p.qzeros_shape[0] * p.qzeros_shape[1]; i++)
            if ((uint32_t)p.qzeros[i] != cases[ci].w[i % nw]) {
                if (!bad) TEST_FAIL_("%s %d-bit: qzeros[%lld] = 0x%08X, expected 0x%08X", cases[ci].fmt,
                                     cases[ci].bits, (long long)i, (uint32_t)p.qzeros[i], cases[ci].w[i % nw]);
                bad++;
            }
        CHECK_INT(bad, 0);
        qd_packed_free(&p);
        qd_qlayer_free(&l);
    }
}

static void test_roundtrip_all(void)
{
    test_rng r;
    test_rng_seed(&r, 5);
    int bitsv[4] = {2, 3, 4, 8};
    for (size_t fi = 0; fi < qd_format_count(); fi++) {
        const qd_format *f = qd_format_at(fi);
        if (f->grid != QD_GRID_INT) continue;   /* test_formats_float.c */
        for (int bi = 0; bi < 4; bi++) {
            int b = bitsv[bi];
            if (!(f->bits_mask & (1u << b))) continue;
            for (int variant = 0; variant < 4; variant++) {
                int sym = variant & 1, act = (variant >> 1) && f->has_g_idx;
                int64_t gs = variant == 2 ? -1 : 32;
                qd_qlayer l, u;
                qd_packed p = {0};
                qd_err e = {0};
                make_layer(&l, 96, 128, b, sym, gs, act, f->zero_offset, &r);
                int rc = f->pack(&l, &p, &e);
                CHECK_OK(rc);
                if (rc) { fprintf(stderr, "%s\n", e.msg); qd_qlayer_free(&l); continue; }
                if (f->kernel == QD_FMT_KERNEL_GPTQ) {
                    CHECK_INT(p.qweight_shape[0], 128 * b / 32);
                    CHECK_INT(p.qweight_shape[1], 96);
                    CHECK_INT(p.g_idx_len, f->has_g_idx ? 128 : 0);
                    CHECK((p.g_idx != NULL) == f->has_g_idx);
                } else {
                    CHECK_INT(p.qweight_shape[0], 128);
                    CHECK_INT(p.qweight_shape[1], 96 / 8);
                    CHECK(p.g_idx == NULL);
                }
                CHECK_INT(p.scales_shape[0], l.n_groups);
                CHECK_INT(p.scales_shape[1], 96);
                CHECK_INT(p.bias_len, 96);
                CHECK_OK(f->unpack(&p, &u, &e));
                CHECK(layers_equal(&l, &u));
                float *w1 = malloc(96 * 128 * sizeof *w1), *w2 = malloc(96 * 128 * sizeof *w2);
                qd_qlayer_dequant_ref(&l, w1);
                if (f->f16_products)
                    for (int64_t i = 0; i < 96 * 128; i++) w1[i] = qd_f32_round_f16(w1[i]);
                CHECK_OK(f->dequant_ref(&p, w2, &e));
                CHECK(memcmp(w1, w2, 96 * 128 * sizeof *w1) == 0);
                free(w1); free(w2);
                qd_packed_free(&p);
                qd_qlayer_free(&u);
                qd_qlayer_free(&l);
            }
        }
    }
}

/* RTN output packed in each format decodes to exactly the RTN dequantized weights. */
static void test_rtn_pack(void)
{
    test_rng r;
    test_rng_seed(&r, 9);
    const int64_t n = 64, k = 128;
    float *w = malloc(n * k * 4), *deq = malloc(n * k * 4), *dec = malloc(n * k * 4);
    test_fill_normal(&r, w, n * k, 0.02f);
    const char *names[3] = {"gptq", "gptq_v2", "awq_gemm"};
    for (int fi = 0; fi < 3; fi++) {
        const qd_format *f = qd_format_find(names[fi]);
        qd_quant_cfg c = qd_quant_cfg_default();
        c.group_size = 64;
        c.sym = fi == 0 ? 1 : 0;
        qd_qlayer l;
        qd_packed p = {0};
        qd_err e = {0};
        CHECK_OK(qd_rtn_quantize_qlayer(&c, w, n, k, &l, deq, &e));
        CHECK_OK(f->pack(&l, &p, &e));
        CHECK_OK(f->dequant_ref(&p, dec, &e));
        CHECK(memcmp(deq, dec, n * k * 4) == 0);
        qd_packed_free(&p);
        qd_qlayer_free(&l);
    }
    free(w); free(deq); free(dec);
}

static void test_awq_known_word(void)
{
    /* Row k = 0, channels 0..7 hold codes 0..7: nibble i holds channel ORDER[i] =
     * [0,2,4,6,1,3,5,7], so the word reads 0x75316420. Zeros 8..15 likewise: 0xFDB9ECA8. */
    qd_qlayer l;
    qd_packed p = {0};
    qd_err e = {0};
    CHECK_OK(qd_qlayer_alloc(&l, 8, 32, 4, 0, 32, 0, &e));
    for (int c = 0; c < 8; c++) {
        l.q[c * 32 + 0] = (uint8_t)c;
        l.q[c * 32 + 1] = 15;
        l.zeros[c] = 8 + c;
        l.scales[c] = 1.0f;
    }
    CHECK_OK(qd_format_find("awq_gemm")->pack(&l, &p, &e));
    CHECK_INT((uint32_t)p.qweight[0], 0x75316420u);
    CHECK_INT((uint32_t)p.qweight[1], 0xFFFFFFFFu);
    CHECK_INT((uint32_t)p.qweight[2], 0u);
    CHECK_INT((uint32_t)p.qzeros[0], 0xFDB9ECA8u);
    CHECK_INT(p.scales[3], 0x3C00);
    qd_packed_free(&p);
    qd_qlayer_free(&l);
}

static void test_refusals(void)
{
    test_rng r;
    test_rng_seed(&r, 13);
    qd_qlayer l;
    qd_packed p = {0};
    qd_err e = {0};
    const qd_format *v1 = qd_format_find("gptq"), *v2 = qd_format_find("gptq_v2"),
                    *awq = qd_format_find("awq_gemm");

    /* K % group_size != 0 (a partial last group). */
    make_layer(&l, 64, 96, 4, 1, 64, 0, 1, &r);
    CHECK_INT(v2->check(&l, &e), QD_ESHAPE);
    CHECK_CONTAINS(e.msg, "group_size");
    CHECK_ERR(v1->pack(&l, &p, &e));
    CHECK_ERR(awq->check(&l, &e));
    CHECK_CONTAINS(e.msg, "awq_gemm");
    qd_qlayer_free(&l);

    /* N not a multiple of 32 (fine for awq, which needs N % 8). */
    make_layer(&l, 40, 64, 4, 1, 32, 0, 1, &r);
    CHECK_INT(v1->check(&l, &e), QD_ESHAPE);
    CHECK_CONTAINS(e.msg, "out_features 40");
    CHECK_ERR(v2->check(&l, &e));
    CHECK_OK(awq->check(&l, &e));
    qd_qlayer_free(&l);
    make_layer(&l, 36, 64, 4, 1, 32, 0, 1, &r);
    CHECK_ERR(awq->check(&l, &e));
    CHECK_CONTAINS(e.msg, "multiple of 8");
    qd_qlayer_free(&l);

    /* K not a multiple of 32 */
    make_layer(&l, 32, 48, 4, 1, 16, 0, 1, &r);
    CHECK_ERR(v1->check(&l, &e));
    CHECK_CONTAINS(e.msg, "in_features 48");
    qd_qlayer_free(&l);

    /* Every format's pack refuses what its check refuses, with the same code (the pipeline
     * packs without checking first). */
    static const char *const all[] = {"gptq", "gptq_v2", "awq_gemm", "compressed-tensors"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const qd_format *f = qd_format_find(all[i]);
        CHECK(f != NULL);
        if (!f) continue;
        make_layer(&l, 36, 48, 4, 1, 16, 0, 1, &r);   /* N % 8 and K % 32 both off */
        int rc = f->check(&l, &e);
        CHECK(rc != 0);
        qd_packed pk = {0};
        CHECK_INT(f->pack(&l, &pk, &e), rc);
        qd_packed_free(&pk);
        qd_qlayer_free(&l);
    }

    /* awq is 4-bit only */
    make_layer(&l, 64, 64, 3, 1, 32, 0, 1, &r);
    CHECK_INT(awq->check(&l, &e), QD_EUNSUPPORTED);
    CHECK_CONTAINS(e.msg, "3-bit");
    CHECK_ERR(awq->pack(&l, &p, &e));
    CHECK_OK(v1->check(&l, &e));
    qd_qlayer_free(&l);

    /* awq with an act-order g_idx */
    make_layer(&l, 64, 64, 4, 1, 32, 1, 1, &r);
    CHECK_ERR(awq->check(&l, &e));
    CHECK_CONTAINS(e.msg, "g_idx");
    CHECK_OK(v1->check(&l, &e));
    qd_qlayer_free(&l);

    /* v1 asymmetric with a zero of 0: refused by v1, fine for v2 and awq. */
    make_layer(&l, 64, 64, 4, 0, 32, 0, 1, &r);
    l.zeros[5] = 0;
    CHECK_ERR(v1->check(&l, &e));
    CHECK_CONTAINS(e.msg, "zero 0");
    CHECK_ERR(v1->pack(&l, &p, &e));
    CHECK_OK(v2->check(&l, &e));
    CHECK_OK(awq->check(&l, &e));
    /* A v1 checkpoint whose stored zero field is all ones (the -1 bug) is refused on unpack
     * and decodes the way loaders do (z = 2^b). */
    CHECK_OK(v2->pack(&l, &p, &e));
    p.qzeros[0] = -1;
    qd_qlayer u;
    CHECK_INT(v1->unpack(&p, &u, &e), QD_EFORMAT);
    qd_packed_free(&p);
    /* Out-of-range codes, bad scales */
    l.zeros[5] = 3;
    l.q[7] = 16;
    CHECK_ERR(v2->check(&l, &e));
    l.q[7] = 1;
    l.scales[2] = 0.0f;
    CHECK_ERR(v2->check(&l, &e));
    l.scales[2] = 1e6f;
    CHECK_ERR(v2->check(&l, &e));
    qd_qlayer_free(&l);

    /* Packed tensors with a wrong shape */
    make_layer(&l, 64, 64, 4, 1, 32, 0, 1, &r);
    CHECK_OK(v2->pack(&l, &p, &e));
    p.qweight_shape[0] = 7;
    float *w = malloc(64 * 64 * 4);
    CHECK_INT(v2->dequant_ref(&p, w, &e), QD_ESHAPE);
    CHECK_CONTAINS(e.msg, "qweight");
    free(w);
    qd_packed_free(&p);
    qd_qlayer_free(&l);
    qd_packed_free(NULL);
    qd_qlayer_free(NULL);
}

int main(void)
{
    TEST_RUN(test_table);
    TEST_RUN(test_bits_roundtrip);
    TEST_RUN(test_sym_zero_words);
    TEST_RUN(test_roundtrip_all);
    TEST_RUN(test_rtn_pack);
    TEST_RUN(test_awq_known_word);
    TEST_RUN(test_refusals);
    return test_finish();
}
