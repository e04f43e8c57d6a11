/* AWQ search on the CPU backend: on a layer whose input has a few salient channels, AWQ's
 * output error is below RTN's at 3 and 4 bits (checked with an independent double-precision
 * evaluation); alpha 0 is RTN exactly (s = 1, same effective weights); clipping never
 * increases the calibration error; a q/k/v-style multi-layer search scores the sum of the
 * single-layer losses; tied channels (GQA's o_proj) get one scale; a caller-supplied loss
 * sees the candidates and its errors propagate; the Gram form of the output errors (X^T X,
 * or the caller's Hessian) agrees with the direct products. */
#include <stdlib.h>

#include "quant/algo/awq.h"
#include "quant/backend/backend.h"
#include "test_util.h"

enum { K = 128, N = 64, ROWS = 384 };

static float *g_x, *g_w;                 /* host copies (CPU backend memory is host memory) */

static void make_data(uint64_t seed)
{
    test_rng r;
    test_rng_seed(&r, seed);
    g_x = malloc(sizeof(float) * ROWS * K);
    g_w = malloc(sizeof(float) * N * K);
    test_fill_normal(&r, g_x, ROWS * K, 1.0f);
    test_fill_normal(&r, g_w, N * K, 0.05f);
    int salient[4] = {5, 40, 77, 100};
    for (int t = 0; t < ROWS; t++)
        for (int j = 0; j < 4; j++) g_x[t * K + salient[j]] *= 25.0f;
}

/* Independent evaluation: ||X we^T - X W^T||^2 in double. */
static double out_err(const float *we)
{
    double e = 0;
    for (int t = 0; t < ROWS; t++)
        for (int n = 0; n < N; n++) {
            double a = 0, b = 0;
            for (int c = 0; c < K; c++) {
                a += (double)g_x[t * K + c] * we[n * K + c];
                b += (double)g_x[t * K + c] * g_w[n * K + c];
            }
            e += (a - b) * (a - b);
        }
    return e;
}

static double rtn_err(const qd_quant_cfg *c)
{
    float *d = malloc(sizeof(float) * N * K);
    memcpy(d, g_w, sizeof(float) * N * K);
    CHECK_OK(qd_quant_fake_ref(c, d, N, K));
    double e = out_err(d);
    free(d);
    return e;
}

/* The final AWQ weight in the original space: Q(clamp(W s)) / s. */
static double awq_err(const qd_quant_cfg *c, const float *s, const qd_awq_clip *clip)
{
    float *d = malloc(sizeof(float) * N * K);
    memcpy(d, g_w, sizeof(float) * N * K);
    CHECK_OK(qd_awq_apply(s, clip, d, N, K, NULL));
    CHECK_OK(qd_quant_fake_ref(c, d, N, K));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) d[n * K + k] /= s[k];
    double e = out_err(d);
    free(d);
    return e;
}

static qd_backend *g_be;

