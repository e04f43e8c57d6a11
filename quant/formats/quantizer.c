/* The shared min-max quantizer (see quantizer.h): group parameters, round-to-nearest of a
 * whole [N, K] weight, and in-place fake quantization. Every other quantizer (GPTQ, AWQ)
 * calls qd_quant_params/qd_quant_code so that they all agree on the codes bit for bit.
 *
 * One deliberate departure from GPTQ's reference: there a symmetric group whose weights
 * are all >= 0 keeps xmin = 0 (only xmin < 0 is mirrored), so its scale covers half the
 * range it needs. We follow the spec in quantizer.h (xmin = -xmax always), which never
 * loses range and changes nothing for groups that hold a negative weight. */
#include "quant/formats/quantizer.h"

#include <math.h>
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/core/finite.h"
#include "quant/formats/qlayer.h"

qd_quant_cfg qd_quant_cfg_default(void)
{
    qd_quant_cfg c = {.bits = 4, .sym = 1, .group_size = 128, .clip_ratio = 1.0f,
                      .f16_scales = 1, .zero_min1 = 0, .grid = QD_GRID_INT, .scale_rule = QD_SCALE_F16,
                      .global_scale = 0.0f, .row_block = 1, .scale_search = QD_SCALE_SEARCH_MINMAX,
                      .search_grid = 100, .search_maxshrink = 0.8f, .search_norm = 2.0f};
    return c;
}

int qd_quant_cfg_validate(const qd_quant_cfg *c, qd_err *err)
{
    if (!c) return qd_err_set(err, QD_EINVAL, "quant cfg: missing");
    if (c->bits != 2 && c->bits != 3 && c->bits != 4 && c->bits != 8)
        return qd_err_set(err, QD_EINVAL, "bits: %d is not one of 2, 3, 4, 8", c->bits);
    if (c->group_size == 0 || c->group_size < -1)
        return qd_err_set(err, QD_EINVAL, "group_size: %lld must be -1 or positive",
                          (long long)c->group_size);
    if (!(c->clip_ratio > 0.0f && c->clip_ratio <= 1.0f))
        return qd_err_set(err, QD_EINVAL, "clip_ratio: %g must be in (0, 1]", (double)c->clip_ratio);
    if (c->row_block == 0 || c->row_block < -1)
        return qd_err_set(err, QD_EINVAL, "row_block: %lld must be -1 or positive", (long long)c->row_block);
    if (c->scale_search == QD_SCALE_SEARCH_MSE) {
        if (c->search_grid < 1 || c->search_grid > 100000)
            return qd_err_set(err, QD_EINVAL, "scale_search mse: grid %d must be from 1 to 100000", c->search_grid);
        if (!(c->search_maxshrink > 0.0f && c->search_maxshrink < 1.0f))
            return qd_err_set(err, QD_EINVAL, "scale_search mse: maxshrink %g must be in (0, 1)",
                              (double)c->search_maxshrink);
        if (!(c->search_norm >= 1.0f && c->search_norm <= 16.0f))
            return qd_err_set(err, QD_EINVAL, "scale_search mse: norm %g must be in [1, 16]", (double)c->search_norm);
        /* A scale shared by several rows is their largest; one row's search cannot pick it. */
        if (c->row_block != 1)
            return qd_err_set(err, QD_EINVAL, "scale_search mse: rows sharing one scale (row_block %lld) are not "
                              "searched; use scale_search minmax", (long long)c->row_block);
    } else if (c->scale_search != QD_SCALE_SEARCH_MINMAX) {
        return qd_err_set(err, QD_EINVAL, "scale_search: %d is not minmax or mse", (int)c->scale_search);
    }
    switch (c->grid) {
    case QD_GRID_INT:
        if (c->scale_rule != QD_SCALE_F16 || c->row_block != 1)
            return qd_err_set(err, QD_EINVAL, "grid int: scales are min-max per row and group (scale rule f16, row_block 1)");
        return 0;
    case QD_GRID_FP8_E4M3:
        if (c->bits != 8 || !c->sym || c->scale_rule != QD_SCALE_F32)
            return qd_err_set(err, QD_EINVAL, "grid fp8_e4m3: 8 bits, symmetric, F32 scales");
        return 0;
    case QD_GRID_FP4_E2M1:
        if (c->bits != 4 || !c->sym || (c->scale_rule != QD_SCALE_FP8_GLOBAL && c->scale_rule != QD_SCALE_E8M0) ||
            c->row_block != 1)
            return qd_err_set(err, QD_EINVAL, "grid fp4_e2m1: 4 bits, symmetric, FP8 or E8M0 group scales, one row each");
        if (c->scale_rule == QD_SCALE_FP8_GLOBAL && c->global_scale != 0.0f &&
            !(c->global_scale > 0.0f && isfinite(c->global_scale)))
            return qd_err_set(err, QD_EINVAL, "global_scale: %g must be positive and finite", (double)c->global_scale);
        return 0;
    }
    return qd_err_set(err, QD_EINVAL, "grid: %d is not a grid", (int)c->grid);
}

