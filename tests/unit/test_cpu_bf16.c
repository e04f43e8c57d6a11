/* bfloat16-input products (cpu_bf16.h) against the scalar reference: inputs rounded to
 * bf16 (nearest even, subnormals to zero), products summed in double here. Both paths (the
 * AMX tiles where this CPU and kernel allow them, the portable one always) must
 *   - give the reference's exact bits where every partial sum is exact in F32 (small
 *     integers), and show that inputs are rounded (1 + 2^-10 counts as 1);
 *   - stay within F32 summation error of it on random data, every edge shape included
 *     (m, n, k not multiples of the 16 x 16 x 32 tiles);
 *   - for the tile unit, give the same bits for 1, 2 and 3 threads;
 * and the backend's attention_bf16 (Q K^T and P V on rounded inputs, F32 softmax): tiles
 * and portable path agree, both near a double reference that rounds its inputs the same
 * way, and both differ from the F32 attention by bf16's rounding. */
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/backend/cpu/cpu_bf16.h"
#include "quant/core/runtime.h"
#include "test_util.h"

static test_rng rng;

static float *randn(int64_t n, float s)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    test_fill_normal(&rng, p, (size_t)n, s);
    return p;
}

/* ref[i][j] = sum_t r(a[i][t]) r(b[j][t]) in double; bound[i][j] = sum_t |.| for the tolerance. */
static void ref_gemm_nt(int64_t m, int64_t n, int64_t k, const float *a, const float *b, double *ref, double *bound)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, sa = 0;
            for (int64_t t = 0; t < k; t++) {
                double p = (double)cpu_bf16_round(a[i * k + t]) * (double)cpu_bf16_round(b[j * k + t]);
                s += p;
                sa += p < 0 ? -p : p;
            }
            ref[i * n + j] = s;
            bound[i * n + j] = sa;
        }
}

static int paths(int *list)
{
    int n = 0;
    list[n++] = 0;
    if (cpu_bf16_amx_usable()) list[n++] = 1;
    return n;
}

static void test_round(void)
{
    CHECK(cpu_bf16_round(1.0f + 0x1p-10f) == 1.0f);
    CHECK(cpu_bf16_round(1.0f + 0x1p-8f) == 1.0f);                /* tie, to even */
    CHECK(cpu_bf16_round(1.0f + 0x1p-8f + 0x1p-9f) == 1.0f + 0x1p-7f); /* above the tie: up */
    CHECK(cpu_bf16_round(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f); /* tie from odd, to even */
    CHECK(cpu_bf16_round(-3.0f) == -3.0f);
    CHECK(cpu_bf16_round(1e-40f) == 0.0f);                         /* subnormal */
    CHECK(signbit(cpu_bf16_round(-1e-40f)));
    CHECK(cpu_bf16_round(0x1p-126f) == 0x1p-126f);                 /* smallest normal stays */
}

static void test_gemm_exact(void)
{
    const int64_t m = 45, n = 37, k = 70;
    float *a = malloc(m * k * 4), *b = malloc(n * k * 4), *c = malloc(m * n * 4);
    double *ref = malloc(m * n * 8), *bound = malloc(m * n * 8);
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)((int)(test_rng_u64(&rng) % 17) - 8);
    for (int64_t i = 0; i < n * k; i++) b[i] = (float)((int)(test_rng_u64(&rng) % 17) - 8);
    ref_gemm_nt(m, n, k, a, b, ref, bound);
    int list[2], np = paths(list);
    for (int p = 0; p < np; p++) {
        CHECK_OK(cpu_bf16_gemm_nt(list[p], 2, m, n, k, a, k, b, k, c, n));
        int bad = 0;
        for (int64_t i = 0; i < m * n; i++) bad += c[i] != (float)ref[i];
        CHECK_INT(bad, 0);
        /* inputs are rounded: a = 1 + 2^-10, b = 1 sums to k exactly */
        for (int64_t i = 0; i < m * k; i++) a[i] = 1.0f + 0x1p-10f;
        for (int64_t i = 0; i < n * k; i++) b[i] = 1.0f;
        CHECK_OK(cpu_bf16_gemm_nt(list[p], 1, m, n, k, a, k, b, k, c, n));
        CHECK(c[0] == (float)k && c[m * n - 1] == (float)k);
        for (int64_t i = 0; i < m * k; i++) a[i] = (float)((int)(test_rng_u64(&rng) % 17) - 8);
        for (int64_t i = 0; i < n * k; i++) b[i] = (float)((int)(test_rng_u64(&rng) % 17) - 8);
        ref_gemm_nt(m, n, k, a, b, ref, bound);
    }
    free(a), free(b), free(c), free(ref), free(bound);
}

