/* Products with bfloat16 inputs and F32 sums, for the job's "compute": "bf16" (the
 * calibration forward's projections and the GPTQ Hessians).
 *
 * The arithmetic is defined, whatever runs it: every input element is rounded to bfloat16
 * (nearest, ties to even; a subnormal input becomes a zero of its sign, as the hardware's
 * conversion does), each product of two such values is exact in F32, and the products are
 * summed in F32. Only the summation order differs between the two implementations:
 *   - AMX-BF16 (Intel Sapphire Rapids and later, when Linux grants the tile state): the
 *     tile unit's TDPBF16PS, 16 x 16 F32 tiles over k in steps of 32 in order. Each output
 *     element is summed by one tile in a fixed order, so the result does not depend on
 *     the thread count;
 *   - elsewhere: rounded F32 copies through OpenBLAS's sgemm / ssyrk (no speed gain; it
 *     keeps a job's arithmetic the same on any CPU).
 * tests/unit/test_cpu_bf16.c holds the scalar reference both are checked against.
 *
 * Inputs must be finite (the callers check or produce them); nothing here allocates more
 * than a bounded scratch per thread and the packed copy of one weight matrix. */
#ifndef QUANT_BACKEND_CPU_BF16_H
#define QUANT_BACKEND_CPU_BF16_H

#include <stdint.h>

/* 1 when AMX-BF16 is present, enabled by the OS and granted to this process (asked once,
 * with arch_prctl); 0 otherwise. The backend uses the tiles only when its runtime options
 * leave cpu_kernel at auto (QUANTD_CPU_KERNEL=portable turns them off). */
int cpu_bf16_amx_usable(void);

/* The bfloat16 value of f (round to nearest even, subnormals to signed zero), as an F32. */
float cpu_bf16_round(float f);
/* dst [rows, cols] (dense) = src [rows, cols] (row stride ld), every element cpu_bf16_round. */
void cpu_bf16_round_rows(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld);

/* C[m, n] = A[m, k] B[n, k]^T (both operands row-major with their k contiguous: a linear's
 * y = x W^T). 0, or QD_ENOMEM with C unchanged. amx: 1 = the tile unit (only when
 * cpu_bf16_amx_usable()), 0 = the portable path; callers pass cpu_bf16_amx_usable(). */
int cpu_bf16_gemm_nt(int amx, int n_threads, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc);

/* H = beta H + alpha X^T X for X [rows, k] (row stride ldx) and H [k, k] row-major, full
 * symmetric on entry and on return (the upper triangle is computed, then mirrored).
 * 0, or QD_ENOMEM with H unchanged. */
int cpu_bf16_syrk(int amx, int n_threads, int64_t k, const float *x, int64_t rows, int64_t ldx,
                  float alpha, float beta, float *h);

#endif
