/* The CPU backend's neural-net ops (cpu_nn.c, through be->ops) against scalar double
 * references written here: rmsnorm, layernorm, rotate-half RoPE with partial rot_dim,
 * causal grouped-query attention over a batch (and with a keep mask), the activations, adds and per-row NLL; the
 * recurrent mixers' causal conv and gated delta rule, and the sigmoid gate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "test_util.h"

static qd_backend *be;
static test_rng rng;

static float *randn(size_t n, float s)
{
    float *p = malloc(n * sizeof *p);
    test_fill_normal(&rng, p, n, s);
    return p;
}

/* RMSNorm gives every row the bits of the serial double sum of squares written here, the
 * one every run has used (a reordered or vectorised sum would move the forward's outputs,
 * the Hessians and the golden files by ulps): 203 rows over both threads' shares, in place
 * and out of place, with and without a weight. */
static void test_rmsnorm_bits(void)
{
    const int R = 203, D = 576;
    const float eps = 1e-6f;
    float *x = randn((size_t)R * D, 3.0f), *w = randn(D, 1.0f);
    float *y = malloc((size_t)R * D * 4), *r = malloc((size_t)R * D * 4), *xi = malloc((size_t)R * D * 4);
    for (int pass = 0; pass < 2; pass++) {
        const float *wp = pass ? NULL : w;
        for (int t = 0; t < R; t++) {
            double ss = 0.0;
            for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
            float inv = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
            for (int i = 0; i < D; i++) r[t * D + i] = (x[t * D + i] * inv) * (wp ? wp[i] : 1.0f);
        }
        CHECK_OK(be->ops->rmsnorm(be, y, x, wp, R, D, eps));
        CHECK(memcmp(y, r, (size_t)R * D * 4) == 0);
        memcpy(xi, x, (size_t)R * D * 4);
        CHECK_OK(be->ops->rmsnorm(be, xi, xi, wp, R, D, eps));
        CHECK(memcmp(xi, r, (size_t)R * D * 4) == 0);
    }
    free(x); free(w); free(y); free(r); free(xi);
}

static void test_norms(void)
{
    int R = 5, D = 37;
    float *x = randn((size_t)R * D, 2.0f), *w = randn(D, 1.0f), *b = randn(D, 1.0f);
    float *y = malloc((size_t)R * D * 4), *r = malloc((size_t)R * D * 4);
    for (int i = 0; i < R * D; i++) x[i] += 3.0f;   /* a mean that layernorm must remove */
    CHECK_OK(be->ops->rmsnorm(be, y, x, w, R, D, 1e-5f));
    for (int t = 0; t < R; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        for (int i = 0; i < D; i++) r[t * D + i] = (float)(x[t * D + i] / sqrt(ss / D + 1e-5) * w[i]);
    }
    CHECK(test_max_abs_diff(y, r, (size_t)R * D) < 1e-5);
    CHECK_OK(be->ops->layernorm(be, y, x, w, b, R, D, 1e-5f));
    for (int t = 0; t < R; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < D; i++) m += x[t * D + i];
        m /= D;
        for (int i = 0; i < D; i++) v += (x[t * D + i] - m) * (x[t * D + i] - m);
        for (int i = 0; i < D; i++) r[t * D + i] = (float)((x[t * D + i] - m) / sqrt(v / D + 1e-5) * w[i] + b[i]);
    }
    CHECK(test_max_abs_diff(y, r, (size_t)R * D) < 1e-5);
    /* In place. */
    CHECK_OK(be->ops->layernorm(be, x, x, w, b, R, D, 1e-5f));
    CHECK(test_max_abs_diff(x, r, (size_t)R * D) < 1e-5);
    free(x); free(w); free(b); free(y); free(r);
}

