/* GPTQ checkpoints, v1 ("gptq") and v2 ("gptq_v2"): qweight [K*b/32, N] packed along K,
 * qzeros [G, N*b/32] packed along N, scales [G, N] F16, g_idx [K].
 *
 * The only difference between the two is the stored zero: v1 stores z - 1 and every v1
 * loader adds the 1 back, so a zero of 0 would be stored as -1, whose sign bits spill
 * into the neighbouring fields; v1 therefore refuses such layers (quantize with
 * zero_min1 or write v2). v2 stores z itself. */
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/formats/fmt_internal.h"

#define GPTQ_BITS ((1u << 2) | (1u << 3) | (1u << 4) | (1u << 8))

static int gptq_check_shape(const qd_format *f, const qd_qlayer *l, qd_err *err)
{
    int rc = fmt_check_common(f, l, err);
    if (rc) return rc;
    /* 32 | K keeps every 32-value block of a qweight column whole (3 bits: 3 words);
     * 32 | N does the same for the qzeros rows. */
    if (l->k % 32 != 0)
        return qd_err_set(err, QD_ESHAPE, "%s: in_features %lld is not a multiple of 32", f->name,
                          (long long)l->k);
    if (l->n % 32 != 0)
        return qd_err_set(err, QD_ESHAPE, "%s: out_features %lld is not a multiple of 32", f->name,
                          (long long)l->n);
    return 0;
}

static int gptq_v1_check(const qd_qlayer *l, qd_err *err)
{
    int rc = gptq_check_shape(&qd_fmt_gptq, l, err);
    if (rc) return rc;
    for (int64_t i = 0; i < l->n_groups * l->n; i++)
        if (l->zeros[i] == 0)
            return qd_err_set(err, QD_EINVAL,
                              "gptq: zero 0 at group %lld, column %lld cannot be stored in gptq v1 (it "
                              "stores zero-1, and -1 corrupts the packed word); quantize with "
                              "zero_min1 or write gptq_v2", (long long)(i / l->n), (long long)(i % l->n));
    return 0;
}

static int gptq_v2_check(const qd_qlayer *l, qd_err *err)
{
    return gptq_check_shape(&qd_fmt_gptq_v2, l, err);
}

static int gptq_pack(const qd_format *f, const qd_qlayer *l, qd_packed *out, qd_err *err)
{
    int rc = f->check(l, err);
    if (rc) return rc;
    rc = fmt_packed_begin(l, out, err);
    if (rc) return rc;
    const int b = l->bits;
    const int64_t n = l->n, k = l->k, g = l->n_groups, nw = n * b / 32;
    int64_t tmp_len = k > n ? k : n;
    int32_t *tmp = malloc((size_t)tmp_len * sizeof *tmp);
    out->qweight = calloc((size_t)(k * b / 32 * n), sizeof *out->qweight);
    out->qzeros = calloc((size_t)(g * nw), sizeof *out->qzeros);
    out->g_idx = malloc((size_t)k * sizeof *out->g_idx);
    if (!tmp || !out->qweight || !out->qzeros || !out->g_idx) {
        free(tmp);
        qd_packed_free(out);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory packing [%lld, %lld]", f->name,
                          (long long)n, (long long)k);
    }
    out->qweight_shape[0] = k * b / 32;
    out->qweight_shape[1] = n;
    out->qzeros_shape[0] = g;
    out->qzeros_shape[1] = nw;
    out->g_idx_len = k;
    for (int64_t c = 0; c < n; c++) {
        for (int64_t i = 0; i < k; i++) tmp[i] = l->q[c * k + i];
        qd_pack_bits(b, tmp, k, 1, out->qweight + c, n);
    }
    for (int64_t gi = 0; gi < g; gi++) {
        for (int64_t c = 0; c < n; c++) tmp[c] = l->zeros[gi * n + c] - f->zero_offset;
        qd_pack_bits(b, tmp, n, 1, out->qzeros + gi * nw, 1);
    }
    for (int64_t i = 0; i < k; i++) out->g_idx[i] = l->g_idx[i];
    free(tmp);
    return 0;
}

