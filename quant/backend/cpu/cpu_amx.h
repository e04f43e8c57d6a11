/* The AMX-BF16 implementation behind cpu_bf16.h (cpu_amx.c). Call only after
 * cpu_amx_probe() returned 1 in this process. */
#ifndef QUANT_BACKEND_CPU_AMX_H
#define QUANT_BACKEND_CPU_AMX_H

#include <stdint.h>

/* 1 when this CPU has AMX-BF16 (with AVX-512 BW and BF16), the OS enables the tile state
 * and Linux granted it to this process (the request is made here); 0 otherwise. */
int cpu_amx_probe(void);

/* C[m, n] = A[m, k] B[n, k]^T over bf16-rounded inputs. 0, or -1 when scratch cannot be
 * allocated (C unchanged). */
int cpu_amx_gemm_nt(int n_threads, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc);

/* H = beta H + alpha X^T X over bf16-rounded X [rows, k] (alpha > 0), on the 32 x 32
 * blocks of H [k, k] on or above the diagonal; the rest of H is left scaled by beta.
 * 0, or -1 as above (H unchanged). */
int cpu_amx_syrk(int n_threads, int64_t k, const float *x, int64_t rows, int64_t ldx, float alpha,
                 float beta, float *h);

#endif
