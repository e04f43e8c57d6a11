/* The float grids end to end in quant/formats: for every scheme on a float grid (FP8 per
 * tensor / channel / 128x128 block, NVFP4, MXFP4) a random weight is quantized by RTN and
 * by GPTQ (CPU backend), packed by the scheme's format, and
 *  - the codes are on the grid and every scale is storable (E4M3 for NVFP4, a power of two
 *    for MXFP4, one scale per row block for FP8 blocks and tensors);
 *  - qd_qlayer_dequant_ref, the format's dequant_ref and the quantizer's own dequantized
 *    weights agree bit for bit; unpack(pack(l)) == l;
 *  - tensors() -> read() (through a find callback over the written tensors, with the
 *    quantization_config's detect()) gives the same decode, and tensors() writes what
 *    compressed-tensors names (weight / weight_packed, weight_scale, weight_global_scale);
 *  - GPTQ's error on correlated inputs is below RTN's (tr((W-Q) H (W-Q)^T));
 *  - damaged tensors are refused by name: a NaN FP8 code, a non-finite or zero scale, the
 *    E8M0 NaN, a scale tensor of the wrong shape. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/backend/backend.h"
#include "quant/core/minifloat.h"
#include "quant/formats/format.h"
#include "quant/formats/quantizer.h"
#include "quant/formats/scheme.h"

enum { N = 256, K = 256, ROWS = 512 };

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static qd_quant_cfg cfg_of(const qd_scheme *s)
{
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = s->bits;
    c.sym = s->sym;
    c.group_size = s->group_size;
    c.grid = s->grid;
    c.scale_rule = s->scale_rule;
    c.row_block = s->row_block;
    return c;
}

/* find callback over the tensors a format wrote */
typedef struct { qd_fmt_tensor *t; int n; qd_fmt_tensor *broken; } tset;
static int find_in(void *ud, const char *suffix, qd_fmt_tensor *out)
{
    tset *s = ud;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].suffix, suffix)) {
            *out = s->broken && !strcmp(s->broken->suffix, suffix) ? *s->broken : s->t[i];
            return 1;
        }
    return 0;
}

static double h_err(const float *w, const float *q, const float *h)
{
    double s = 0;
    for (int r = 0; r < N; r++) {
        const float *a = w + r * K, *b = q + r * K;
        for (int i = 0; i < K; i++) {
            double di = a[i] - b[i], acc = 0;
            for (int j = 0; j < K; j++) acc += h[i * K + j] * (double)(a[j] - b[j]);
            s += di * acc;
        }
    }
    return s;
}

static void check_layer(const qd_scheme *s, const qd_qlayer *l, const float *deq)
{
    const qd_format *f = qd_format_find(s->format);
    CHECK(f != NULL && f->grid == s->grid);
    if (!f) return;
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        if (s->grid == QD_GRID_FP4_E2M1) CHECK(l->q[i] < 16);
        else CHECK((l->q[i] & 0x7f) != 0x7f);
    }
    for (int64_t i = 0; i < l->n_groups * N; i++) {
        float sc = l->scales[i];
        CHECK(sc > 0.0f && isfinite(sc));
        if (s->scale_rule == QD_SCALE_FP8_GLOBAL) CHECK(qd_f32_round_fp8_e4m3(sc) == sc);
        if (s->scale_rule == QD_SCALE_E8M0) {
            int e;
            CHECK(frexpf(sc, &e) == 0.5f);
        }
    }
    float *a = malloc(sizeof(float) * N * K), *b = malloc(sizeof(float) * N * K);
    qd_qlayer_dequant_ref(l, a);
    CHECK(memcmp(a, deq, sizeof(float) * N * K) == 0);
    qd_packed p;
    qd_err e = {0};
    int rc = f->pack(l, &p, &e);
    CHECK_OK(rc);
    if (rc) { fprintf(stderr, "%s: %s\n", s->name, e.msg); free(a); free(b); return; }
    CHECK_OK(f->dequant_ref(&p, b, &e));
    CHECK(memcmp(a, b, sizeof(float) * N * K) == 0);
    qd_qlayer u;
    CHECK_OK(f->unpack(&p, &u, &e));
    CHECK(memcmp(u.q, l->q, (size_t)N * K) == 0);
    CHECK(memcmp(u.scales, l->scales, sizeof(float) * (size_t)(l->n_groups * N)) == 0);
    qd_qlayer_free(&u);
    /* tensors -> detect(quant_config) -> read: the same decode */
    qd_fmt_tensor t[QD_FMT_MAX_TENSORS];
    int nt = 0;
    CHECK_OK(f->tensors(&p, t, &nt, &e));
    CHECK_STR(t[0].suffix, s->grid == QD_GRID_FP8_E4M3 ? "weight" : "weight_packed");
    CHECK_STR(t[1].suffix, "weight_scale");
    if (s->scale_rule == QD_SCALE_FP8_GLOBAL) {
        CHECK_INT(t[1].dtype, QD_DTYPE_F8_E4M3);
        CHECK(nt >= 3 && !strcmp(t[2].suffix, "weight_global_scale"));
    }
    if (s->scale_rule == QD_SCALE_E8M0) CHECK_INT(t[1].dtype, QD_DTYPE_U8);
    qd_fmt_config_in in = {.s = {.bits = s->bits, .group_size = s->group_size, .sym = 1}, .scheme = s};
    cJSON *qc = f->quant_config(&in);
    CHECK(qc != NULL);
    const qd_format *df = NULL;
    qd_fmt_detected d;
    CHECK_OK(qd_format_detect(qc, "test", &df, &d, &e));
    CHECK(df == f);
    cJSON_Delete(qc);
    tset ts = {t, nt, NULL};
    qd_packed r;
    rc = f->read(find_in, &ts, N, K, &d, &r, &e);
    CHECK_OK(rc);
    if (!rc) {
        CHECK_OK(f->dequant_ref(&r, b, &e));
        CHECK(memcmp(a, b, sizeof(float) * N * K) == 0);
        qd_packed_free(&r);
    }
    /* Damaged tensors, refused by name. */
    qd_fmt_tensor bad = t[1];
    float nanv[1] = {NAN};
    uint8_t e8nan[N * 8];
    memset(e8nan, 0xff, sizeof e8nan);
    if (s->scale_rule == QD_SCALE_E8M0) bad.data = e8nan;
    else if (bad.dtype == QD_DTYPE_F32 && bad.ndim == 1) bad.data = nanv;
    else bad.shape[0] = bad.shape[0] + 1;     /* wrong shape */
    ts.broken = &bad;
    e.msg[0] = 0;
    CHECK(f->read(find_in, &ts, N, K, &d, &r, &e) != 0);
    CHECK_CONTAINS(e.msg, "weight_scale");
    qd_fmt_tensors_free(t, nt);
    qd_packed_free(&p);
    free(a);
    free(b);
}

