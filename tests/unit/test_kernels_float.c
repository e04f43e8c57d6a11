/* The dequantizing kernels on the float grids (QD_KMAT_FLOAT): FP8 E4M3 per tensor, per
 * channel, per group and in 128 x 128 blocks, NVFP4 (E2M1, FP8 group-16 scales under a
 * global scale) and MXFP4 (E2M1, power-of-two group-32 scales). The packed weights are
 * built here by hand from random F32 weights the way the quantizer rounds them (codes from
 * qd_f32_to_fp8_e4m3 / qd_f32_to_fp4_e2m1), independently of any format descriptor, and
 * decoded by the rule of format.h written out below (decode_spec). Checked:
 *   - qd_kernel_matmul_ref against a double product with that decode (exactly equal);
 *   - kdecode.h's kd_float_weight (what the CUDA kernels run) against it, bit for bit;
 *   - the CPU kernel, portable and AVX2, GEMV, GEMM and AUTO, against the reference under
 *     the self-test's named tolerance, on shapes with N and K off the tile sizes;
 *   - qd_kernel_dequant_cpu against it, bit for bit, one and several threads, both ISAs;
 *   - the layout's checks, names, byte counts, the CUDA launch plan of a float weight, the
 *     per-layer check on the CPU backend, and the self-test's float cases (and, once the
 *     table has float formats, each of them: dequant_ref = dequant_cpu = kd_float_weight). */
#include <stdlib.h>

#include "quant/backend/backend.h"
#include "quant/core/minifloat.h"
#include "quant/formats/quantizer.h"
#include "quant/kernels/kdecode.h"
#include "quant/kernels/kernel_plan.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "test_util.h"

/* The CPU kernels' tolerance: |y - ref| <= abs * sum_k |x w| + rel * |ref| (F32 sums in
 * another order than the reference's double ones), the self-test's "f32-accum". */
typedef struct tol { const char *name; double abs, rel; } tol;
static const tol TOL_F32_ACCUM = {"f32-accum", 5e-5, 1e-5};

/* One float layout to build. */
typedef struct variant {
    const char *name;
    qd_grid grid;
    qd_scale_rule rule;
    int64_t group_size, row_block;
} variant;

static const variant V_FP8_TENSOR = {"fp8-tensor", QD_GRID_FP8_E4M3, QD_SCALE_F32, -1, -1};
static const variant V_FP8_CHANNEL = {"fp8-channel", QD_GRID_FP8_E4M3, QD_SCALE_F32, -1, 1};
static const variant V_FP8_BLOCK = {"fp8-block128", QD_GRID_FP8_E4M3, QD_SCALE_F32, 128, 128};
static const variant V_FP8_GROUP = {"fp8-g64", QD_GRID_FP8_E4M3, QD_SCALE_F32, 64, 1};
static const variant V_NVFP4 = {"nvfp4-g16", QD_GRID_FP4_E2M1, QD_SCALE_FP8_GLOBAL, 16, 1};
static const variant V_MXFP4 = {"mxfp4-g32", QD_GRID_FP4_E2M1, QD_SCALE_E8M0, 32, 1};

/* W[n][k] by format.h's rule, with quant/core's minifloat decoders: value(code) * s, s the
 * stored scale divided by the global scale first under NVFP4's rule. */
static void decode_spec(const qd_packed *p, float *w)
{
    const int64_t n = p->n, k = p->k, G = p->fscales_shape[1];
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < k; i++) {
            const int64_t row = p->row_block > 0 ? r / p->row_block : 0, g = p->group_size > 0 ? i / p->group_size : 0;
            float s = p->fscales[row * G + g];
            if (p->scale_rule == QD_SCALE_FP8_GLOBAL) s = s / p->global_scale;
            float v;
            if (p->grid == QD_GRID_FP4_E2M1) {
                uint8_t b = p->fcodes[r * (k / 2) + i / 2];
                v = qd_fp4_e2m1_to_f32((uint8_t)(i % 2 ? b >> 4 : b & 15));
            } else {
                v = qd_fp8_e4m3_to_f32(p->fcodes[r * k + i]);
            }
            w[r * k + i] = v * s;
        }
}

