/* Private to the CPU backend: the op implementations, split by concern across files.
 * cpu_backend.c assembles them into the qd_backend_ops table:
 *   cpu_backend.c  memory, gemm, hessian_accum, chol_inverse_upper, gptq_block
 *   cpu_mem.c      large blocks kept for reuse by alloc/free
 *   cpu_quant.c    fake_quant, scale_cols, sq_diff_sum
 *   cpu_nn.c       rmsnorm, layernorm, rope, attention, activations, add, nll_rows */
#ifndef QUANT_BACKEND_CPU_INTERNAL_H
#define QUANT_BACKEND_CPU_INTERNAL_H

#include "quant/backend/backend.h"
#include "quant/backend/cpu/cpu_mem.h"

/* cpu_backend.c: frees the backend, its cached blocks included (qd_backend_close). */
void qd_backend_cpu_close(qd_backend *be);

/* cpu_quant.c */
int cpu_fake_quant(qd_backend *be, const struct qd_quant_cfg *cfg, float *w, int64_t n, int64_t k);
int cpu_scale_cols(qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, int inverse);
int cpu_sq_diff_sum(qd_backend *be, const float *a, const float *b, int64_t n, double *out);

/* cpu_nn.c */
int cpu_rmsnorm(qd_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps);
int cpu_layernorm(qd_backend *be, float *y, const float *x, const float *w, const float *b,
                  int64_t rows, int64_t dim, float eps);
int cpu_rope(qd_backend *be, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim,
             int64_t rot_dim, const int32_t *pos, float theta);
int cpu_attention(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                  int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale);
int cpu_silu_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n);
int cpu_relu(qd_backend *be, float *x, int64_t n);
int cpu_gelu(qd_backend *be, float *x, int64_t n);
int cpu_add(qd_backend *be, float *y, const float *x, int64_t n);
int cpu_add_bias(qd_backend *be, float *y, const float *bias, int64_t rows, int64_t cols);
int cpu_nll_rows(qd_backend *be, const float *logits, const int32_t *targets, int64_t rows,
                 int64_t vocab, double *nll_host);

#endif
