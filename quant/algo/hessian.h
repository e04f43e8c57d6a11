/* The streaming GPTQ Hessian: H = (2 / n) X^T X over every calibration row seen so far,
 * kept as a running average so batches can be folded in one at a time (as the reference's
 * add_batch: H *= n / (n + r); H += 2 / (n + r) X_new^T X_new).
 *
 * The accumulator lives in backend memory; rows may come from the host (validated finite
 * here, uploaded in chunks) or already sit in backend memory. */
#ifndef QUANT_ALGO_HESSIAN_H
#define QUANT_ALGO_HESSIAN_H

#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/core/error.h"

typedef struct qd_gptq_hessian {
    qd_backend *be;        /* borrowed: must outlive the accumulator */
    int64_t k;             /* input features */
    int64_t n_seen;        /* rows folded in so far */
    float *h;              /* backend memory [k, k], full symmetric; owned */
    float *stage;          /* backend staging rows for host input (non-CPU backends); owned */
    int64_t stage_rows;
    float x_amax;          /* max |x| over the rows folded in (the static activation scales
                            * of schemes FP8 and NVFP4 are made from it) */
    int bf16;              /* set after init: rows folded in as bfloat16 (the backend's
                            * hessian_accum_bf16, the job's "compute": "bf16"); default 0 */
    const float *diag;     /* borrowed, host [k]: with h NULL, H's diagonal alone, which is all
                            * GPTQ reads of H once it is given the factor made from it
                            * (qd_gptq_quantize_shared with that factor shared; k and n_seen set) */
} qd_gptq_hessian;

/* Zeroes acc and allocates H = 0 for k features on be. On failure acc holds nothing to free
 * (qd_gptq_hessian_free is still safe). */
int qd_gptq_hessian_init(qd_gptq_hessian *acc, qd_backend *be, int64_t k, qd_err *err);
/* Folds in rows X [rows, k] (row-major, host memory, borrowed). Non-finite values are
 * QD_ENUMERIC and leave H unchanged. rows == 0 is a no-op. */
int qd_gptq_hessian_add(qd_gptq_hessian *acc, const float *x, int64_t rows, qd_err *err);
/* Same for rows already in backend memory (row stride ldx); not checked for finiteness
 * (qd_gptq_quantize checks H itself). */
int qd_gptq_hessian_add_dev(qd_gptq_hessian *acc, const float *x, int64_t rows, int64_t ldx,
                            qd_err *err);
/* Folds part (the running average of other rows, on acc's backend, the same k) into acc:
 * H = n/(n+m) H + m/(n+m) H_part, n and m the rows each saw, element by element (the
 * backend's scale and add), so the result depends only on the two operands and their order;
 * n_seen and x_amax combine. part's H is scaled in place (consumed). A part that saw no row
 * leaves acc as it was; into an acc that saw none, part's H is copied. */
int qd_gptq_hessian_merge(qd_gptq_hessian *acc, qd_gptq_hessian *part, qd_err *err);
/* Copies H to host memory h_host [k*k] (caller-owned). */
int qd_gptq_hessian_download(const qd_gptq_hessian *acc, float *h_host, qd_err *err);
void qd_gptq_hessian_free(qd_gptq_hessian *acc);     /* accepts NULL and zeroed structs */

#endif