static void test_awq_beats_rtn(void)
{
    for (int bits = 3; bits <= 4; bits++)
        for (int sym = 0; sym <= 1; sym++) {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.bits = bits;
            c.sym = sym;
            c.group_size = 32;
            qd_awq_opts o = qd_awq_opts_default();
            qd_awq_result res;
            qd_err e = {0};
            int rc = qd_awq_linear(g_be, &c, &o, g_w, N, K, g_x, ROWS, K, &res, &e);
            CHECK_OK(rc);
            if (rc) { fprintf(stderr, "%s\n", e.msg); continue; }
            double ref = out_err((float[N * K]){0});          /* ||X W^T||^2 */
            double r_rtn = rtn_err(&c), r_awq = awq_err(&c, res.scales.s, &res.clip);
            double r_scale_only = awq_err(&c, res.scales.s, NULL);
            printf("bits %d sym %d: alpha %.2f rel err rtn %.5f awq-scale %.5f awq+clip %.5f (reverted rows %lld)\n",
                   bits, sym, res.scales.best_alpha, r_rtn / ref, r_scale_only / ref, r_awq / ref,
                   (long long)res.clip.rows_reverted);
            CHECK(res.scales.best_alpha > 0.0f);
            CHECK(r_awq < 0.8 * r_rtn);                  /* salient channels: a clear win */
            CHECK(r_awq <= r_scale_only * (1 + 1e-6));
            /* The library's own numbers agree with the independent evaluation. */
            CHECK_NEAR(res.ref_norm2 / ref, 1.0, 1e-5);
            CHECK_NEAR(res.scales.rtn_loss / r_rtn, 1.0, 1e-4);
            CHECK_NEAR(res.scales.best_loss / r_scale_only, 1.0, 1e-4);
            CHECK_NEAR(res.clip.loss_noclip / r_scale_only, 1.0, 1e-4);
            CHECK_NEAR(res.clip.loss_clip / r_awq, 1.0, 1e-4);
            for (int a = 0; a < res.scales.n_grid; a++) CHECK(res.scales.best_loss <= res.scales.loss[a]);
            /* s is normalised: max * min == 1 */
            float mx = 0, mn = 1e30f;
            for (int k = 0; k < K; k++) {
                mx = res.scales.s[k] > mx ? res.scales.s[k] : mx;
                mn = res.scales.s[k] < mn ? res.scales.s[k] : mn;
            }
            CHECK_NEAR((double)mx * mn, 1.0, 1e-5);
            CHECK(res.scales.s[5] > 1.0f && res.scales.s[6] < res.scales.s[5]);
            qd_awq_result_free(&res);
        }
}

typedef struct capture { const float *ref_w; float *seen; int calls; int fail_at; const float *rtn_w; } capture;

static int capture_loss(void *user, qd_backend *be, const float *const *wq, int n_layers,
                        double *loss, qd_err *err)
{
    capture *c = user;
    if (c->calls == c->fail_at) { c->calls++; return qd_err_set(err, QD_EBACKEND, "module forward failed"); }
    if (c->calls == 0) memcpy(c->seen, wq[0], sizeof(float) * N * K);
    c->calls++;
    CHECK_INT(n_layers, 1);
    if (c->rtn_w) {               /* a loss only the RTN weights minimise: their distance */
        double d = 0;
        for (int i = 0; i < N * K; i++) d += ((double)wq[0][i] - c->rtn_w[i]) * ((double)wq[0][i] - c->rtn_w[i]);
        *loss = d;
        return 0;
    }
    /* A module-level objective stand-in: output error on the first 8 outputs only. */
    double e = 0;
    for (int t = 0; t < ROWS; t++)
        for (int n = 0; n < 8; n++) {
            double a = 0, b = 0;
            for (int k = 0; k < K; k++) {
                a += (double)g_x[t * K + k] * wq[0][n * K + k];
                b += (double)g_x[t * K + k] * c->ref_w[n * K + k];
            }
            e += (a - b) * (a - b);
        }
    *loss = e;
    return 0;
}

