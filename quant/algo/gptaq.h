/* GPTAQ (Li et al., 2025, "GPTAQ: Efficient Finetuning-Free Quantization for Asymmetric
 * Calibration"): GPTQ whose objective is ||W X_fp - Q X_q||^2, where X_q are the layer's
 * inputs in the partly quantized model (what GPTQ sees) and X_fp the same layer's inputs in
 * the float model. It follows GPTQModel's GPTAQ class (gptqmodel/quantization/gptaq.py):
 *
 *   H    = (2 / N) sum_t x_q,t x_q,t^T                    (the GPTQ Hessian, hessian.h)
 *   dXXT = (2 / N) sum_t (x_fp,t - x_q,t) x_q,t^T         (qd_gptaq_dxx below; same running
 *                                                          average as H, so only the ratio
 *                                                          to H matters)
 *   dead columns (H[i][i] == 0): H[i][i] = 1, W[:, i] = 0, dXXT[:, i] = 0
 *   act-order permutes W, H and dXXT (rows and columns) by diag H, descending
 *   U    = upper Cholesky factor of (H + damp I)^-1 (H^-1 = U^T U), damping as GPTQ
 *   P    = alpha * triu(dXXT U^T, 1) U                    (strictly upper triangular)
 *   per block [i1, i2), W1 = W[:, i1:i2], and per column j of the block, w = W1[:, j]:
 *       q = quant(w); e = (w - q) / U[j][j]
 *       W1[:, j:] -= e U[j, j:] - w P[j, j:]
 *   then W[:, i2:] -= Err1 U[i1:i2, i2:] - W1 P[i1:i2, i2:]
 *
 * Note that after its own column's update W1[:, j] holds w - e U[j][j] (about q, since
 * P[j][j] = 0), and that is what the lazy trailing update multiplies by P, exactly as
 * GPTQModel does. Groups (dynamic and static), g_idx and the damping retries are GPTQ's
 * (gptq.h); alpha is GPTQModel's default 0.25. With dXXT = 0 (X_fp == X_q) P = 0 and the
 * result is GPTQ's in the inverse (U) form.
 *
 * GPTAQ runs on the host: on the CPU backend only (its gemm and chol_inverse_upper ops);
 * another backend is refused by name. When no damping makes H factorisable the layer is
 * quantized by plain GPTQ (which falls back to round-to-nearest) and the result says so. */
#ifndef QUANT_ALGO_GPTAQ_H
#define QUANT_ALGO_GPTAQ_H

#include <stdint.h>

#include "quant/algo/gptq.h"
#include "quant/backend/backend.h"
#include "quant/core/error.h"

/* GPTQModel's GPTAQConfig.alpha default. */
#define QD_GPTAQ_ALPHA_DEFAULT 0.25

/* The streaming dXXT of one linear group (the layers reading one input): dXXT [k, k] =
 * (2 / N) sum_t (x_fp,t - x_q,t) x_q,t^T over the N rows folded in, kept as a running
 * average as the Hessian is (qd_backend_hessian_weights), so its ratio to H is exact
 * whatever the batching. d[a * k + b] = (2 / N) sum_t (x_fp,t[a] - x_q,t[a]) x_q,t[b]. */
typedef struct qd_gptaq_dxx {
    qd_backend *be;            /* borrowed: must outlive the accumulator */
    int64_t k;
    int64_t n_seen;
    float *d;                  /* backend memory [k, k]; owned */
    float *diff;               /* backend scratch [diff_rows, k]: x_fp - x_q; owned */
    int64_t diff_rows;
} qd_gptaq_dxx;

/* Zeroes acc and allocates dXXT = 0 on be. On failure acc holds nothing to free. */
int qd_gptaq_dxx_init(qd_gptaq_dxx *acc, qd_backend *be, int64_t k, qd_err *err);
/* Folds in rows of x_fp and x_q (each [rows, ldx], backend memory, borrowed). */
int qd_gptaq_dxx_add_dev(qd_gptaq_dxx *acc, const float *x_fp, const float *x_q, int64_t rows, int64_t ldx,
                         qd_err *err);
/* Copies dXXT to host memory d_host [k*k] (caller-owned). */
int qd_gptaq_dxx_download(const qd_gptaq_dxx *acc, float *d_host, qd_err *err);
void qd_gptaq_dxx_free(qd_gptaq_dxx *acc);   /* accepts NULL and zeroed structs */

/* Quantizes W [n, k] (host, borrowed) given H and dXXT [k, k] (host, borrowed, unchanged)
 * with GPTQ's options o and the weight alpha of the asymmetric term. On success *out owns
 * its arrays (qd_gptq_result_free); on failure it holds nothing. out->h_err is -1 (GPTAQ's
 * loss is not GPTQ's). Only on a host backend (be->device < 0); o->quant.row_block other
 * than 1 (scales shared across rows) is refused. */
int qd_gptaq_quantize_h(qd_backend *be, const qd_gptq_opts *o, double alpha, const float *w, int64_t n, int64_t k,
                        const float *h, const float *dxxt, qd_gptq_result *out, qd_err *err);

#endif
