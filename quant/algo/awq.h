/* AWQ (Lin et al., "Activation-aware Weight Quantization") for linears that share one
 * input: the per-input-channel scale search and the clipping search, following AutoAWQ's
 * auto_scale (_search_best_scale / _compute_best_scale) and auto_clip (_compute_best_clip).
 *
 * Scale search. x_mean[k] = mean over calibration rows of |X[:, k]|. For alpha = n / n_grid
 * (n = 0 .. n_grid-1, n_grid = 20) the candidate is, by default, the paper's
 * s = x_mean^alpha (opts.duo_scaling = 0; AutoAWQ's duo_scaling s = x_mean^alpha /
 * (w_mean^(1-alpha) + 1e-4), with w_mean the per-channel mean of |W| normalised by each
 * group's max, is opts.duo_scaling = 1). s is clamped to >= 1e-4, normalised by
 * sqrt(max(s) * min(s)), and scored by the loss of the effective weights
 * We = Q(W diag(s)) diag(s)^-1, i.e. ||Q(W diag(s)) (diag(s)^-1 X) - W X||^2 summed over the
 * calibration rows and over all layers sharing the input (or any loss the caller computes
 * from We, see qd_awq_loss_fn). Q is fake quantization with the layer's qd_quant_cfg. Alpha
 * 0 gives s = 1 exactly, so its loss is plain RTN's and AWQ never picks worse than RTN on
 * the calibration data. With opts.tie, channels of one class share a scale (the scales of
 * o_proj's input channels under grouped-query attention, where one v_proj output feeds
 * several heads: see quant/pipeline/pipeline_awq.c).
 *
 * Clip search (run on W diag(s) with inputs X diag(s)^-1, per layer; AutoAWQ skips q/k
 * projections, which is the caller's choice): for each (row, group) the clamp bound
 * max|w| * (1 - i / clip_n_grid), i = 0 .. clip_max_shrink * clip_n_grid - 1, minimising the
 * mean squared partial output of that group over a subsample of clip_n_tokens calibration
 * rows (every step-th row, as AutoAWQ). One addition to AutoAWQ: a row whose clipped output
 * error over ALL calibration rows exceeds its unclipped error keeps no clipping (rows are
 * independent outputs), so clipping never increases the calibration error.
 *
 * Applying the result: W_final = clamp(W diag(s), -max, +max) per (row, group) (see
 * qd_awq_apply), which is then quantized with the same cfg (RTN or GPTQ), and the operator
 * that produces X (an RMSNorm/LayerNorm weight, or the previous linear's output rows) has
 * its output channel k divided by s[k], so that W_final X' = W diag(s) diag(s)^-1 X.
 *
 * Memory: w and x arguments are backend memory (qd_backend_alloc), row-major F32; every
 * result is host memory owned by the result struct and released by its _free (NULL-safe).
 * The heavy work runs on backend ops (gemm, fake_quant, scale_cols, sq_diff_sum); per-row
 * and per-group reductions that no op provides are done on the host after a download. */
#ifndef QUANT_ALGO_AWQ_H
#define QUANT_ALGO_AWQ_H

#include <stdint.h>

#include "quant/algo/hessian.h"
#include "quant/formats/quantizer.h"
#include "quant/backend/backend.h"
#include "quant/core/error.h"

typedef struct qd_awq_opts {
    int n_grid;               /* alphas n / n_grid, n = 0 .. n_grid-1 (20) */
    int duo_scaling;          /* 0: s = x_mean^alpha (paper, default); 1: AutoAWQ duo scaling */
    int clip;                 /* run the clip search in qd_awq_linear (1) */
    int clip_n_grid;          /* 20 */
    float clip_max_shrink;    /* 0.5: shrink ratios 1 - i/20 for i = 0 .. 9 */
    int64_t clip_n_tokens;    /* 512: calibration rows sampled by the per-group clip search */
    int64_t chunk_rows;       /* 2048: rows of X per gemm (bounds scratch memory) */
    int64_t ref_cache_bytes;  /* 256 MiB: cache W X across alphas when it fits, else recompute */
    int gram;                 /* 1 (default): the built-in output errors (scale loss, clip
                               * guard) through H = X^T X when rows > k: an [n, k] x [k, k]
                               * product per candidate instead of [rows, k] x [k, n], the same
                               * value up to float rounding; 0: always the direct products */
    const int32_t *tie;       /* NULL, or [K] class of each input channel (0 .. K-1): channels
                               * of one class get one scale (their x_mean and w_mean are
                               * averaged before the candidates are formed). Borrowed. */
} qd_awq_opts;

qd_awq_opts qd_awq_opts_default(void);
/* "awq: n_grid 0 must be positive", ... */
int qd_awq_opts_validate(const qd_awq_opts *o, qd_err *err);

/* Result of the scale search; all arrays owned, freed by qd_awq_scales_free. */
typedef struct qd_awq_scales {
    int64_t k;
    float *s;                 /* [K] chosen scales (all 1 when identity) */
    float best_alpha;         /* of the best grid candidate */
    int identity;             /* 1: no scaling (s = 1) beat every candidate: nothing to fold */
    int n_grid;
    double *loss;             /* [n_grid] loss of alpha n / n_grid */
    double best_loss;         /* loss of the chosen scales */
    double rtn_loss;          /* loss with s = 1 (plain RTN) */
} qd_awq_scales;
void qd_awq_scales_free(qd_awq_scales *r);

