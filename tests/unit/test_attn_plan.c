/* The CUDA attention's plan (quant/backend/attn_plan.c), host C that every build runs: the
 * chunks cover every (sequence, head, query row) exactly once, each chunk's scores fit the
 * workspace and the workspace the budget, each row's keys (causal prefix, sliding window)
 * lie inside its chunk's key range, the grouped-query offsets reach the right kv head and
 * stay inside the tensors, and the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/attn_plan.h"
#include "quant/core/error.h"
#include "test_util.h"

/* Plans the shape and checks every chunk against the invariants the CUDA code relies on. */
static void check_shape(int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t window,
                        size_t budget)
{
    qd_attn_plan p;
    const char *err = NULL;
    int rc = qd_attn_plan_make(&p, batch, seq, n_heads, n_kv, hd, window, budget, &err);
    CHECK_OK(rc);
    if (rc) return;
    CHECK(p.ws_bytes <= budget);
    CHECK_INT(p.ldq, n_heads * hd);
    CHECK_INT(p.ldk, n_kv * hd);
    size_t cells = (size_t)(batch * n_heads * seq);
    unsigned char *seen = calloc(cells ? cells : 1, 1);
    int64_t n = qd_attn_plan_chunks(&p), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        qd_attn_chunk c;
        qd_attn_plan_chunk(&p, i, &c);
        if (c.nb < 1 || c.nh < 1 || c.rows < 1 || c.keys < 1 || c.b0 + c.nb > batch || c.h0 + c.nh > n_heads ||
            c.r0 + c.rows > seq || c.k0 < 0) {
            bad++;
            continue;
        }
        /* The scores of the chunk, and its last matrix, inside the workspace. */
        if ((size_t)(c.nh * c.nb * c.rows * c.keys) * sizeof(float) > p.ws_bytes) bad++;
        if ((size_t)(qd_attn_s_offset(&c, c.nh - 1, c.nb - 1) + c.rows * c.keys) * sizeof(float) > p.ws_bytes)
            bad++;
        /* cuBLAS ints and the softmax grid. */
        if (c.keys > 2147483647 || c.nh * c.nb * c.rows > 2147483647) bad++;
        /* The keys end at the last row, and every row's keys lie in [k0, k0 + keys). */
        if (c.k0 + c.keys != c.r0 + c.rows) bad++;
        for (int64_t r = c.r0; r < c.r0 + c.rows; r++) {
            int64_t lo;
            qd_attn_key_range(window, r, &lo);
            if (lo < c.k0 || lo > r || (window > 0 && r + 1 - lo > window) || (window == 0 && lo != 0)) bad++;
        }
        for (int64_t b = c.b0; b < c.b0 + c.nb; b++)
            for (int64_t h = c.h0; h < c.h0 + c.nh; h++)
                for (int64_t r = c.r0; r < c.r0 + c.rows; r++) seen[(b * n_heads + h) * seq + r]++;
    }
    CHECK_INT(bad, 0);
    int64_t wrong = 0;
    for (size_t i = 0; i < cells; i++) wrong += seen[i] != 1;
    if (wrong) TEST_FAIL_("batch %lld seq %lld heads %lld/%lld budget %zu: %lld query rows covered other than once",
                          (long long)batch, (long long)seq, (long long)n_heads, (long long)n_kv, budget,
                          (long long)wrong);
    test_checks++;
    free(seen);
}

static void test_coverage(void)
{
    /* seq not a multiple of the row block, several sequences, GQA, windows, and budgets
     * that split the sequences and the heads into several chunks. */
    check_shape(3, 300, 8, 2, 64, 0, QD_ATTN_WORKSPACE_DEFAULT);
    check_shape(2, 517, 4, 4, 32, 100, QD_ATTN_WORKSPACE_DEFAULT);
    check_shape(2, 700, 8, 4, 64, 257, QD_ATTN_WORKSPACE_DEFAULT);
    check_shape(130, 2048, 2, 1, 8, 0, QD_ATTN_WORKSPACE_DEFAULT);
    check_shape(5, 1000, 12, 3, 16, 0, (size_t)3 * 256 * 1000 * 4 + 17);
    check_shape(7, 301, 6, 2, 16, 1, 4096);
    check_shape(4, 64, 6, 6, 16, 0, 64 * 4);        /* one row of S: row block 1 */
    check_shape(1, 1, 1, 1, 1, 0, 4);
    check_shape(2, 3, 4, 2, 16, 2, QD_ATTN_WORKSPACE_DEFAULT);
    check_shape(1, 2048, 32, 8, 128, 4096, QD_ATTN_WORKSPACE_DEFAULT);
}

