/* Private to quant/kernels: scalar decoders of one packed value, shared by the reference
 * matmul and the tails of the CPU kernel, so both read the formats the same way (and the
 * CUDA kernels too: the decoders are kdecode.h's); and the CPU kernel's tile decoder,
 * shared by its matmul and the bulk dequantization. */
#ifndef QUANT_KERNELS_KERNEL_INTERNAL_H
#define QUANT_KERNELS_KERNEL_INTERNAL_H

#include "quant/core/dtype.h"
#include "quant/kernels/kdecode.h"
#include "quant/kernels/kernels.h"

/* The decoders below are the shared host/device ones of kdecode.h, so the reference, the
 * CPU kernels and the CUDA kernels read the formats with the same code. */

/* The kdecode view of m: g_idx only for act-order, perm only for the reordered layout. */
static inline kd_wdesc kmat_desc(const qd_kmat *m)
{
    kd_wdesc d = {m->qweight, m->qzeros, m->scales,
                  m->layout == QD_KMAT_GPTQ && m->act_order ? m->g_idx : NULL,
                  m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL,
                  m->n, m->k, m->group_size, m->bits, m->zero_offset, m->layout == QD_KMAT_AWQ};
    return d;
}

/* The kdecode view of a QD_KMAT_FLOAT weight. */
static inline kd_fdesc kmat_fdesc(const qd_kmat *m)
{
    kd_fdesc d = {m->fcodes, m->fscales, m->n, m->k, m->group_size, m->n_groups, m->row_block,
                  m->global_scale, m->grid == QD_GRID_FP4_E2M1, m->scale_rule == QD_SCALE_FP8_GLOBAL};
    return d;
}

/* Code of qweight row i (a K index in storage order) for output column c. */
static inline int32_t kmat_code(const qd_kmat *m, int64_t i, int64_t c)
{
    if (m->layout == QD_KMAT_AWQ) return kd_awq_code(m->qweight, m->n, i, c);
    return kd_gptq_code(m->qweight, m->n, m->bits, i, c);
}

/* Zero (offset applied) of group g, column c. */
static inline int32_t kmat_zero(const qd_kmat *m, int64_t g, int64_t c)
{
    if (m->layout == QD_KMAT_AWQ) return kd_awq_zero(m->qzeros, m->n, g, c);
    return kd_gptq_zero(m->qzeros, m->n, m->bits, m->zero_offset, g, c);
}

/* Group of qweight row i. */
static inline int64_t kmat_group(const qd_kmat *m, int64_t i)
{
    return kd_group(m->layout == QD_KMAT_GPTQ && m->act_order ? m->g_idx : NULL, m->group_size, i);
}

/* Input feature (column of x) that qweight row i multiplies. */
static inline int64_t kmat_feature(const qd_kmat *m, int64_t i)
{
    return kd_feature(m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL, i);
}

/* Checks the fields every kernel relies on; names the problem. */
int kmat_validate(const qd_kmat *m, qd_err *err);

/* ---- The CPU kernel's tile decoder (kernel_cpu.c), shared by its matmul and the bulk
 * dequantization (kernel_dequant.c), so there is one fast reading of each layout. ---- */

typedef struct kcpu_ctx {
    const qd_kmat *m;
    const float *S, *Z;        /* [G, N] F32 scales and zeros (offset applied); borrowed;
                                  NULL for QD_KMAT_FLOAT, whose decoder reads fscales */
} kcpu_ctx;

#define KCPU_TILE 32           /* K-rows per decoded tile (one 32-value bit block) */

/* Decodes rows [i0, i0 + len) x columns [n0, n0 + 8) into T [len][8] (len <= KCPU_TILE;
 * i0 a multiple of 32 for the gptq layouts). Each weight is S * ((float)q - Z), which is
 * the format's scale * (q - zero) to the bit: both differences are small exact integers.
 * QD_KMAT_FLOAT (kernel_float.c): value(code) * s as kdecode.h's kd_float_weight, and N
 * need not be a multiple of 8: columns past N read as 0 and are never stored. */
typedef void (*kcpu_decode_fn)(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T);

/* 1 when this CPU has AVX2 and FMA. */
int kcpu_have_avx2(void);
/* *avx2 = whether isa runs the AVX2 code here; QD_EUNSUPPORTED when AVX2 is asked for and
 * the CPU lacks it. */
int kcpu_isa_pick(qd_kcpu_isa isa, int *avx2, qd_err *err);
/* The decoder of m's layout. */
kcpu_decode_fn kcpu_decode_pick(const qd_kmat *m, int avx2);
/* The float-grid decoders (kernel_float.c). */
void kcpu_decode_float_portable(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T);
void kcpu_decode_float_avx2(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T);
/* Columns of the tile at n0 that exist (8, or fewer at the end of a float weight's N). */
static inline int kcpu_tile_cols(const qd_kmat *m, int64_t n0) { return m->n - n0 < 8 ? (int)(m->n - n0) : 8; }
/* Fills columns [c0, c1) of the tables S and Z, [G, N] each: the F16 scales widened and
 * the zeros decoded (offset applied), once per group and column. */
void kcpu_tables_fill(const qd_kmat *m, float *S, float *Z, int64_t c0, int64_t c1);

/* The 8 x 8 float transpose in three shuffle stages (kernel_dequant.c): r[j] in, r[l] out,
 * so K-rows become output columns or the reverse. AVX2 callers only. */
#include <immintrin.h>
__attribute__((target("avx2,fma"))) void kd_transpose8_avx2(__m256 r[8]);

#endif
