/* GPTQ: identity Hessian == RTN, error below RTN on correlated inputs, act-order and static
 * group g_idx invariants, dead columns, damping retries and the RTN fallback, determinism,
 * the streaming Hessian, agreement with a transliteration of the reference loop, the
 * column losses' tr((W - Q) H (W - Q)^T), the factorisation shared by a group's linears,
 * and input validation. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/backend/backend.h"
#include "quant/formats/qlayer.h"
#include "quant/formats/quantizer.h"
#include "test_util.h"

static qd_backend *be;

/* X = Z @ A: T rows of K correlated features (A a random mixing matrix), plus a few
 * large-magnitude channels as LLM activations have. Caller frees. */
static float *make_correlated_x(test_rng *rng, int64_t t, int64_t k)
{
    float *z = malloc(sizeof(float) * t * k), *a = malloc(sizeof(float) * k * k);
    float *x = calloc(t * k, sizeof(float));
    test_fill_normal(rng, z, t * k, 1.0f);
    test_fill_normal(rng, a, k * k, 1.0f / sqrtf((float)k));
    for (int64_t i = 0; i < k; i++) a[i * k + i] += 0.3f;
    CHECK_OK(be->ops->gemm(be, 0, 0, t, k, k, 1.0f, z, k, a, k, 0.0f, x, k));
    for (int64_t r = 0; r < t; r++) {
        x[r * k + 3] *= 8.0f;
        x[r * k + k / 2] *= 5.0f;
    }
    free(z);
    free(a);
    return x;
}

static float *hessian_of(const float *x, int64_t t, int64_t k)
{
    qd_gptq_hessian acc;
    qd_err err = {0};
    CHECK_OK(qd_gptq_hessian_init(&acc, be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc, x, t, &err));
    float *h = malloc(sizeof(float) * k * k);
    CHECK_OK(qd_gptq_hessian_download(&acc, h, &err));
    qd_gptq_hessian_free(&acc);
    return h;
}

/* ||(W - Q) X^T||_F^2 */
static double out_err2(const float *w, const float *q, const float *x, int64_t n, int64_t k, int64_t t)
{
    double s = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < t; i++) {
            double d = 0;
            for (int64_t c = 0; c < k; c++) d += ((double)w[r * k + c] - q[r * k + c]) * x[i * k + c];
            s += d * d;
        }
    return s;
}

static void test_identity_hessian_is_rtn(void)
{
    test_rng rng;
    test_rng_seed(&rng, 1);
    const int64_t n = 24, k = 96;
    float *w = malloc(sizeof(float) * n * k), *h = calloc(k * k, sizeof(float));
    test_fill_normal(&rng, w, n * k, 0.05f);
    for (int64_t i = 0; i < k; i++) h[i * k + i] = 1.0f;
    const int64_t group_sizes[] = {32, -1, 64};
    for (int gi = 0; gi < 3; gi++)
        for (int bits = 2; bits <= 8; bits *= 2)
            for (int sym = 0; sym < 2; sym++) {
                qd_gptq_opts o = qd_gptq_opts_default();
                o.quant.bits = bits;
                o.quant.sym = sym;
                o.quant.zero_min1 = !sym;
                o.quant.group_size = group_sizes[gi];
                o.desc_act = gi == 2;          /* equal diagonal: the stable order is the identity */
                o.block_size = 40;             /* blocks that do not line up with groups */
                qd_gptq_result res;
                qd_err err = {0};
                CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
                qd_qlayer rtn;
                float *rdeq = malloc(sizeof(float) * n * k);
                float *zf = malloc(sizeof(float) * res.layer.n_groups * n);
                CHECK_OK(qd_qlayer_alloc(&rtn, n, k, bits, sym, o.quant.group_size, 0, &err));
                CHECK_OK(qd_rtn_quantize(&o.quant, w, n, k, rtn.q, rtn.scales, zf, rdeq, &err));
                CHECK(memcmp(res.layer.q, rtn.q, n * k) == 0);
                CHECK(memcmp(res.layer.scales, rtn.scales, sizeof(float) * rtn.n_groups * n) == 0);
                for (int64_t i = 0; i < rtn.n_groups * n; i++) CHECK_INT(res.layer.zeros[i], (int32_t)zf[i]);
                CHECK(memcmp(res.deq, rdeq, sizeof(float) * n * k) == 0);
                for (int64_t i = 0; i < k; i++)
                    CHECK_INT(res.layer.g_idx[i], o.quant.group_size > 0 ? i / o.quant.group_size : 0);
                CHECK_INT(res.fallback_rtn, 0);
                CHECK_INT(res.damp_retries, 0);
                CHECK_NEAR(res.damp, 0.01, 1e-7);
                qd_qlayer_free(&rtn);
                free(rdeq);
                free(zf);
                qd_gptq_result_free(&res);
            }
    free(w);
    free(h);
}