const char *qd_grid_name(qd_grid g)
{
    switch (g) {
    case QD_GRID_INT: return "int";
    case QD_GRID_FP8_E4M3: return "fp8_e4m3";
    case QD_GRID_FP4_E2M1: return "fp4_e2m1";
    }
    return "?";
}

float qd_quant_global_scale(float amax)
{
    if (!(amax > 0.0f)) return 1.0f;
    float g = QD_FP8_E4M3_MAX * QD_FP4_E2M1_MAX / amax;
    return isfinite(g) ? g : 1.0f;
}

void qd_quant_params_rows(const qd_quant_cfg *c, float *scales, int64_t n, int64_t groups)
{
    const int64_t rb = c->row_block < 0 ? n : c->row_block;
    if (rb <= 1) return;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t r0 = 0; r0 < n; r0 += rb) {
            int64_t r1 = r0 + rb < n ? r0 + rb : n;
            float m = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                if (scales[g * n + r] > m) m = scales[g * n + r];
            for (int64_t r = r0; r < r1; r++) scales[g * n + r] = m;
        }
}

/* A float grid's scale from the group's largest magnitude a (grid.h has the rules). */
static float float_grid_scale(const qd_quant_cfg *c, float a)
{
    switch (c->scale_rule) {
    case QD_SCALE_FP8_GLOBAL: {
        float gs = c->global_scale > 0.0f ? c->global_scale : 1.0f;
        float s = qd_f32_round_fp8_e4m3(gs * (a / QD_FP4_E2M1_MAX));
        return s > 0.0f ? s : qd_fp8_e4m3_to_f32(0x01);       /* never 0: 2^-9 */
    }
    case QD_SCALE_E8M0: {
        if (!(a > 0.0f)) return qd_e8m0_to_f32(0);
        int e;
        float m = frexpf(a, &e);                              /* a = m * 2^e, m in [0.5, 1) */
        e -= 1;                                               /* a = 2m * 2^e, 2m in [1, 2) */
        if (2.0f * m >= 1.75f) e += 1;                        /* round_to_power_2 */
        e -= 2;                                               /* floor(log2(6)) */
        if (e < -127) e = -127;
        if (e > 127) e = 127;
        return qd_e8m0_to_f32((uint8_t)(e + 127));
    }
    default: {
        float s = a / QD_FP8_E4M3_MAX;
        return s > 0.0f ? s : 0x1p-126f;
    }
    }
}

int64_t qd_quant_n_groups(const qd_quant_cfg *c, int64_t k)
{
    if (c->group_size <= 0 || k <= 0) return 1;
    return (k + c->group_size - 1) / c->group_size;
}

int64_t qd_quant_group_len(const qd_quant_cfg *c, int64_t k)
{
    return c->group_size <= 0 ? k : c->group_size;
}

/* Rounds a positive scale to F16 without ever producing 0 or Inf: a scale below the
 * smallest F16 subnormal would divide by zero, one above F16's max would decode to Inf. */
