/* The CUDA backend against the CPU backend (the reference), op by op on small random
 * inputs, a whole GPTQ layer quantized by both, and the CUDA dequantizing kernels against
 * the scalar reference (the quick self-test). Skips (77) where no CUDA device is visible,
 * which includes every build without CUDA. */
#include <stdlib.h>
#include <string.h>

#include "quant/algo/gptq.h"
#include "quant/backend/backend.h"
#include "quant/backend/gptq_block.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "test_util.h"

static qd_backend *cpu, *gpu;
static test_rng rng;

static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        float v = scale * test_rng_normal(&rng);
        p[i] = v >= 0 ? v + 1e-3f : v - 1e-3f;
    }
    return p;
}

/* Backend copy of host data. */
static void *put(qd_backend *be, const void *h, size_t bytes)
{
    void *d = qd_backend_alloc(be, bytes);
    if (d) CHECK_OK(qd_backend_upload(be, d, h, bytes));
    return d;
}

static float *get(qd_backend *be, const void *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    CHECK_OK(qd_backend_download(be, h, d, n * sizeof *h));
    return h;
}

/* max |a-b| / max(1, max|b|) */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;                       /* NaN propagates as a failure */
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

/* Runs the same unary-output op on both backends: fn(be, out_dev, in_devs...) via a
 * callback that takes the backend and its copies of the inputs. */
typedef int (*op_fn)(qd_backend *be, float *out, float **in, void *ud);

static double both(op_fn fn, float **in_host, const size_t *in_n, int n_in, size_t out_n, void *ud)
{
    qd_backend *bes[2] = {cpu, gpu};
    float *res[2];
    for (int b = 0; b < 2; b++) {
        float *in[8];
        for (int i = 0; i < n_in; i++) in[i] = put(bes[b], in_host[i], in_n[i] * sizeof(float));
        float *out = qd_backend_alloc(bes[b], out_n * sizeof(float));
        int rc = fn(bes[b], out, in, ud);
        if (rc) TEST_FAIL_("%s backend: %s", bes[b]->name, bes[b]->err.msg);
        res[b] = get(bes[b], out, out_n);
        for (int i = 0; i < n_in; i++) qd_backend_free(bes[b], in[i]);
        qd_backend_free(bes[b], out);
    }
    double d = rel_diff(res[1], res[0], out_n);
    free(res[0]);
    free(res[1]);
    return d;
}

typedef struct gemm_ud { int ta, tb; int64_t m, n, k; } gemm_ud;
static int op_gemm(qd_backend *be, float *out, float **in, void *ud)
{
    gemm_ud *g = ud;
    int rc = be->ops->memset0(be, out, (size_t)(g->m * g->n) * sizeof(float));
    return rc ? rc : be->ops->gemm(be, g->ta, g->tb, g->m, g->n, g->k, 1.5f, in[0], g->ta ? g->m : g->k, in[1],
                                   g->tb ? g->k : g->n, 0.0f, out, g->n);
}

static void test_gemm(void)
{
    for (int t = 0; t < 4; t++) {
        gemm_ud g = {t & 1, t >> 1, 37, 29, 53};
        float *a = rnd(37 * 53, 1), *b = rnd(53 * 29, 1);
        float *in[2] = {a, b};
        size_t n[2] = {37 * 53, 53 * 29};
        CHECK(both(op_gemm, in, n, 2, 37 * 29, &g) < 1e-5);
        free(a);
        free(b);
    }
}

static int op_hessian(qd_backend *be, float *out, float **in, void *ud)
{
    int rc = qd_backend_upload(be, out, ud, 48 * 48 * sizeof(float));
    if (!rc) rc = be->ops->hessian_accum(be, out, 48, in[0], 100, 48, 50);
    return rc;
}

/* "compute": "bf16": the same bf16-rounded products, F32 sums, in another order. The shapes
 * cross the 8192-row chunk of the CUDA side (rows 9000) and the tile edges of the CPU's. */
static int op_gemm_bf16(qd_backend *be, float *out, float **in, void *ud)
{
    (void)ud;
    return be->ops->gemm_nt_bf16(be, 9000, 45, 70, in[0], 70, in[1], 70, out, 45);
}

static int op_hessian_bf16(qd_backend *be, float *out, float **in, void *ud)
{
    int rc = qd_backend_upload(be, out, ud, 40 * 40 * sizeof(float));
    if (!rc) rc = be->ops->hessian_accum_bf16(be, out, 40, in[0], 9000, 40, 50);
    return rc;
}

