/* Private to quant/kernels: scalar decoders of one packed value, shared by the reference
 * matmul and the tails of the CPU kernel, so both read the formats the same way. */
#ifndef QUANT_KERNELS_KERNEL_INTERNAL_H
#define QUANT_KERNELS_KERNEL_INTERNAL_H

#include "quant/core/dtype.h"
#include "quant/kernels/kernels.h"

/* AWQ interleave: channel j of a word sits in nibble awq_nibble[j] (ORDER = 0,2,4,6,1,3,5,7). */
static const int kmat_awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* Code of qweight row i (a K index in storage order) for output column c. */
static inline int32_t kmat_code(const qd_kmat *m, int64_t i, int64_t c)
{
    if (m->layout == QD_KMAT_AWQ) {
        uint32_t w = (uint32_t)m->qweight[i * (m->n / 8) + c / 8];
        return (int32_t)((w >> (4 * kmat_awq_nibble[c % 8])) & 0xFu);
    }
    return qd_bits_get(m->bits, m->qweight + c, m->n, i);
}

/* Zero (offset applied) of group g, column c. */
static inline int32_t kmat_zero(const qd_kmat *m, int64_t g, int64_t c)
{
    if (m->layout == QD_KMAT_AWQ) {
        uint32_t w = (uint32_t)m->qzeros[g * (m->n / 8) + c / 8];
        return (int32_t)((w >> (4 * kmat_awq_nibble[c % 8])) & 0xFu);
    }
    return qd_bits_get(m->bits, m->qzeros + g * (m->n * m->bits / 32), 1, c) + m->zero_offset;
}

/* Group of qweight row i. */
static inline int64_t kmat_group(const qd_kmat *m, int64_t i)
{
    if (m->layout == QD_KMAT_GPTQ && m->act_order) return m->g_idx[i];
    return m->group_size > 0 ? i / m->group_size : 0;
}

/* Input feature (column of x) that qweight row i multiplies. */
static inline int64_t kmat_feature(const qd_kmat *m, int64_t i)
{
    return m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm[i] : i;
}

/* Checks the fields every kernel relies on; names the problem. */
int kmat_validate(const qd_kmat *m, qd_err *err);

#endif