static void test_rope(void)
{
    int T = 6, NH = 3, HD = 16, ROT = 8;
    float theta = 10000.0f;
    int32_t pos[6] = {0, 1, 5, 100, 511, 2047};
    float *x = randn((size_t)T * NH * HD, 1.0f), *r = malloc((size_t)T * NH * HD * 4);
    memcpy(r, x, (size_t)T * NH * HD * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            float *p = r + (t * NH + h) * HD;
            for (int i = 0; i < ROT / 2; i++) {
                double a = pos[t] * pow(theta, -2.0 * i / ROT);
                double x0 = p[i], x1 = p[i + ROT / 2];
                p[i] = (float)(x0 * cos(a) - x1 * sin(a));
                p[i + ROT / 2] = (float)(x1 * cos(a) + x0 * sin(a));
            }
        }
    qd_rope_freqs f;
    memset(&f, 0, sizeof f);
    f.rot_dim = ROT;
    f.attn_scale = 1.0f;
    for (int i = 0; i < ROT / 2; i++) f.inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)ROT);
    CHECK_OK(be->ops->rope(be, x, T, NH, HD, pos, &f));
    /* The angle is a float32 product (as in transformers): at position 2047 that is within
     * about 1e-4 rad of the exact angle. */
    CHECK(test_max_abs_diff(x, r, (size_t)T * NH * HD) < 5e-4);
    /* Interleaved pairs (x_2i, x_2i+1) turned by the same angles (ERNIE 4.5). */
    float *y = randn((size_t)T * NH * HD, 1.0f);
    memcpy(r, y, (size_t)T * NH * HD * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            float *p = r + (t * NH + h) * HD;
            for (int i = 0; i < ROT / 2; i++) {
                double a = pos[t] * pow(theta, -2.0 * i / ROT);
                double x0 = p[2 * i], x1 = p[2 * i + 1];
                p[2 * i] = (float)(x0 * cos(a) - x1 * sin(a));
                p[2 * i + 1] = (float)(x1 * cos(a) + x0 * sin(a));
            }
        }
    f.interleaved = 1;
    CHECK_OK(be->ops->rope(be, y, T, NH, HD, pos, &f));
    CHECK(test_max_abs_diff(y, r, (size_t)T * NH * HD) < 5e-4);
    f.rot_dim = 7;
    CHECK_ERR(be->ops->rope(be, x, T, NH, HD, pos, &f));
    free(x); free(y); free(r);
}

/* GLM-4's RoPE: the pairs are dims (2i, 2i + 1) of the rotated part (rotate_half on
 * x[..., 0::2], x[..., 1::2] with cos/sin repeat_interleave'd); the dims past rot_dim stay. */
static void test_rope_interleaved(void)
{
    int T = 5, NH = 2, HD = 16, ROT = 8;
    float theta = 10000.0f;
    int32_t pos[5] = {0, 1, 3, 77, 1023};
    float *x = randn((size_t)T * NH * HD, 1.0f), *r = malloc((size_t)T * NH * HD * 4);
    memcpy(r, x, (size_t)T * NH * HD * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            float *p = r + (t * NH + h) * HD;
            for (int i = 0; i < ROT / 2; i++) {
                double a = pos[t] * pow(theta, -2.0 * i / ROT);
                double x0 = p[2 * i], x1 = p[2 * i + 1];
                p[2 * i] = (float)(x0 * cos(a) - x1 * sin(a));
                p[2 * i + 1] = (float)(x1 * cos(a) + x0 * sin(a));
            }
        }
    qd_rope_freqs f;
    memset(&f, 0, sizeof f);
    f.rot_dim = ROT;
    f.interleaved = 1;
    f.attn_scale = 1.0f;
    for (int i = 0; i < ROT / 2; i++) f.inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)ROT);
    CHECK_OK(be->ops->rope(be, x, T, NH, HD, pos, &f));
    CHECK(test_max_abs_diff(x, r, (size_t)T * NH * HD) < 5e-4);
    free(x); free(r);
}