static int op_gemm_f32_or_bf16(qd_backend *be, float *out, float **in, void *ud)
{
    if (be != cpu) return op_gemm_bf16(be, out, in, ud);
    return be->ops->gemm(be, 0, 1, 9000, 45, 70, 1.0f, in[0], 70, in[1], 70, 0.0f, out, 45);
}

static void test_bf16_products(void)
{
    float *a = rnd(9000 * 70, 1), *b = rnd(45 * 70, 1), *h0 = rnd(40 * 40, 0.0f);
    for (int i = 0; i < 40 * 40; i++) h0[i] = i % 41 == 0 ? 1.0f : 0.0f;
    float *in[2] = {a, b};
    size_t n[2] = {9000 * 70, 45 * 70};
    /* The tensor cores sum in F32 but truncate as they add (not round to nearest): over the
     * Hessian's 9000 rows, about 9000 / 16 additions of positive terms, a bias of up to
     * ~3e-5 of the diagonal. 1e-4 holds that and stays 20x below bf16's own rounding. */
    CHECK(both(op_gemm_bf16, in, n, 2, 9000 * 45, NULL) < 1e-4);
    float *in1[1] = {a};
    size_t n1[1] = {9000 * 40};
    CHECK(both(op_hessian_bf16, in1, n1, 1, 40 * 40, h0) < 1e-4);
    /* And the inputs are rounded: the CPU's F32 product differs from the GPU's bf16 one by
     * bf16's rounding (2.2e-3 of the largest output for such inputs, computed in double). */
    CHECK(both(op_gemm_f32_or_bf16, in, n, 2, 9000 * 45, NULL) > 5e-4);
    free(a);
    free(b);
    free(h0);
}

static int op_chol(qd_backend *be, float *out, float **in, void *ud)
{
    int rc = be->ops->copy(be, out, in[0], 48 * 48 * sizeof(float));
    return rc ? rc : be->ops->chol_inverse_upper(be, out, 48);
}

static void test_hessian_chol(void)
{
    float *x = rnd(100 * 48, 1), *h0 = rnd(48 * 48, 0.0f);
    for (int i = 0; i < 48 * 48; i++) h0[i] = 0;
    for (int i = 0; i < 48; i++) h0[i * 48 + i] = 1.0f;
    float *in[1] = {x};
    size_t n[1] = {100 * 48};
    CHECK(both(op_hessian, in, n, 1, 48 * 48, h0) < 1e-5);
    /* A well-conditioned SPD matrix: X^T X / rows + I. */
    float *h = malloc(48 * 48 * sizeof *h);
    for (int i = 0; i < 48; i++)
        for (int j = 0; j < 48; j++) {
            double s = 0;
            for (int r = 0; r < 100; r++) s += (double)x[r * 48 + i] * x[r * 48 + j];
            h[i * 48 + j] = (float)(s / 100 + (i == j));
        }
    float *in2[1] = {h};
    size_t n2[1] = {48 * 48};
    CHECK(both(op_chol, in2, n2, 1, 48 * 48, NULL) < 1e-4);
    /* Not positive definite: both refuse with QD_ENUMERIC. */
    for (int i = 0; i < 48; i++) h[i * 48 + i] = -1.0f;
    float *d = put(gpu, h, 48 * 48 * sizeof *h);
    CHECK_INT(gpu->ops->chol_inverse_upper(gpu, d, 48), QD_ENUMERIC);
    qd_backend_free(gpu, d);
    free(x);
    free(h0);
    free(h);
}

