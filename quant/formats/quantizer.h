/* The min-max quantizer every method shares, as the reference implementations do it.
 *
 * For one group of weights w (of one output row): xmin = min(min(w), 0), xmax =
 * max(max(w), 0) (the range always holds 0); symmetric: xmax = max(|xmin|, xmax), xmin =
 * -xmax; an optional clip ratio shrinks both ends; a group with xmin == xmax gets xmin = -1,
 * xmax = +1 so no scale is ever 0; scale = (xmax - xmin) / maxq with maxq = 2^bits - 1;
 * zero = round(-xmin / scale) (symmetric: (maxq + 1) / 2); q = clamp(round(w / scale) +
 * zero, 0, maxq); dequant = scale * (q - zero).
 *
 * Scales are rounded to F16 before q is computed (cfg.f16_scales, on by default through
 * qd_quant_cfg_default), so the codes and the dequantized values are exactly what a packed
 * checkpoint decodes to. With cfg.zero_min1 (GPTQ v1, asymmetric) no zero is ever 0: such a
 * group widens its scale so that zero = 1 still covers xmax (the v1 "-1" convention cannot
 * store 0).
 *
 * Scale search (cfg.scale_search = QD_SCALE_SEARCH_MSE, scale_search.c): instead of the
 * min-max range itself, each group takes the best of the shrunk ranges p * [xmin, xmax],
 * p = 1 - i / search_grid for i = 0 .. round(search_maxshrink * search_grid) - 1 (p = 1 is
 * min-max; each candidate's scale and zero are found exactly as above, F16 rounding
 * included, with the clip ratio multiplied by p), by the lowest error sum_j wt_j *
 * |w_j - deq_j|^search_norm over the group's values (wt: per-column weights, e.g. the
 * Hessian's diagonal; 1 where none are given). Ties keep the larger p, so a group whose
 * min-max is already best keeps min-max. GPTQ's reference Quantizer.find_params(mse=True)
 * searches the same candidates, unweighted, with exponent 2.4. */
#ifndef QUANT_FORMATS_QUANTIZER_H
#define QUANT_FORMATS_QUANTIZER_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/core/minifloat.h"
#include "quant/formats/grid.h"

typedef enum qd_scale_search {
    QD_SCALE_SEARCH_MINMAX = 0,     /* the group's range as found */
    QD_SCALE_SEARCH_MSE = 1,        /* the best shrink of it by weighted error (above) */
} qd_scale_search;
/* "minmax", "mse" (NULL for another value), and back (-1 for an unknown name). */
const char *qd_scale_search_name(qd_scale_search s);
int qd_scale_search_parse(const char *name);

typedef struct qd_quant_cfg {
    int bits;               /* 2, 3, 4 or 8 */
    int sym;                /* symmetric (zero = 2^(bits-1)) */
    int64_t group_size;     /* > 0, or -1 for one group spanning all of K */
    float clip_ratio;       /* (0, 1]; 1 = no clipping */
    int f16_scales;         /* round scales to F16 (default 1) */
    int zero_min1;          /* asymmetric zeros kept >= 1 (GPTQ v1) */
    /* Float grids (grid.h); the defaults are the integer grid above. */
    qd_grid grid;           /* QD_GRID_INT, or FP8 (bits 8) / FP4 (bits 4), both sym */
    qd_scale_rule scale_rule;   /* QD_SCALE_F16 for INT; F32 (FP8), FP8_GLOBAL or E8M0 (FP4) */
    float global_scale;     /* FP8_GLOBAL: the tensor's gs (qd_quant_global_scale); 0 = unset
                               (qd_rtn_quantize then takes the weight's own) */
    int64_t row_block;      /* rows that share one scale: 1 (default), 128 (FP8 128x128
                               blocks) or -1 (all rows: one scale per tensor); only with
                               scale rule F32, whose scale grows with amax */
    qd_scale_search scale_search;   /* MINMAX (default) or MSE (above); MSE only with row_block 1 */
    int search_grid;        /* MSE: steps of p (default 100) */
    float search_maxshrink; /* MSE: p goes down to about 1 - maxshrink, in (0, 1) (default 0.8) */
    float search_norm;      /* MSE: the error's exponent, >= 1 (default 2: on SmolLM2-135M as good as
                               GPTQ's 2.4 and about half the cost, bench/results/scale-search.md) */
} qd_quant_cfg;

qd_quant_cfg qd_quant_cfg_default(void);   /* 4 bits, sym, group 128, clip 1, f16 scales */
/* "bits: 5 is not one of 2, 3, 4, 8", "group_size: 0 must be -1 or positive", ... */
int qd_quant_cfg_validate(const qd_quant_cfg *c, qd_err *err);
static inline int qd_quant_maxq(const qd_quant_cfg *c) { return (1 << c->bits) - 1; }
/* Number of groups for K input features (ceil(K / group_size); 1 when group_size = -1). */
int64_t qd_quant_n_groups(const qd_quant_cfg *c, int64_t k);
/* Effective group length for K (group_size, or K when -1). */
int64_t qd_quant_group_len(const qd_quant_cfg *c, int64_t k);