/* The 7B job's shape: 128 sequences of 2048 tokens, 32 heads of 128. */
static void test_llama_shape(void)
{
    qd_attn_plan p;
    const char *err = NULL;
    CHECK_OK(qd_attn_plan_make(&p, 128, 2048, 32, 32, 128, 0, QD_ATTN_WORKSPACE_DEFAULT, &err));
    CHECK_INT(p.row_block, QD_ATTN_ROW_BLOCK);
    CHECK_INT(p.seqs, 128);
    CHECK_INT(p.heads, 1);
    CHECK_INT(p.ws_bytes, (size_t)128 * 256 * 2048 * 4);
    CHECK_INT(qd_attn_plan_chunks(&p), 8 * 32);
    /* The first block of rows sees 256 keys, the last all 2048. */
    qd_attn_chunk c;
    qd_attn_plan_chunk(&p, 0, &c);
    CHECK_INT(c.keys, 256);
    qd_attn_plan_chunk(&p, qd_attn_plan_chunks(&p) - 1, &c);
    CHECK_INT(c.r0, 1792);
    CHECK_INT(c.k0, 0);
    CHECK_INT(c.keys, 2048);
    CHECK_INT(c.h0, 31);
    /* A 4096-token window over 2048 tokens is the full prefix; a 1000-token one starts the
     * last block's keys at 1792 + 1 - 1000. */
    CHECK_OK(qd_attn_plan_make(&p, 1, 2048, 32, 8, 128, 1000, QD_ATTN_WORKSPACE_DEFAULT, &err));
    qd_attn_plan_chunk(&p, qd_attn_plan_chunks(&p) - 1, &c);
    CHECK_INT(c.k0, 793);
    CHECK_INT(c.keys, 2048 - 793);
    CHECK_INT(p.heads, 32);
    CHECK(p.ws_bytes <= (size_t)32 * 256 * (256 + 999) * 4);
}

static void test_gqa_offsets(void)
{
    qd_attn_plan p;
    const char *err = NULL;
    CHECK_OK(qd_attn_plan_make(&p, 3, 10, 8, 2, 16, 0, QD_ATTN_WORKSPACE_DEFAULT, &err));
    CHECK_INT(p.group, 4);
    for (int64_t h = 0; h < 8; h++) CHECK_INT(qd_attn_kv_head(&p, h), h / 4);
    /* Sequence 2, query head 5 (kv head 1), row 7. */
    CHECK_INT(qd_attn_q_offset(&p, 2, 5, 7), (2 * 10 + 7) * 128 + 5 * 16);
    CHECK_INT(qd_attn_kv_offset(&p, 2, 5, 7), (2 * 10 + 7) * 32 + 1 * 16);
    /* The last head's last element stays inside q and k. */
    CHECK(qd_attn_q_offset(&p, 2, 7, 9) + 16 == 3 * 10 * 128);
    CHECK(qd_attn_kv_offset(&p, 2, 7, 9) + 16 == 3 * 10 * 32);
    /* Multi-head: every head its own kv head. */
    CHECK_OK(qd_attn_plan_make(&p, 1, 10, 4, 4, 8, 0, QD_ATTN_WORKSPACE_DEFAULT, &err));
    for (int64_t h = 0; h < 4; h++) CHECK_INT(qd_attn_kv_head(&p, h), h);
}

static void test_key_range(void)
{
    int64_t lo;
    qd_attn_key_range(0, 100, &lo);
    CHECK_INT(lo, 0);
    qd_attn_key_range(4, 2, &lo);       /* fewer rows than the window: the whole prefix */
    CHECK_INT(lo, 0);
    qd_attn_key_range(4, 3, &lo);
    CHECK_INT(lo, 0);
    qd_attn_key_range(4, 4, &lo);       /* i - window < j <= i */
    CHECK_INT(lo, 1);
    qd_attn_key_range(1, 9, &lo);       /* a window of one: the row's own key */
    CHECK_INT(lo, 9);
}

