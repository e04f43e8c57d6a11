/* Private to quant/kernels: scalar decoders of one packed value, shared by the reference
 * matmul and the tails of the CPU kernel, so both read the formats the same way (and the
 * CUDA kernels too: the decoders are kdecode.h's). */
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

#endif
