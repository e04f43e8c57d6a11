/* The unpacked quantized layer: allocation, release and the scalar dequantization that
 * every packed format's decode is checked against. */
#include "quant/formats/qlayer.h"

#include <stdlib.h>
#include <string.h>

#include "quant/formats/quantizer.h"

int qd_qlayer_alloc(qd_qlayer *l, int64_t n, int64_t k, int bits, int sym, int64_t group_size,
                    int with_bias, qd_err *err)
{
    memset(l, 0, sizeof *l);
    if (n <= 0 || k <= 0)
        return qd_err_set(err, QD_EINVAL, "qlayer: shape [%lld, %lld] must be positive",
                          (long long)n, (long long)k);
    if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
        return qd_err_set(err, QD_EINVAL, "qlayer: bits %d is not one of 2, 3, 4, 8", bits);
    if (group_size == 0 || group_size < -1)
        return qd_err_set(err, QD_EINVAL, "qlayer: group_size %lld must be -1 or positive",
                          (long long)group_size);
    l->n = n;
    l->k = k;
    l->bits = bits;
    l->sym = sym;
    l->group_size = group_size;
    l->n_groups = group_size > 0 ? (k + group_size - 1) / group_size : 1;
    l->q = calloc((size_t)(n * k), 1);
    l->scales = calloc((size_t)(l->n_groups * n), sizeof *l->scales);
    l->zeros = calloc((size_t)(l->n_groups * n), sizeof *l->zeros);
    l->g_idx = calloc((size_t)k, sizeof *l->g_idx);
    if (with_bias) l->bias = calloc((size_t)n, sizeof *l->bias);
    if (!l->q || !l->scales || !l->zeros || !l->g_idx || (with_bias && !l->bias)) {
        qd_qlayer_free(l);
        return qd_err_set(err, QD_ENOMEM, "qlayer: out of memory for [%lld, %lld]",
                          (long long)n, (long long)k);
    }
    for (int64_t i = 0; i < k; i++) l->g_idx[i] = group_size > 0 ? (int32_t)(i / group_size) : 0;
    return 0;
}

void qd_qlayer_free(qd_qlayer *l)
{
    if (!l) return;
    free(l->q);
    free(l->scales);
    free(l->zeros);
    free(l->g_idx);
    free(l->bias);
    memset(l, 0, sizeof *l);
}

void qd_qlayer_set_grid(qd_qlayer *l, const qd_quant_cfg *c)
{
    l->grid = c->grid;
    l->scale_rule = c->scale_rule;
    l->global_scale = c->global_scale;
    l->row_block = c->row_block;
}

void qd_qlayer_dequant_ref(const qd_qlayer *l, float *w)
{
    if (l->grid != QD_GRID_INT) {
        qd_quant_cfg c = qd_quant_cfg_default();
        c.grid = l->grid;
        c.scale_rule = l->scale_rule;
        c.global_scale = l->global_scale;
        for (int64_t r = 0; r < l->n; r++)
            for (int64_t i = 0; i < l->k; i++)
                w[r * l->k + i] = qd_quant_dequant_cfg(&c, l->q[r * l->k + i], l->scales[l->g_idx[i] * l->n + r], 0.0f);
        return;
    }
    for (int64_t r = 0; r < l->n; r++)
        for (int64_t c = 0; c < l->k; c++) {
            int64_t g = l->g_idx[c];
            w[r * l->k + c] = l->scales[g * l->n + r] *
                              (float)((int32_t)l->q[r * l->k + c] - l->zeros[g * l->n + r]);
        }
}