static int op_nn(qd_backend *be, float *out, float **in, void *ud)
{
    int which = *(int *)ud, rc = 0;
    const int64_t rows = 6, dim = 64;
    switch (which) {
    case 0: return be->ops->rmsnorm(be, out, in[0], in[1], rows, dim, 1e-5f);
    case 1: return be->ops->layernorm(be, out, in[0], in[1], in[2], rows, dim, 1e-5f);
    case 2: return be->ops->silu_mul(be, out, in[0], in[1], rows * dim);
    case 3: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->relu(be, out, rows * dim);
    case 4: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->gelu(be, out, rows * dim);
    case 5: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->add(be, out, in[1], rows * dim);
    case 6: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->add_bias(be, out, in[1], rows, dim);
    case 7: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->scale_cols(be, out, rows, dim, in[1], 1);
    case 8: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc;
        {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.group_size = 32;
            c.sym = 0;
            return be->ops->fake_quant(be, &c, out, rows, dim);
        }
    case 9: {
        /* RoPE on [6 tokens, 2 heads x 32]: pos is int32 in backend memory */
        int32_t pos[6] = {0, 1, 2, 7, 100, 4095};
        int32_t *dp = put(be, pos, sizeof pos);
        if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc;
        qd_rope_freqs f;
        memset(&f, 0, sizeof f);
        f.rot_dim = 32;
        f.attn_scale = 1.0f;
        for (int i = 0; i < 16; i++) f.inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 32.0f);
        rc = be->ops->rope(be, out, rows, 2, 32, dp, &f);
        qd_backend_free(be, dp);
        return rc;
    }
    case 10: /* attention: batch 2, seq 3, 4 heads over 2 kv heads, hd 16 (64 = 4 x 16) */
        return be->ops->attention(be, out, in[0], in[1], in[2], 2, 3, 4, 2, 16, 0.25f, 2, 0.0f);
    case 11: /* the same with Gemma 2's soft-cap on the scores */
        return be->ops->attention(be, out, in[0], in[1], in[2], 2, 3, 4, 2, 16, 0.25f, 0, 0.5f);
    case 12: return be->ops->gelu_tanh_mul(be, out, in[0], in[1], rows * dim);
    case 13: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->softcap(be, out, rows * dim, 0.7f);
    case 15: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->scale(be, out, rows * dim, -0.3f);
    case 16: {
        /* GLM-4's RoPE: interleaved pairs (2i, 2i + 1) on the first 16 of 32 dims */
        int32_t pos[6] = {0, 1, 2, 7, 100, 4095};
        int32_t *dp = put(be, pos, sizeof pos);
        if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc;
        qd_rope_freqs f;
        memset(&f, 0, sizeof f);
        f.rot_dim = 16;
        f.interleaved = 1;
        f.attn_scale = 1.0f;
        for (int i = 0; i < 8; i++) f.inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 16.0f);
        rc = be->ops->rope(be, out, rows, 2, 32, dp, &f);
        qd_backend_free(be, dp);
        return rc;
    }
    case 17: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc; return be->ops->gelu_tanh(be, out, rows * dim);
    case 18: /* copy_2d: columns [8, 24) of in[0] [6, 64] into columns [40, 56) of a copy of in[1] */
        if ((rc = be->ops->copy(be, out, in[1], rows * dim * 4))) return rc;
        return be->ops->copy_2d(be, out + 40, dim, in[0] + 8, dim, rows, 16);
    case 19: if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc;
        return be->ops->xielu(be, out, rows * dim, 0.8f, 0.8f, 0.5f, -1e-6f);
    case 20: return be->ops->swiglu_clamp_mul(be, out, in[0], in[1], rows * dim, 1.702f, 0.8f);   /* gpt-oss, clamps bite */
    case 21: { /* attention with gpt-oss's sinks, per head below, near and above the scores */
        float sinks[4] = {-2.0f, 0.0f, 0.7f, 4.0f};
        float *ds = put(be, sinks, sizeof sinks);
        rc = be->ops->attention_sink(be, out, in[0], in[1], in[2], 2, 3, 4, 2, 16, 0.25f, 2, ds);
        qd_backend_free(be, ds);
        return rc;
    }
    case 22: { /* attention_keep (DeepSeek-V3.2's indexer choice): rows keeping 1 to 3 of their causal keys */
        static const uint8_t keep[2 * 3 * 3] = {1, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1};
        uint8_t *dk = put(be, keep, sizeof keep);
        rc = be->ops->attention_keep(be, out, in[0], in[1], in[2], 2, 3, 4, 2, 16, 0.25f, dk);
        qd_backend_free(be, dk);
        return rc;
    }
    case 23: /* dsa_scores: 2 sequences of 3 queries, 4 heads of 16 (q in[0]), one key of 16 per token (the
              * first 96 of in[1]), weights the first 24 of in[2]; [2, 3, 3] out */
        if ((rc = be->ops->memset0(be, out, rows * dim * 4))) return rc;
        return be->ops->dsa_scores(be, out, in[0], in[1], in[2], 2, 3, 4, 16, 0.25f, 0.5f);
    case 14: /* NVFP4 fake quantization: the global scale found from the whole weight on each side */
        if ((rc = be->ops->copy(be, out, in[0], rows * dim * 4))) return rc;
        {
            qd_quant_cfg c = qd_quant_cfg_default();
            c.grid = QD_GRID_FP4_E2M1;
            c.scale_rule = QD_SCALE_FP8_GLOBAL;
            c.group_size = 16;
            return be->ops->fake_quant(be, &c, out, rows, dim);
        }
    }
    return QD_EINVAL;
}

