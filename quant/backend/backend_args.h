/* Argument checks and launch choices of the device backend's ops, as plain host C: the
 * CUDA backend (quant/backend/cuda) calls them before any CUDA call, and every build, GPU
 * or not, tests them (tests/unit/test_backend_args.c). Each check returns 0 or QD_EINVAL /
 * QD_EUNSUPPORTED with the op (`who`, e.g. "cuda gemm") and the offending values in *err.
 * A refusal here is the caller's mistake, never a device error: the backend is not marked
 * broken. */
#ifndef QUANT_BACKEND_BACKEND_ARGS_H
#define QUANT_BACKEND_BACKEND_ARGS_H

#include <stdint.h>

#include "quant/core/error.h"

struct qd_gptq_block_args;     /* quant/backend/gptq_block.h */

/* Shared memory one GPTQ block launch may use (the default per-block limit). */
#define QD_BACKEND_GPTQ_SMEM (48 * 1024)

/* gemm (row-major C[m,n] = op(A) op(B)): every size within cuBLAS's int, strides at least
 * the row lengths, operands present when read. *skip = 1 when there is nothing to compute
 * (m or n is 0). *lda_ok / *ldb_ok are the strides to hand cuBLAS: the given ones, or 1-row
 * placeholders when k == 0 (the operands are never read, but cuBLAS still checks them). */
int qd_backend_gemm_args_check(const char *who, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a,
                               int64_t lda, const void *b, int64_t ldb, const void *c, int64_t ldc, int *skip,
                               int64_t *lda_ok, int64_t *ldb_ok, qd_err *err);
/* hessian_accum: H [k,k] and X [rows, k] (ld ldx) within cuBLAS's int; n_seen >= 0. */
int qd_backend_hessian_args_check(const char *who, const void *h, int64_t k, const void *x, int64_t rows,
                                  int64_t ldx, int64_t n_seen, qd_err *err);
/* hessian_accum's running mean: after n_seen rows, `rows` more make H = beta H + alpha X^T X
 * with beta = n_seen / total and alpha = 2 / total (total = n_seen + rows > 0). */
void qd_backend_hessian_weights(int64_t n_seen, int64_t rows, float *alpha, float *beta);
/* chol_inverse_upper: H [k,k], k within cuSOLVER's int. */
int qd_backend_chol_args_check(const char *who, const void *h, int64_t k, qd_err *err);
/* gather_rows / scatter_add_rows: every count within the device's int (rows and n_idx
 * also within a grid's 2^31 - 1 blocks), cols > 0 when n_idx > 0, and the arrays present
 * when n_idx > 0 (w too when want_w). *skip = 1 when n_idx is 0 (nothing to do). */
int qd_backend_rows_args_check(const char *who, const void *dst, const void *src, int64_t rows, const void *idx,
                               const void *w, int want_w, int64_t n_idx, int64_t cols, int *skip, qd_err *err);
/* The indices themselves, on a host copy (idx[n_idx]): each in [0, rows), and, with
 * distinct, no two equal (scatter_add_rows's precondition; a byte per row of scratch).
 * QD_EINVAL names the first offender; QD_ENOMEM when the scratch cannot be had. */
int qd_backend_rows_idx_check(const char *who, const int32_t *idx, int64_t n_idx, int64_t rows, int distinct,
                              qd_err *err);
/* gptq_block: every array present, the block [i1, i2) inside [0, k), strides wide enough,
 * the U form only (ldl and a separate q refused), and the block narrow enough for its
 * shared-memory copy. */
int qd_backend_gptq_block_args_check(const char *who, const struct qd_gptq_block_args *a, qd_err *err);
/* Rows of W per GPTQ-block launch block: as many as keep rows x block_cols floats within
 * QD_BACKEND_GPTQ_SMEM, at most 64 (two warps' worth of loads in flight per column), at
 * least 1; 0 when even one row does not fit. */
int qd_backend_gptq_block_rows(int64_t block_cols);

#endif
