/* The format table (one entry per checkpoint layout) and the checks and tensor plumbing
 * that all packed formats share. */
#include "quant/formats/fmt_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/dtype.h"

static const qd_format *const table[] = {&qd_fmt_gptq, &qd_fmt_gptq_v2, &qd_fmt_awq_gemm};

size_t qd_format_count(void) { return sizeof table / sizeof table[0]; }
const qd_format *qd_format_at(size_t i) { return i < qd_format_count() ? table[i] : NULL; }

const qd_format *qd_format_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < qd_format_count(); i++)
        if (strcmp(table[i]->name, name) == 0) return table[i];
    return NULL;
}

void qd_packed_free(qd_packed *p)
{
    if (!p) return;
    free(p->qweight);
    free(p->qzeros);
    free(p->scales);
    free(p->g_idx);
    free(p->bias);
    memset(p, 0, sizeof *p);
}

int fmt_check_common(const qd_format *f, const qd_qlayer *l, qd_err *err)
{
    const char *fn = f->name;
    if (!l || !l->q || !l->scales || !l->zeros || !l->g_idx)
        return qd_err_set(err, QD_EINVAL, "%s: layer arrays missing", fn);
    if (l->n <= 0 || l->k <= 0)
        return qd_err_set(err, QD_ESHAPE, "%s: shape [%lld, %lld] must be positive", fn,
                          (long long)l->n, (long long)l->k);
    if (l->bits < 1 || l->bits > 8 || !(f->bits_mask & (1u << l->bits)))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: %d-bit layers cannot be written in this format",
                          fn, l->bits);
    if (l->group_size == 0 || l->group_size < -1)
        return qd_err_set(err, QD_EINVAL, "%s: group_size %lld must be -1 or positive", fn,
                          (long long)l->group_size);
    if (l->group_size > 0 && l->k % l->group_size != 0)
        return qd_err_set(err, QD_ESHAPE,
                          "%s: in_features %lld is not a multiple of group_size %lld (a partial last "
                          "group cannot be stored)", fn, (long long)l->k, (long long)l->group_size);
    int64_t g_want = l->group_size > 0 ? l->k / l->group_size : 1;
    if (l->n_groups != g_want)
        return qd_err_set(err, QD_ESHAPE, "%s: n_groups %lld does not match K %lld / group_size %lld",
                          fn, (long long)l->n_groups, (long long)l->k, (long long)l->group_size);
    const int maxq = (1 << l->bits) - 1;
    for (int64_t i = 0; i < l->n * l->k; i++)
        if (l->q[i] > maxq)
            return qd_err_set(err, QD_EINVAL, "%s: code %d at row %lld, column %lld exceeds %d bits", fn,
                              l->q[i], (long long)(i / l->k), (long long)(i % l->k), l->bits);
    for (int64_t i = 0; i < l->n_groups * l->n; i++) {
        if (l->zeros[i] < 0 || l->zeros[i] > maxq)
            return qd_err_set(err, QD_EINVAL, "%s: zero %d of group %lld, column %lld is outside [0, %d]",
                              fn, l->zeros[i], (long long)(i / l->n), (long long)(i % l->n), maxq);
        float s = l->scales[i];
        if (!(s > 0.0f) || !isfinite(s) || isinf(qd_f16_to_f32(qd_f32_to_f16(s))))
            return qd_err_set(err, QD_ENUMERIC, "%s: scale %g of group %lld, column %lld is not a "
                              "positive finite F16 value", fn, (double)s, (long long)(i / l->n),
                              (long long)(i % l->n));
    }
    for (int64_t i = 0; i < l->k; i++)
        if (l->g_idx[i] < 0 || l->g_idx[i] >= l->n_groups)
            return qd_err_set(err, QD_EINVAL, "%s: g_idx[%lld] = %d is outside [0, %lld)", fn,
                              (long long)i, l->g_idx[i], (long long)l->n_groups);
    return 0;
}

int fmt_packed_begin(const qd_qlayer *l, qd_packed *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    out->n = l->n;
    out->k = l->k;
    out->bits = l->bits;
    out->group_size = l->group_size;
    out->n_groups = l->n_groups;
    out->scales = malloc((size_t)(l->n_groups * l->n) * sizeof *out->scales);
    if (!out->scales) return qd_err_set(err, QD_ENOMEM, "pack: out of memory for scales");
    out->scales_shape[0] = l->n_groups;
    out->scales_shape[1] = l->n;
    for (int64_t i = 0; i < l->n_groups * l->n; i++) out->scales[i] = qd_f32_to_f16(l->scales[i]);
    if (l->bias) {
        out->bias = malloc((size_t)l->n * sizeof *out->bias);
        if (!out->bias) {
            qd_packed_free(out);
            return qd_err_set(err, QD_ENOMEM, "pack: out of memory for bias");
        }
        out->bias_len = l->n;
        for (int64_t i = 0; i < l->n; i++) out->bias[i] = qd_f32_to_f16(l->bias[i]);
    }
    return 0;
}

int fmt_check_shape(const char *fmt, const char *tensor, const int64_t *got, int64_t r, int64_t c,
                    qd_err *err)
{
    if (got[0] != r || got[1] != c)
        return qd_err_set(err, QD_ESHAPE, "%s: %s has shape [%lld, %lld], expected [%lld, %lld]", fmt,
                          tensor, (long long)got[0], (long long)got[1], (long long)r, (long long)c);
    return 0;
}

int fmt_unpack_begin(const char *fmt, const qd_packed *p, qd_qlayer *out, qd_err *err)
{
    if (!p->qweight || !p->qzeros || !p->scales)
        return qd_err_set(err, QD_EINVAL, "%s: packed tensors missing", fmt);
    int rc = fmt_check_shape(fmt, "scales", p->scales_shape, p->n_groups, p->n, err);
    if (rc) return rc;
    if (p->bias && p->bias_len != p->n)
        return qd_err_set(err, QD_ESHAPE, "%s: bias has %lld values, expected %lld", fmt,
                          (long long)p->bias_len, (long long)p->n);
    rc = qd_qlayer_alloc(out, p->n, p->k, p->bits, 0, p->group_size, p->bias != NULL, err);
    if (rc) return rc;
    if (out->n_groups != p->n_groups) {
        qd_qlayer_free(out);
        return qd_err_set(err, QD_ESHAPE, "%s: %lld groups do not match K %lld / group_size %lld", fmt,
                          (long long)p->n_groups, (long long)p->k, (long long)p->group_size);
    }
    for (int64_t i = 0; i < p->n_groups * p->n; i++) out->scales[i] = qd_f16_to_f32(p->scales[i]);
    if (p->bias)
        for (int64_t i = 0; i < p->n; i++) out->bias[i] = qd_f16_to_f32(p->bias[i]);
    return 0;
}