static void test_alpha0_is_rtn(void)
{
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = 4;
    c.sym = 0;
    c.group_size = 32;
    qd_awq_opts o = qd_awq_opts_default();
    o.n_grid = 1;                                 /* only alpha = 0 */
    o.clip = 0;
    qd_awq_result res;
    qd_err e = {0};
    CHECK_OK(qd_awq_linear(g_be, &c, &o, g_w, N, K, g_x, ROWS, K, &res, &e));
    CHECK_NEAR(res.scales.best_alpha, 0.0, 0);
    int ones = 0;
    for (int k = 0; k < K; k++) ones += res.scales.s[k] == 1.0f;
    CHECK_INT(ones, K);
    CHECK(res.clip.max == NULL);
    /* RTN's loss via the library path, equal to the search's alpha-0 loss */
    float *d = malloc(sizeof(float) * N * K);
    memcpy(d, g_w, sizeof(float) * N * K);
    CHECK_OK(qd_quant_fake_ref(&c, d, N, K));
    double l_rtn;
    CHECK_OK(qd_awq_output_sq_err(g_be, g_x, ROWS, K, K, d, g_w, N, 2048, &l_rtn, &e));
    CHECK_NEAR(res.scales.loss[0] / l_rtn, 1.0, 1e-6);
    qd_awq_result_free(&res);

    /* The candidate weights at alpha 0 are the RTN weights bit for bit (callback API). */
    float x_mean[K];
    CHECK_OK(qd_awq_x_mean(g_be, g_x, ROWS, K, K, x_mean, &e));
    double xm5 = 0;
    for (int t = 0; t < ROWS; t++) xm5 += fabs(g_x[t * K + 5]);
    CHECK_NEAR(x_mean[5], xm5 / ROWS, 1e-4);
    capture cap = {.ref_w = g_w, .seen = malloc(sizeof(float) * N * K), .fail_at = -1};
    const float *ws[1] = {g_w};
    int64_t ns[1] = {N};
    qd_awq_scales sc;
    o = qd_awq_opts_default();
    CHECK_OK(qd_awq_search_scales_cb(g_be, &c, &o, ws, ns, 1, K, x_mean, capture_loss, &cap, &sc, &e));
    CHECK_INT(cap.calls, 20);
    CHECK(memcmp(cap.seen, d, sizeof(float) * N * K) == 0);
    CHECK_INT(sc.n_grid, 20);
    for (int a = 0; a < 20; a++) CHECK(sc.best_loss <= sc.loss[a]);
    qd_awq_scales_free(&sc);
    /* A failing loss stops the search with its code and a message naming the alpha. */
    cap.calls = 0;
    cap.fail_at = 3;
    CHECK_INT(qd_awq_search_scales_cb(g_be, &c, &o, ws, ns, 1, K, x_mean, capture_loss, &cap, &sc, &e),
              QD_EBACKEND);
    CHECK_CONTAINS(e.msg, "alpha 0.15");
    CHECK_CONTAINS(e.msg, "module forward failed");
    CHECK(sc.s == NULL);
    qd_awq_scales_free(&sc);
    /* With duo scaling alpha 0 is not s = 1, so s = 1 is scored first (21 calls); a loss
     * that only RTN's weights minimise makes it the choice: nothing to fold. */
    o.duo_scaling = 1;
    qd_awq_scales duo;
    cap = (capture){.ref_w = g_w, .seen = cap.seen, .fail_at = -1, .rtn_w = d};
    CHECK_OK(qd_awq_search_scales_cb(g_be, &c, &o, ws, ns, 1, K, x_mean, capture_loss, &cap, &duo, &e));
    CHECK_INT(cap.calls, 21);
    CHECK(duo.identity);
    for (int k = 0; k < K; k++) if (duo.s[k] != 1.0f) { CHECK(duo.s[k] == 1.0f); break; }
    CHECK_NEAR(duo.best_loss, 0.0, 0);
    CHECK_NEAR(duo.rtn_loss, 0.0, 0);
    qd_awq_scales_free(&duo);
    free(cap.seen);
    free(d);
}