static void test_nn_ops(void)
{
    const size_t n = 6 * 64;
    float *a = rnd(n, 1), *b = rnd(n, 1), *c = rnd(n, 1);
    float *in[3] = {a, b, c};
    size_t ns[3] = {n, n, n};
    for (int which = 0; which <= 23; which++) {
        double d = both(op_nn, in, ns, 3, n, &which);
        if (!(d < 1e-5)) TEST_FAIL_("nn op %d: cpu and cuda differ by %g", which, d);
        test_checks++;
    }
    free(a);
    free(b);
    free(c);
}

/* The MoE forward's row ops (gather_rows, scatter_add_rows) against the CPU reference: a
 * copy, and one product and one sum per element in the same order (no FMA), so the two
 * backends agree bit for bit; an index out of range is refused (QD_EINVAL, not a device
 * error) with the rows it names left alone. */
static void test_gather_scatter(void)
{
    const int64_t rows = 300, n = 113, cols = 2049;
    float *src = rnd((size_t)(rows * cols), 1), *dst0 = rnd((size_t)(rows * cols), 1), *w = rnd((size_t)n, 0.5f);
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)((i * 37 + 11) % rows);   /* distinct: 37 is prime to 300 */
    float *res[2][2];
    qd_backend *bes[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++) {
        qd_backend *be = bes[b];
        float *s = put(be, src, (size_t)(rows * cols) * sizeof(float)), *d = put(be, dst0, (size_t)(rows * cols) * sizeof(float));
        float *g = qd_backend_alloc(be, (size_t)(n * cols) * sizeof(float)), *wd = put(be, w, (size_t)n * sizeof(float));
        int32_t *id = put(be, idx, (size_t)n * sizeof *idx);
        CHECK_OK(be->ops->gather_rows(be, g, s, rows, id, n, cols));
        CHECK_OK(be->ops->scatter_add_rows(be, d, rows, g, id, wd, n, cols));
        res[b][0] = get(be, g, (size_t)(n * cols));
        res[b][1] = get(be, d, (size_t)(rows * cols));
        int32_t bad[2] = {0, (int32_t)rows};
        CHECK_OK(qd_backend_upload(be, id, bad, sizeof bad));
        CHECK_INT(be->ops->gather_rows(be, g, s, rows, id, 2, cols), QD_EINVAL);
        CHECK_INT(be->ops->scatter_add_rows(be, d, rows, g, id, wd, 2, cols), QD_EINVAL);
        CHECK_INT(be->broken, 0);
        qd_backend_free(be, s); qd_backend_free(be, d); qd_backend_free(be, g); qd_backend_free(be, wd);
        qd_backend_free(be, id);
    }
    CHECK(memcmp(res[0][0], res[1][0], (size_t)(n * cols) * sizeof(float)) == 0);
    CHECK(memcmp(res[0][1], res[1][1], (size_t)(rows * cols) * sizeof(float)) == 0);
    if (memcmp(res[0][1], res[1][1], (size_t)(rows * cols) * sizeof(float)))
        fprintf(stderr, "scatter_add_rows: cpu and cuda differ by %g (relative)\n",
                rel_diff(res[1][1], res[0][1], (size_t)(rows * cols)));
    for (int b = 0; b < 2; b++) { free(res[b][0]); free(res[b][1]); }
    free(src); free(dst0); free(w); free(idx);
}

/* The recurrent mixers' ops (cuda_recurrent.cu) against the CPU's: the causal conv with and
 * without bias and SiLU, the sigmoid gate, and the gated delta rule on Qwen3-Next's head
 * shape (key heads of 128 serving two value heads each) over two sequences of 70 tokens.
 * The CUDA state is float, the CPU's double: 1e-4 relative to the largest output. */
