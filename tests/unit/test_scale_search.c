/* The scale search (quantizer.h, scale_search.c) against brute force: the chosen (scale,
 * zero) is the exhaustive best over the same candidates, for sym and zero-point, zero_min1,
 * bits 3 and 4, the FP4 grids, with and without weights, contiguous and strided; it is never
 * worse than min-max under its own metric; with the search off, every entry point is
 * exactly min-max. Then its wiring: RTN, and GPTQ's per-channel, static and dynamic groups
 * weighted by the Hessian's diagonal in processing order (act-order), on the portable and
 * SIMD kernels; and the refusals (rows sharing a scale, bad grids, the device's check). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/algo/gptq.h"
#include "quant/backend/backend.h"
#include "quant/backend/backend_args.h"
#include "quant/backend/gptq_block.h"
#include "quant/formats/quantizer.h"
#include "test_util.h"

static qd_backend *be;

static qd_quant_cfg cfg(int bits, int sym)
{
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = bits;
    c.sym = sym;
    c.group_size = 64;
    c.scale_search = QD_SCALE_SEARCH_MSE;
    return c;
}

/* The error in float64 throughout (pow in double): an independent reading of the metric. */
static double err64(const qd_quant_cfg *c, const float *w, int64_t n, int64_t st, const float *wt, float s, float z)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float v = w[i * st];
        double d = fabs((double)v - (double)qd_quant_dequant_cfg(c, qd_quant_code_cfg(c, v, s, z), s, z));
        e += (wt ? (double)wt[i] : 1.0) * pow(d, (double)c->search_norm);
    }
    return e;
}

/* A group: normal weights with a few outliers (where shrinking pays), sometimes all >= 0. */
static void fill_group(test_rng *rng, float *w, int64_t n, int64_t st, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        float v = test_rng_normal(rng) * 0.02f;
        if (test_rng_uniform(rng) < 0.03f) v *= 6.0f;
        if (kind == 1) v = fabsf(v);
        w[i * st] = v;
    }
}

/* One group: search vs brute force over qd_quant_search_candidate. */
static void check_group(const qd_quant_cfg *c, const float *w, int64_t n, int64_t st, const float *wt,
                        int *near_ties)
{
    float s, z;
    qd_quant_params_w(c, w, n, st, wt, &s, &z);
    float xmin = 0.0f, xmax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (w[i * st] < xmin) xmin = w[i * st];
        if (w[i * st] > xmax) xmax = w[i * st];
    }
    /* Brute force under the search's own arithmetic: exactly its choice (first best). */
    float bs = 0, bz = 0, ms = 0, mz = 0;
    double best = INFINITY, best64 = INFINITY;
    float b64s = 0, b64z = 0;
    for (int i = 0; i < qd_quant_search_count(c); i++) {
        float cs, cz;
        qd_quant_search_candidate(c, xmin, xmax, i, &cs, &cz);
        if (i == 0) ms = cs, mz = cz;
        double e = qd_quant_search_err(c, w, n, st, wt, cs, cz);
        if (e < best) best = e, bs = cs, bz = cz;
        double e64 = err64(c, w, n, st, wt, cs, cz);
        if (e64 < best64) best64 = e64, b64s = cs, b64z = cz;
    }
    CHECK_NEAR(s, bs, 0);
    CHECK_NEAR(z, bz, 0);
    /* Candidate 0 is min-max exactly. */
    float rs, rz;
    qd_quant_params_range(c, xmin, xmax, &rs, &rz);
    CHECK_NEAR(ms, rs, 0);
    CHECK_NEAR(mz, rz, 0);
    /* Never worse than min-max under its metric. */
    CHECK(qd_quant_search_err(c, w, n, st, wt, s, z) <= qd_quant_search_err(c, w, n, st, wt, ms, mz));
    CHECK(err64(c, w, n, st, wt, s, z) <= err64(c, w, n, st, wt, ms, mz) * (1.0 + 1e-5));
    /* The float64 brute force agrees but for near ties (float terms vs double pow). */
    if (s != b64s || z != b64z) {
        (*near_ties)++;
        CHECK_NEAR(err64(c, w, n, st, wt, s, z) / best64, 1.0, 1e-5);
    }
}