static float amax_block(const float *w, int64_t k, int64_t r0, int64_t r1, int64_t i0, int64_t i1)
{
    float a = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = i0; i < i1; i++) a = fabsf(w[r * k + i]) > a ? fabsf(w[r * k + i]) : a;
    return a;
}

/* The stored scale of a block of largest magnitude a, by the rule (grid.h). */
static float rule_scale(qd_scale_rule rule, float a, float gscale)
{
    if (rule == QD_SCALE_FP8_GLOBAL) {
        float s = qd_f32_round_fp8_e4m3(gscale * (a / 6.0f));
        return s > 0.0f ? s : qd_fp8_e4m3_to_f32(0x01);
    }
    if (rule == QD_SCALE_E8M0) {
        if (!(a > 0.0f)) return qd_e8m0_to_f32(0);
        int e;
        frexpf(a, &e);                           /* a in [2^(e-1), 2^e) */
        return ldexpf(1.0f, e - 1 - 2);         /* 2^(floor(log2 a) - 2): 6 x s covers a */
    }
    return a > 0.0f ? a / 448.0f : 0x1p-126f;
}

/* Quantizes random weights [n, k] (normal, a few outliers) into the float layout of v. */
static void build(const variant *v, int64_t n, int64_t k, uint64_t seed, qd_packed *p)
{
    test_rng r;
    test_rng_seed(&r, seed);
    memset(p, 0, sizeof *p);
    float *w = malloc((size_t)(n * k) * sizeof *w);
    test_fill_normal(&r, w, (size_t)(n * k), 0.05f);
    for (int64_t i = 0; i < n * k; i += 97) w[i] *= 8.0f;
    const int fp4 = v->grid == QD_GRID_FP4_E2M1;
    const int64_t gs = v->group_size > 0 ? v->group_size : k, rb = v->row_block > 0 ? v->row_block : n;
    const int64_t G = (k + gs - 1) / gs, R = (n + rb - 1) / rb;
    p->n = n;
    p->k = k;
    p->bits = fp4 ? 4 : 8;
    p->sym = 1;
    p->group_size = v->group_size;
    p->n_groups = G;
    p->grid = v->grid;
    p->scale_rule = v->rule;
    p->row_block = v->row_block;
    p->global_scale = v->rule == QD_SCALE_FP8_GLOBAL ? qd_quant_global_scale(amax_block(w, k, 0, n, 0, k)) : 0.0f;
    p->fscales = malloc((size_t)(R * G) * sizeof *p->fscales);
    p->fscales_shape[0] = R;
    p->fscales_shape[1] = G;
    p->fcodes = calloc((size_t)(n * (fp4 ? k / 2 : k)), 1);
    p->fcodes_shape[0] = n;
    p->fcodes_shape[1] = fp4 ? k / 2 : k;
    for (int64_t br = 0; br < R; br++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = br * rb, r1 = r0 + rb < n ? r0 + rb : n, i0 = g * gs, i1 = i0 + gs < k ? i0 + gs : k;
            const float s = rule_scale(v->rule, amax_block(w, k, r0, r1, i0, i1), p->global_scale);
            p->fscales[br * G + g] = s;
            const float se = v->rule == QD_SCALE_FP8_GLOBAL ? s / p->global_scale : s;
            for (int64_t row = r0; row < r1; row++)
                for (int64_t i = i0; i < i1; i++) {
                    const float q = w[row * k + i] / se;
                    if (fp4) p->fcodes[row * (k / 2) + i / 2] |= (uint8_t)(qd_f32_to_fp4_e2m1(q) << (4 * (i % 2)));
                    else p->fcodes[row * k + i] = qd_f32_to_fp8_e4m3(q);
                }
        }
    free(w);
}