static void test_gemm_shapes(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 17, 33}, {16, 16, 32}, {32, 32, 64}, {33, 47, 31},
                                        {100, 65, 577}, {300, 96, 40}, {513, 33, 1100}};
    int list[2], np = paths(list);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        /* strided operands: lda, ldb, ldc wider than the rows */
        int64_t lda = k + 3, ldb = k + 5, ldc = n + 7;
        float *a = randn(m * lda, 1.0f), *b = randn(n * ldb, 0.3f);
        float *ap = malloc(m * k * 4), *bp = malloc(n * k * 4);
        for (int64_t i = 0; i < m; i++) memcpy(ap + i * k, a + i * lda, k * 4);
        for (int64_t i = 0; i < n; i++) memcpy(bp + i * k, b + i * ldb, k * 4);
        double *ref = malloc(m * n * 8), *bound = malloc(m * n * 8);
        ref_gemm_nt(m, n, k, ap, bp, ref, bound);
        float *c = malloc(m * ldc * 4), *c1 = malloc(m * ldc * 4);
        for (int p = 0; p < np; p++) {
            for (int64_t i = 0; i < m * ldc; i++) c[i] = -77.0f;
            CHECK_OK(cpu_bf16_gemm_nt(list[p], 2, m, n, k, a, lda, b, ldb, c, ldc));
            int bad = 0, pad = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < ldc; j++) {
                    if (j >= n) { pad += c[i * ldc + j] != -77.0f; continue; }
                    double tol = 2.0 * (double)(k + 2) * 0x1p-24 * bound[i * n + j] + 1e-30;
                    if (!(fabs((double)c[i * ldc + j] - ref[i * n + j]) <= tol)) bad++;
                }
            CHECK_INT(bad, 0);
            CHECK_INT(pad, 0);   /* nothing written past n */
            if (list[p] == 1)
                for (int t = 1; t <= 3; t += 2) {
                    CHECK_OK(cpu_bf16_gemm_nt(1, t, m, n, k, a, lda, b, ldb, c1, ldc));
                    int diff = 0;
                    for (int64_t i = 0; i < m; i++) diff += memcmp(c + i * ldc, c1 + i * ldc, n * 4) != 0;
                    CHECK_INT(diff, 0);
                }
        }
        free(a), free(b), free(ap), free(bp), free(ref), free(bound), free(c), free(c1);
    }
}

static void test_syrk(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {5, 3}, {64, 32}, {100, 33}, {2500, 70}, {300, 129}};
    int list[2], np = paths(list);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t rows = shapes[s][0], k = shapes[s][1], ldx = k + 2;
        float *x = randn(rows * ldx, 1.0f), *xt = malloc(k * rows * 4);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < k; i++) xt[i * rows + r] = x[r * ldx + i];
        double *ref = malloc(k * k * 8), *bound = malloc(k * k * 8);
        ref_gemm_nt(k, k, rows, xt, xt, ref, bound);
        float *h0 = randn(k * k, 1.0f), *h = malloc(k * k * 4), *h1 = malloc(k * k * 4);
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < i; j++) h0[i * k + j] = h0[j * k + i];
        const float alpha = 0.25f, beta = 0.5f;
        for (int p = 0; p < np; p++)
            for (int first = 0; first <= 1; first++) {
                float be = first ? 0.0f : beta;
                memcpy(h, h0, k * k * 4);
                if (first) h[0] = NAN;   /* beta 0 overwrites whatever H held */
                CHECK_OK(cpu_bf16_syrk(list[p], 2, k, x, rows, ldx, alpha, be, h));
                int bad = 0, asym = 0;
                for (int64_t i = 0; i < k; i++)
                    for (int64_t j = 0; j < k; j++) {
                        double want = (double)be * h0[i * k + j] + alpha * ref[i * k + j];
                        double tol = 4.0 * (double)(rows + 4) * 0x1p-24 * (alpha * bound[i * k + j] + fabs(be * h0[i * k + j])) + 1e-30;
                        if (!(fabs((double)h[i * k + j] - want) <= tol)) bad++;
                        asym += h[i * k + j] != h[j * k + i];
                    }
                CHECK_INT(bad, 0);
                CHECK_INT(asym, 0);
                if (list[p] == 1) {
                    memcpy(h1, h0, k * k * 4);
                    if (first) h1[0] = NAN;
                    CHECK_OK(cpu_bf16_syrk(1, 3, k, x, rows, ldx, alpha, be, h1));
                    CHECK(memcmp(h, h1, k * k * 4) == 0);
                }
            }
        free(x), free(xt), free(ref), free(bound), free(h0), free(h), free(h1);
    }
}

/* Causal attention in double over bf16-rounded q, k, v and probabilities; window > 0: query
 * i sees keys i - window < j <= i; softcap > 0: scores capped as softcap * tanh(s / softcap). */