static void test_clip_never_worse(void)
{
    int clipped_somewhere = 0;
    for (int bits = 2; bits <= 4; bits++)
        for (int sym = 0; sym <= 1; sym++) {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.bits = bits;
            c.sym = sym;
            c.group_size = bits == 2 ? 64 : 32;
            qd_awq_opts o = qd_awq_opts_default();
            o.clip_n_tokens = 100;                   /* subsample: every 3rd row */
            o.chunk_rows = 100;                      /* several chunks incl. a partial one */
            float ones[K];
            for (int k = 0; k < K; k++) ones[k] = 1.0f;
            for (int use_s = 0; use_s <= 1; use_s++) {
                qd_awq_scales sc = {0};
                const float *s = ones;
                qd_err e = {0};
                if (use_s) {
                    const float *ws[1] = {g_w};
                    int64_t ns[1] = {N};
                    CHECK_OK(qd_awq_search_scales(g_be, &c, &o, ws, ns, 1, K, g_x, ROWS, K, &sc, &e));
                    s = sc.s;
                }
                qd_awq_clip cl;
                CHECK_OK(qd_awq_search_clip(g_be, &c, &o, g_w, N, K, g_x, ROWS, K, use_s ? s : NULL, &cl, &e));
                CHECK(cl.loss_clip <= cl.loss_noclip);
                double with = awq_err(&c, s, &cl), without = awq_err(&c, s, NULL);
                CHECK(with <= without * (1 + 1e-6));
                CHECK_NEAR(cl.loss_clip / with, 1.0, 1e-4);
                int64_t shrunk = 0;
                for (int64_t i = 0; i < cl.n * cl.n_groups; i++) {
                    float orig = 0;
                    int64_t r = i / cl.n_groups, g = i % cl.n_groups;
                    for (int64_t k = g * cl.group_len; k < (g + 1) * cl.group_len; k++)
                        orig = fabsf(g_w[r * K + k] * s[k]) > orig ? fabsf(g_w[r * K + k] * s[k]) : orig;
                    CHECK(cl.max[i] <= orig && cl.max[i] >= 0.5f * orig * 0.999f);
                    shrunk += cl.max[i] < orig;
                }
                if (shrunk && with < without) clipped_somewhere = 1;
                qd_awq_clip_free(&cl);
                qd_awq_scales_free(&sc);
            }
        }
    CHECK(clipped_somewhere);
}

static void test_multi_layer(void)
{
    /* q/k/v: three weights sharing X; the joint loss is the sum of the single losses. */
    test_rng r;
    test_rng_seed(&r, 99);
    float *w2 = malloc(sizeof(float) * 32 * K), *w3 = malloc(sizeof(float) * 96 * K);
    test_fill_normal(&r, w2, 32 * K, 0.08f);
    test_fill_normal(&r, w3, 96 * K, 0.02f);
    const float *ws[3] = {g_w, w2, w3};
    int64_t ns[3] = {N, 32, 96};
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = 3;
    c.group_size = 64;
    qd_awq_opts o = qd_awq_opts_default();
    o.gram = 0;                                       /* the direct products (test_gram: X^T X) */
    o.ref_cache_bytes = 0;                            /* the recompute path */
    qd_awq_scales joint, single[3];
    qd_err e = {0};
    CHECK_OK(qd_awq_search_scales(g_be, &c, &o, ws, ns, 3, K, g_x, ROWS, K, &joint, &e));
    o.ref_cache_bytes = (int64_t)64 << 20;            /* the cached path */
    for (int i = 0; i < 3; i++)
        CHECK_OK(qd_awq_search_scales(g_be, &c, &o, ws + i, ns + i, 1, K, g_x, ROWS, K, &single[i], &e));
    for (int a = 0; a < 20; a++) {
        double sum = single[0].loss[a] + single[1].loss[a] + single[2].loss[a];
        CHECK_NEAR(joint.loss[a] / sum, 1.0, 1e-6);
    }
    for (int a = 0; a < 20; a++) CHECK(joint.best_loss <= joint.loss[a]);
    CHECK(joint.best_loss < joint.rtn_loss);
    const double joint_rtn = joint.rtn_loss;
    qd_awq_scales_free(&joint);
    for (int i = 0; i < 3; i++) qd_awq_scales_free(&single[i]);

    /* duo scaling runs and still never beats itself at its best alpha */
    o.duo_scaling = 1;
    qd_awq_scales duo;
    CHECK_OK(qd_awq_search_scales(g_be, &c, &o, ws, ns, 3, K, g_x, ROWS, K, &duo, &e));
    for (int a = 0; a < 20; a++) CHECK(duo.best_loss <= duo.loss[a] && isfinite(duo.loss[a]));
    /* With duo scaling alpha 0 is not s = 1, so RTN (s = 1) is scored on its own: it is the
     * joint search's RTN loss, and the chosen scales are never worse than it. */
    CHECK_NEAR(duo.rtn_loss / joint_rtn, 1.0, 1e-6);
    CHECK(duo.best_loss <= duo.rtn_loss);
    if (duo.identity) {
        int ones = 0;
        for (int k = 0; k < K; k++) ones += duo.s[k] == 1.0f;
        CHECK_INT(ones, K);
    }
    qd_awq_scales_free(&duo);
    free(w2);
    free(w3);
}