/* A stand-in float format for the calls that take one (dequant_cpu, check_layer) while the
 * table has none: its dequant_ref is the rule itself. */
static int spec_dequant(const qd_packed *p, float *w, qd_err *err)
{
    (void)err;
    decode_spec(p, w);
    return 0;
}
static const qd_format FMT_FLOAT = {.name = "test-float", .bits_mask = (1u << 4) | (1u << 8),
                                    .kernel = QD_FMT_KERNEL_FLOAT, .dequant_ref = spec_dequant};

static int same_bits(const float *a, const float *b, int64_t count, int64_t *where)
{
    for (int64_t i = 0; i < count; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) && !(isnan(a[i]) && isnan(b[i]))) {
            *where = i;
            return 0;
        }
    return 1;
}

static void random_x(test_rng *r, float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        float v = test_rng_normal(r);
        x[i] = v >= 0 ? v + 0.01f : v - 0.01f;
    }
}

/* Everything on one layer: decode, reference, CPU kernels, bulk dequantization. */
static void check_layer(const variant *v, int64_t n, int64_t k, uint64_t seed)
{
    qd_packed p;
    qd_err err = {0};
    build(v, n, k, seed, &p);
    qd_kmat m;
    if (qd_kmat_from_float(&p, &m, &err)) {
        TEST_FAIL_("%s [%lld, %lld]: %s", v->name, (long long)n, (long long)k, err.msg);
        qd_packed_free(&p);
        return;
    }
    CHECK_INT(m.layout, QD_KMAT_FLOAT);
    float *w = malloc((size_t)(n * k) * sizeof *w), *w2 = malloc((size_t)(n * k) * sizeof *w2);
    decode_spec(&p, w);
    /* kdecode (the CUDA kernels' decoder) is the rule, bit for bit. */
    const kd_fdesc d = {m.fcodes, m.fscales, n, k, m.group_size, m.n_groups, m.row_block, m.global_scale,
                        m.grid == QD_GRID_FP4_E2M1, m.scale_rule == QD_SCALE_FP8_GLOBAL};
    int64_t bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < k; i++) {
            float a = kd_float_weight(&d, r, i);
            if (memcmp(&a, &w[r * k + i], sizeof a)) bad++;
        }
    if (bad) TEST_FAIL_("%s [%lld, %lld]: kd_float_weight differs from the rule at %lld weights", v->name,
                        (long long)n, (long long)k, (long long)bad);
    test_checks++;
    /* The bulk decode, bit for bit, every ISA and thread count. */
    const int have_avx2 = !strcmp(qd_kernel_cpu_isa_name(), "avx2");
    for (int isa = QD_KCPU_PORTABLE; isa <= (have_avx2 ? QD_KCPU_AVX2 : QD_KCPU_PORTABLE); isa++)
        for (int nt = 1; nt <= 3; nt += 2) {
            for (int64_t i = 0; i < n * k; i++) w2[i] = NAN;
            CHECK_OK(qd_kernel_dequant_cpu(&FMT_FLOAT, &p, w2, nt, (qd_kcpu_isa)isa, &err));
            int64_t at = 0;
            if (!same_bits(w2, w, n * k, &at))
                TEST_FAIL_("%s [%lld, %lld] dequant_cpu isa %d threads %d: w[%lld] = %.9g, rule %.9g", v->name,
                           (long long)n, (long long)k, isa, nt, (long long)at, (double)w2[at], (double)w[at]);
            test_checks++;
        }
    /* The reference, then every CPU variant against it. */
    static const int64_t Ms[] = {1, 2, 3, 5, 8, 9, 17, 33};
    test_rng r;
    test_rng_seed(&r, seed + 1);
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int64_t M = Ms[mi];
        float *x = malloc((size_t)(M * k) * sizeof *x), *ref = malloc((size_t)(M * n) * sizeof *ref);
        float *y = malloc((size_t)(M * n) * sizeof *y);
        double *mag = malloc((size_t)(M * n) * sizeof *mag);
        random_x(&r, x, M * k);
        CHECK_OK(qd_kernel_matmul_ref(&m, x, M, ref, mag, &err));
        /* The reference is the double product of the rule's weights, in the same order. */
        int64_t off = 0;
        for (int64_t row = 0; row < M; row++)
            for (int64_t c = 0; c < n; c++) {
                double acc = 0.0;
                for (int64_t i = 0; i < k; i++) acc += (double)x[row * k + i] * (double)w[c * k + i];
                if ((float)acc != ref[row * n + c]) off++;
            }
        if (off) TEST_FAIL_("%s [%lld, %lld] M=%lld: the reference differs from the rule's product at %lld outputs",
                            v->name, (long long)n, (long long)k, (long long)M, (long long)off);
        test_checks++;
        for (int isa = QD_KCPU_PORTABLE; isa <= (have_avx2 ? QD_KCPU_AVX2 : QD_KCPU_PORTABLE); isa++)
            for (int path = QD_KPATH_AUTO; path <= QD_KPATH_GEMM; path++) {
                for (int64_t i = 0; i < M * n; i++) y[i] = NAN;
                CHECK_OK(qd_kernel_matmul_cpu(&m, x, M, y, (qd_kpath)path, (qd_kcpu_isa)isa, &err));
                for (int64_t i = 0; i < M * n; i++) {
                    const double diff = fabs((double)y[i] - (double)ref[i]);
                    if (!(diff <= TOL_F32_ACCUM.abs * mag[i] + TOL_F32_ACCUM.rel * fabs((double)ref[i]))) {
                        TEST_FAIL_("%s [%lld, %lld] isa %d path %d M=%lld: y[%lld] = %.9g, ref %.9g (outside %s)",
                                   v->name, (long long)n, (long long)k, isa, path, (long long)M, (long long)i,
                                   (double)y[i], (double)ref[i], TOL_F32_ACCUM.name);
                        break;
                    }
                }
                test_checks++;
            }
        free(x);
        free(ref);
        free(y);
        free(mag);
    }
    free(w);
    free(w2);
    qd_packed_free(&p);
}

