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

/* One thread's small products, for callers that split the work themselves (the attention):
 * B packed once into tiles, then any number of products against it.
 *   cpu_amx_packed_elems: bf16 elements of the packed form of a B with n columns of C and
 *     k products per element (allocate that many uint16_t, 64-byte aligned);
 *   cpu_amx_pack_nk: B [n, k] (ldb), each row a column of C (a linear's W, attention's K);
 *   cpu_amx_pack_kn: B [k, n] (ldb), each row one k (attention's V);
 *   cpu_amx_gemm_packed: C[m, n] = alpha A[m, k] B^T over bf16-rounded A and B, B packed
 *     for k_packed >= k (only its first k rows of products are used); scratch holds
 *     32 * roundup(k, 32) bf16. */
int64_t cpu_amx_packed_elems(int64_t n, int64_t k);
void cpu_amx_pack_nk(const float *b, int64_t n, int64_t k, int64_t ldb, uint16_t *bp);
void cpu_amx_pack_kn(const float *b, int64_t k, int64_t n, int64_t ldb, uint16_t *bp);
void cpu_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const uint16_t *bp,
                         int64_t k_packed, float alpha, float *c, int64_t ldc, uint16_t *scratch);

#endif