/* The SIMD error sum (contiguous values, integer grid, exponent 2) against the scalar one
 * (the same values strided): equal to the bit, for group lengths with and without a tail,
 * with and without weights, every candidate, and with a bound that stops the sum early. */
static void test_simd_equals_scalar(void)
{
    test_rng rng;
    test_rng_seed(&rng, 11);
    enum { MAXN = 200 };
    float w[MAXN], ws[2 * MAXN], wt[MAXN];
    static const int64_t lens[] = {8, 13, 32, 64, 128, 200};
    for (int bits = 3; bits <= 4; bits++)
        for (int sym = 0; sym < 2; sym++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                qd_quant_cfg c = cfg(bits, sym);
                int64_t n = lens[li];
                fill_group(&rng, w, n, 1, (int)(li % 2));
                for (int64_t i = 0; i < n; i++) {
                    ws[2 * i] = w[i];
                    ws[2 * i + 1] = 1e9f;          /* never read: stride 2 */
                    wt[i] = 0.5f + test_rng_uniform(&rng);
                }
                float xmin = 0.0f, xmax = 0.0f;
                for (int64_t i = 0; i < n; i++) {
                    if (w[i] < xmin) xmin = w[i];
                    if (w[i] > xmax) xmax = w[i];
                }
                for (int ci = 0; ci < qd_quant_search_count(&c); ci += 7) {
                    float cs, cz;
                    qd_quant_search_candidate(&c, xmin, xmax, ci, &cs, &cz);
                    for (int weighted = 0; weighted < 2; weighted++) {
                        const float *pw = weighted ? wt : NULL;
                        double e1 = qd_quant_search_err(&c, w, n, 1, pw, cs, cz);
                        double e2 = qd_quant_search_err(&c, ws, n, 2, pw, cs, cz);
                        CHECK(e1 == e2);
                    }
                }
                /* The chosen parameters too (the bound stops sums early in both). */
                float s1, z1, s2, z2;
                qd_quant_params_w(&c, w, n, 1, wt, &s1, &z1);
                qd_quant_params_w(&c, ws, n, 2, wt, &s2, &z2);
                CHECK(s1 == s2 && z1 == z2);
            }
}