static void test_refusals(void)
{
    qd_attn_plan p;
    const char *err = NULL;
    CHECK_INT(qd_attn_plan_make(&p, 1, 10, 6, 4, 16, 0, QD_ATTN_WORKSPACE_DEFAULT, &err), QD_EINVAL);
    CHECK_CONTAINS(err, "multiple of n_kv");
    CHECK_INT(qd_attn_plan_make(&p, 1, 10, 4, 0, 16, 0, QD_ATTN_WORKSPACE_DEFAULT, &err), QD_EINVAL);
    CHECK_INT(qd_attn_plan_make(&p, 1, 10, 4, 2, 0, 0, QD_ATTN_WORKSPACE_DEFAULT, &err), QD_EINVAL);
    CHECK_INT(qd_attn_plan_make(&p, 1, 10, 4, 2, 16, -1, QD_ATTN_WORKSPACE_DEFAULT, &err), QD_EINVAL);
    CHECK_INT(qd_attn_plan_make(&p, 1, 10, 1 << 20, 1, 1 << 12, 0, QD_ATTN_WORKSPACE_DEFAULT, &err), QD_EINVAL);
    CHECK_CONTAINS(err, "cuBLAS int");
    /* Less than one row of scores. */
    CHECK_INT(qd_attn_plan_make(&p, 1, 1000, 4, 2, 16, 0, 3999, &err), QD_EINVAL);
    CHECK_CONTAINS(err, "one row");
    CHECK_OK(qd_attn_plan_make(&p, 1, 1000, 4, 2, 16, 0, 4000, &err));
    CHECK_INT(p.row_block, 1);
    /* Nothing to do: no chunk. */
    CHECK_OK(qd_attn_plan_make(&p, 0, 10, 4, 2, 16, 0, QD_ATTN_WORKSPACE_DEFAULT, &err));
    CHECK_INT(qd_attn_plan_chunks(&p), 0);
    CHECK_OK(qd_attn_plan_make(&p, 3, 0, 4, 2, 16, 0, QD_ATTN_WORKSPACE_DEFAULT, &err));
    CHECK_INT(qd_attn_plan_chunks(&p), 0);
}

/* cublasSgemmStridedBatched's definition (column-major, beta 0) in double. */
static void ref_gemm(const qd_attn_gemm *g, float alpha, const float *a, const float *b, float *c)
{
    for (int64_t i = 0; i < g->batch; i++) {
        const float *ai = a + g->a_off + i * g->stride_a, *bi = b + g->b_off + i * g->stride_b;
        float *ci = c + g->c_off + i * g->stride_c;
        for (int64_t col = 0; col < g->n; col++)
            for (int64_t row = 0; row < g->m; row++) {
                double acc = 0;
                for (int64_t l = 0; l < g->k; l++) {
                    double x = g->trans_a ? ai[row * g->lda + l] : ai[l * g->lda + row];
                    double y = g->trans_b ? bi[l * g->ldb + col] : bi[col * g->ldb + l];
                    acc += x * y;
                }
                ci[col * g->ldc + row] = (float)(alpha * acc);
            }
    }
}

/* k_attn_softmax of cuda_attention.cu on one chunk's workspace, as written there. */
static void ref_softmax(const qd_attn_chunk *c, int64_t window, float softcap, float *s)
{
    for (int64_t t = 0; t < c->nh * c->nb * c->rows; t++) {
        float *row = s + t * c->keys;
        int64_t qi = c->r0 + t % c->rows, lo;
        qd_attn_key_range(window, qi, &lo);
        int64_t c0 = lo - c->k0, c1 = qi + 1 - c->k0;
        float mx = -INFINITY;
        for (int64_t j = c0; j < c1; j++) {
            if (softcap > 0.0f) row[j] = tanhf(row[j] / softcap) * softcap;
            mx = fmaxf(mx, row[j]);
        }
        double sum = 0;
        for (int64_t j = c0; j < c1; j++) sum += row[j] = expf(row[j] - mx);
        for (int64_t j = 0; j < c->keys; j++) row[j] = j >= c0 && j < c1 ? row[j] * (float)(1.0 / sum) : 0.0f;
    }
}

/* The op's definition (backend.h), directly, in double. */
static void naive_attention(const float *q, const float *k, const float *v, int64_t batch, int64_t seq,
                            int64_t nh, int64_t nkv, int64_t hd, float scale, int64_t window, float softcap,
                            float *out)
{
    double *w = malloc((size_t)seq * sizeof *w);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < seq; i++) {
                const float *qr = q + (b * seq + i) * nh * hd + h * hd;
                int64_t kh = h / (nh / nkv);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    if (window > 0 && j <= i - window) continue;
                    const float *kr = k + (b * seq + j) * nkv * hd + kh * hd;
                    double d = 0;
                    for (int64_t e = 0; e < hd; e++) d += (double)qr[e] * kr[e];
                    d *= scale;
                    if (softcap > 0) d = softcap * tanh(d / softcap);
                    w[j] = d;
                    if (d > mx) mx = d;
                }
                for (int64_t j = 0; j <= i; j++)
                    if (!(window > 0 && j <= i - window)) sum += w[j] = exp(w[j] - mx);
                for (int64_t e = 0; e < hd; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++)
                        if (!(window > 0 && j <= i - window)) acc += w[j] * v[(b * seq + j) * nkv * hd + kh * hd + e];
                    out[(b * seq + i) * nh * hd + h * hd + e] = (float)(acc / sum);
                }
            }
    free(w);
}