static void test_better_than_rtn(void)
{
    test_rng rng;
    test_rng_seed(&rng, 2);
    const int64_t n = 64, k = 128, t = 512;
    float *x = make_correlated_x(&rng, t, k);
    float *h = hessian_of(x, t, k);
    float *w = malloc(sizeof(float) * n * k), *rdeq = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    for (int bits = 3; bits <= 4; bits++)
        for (int act = 0; act < 2; act++) {
            qd_gptq_opts o = qd_gptq_opts_default();
            o.quant.bits = bits;
            o.quant.sym = 0;
            o.quant.zero_min1 = 1;
            o.quant.group_size = 32;
            o.desc_act = act;
            qd_gptq_result res;
            qd_err err = {0};
            CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
            CHECK_OK(qd_rtn_quantize(&o.quant, w, n, k, NULL, NULL, NULL, rdeq, &err));
            double eg = out_err2(w, res.deq, x, n, k, t), er = out_err2(w, rdeq, x, n, k, t);
            if (!(eg < 0.8 * er))
                fprintf(stderr, "bits %d act %d: gptq %g vs rtn %g\n", bits, act, eg, er);
            CHECK(eg < 0.8 * er);
            /* deq is exactly what the codes decode to */
            float *dq = malloc(sizeof(float) * n * k);
            qd_qlayer_dequant_ref(&res.layer, dq);
            CHECK(memcmp(dq, res.deq, sizeof(float) * n * k) == 0);
            free(dq);
            for (int64_t i = 0; i < res.layer.n_groups * n; i++) CHECK(res.layer.zeros[i] >= 1);
            CHECK(res.seconds >= 0.0);
            qd_gptq_result_free(&res);
        }
    free(x); free(h); free(w); free(rdeq);
}

static void test_act_order_g_idx(void)
{
    test_rng rng;
    test_rng_seed(&rng, 3);
    const int64_t n = 16, k = 128, t = 300, gs = 32;
    float *x = make_correlated_x(&rng, t, k);
    for (int64_t r = 0; r < t; r++)
        for (int64_t c = 0; c < k; c++) x[r * k + c] *= 0.2f + (float)((c * 37) % k) / (float)k;
    float *h = hessian_of(x, t, k);
    float *w = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    float diag[128];
    for (int64_t i = 0; i < k; i++) diag[i] = h[i * k + i];
    int64_t perm[128];
    qd_gptq_act_order_perm(diag, k, perm);
    for (int64_t j = 1; j < k; j++) CHECK(diag[perm[j - 1]] >= diag[perm[j]]);

    for (int st = 0; st < 2; st++) {
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant.group_size = gs;
        o.desc_act = 1;
        o.static_groups = st;
        qd_gptq_result res;
        qd_err err = {0};
        CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
        int64_t counts[4] = {0};
        for (int64_t i = 0; i < k; i++) {
            CHECK(res.layer.g_idx[i] >= 0 && res.layer.g_idx[i] < 4);
            counts[res.layer.g_idx[i]]++;
        }
        for (int g = 0; g < 4; g++) CHECK_INT(counts[g], gs);
        int perm_ok = 1, static_ok = 1;
        for (int64_t j = 0; j < k; j++) {
            if (res.layer.g_idx[perm[j]] != j / gs) perm_ok = 0;
            if (res.layer.g_idx[j] != j / gs) static_ok = 0;
        }
        if (st) CHECK(static_ok);
        else CHECK(perm_ok && !static_ok);
        float *dq = malloc(sizeof(float) * n * k);
        qd_qlayer_dequant_ref(&res.layer, dq);
        CHECK(memcmp(dq, res.deq, sizeof(float) * n * k) == 0);
        free(dq);
        qd_gptq_result_free(&res);
    }
    /* Ties keep index order. */
    float ties[6] = {1, 3, 1, 3, 2, 1};
    int64_t tp[6];
    qd_gptq_act_order_perm(ties, 6, tp);
    const int64_t want[6] = {1, 3, 4, 0, 2, 5};
    for (int i = 0; i < 6; i++) CHECK_INT(tp[i], want[i]);
    free(x); free(h); free(w);
}