/* S = 300 spans three chunks of query rows (128, 128, 44) in cpu_attention; W > 0 limits
 * each query to the W most recent keys (sliding window). */
/* sinks (attention_sink, gpt-oss): a logit per head in each row's max and denominator. */
static void check_attention_sinks(int S, int W, float cap, const float *sinks)
{
    int B = 2, NH = 6, NKV = 2, HD = 8;
    float sc = 1.0f / sqrtf((float)HD);
    size_t nq = (size_t)B * S * NH * HD, nk = (size_t)B * S * NKV * HD;
    float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
    float *o = malloc(nq * 4), *r = malloc(nq * 4);
    if (sinks) CHECK_OK(be->ops->attention_sink(be, o, q, k, v, B, S, NH, NKV, HD, sc, W, sinks));
    else CHECK_OK(be->ops->attention(be, o, q, k, v, B, S, NH, NKV, HD, sc, W, cap));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int kh = h / (NH / NKV);
            for (int t = 0; t < S; t++) {
                double s[512], mx = -1e30, sum = 0;
                const float *qt = q + ((size_t)(b * S + t) * NH + h) * HD;
                int lo = W > 0 && t + 1 > W ? t + 1 - W : 0;
                for (int j = 0; j < lo; j++) s[j] = 0;
                for (int j = lo; j <= t; j++) {
                    const float *kj = k + ((size_t)(b * S + j) * NKV + kh) * HD;
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += (double)qt[i] * kj[i];
                    s[j] = d * sc;
                    if (cap > 0) s[j] = tanh(s[j] / cap) * cap;
                    if (s[j] > mx) mx = s[j];
                }
                if (sinks && sinks[h] > mx) mx = sinks[h];
                if (sinks) sum += exp(sinks[h] - mx);
                for (int j = lo; j <= t; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int j = lo; j <= t; j++) a += s[j] / sum * v[((size_t)(b * S + j) * NKV + kh) * HD + i];
                    r[((size_t)(b * S + t) * NH + h) * HD + i] = (float)a;
                }
            }
        }
    CHECK(test_max_abs_diff(o, r, nq) < 1e-5);
    if (sinks) CHECK_ERR(be->ops->attention_sink(be, o, q, k, v, B, S, NH, 4, HD, sc, W, sinks));
    else CHECK_ERR(be->ops->attention(be, o, q, k, v, B, S, NH, 4, HD, sc, W, cap));   /* 6 heads, 4 kv */
    free(q); free(k); free(v); free(o); free(r);
}

static void check_attention(int S, int W, float cap) { check_attention_sinks(S, W, cap, NULL); }

static void test_attention(void)
{
    check_attention(1, 0, 0);
    check_attention(33, 0, 0);
    check_attention(300, 0, 0);
    check_attention(33, 8, 0);      /* windows inside one chunk, across chunks, wider than seq */
    check_attention(300, 100, 0);
    check_attention(40, 64, 0);
    check_attention(33, 0, 1.5f);   /* Gemma 2's soft-cap (scores of |s| ~ 3 are capped hard) */
    check_attention(300, 100, 1.5f);
    /* Sinks below, around and above the scores (a sink of 5 takes most of each row). */
    static const float sinks[6] = {-3.0f, 0.0f, 0.5f, 1.0f, 5.0f, -30.0f};
    check_attention_sinks(1, 0, 0, sinks);
    check_attention_sinks(33, 8, 0, sinks);
    check_attention_sinks(300, 100, 0, sinks);
    check_attention_sinks(300, 0, 0, sinks);
}

/* attention_keep (DeepSeek-V3.2's indexer choice): a random keep mask per (sequence, query),
 * each row keeping at least one causal key (not always its own), against the masked softmax
 * in double; keys outside the mask weigh exactly 0. S = 300 spans the chunks. */