static void ref_attention(double *out, const float *q, const float *k, const float *v, int64_t seq, int64_t nh,
                          int64_t nkv, int64_t hd, double scale, int64_t window, double softcap)
{
    double *p = malloc((size_t)seq * sizeof *p);
    for (int64_t h = 0; h < nh; h++) {
        int64_t kh = h / (nh / nkv);
        for (int64_t i = 0; i < seq; i++) {
            double mx = -1e300, sum = 0;
            int64_t j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
            for (int64_t j = j0; j <= i; j++) {
                double d = 0;
                for (int64_t e = 0; e < hd; e++)
                    d += (double)cpu_bf16_round(q[i * nh * hd + h * hd + e]) * cpu_bf16_round(k[j * nkv * hd + kh * hd + e]);
                p[j] = softcap > 0 ? softcap * tanh(d * scale / softcap) : d * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int64_t j = j0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t e = 0; e < hd; e++) {
                double o = 0;
                for (int64_t j = j0; j <= i; j++)
                    o += (double)cpu_bf16_round((float)(p[j] / sum)) * cpu_bf16_round(v[j * nkv * hd + kh * hd + e]);
                out[i * nh * hd + h * hd + e] = o;
            }
        }
    }
    free(p);
}

static double rel_to(const float *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* window and softcap as Gemma 2's sliding layers and score cap (0: none). */
static void attention_case(int64_t window, float softcap)
{
    const int64_t seq = 200, nh = 4, nkv = 2, hd = 48;   /* two query chunks; hd not a tile multiple */
    /* Wide q/k with the cap, so tanh bends the scores (|s| up to several times softcap). */
    float sq = softcap > 0 ? 3.0f : 1.0f;
    float *q = randn(seq * nh * hd, sq), *k = randn(seq * nkv * hd, sq), *v = randn(seq * nkv * hd, 1.0f);
    float *o[3];
    double *ref = malloc((size_t)(seq * nh * hd) * sizeof *ref);
    ref_attention(ref, q, k, v, seq, nh, nkv, hd, 0.2, window, softcap);
    qd_runtime_opts rt = qd_runtime_opts_default();
    for (int i = 0; i < 3; i++) {
        rt.cpu_kernel = i == 1 ? QD_CPU_KERNEL_PORTABLE : QD_CPU_KERNEL_AUTO;
        qd_backend *be = NULL;
        qd_err err = {0};
        CHECK_OK(qd_backend_cpu_open(2, &rt, &be, &err));
        o[i] = malloc((size_t)(seq * nh * hd) * sizeof(float));
        if (!be) continue;
        CHECK(be->ops->attention_bf16 != NULL);
        if (i < 2) CHECK_OK(be->ops->attention_bf16(be, o[i], q, k, v, 1, seq, nh, nkv, hd, 0.2f, window, softcap));
        else CHECK_OK(be->ops->attention(be, o[i], q, k, v, 1, seq, nh, nkv, hd, 0.2f, window, softcap));
        qd_backend_close(be);
    }
    double e_auto = rel_to(o[0], ref, seq * nh * hd), e_port = rel_to(o[1], ref, seq * nh * hd);
    double e_f32 = rel_to(o[2], ref, seq * nh * hd);
    fprintf(stderr, "attention (window %lld, softcap %g) vs bf16 reference: auto %.2e, portable %.2e, f32 %.2e\n",
            (long long)window, softcap, e_auto, e_port, e_f32);
    /* With the cap, tanhf's last bit moves some probabilities across a bf16 rounding
     * boundary (2^-8 of that term each): measured 1.5e-5 on the portable path (the tiles sum
     * the scores in another order, so they flip others). An uncapped or a wrongly windowed
     * attention is off by 1e-1 and more. */
    double tol = softcap > 0 ? 1e-4 : 1e-5;
    CHECK(e_auto < tol && e_port < tol);
    CHECK(e_f32 > 2.0 * e_port);   /* the F32 attention does not round: farther from the bf16 reference */
    for (int i = 0; i < 3; i++) free(o[i]);
    free(q), free(k), free(v), free(ref);
}

static void test_attention(void)
{
    attention_case(0, 0.0f);
    attention_case(37, 0.0f);      /* a window shorter than a query chunk, not a tile multiple */
    attention_case(0, 5.0f);       /* a soft-cap (Gemma 2) the scores exceed */
    attention_case(64, 5.0f);
}

int main(void)
{
    test_rng_seed(&rng, 20261125);
    fprintf(stderr, "test_cpu_bf16: AMX-BF16 %s\n", cpu_bf16_amx_usable() ? "used" : "not available (portable path only)");
    TEST_RUN(test_round);
    TEST_RUN(test_gemm_exact);
    TEST_RUN(test_gemm_shapes);
    TEST_RUN(test_syrk);
    TEST_RUN(test_attention);
    return test_finish();
}