/* res.h_err (GPTQ's column losses, less the damping's and dead columns' share) against
 * tr((W - Q) H (W - Q)^T) computed here in double: the per-layer error's numerator. */
static void check_h_err(const qd_gptq_result *res, const float *w, const float *h, int64_t n, int64_t k)
{
    double want = 0;
    double *d = malloc(sizeof(double) * k);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t c = 0; c < k; c++) d[c] = (double)w[r * k + c] - res->deq[r * k + c];
        for (int64_t i = 0; i < k; i++) {
            double hi = 0;
            for (int64_t c = 0; c < k; c++) hi += (double)h[i * k + c] * d[c];
            want += d[i] * hi;
        }
    }
    free(d);
    CHECK(want > 0);
    CHECK_NEAR(res->h_err, want, 2e-4 * want);
}

static void test_dead_columns(void)
{
    test_rng rng;
    test_rng_seed(&rng, 4);
    const int64_t n = 8, k = 64, t = 200;
    float *x = make_correlated_x(&rng, t, k);
    for (int64_t r = 0; r < t; r++) x[r * k + 5] = x[r * k + 40] = 0.0f;
    float *h = hessian_of(x, t, k);
    CHECK(h[5 * k + 5] == 0.0f);
    float *w = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    for (int act = 0; act < 2; act++) {
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant.group_size = 16;
        o.desc_act = act;
        qd_gptq_result res;
        qd_err err = {0};
        CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
        CHECK_INT(res.dead_columns, 2);
        for (int64_t r = 0; r < n; r++) {
            CHECK(res.deq[r * k + 5] == 0.0f);
            CHECK(res.deq[r * k + 40] == 0.0f);
        }
        for (int64_t i = 0; i < n * k; i++)
            if (!isfinite(res.deq[i])) { CHECK(isfinite(res.deq[i])); break; }
        check_h_err(&res, w, h, n, k);
        qd_gptq_result_free(&res);
    }
    free(x); free(h); free(w);
}

/* H built from 2x2 blocks [[1, c], [c, 1]]: eigenvalues 1 - c < 0 until the damping
 * exceeds c - 1 (damp = pct * mean(diag) = pct). */
static float *indefinite_h(int64_t k, float c)
{
    float *h = calloc(k * k, sizeof(float));
    for (int64_t i = 0; i < k; i += 2) {
        h[i * k + i] = h[(i + 1) * k + i + 1] = 1.0f;
        h[i * k + i + 1] = h[(i + 1) * k + i] = c;
    }
    return h;
}

static void test_damping_retries_and_fallback(void)
{
    test_rng rng;
    test_rng_seed(&rng, 5);
    const int64_t n = 8, k = 32;
    float *w = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.group_size = 16;
    qd_gptq_result res;
    qd_err err = {0};

    /* c = 3: 0.01, 0.1, 1 fail; 10 (damp 10) works. */
    float *h = indefinite_h(k, 3.0f);
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
    CHECK_INT(res.damp_retries, 3);
    CHECK_NEAR(res.damp_percent, 10.0, 1e-9);
    CHECK_INT(res.fallback_rtn, 0);
    for (int64_t i = 0; i < n * k; i++) CHECK(isfinite(res.deq[i]));
    qd_gptq_result_free(&res);
    free(h);

    /* c = 30: nothing up to 10 works: RTN. */
    h = indefinite_h(k, 30.0f);
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
    CHECK_INT(res.fallback_rtn, 1);
    CHECK(res.h_err < 0);                   /* no column losses: the caller computes the error */
    float *rdeq = malloc(sizeof(float) * n * k);
    CHECK_OK(qd_rtn_quantize(&o.quant, w, n, k, NULL, NULL, NULL, rdeq, &err));
    CHECK(memcmp(rdeq, res.deq, sizeof(float) * n * k) == 0);
    qd_gptq_result_free(&res);

    /* With no retries allowed, c = 3 falls back at once. */
    free(h);
    h = indefinite_h(k, 3.0f);
    o.max_damp_retries = 0;
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
    CHECK_INT(res.fallback_rtn, 1);
    CHECK_NEAR(res.damp_percent, 0.01, 1e-12);
    qd_gptq_result_free(&res);
    free(h); free(w); free(rdeq);
}