static void test_recurrent(void)
{
    const int64_t B = 2, T = 70, C = 300, K = 4, nk = 2, nv = 4, dk = 128, dv = 128;
    const int64_t ld = 2 * nk * dk + nv * dv;
    float *x = rnd((size_t)(B * T * C), 1), *w = rnd((size_t)(C * K), 0.5f), *bias = rnd((size_t)C, 0.2f);
    float *qkv = rnd((size_t)(B * T * ld), 1), *ba = rnd((size_t)(B * T * 2 * nv), 1);
    float *al = rnd((size_t)nv, 0.3f), *dt = rnd((size_t)nv, 0.3f);
    float *res[2][4];
    qd_backend *bes[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++) {
        qd_backend *be = bes[b];
        float *xd = put(be, x, (size_t)(B * T * C) * 4), *wd = put(be, w, (size_t)(C * K) * 4), *bd = put(be, bias, (size_t)C * 4);
        float *y = qd_backend_alloc(be, (size_t)(B * T * C) * 4), *y2 = qd_backend_alloc(be, (size_t)(B * T * C) * 4);
        float *qd = put(be, qkv, (size_t)(B * T * ld) * 4), *bad = put(be, ba, (size_t)(B * T * 2 * nv) * 4);
        float *ald = put(be, al, (size_t)nv * 4), *dtd = put(be, dt, (size_t)nv * 4);
        float *o = qd_backend_alloc(be, (size_t)(B * T * nv * dv) * 4);
        CHECK_OK(be->ops->conv1d_causal(be, y, xd, NULL, NULL, C, B, T, C, wd, bd, K, 0));
        CHECK_OK(be->ops->conv1d_causal(be, y2, xd, NULL, NULL, C, B, T, C, wd, NULL, K, 1));
        CHECK_OK(be->ops->gated_delta_rule(be, o, qd, ld, bad, bad + nv, 2 * nv, ald, dtd, B, T, nk, nv, dk, dv));
        res[b][0] = get(be, y, (size_t)(B * T * C));
        res[b][1] = get(be, y2, (size_t)(B * T * C));
        res[b][2] = get(be, o, (size_t)(B * T * nv * dv));
        CHECK_OK(be->ops->sigmoid_mul(be, y2, xd, y2, B * T * C));
        res[b][3] = get(be, y2, (size_t)(B * T * C));
        CHECK_INT(be->broken, 0);
        qd_backend_free(be, xd); qd_backend_free(be, wd); qd_backend_free(be, bd); qd_backend_free(be, y);
        qd_backend_free(be, y2); qd_backend_free(be, qd); qd_backend_free(be, bad); qd_backend_free(be, ald);
        qd_backend_free(be, dtd); qd_backend_free(be, o);
    }
    CHECK(rel_diff(res[1][0], res[0][0], (size_t)(B * T * C)) < 1e-6);
    CHECK(rel_diff(res[1][1], res[0][1], (size_t)(B * T * C)) < 1e-6);
    CHECK(rel_diff(res[1][2], res[0][2], (size_t)(B * T * nv * dv)) < 1e-4);
    CHECK(rel_diff(res[1][3], res[0][3], (size_t)(B * T * C)) < 1e-6);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++) free(res[b][i]);
    free(x); free(w); free(bias); free(qkv); free(ba); free(al); free(dt);
}

/* The attention (cuda_attention.cu: batched GEMMs around a softmax kernel, chunked by
 * quant/backend/attn_plan.h) against the CPU's on the shapes its plan splits: grouped-query
 * heads, several sequences, seq off every row block (256), sliding windows that cut a
 * block's keys, the soft-cap, more sequences than one chunk holds (130 x 2048 splits into
 * 128 + 2), and a Llama-sized 2048 x 32 heads of 128. A wrong mask, window or kv head moves
 * an output by O(0.1); the F32 products and the exp differ by ~1e-6, so 1e-4 (relative to
 * the largest output, at least 1) separates the two. */
typedef struct attn_case { int64_t batch, seq, n_heads, n_kv, hd, window; float softcap; int sinks; } attn_case;

static int op_attn(qd_backend *be, float *out, float **in, void *ud)
{
    const attn_case *a = ud;
    if (a->sinks) {   /* gpt-oss: a sink per head, spread from below to above the scores */
        float *h = malloc((size_t)a->n_heads * sizeof *h);
        for (int64_t i = 0; i < a->n_heads; i++) h[i] = -3.0f + 6.0f * (float)i / (float)a->n_heads;
        float *ds = put(be, h, (size_t)a->n_heads * sizeof *h);
        int rc = be->ops->attention_sink(be, out, in[0], in[1], in[2], a->batch, a->seq, a->n_heads, a->n_kv, a->hd,
                                         1.0f / sqrtf((float)a->hd), a->window, ds);
        qd_backend_free(be, ds);
        free(h);
        return rc;
    }
    return be->ops->attention(be, out, in[0], in[1], in[2], a->batch, a->seq, a->n_heads, a->n_kv, a->hd,
                              1.0f / sqrtf((float)a->hd), a->window, a->softcap);
}

