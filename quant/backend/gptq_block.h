/* The arguments of the backend's gptq_block op: GPTQ's inner loop over one block of
 * columns [i1, i2) (Algorithm 1 of Frantar et al., the `for i in range(count)` loop of the
 * reference gptq.py), with everything in processing order (columns already permuted when
 * act-order is on).
 *
 * For every row r (rows are independent inside a block, so an implementation may process
 * them in any order or in parallel) and each column j = i1 .. i2-1 in turn:
 *   g      = col_group[j]; s = scales[g*n + r]; z = zeros[g*n + r]
 *   code   = qd_quant_code(w1[j], s, z, maxq); qv = qd_quant_dequant(code, s, z)
 *   e      = (w1[j] - qv) / hinv[j][j]
 *   w1[c] -= e * hinv[j][c]            for c = j+1 .. i2-1
 *   err[r][j - i1] = e; codes[r][j] = code; w[r][j] = qv
 * where w1 is a private copy of w[r][i1:i2] taken when the block starts. The op therefore
 * leaves the dequantized weights Q in w's columns [i1, i2); the caller then applies the
 * lazy trailing update w[:, i2:] -= err @ hinv[i1:i2, i2:] with gemm.
 *
 * Group parameters. With find_params set, a group whose first column j (j % group_size ==
 * 0, dynamic groups) lies in [i1, i2) gets its scale and zero from qd_quant_params over
 * w[r][j : min(j + group_size, k)] as w stands when the block starts: the columns of the
 * current block before this block's in-block updates, later columns after all earlier
 * trailing updates. That is exactly what the reference does (it calls find_params on W,
 * not on the block copy W1). Otherwise (static groups, or one group for all of K) the
 * parameters are given and only read. With cfg->scale_search mse, "qd_quant_params" is
 * qd_quant_params_w with col_weight[j .. j + len) as the weights.
 *
 * LDL form (ldl set; only backends with the chol_ldl_upper op see it). The same algorithm
 * without H^-1 (the "LDLQ" of Chee et al., equal to GPTQ in exact arithmetic): with
 * H = R R^T, R upper, and A = R diag(R)^-1 (what chol_ldl_upper leaves in hinv), GPTQ's
 * updated weights are w_hat[j] = w[j] + sum_{c<j} (w[c] - q[c]) A[c][j] with the ORIGINAL
 * w, so w is not updated in place: the corrections sum_{c<j} ... live in acc. Per row:
 *   w1     = w[r][i1:i2] + acc[r][i1:i2]   (acc NULL: no corrections yet, w1 = w)
 *   code   = qd_quant_code(w1[j], s, z, maxq); qv = qd_quant_dequant(code, s, z)
 *   e      = w[r][j] - qv                  (the original weight; no division)
 *   w1[c] += e * hinv[j][c]                for c = j+1 .. i2-1
 *   err[r][j - i1] = e; codes[r][j] = code; w[r][j] = qv
 * and dynamic group parameters come from w + acc over the group's columns (the updated
 * weights as the block starts, as above). The caller's trailing update is then
 * acc[:, i2:] += err @ hinv[i1:i2, i2:]. There hinv's diagonal is not 1 but D_jj = R_jj^2
 * (H = A D A^T, chol_ldl_upper), which only the column losses below read.
 *
 * Column losses (loss not NULL; host backends only). Per row, with x the updated weight
 * w1[j] as quantized and qv its dequantized value:
 *   loss[r] += (x - qv)^2 * D_jj       LDL form
 *   loss[r] += e^2                     U form, e = (x - qv) / hinv[j][j]
 * summed over the block's columns (in float, added to the double once per block). Over
 * all blocks sum_r loss[r] = tr((W - Q) H (W - Q)^T) for the H that was factored (GPTQ's
 * own objective, the OBS loss of every column), in exact arithmetic. All pointers are
 * backend memory. */
#ifndef QUANT_BACKEND_GPTQ_BLOCK_H
#define QUANT_BACKEND_GPTQ_BLOCK_H

#include <stdint.h>

#include "quant/formats/quantizer.h"

typedef struct qd_gptq_block_args {
    const qd_quant_cfg *cfg;   /* host struct: bits, sym, group_size, f16_scales, zero_min1 */
    int64_t n, k;              /* W is [n, k] */
    int64_t i1, i2;            /* the block's columns */
    float *w;                  /* [n, ldw]: read, columns [i1, i2) overwritten with Q */
    int64_t ldw;
    const float *hinv;         /* [k, ldh]: upper Cholesky factor U of H^-1 (H^-1 = U^T U) */
    int64_t ldh;
    float *err;                /* out [n, lde]: the scaled errors of the block, columns 0 .. i2-i1-1 */
    int64_t lde;
    uint8_t *codes;            /* out [n, ldc]: codes, columns [i1, i2) written */
    int64_t ldc;
    float *scales;             /* [G, n]: read, and written for groups found here */
    float *zeros;              /* [G, n]: likewise (integer-valued floats) */
    const int32_t *col_group;  /* [k]: the group whose parameters quantize column j */
    int find_params;           /* 1: dynamic groups, found at each group's first column */
    int ldl;                   /* 1: the LDL form (above); 0: the U form */
    const float *acc;          /* ldl: [n, lda] corrections to w, or NULL (all zero) */
    int64_t lda;
    float *q;                  /* or NULL: Q goes to q [n, ldq], columns [i1, i2), instead of
                                * into w, which the op then only reads (the LDL form reads
                                * only the original w, so the caller needs no working copy) */
    int64_t ldq;
    double *loss;              /* or NULL: [n] column losses added per row (above) */
    const float *col_weight;   /* or NULL: [k] per-column weights of the scale search's error
                                * (cfg->scale_search mse, dynamic groups; NULL: all 1) */
} qd_gptq_block_args;

#endif