static void check_attention_keep(int S)
{
    int B = 2, NH = 4, NKV = 4, HD = 8;
    float sc = 1.0f / sqrtf((float)HD);
    size_t nq = (size_t)B * S * NH * HD;
    float *q = randn(nq, 1.0f), *k = randn(nq, 1.0f), *v = randn(nq, 1.0f);
    float *o = malloc(nq * 4), *r = malloc(nq * 4);
    uint8_t *keep = calloc((size_t)B * S * S, 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            uint8_t *kr = keep + ((size_t)b * S + t) * S;
            for (int j = 0; j <= t; j++) kr[j] = test_rng_uniform(&rng) < 0.3;
            kr[(int)(test_rng_uniform(&rng) * (t + 1)) % (t + 1)] = 1;
            for (int j = t + 1; j < S; j++) kr[j] = 1;   /* past the diagonal: causal anyway */
        }
    CHECK_OK(be->ops->attention_keep(be, o, q, k, v, B, S, NH, NKV, HD, sc, keep));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < S; t++) {
                double s[512], mx = -1e30, sum = 0;
                const uint8_t *kr = keep + ((size_t)b * S + t) * S;
                const float *qt = q + ((size_t)(b * S + t) * NH + h) * HD;
                for (int j = 0; j <= t; j++) {
                    const float *kj = k + ((size_t)(b * S + j) * NKV + h) * HD;
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += (double)qt[i] * kj[i];
                    s[j] = d * sc;
                    if (kr[j] && s[j] > mx) mx = s[j];
                }
                for (int j = 0; j <= t; j++) { s[j] = kr[j] ? exp(s[j] - mx) : 0.0; sum += s[j]; }
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += s[j] / sum * v[((size_t)(b * S + j) * NKV + h) * HD + i];
                    r[((size_t)(b * S + t) * NH + h) * HD + i] = (float)a;
                }
            }
    CHECK(test_max_abs_diff(o, r, nq) < 1e-5);
    /* Every key kept is the plain causal attention. */
    memset(keep, 1, (size_t)B * S * S);
    CHECK_OK(be->ops->attention_keep(be, o, q, k, v, B, S, NH, NKV, HD, sc, keep));
    CHECK_OK(be->ops->attention(be, r, q, k, v, B, S, NH, NKV, HD, sc, 0, 0.0f));
    CHECK(test_max_abs_diff(o, r, nq) < 1e-6);
    CHECK_ERR(be->ops->attention_keep(be, o, q, k, v, B, S, NH, NKV, HD, sc, NULL));
    free(q); free(k); free(v); free(o); free(r); free(keep);
}

/* dsa_scores against its formula in double: the causal keys' weighted relu'd dot products,
 * 0 past the diagonal. */
static void test_dsa_scores(void)
{
    int B = 2, S = 37, NH = 5, HD = 12;
    float qs = 0.3f, ws = 0.45f;
    float *q = randn((size_t)B * S * NH * HD, 1.0f), *k = randn((size_t)B * S * HD, 1.0f);
    float *w = randn((size_t)B * S * NH, 1.0f), *o = malloc((size_t)B * S * S * 4), *r = malloc((size_t)B * S * S * 4);
    CHECK_OK(be->ops->dsa_scores(be, o, q, k, w, B, S, NH, HD, qs, ws));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++)
            for (int j = 0; j < S; j++) {
                double acc = 0;
                for (int h = 0; h < NH && j <= i; h++) {
                    double d = 0;
                    for (int e = 0; e < HD; e++)
                        d += (double)q[((size_t)(b * S + i) * NH + h) * HD + e] * k[(size_t)(b * S + j) * HD + e];
                    d *= qs;
                    acc += (double)w[(size_t)(b * S + i) * NH + h] * ws * (d > 0 ? d : 0);
                }
                r[((size_t)b * S + i) * S + j] = (float)acc;
            }
    CHECK(test_max_abs_diff(o, r, (size_t)B * S * S) < 1e-5);
    CHECK_ERR(be->ops->dsa_scores(be, o, q, k, w, B, S, 0, HD, qs, ws));
    free(q); free(k); free(w); free(o); free(r);
}