/* Parameters of one group: n values at w[0], w[stride], ... With scale search on, the
 * search with every weight 1 (qd_quant_params_w). */
void qd_quant_params(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride,
                     float *scale, float *zero);
/* The same with per-value weights wt [n] (contiguous; NULL: all 1) for the scale search's
 * error; with scale search off, exactly qd_quant_params (wt unread). */
void qd_quant_params_w(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                       float *scale, float *zero);
/* The search's error of one candidate: sum_i wt_i * |w_i - deq_i|^norm, in double (each
 * term in float, as the search computes it); exposed for tests. */
double qd_quant_search_err(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                           float scale, float zero);
/* Candidate i's parameters for the group's range [xmin, xmax] (i = 0: min-max). */
void qd_quant_search_candidate(const qd_quant_cfg *c, float xmin, float xmax, int i, float *scale, float *zero);
/* How many candidates the search tries: round(maxshrink * grid), at least 1. */
int qd_quant_search_count(const qd_quant_cfg *c);
/* The same from the group's range: xmin = min(0, w...), xmax = max(0, w...), each found as
 * qd_quant_params does (x < xmin / x > xmax replaces, so NaNs and a -0 never enter). SIMD
 * kernels find the ranges of many groups at once and finish here. */
void qd_quant_params_range(const qd_quant_cfg *c, float xmin, float xmax, float *scale, float *zero);
/* NVFP4's global scale of a tensor (or of the tensors that must share one: fused q/k/v,
 * gate/up) from its largest magnitude: 448 * 6 / amax in F32, 1 when amax is 0. */
float qd_quant_global_scale(float amax);
/* The largest |w[i]| of count finite values (0 for none). */
float qd_quant_amax(const float *w, int64_t count);
/* The rows of a group that share a scale (cfg.row_block) all take the largest: scales
 * [G, n] group-major, as every quantizer holds them. No-op for row_block 1. */
void qd_quant_params_rows(const qd_quant_cfg *c, float *scales, int64_t n, int64_t groups);
static inline int qd_quant_code(float w, float scale, float zero, int maxq)
{
    float v = __builtin_rintf(w / scale) + zero;   /* round half to even, as torch.round */
    return v < 0.0f ? 0 : v > (float)maxq ? maxq : (int)v;
}
static inline float qd_quant_dequant(int q, float scale, float zero) { return scale * ((float)q - zero); }
/* The same on c's grid: an integer code and its value for INT (exactly the two above), the
 * E4M3 byte or E2M1 nibble of w / s' for the float grids, where s' = s / global_scale for
 * FP8_GLOBAL and s otherwise (compressed-tensors divides the group scale by the global
 * scale before it quantizes and before it dequantizes, and so do these). */
static inline float qd_quant_scale_eff(const qd_quant_cfg *c, float scale)
{
    return c->scale_rule == QD_SCALE_FP8_GLOBAL ? scale / c->global_scale : scale;
}
static inline int qd_quant_code_cfg(const qd_quant_cfg *c, float w, float scale, float zero)
{
    switch (c->grid) {
    case QD_GRID_FP8_E4M3: return qd_f32_to_fp8_e4m3(w / qd_quant_scale_eff(c, scale));
    case QD_GRID_FP4_E2M1: return qd_f32_to_fp4_e2m1(w / qd_quant_scale_eff(c, scale));
    default: return qd_quant_code(w, scale, zero, (1 << c->bits) - 1);
    }
}
static inline float qd_quant_dequant_cfg(const qd_quant_cfg *c, int q, float scale, float zero)
{
    switch (c->grid) {
    case QD_GRID_FP8_E4M3: return qd_fp8_e4m3_to_f32((uint8_t)q) * qd_quant_scale_eff(c, scale);
    case QD_GRID_FP4_E2M1: return qd_fp4_e2m1_to_f32((uint8_t)q) * qd_quant_scale_eff(c, scale);
    default: return qd_quant_dequant(q, scale, zero);
    }
}

/* Round-to-nearest of a whole [N, K] row-major weight (nn.Linear layout) with groups along
 * K. Outputs (caller-allocated, any may be NULL): q [N*K] codes, scales/zeros [G*N] laid out
 * [g][n], deq [N*K] dequantized weights. Non-finite weights are QD_ENUMERIC. */
int qd_rtn_quantize(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k,
                    uint8_t *q, float *scales, float *zeros, float *deq, qd_err *err);

/* RTN straight into a qd_qlayer (quant/formats/qlayer.h): allocates *out (the caller frees
 * it with qd_qlayer_free; no bias) with g_idx = k / group_size and fills codes, scales and
 * integer zeros; deq [N*K] (may be NULL) receives the dequantized weights. */
struct qd_qlayer;
int qd_rtn_quantize_qlayer(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k,
                           struct qd_qlayer *out, float *deq, qd_err *err);

/* Quantize-dequantize in place ("fake quantization") of [N, K] with groups along K. */
int qd_quant_fake_ref(const qd_quant_cfg *c, float *w, int64_t n, int64_t k);

#endif
