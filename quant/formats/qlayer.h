/* A quantized linear layer in unpacked form: what every quantizer (RTN, GPTQ, AWQ)
 * produces and every format packs.
 *
 * Shapes follow nn.Linear: N = out_features, K = in_features. q holds the integer codes in
 * [0, 2^bits - 1] as [N, K] row-major. Group parameters are [G, N] (group-major, as the
 * checkpoints store them): scales are F16-representable floats, zeros are integers in
 * [0, 2^bits - 1]. g_idx[k] is the group of input feature k (k / group_size unless
 * act-order). Dequant: W[n][k] = scales[g][n] * (q[n][k] - zeros[g][n]), g = g_idx[k].
 * An optional bias [N] travels with the layer. Everything is owned by the qd_qlayer and
 * freed by qd_qlayer_free. */
#ifndef QUANT_FORMATS_QLAYER_H
#define QUANT_FORMATS_QLAYER_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/formats/grid.h"

typedef struct qd_qlayer {
    int64_t n, k;
    int bits;
    int sym;
    int64_t group_size;      /* > 0, or -1 */
    int64_t n_groups;        /* G */
    uint8_t *q;              /* [N*K] */
    float *scales;           /* [G*N] */
    int32_t *zeros;          /* [G*N] */
    int32_t *g_idx;          /* [K] */
    float *bias;             /* [N] or NULL */
    /* The grid (grid.h; zeroed = the integer grid). Float grids: q holds E4M3 bytes or E2M1
     * nibbles, scales the stored group scales as floats, zeros 0, and
     * W[n][k] = value(q) * scale' with scale' = scale / global_scale under FP8_GLOBAL. */
    qd_grid grid;
    qd_scale_rule scale_rule;
    float global_scale;      /* FP8_GLOBAL only */
    int64_t row_block;       /* rows sharing a scale: 1 (or 0), 128, or -1 (all) */
} qd_qlayer;

/* Allocates all arrays (bias only when with_bias) and fills g_idx with k / group_size. */
int qd_qlayer_alloc(qd_qlayer *l, int64_t n, int64_t k, int bits, int sym, int64_t group_size,
                    int with_bias, qd_err *err);
void qd_qlayer_free(qd_qlayer *l);                      /* accepts zeroed/partial structs */
struct qd_quant_cfg;
/* Records c's grid, scale rule, global scale and row block in l (after qd_qlayer_alloc). */
void qd_qlayer_set_grid(qd_qlayer *l, const struct qd_quant_cfg *c);
/* Dequantizes to W [N, K] (the scalar reference of every format's decode). */
void qd_qlayer_dequant_ref(const qd_qlayer *l, float *w);

#endif