static void test_deterministic(void)
{
    test_rng rng;
    test_rng_seed(&rng, 6);
    const int64_t n = 48, k = 256, t = 400;
    float *x = make_correlated_x(&rng, t, k);
    float *h = hessian_of(x, t, k);
    float *w = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.bits = 3;
    o.quant.sym = 0;
    o.quant.group_size = 64;
    o.desc_act = 1;
    qd_gptq_result a, b;
    qd_err err = {0};
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &a, &err));
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &b, &err));
    CHECK(memcmp(a.layer.q, b.layer.q, n * k) == 0);
    CHECK(memcmp(a.layer.scales, b.layer.scales, sizeof(float) * a.layer.n_groups * n) == 0);
    CHECK(memcmp(a.layer.zeros, b.layer.zeros, sizeof(int32_t) * a.layer.n_groups * n) == 0);
    CHECK(memcmp(a.layer.g_idx, b.layer.g_idx, sizeof(int32_t) * k) == 0);
    CHECK(memcmp(a.deq, b.deq, sizeof(float) * n * k) == 0);
    qd_gptq_result_free(&b);
    /* A stop flag left at 0 changes nothing; set, the column loop stops: QD_ECANCELLED, no result. */
    atomic_int stop = 0;
    o.stop = &stop;
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &b, &err));
    CHECK(memcmp(a.layer.q, b.layer.q, n * k) == 0 && memcmp(a.deq, b.deq, sizeof(float) * n * k) == 0);
    qd_gptq_result_free(&b);
    atomic_store(&stop, 1);
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &b, &err), QD_ECANCELLED);
    CHECK(b.deq == NULL && b.layer.q == NULL);
    qd_gptq_result_free(&a);
    free(x); free(h); free(w);
}

static void test_hessian_stream(void)
{
    test_rng rng;
    test_rng_seed(&rng, 7);
    const int64_t k = 40, t = 150;
    float *x = make_correlated_x(&rng, t, k);
    qd_gptq_hessian acc;
    qd_err err = {0};
    CHECK_OK(qd_gptq_hessian_init(&acc, be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc, x, 50, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc, x + 50 * k, 0, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc, x + 50 * k, 100, &err));
    CHECK_INT(acc.n_seen, t);
    float *h = malloc(sizeof(float) * k * k);
    CHECK_OK(qd_gptq_hessian_download(&acc, h, &err));
    double md = 0;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) {
            double s = 0;
            for (int64_t r = 0; r < t; r++) s += (double)x[r * k + i] * x[r * k + j];
            md = fmax(md, fabs(2.0 * s / t - h[i * k + j]) / (1.0 + fabs(2.0 * s / t)));
        }
    CHECK_NEAR(md, 0.0, 1e-5);
    /* A NaN input is refused and leaves H unchanged. */
    x[7] = NAN;
    CHECK_INT(qd_gptq_hessian_add(&acc, x, 1, &err), QD_ENUMERIC);
    CHECK_CONTAINS(err.msg, "not finite");
    CHECK_INT(acc.n_seen, t);

    /* quantize through the accumulator == quantize_h on its H */
    float *w = malloc(sizeof(float) * 8 * k);
    test_fill_normal(&rng, w, 8 * k, 0.05f);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.group_size = 20;
    qd_gptq_result a, b;
    CHECK_OK(qd_gptq_quantize(be, &o, w, 8, k, &acc, &a, &err));
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, 8, k, h, &b, &err));
    CHECK(memcmp(a.deq, b.deq, sizeof(float) * 8 * k) == 0);
    qd_gptq_result_free(&a);
    qd_gptq_result_free(&b);
    CHECK_INT(qd_gptq_quantize(be, &o, w, 8, k + 1, &acc, &a, &err), QD_ESHAPE);
    qd_gptq_hessian_free(&acc);
    qd_gptq_hessian_free(&acc);
    qd_gptq_hessian_free(NULL);
    CHECK_OK(qd_gptq_hessian_init(&acc, be, k, &err));
    CHECK_INT(qd_gptq_quantize(be, &o, w, 8, k, &acc, &a, &err), QD_EINVAL);   /* no rows */
    qd_gptq_hessian_free(&acc);
    free(x); free(h); free(w);
}