static float scale_to_f16(float s)
{
    float r = qd_f32_round_f16(s);
    if (r <= 0.0f) r = qd_f16_to_f32(0x0001);          /* 2^-24 */
    if (isinf(r)) r = qd_f16_to_f32(0x7bff);            /* 65504 */
    return r;
}

void qd_quant_params(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride,
                     float *scale, float *zero)
{
    if (c->scale_search == QD_SCALE_SEARCH_MSE) {
        qd_quant_params_w(c, w, n, stride, NULL, scale, zero);
        return;
    }
    float xmin = 0.0f, xmax = 0.0f;                     /* the range always holds 0 */
    for (int64_t i = 0; i < n; i++) {
        float v = w[i * stride];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    qd_quant_params_range(c, xmin, xmax, scale, zero);
}

void qd_quant_params_range(const qd_quant_cfg *c, float xmin, float xmax, float *scale, float *zero)
{
    if (c->grid != QD_GRID_INT) {
        float a = fabsf(xmin) > xmax ? fabsf(xmin) : xmax;
        if (c->clip_ratio > 0.0f && c->clip_ratio < 1.0f) a *= c->clip_ratio;
        *scale = float_grid_scale(c, a);
        *zero = 0.0f;
        return;
    }
    const int maxq = qd_quant_maxq(c);
    if (c->sym) {
        float a = fabsf(xmin) > xmax ? fabsf(xmin) : xmax;
        xmax = a;
        xmin = -a;
    }
    if (c->clip_ratio > 0.0f && c->clip_ratio < 1.0f) {
        xmin *= c->clip_ratio;
        xmax *= c->clip_ratio;
    }
    if (xmin == xmax) {                                 /* all zero: any scale works, avoid 0 */
        xmin = -1.0f;
        xmax = 1.0f;
    }
    float s = (xmax - xmin) / (float)maxq;
    if (c->f16_scales) s = scale_to_f16(s);
    float z;
    if (c->sym) {
        z = (float)((maxq + 1) / 2);
    } else {
        z = rintf(-xmin / s);
        if (z < 0.0f) z = 0.0f;
        if (z > (float)maxq) z = (float)maxq;
        if (c->zero_min1 && z < 1.0f) {
            /* GPTQ v1 cannot store a zero of 0. With z = 1 the top code decodes to
             * (maxq - 1) * s, so widen s until that still reaches xmax; the bottom code
             * -s stays below xmin because z rounded to 0 means -xmin < s / 2. */
            z = 1.0f;
            s = xmax / (float)(maxq - 1);
            if (c->f16_scales) {
                s = scale_to_f16(s);
                if (s * (float)(maxq - 1) < xmax) {     /* rounded down: take the next F16 */
                    uint16_t h = qd_f32_to_f16(s);
                    if (h < 0x7bff) s = qd_f16_to_f32((uint16_t)(h + 1));
                }
            }
        }
    }
    *scale = s;
    *zero = z;
}

static int all_finite(const float *w, int64_t count)
{
    return qd_f32_first_nonfinite(w, count) < 0;
}

float qd_quant_amax(const float *w, int64_t count)
{
    float a = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        float v = fabsf(w[i]);
        if (v > a) a = v;
    }
    return a;
}

/* c with the global scale of w [n, k] filled in where c's rule needs one and has none. */
static qd_quant_cfg cfg_for(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k)
{
    qd_quant_cfg cc = *c;
    if (cc.scale_rule == QD_SCALE_FP8_GLOBAL && cc.global_scale == 0.0f)
        cc.global_scale = qd_quant_global_scale(qd_quant_amax(w, n * k));
    return cc;
}

/* Round-to-nearest of w [n, k] into any of q, deq (may alias w), with the parameters of
 * every group found first (scales/zeros [G, n], caller-allocated) so that the rows sharing
 * a scale (row_block) can take their block's. */