static void test_brute_force(void)
{
    test_rng rng;
    test_rng_seed(&rng, 7);
    enum { N = 64, ST = 3 };
    float w[N * ST], wt[N];
    int near_ties = 0, cases = 0, shrunk = 0;
    for (int variant = 0; variant < 7; variant++) {
        qd_quant_cfg c = cfg(4, 1);
        switch (variant) {
        case 0: c = cfg(4, 1); break;
        case 1: c = cfg(3, 1); break;
        case 2: c = cfg(4, 0); break;
        case 3: c = cfg(3, 0); break;
        case 4: c = cfg(4, 0); c.zero_min1 = 1; break;
        case 5: c.grid = QD_GRID_FP4_E2M1; c.scale_rule = QD_SCALE_E8M0; break;
        case 6: c.grid = QD_GRID_FP4_E2M1; c.scale_rule = QD_SCALE_FP8_GLOBAL; c.global_scale = 448.0f * 6.0f / 0.2f; break;
        }
        CHECK_OK(qd_quant_cfg_validate(&c, NULL));
        for (int norm = 0; norm < 2; norm++) {
            c.search_norm = norm ? 2.0f : 2.4f;
            for (int rep = 0; rep < 40; rep++) {
                int kind = rep % 5 == 4;
                int64_t st = rep % 2 ? ST : 1, n = rep % 3 == 2 ? 37 : N;
                fill_group(&rng, w, n, st, kind);
                for (int i = 0; i < N; i++) wt[i] = i % 11 == 0 ? 0.0f : test_rng_uniform(&rng) * 4.0f;
                check_group(&c, w, n, st, NULL, &near_ties);
                check_group(&c, w, n, st, wt, &near_ties);
                float s, z, ms, mz;
                c.scale_search = QD_SCALE_SEARCH_MINMAX;
                qd_quant_params(&c, w, n, st, &ms, &mz);
                c.scale_search = QD_SCALE_SEARCH_MSE;
                qd_quant_params_w(&c, w, n, st, wt, &s, &z);
                shrunk += s != ms;
                cases += 2;
            }
        }
    }
    /* A search that never moves would pass the above: it must move on these groups. */
    CHECK(shrunk > 100);
    CHECK(near_ties <= cases / 50);
    /* All zero: min-max's +-1 range, no search. */
    float zero[8] = {0}, s, z, ms, mz;
    qd_quant_cfg c = cfg(4, 0);
    qd_quant_params_w(&c, zero, 8, 1, NULL, &s, &z);
    c.scale_search = QD_SCALE_SEARCH_MINMAX;
    qd_quant_params(&c, zero, 8, 1, &ms, &mz);
    CHECK_NEAR(s, ms, 0);
    CHECK_NEAR(z, mz, 0);
}

/* Search off: qd_quant_params_w (any weights) and qd_quant_params are min-max exactly. */
static void test_off_is_minmax(void)
{
    test_rng rng;
    test_rng_seed(&rng, 8);
    float w[64], wt[64];
    for (int sym = 0; sym < 2; sym++)
        for (int bits = 2; bits <= 4; bits++)
            for (int rep = 0; rep < 20; rep++) {
                qd_quant_cfg c = cfg(bits, sym);
                c.scale_search = QD_SCALE_SEARCH_MINMAX;
                fill_group(&rng, w, 64, 1, rep % 4 == 3);
                for (int i = 0; i < 64; i++) wt[i] = test_rng_uniform(&rng);
                float xmin = 0.0f, xmax = 0.0f, s0, z0, s1, z1, s2, z2;
                for (int i = 0; i < 64; i++) {
                    if (w[i] < xmin) xmin = w[i];
                    if (w[i] > xmax) xmax = w[i];
                }
                qd_quant_params_range(&c, xmin, xmax, &s0, &z0);
                qd_quant_params(&c, w, 64, 1, &s1, &z1);
                qd_quant_params_w(&c, w, 64, 1, wt, &s2, &z2);
                CHECK(s0 == s1 && s1 == s2 && z0 == z1 && z1 == z2);
            }
    qd_quant_cfg d = qd_quant_cfg_default();
    CHECK_INT(d.scale_search, QD_SCALE_SEARCH_MINMAX);
    CHECK_STR(qd_scale_search_name(QD_SCALE_SEARCH_MSE), "mse");
    CHECK_INT(qd_scale_search_parse("minmax"), QD_SCALE_SEARCH_MINMAX);
    CHECK_INT(qd_scale_search_parse("l2"), -1);
}