/* Channel c and c + K/2 share a class (as two heads reading one KV head): one scale each
 * class, for both the paper's and the duo candidates; a class outside 0..K-1 is refused. */
static void test_tie(void)
{
    int32_t tie[K];
    for (int c = 0; c < K; c++) tie[c] = c % (K / 2);
    qd_quant_cfg c = qd_quant_cfg_default();
    c.bits = 3;
    c.group_size = 64;
    const float *ws[1] = {g_w};
    int64_t ns[1] = {N};
    qd_err e = {0};
    for (int duo = 0; duo < 2; duo++) {
        qd_awq_opts o = qd_awq_opts_default();
        o.duo_scaling = duo;
        o.tie = tie;
        qd_awq_scales sc;
        CHECK_OK(qd_awq_search_scales(g_be, &c, &o, ws, ns, 1, K, g_x, ROWS, K, &sc, &e));
        int same = 0, spread = 0;
        for (int k = 0; k < K / 2; k++) same += sc.s[k] == sc.s[k + K / 2];
        for (int k = 1; k < K / 2; k++) spread += sc.s[k] != sc.s[0];
        CHECK_INT(same, K / 2);
        CHECK(sc.identity || spread > 0);             /* tied, not collapsed to one value */
        CHECK(sc.best_loss <= sc.rtn_loss);
        qd_awq_scales_free(&sc);
    }
    qd_awq_opts o = qd_awq_opts_default();
    tie[3] = K;
    o.tie = tie;
    qd_awq_scales sc;
    CHECK_INT(qd_awq_search_scales(g_be, &c, &o, ws, ns, 1, K, g_x, ROWS, K, &sc, &e), QD_EINVAL);
    CHECK_CONTAINS(e.msg, "tie class");
}

/* The Gram form (X^T X, the default when rows > k) and the direct products give the same
 * losses up to rounding, hence the same choices; the clip search takes the caller's Hessian
 * (as the pipeline passes its GPTQ accumulator) and refuses one of other rows. */