static void test_schemes(void)
{
    qd_err e = {0};
    qd_backend *be = NULL;
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &e));
    uint64_t seed = 17;
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * ROWS * K), *h = malloc(sizeof(float) * K * K);
    for (int i = 0; i < N * K; i++) w[i] = frand(&seed) * (1.0f + (float)(i % 7));
    /* Correlated inputs: a few shared directions plus noise, so GPTQ has something to use. */
    for (int r = 0; r < ROWS; r++) {
        float a = frand(&seed), b = frand(&seed);
        for (int i = 0; i < K; i++) x[r * K + i] = a * sinf((float)i * 0.1f) + b * cosf((float)i * 0.07f) + 0.1f * frand(&seed);
    }
    qd_gptq_hessian acc;
    CHECK_OK(qd_gptq_hessian_init(&acc, be, K, &e));
    CHECK_OK(qd_gptq_hessian_add(&acc, x, ROWS, &e));
    CHECK_OK(qd_gptq_hessian_download(&acc, h, &e));
    int n_float = 0;
    for (size_t si = 0; si < qd_scheme_count(); si++) {
        const qd_scheme *s = qd_scheme_at(si);
        if (s->grid == QD_GRID_INT) continue;
        n_float++;
        qd_quant_cfg c = cfg_of(s);
        CHECK_OK(qd_quant_cfg_validate(&c, &e));
        qd_qlayer l;
        float *deq = malloc(sizeof(float) * N * K);
        CHECK_OK(qd_rtn_quantize_qlayer(&c, w, N, K, &l, deq, &e));
        check_layer(s, &l, deq);
        double e_rtn = h_err(w, deq, h);
        qd_qlayer_free(&l);
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant = c;
        qd_gptq_result gr;
        int rc = qd_gptq_quantize(be, &o, w, N, K, &acc, &gr, &e);
        CHECK_OK(rc);
        if (!rc) {
            check_layer(s, &gr.layer, gr.deq);
            double e_gptq = h_err(w, gr.deq, h);
            if (!(e_gptq < e_rtn)) TEST_FAIL_("%s: GPTQ's error %g is not below RTN's %g", s->name, e_gptq, e_rtn);
            test_checks++;
            qd_gptq_result_free(&gr);
        }
        free(deq);
    }
    CHECK(n_float >= 5);
    qd_gptq_hessian_free(&acc);
    qd_backend_close(be);
    free(w);
    free(x);
    free(h);
}

/* The refusals of the layer checks: a layer on another grid, a scale the format cannot store. */
static void test_check_refusals(void)
{
    const qd_scheme *nv = qd_scheme_find("NVFP4A16"), *mx = qd_scheme_find("MXFP4A16");
    qd_quant_cfg c = cfg_of(nv);
    float w[32 * 32];
    uint64_t seed = 3;
    for (int i = 0; i < 32 * 32; i++) w[i] = frand(&seed);
    qd_qlayer l;
    qd_err e = {0};
    qd_packed p;
    CHECK_OK(qd_rtn_quantize_qlayer(&c, w, 32, 32, &l, NULL, &e));
    CHECK(qd_format_find(mx->format)->pack(&l, &p, &e) != 0);      /* NVFP4 layer into MXFP4 */
    l.scales[5] = 0.3f;                                              /* not an E4M3 value */
    CHECK(qd_format_find(nv->format)->pack(&l, &p, &e) != 0);
    CHECK_CONTAINS(e.msg, "cannot be stored");
    qd_qlayer_free(&l);
    qd_quant_cfg bad = c;
    bad.bits = 8;
    CHECK(qd_quant_cfg_validate(&bad, &e) != 0);
}

int main(void)
{
    TEST_RUN(test_schemes);
    TEST_RUN(test_check_refusals);
    return test_finish();
}