static void test_validate(void)
{
    qd_err e = {0};
    qd_quant_cfg c = cfg(4, 1);
    CHECK_INT(qd_quant_search_count(&c), 80);
    c.grid = QD_GRID_FP8_E4M3;
    c.bits = 8;
    c.scale_rule = QD_SCALE_F32;
    CHECK_OK(qd_quant_cfg_validate(&c, &e));
    c.row_block = 128;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    CHECK_CONTAINS(e.msg, "row_block 128");
    c = cfg(4, 1);
    c.search_maxshrink = 1.0f;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    CHECK_CONTAINS(e.msg, "maxshrink");
    c = cfg(4, 1);
    c.search_grid = 0;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    c = cfg(4, 1);
    c.search_norm = 0.5f;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    c = cfg(4, 1);
    c.scale_search = (qd_scale_search)5;
    CHECK_ERR(qd_quant_cfg_validate(&c, &e));
    /* The device's gptq_block searches dynamic groups with the exponent 2 (cfg's) and
     * refuses one it cannot compute as the reference does, by name. */
    c = cfg(4, 1);
    float f = 0;
    uint8_t u = 0;
    int32_t cg = 0;
    qd_gptq_block_args a = {.cfg = &c, .n = 1, .k = 1, .i1 = 0, .i2 = 1, .w = &f, .ldw = 1, .hinv = &f, .ldh = 1,
                            .err = &f, .lde = 1, .codes = &u, .ldc = 1, .scales = &f, .zeros = &f,
                            .col_group = &cg, .find_params = 1};
    CHECK_OK(qd_backend_gptq_block_args_check("dev gptq_block", &a, &e));
    c.search_norm = 3.0f;
    CHECK_INT(qd_backend_gptq_block_args_check("dev gptq_block", &a, &e), QD_EUNSUPPORTED);
    CHECK_CONTAINS(e.msg, "scale_search mse");
    c.scale_search = QD_SCALE_SEARCH_MINMAX;
    CHECK_OK(qd_backend_gptq_block_args_check("dev gptq_block", &a, &e));
}

/* RTN: every group's parameters are the search's with weights 1, and its error is at most
 * min-max's. */
static void test_rtn(void)
{
    test_rng rng;
    test_rng_seed(&rng, 9);
    const int64_t n = 6, k = 200;
    float *w = malloc(sizeof(float) * n * k), *deq = malloc(sizeof(float) * n * k);
    float *mdeq = malloc(sizeof(float) * n * k);
    for (int64_t r = 0; r < n; r++) fill_group(&rng, w + r * k, k, 1, 0);
    qd_quant_cfg c = cfg(4, 0);
    const int64_t G = qd_quant_n_groups(&c, k);
    float *sc = malloc(sizeof(float) * G * n), *zr = malloc(sizeof(float) * G * n);
    qd_err e = {0};
    CHECK_OK(qd_rtn_quantize(&c, w, n, k, NULL, sc, zr, deq, &e));
    qd_quant_cfg m = c;
    m.scale_search = QD_SCALE_SEARCH_MINMAX;
    CHECK_OK(qd_rtn_quantize(&m, w, n, k, NULL, NULL, NULL, mdeq, &e));
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < G; g++) {
            int64_t k0 = g * 64, len = k - k0 < 64 ? k - k0 : 64;
            float s, z;
            qd_quant_params_w(&c, w + r * k + k0, len, 1, NULL, &s, &z);
            CHECK(s == sc[g * n + r] && z == zr[g * n + r]);
            double es = 0, em = 0;
            for (int64_t i = r * k + k0; i < r * k + k0 + len; i++) {
                es += pow(fabs((double)w[i] - deq[i]), (double)c.search_norm);
                em += pow(fabs((double)w[i] - mdeq[i]), (double)c.search_norm);
            }
            CHECK(es <= em * (1.0 + 1e-5));
        }
    free(w); free(deq); free(mdeq); free(sc); free(zr);
}

/* GPTQ: the parameters found before any column is updated are the search's over the
 * original weights, weighted by H's diagonal: per channel (all of K), static groups
 * (original columns), and with act-order the first dynamic group (the first gs columns of
 * the processing order, so their diagonals in that order); the portable kernel agrees
 * with the SIMD one; and the search lowers GPTQ's own objective on this layer. */