static void test_attention_keep(void)
{
    check_attention_keep(1);
    check_attention_keep(33);
    check_attention_keep(300);
}

/* gpt-oss's clamped SwiGLU against its formula in double, across both clamps. */
static void test_swiglu_clamp(void)
{
    int n = 301;
    float *g = randn((size_t)n, 4.0f), *u = randn((size_t)n, 4.0f), *o = malloc((size_t)n * 4);
    float alpha = 1.702f, limit = 3.0f;
    CHECK_OK(be->ops->swiglu_clamp_mul(be, o, g, u, n, alpha, limit));
    int clamped = 0;
    for (int i = 0; i < n; i++) {
        double gg = g[i] > limit ? limit : g[i], uu = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
        clamped += g[i] > limit || fabsf(u[i]) > limit;
        double want = (uu + 1.0) * gg / (1.0 + exp(-alpha * gg));
        CHECK_NEAR(o[i], want, 1e-5 * (1 + fabs(want)));
    }
    CHECK(clamped > 20);
    CHECK_OK(be->ops->swiglu_clamp_mul(be, g, g, u, n, alpha, limit));   /* in place */
    CHECK(test_max_abs_diff(g, o, (size_t)n) == 0);
    free(g); free(u); free(o);
}

static void test_activations(void)
{
    int n = 257;
    float *g = randn(n, 3.0f), *u = randn(n, 1.0f), *y = malloc(n * 4), *x = malloc(n * 4);
    CHECK_OK(be->ops->silu_mul(be, y, g, u, n));
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        if (fabs(y[i] - want) > worst) worst = fabs(y[i] - want);
    }
    CHECK(worst < 1e-5);
    memcpy(x, g, n * 4);
    CHECK_OK(be->ops->relu(be, x, n));
    for (int i = 0; i < n; i++) CHECK_NEAR(x[i], g[i] > 0 ? g[i] : 0.0, 0);
    memcpy(x, g, n * 4);
    CHECK_OK(be->ops->gelu(be, x, n));
    worst = 0;
    for (int i = 0; i < n; i++) {
        double want = 0.5 * g[i] * (1.0 + erf(g[i] / sqrt(2.0)));
        if (fabs(x[i] - want) > worst) worst = fabs(x[i] - want);
    }
    CHECK(worst < 1e-5);
    CHECK_OK(be->ops->gelu_tanh_mul(be, y, g, u, n));
    worst = 0;
    for (int i = 0; i < n; i++) {
        double gi = g[i], want = 0.5 * gi * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (gi + 0.044715 * gi * gi * gi))) * u[i];
        if (fabs(y[i] - want) > worst) worst = fabs(y[i] - want);
    }
    CHECK(worst < 1e-5);
    /* The plain tanh GELU (gelu_new, gelu_pytorch_tanh): the GeGLU above without the up factor. */
    memcpy(x, g, n * 4);
    CHECK_OK(be->ops->gelu_tanh(be, x, n));
    worst = 0;
    for (int i = 0; i < n; i++) {
        double gi = g[i], want = 0.5 * gi * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (gi + 0.044715 * gi * gi * gi)));
        if (fabs(x[i] - want) > worst) worst = fabs(x[i] - want);
    }
    CHECK(worst < 1e-5);
    /* copy_2d: a [3, 4] block between pitched matrices, the rest untouched; a stride
     * narrower than the block is refused. */
    float src[5 * 7], dst[3 * 9];
    for (int i = 0; i < 35; i++) src[i] = (float)i;
    for (int i = 0; i < 27; i++) dst[i] = -1.0f;
    CHECK_OK(be->ops->copy_2d(be, dst + 2, 9, src + 1, 7, 3, 4));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 9; c++) CHECK_NEAR(dst[r * 9 + c], c >= 2 && c < 6 ? src[r * 7 + 1 + c - 2] : -1.0f, 0);
    CHECK_ERR(be->ops->copy_2d(be, dst, 3, src, 7, 3, 4));
    memcpy(x, g, n * 4);
    CHECK_OK(be->ops->softcap(be, x, n, 2.5f));
    worst = 0;
    for (int i = 0; i < n; i++) {
        double want = 2.5 * tanh(g[i] / 2.5);
        if (fabs(x[i] - want) > worst) worst = fabs(x[i] - want);
    }
    CHECK(worst < 1e-6);
    CHECK_ERR(be->ops->softcap(be, x, n, 0.0f));
    memcpy(x, g, n * 4);
    CHECK_OK(be->ops->add(be, x, u, n));
    for (int i = 0; i < n; i++) CHECK_NEAR(x[i], g[i] + u[i], 0);
    float bias[3] = {1, -2, 0.5f}, m[6] = {0, 0, 0, 1, 1, 1};
    CHECK_OK(be->ops->add_bias(be, m, bias, 2, 3));
    CHECK_NEAR(m[1], -2, 0);
    CHECK_NEAR(m[5], 1.5, 0);
    free(g); free(u); free(y); free(x);
}

