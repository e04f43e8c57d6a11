/* Private to the CPU backend: the op implementations, split by concern across files.
 * cpu_backend.c assembles them into the qd_backend_ops table. Every op is cpu_<name>,
 * declared below from backend.h's op lists:
 *   cpu_backend.c  memory, gemm, hessian_accum, chol_inverse_upper, chol_ldl_upper, the
 *                  bfloat16 products (cpu_bf16.c, cpu_amx.c), trim
 *   cpu_exp.c      exp over arrays for softmax and SiLU (portable, AVX2 and AVX-512 loops)
 *   cpu_gptq.c     gptq_block (portable, AVX2 and AVX-512 kernels)
 *   cpu_mem.c      large blocks kept for reuse by alloc/free
 *   cpu_quant.c    fake_quant, scale_cols, sq_diff_sum
 *   cpu_nn.c       rmsnorm, layernorm, rope, attention (and attention_bf16), activations,
 *                  add, gather_rows, scatter_add_rows, nll_rows */
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

/* cpu_gptq.c: the rows kernel for this CPU and the runtime options' choice. */
cpu_gptq_rows_fn cpu_gptq_rows_pick(qd_cpu_kernel kernel);
const char *cpu_gptq_rows_name(cpu_gptq_rows_fn f);   /* "avx512", "avx2", "portable" */

/* The ops (backend.h's lists), cpu_<name> each. */
#define CPU_OP_DECLARE(ret, name, params) ret cpu_##name params;
QD_BACKEND_OPS_REQUIRED(CPU_OP_DECLARE)
QD_BACKEND_OPS_OPTIONAL(CPU_OP_DECLARE)
#undef CPU_OP_DECLARE

#endif