static void test_fp8(void)
{
    check_layer(&V_FP8_TENSOR, 256, 512, 1);
    check_layer(&V_FP8_TENSOR, 37, 72, 2);          /* odd N, K off the tile */
    check_layer(&V_FP8_CHANNEL, 384, 1024, 3);
    check_layer(&V_FP8_CHANNEL, 13, 45, 4);         /* N < 16, odd K */
    check_layer(&V_FP8_BLOCK, 384, 1024, 5);
    check_layer(&V_FP8_BLOCK, 200, 320, 6);         /* partial 128 x 128 blocks both ways */
    check_layer(&V_FP8_GROUP, 129, 256, 7);
}

static void test_fp4(void)
{
    check_layer(&V_NVFP4, 256, 512, 11);
    check_layer(&V_NVFP4, 384, 1024, 12);
    check_layer(&V_NVFP4, 41, 100, 13);             /* odd N, K not a multiple of the group */
    check_layer(&V_MXFP4, 256, 512, 14);
    check_layer(&V_MXFP4, 384, 1024, 15);
    check_layer(&V_MXFP4, 7, 84, 16);               /* N below one tile */
}

/* Every FP8 byte and FP4 code through the CPU kernels (portable and AVX2) and the bulk
 * decode, bit for bit against the minifloat decoders, NaN codes included, with scale 1:
 * a [1, 256] FP8 weight holding each byte once, a [1, 16] FP4 one each code. */