/* calibration.shards: Hessians summed per shard and merged in shard order are the mean over
 * every row (to rounding), element by element n/(n+m) H + m/(n+m) H_s exactly; a shard of no
 * row changes nothing; into an accumulator of no row the shard's H is copied bit for bit. */
static void test_hessian_merge(void)
{
    test_rng rng;
    test_rng_seed(&rng, 11);
    const int64_t k = 24, t = 90;
    float *x = make_correlated_x(&rng, t, k);
    qd_err err = {0};
    qd_gptq_hessian all, a, b, none;
    CHECK_OK(qd_gptq_hessian_init(&all, be, k, &err));
    CHECK_OK(qd_gptq_hessian_init(&a, be, k, &err));
    CHECK_OK(qd_gptq_hessian_init(&b, be, k, &err));
    CHECK_OK(qd_gptq_hessian_init(&none, be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&all, x, t, &err));
    CHECK_OK(qd_gptq_hessian_add(&a, x, 30, &err));
    CHECK_OK(qd_gptq_hessian_add(&b, x + 30 * k, 60, &err));
    float *ha = malloc(sizeof(float) * k * k), *hb = malloc(sizeof(float) * k * k), *h = malloc(sizeof(float) * k * k);
    CHECK_OK(qd_gptq_hessian_download(&a, ha, &err));
    CHECK_OK(qd_gptq_hessian_download(&b, hb, &err));
    /* into an empty accumulator: a's H exactly */
    qd_gptq_hessian m;
    CHECK_OK(qd_gptq_hessian_init(&m, be, k, &err));
    CHECK_OK(qd_gptq_hessian_merge(&m, &a, &err));
    CHECK_OK(qd_gptq_hessian_merge(&m, &none, &err));   /* no rows: nothing changes */
    CHECK_OK(qd_gptq_hessian_download(&m, h, &err));
    CHECK(memcmp(h, ha, sizeof(float) * k * k) == 0);
    CHECK_INT(m.n_seen, 30);
    CHECK_OK(qd_gptq_hessian_merge(&m, &b, &err));
    CHECK_INT(m.n_seen, t);
    CHECK(m.x_amax == all.x_amax);
    CHECK_OK(qd_gptq_hessian_download(&m, h, &err));
    float *hall = malloc(sizeof(float) * k * k);
    CHECK_OK(qd_gptq_hessian_download(&all, hall, &err));
    int exact = 1;
    double md = 0;
    for (int64_t i = 0; i < k * k; i++) {
        volatile float p1 = ha[i] * (float)(30.0 / 90.0), p2 = hb[i] * (float)(60.0 / 90.0);   /* no FMA */
        exact &= h[i] == p1 + p2;
        md = fmax(md, fabs((double)h[i] - hall[i]) / (1.0 + fabs((double)hall[i])));
    }
    CHECK(exact);
    CHECK_NEAR(md, 0.0, 1e-5);
    qd_gptq_hessian narrow;
    CHECK_OK(qd_gptq_hessian_init(&narrow, be, k - 1, &err));
    CHECK_INT(qd_gptq_hessian_merge(&m, &narrow, &err), QD_EINVAL);
    qd_gptq_hessian_free(&narrow);
    qd_gptq_hessian_free(&m);
    qd_gptq_hessian_free(&all);
    qd_gptq_hessian_free(&a);
    qd_gptq_hessian_free(&b);
    qd_gptq_hessian_free(&none);
    free(x); free(ha); free(hb); free(h); free(hall);
}

/* The reference fasterquant loop transliterated (column by column over all rows, W1/Err1
 * copies, trailing update with plain loops in double), fed the same Hinv. */
