/* The CUDA attention's chunking and offsets (attn_plan.h), host C for every build. */
#include "quant/backend/attn_plan.h"

#include <limits.h>
#include <string.h>

#include "quant/core/error.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Most keys a block of rb query rows sees: the causal prefix, at most rb + window - 1 of
 * it under a window. */
static int64_t keys_max(int64_t seq, int64_t window, int64_t rb)
{
    return window > 0 ? min64(seq, rb + window - 1) : seq;
}

int qd_attn_plan_make(qd_attn_plan *p, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd,
                      int64_t window, size_t budget, const char **err)
{
    memset(p, 0, sizeof *p);
    if (n_kv <= 0 || n_heads <= 0 || n_heads % n_kv != 0) {
        *err = "attention: n_heads must be a positive multiple of n_kv";
        return QD_EINVAL;
    }
    if (hd <= 0 || batch < 0 || seq < 0 || window < 0) {
        *err = "attention: head_dim must be positive and batch, seq, window not negative";
        return QD_EINVAL;
    }
    /* cuBLAS takes int dimensions and leading dimensions. */
    if (hd > INT_MAX / n_heads || seq > INT_MAX || batch > INT_MAX) {
        *err = "attention: n_heads * head_dim, seq or batch exceeds what a cuBLAS int holds";
        return QD_EINVAL;
    }
    p->batch = batch;
    p->seq = seq;
    p->n_heads = n_heads;
    p->n_kv = n_kv;
    p->hd = hd;
    p->window = window;
    p->group = n_heads / n_kv;
    p->ldq = n_heads * hd;
    p->ldk = n_kv * hd;
    if (batch == 0 || seq == 0) return 0;
    int64_t rb = min64(seq, QD_ATTN_ROW_BLOCK);
    /* A smaller row block before a refusal: one row of S is all a chunk must hold. */
    while (rb > 1 && (size_t)(rb * keys_max(seq, window, rb)) * sizeof(float) > budget) rb = (rb + 1) / 2;
    size_t pair_bytes = (size_t)(rb * keys_max(seq, window, rb)) * sizeof(float);
    if (pair_bytes > budget) {
        *err = "attention: the workspace budget holds less than one row of scores";
        return QD_EINVAL;
    }
    int64_t pairs = (int64_t)(budget / pair_bytes);
    /* The softmax grid has one block per row of S: keep the rows of a chunk in an int. */
    if (pairs > INT_MAX / rb) pairs = INT_MAX / rb;
    p->row_block = rb;
    p->seqs = min64(batch, pairs);
    p->heads = min64(n_heads, pairs / p->seqs);
    p->n_row_blocks = (seq + rb - 1) / rb;
    p->n_seq_chunks = (batch + p->seqs - 1) / p->seqs;
    p->n_head_chunks = (n_heads + p->heads - 1) / p->heads;
    p->ws_bytes = (size_t)(p->seqs * p->heads) * pair_bytes;
    return 0;
}

int64_t qd_attn_plan_chunks(const qd_attn_plan *p)
{
    return p->n_row_blocks * p->n_seq_chunks * p->n_head_chunks;
}

void qd_attn_key_range(int64_t window, int64_t i, int64_t *lo)
{
    *lo = window > 0 && i + 1 > window ? i + 1 - window : 0;
}

/* Head chunks innermost: consecutive chunks reread the same sequences' K and V. */
void qd_attn_plan_chunk(const qd_attn_plan *p, int64_t idx, qd_attn_chunk *c)
{
    int64_t hc = idx % p->n_head_chunks, rest = idx / p->n_head_chunks;
    int64_t sc = rest % p->n_seq_chunks, rbi = rest / p->n_seq_chunks;
    c->h0 = hc * p->heads;
    c->nh = min64(p->heads, p->n_heads - c->h0);
    c->b0 = sc * p->seqs;
    c->nb = min64(p->seqs, p->batch - c->b0);
    c->r0 = rbi * p->row_block;
    c->rows = min64(p->row_block, p->seq - c->r0);
    /* The first row of the block sees the fewest keys from the left; the last sees up to
     * itself. */
    qd_attn_key_range(p->window, c->r0, &c->k0);
    c->keys = c->r0 + c->rows - c->k0;
}

int64_t qd_attn_kv_head(const qd_attn_plan *p, int64_t h) { return h / p->group; }

int64_t qd_attn_q_offset(const qd_attn_plan *p, int64_t b, int64_t h, int64_t r)
{
    return (b * p->seq + r) * p->ldq + h * p->hd;
}

int64_t qd_attn_kv_offset(const qd_attn_plan *p, int64_t b, int64_t h, int64_t r)
{
    return (b * p->seq + r) * p->ldk + qd_attn_kv_head(p, h) * p->hd;
}

int64_t qd_attn_s_offset(const qd_attn_chunk *c, int64_t hh, int64_t bb)
{
    return (hh * c->nb + bb) * c->rows * c->keys;
}

/* Row-major S [rows, keys] is column-major S^T; row-major K [keys, hd] (ld ldk) is
 * column-major K^T, hence op T on it; row-major Q [rows, hd] is column-major Q^T. */
void qd_attn_gemm_qk(const qd_attn_plan *p, const qd_attn_chunk *c, int64_t hh, qd_attn_gemm *g)
{
    const int64_t h = c->h0 + hh;
    memset(g, 0, sizeof *g);
    g->trans_a = 1;
    g->m = c->keys;
    g->n = c->rows;
    g->k = p->hd;
    g->batch = c->nb;
    g->a_off = qd_attn_kv_offset(p, c->b0, h, c->k0);
    g->lda = p->ldk;
    g->stride_a = p->seq * p->ldk;
    g->b_off = qd_attn_q_offset(p, c->b0, h, c->r0);
    g->ldb = p->ldq;
    g->stride_b = p->seq * p->ldq;
    g->c_off = qd_attn_s_offset(c, hh, 0);
    g->ldc = c->keys;
    g->stride_c = c->rows * c->keys;
}

/* Row-major O [rows, hd] = P V is column-major O^T = V^T P^T, both operands as stored. */
void qd_attn_gemm_pv(const qd_attn_plan *p, const qd_attn_chunk *c, int64_t hh, qd_attn_gemm *g)
{
    const int64_t h = c->h0 + hh;
    memset(g, 0, sizeof *g);
    g->m = p->hd;
    g->n = c->rows;
    g->k = c->keys;
    g->batch = c->nb;
    g->a_off = qd_attn_kv_offset(p, c->b0, h, c->k0);
    g->lda = p->ldk;
    g->stride_a = p->seq * p->ldk;
    g->b_off = qd_attn_s_offset(c, hh, 0);
    g->ldb = c->keys;
    g->stride_b = c->rows * c->keys;
    g->c_off = qd_attn_q_offset(p, c->b0, h, c->r0);
    g->ldc = p->ldq;
    g->stride_c = p->seq * p->ldq;
}