/* The whole CUDA sequence (the plan's chunks, its GEMMs, the softmax) run on the host
 * through references, against the op's definition: catches a wrong transpose, leading
 * dimension, stride, offset or mask before any GPU runs it. Budgets force row blocks
 * shorter than seq (keys starting past 0 under a window) and several chunks of sequences
 * and heads. */
static void test_emulated(void)
{
    static const struct { int64_t batch, seq, nh, nkv, hd, window; float softcap; size_t budget; int64_t rb, chunks; } cases[] = {
        {2, 37, 4, 2, 8, 0, 0.0f, QD_ATTN_WORKSPACE_DEFAULT, 37, 1},
        {3, 37, 4, 2, 8, 5, 0.0f, 2800, 19, 2 * 3 * 4},         /* keys from 15 */
        {2, 41, 6, 3, 8, 0, 1.5f, 4 * 41 * 41 * 4, 41, 3}, /* 2 sequences x 2 heads */
        {3, 29, 4, 4, 4, 7, 2.0f, 8 * 14 * 4, 8, 4 * 3 * 4},     /* one (b, h) a chunk */
        {1, 300, 2, 1, 8, 0, 0.0f, QD_ATTN_WORKSPACE_DEFAULT, 256, 2},
    };
    test_rng rng;
    test_rng_seed(&rng, 7);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t batch = cases[ci].batch, seq = cases[ci].seq, nh = cases[ci].nh, nkv = cases[ci].nkv;
        int64_t hd = cases[ci].hd, window = cases[ci].window;
        float softcap = cases[ci].softcap, scale = 1.0f / sqrtf((float)hd);
        size_t nq = (size_t)(batch * seq * nh * hd), nk = (size_t)(batch * seq * nkv * hd);
        float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
        float *out = malloc(nq * sizeof *out), *ref = malloc(nq * sizeof *ref);
        for (size_t i = 0; i < nq; i++) q[i] = 2.0f * test_rng_normal(&rng);
        for (size_t i = 0; i < nk; i++) k[i] = test_rng_normal(&rng);
        for (size_t i = 0; i < nk; i++) v[i] = test_rng_normal(&rng);
        for (size_t i = 0; i < nq; i++) out[i] = NAN;   /* a row no chunk writes stays NaN */
        qd_attn_plan p;
        const char *err = NULL;
        CHECK_OK(qd_attn_plan_make(&p, batch, seq, nh, nkv, hd, window, cases[ci].budget, &err));
        CHECK_INT(p.row_block, cases[ci].rb);
        CHECK_INT(qd_attn_plan_chunks(&p), cases[ci].chunks);
        float *ws = malloc(p.ws_bytes);
        for (int64_t i = 0; i < qd_attn_plan_chunks(&p); i++) {
            qd_attn_chunk c;
            qd_attn_gemm g;
            qd_attn_plan_chunk(&p, i, &c);
            for (int64_t hh = 0; hh < c.nh; hh++) {
                qd_attn_gemm_qk(&p, &c, hh, &g);
                ref_gemm(&g, scale, k, q, ws);
            }
            ref_softmax(&c, window, softcap, ws);
            for (int64_t hh = 0; hh < c.nh; hh++) {
                qd_attn_gemm_pv(&p, &c, hh, &g);
                ref_gemm(&g, 1.0f, v, ws, out);
            }
        }
        naive_attention(q, k, v, batch, seq, nh, nkv, hd, scale, window, softcap, ref);
        double worst = 0;
        for (size_t i = 0; i < nq; i++) {
            double e = fabs((double)out[i] - ref[i]);
            if (!(e <= worst)) worst = e;
        }
        if (!(worst < 1e-5))
            TEST_FAIL_("case %zu (row block %lld, %lld chunks): emulated and naive attention differ by %g", ci,
                       (long long)p.row_block, (long long)qd_attn_plan_chunks(&p), worst);
        test_checks++;
        free(ws);
        free(q);
        free(k);
        free(v);
        free(out);
        free(ref);
    }
}

int main(void)
{
    TEST_RUN(test_coverage);
    TEST_RUN(test_llama_shape);
    TEST_RUN(test_gqa_offsets);
    TEST_RUN(test_key_range);
    TEST_RUN(test_refusals);
    TEST_RUN(test_emulated);
    return test_finish();
}