static void test_nll(void)
{
    int R = 4, V = 1000;
    float *lg = randn((size_t)R * V, 5.0f);
    lg[2 * V + 17] = 80.0f;   /* a dominant logit must not overflow */
    int32_t tg[4] = {0, 999, 17, 500};
    double nll[4];
    CHECK_OK(be->ops->nll_rows(be, lg, tg, R, V, nll));
    for (int r = 0; r < R; r++) {
        double mx = -1e30, s = 0;
        for (int j = 0; j < V; j++) if (lg[r * V + j] > mx) mx = lg[r * V + j];
        for (int j = 0; j < V; j++) s += exp(lg[r * V + j] - mx);
        CHECK_NEAR(nll[r], mx + log(s) - lg[r * V + tg[r]], 1e-9);
    }
    CHECK(nll[2] < 1e-6);
    tg[1] = V;
    CHECK_ERR(be->ops->nll_rows(be, lg, tg, R, V, nll));
    free(lg);
}

/* The recurrent mixers' ops against direct references: the causal depthwise conv as Gated
 * DeltaNet calls it (no gates; bias, SiLU, two sequences that must not leak into each other), the sigmoid gate, and the gated
 * delta rule written as the plain recurrence in double (per value head on key head
 * h / (nv / nk); q, k L2-normalised, q scaled; beta = sigmoid(b), g = -exp(A_log)
 * softplus(a + dt_bias); S = S e^g + k ((v - S^T k) beta)^T; o = S^T q). */