static void test_attention(void)
{
    static const attn_case cases[] = {
        {3, 300, 8, 2, 64, 0, 0.0f, 0},      /* GQA 4:1, two row blocks, the second of 44 rows */
        {2, 517, 4, 4, 32, 100, 0.0f, 0},    /* sliding window inside a block and across blocks */
        {2, 333, 6, 3, 48, 0, 1.5f, 0},      /* soft-cap that bites (scores ~ N(0, 1)) */
        {2, 700, 8, 4, 64, 257, 5.0f, 0},    /* window, soft-cap and GQA at once */
        {1, 5, 2, 1, 16, 1, 0.0f, 0},        /* a window of one: each row its own value */
        {130, 2048, 2, 1, 8, 0, 0.0f, 0},    /* two chunks of sequences */
        {1, 2048, 32, 8, 128, 0, 0.0f, 0},   /* Llama-sized, GQA 4:1 */
        {1, 2048, 32, 32, 128, 4096, 0.0f, 0},
        {2, 517, 8, 2, 64, 128, 0.0f, 1},  /* gpt-oss: sinks, GQA 4:1, window 128 across blocks */
        {130, 2048, 4, 2, 64, 0, 0.0f, 1}, /* sinks over two chunks of sequences (the head index per matrix) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const attn_case *a = &cases[i];
        size_t nq = (size_t)(a->batch * a->seq * a->n_heads * a->hd), nk = (size_t)(a->batch * a->seq * a->n_kv * a->hd);
        float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1);
        float *in[3] = {q, k, v};
        size_t ns[3] = {nq, nk, nk};
        double d = both(op_attn, in, ns, 3, nq, (void *)a);
        if (!(d < 1e-4))
            TEST_FAIL_("attention case %zu (batch %lld seq %lld heads %lld/%lld hd %lld window %lld softcap %g): "
                       "cpu and cuda differ by %g", i, (long long)a->batch, (long long)a->seq, (long long)a->n_heads,
                       (long long)a->n_kv, (long long)a->hd, (long long)a->window, (double)a->softcap, d);
        test_checks++;
        free(q);
        free(k);
        free(v);
    }
}

/* A non-finite weight: fake_quant refuses (QD_ENUMERIC) and every weight is left as it was,
 * the NaN's group and every other one, as the CPU backend's refusal leaves them. Both
 * backends must be broken-free afterwards (a refusal is not a device error). */
static void test_fake_quant_refusal(void)
{
    const int64_t n = 8, k = 256;
    const size_t nk = (size_t)(n * k);
    float *w = rnd(nk, 1);
    w[5 * k + 130] = NAN;
    qd_quant_cfg c = qd_quant_cfg_default();
    c.group_size = 64;
    qd_backend *bes[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++) {
        float *d = put(bes[b], w, nk * sizeof *w);
        CHECK(d != NULL);
        if (!d) continue;
        CHECK_INT(bes[b]->ops->fake_quant(bes[b], &c, d, n, k), QD_ENUMERIC);
        float *back = get(bes[b], d, nk);
        CHECK(memcmp(back, w, nk * sizeof *w) == 0);
        CHECK(!bes[b]->broken);
        free(back);
        qd_backend_free(bes[b], d);
    }
    free(w);
}

static void test_reductions(void)
{
    float *a = rnd(10007, 1), *b = rnd(10007, 1);
    double s[2];
    qd_backend *bes[2] = {cpu, gpu};
    for (int i = 0; i < 2; i++) {
        float *da = put(bes[i], a, 10007 * 4), *db = put(bes[i], b, 10007 * 4);
        CHECK_OK(bes[i]->ops->sq_diff_sum(bes[i], da, db, 10007, &s[i]));
        qd_backend_free(bes[i], da);
        qd_backend_free(bes[i], db);
    }
    CHECK_NEAR(s[1], s[0], 1e-9 * s[0]);
    /* NLL rows, and a bad target is refused. */
    float *lg = rnd(5 * 300, 3);
    int32_t tg[5] = {0, 299, 17, 150, 3};
    double nll[2][5];
    for (int i = 0; i < 2; i++) {
        float *dl = put(bes[i], lg, 5 * 300 * 4);
        int32_t *dt = put(bes[i], tg, sizeof tg);
        CHECK_OK(bes[i]->ops->nll_rows(bes[i], dl, dt, 5, 300, nll[i]));
        qd_backend_free(bes[i], dl);
        qd_backend_free(bes[i], dt);
    }
    for (int r = 0; r < 5; r++) CHECK_NEAR(nll[1][r], nll[0][r], 1e-5);
    tg[2] = 300;
    float *dl = put(gpu, lg, 5 * 300 * 4);
    int32_t *dt = put(gpu, tg, sizeof tg);
    CHECK_ERR(gpu->ops->nll_rows(gpu, dl, dt, 5, 300, nll[1]));
    qd_backend_free(gpu, dl);
    qd_backend_free(gpu, dt);
    free(a);
    free(b);
    free(lg);
}

/* A GPTQ layer quantized on both backends: the same codes up to rare rounding-boundary
 * flips, and the same dequantized weights within a quantization step. */
/* H = 2/rows X^T X of x [rows, k] (host, malloc'd). */
static float *hessian_of(const float *x, int64_t rows, int64_t k)
{
    float *h = malloc(k * k * sizeof *h);
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) {
            double s = 0;
            for (int64_t r = 0; r < rows; r++) s += (double)x[r * k + i] * x[r * k + j];
            h[i * k + j] = (float)(2 * s / rows);
        }
    return h;
}

static void test_gptq_layer(void)
{
    const int64_t n = 96, k = 256, rows = 512;
    float *w = rnd(n * k, 0.05f), *x = rnd(rows * k, 1), *h = hessian_of(x, rows, k);
    /* Dynamic groups (column order, and act-order without static groups), with min-max and
     * with the scale search under H's diagonal, found by the kernel as it goes. */
    for (int c = 0; c < 4; c++) {
        const int act = c & 1;
        qd_gptq_opts o = qd_gptq_opts_default();
        o.desc_act = act;
        o.quant.sym = !act;
        o.quant.group_size = 64;
        o.quant.scale_search = c >= 2 ? QD_SCALE_SEARCH_MSE : QD_SCALE_SEARCH_MINMAX;
        qd_gptq_result rc_cpu, rc_gpu;
        qd_err err = {0};
        CHECK_OK(qd_gptq_quantize_h(cpu, &o, w, n, k, h, &rc_cpu, &err));
        int rc = qd_gptq_quantize_h(gpu, &o, w, n, k, h, &rc_gpu, &err);
        CHECK_OK(rc);
        if (rc) { fprintf(stderr, "gpu gptq (case %d): %s\n", c, err.msg); qd_gptq_result_free(&rc_cpu); continue; }
        int64_t diff = 0;
        for (int64_t i = 0; i < n * k; i++) diff += rc_cpu.layer.q[i] != rc_gpu.layer.q[i];
        /* A searched group whose two best ranges nearly tie may pick the other one on the
         * device (the weights it sees differ in the last bits): its 64 codes then all move. */
        CHECK(diff <= n * k / (c >= 2 ? 50 : 200));
        CHECK(rel_diff(rc_gpu.deq, rc_cpu.deq, n * k) < 0.02);
        for (int64_t i = 0; i < k; i++) CHECK_INT(rc_gpu.layer.g_idx[i], rc_cpu.layer.g_idx[i]);
        qd_gptq_result_free(&rc_cpu);
        qd_gptq_result_free(&rc_gpu);
    }
    free(w);
    free(x);
    free(h);
}

/* GPTQ on the float grids (FP8 per channel and in 128-row blocks, NVFP4 with its global
 * scale, MXFP4) on both backends: the CUDA op rounds with the very functions the CPU's does
 * (quant/core/minifloat.h), so the codes agree up to rare rounding-boundary flips and the
 * dequantized weights within a step. */
static void test_gptq_float_grids(void)
{
    const int64_t n = 256, k = 256, rows = 512;
    float *w = rnd(n * k, 0.05f), *x = rnd(rows * k, 1), *h = hessian_of(x, rows, k);
    static const struct { qd_grid grid; qd_scale_rule rule; int bits; int64_t gs, rb; } cases[] = {
        {QD_GRID_FP8_E4M3, QD_SCALE_F32, 8, -1, 1},
        {QD_GRID_FP8_E4M3, QD_SCALE_F32, 8, 128, 128},
        {QD_GRID_FP4_E2M1, QD_SCALE_FP8_GLOBAL, 4, 16, 1},
        {QD_GRID_FP4_E2M1, QD_SCALE_E8M0, 4, 32, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant.grid = cases[c].grid;
        o.quant.scale_rule = cases[c].rule;
        o.quant.bits = cases[c].bits;
        o.quant.group_size = cases[c].gs;
        o.quant.row_block = cases[c].rb;
        qd_gptq_result rc_cpu, rc_gpu;
        qd_err err = {0};
        CHECK_OK(qd_gptq_quantize_h(cpu, &o, w, n, k, h, &rc_cpu, &err));
        int rc = qd_gptq_quantize_h(gpu, &o, w, n, k, h, &rc_gpu, &err);
        CHECK_OK(rc);
        if (rc) { fprintf(stderr, "gpu gptq (%s): %s\n", qd_grid_name(cases[c].grid), err.msg); qd_gptq_result_free(&rc_cpu); continue; }
        int64_t diff = 0;
        for (int64_t i = 0; i < n * k; i++) diff += rc_cpu.layer.q[i] != rc_gpu.layer.q[i];
        CHECK(diff <= n * k / 200);
        CHECK(rel_diff(rc_gpu.deq, rc_cpu.deq, n * k) < 0.05);
        qd_gptq_result_free(&rc_cpu);
        qd_gptq_result_free(&rc_gpu);
    }
    free(w);
    free(x);
    free(h);
}

/* The CUDA dequantizing kernels against the scalar reference, and the per-layer check. */
static void test_kernels_selftest(void)
{
    qd_selftest_report rep;
    qd_err err = {0};
    int rc = qd_selftest_run(gpu, 1, stderr, &rep, &err);
    CHECK_OK(rc);
    if (rc) fprintf(stderr, "selftest: %s\n", err.msg);
    CHECK(rep.cases > 0);
    CHECK_INT(rep.failures, 0);
    qd_packed p;
    CHECK_OK(qd_selftest_make_layer(qd_format_find("gptq"), 4, 128, 1, 256, 512, 4, &p, &err));
    float *x = rnd(16 * 512, 1);
    double rel = 1;
    CHECK_OK(qd_kernel_check_layer(gpu, qd_format_find("gptq"), &p, NULL, x, 16, &rel, &err));
    CHECK(rel < 5e-3);                              /* the tensor-core path rounds to half */
    CHECK_OK(qd_kernel_check_layer(gpu, qd_format_find("gptq"), &p, NULL, x, 4, &rel, &err));
    CHECK(rel < 1e-5);
    free(x);
    qd_packed_free(&p);
}

static void test_errors_name_the_device(void)
{
    /* An absurd allocation fails cleanly, with the device in the message. */
    void *p = qd_backend_alloc(gpu, (size_t)1 << 50);
    CHECK(p == NULL);
    CHECK_CONTAINS(gpu->err.msg, "cuda:");
    CHECK_INT(gpu->broken, 0);                      /* out of memory leaves the context usable */
    /* A refusal before any CUDA call is not a device error either. */
    CHECK_ERR(gpu->ops->gemm(gpu, 0, 0, 4, 4, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 4));
    CHECK_INT(gpu->broken, 0);
    qd_backend *bad = NULL;
    qd_err err = {0};
    CHECK_ERR(qd_backend_open("cuda:1000", NULL, &bad, &err));
    /* A failing CUDA call (a copy into NULL) marks the backend broken, with the call, file,
     * line and device in the message: the worker then exits and is replaced. Last, since
     * nothing may run on a broken backend. */
    void *src = qd_backend_alloc(gpu, 64);
    CHECK_ERR(gpu->ops->copy(gpu, NULL, src, 64));
    CHECK_INT(gpu->broken, 1);
    CHECK_CONTAINS(gpu->err.msg, "cuda:0: cudaMemcpyAsync");
    CHECK_CONTAINS(gpu->err.msg, "cuda_backend.c:");
    qd_backend_free(gpu, src);
}

int main(void)
{
    if (qd_backend_cuda_device_count() == 0) {
        fprintf(stderr, "test_backend_cuda: no CUDA device visible, skipping\n");
        return TEST_SKIP;
    }
    qd_err err = {0};
    test_rng_seed(&rng, 2026);
    if (qd_backend_cpu_open(2, NULL, &cpu, &err) || qd_backend_open("cuda:0", NULL, &gpu, &err)) {
        fprintf(stderr, "test_backend_cuda: %s\n", err.msg);
        return 1;
    }
    TEST_RUN(test_gemm);
    TEST_RUN(test_hessian_chol);
    TEST_RUN(test_bf16_products);
    TEST_RUN(test_nn_ops);
    TEST_RUN(test_attention);
    TEST_RUN(test_fake_quant_refusal);
    TEST_RUN(test_gptq_float_grids);
    TEST_RUN(test_gather_scatter);
    TEST_RUN(test_recurrent);
    TEST_RUN(test_reductions);
    TEST_RUN(test_gptq_layer);
    TEST_RUN(test_kernels_selftest);
    TEST_RUN(test_errors_name_the_device);
    qd_backend_close(gpu);
    qd_backend_close(cpu);
    return test_finish();
}