/* Result of the clip search for one linear; max is owned, freed by qd_awq_clip_free. */
typedef struct qd_awq_clip {
    int64_t n, k, group_len, n_groups;
    float *max;               /* [N * G], [n][g]: clamp bound of row n, group g in W diag(s) */
    double loss_noclip;       /* ||X We^T - X W^T||^2 over all calibration rows, no clipping */
    double loss_clip;         /* the same with the chosen clipping (<= loss_noclip) */
    int64_t rows_reverted;    /* rows whose group-wise choice made the row worse: unclipped */
} qd_awq_clip;
void qd_awq_clip_free(qd_awq_clip *c);

/* A loss for one scale candidate: wq[i] (backend memory, [n[i], K]) is layer i's effective
 * weight Q(W_i diag(s)) diag(s)^-1, what the layer computes on the original input once s is
 * folded in. Writes a loss (lower is better, e.g. a module output's squared error) into
 * *loss; returns 0 or a negative QD_E* code with err set. */
typedef int (*qd_awq_loss_fn)(void *user, qd_backend *be, const float *const *wq,
                              int n_layers, double *loss, qd_err *err);

/* x_mean[k] = mean_r |x[r][k]| over rows of x (backend, [rows, k], row stride ldx) into the
 * host array x_mean [K]. */
int qd_awq_x_mean(qd_backend *be, const float *x, int64_t rows, int64_t k, int64_t ldx,
                  float *x_mean, qd_err *err);

/* ||X wa^T - X wb^T||^2 summed over rows and outputs (wb NULL: ||X wa^T||^2); wa, wb
 * backend [n, k]. */
int qd_awq_output_sq_err(qd_backend *be, const float *x, int64_t rows, int64_t ldx, int64_t k,
                         const float *wa, const float *wb, int64_t n, int64_t chunk_rows,
                         double *out, qd_err *err);

/* Scale search with a caller-supplied loss. w[i] (backend, [n[i], K]) are the layers that
 * share the input; x_mean [K] (host) its activation statistic. *out is filled (caller frees
 * it with qd_awq_scales_free). */
int qd_awq_search_scales_cb(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                            const float *const *w, const int64_t *n, int n_layers, int64_t k,
                            const float *x_mean, qd_awq_loss_fn fn, void *user,
                            qd_awq_scales *out, qd_err *err);

/* Scale search for layers sharing input x (backend, [rows, K], stride ldx), loss = sum over
 * layers of ||X We_i^T - X W_i^T||^2 (q/k/v or gate/up searched with one s). */
int qd_awq_search_scales(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                         const float *const *w, const int64_t *n, int n_layers, int64_t k,
                         const float *x, int64_t rows, int64_t ldx, qd_awq_scales *out,
                         qd_err *err);

/* The same loss from a Hessian instead of X: h (borrowed) is the GPTQ accumulator of the
 * calibration rows, (2 / rows) X^T X, and x_mean [K] (host) their mean |x| per channel, so
 * the caller never holds X itself (the pipeline accumulates both in one pass). */
int qd_awq_search_scales_h(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                           const float *const *w, const int64_t *n, int n_layers, int64_t k,
                           const float *x_mean, const qd_gptq_hessian *h, qd_awq_scales *out,
                           qd_err *err);

/* Clip search for one linear w (backend [n, k]) with scales s (host [K], NULL = ones) and
 * the same input x as the scale search. *out is filled (caller frees with
 * qd_awq_clip_free). */
int qd_awq_search_clip(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                       const float *w, int64_t n, int64_t k, const float *x, int64_t rows,
                       int64_t ldx, const float *s, qd_awq_clip *out, qd_err *err);
/* The same, with the guard's per-row errors over all rows of x taken from h (borrowed):
 * the GPTQ accumulator of exactly those rows, (2 / rows) X^T X, which the pipeline already
 * has for the group; h NULL is qd_awq_search_clip (which forms X^T X itself when rows > k and
 * opts.gram). A Hessian of other rows or features is QD_EINVAL. */
int qd_awq_search_clip_h(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o,
                         const float *w, int64_t n, int64_t k, const float *x, int64_t rows,
                         int64_t ldx, const qd_gptq_hessian *h, const float *s, qd_awq_clip *out,
                         qd_err *err);

/* In place on a host weight [n, k]: w <- w diag(s) (s NULL: unchanged), then clamped to
 * [-max, max] per (row, group) when clip is non-NULL. The result is what gets quantized. */
int qd_awq_apply(const float *s, const qd_awq_clip *clip, float *w, int64_t n, int64_t k,
                 qd_err *err);

/* The whole search for one linear: scales, then (opts.clip) clipping; ref_norm2 =
 * ||X W^T||^2 turns the losses into relative errors. */
typedef struct qd_awq_result {
    qd_awq_scales scales;
    qd_awq_clip clip;         /* zeroed (max NULL) when opts.clip is 0 */
    double ref_norm2;
} qd_awq_result;
int qd_awq_linear(qd_backend *be, const qd_quant_cfg *cfg, const qd_awq_opts *o, const float *w,
                  int64_t n, int64_t k, const float *x, int64_t rows, int64_t ldx,
                  qd_awq_result *out, qd_err *err);
void qd_awq_result_free(qd_awq_result *r);

#endif
