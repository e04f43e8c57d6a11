/* DeepSeek-V3.2's sparse-attention indexer (DSA), as transformers' DeepseekV32Indexer computes
 * it in float32 (its bf16 form, without the reference's Hadamard rotation, which keeps dot
 * products, and FP8 scoring, a precision shortcut):
 *   q = wq_b(q_resid) as index_n_heads heads of index_head_dim, k = LayerNorm(wk(x), k_norm,
 *   eps 1e-6), one key per token; RoPE, the HALF-SPLIT kind (unlike MLA's interleaved), on
 *   the first qk_rope_head_dim dims of each q head and of k, with MLA's frequencies;
 *   score(i, j) = sum_h w(i, h) n_heads^-1/2 * relu(q(i, h) . k(j) index_head_dim^-1/2),
 *   w = weights_proj(x); query i attends the index_topk best of its causal keys j <= i (all
 *   of them when it has no more than index_topk).
 * The scores are the backend's dsa_scores op (float32, the dot over the dims then the heads);
 * the choice is made on the host, as the MoE routers' is. Ties: the lower key index wins (the
 * goldens have none at the boundary; torch.topk's order among equal scores is its own).
 * wq_b is a quantized linear of the block (group q_latent); wk, weights_proj and k_norm are
 * float tensors (bw->dsa_w), as vLLM loads them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

#define DSA_NORM_EPS 1e-6f

static const char *const dsa_names[4] = {"self_attn.indexer.wk.weight", "self_attn.indexer.weights_proj.weight",
                                         "self_attn.indexer.k_norm.weight", "self_attn.indexer.k_norm.bias"};

int qd_dsa_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t wk[2] = {c->index_head_dim, c->hidden}, wp[2] = {c->index_heads, c->hidden};
    const int64_t *shapes[4] = {wk, wp, &c->index_head_dim, &c->index_head_dim};
    char name[512];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    for (int i = 0; i < 4; i++) {
        snprintf(name + n, sizeof name - n, "%s", dsa_names[i]);
        const st_tensor *t;
        int rc = bw ? qd_model_load_f32(m, name, i < 2 ? 2 : 1, shapes[i], &bw->dsa_w[i], err)
                    : qd_model_find_float(m, name, i < 2 ? 2 : 1, shapes[i], &t, err);
        if (rc) return rc;
    }
    return 0;
}

uint64_t qd_dsa_bytes(const qd_model *m)
{
    const qd_model_config *c = &m->cfg;
    if (!m->arch->lin_idx_q) return 0;
    return (uint64_t)((c->index_head_dim + c->index_heads) * c->hidden + 2 * c->index_head_dim) * sizeof(float);
}

const char *qd_model_dsa_float(const qd_model *m, int j)
{
    static const char *const mods[2] = {"self_attn.indexer.wk", "self_attn.indexer.weights_proj"};
    return m->arch->lin_idx_q && j >= 0 && j < 2 ? mods[j] : NULL;
}

typedef struct dsa_cand { float s; int32_t j; } dsa_cand;

/* Larger score first; the lower key on a tie. */
static int cand_cmp(const void *a, const void *b)
{
    const dsa_cand *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

#define BE_TRY(call, what) do { int _rc = (call); \
    if (_rc) { rc = qd_err_set(err, _rc, "block %d indexer %s: %s", bw->block, (what), m->be->err.msg); goto done; } } while (0)