static void test_every_code(void)
{
    qd_err err = {0};
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int64_t k = fp4 ? 16 : 256;
        uint8_t codes[256];
        float one = 1.0f, w[256], want[256];
        for (int i = 0; i < (fp4 ? 8 : 256); i++) codes[i] = fp4 ? (uint8_t)((2 * i) | (2 * i + 1) << 4) : (uint8_t)i;
        for (int i = 0; i < k; i++) want[i] = fp4 ? qd_fp4_e2m1_to_f32((uint8_t)i) : qd_fp8_e4m3_to_f32((uint8_t)i);
        qd_packed p;
        memset(&p, 0, sizeof p);
        p.n = 1;
        p.k = k;
        p.bits = fp4 ? 4 : 8;
        p.group_size = -1;
        p.n_groups = 1;
        p.grid = fp4 ? QD_GRID_FP4_E2M1 : QD_GRID_FP8_E4M3;
        p.scale_rule = fp4 ? QD_SCALE_E8M0 : QD_SCALE_F32;
        p.row_block = -1;
        p.fcodes = codes;
        p.fcodes_shape[0] = 1;
        p.fcodes_shape[1] = fp4 ? 8 : 256;
        p.fscales = &one;
        p.fscales_shape[0] = p.fscales_shape[1] = 1;
        static const qd_kcpu_isa isas[] = {QD_KCPU_PORTABLE, QD_KCPU_AVX2};
        for (int ii = 0; ii < 2; ii++) {
            const qd_kcpu_isa isa = isas[ii];
            if (isa == QD_KCPU_AVX2 && strcmp(qd_kernel_cpu_isa_name(), "avx2")) continue;
            CHECK_OK(qd_kernel_dequant_cpu(&FMT_FLOAT, &p, w, 1, isa, &err));
            int64_t at = 0;
            if (!same_bits(w, want, k, &at))
                TEST_FAIL_("%s code %lld isa %d: %.9g, minifloat %.9g", fp4 ? "fp4" : "fp8", (long long)at, (int)isa,
                           (double)w[at], (double)want[at]);
            test_checks++;
            /* NaN bits too (the minifloat decoder's NAN). */
            if (!fp4) CHECK_INT(memcmp(&w[0x7f], &want[0x7f], 4) == 0 && memcmp(&w[0xff], &want[0xff], 4) == 0, 1);
        }
    }
}