static void gptq_case(int64_t gs, int desc_act, int static_groups, int sym)
{
    test_rng rng;
    test_rng_seed(&rng, 11 + (uint64_t)gs + 3u * (uint64_t)desc_act + 7u * (uint64_t)static_groups);
    const int64_t n = 20, k = 192, t = 600;
    float *x = malloc(sizeof(float) * t * k), *h = calloc((size_t)(k * k), sizeof(float));
    float *w = malloc(sizeof(float) * n * k);
    /* Columns of very different energy, so the weights matter. */
    for (int64_t r = 0; r < t; r++)
        for (int64_t j = 0; j < k; j++) x[r * k + j] = test_rng_normal(&rng) * (1.0f + (float)(j % 7) * 1.5f);
    for (int64_t r = 0; r < t; r++)
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < k; j++) h[i * k + j] += 2.0f * x[r * k + i] * x[r * k + j] / (float)t;
    for (int64_t r = 0; r < n; r++) fill_group(&rng, w + r * k, k, 1, 0);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant = cfg(4, sym);
    o.quant.group_size = gs;
    o.desc_act = desc_act;
    o.static_groups = static_groups;
    qd_gptq_result res, mres;
    qd_err e = {0};
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &e));
    float *hd = malloc(sizeof(float) * k), *row = malloc(sizeof(float) * k), *cw = malloc(sizeof(float) * k);
    for (int64_t i = 0; i < k; i++) hd[i] = h[i * k + i];
    int64_t *perm = malloc(sizeof(int64_t) * k);
    qd_gptq_act_order_perm(hd, k, perm);
    int64_t L = gs > 0 ? gs : k;
    for (int64_t r = 0; r < n; r++) {
        float s, z;
        if (gs < 0 || static_groups) {
            qd_quant_params_w(&o.quant, w + r * k, L, 1, hd, &s, &z);      /* group 0: columns 0..L-1 */
        } else {
            for (int64_t j = 0; j < L; j++) {
                int64_t p = desc_act ? perm[j] : j;
                row[j] = w[r * k + p];
                cw[j] = hd[p];
            }
            qd_quant_params_w(&o.quant, row, L, 1, cw, &s, &z);
        }
        CHECK(s == res.layer.scales[r]);
        CHECK(z == (float)res.layer.zeros[r]);
    }
    /* The portable kernel: the same codes. */
    qd_runtime_opts rt = qd_runtime_opts_default();
    rt.cpu_kernel = QD_CPU_KERNEL_PORTABLE;
    qd_backend *port = NULL;
    CHECK_OK(qd_backend_cpu_open(2, &rt, &port, &e));
    qd_gptq_result pres;
    CHECK_OK(qd_gptq_quantize_h(port, &o, w, n, k, h, &pres, &e));
    CHECK(memcmp(pres.layer.q, res.layer.q, (size_t)(n * k)) == 0);
    CHECK(memcmp(pres.layer.scales, res.layer.scales, sizeof(float) * (size_t)(res.layer.n_groups * n)) == 0);
    qd_gptq_result_free(&pres);
    qd_backend_close(port);
    /* GPTQ's objective tr((W - Q) H (W - Q)^T): the search does not raise it here. */
    o.quant.scale_search = QD_SCALE_SEARCH_MINMAX;
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &mres, &e));
    CHECK(res.h_err <= mres.h_err * 1.02);
    qd_gptq_result_free(&res);
    qd_gptq_result_free(&mres);
    free(x); free(h); free(w); free(hd); free(row); free(cw); free(perm);
}

static void test_gptq(void)
{
    gptq_case(-1, 0, 0, 1);     /* per channel */
    gptq_case(64, 0, 0, 1);     /* dynamic groups */
    gptq_case(64, 1, 0, 0);     /* act-order: the diagonal in processing order */
    gptq_case(64, 1, 1, 1);     /* act-order + static groups: original order */
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    TEST_RUN(test_brute_force);
    TEST_RUN(test_simd_equals_scalar);
    TEST_RUN(test_off_is_minmax);
    TEST_RUN(test_validate);
    TEST_RUN(test_rtn);
    TEST_RUN(test_gptq);
    qd_backend_close(be);
    return test_finish();
}