static void reference_gptq(const qd_gptq_opts *o, float *W, const float *hinv, int64_t n, int64_t k,
                           float *Q)
{
    const qd_quant_cfg *c = &o->quant;
    const int64_t B = o->block_size, gs = c->group_size;
    const int maxq = qd_quant_maxq(c);
    float *scale = malloc(sizeof(float) * n), *zero = malloc(sizeof(float) * n);
    float *W1 = malloc(sizeof(float) * n * B), *Err1 = malloc(sizeof(float) * n * B);
    for (int64_t i1 = 0; i1 < k; i1 += B) {
        int64_t i2 = i1 + B < k ? i1 + B : k, cnt = i2 - i1;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < cnt; i++) W1[r * B + i] = W[r * k + i1 + i];
        for (int64_t i = 0; i < cnt; i++) {
            int64_t j = i1 + i;
            if (j % gs == 0)
                for (int64_t r = 0; r < n; r++)
                    qd_quant_params(c, W + r * k + j, j + gs <= k ? gs : k - j, 1, &scale[r], &zero[r]);
            float d = hinv[j * k + j];
            for (int64_t r = 0; r < n; r++) {
                float wv = W1[r * B + i];
                float q = qd_quant_dequant(qd_quant_code(wv, scale[r], zero[r], maxq), scale[r], zero[r]);
                Q[r * k + j] = q;
                float e = (wv - q) / d;
                for (int64_t cc = i; cc < cnt; cc++) W1[r * B + cc] -= e * hinv[j * k + i1 + cc];
                Err1[r * B + i] = e;
            }
        }
        for (int64_t r = 0; r < n; r++)
            for (int64_t cc = i2; cc < k; cc++) {
                double s = 0;
                for (int64_t i = 0; i < cnt; i++) s += (double)Err1[r * B + i] * hinv[(i1 + i) * k + cc];
                W[r * k + cc] -= (float)s;
            }
    }
    free(scale); free(zero); free(W1); free(Err1);
}

static void test_matches_reference_loop(void)
{
    test_rng rng;
    test_rng_seed(&rng, 8);
    const int64_t n = 32, k = 192, t = 600;
    float *x = make_correlated_x(&rng, t, k);
    float *h = hessian_of(x, t, k);
    float *w = malloc(sizeof(float) * n * k), *wc = malloc(sizeof(float) * n * k);
    float *qref = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.bits = 4;
    o.quant.sym = 0;
    o.quant.group_size = 32;     /* groups start inside blocks of 64 */
    o.block_size = 64;
    qd_gptq_result res;
    qd_err err = {0};
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err));
    /* Hinv as the implementation computes it: damp, then the backend op. */
    float *hinv = malloc(sizeof(float) * k * k);
    memcpy(hinv, h, sizeof(float) * k * k);
    double mean = 0;
    for (int64_t i = 0; i < k; i++) mean += h[i * k + i];
    float damp = (float)(0.01 * mean / k);
    for (int64_t i = 0; i < k; i++) hinv[i * k + i] += damp;
    CHECK_OK(be->ops->chol_inverse_upper(be, hinv, k));
    memcpy(wc, w, sizeof(float) * n * k);
    reference_gptq(&o, wc, hinv, n, k, qref);
    int64_t same = 0;
    for (int64_t i = 0; i < n * k; i++) same += qref[i] == res.deq[i];
    /* Summation order differs (BLAS vs loops), so a rare rounding tie may flip a code. */
    CHECK(same >= n * k - n * k / 200);
    double eg = out_err2(w, res.deq, x, n, k, t), er = out_err2(w, qref, x, n, k, t);
    CHECK_NEAR(eg / er, 1.0, 0.01);
    qd_gptq_result_free(&res);
    free(x); free(h); free(w); free(wc); free(qref); free(hinv);
}

static void test_bad_input(void)
{
    const int64_t n = 4, k = 8;
    float w[32], h[64] = {0};
    for (int i = 0; i < 32; i++) w[i] = 0.1f * (float)(i % 7);
    for (int i = 0; i < 8; i++) h[i * 8 + i] = 1.0f;
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.group_size = 4;
    qd_gptq_result res;
    qd_err err = {0};
    w[5] = INFINITY;
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err), QD_ENUMERIC);
    CHECK_CONTAINS(err.msg, "weight [0][5]");
    w[5] = 0.0f;
    h[9] = NAN;
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err), QD_ENUMERIC);
    CHECK_CONTAINS(err.msg, "Hessian");
    h[9] = 1.0f;
    o.quant.bits = 5;
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "bits: 5");
    o.quant.bits = 4;
    o.damp_percent = 1.5;
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "damp_percent");
    o.damp_percent = 0.01;
    o.quant.group_size = 0;
    CHECK_INT(qd_gptq_quantize_h(be, &o, w, n, k, h, &res, &err), QD_EINVAL);
    CHECK(res.deq == NULL);
    qd_gptq_result_free(&res);
}