int qd_dsa_keep(qd_model *m, const qd_block_weights *bw, const float *xn, const float *q_resid, int64_t batch,
                int64_t seq, const int32_t *pos_be, const qd_rope_freqs *rf, const qd_block_hooks *hooks,
                uint8_t *keep, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    qd_backend *be = m->be;
    int64_t rows = batch * seq, IH = c->index_heads, ID = c->index_head_dim, R = c->qk_rope_dim, H = c->hidden;
    size_t f = sizeof(float);
    float *q_be = qd_backend_alloc(be, (size_t)(rows * IH * ID) * f), *k_be = qd_backend_alloc(be, (size_t)(rows * ID) * f);
    float *w_be = qd_backend_alloc(be, (size_t)(rows * IH) * f), *r_be = qd_backend_alloc(be, (size_t)(rows * (IH + 1) * R) * f);
    float *hq = malloc((size_t)(rows * IH * ID) * f), *hk = malloc((size_t)(rows * ID) * f);
    float *hr = malloc((size_t)(rows * (IH + 1) * R) * f);
    float *s_be = qd_backend_alloc(be, (size_t)(rows * seq) * f), *score = malloc((size_t)(rows * seq) * f);
    dsa_cand *cand = malloc((size_t)seq * sizeof *cand);
    uint8_t *hkeep = calloc((size_t)(rows * seq), 1);
    int rc = 0;
    if (!q_be || !k_be || !w_be || !r_be || !s_be || !hq || !hk || !hr || !score || !cand || !hkeep) {
        rc = qd_err_set(err, QD_ENOMEM, "block %d: out of memory for the indexer", bw->block);
        goto done;
    }
    /* q = wq_b(q_resid) (quantized; the q_latent group's input hook has seen q_resid);
     * k = k_norm(wk(x)); w = weights_proj(x). */
    if ((rc = qd_fwd_linear_part(m, bw, m->arch->lin_idx_q, 0, IH * ID, q_resid, rows, q_be, hooks, err))) goto done;
    BE_TRY(be->ops->gemm(be, 0, 1, rows, ID, H, 1.0f, xn, H, bw->dsa_w[0], H, 0.0f, k_be, ID), "wk");
    BE_TRY(be->ops->layernorm(be, k_be, k_be, bw->dsa_w[2], bw->dsa_w[3], rows, ID, DSA_NORM_EPS), "k_norm");
    BE_TRY(be->ops->gemm(be, 0, 1, rows, IH, H, 1.0f, xn, H, bw->dsa_w[1], H, 0.0f, w_be, IH), "weights_proj");
    BE_TRY(qd_backend_download(be, hq, q_be, (size_t)(rows * IH * ID) * f), "q: download");
    BE_TRY(qd_backend_download(be, hk, k_be, (size_t)(rows * ID) * f), "k: download");
    /* Half-split RoPE on the first R dims: q heads [rows, IH, R], then k [rows, 1, R]. */
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < IH; h++) memcpy(hr + (t * IH + h) * R, hq + (t * IH + h) * ID, (size_t)R * f);
        memcpy(hr + rows * IH * R + t * R, hk + t * ID, (size_t)R * f);
    }
    BE_TRY(qd_backend_upload(be, r_be, hr, (size_t)(rows * (IH + 1) * R) * f), "rope: upload");
    BE_TRY(be->ops->rope(be, r_be, rows, IH, R, pos_be, rf), "rope q");
    BE_TRY(be->ops->rope(be, r_be + rows * IH * R, rows, 1, R, pos_be, rf), "rope k");
    BE_TRY(qd_backend_download(be, hr, r_be, (size_t)(rows * (IH + 1) * R) * f), "rope: download");
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < IH; h++) memcpy(hq + (t * IH + h) * ID, hr + (t * IH + h) * R, (size_t)R * f);
        memcpy(hk + t * ID, hr + rows * IH * R + t * R, (size_t)R * f);
    }
    /* Scores on the backend, the choice per sequence and query on the host. */
    BE_TRY(qd_backend_upload(be, q_be, hq, (size_t)(rows * IH * ID) * f), "q: upload");
    BE_TRY(qd_backend_upload(be, k_be, hk, (size_t)(rows * ID) * f), "k: upload");
    BE_TRY(be->ops->dsa_scores(be, s_be, q_be, k_be, w_be, batch, seq, IH, ID, (float)(1.0 / sqrt((double)ID)),
                               (float)(1.0 / sqrt((double)IH))), "scores");
    BE_TRY(qd_backend_download(be, score, s_be, (size_t)(rows * seq) * f), "scores: download");
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < seq; i++) {
            uint8_t *kr = hkeep + (b * seq + i) * seq;
            if (i + 1 <= c->index_topk) { memset(kr, 1, (size_t)(i + 1)); continue; }
            for (int64_t j = 0; j <= i; j++) {
                cand[j].s = score[(b * seq + i) * seq + j];
                cand[j].j = (int32_t)j;
            }
            qsort(cand, (size_t)(i + 1), sizeof *cand, cand_cmp);
            for (int64_t r = 0; r < c->index_topk; r++) kr[cand[r].j] = 1;
        }
    BE_TRY(qd_backend_upload(be, keep, hkeep, (size_t)(rows * seq)), "keep: upload");
done:
    qd_backend_free(be, q_be); qd_backend_free(be, k_be); qd_backend_free(be, w_be); qd_backend_free(be, r_be);
    qd_backend_free(be, s_be);
    free(hq); free(hk); free(hr); free(score); free(cand); free(hkeep);
    return rc;
}