static int gptq_check_packed(const qd_format *f, const qd_packed *p, qd_err *err)
{
    if (!p->qweight || !p->qzeros || !p->scales)
        return qd_err_set(err, QD_EINVAL, "%s: packed tensors missing", f->name);
    if (p->bits < 1 || p->bits > 8 || !(f->bits_mask & (1u << p->bits)))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: %d-bit tensors are not in this format", f->name,
                          p->bits);
    if (p->k % 32 || p->n % 32 || p->k <= 0 || p->n <= 0)
        return qd_err_set(err, QD_ESHAPE, "%s: [%lld, %lld] is not a multiple of 32", f->name,
                          (long long)p->n, (long long)p->k);
    int rc = fmt_check_shape(f->name, "qweight", p->qweight_shape, p->k * p->bits / 32, p->n, err);
    if (!rc) rc = fmt_check_shape(f->name, "qzeros", p->qzeros_shape, p->n_groups, p->n * p->bits / 32, err);
    if (!rc) rc = fmt_check_shape(f->name, "scales", p->scales_shape, p->n_groups, p->n, err);
    if (rc) return rc;
    if (p->g_idx && p->g_idx_len != p->k)
        return qd_err_set(err, QD_ESHAPE, "%s: g_idx has %lld entries, expected %lld", f->name,
                          (long long)p->g_idx_len, (long long)p->k);
    if (p->g_idx)
        for (int64_t i = 0; i < p->k; i++)
            if (p->g_idx[i] < 0 || p->g_idx[i] >= p->n_groups)
                return qd_err_set(err, QD_EFORMAT, "%s: g_idx[%lld] = %d is outside [0, %lld)", f->name,
                                  (long long)i, p->g_idx[i], (long long)p->n_groups);
    return 0;
}

static int gptq_unpack(const qd_format *f, const qd_packed *p, qd_qlayer *out, qd_err *err)
{
    int rc = gptq_check_packed(f, p, err);
    if (!rc) rc = fmt_unpack_begin(f->name, p, out, err);
    if (rc) return rc;
    const int b = p->bits, maxq = (1 << b) - 1;
    const int64_t n = p->n, k = p->k, nw = n * b / 32;
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++)
            out->q[c * k + i] = (uint8_t)qd_bits_get(b, p->qweight + c, n, i);
    int sym = 1;
    for (int64_t gi = 0; gi < p->n_groups; gi++)
        for (int64_t c = 0; c < n; c++) {
            int32_t z = qd_bits_get(b, p->qzeros + gi * nw, 1, c) + f->zero_offset;
            if (z > maxq) {
                qd_qlayer_free(out);
                return qd_err_set(err, QD_EFORMAT, "%s: stored zero %d at group %lld, column %lld "
                                  "decodes to %d, outside %d bits (a zero of 0 written as -1)",
                                  f->name, z - f->zero_offset, (long long)gi, (long long)c, z, b);
            }
            out->zeros[gi * n + c] = z;
            if (z != (maxq + 1) / 2) sym = 0;
        }
    out->sym = sym;
    if (p->g_idx)
        for (int64_t i = 0; i < k; i++) out->g_idx[i] = p->g_idx[i];
    return 0;
}

static int gptq_dequant(const qd_format *f, const qd_packed *p, float *w, qd_err *err)
{
    int rc = gptq_check_packed(f, p, err);
    if (rc) return rc;
    const int b = p->bits;
    const int64_t n = p->n, k = p->k, nw = n * b / 32;
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++) {
            int64_t g = p->g_idx ? p->g_idx[i] : (p->group_size > 0 ? i / p->group_size : 0);
            /* As the loaders do: v1 adds the 1 back without masking. */
            int32_t z = qd_bits_get(b, p->qzeros + g * nw, 1, c) + f->zero_offset;
            int32_t q = qd_bits_get(b, p->qweight + c, n, i);
            w[c * k + i] = qd_f16_to_f32(p->scales[g * n + c]) * (float)(q - z);
        }
    return 0;
}

static int v1_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return gptq_pack(&qd_fmt_gptq, l, o, e); }
static int v2_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return gptq_pack(&qd_fmt_gptq_v2, l, o, e); }
static int v1_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e) { return gptq_unpack(&qd_fmt_gptq, p, o, e); }
static int v2_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e) { return gptq_unpack(&qd_fmt_gptq_v2, p, o, e); }
static int v1_deq(const qd_packed *p, float *w, qd_err *e) { return gptq_dequant(&qd_fmt_gptq, p, w, e); }
static int v2_deq(const qd_packed *p, float *w, qd_err *e) { return gptq_dequant(&qd_fmt_gptq_v2, p, w, e); }

const qd_format qd_fmt_gptq = {
    .name = "gptq", .bits_mask = GPTQ_BITS, .has_g_idx = 1, .zero_offset = 1,
    .check = gptq_v1_check, .pack = v1_pack, .unpack = v1_unpack, .dequant_ref = v1_deq,
};

const qd_format qd_fmt_gptq_v2 = {
    .name = "gptq_v2", .bits_mask = GPTQ_BITS, .has_g_idx = 1, .zero_offset = 0,
    .check = gptq_v2_check, .pack = v2_pack, .unpack = v2_unpack, .dequant_ref = v2_deq,
};