static void test_gram(void)
{
    const float *ws[1] = {g_w};
    int64_t ns[1] = {N};
    qd_err e = {0};
    for (int bits = 3; bits <= 4; bits++)
        for (int duo = 0; duo <= 1; duo++) {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.bits = bits;
            c.sym = 0;
            c.group_size = 32;
            qd_awq_opts og = qd_awq_opts_default(), od = og;
            og.duo_scaling = od.duo_scaling = duo;
            od.gram = 0;
            qd_awq_scales sg, sd;
            CHECK_OK(qd_awq_search_scales(g_be, &c, &og, ws, ns, 1, K, g_x, ROWS, K, &sg, &e));
            CHECK_OK(qd_awq_search_scales(g_be, &c, &od, ws, ns, 1, K, g_x, ROWS, K, &sd, &e));
            for (int a = 0; a < 20; a++) CHECK_NEAR(sg.loss[a] / sd.loss[a], 1.0, 1e-5);
            CHECK_NEAR(sg.rtn_loss / sd.rtn_loss, 1.0, 1e-5);
            CHECK_NEAR((double)sg.best_alpha, (double)sd.best_alpha, 1e-9);
            CHECK_INT(sg.identity, sd.identity);

            qd_gptq_hessian h;
            CHECK_OK(qd_gptq_hessian_init(&h, g_be, K, &e));
            CHECK_OK(qd_gptq_hessian_add_dev(&h, g_x, ROWS / 2, K, &e));      /* two batches, */
            CHECK_OK(qd_gptq_hessian_add_dev(&h, g_x + ROWS / 2 * K, ROWS - ROWS / 2, K, &e));   /* as captured */
            qd_awq_clip cg, cd, ch;
            CHECK_OK(qd_awq_search_clip(g_be, &c, &og, g_w, N, K, g_x, ROWS, K, sg.s, &cg, &e));
            CHECK_OK(qd_awq_search_clip(g_be, &c, &od, g_w, N, K, g_x, ROWS, K, sg.s, &cd, &e));
            CHECK_OK(qd_awq_search_clip_h(g_be, &c, &od, g_w, N, K, g_x, ROWS, K, &h, sg.s, &ch, &e));
            CHECK_NEAR(cg.loss_noclip / cd.loss_noclip, 1.0, 1e-5);
            CHECK_NEAR(cg.loss_clip / cd.loss_clip, 1.0, 1e-5);
            CHECK_NEAR(ch.loss_clip / cd.loss_clip, 1.0, 1e-5);
            CHECK_INT(cg.rows_reverted, cd.rows_reverted);
            CHECK_INT(ch.rows_reverted, cd.rows_reverted);
            int same = 0;
            for (int64_t i = 0; i < cd.n * cd.n_groups; i++) same += cg.max[i] == cd.max[i] && ch.max[i] == cd.max[i];
            CHECK_INT(same, cd.n * cd.n_groups);
            qd_awq_clip_free(&cg);
            qd_awq_clip_free(&cd);
            qd_awq_clip_free(&ch);
            /* A Hessian of other rows than x's is refused, naming both. */
            CHECK_INT(qd_awq_search_clip_h(g_be, &c, &og, g_w, N, K, g_x, ROWS - 1, K, &h, sg.s, &ch, &e), QD_EINVAL);
            CHECK_CONTAINS(e.msg, "Hessian");
            qd_gptq_hessian_free(&h);
            qd_awq_scales_free(&sg);
            qd_awq_scales_free(&sd);
        }
}

static void test_refusals(void)
{
    qd_quant_cfg c = qd_quant_cfg_default();
    qd_awq_opts o = qd_awq_opts_default();
    qd_awq_result res;
    qd_err e = {0};
    o.n_grid = 0;
    CHECK_INT(qd_awq_linear(g_be, &c, &o, g_w, N, K, g_x, ROWS, K, &res, &e), QD_EINVAL);
    CHECK_CONTAINS(e.msg, "n_grid");
    o = qd_awq_opts_default();
    c.bits = 5;
    CHECK_INT(qd_awq_linear(g_be, &c, &o, g_w, N, K, g_x, ROWS, K, &res, &e), QD_EINVAL);
    CHECK_CONTAINS(e.msg, "bits");
    c = qd_quant_cfg_default();
    CHECK_INT(qd_awq_linear(g_be, &c, &o, g_w, N, K, g_x, ROWS, K - 1, &res, &e), QD_EINVAL);
    qd_awq_clip cl = {.n = 3, .k = 4, .group_len = 4, .n_groups = 1, .max = (float[3]){1, 1, 1}};
    CHECK_INT(qd_awq_apply(NULL, &cl, g_w, N, K, &e), QD_ESHAPE);
    qd_awq_result_free(NULL);
    qd_awq_clip_free(NULL);
    qd_awq_scales_free(NULL);
}

int main(void)
{
    qd_err e = {0};
    if (qd_backend_cpu_open(1, NULL, &g_be, &e)) {
        fprintf(stderr, "cpu backend: %s\n", e.msg);
        return 1;
    }
    make_data(1234);
    TEST_RUN(test_awq_beats_rtn);
    TEST_RUN(test_alpha0_is_rtn);
    TEST_RUN(test_tie);
    TEST_RUN(test_clip_never_worse);
    TEST_RUN(test_multi_layer);
    TEST_RUN(test_gram);
    TEST_RUN(test_refusals);
    qd_backend_close(g_be);
    free(g_x);
    free(g_w);
    return test_finish();
}
