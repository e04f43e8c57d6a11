/* GPTQ (Frantar et al., ICLR 2023) for one linear layer, with the semantics of the
 * reference gptq.py (IST-DASLab) and AutoGPTQ's act-order and static groups:
 *
 *   dead columns (H[i][i] == 0): H[i][i] = 1, W[:, i] = 0
 *   static groups: parameters of group g found up front on W[:, g*gs : (g+1)*gs] (original
 *     column order, dead columns zeroed)
 *   act-order: perm = stable argsort(diag H) descending; W and H permuted
 *   damp = damp_percent * mean(diag H) added to the diagonal; Hinv = upper Cholesky factor
 *     of H^-1 (cholesky, cholesky_inverse, cholesky upper)
 *   blocks of block_size columns: the in-block loop (backend gptq_block op), then the lazy
 *     trailing update W[:, i2:] -= Err @ Hinv[i1:i2, i2:] (backend gemm)
 *   dynamic groups: each group's parameters found when the loop reaches its first column,
 *     on W as it then stands (earlier blocks' updates included)
 *   g_idx[k] = (position of k in perm) / gs, or k / gs without act-order or with static
 *     groups; scales/zeros are numbered by group.
 *
 * When the Cholesky factorisation fails the damping grows x10 up to max_damp_retries
 * times; when every try fails the layer falls back to round-to-nearest and the result says
 * so. Non-finite weights or Hessian entries are QD_ENUMERIC; no output is ever NaN. */
#ifndef QUANT_ALGO_GPTQ_H
#define QUANT_ALGO_GPTQ_H

#include <stdatomic.h>
#include <stdint.h>

#include "quant/algo/hessian.h"
#include "quant/backend/backend.h"
#include "quant/core/error.h"
#include "quant/formats/qlayer.h"
#include "quant/formats/quantizer.h"

typedef struct qd_gptq_opts {
    qd_quant_cfg quant;        /* bits, sym, group_size, f16_scales, zero_min1 (clip must be 1) */
    double damp_percent;       /* in (0, 1); 0.01 */
    int desc_act;              /* act-order */
    int static_groups;         /* group parameters from the unpermuted weights, up front */
    int64_t block_size;        /* lazy-update block; 128 */
    int max_damp_retries;      /* x10 damping retries before RTN; 3 */
    const atomic_int *stop;    /* nonzero (set by another thread) stops the column loop at its
                                  next block: QD_ECANCELLED; NULL: never */
} qd_gptq_opts;

/* 4 bits, sym, group 128, damp 0.01, no act-order, block 128, 3 retries. */
qd_gptq_opts qd_gptq_opts_default(void);
/* "damp_percent: 1.5 is not in (0, 1)", ... */
int qd_gptq_opts_validate(const qd_gptq_opts *o, qd_err *err);

typedef struct qd_gptq_result {
    qd_qlayer layer;           /* codes, F16-representable scales, zeros, g_idx; owned */
    float *deq;                /* [N*K] the dequantized weights Q (what the codes decode to); owned */
    qd_backend *deq_be;        /* deq came from this CPU backend's cached blocks (NULL: malloc):
                                * free the result before closing that backend */
    double damp_percent;       /* the damping fraction that succeeded (the last one tried on fallback) */
    double damp;               /* the absolute value added to diag(H) */
    int damp_retries;          /* extra tries needed (0: the first damping worked) */
    int fallback_rtn;          /* 1: every Cholesky failed and the layer is round-to-nearest */
    int64_t dead_columns;      /* columns with H[i][i] == 0 */
    double h_err;              /* tr((W - Q) H (W - Q)^T) for the caller's W and H, from GPTQ's
                                * own column losses (no extra pass over H); -1 where they are
                                * not kept (device backends, the RTN fallback) */
    double seconds;            /* damping, Cholesky and the column loop given H */
} qd_gptq_result;

/* One Hessian's factorisation shared by the linears that read the same input (q/k/v,
 * gate/up): the factor depends only on H, act-order and the damping, so the first
 * qd_gptq_quantize_shared of a group computes it (damping retries included, or finds that
 * every try fails and falls back to RTN) and the next ones with the same accumulator, as
 * many rows folded in, and the same options reuse it. Zero-initialise; the factor is
 * backend memory of the backend that made it; qd_gptq_shared_free releases it (call it
 * before that backend closes and before the accumulator changes). */
typedef struct qd_gptq_shared {
    const void *key;           /* the accumulator (or H) it was made from; NULL: empty */
    int64_t k, n_seen;
    int desc_act, max_damp_retries;
    double damp_opt;           /* the damp_percent option asked for */
    qd_backend *be;
    float *fac;                /* the factor (LDL's A or H^-1's U), backend memory; owned */
    int ldl;                   /* the form fac is in */
    int factored;              /* 0: every damping failed (RTN) */
    double damp_percent, damp;
    int damp_retries;
} qd_gptq_shared;
void qd_gptq_shared_free(qd_gptq_shared *s);   /* accepts NULL; leaves s empty */
/* Makes into *sh (emptied first) the factorisation of acc's H that qd_gptq_quantize_shared
 * computes for the first linear it quantizes with options o on be (act order, damping and
 * its retries, the form), keyed to acc; a non-finite H is QD_ENUMERIC. So a factor can be
 * made once and handed to the parts of a group run elsewhere (quant/pipeline/part.h). */
int qd_gptq_shared_make(qd_backend *be, const qd_gptq_opts *o, const qd_gptq_hessian *acc, qd_gptq_shared *sh,
                        qd_err *err);
/* Takes a factorisation made elsewhere: rec's record (its fac and be ignored) and its factor
 * fac_host (host [k, k]), copied to be's memory and keyed to acc (which must hold the H it
 * was made from, as many rows folded in). */
int qd_gptq_shared_adopt(qd_backend *be, const qd_gptq_hessian *acc, const qd_gptq_shared *rec, const float *fac_host,
                         qd_gptq_shared *sh, qd_err *err);

/* Quantizes W [n, k] (row-major nn.Linear weight, host memory, borrowed) given the Hessian
 * in acc (left unchanged, so the same acc can serve several layers sharing an input). On
 * success *out owns its arrays (qd_gptq_result_free); on failure it holds nothing. */
int qd_gptq_quantize(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                     const qd_gptq_hessian *acc, qd_gptq_result *out, qd_err *err);
/* Same with the factorisation shared through *shared (see qd_gptq_shared; NULL: none). */
int qd_gptq_quantize_shared(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                            const qd_gptq_hessian *acc, qd_gptq_shared *shared, qd_gptq_result *out, qd_err *err);
/* Same with H [k, k] given in host memory (borrowed, unchanged). */
int qd_gptq_quantize_h(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                       const float *h, qd_gptq_result *out, qd_err *err);
void qd_gptq_result_free(qd_gptq_result *r);          /* accepts NULL and zeroed structs */

/* The act-order permutation: perm[j] = the column processed j-th, i.e. the indices of
 * diag[0..k) sorted by value descending, ties by index ascending (a stable sort). */
void qd_gptq_act_order_perm(const float *diag, int64_t k, int64_t *perm);

#endif
