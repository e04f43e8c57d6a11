/* The format table (one entry per checkpoint layout), the rules every caller asks it
 * (job settings, default format, layer shapes, recognising a checkpoint) and the checks
 * and tensor plumbing that all packed formats share. */
#include "quant/formats/fmt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/dtype.h"

/* The order is part of the job spec's in-memory enum (qp_format: gptq 0, gptq_v2 1,
 * awq_gemm 2): append new formats at the end. */
static const qd_format *const table[] = {&qd_fmt_gptq, &qd_fmt_gptq_v2, &qd_fmt_awq_gemm, &qd_fmt_ct,
                                         &qd_fmt_fp8, &qd_fmt_nvfp4, &qd_fmt_mxfp4};

size_t qd_format_count(void) { return sizeof table / sizeof table[0]; }
const qd_format *qd_format_at(size_t i) { return i < qd_format_count() ? table[i] : NULL; }

const qd_format *qd_format_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < qd_format_count(); i++)
        if (strcmp(table[i]->name, name) == 0) return table[i];
    return NULL;
}

int qd_format_index(const qd_format *f)
{
    for (size_t i = 0; i < qd_format_count(); i++)
        if (table[i] == f) return (int)i;
    return -1;
}

/* "a, b or c": the formats other than `not` that hold `bits`. */
static void alternatives(const qd_format *not, int bits, char *out, size_t cap)
{
    const char *names[16];
    size_t n = 0;
    for (size_t i = 0; i < qd_format_count() && n < 16; i++) {
        const qd_format *f = table[i];
        /* The float formats are chosen through a scheme, never as the way out of a bits rule. */
        if (f == not || !(f->bits_mask & (1u << bits)) || f->grid != QD_GRID_INT) continue;
        names[n++] = f->name;
    }
    out[0] = 0;
    size_t o = 0;
    for (size_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%s", i == 0 ? "" : (i + 1 == n ? " or " : ", "), names[i]);
}

int qd_format_check_settings(const qd_format *f, const qd_fmt_settings *s, const char **field,
                             char *msg, size_t cap)
{
    char alt[160];
    if (s->bits < 1 || s->bits > 8 || !(f->bits_mask & (1u << s->bits))) {
        char held[64] = "";
        size_t o = 0;
        int nb = 0, seen = 0;
        for (int b = 1; b <= 8; b++) nb += (f->bits_mask >> b) & 1;
        for (int b = 1; b <= 8 && o < sizeof held; b++) {
            if (!(f->bits_mask & (1u << b))) continue;
            seen++;
            o += (size_t)snprintf(held + o, sizeof held - o, "%s%d%s", seen == 1 ? "" : (seen == nb ? " or " : ", "),
                                  b, seen == nb ? "" : "-");
        }
        alternatives(f, s->bits, alt, sizeof alt);
        *field = "format";
        snprintf(msg, cap, "%s holds %s-bit weights only, but job.bits is %d; use format %s", f->name, held,
                 s->bits, alt);
        return QD_EINVAL;
    }
    /* Static groups keep the plain layout (g_idx k / group_size), which every format holds. */
    if (s->desc_act && !s->static_groups && f->act_order == QD_FMT_ACT_ORDER_NONE) {
        *field = "format";
        snprintf(msg, cap, "%s has no g_idx, so it cannot hold act-order (desc_act) weights without static groups; "
                 "set static_groups true (the plain layout), or desc_act false, or use format %s", f->name,
                 table[0]->name);
        return QD_EINVAL;
    }
    if (s->desc_act && !s->static_groups && f->act_order == QD_FMT_ACT_ORDER_STATIC) {
        *field = "static_groups";
        snprintf(msg, cap, "%s holds act-order (desc_act) weights only with static groups (groups stay "
                 "contiguous, no g_idx): %s; set static_groups true, or desc_act false, or use format %s",
                 f->name, f->act_order_why ? f->act_order_why : "it stores no g_idx", table[0]->name);
        return QD_EINVAL;
    }
    if (s->group_size == -1 && !f->channel_groups) {
        *field = "group_size";
        snprintf(msg, cap, "%s needs a positive group size (%s), not -1", f->name,
                 f->channel_why ? f->channel_why : "it stores one scale per group");
        return QD_EINVAL;
    }
    return 0;
}

int qd_format_default(unsigned method, int bits)
{
    int best = -1;
    for (size_t i = 0; i < qd_format_count(); i++) {
        const qd_format *f = table[i];
        if (!(f->default_methods & method) || bits < 1 || bits > 8 || !(f->bits_mask & (1u << bits))) continue;
        if (best < 0 || f->default_rank > table[best]->default_rank) best = (int)i;
    }
    return best;
}

int qd_format_misfit(const qd_format *f, int64_t n, int64_t k, int64_t gs, char *why, size_t cap)
{
    if (gs > 0 && k % gs != 0) {
        snprintf(why, cap, "in_features %lld is not a multiple of group_size %lld", (long long)k, (long long)gs);
        return 1;
    }
    return f->misfit ? f->misfit(n, k, why, cap) : 0;
}

int qd_format_detect(const cJSON *q, const char *what, const qd_format **fmt, qd_fmt_detected *out, qd_err *err)
{
    *fmt = NULL;
    if (!cJSON_IsObject(q)) return qd_err_set(err, QD_EFORMAT, "%s: quantization_config must be an object", what);
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < qd_format_count(); i++) {
        const qd_format *f = table[i];
        qd_fmt_detected d = {.bits = 0, .group_size = -1, .sym = 1, .desc_act = 0};
        int rc = f->detect(q, what, &d, err);
        if (rc < 0) return rc;
        if (rc == 0) continue;
        /* A mixed checkpoint's bits and group sizes are each layer's (qd_fmt_detected.mixed). */
        if (!d.mixed && d.bits != 2 && d.bits != 3 && d.bits != 4 && d.bits != 8)
            return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.bits %d is not one of 2, 3, 4, 8", what, d.bits);
        if (!d.mixed && (d.group_size == 0 || d.group_size < -1))
            return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.group_size %lld must be -1 or positive", what,
                              (long long)d.group_size);
        *out = d;
        *fmt = f;
        return 0;
    }
    /* Nobody claimed it: name what quantd reads. */
    char method[64] = "", list[160] = "";
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (cJSON_IsString(m)) snprintf(method, sizeof method, "%s", m->valuestring);
    size_t o = 0;
    for (size_t i = 0; i < qd_format_count() && o < sizeof list; i++) {
        int dup = 0;
        for (size_t j = 0; j < i; j++) dup |= !strcmp(table[j]->quant_method, table[i]->quant_method);
        if (!dup) o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", table[i]->quant_method);
    }
    return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.quant_method \"%s\" is not supported (%s)", what,
                      method, list);
}

void qd_fmt_tensors_free(qd_fmt_tensor *t, int n)
{
    for (int i = 0; t && i < n; i++) {
        free(t[i].owned);
        t[i].owned = NULL;
        t[i].data = NULL;
    }
}

void qd_packed_free(qd_packed *p)
{
    if (!p) return;
    free(p->qweight);
    free(p->qzeros);
    free(p->scales);
    free(p->g_idx);
    free(p->bias);
    free(p->fcodes);
    free(p->fscales);
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