static void test_names_bytes_checks(void)
{
    qd_packed p;
    qd_kmat m;
    qd_err err = {0};
    build(&V_FP8_BLOCK, 200, 320, 21, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK_STR(qd_kmat_layout_name(&m), "fp8");
    CHECK_INT(m.n_scale_rows, 2);
    CHECK_INT(m.n_groups, 3);
    CHECK_INT(qd_kmat_bytes(&m), 200 * 320 + 2 * 3 * 4);
    /* qd_kmat_from_packed dispatches on the format's kernel. */
    CHECK_OK(qd_kmat_from_packed(&FMT_FLOAT, &p, &m, &err));
    CHECK_INT(m.layout, QD_KMAT_FLOAT);
    /* Scales that do not cover the weight, codes of the wrong shape, a bits mismatch. */
    p.fscales_shape[0] = 1;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    CHECK_CONTAINS(err.msg, "scale rows");
    p.fscales_shape[0] = 2;
    p.fcodes_shape[1] = 160;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    CHECK_CONTAINS(err.msg, "codes are");
    p.fcodes_shape[1] = 320;
    p.bits = 4;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    p.bits = 8;
    /* Grid and scale rule must pair as grid.h says. */
    p.scale_rule = QD_SCALE_E8M0;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    CHECK_CONTAINS(err.msg, "fp8_e4m3");
    p.scale_rule = QD_SCALE_F32;
    p.grid = QD_GRID_INT;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    p.grid = QD_GRID_FP8_E4M3;
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    /* The reorder is for gptq only. */
    qd_kmat re;
    CHECK_ERR(qd_kmat_reorder(&m, &re, &err));
    qd_packed_free(&p);

    build(&V_NVFP4, 64, 128, 22, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK_STR(qd_kmat_layout_name(&m), "nvfp4");
    CHECK_INT(qd_kmat_bytes(&m), 64 * 64 + 64 * 8 * 4);
    const float gs = p.global_scale;
    p.global_scale = 0.0f;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    CHECK_CONTAINS(err.msg, "global scale");
    p.global_scale = gs;
    p.k = 127;                      /* FP4 needs an even K */
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    p.k = 128;
    uint8_t *fc = p.fcodes;
    p.fcodes = NULL;
    CHECK_ERR(qd_kmat_from_float(&p, &m, &err));
    CHECK_CONTAINS(err.msg, "missing");
    p.fcodes = fc;
    qd_packed_free(&p);

    build(&V_MXFP4, 64, 128, 23, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK_STR(qd_kmat_layout_name(&m), "mxfp4");
    /* A format whose bits_mask lacks the width is refused by the bulk decode. */
    qd_format narrow = FMT_FLOAT;
    narrow.bits_mask = 1u << 8;
    float *w = malloc(64 * 128 * sizeof *w);
    CHECK_ERR(qd_kernel_dequant_cpu(&narrow, &p, w, 1, QD_KCPU_AUTO, &err));
    free(w);
    qd_packed_free(&p);
}

/* The CUDA launch plan of float weights (host arithmetic, tested here without a GPU). */
static void test_plan(void)
{
    qd_packed p;
    qd_kmat m;
    qd_kplan pl;
    qd_err err = {0};
    build(&V_NVFP4, 1001, 512, 31, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK(qd_kplan_float_gemv_ok(&m));
    CHECK_OK(qd_kplan_make(&m, 3, QD_KPATH_AUTO, &pl, &err));
    CHECK_INT(pl.gemv, 1);
    CHECK_INT(pl.threads, KPLAN_FV_THREADS);
    CHECK_INT(pl.grid_x, (1001 + KPLAN_FV_ROWS - 1) / KPLAN_FV_ROWS);
    CHECK_INT(pl.grid_y, 1);
    CHECK_INT(pl.workspace_bytes, 0);
    CHECK_OK(qd_kplan_make(&m, 20, QD_KPATH_GEMV, &pl, &err));
    CHECK_INT(pl.launches, 3);
    CHECK_OK(qd_kplan_make(&m, 20, QD_KPATH_AUTO, &pl, &err));
    CHECK_INT(pl.gemv, 0);
    CHECK_INT(pl.grid_x, (1001 + KPLAN_GM_BN - 1) / KPLAN_GM_BN);
    qd_packed_free(&p);
    /* K off 32 or a group that is not a multiple of 8: the GEMM, whatever the path asks. */
    build(&V_FP8_TENSOR, 64, 72, 32, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK(!qd_kplan_float_gemv_ok(&m));
    CHECK_OK(qd_kplan_make(&m, 1, QD_KPATH_GEMV, &pl, &err));
    CHECK_INT(pl.gemv, 0);
    qd_packed_free(&p);
    const variant odd_group = {"fp8-g12", QD_GRID_FP8_E4M3, QD_SCALE_F32, 12, 1};
    build(&odd_group, 64, 96, 33, &p);
    CHECK_OK(qd_kmat_from_float(&p, &m, &err));
    CHECK(!qd_kplan_float_gemv_ok(&m));
    qd_packed_free(&p);
    check_layer(&odd_group, 24, 96, 34);            /* groups that split the AVX2 8-blocks */
}

/* The pipeline's per-layer check on the CPU backend, through a float format. */
static void test_check_layer_cpu(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    qd_packed p;
    build(&V_NVFP4, 96, 256, 41, &p);
    test_rng r;
    test_rng_seed(&r, 5);
    float *x = malloc(4 * 256 * sizeof *x), *w = malloc(96 * 256 * sizeof *w);
    random_x(&r, x, 4 * 256);
    double rel = 1.0;
    CHECK_OK(qd_kernel_check_layer(be, &FMT_FLOAT, &p, NULL, x, 4, &rel, &err));
    CHECK(rel < 1e-5);
    decode_spec(&p, w);
    for (int64_t i = 0; i < 256; i++) w[7 * 256 + i] = -w[7 * 256 + i];
    CHECK_OK(qd_kernel_check_layer(be, &FMT_FLOAT, &p, w, x, 4, &rel, &err));
    CHECK(rel > 0.1);
    free(x);
    free(w);
    qd_packed_free(&p);
    qd_backend_close(be);
}

/* The self-test's float cases: every variant by hand, and each float format of the table
 * with the variants it packs, whose dequant_ref must be the rule (= dequant_cpu, bit for
 * bit) and whose kernels must match the reference. */
static void test_selftest_cases(void)
{
    qd_selftest_fcase fc[QD_SELFTEST_MAX_FCASES];
    const int nf = qd_selftest_float_cases(fc, QD_SELFTEST_MAX_FCASES);
    int by_hand = 0, in_table = 0;
    qd_err err = {0};
    for (int i = 0; i < nf; i++) {
        const int64_t n = 67, k = 256;
        qd_packed p;
        if (qd_selftest_make_float_layer(&fc[i], n, k, 50 + (uint64_t)i, &p, &err)) {
            TEST_FAIL_("make_float_layer %s %s: %s", fc[i].fmt ? fc[i].fmt->name : "by-hand", fc[i].name, err.msg);
            continue;
        }
        qd_kmat m;
        CHECK_OK(fc[i].fmt ? qd_kmat_from_packed(fc[i].fmt, &p, &m, &err) : qd_kmat_from_float(&p, &m, &err));
        float *w = malloc((size_t)(n * k) * sizeof *w), *w2 = malloc((size_t)(n * k) * sizeof *w2);
        decode_spec(&p, w);
        const qd_format *fmt = fc[i].fmt ? fc[i].fmt : &FMT_FLOAT;
        CHECK_OK(fmt->dequant_ref(&p, w2, &err));
        int64_t at = 0;
        if (!same_bits(w2, w, n * k, &at))
            TEST_FAIL_("%s %s: dequant_ref w[%lld] = %.9g, the rule %.9g", fmt->name, fc[i].name, (long long)at,
                       (double)w2[at], (double)w[at]);
        CHECK_OK(qd_kernel_dequant_cpu(fmt, &p, w2, 2, QD_KCPU_AUTO, &err));
        if (!same_bits(w2, w, n * k, &at))
            TEST_FAIL_("%s %s: dequant_cpu w[%lld] = %.9g, the rule %.9g", fmt->name, fc[i].name, (long long)at,
                       (double)w2[at], (double)w[at]);
        test_checks += 2;
        if (fc[i].fmt) in_table++;
        else by_hand++;
        free(w);
        free(w2);
        qd_packed_free(&p);
    }
    CHECK_INT(by_hand, 6);
    /* Each float format of the table holds at least one case, and only float formats do. */
    int float_formats = 0;
    for (size_t f = 0; f < qd_format_count(); f++) float_formats += qd_format_at(f)->kernel == QD_FMT_KERNEL_FLOAT;
    CHECK(in_table >= float_formats);
    qd_selftest_case ic[QD_SELFTEST_MAX_CASES];
    const int ni = qd_selftest_cases(ic, QD_SELFTEST_MAX_CASES);
    for (int i = 0; i < ni; i++) CHECK(ic[i].fmt->kernel != QD_FMT_KERNEL_FLOAT);
    /* The quick self-test on the CPU runs them all, and passes. */
    qd_backend *be = NULL;
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    qd_selftest_report rep;
    int rc = qd_selftest_run(be, 1, NULL, &rep, &err);
    CHECK_OK(rc);
    if (rc) fprintf(stderr, "selftest: %s\n", err.msg);
    CHECK_INT(rep.failures, 0);
    qd_backend_close(be);
}

int main(void)
{
    TEST_RUN(test_fp8);
    TEST_RUN(test_fp4);
    TEST_RUN(test_every_code);
    TEST_RUN(test_names_bytes_checks);
    TEST_RUN(test_plan);
    TEST_RUN(test_check_layer_cpu);
    TEST_RUN(test_selftest_cases);
    return test_finish();
}
