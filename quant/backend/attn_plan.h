/* The host-side plan of the CUDA attention (quant/backend/cuda/cuda_attention.cu), plain C
 * so that every build tests it (tests/unit/test_attn_plan.c). The attention runs as
 * batched GEMMs: per chunk of (query rows, sequences, heads), S = scale Q K^T by one
 * strided-batched GEMM per head over the chunk's sequences, a softmax kernel over each row
 * of S (causal mask, sliding window, soft-cap), then O = P V the same way. Query rows go in
 * blocks of row_block so that a block ending at row r1 multiplies only against the keys it
 * can see ([k0, r1): the causal prefix, cut by the window); the S of a chunk lives in one
 * workspace whose size the plan bounds. Grouped-query heads need no copy of K or V: query
 * head h reads kv head h / (n_heads / n_kv) through its offset (qd_attn_kv_offset). */
#ifndef QUANT_BACKEND_ATTN_PLAN_H
#define QUANT_BACKEND_ATTN_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* Query rows per block: small enough that the causal mask saves work (at 2048 tokens the
 * eight blocks multiply 56% of the full square), large enough that each GEMM stays big. */
#define QD_ATTN_ROW_BLOCK 256
/* The S workspace a call may take by default (device memory). */
#define QD_ATTN_WORKSPACE_DEFAULT ((size_t)256 << 20)

typedef struct qd_attn_plan {
    int64_t batch, seq, n_heads, n_kv, hd, window;
    int64_t group;        /* n_heads / n_kv: query heads per kv head */
    int64_t ldq, ldk;     /* row strides of q/out (n_heads * hd) and of k/v (n_kv * hd) */
    int64_t row_block;    /* query rows per block */
    int64_t seqs, heads;  /* sequences and query heads per chunk */
    int64_t n_row_blocks, n_seq_chunks, n_head_chunks;
    size_t ws_bytes;      /* workspace the largest chunk needs; <= the budget */
} qd_attn_plan;

/* One chunk: sequences [b0, b0 + nb), query heads [h0, h0 + nh), query rows [r0, r0 + rows),
 * keys [k0, k0 + keys). Its S is nh x nb matrices of rows x keys floats, head-major:
 * matrix (hh, bb) at float offset qd_attn_s_offset(c, hh, bb). */
typedef struct qd_attn_chunk {
    int64_t b0, nb, h0, nh, r0, rows, k0, keys;
} qd_attn_chunk;

/* Plans attention over batch x seq tokens with S in at most budget bytes. 0, or QD_EINVAL
 * with *err set (n_heads not a multiple of n_kv, a non-positive size, a dimension a cuBLAS
 * int cannot hold, a budget below one row of S). batch or seq 0 plan no chunk. */
int qd_attn_plan_make(qd_attn_plan *p, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd,
                      int64_t window, size_t budget, const char **err);
/* Number of chunks; chunk idx in [0, that) is written to *c. */
int64_t qd_attn_plan_chunks(const qd_attn_plan *p);
void qd_attn_plan_chunk(const qd_attn_plan *p, int64_t idx, qd_attn_chunk *c);

/* The keys query row i sees: [*lo, i + 1). window > 0 keeps the last `window` of them. */
void qd_attn_key_range(int64_t window, int64_t i, int64_t *lo);
/* The kv head of query head h. */
int64_t qd_attn_kv_head(const qd_attn_plan *p, int64_t h);
/* Element offsets of row r of sequence b, head h: in q and out, and in k and v. */
int64_t qd_attn_q_offset(const qd_attn_plan *p, int64_t b, int64_t h, int64_t r);
int64_t qd_attn_kv_offset(const qd_attn_plan *p, int64_t b, int64_t h, int64_t r);
/* Float offset of the S matrix of chunk-local head hh and sequence bb. */
int64_t qd_attn_s_offset(const qd_attn_chunk *c, int64_t hh, int64_t bb);


/* One strided-batched GEMM as cublasSgemmStridedBatched takes it (column-major): for i in
 * [0, batch), C_i (m x n, ld ldc) = alpha op(A_i) op(B_i) with op T where trans_*, A_i at
 * element a_off + i * stride_a of its tensor, and so on. Written here so that the host test
 * runs the same GEMMs through a reference (tests/unit/test_attn_plan.c). */
typedef struct qd_attn_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, batch;
    int64_t a_off, lda, stride_a, b_off, ldb, stride_b, c_off, ldc, stride_c;
} qd_attn_gemm;

/* Head hh of the chunk, its sequences batched. S^T (keys x rows, ld keys) = K Q^T: A is k
 * (op T), B is q, C the workspace; alpha is the op's scale. */
void qd_attn_gemm_qk(const qd_attn_plan *p, const qd_attn_chunk *c, int64_t hh, qd_attn_gemm *g);
/* O^T (hd x rows, ld ldq) = V^T P^T: A is v, B the workspace, C out; alpha 1. */
void qd_attn_gemm_pv(const qd_attn_plan *p, const qd_attn_chunk *c, int64_t hh, qd_attn_gemm *g);

#endif