/* The LDL form (the CPU default: one Cholesky, no inverse, lazy updates of corrections) against
 * the U form (QD_GPTQ_FORM_INVERSE, QUANTD_GPTQ_FORM=inverse, the reference's formulation): equal in exact
 * arithmetic, so the codes agree but for rare rounding ties and the output errors match.
 * Configurations: many blocks with a short last one, groups inside blocks,
 * groups wider than a block, one group, static groups with act-order, the SIMD and the
 * portable kernels. */
static void ldl_vs_inverse_case(int64_t n, int64_t k, int64_t B, int64_t gs, int sym, int desc_act,
                                int static_groups, uint64_t seed)
{
    test_rng rng;
    test_rng_seed(&rng, seed);
    const int64_t t = 3 * k;
    float *x = make_correlated_x(&rng, t, k);
    float *h = hessian_of(x, t, k);
    float *w = malloc(sizeof(float) * n * k);
    test_fill_normal(&rng, w, n * k, 0.05f);
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.sym = sym;
    o.quant.group_size = gs;
    o.block_size = B;
    o.desc_act = desc_act;
    o.static_groups = static_groups;
    qd_gptq_result rl, ru;
    qd_err err = {0};
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &rl, &err));
    be->rt.gptq_form = QD_GPTQ_FORM_INVERSE;       /* what QUANTD_GPTQ_FORM=inverse sets */
    CHECK_OK(qd_gptq_quantize_h(be, &o, w, n, k, h, &ru, &err));
    be->rt.gptq_form = QD_GPTQ_FORM_AUTO;
    int64_t same = 0;
    for (int64_t i = 0; i < n * k; i++) same += rl.layer.q[i] == ru.layer.q[i];
    CHECK(same >= n * k - n * k / 200);
    CHECK(memcmp(rl.layer.g_idx, ru.layer.g_idx, sizeof(int32_t) * k) == 0);
    double el = out_err2(w, rl.deq, x, n, k, t), eu = out_err2(w, ru.deq, x, n, k, t);
    CHECK_NEAR(el / eu, 1.0, 0.01);
    check_h_err(&rl, w, h, n, k);   /* both forms' column losses give the layer's error */
    check_h_err(&ru, w, h, n, k);
    qd_gptq_result_free(&rl);
    qd_gptq_result_free(&ru);
    free(x); free(h); free(w);
}

static void test_ldl_matches_inverse_form(void)
{
    ldl_vs_inverse_case(40, 600, 64, 32, 0, 0, 0, 31);     /* 10 blocks, the last short */
    ldl_vs_inverse_case(37, 300, 32, 128, 1, 0, 0, 32);    /* a group spans 4 blocks */
    ldl_vs_inverse_case(24, 320, 64, -1, 0, 0, 0, 33);     /* one group for all of K */
    ldl_vs_inverse_case(33, 384, 64, 64, 1, 1, 0, 34);     /* act-order */
    ldl_vs_inverse_case(33, 384, 64, 64, 1, 1, 1, 35);     /* act-order + static groups */
    qd_runtime_opts rt = qd_runtime_opts_default();
    rt.cpu_kernel = QD_CPU_KERNEL_PORTABLE;
    qd_backend *keep = be, *port = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(2, &rt, &port, &err));
    be = port;
    ldl_vs_inverse_case(40, 600, 64, 32, 0, 0, 0, 36);
    ldl_vs_inverse_case(37, 300, 32, 128, 1, 0, 0, 37);
    qd_backend_close(port);
    /* The AVX2 kernel too (it writes Q into the result directly without act-order). */
    rt.cpu_kernel = QD_CPU_KERNEL_AVX2;
    CHECK_OK(qd_backend_cpu_open(2, &rt, &port, &err));
    be = port;
    ldl_vs_inverse_case(40, 600, 64, 32, 0, 0, 0, 38);
    ldl_vs_inverse_case(33, 384, 64, 64, 1, 1, 0, 39);
    be = keep;
    qd_backend_close(port);
}

