/* Private to the CPU backend: the op implementations, split by concern across files.
 * cpu_backend.c assembles them into the qd_backend_ops table:
 *   cpu_backend.c  memory, gemm, hessian_accum, chol_inverse_upper, chol_ldl_upper
 *   cpu_exp.c      exp over arrays for softmax and SiLU (portable, AVX2 and AVX-512 loops)
 *   cpu_gptq.c     gptq_block (portable, AVX2 and AVX-512 kernels)
 *   cpu_mem.c      large blocks kept for reuse by alloc/free
 *   cpu_quant.c    fake_quant, scale_cols, sq_diff_sum
 *   cpu_nn.c       rmsnorm, layernorm, rope, attention, activations, add, nll_rows */
#ifndef QUANT_BACKEND_CPU_INTERNAL_H
#define QUANT_BACKEND_CPU_INTERNAL_H

#include "quant/backend/backend.h"
#include "quant/backend/cpu/cpu_mem.h"

struct qd_gptq_block_args;

/* The GPTQ block kernel for rows [r0, r1) of a block (see cpu_gptq_block), with per-thread
 * scratch (CPU_GPTQ_SCRATCH in cpu_gptq.c). */
typedef void (*cpu_gptq_rows_fn)(const struct qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch);

/* The backend's private state (be->impl), owned by the backend. */
typedef struct cpu_impl {
    cpu_gptq_rows_fn gptq_rows; /* chosen once at open (cpu_gptq_rows_pick) */
    cpu_mem mem;                /* large blocks kept for reuse (cpu_mem.h) */
} cpu_impl;

/* cpu_backend.c: frees the backend, its cached blocks included (qd_backend_close). */
void qd_backend_cpu_close(qd_backend *be);
/* cpu_backend.c: 1 when "compute": "bf16" runs on the AMX tiles (cpu_bf16.h): the CPU has
 * them and the runtime options leave the CPU kernels at auto. */
int cpu_amx_on(const qd_backend *be);
/* cpu_backend.c: copies the upper triangle of the row-major k x k matrix h onto its lower one. */
void cpu_symmetrize_from_upper(float *h, int64_t k);

/* cpu_gptq.c: the gptq_block op, and the rows kernel for this CPU and the runtime options' choice. */
int cpu_gptq_block(qd_backend *be, const struct qd_gptq_block_args *a);
cpu_gptq_rows_fn cpu_gptq_rows_pick(qd_cpu_kernel kernel);

/* cpu_quant.c */
int cpu_fake_quant(qd_backend *be, const struct qd_quant_cfg *cfg, float *w, int64_t n, int64_t k);
int cpu_scale_cols(qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, int inverse);
int cpu_sq_diff_sum(qd_backend *be, const float *a, const float *b, int64_t n, double *out);

/* cpu_nn.c */
int cpu_rmsnorm(qd_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps);
int cpu_layernorm(qd_backend *be, float *y, const float *x, const float *w, const float *b,
                  int64_t rows, int64_t dim, float eps);
int cpu_rope(qd_backend *be, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim,
             const int32_t *pos, const qd_rope_freqs *f);
int cpu_attention(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                  int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                  int64_t window, float softcap);
/* The same with both products on bf16-rounded inputs (Q, K; P, V), F32 sums: the AMX tiles
 * where cpu_amx_on(be), else rounded copies through OpenBLAS. The softmax stays F32. */
int cpu_attention_bf16(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                       int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                       int64_t window, float softcap);
int cpu_silu_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n);
int cpu_gelu_tanh_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n);
int cpu_softcap(qd_backend *be, float *x, int64_t n, float cap);
int cpu_relu(qd_backend *be, float *x, int64_t n);
int cpu_gelu(qd_backend *be, float *x, int64_t n);
int cpu_add(qd_backend *be, float *y, const float *x, int64_t n);
int cpu_add_bias(qd_backend *be, float *y, const float *bias, int64_t rows, int64_t cols);
int cpu_nll_rows(qd_backend *be, const float *logits, const int32_t *targets, int64_t rows,
                 int64_t vocab, double *nll_host);

#endif