static void rtn_rows(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k, uint8_t *q, float *scales,
                     float *zeros, float *deq)
{
    const int64_t gl = qd_quant_group_len(c, k), ng = qd_quant_n_groups(c, k);
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t k0 = g * gl, len = k - k0 < gl ? k - k0 : gl;
            qd_quant_params(c, w + r * k + k0, len, 1, &scales[g * n + r], &zeros[g * n + r]);
        }
    qd_quant_params_rows(c, scales, n, ng);
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t k0 = g * gl, len = k - k0 < gl ? k - k0 : gl;
            float s = scales[g * n + r], z = zeros[g * n + r];
            for (int64_t i = r * k + k0; i < r * k + k0 + len; i++) {
                int code = qd_quant_code_cfg(c, w[i], s, z);
                if (q) q[i] = (uint8_t)code;
                if (deq) deq[i] = qd_quant_dequant_cfg(c, code, s, z);
            }
        }
}

int qd_rtn_quantize(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k,
                    uint8_t *q, float *scales, float *zeros, float *deq, qd_err *err)
{
    int rc = qd_quant_cfg_validate(c, err);
    if (rc) return rc;
    if (!w || n <= 0 || k <= 0)
        return qd_err_set(err, QD_EINVAL, "rtn: weights missing or empty shape [%lld, %lld]",
                          (long long)n, (long long)k);
    if (!all_finite(w, n * k))
        return qd_err_set(err, QD_ENUMERIC, "rtn: weights [%lld, %lld] hold a NaN or Inf",
                          (long long)n, (long long)k);
    const qd_quant_cfg cc = cfg_for(c, w, n, k);
    const int64_t ng = qd_quant_n_groups(c, k);
    float *ts = scales ? NULL : malloc((size_t)(ng * n) * sizeof *ts);
    float *tz = zeros ? NULL : malloc((size_t)(ng * n) * sizeof *tz);
    if ((!scales && !ts) || (!zeros && !tz)) {
        free(ts);
        free(tz);
        return qd_err_set(err, QD_ENOMEM, "rtn: out of memory for [%lld, %lld]", (long long)n, (long long)k);
    }
    rtn_rows(&cc, w, n, k, q, scales ? scales : ts, zeros ? zeros : tz, deq);
    free(ts);
    free(tz);
    return 0;
}

int qd_quant_fake_ref(const qd_quant_cfg *c, float *w, int64_t n, int64_t k)
{
    if (qd_quant_cfg_validate(c, NULL)) return QD_EINVAL;
    if (!w || n < 0 || k < 0) return QD_EINVAL;
    if (!all_finite(w, n * k)) return QD_ENUMERIC;
    if (n == 0 || k == 0) return 0;
    const qd_quant_cfg cc = cfg_for(c, w, n, k);
    const int64_t ng = qd_quant_n_groups(c, k);
    float *ts = malloc((size_t)(ng * n) * 2 * sizeof *ts);
    if (!ts) return QD_ENOMEM;
    rtn_rows(&cc, w, n, k, NULL, ts, ts + ng * n, w);
    free(ts);
    return 0;
}

int qd_rtn_quantize_qlayer(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k,
                           qd_qlayer *out, float *deq, qd_err *err)
{
    int rc = qd_quant_cfg_validate(c, err);
    if (rc) return rc;
    rc = qd_qlayer_alloc(out, n, k, c->bits, c->sym, c->group_size, 0, err);
    if (rc) return rc;
    float *zf = malloc((size_t)(out->n_groups * n) * sizeof *zf);
    if (!zf) {
        qd_qlayer_free(out);
        return qd_err_set(err, QD_ENOMEM, "rtn: out of memory for zeros");
    }
    /* The global scale is fixed here so that the layer records the one its codes used. */
    const qd_quant_cfg cc = w && all_finite(w, n * k) ? cfg_for(c, w, n, k) : *c;
    qd_qlayer_set_grid(out, &cc);
    rc = qd_rtn_quantize(&cc, w, n, k, out->q, out->scales, zf, deq, err);
    if (!rc)
        for (int64_t i = 0; i < out->n_groups * n; i++) out->zeros[i] = (int32_t)zf[i];
    free(zf);
    if (rc) qd_qlayer_free(out);
    return rc;
}