static void test_recurrent(void)
{
    const int64_t B = 2, T = 9, C = 6, K = 4;
    float *x = randn((size_t)(B * T * C), 1.0f), *w = randn((size_t)(C * K), 0.7f), *bias = randn(C, 0.3f);
    float *y = malloc((size_t)(B * T * C) * 4);
    for (int silu = 0; silu < 2; silu++) {
        CHECK_OK(be->ops->conv1d_causal(be, y, x, NULL, NULL, C, B, T, C, w, silu ? NULL : bias, K, silu));
        double worst = 0;
        for (int64_t s = 0; s < B; s++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < C; c++) {
                    double acc = silu ? 0.0 : bias[c];
                    for (int64_t j = 0; j < K; j++)
                        if (t - K + 1 + j >= 0) acc += (double)w[c * K + j] * x[(s * T + t - K + 1 + j) * C + c];
                    if (silu) acc = acc / (1.0 + exp(-acc));
                    double d = fabs(acc - y[(s * T + t) * C + c]);
                    if (d > worst) worst = d;
                }
        CHECK(worst < 1e-6);
    }
    CHECK(be->ops->conv1d_causal(be, x, x, NULL, NULL, C, B, T, C, w, NULL, K, 1) == QD_EINVAL);   /* y aliases x */
    float *g = randn(50, 2.0f), *v = randn(50, 1.0f), *o = malloc(50 * 4);
    CHECK_OK(be->ops->sigmoid_mul(be, o, g, v, 50));
    for (int i = 0; i < 50; i++) CHECK(fabs(o[i] - v[i] / (1.0 + exp(-(double)g[i]))) < 1e-6);
    free(g); free(v); free(o);

    const int64_t nk = 2, nv = 4, dk = 8, dv = 5, ld = 2 * nk * dk + nv * dv + 3, ldba = 2 * nv;
    float *qkv = randn((size_t)(B * T * ld), 1.0f), *ba = randn((size_t)(B * T * ldba), 1.0f);
    float *alog = randn(nv, 0.5f), *dtb = randn(nv, 0.5f), *out = malloc((size_t)(B * T * nv * dv) * 4);
    CHECK_OK(be->ops->gated_delta_rule(be, out, qkv, ld, ba, ba + nv, ldba, alog, dtb, B, T, nk, nv, dk, dv));
    double worst = 0;
    for (int64_t s = 0; s < B; s++)
        for (int64_t h = 0; h < nv; h++) {
            double S[8][5] = {{0}};
            int64_t kh = h / (nv / nk);
            for (int64_t t = 0; t < T; t++) {
                const float *row = qkv + (s * T + t) * ld;
                double q[8], k[8], nq = 0, nkk = 0;
                for (int64_t j = 0; j < dk; j++) {
                    q[j] = row[kh * dk + j];
                    k[j] = row[nk * dk + kh * dk + j];
                    nq += q[j] * q[j];
                    nkk += k[j] * k[j];
                }
                for (int64_t j = 0; j < dk; j++) { q[j] /= sqrt(nq + 1e-6) * sqrt((double)dk); k[j] /= sqrt(nkk + 1e-6); }
                double bt = ba[(s * T + t) * ldba + h], at = ba[(s * T + t) * ldba + nv + h] + (double)dtb[h];
                double beta = 1.0 / (1.0 + exp(-bt)), decay = exp(-exp((double)alog[h]) * log1p(exp(at)));
                for (int64_t e = 0; e < dv; e++) {
                    double kv = 0, acc = 0;
                    for (int64_t j = 0; j < dk; j++) { S[j][e] *= decay; kv += S[j][e] * k[j]; }
                    double delta = (row[2 * nk * dk + h * dv + e] - kv) * beta;
                    for (int64_t j = 0; j < dk; j++) { S[j][e] += k[j] * delta; acc += S[j][e] * q[j]; }
                    double d = fabs(acc - out[(s * T + t) * nv * dv + h * dv + e]);
                    if (d > worst) worst = d;
                }
            }
        }
    CHECK(worst < 1e-5);
    CHECK(be->ops->gated_delta_rule(be, out, qkv, ld, ba, ba + nv, ldba, alog, dtb, B, T, nk, 3, dk, dv) == QD_EINVAL);
    free(x); free(w); free(bias); free(y); free(qkv); free(ba); free(alog); free(dtb); free(out);
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    test_rng_seed(&rng, 42);
    TEST_RUN(test_rmsnorm_bits);
    TEST_RUN(test_norms);
    TEST_RUN(test_rope);
    TEST_RUN(test_rope_interleaved);
    TEST_RUN(test_attention);
    TEST_RUN(test_attention_keep);
    TEST_RUN(test_dsa_scores);
    TEST_RUN(test_activations);
    TEST_RUN(test_swiglu_clamp);
    TEST_RUN(test_nll);
    TEST_RUN(test_recurrent);
    qd_backend_close(be);
    return test_finish();
}