/* The factorisation shared between linears of one input group gives each linear exactly
 * what quantizing it alone gives (codes, Q, damping, error), is made once (the factor
 * buffer is the first call's), and is remade for another accumulator or more rows folded
 * in; with and without act-order. */
static void test_shared_factor(void)
{
    test_rng rng;
    test_rng_seed(&rng, 41);
    const int64_t k = 96, t = 400;
    float *x = make_correlated_x(&rng, t, k);
    qd_gptq_hessian acc, acc2;
    qd_err err = {0};
    CHECK_OK(qd_gptq_hessian_init(&acc, be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc, x, t, &err));
    CHECK_OK(qd_gptq_hessian_init(&acc2, be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&acc2, x, t / 2, &err));
    const int64_t ns[3] = {40, 24, 56};
    for (int act = 0; act < 2; act++) {
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant.group_size = 32;
        o.desc_act = act;
        qd_gptq_shared sh;
        memset(&sh, 0, sizeof sh);
        const float *fac = NULL;
        for (int i = 0; i < 4; i++) {
            const qd_gptq_hessian *a = i == 3 ? &acc2 : &acc;   /* the last: another input */
            int64_t n = ns[i % 3];
            float *w = malloc(sizeof(float) * n * k);
            test_fill_normal(&rng, w, n * k, 0.05f);
            qd_gptq_result alone, shared;
            CHECK_OK(qd_gptq_quantize(be, &o, w, n, k, a, &alone, &err));
            CHECK_OK(qd_gptq_quantize_shared(be, &o, w, n, k, a, &sh, &shared, &err));
            CHECK(memcmp(alone.layer.q, shared.layer.q, (size_t)(n * k)) == 0);
            CHECK(memcmp(alone.deq, shared.deq, sizeof(float) * n * k) == 0);
            CHECK(alone.damp == shared.damp && alone.h_err == shared.h_err);
            if (i == 0) fac = sh.fac;
            if (i > 0 && i < 3) CHECK(sh.fac == fac);   /* reused, not remade */
            CHECK(sh.key == a);
            qd_gptq_result_free(&alone);
            qd_gptq_result_free(&shared);
            free(w);
        }
        qd_gptq_shared_free(&sh);
        CHECK(sh.fac == NULL && sh.key == NULL);
    }
    /* More rows folded into the same accumulator: remade. */
    qd_gptq_opts o = qd_gptq_opts_default();
    qd_gptq_shared sh;
    memset(&sh, 0, sizeof sh);
    float *w = malloc(sizeof(float) * 16 * k);
    test_fill_normal(&rng, w, 16 * k, 0.05f);
    qd_gptq_result r;
    CHECK_OK(qd_gptq_quantize_shared(be, &o, w, 16, k, &acc2, &sh, &r, &err));
    qd_gptq_result_free(&r);
    CHECK_OK(qd_gptq_hessian_add(&acc2, x + (t / 2) * k, t / 2, &err));
    CHECK_OK(qd_gptq_quantize_shared(be, &o, w, 16, k, &acc2, &sh, &r, &err));
    CHECK(sh.n_seen == t);
    qd_gptq_result alone;
    CHECK_OK(qd_gptq_quantize(be, &o, w, 16, k, &acc2, &alone, &err));
    CHECK(memcmp(alone.deq, r.deq, sizeof(float) * 16 * k) == 0);
    qd_gptq_result_free(&alone);
    qd_gptq_result_free(&r);
    qd_gptq_shared_free(&sh);
    free(w);
    qd_gptq_hessian_free(&acc);
    qd_gptq_hessian_free(&acc2);
    free(x);
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    TEST_RUN(test_identity_hessian_is_rtn);
    TEST_RUN(test_better_than_rtn);
    TEST_RUN(test_act_order_g_idx);
    TEST_RUN(test_dead_columns);
    TEST_RUN(test_damping_retries_and_fallback);
    TEST_RUN(test_deterministic);
    TEST_RUN(test_hessian_stream);
    TEST_RUN(test_hessian_merge);
    TEST_RUN(test_matches_reference_loop);
    TEST_RUN(test_ldl_matches_inverse_form);
    TEST_RUN(test_shared_factor);
    TEST_RUN(test_bad_input);
    qd_backend_close(be);
    return test_finish();
}
