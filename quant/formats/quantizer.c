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
                      .f16_scales = 1, .zero_min1 = 0};
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
    return 0;
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
    const int maxq = qd_quant_maxq(c);
    const int64_t gl = qd_quant_group_len(c, k), ng = qd_quant_n_groups(c, k);
    for (int64_t r = 0; r < n; r++) {
        const float *row = w + r * k;
        for (int64_t g = 0; g < ng; g++) {
            int64_t k0 = g * gl, len = k - k0 < gl ? k - k0 : gl;
            float s, z;
            qd_quant_params(c, row + k0, len, 1, &s, &z);
            if (scales) scales[g * n + r] = s;
            if (zeros) zeros[g * n + r] = z;
            for (int64_t i = k0; i < k0 + len; i++) {
                int code = qd_quant_code(row[i], s, z, maxq);
                if (q) q[r * k + i] = (uint8_t)code;
                if (deq) deq[r * k + i] = qd_quant_dequant(code, s, z);
            }
        }
    }
    return 0;
}

int qd_quant_fake_ref(const qd_quant_cfg *c, float *w, int64_t n, int64_t k)
{
    if (qd_quant_cfg_validate(c, NULL)) return QD_EINVAL;
    if (!w || n < 0 || k < 0) return QD_EINVAL;
    if (!all_finite(w, n * k)) return QD_ENUMERIC;
    const int maxq = qd_quant_maxq(c);
    const int64_t gl = qd_quant_group_len(c, k), ng = qd_quant_n_groups(c, k);
    for (int64_t r = 0; r < n; r++) {
        float *row = w + r * k;
        for (int64_t g = 0; g < ng; g++) {
            int64_t k0 = g * gl, len = k - k0 < gl ? k - k0 : gl;
            float s, z;
            qd_quant_params(c, row + k0, len, 1, &s, &z);
            for (int64_t i = k0; i < k0 + len; i++)
                row[i] = qd_quant_dequant(qd_quant_code(row[i], s, z, maxq), s, z);
        }
    }
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
    rc = qd_rtn_quantize(c, w, n, k, out->q, out->scales, zf, deq, err);
    if (!rc)
        for (int64_t i = 0; i < out->n_groups * n; i++) out->zeros[i] = (int32_t)zf[i];
    free(zf);
    if (rc) qd_qlayer_free(out);
    return rc;
}
