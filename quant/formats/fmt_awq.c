/* AWQ "gemm" checkpoints (AutoAWQ WQLinear_GEMM; vLLM awq and awq_marlin): 4-bit only,
 * qweight [K, N/8] and qzeros [G, N/8] packed along N with the interleave
 * ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (nibble i of word column c holds output channel
 * 8c + ORDER[i]), scales [G, N] F16, raw zeros, no g_idx. The AWQ per-channel scales are
 * folded into the previous operator before quantization, so nothing else is stored. */
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/formats/fmt_internal.h"

static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static int awq_check(const qd_qlayer *l, qd_err *err)
{
    int rc = fmt_check_common(&qd_fmt_awq_gemm, l, err);
    if (rc) return rc;
    if (l->n % 8 != 0)
        return qd_err_set(err, QD_ESHAPE, "awq_gemm: out_features %lld is not a multiple of 8",
                          (long long)l->n);
    /* No g_idx tensor: loaders assume group k / group_size, so act-order cannot be stored. */
    for (int64_t i = 0; i < l->k; i++) {
        int32_t want = l->group_size > 0 ? (int32_t)(i / l->group_size) : 0;
        if (l->g_idx[i] != want)
            return qd_err_set(err, QD_EUNSUPPORTED, "awq_gemm: g_idx[%lld] = %d but the format has no "
                              "g_idx (needs %d = k / group_size; act-order layers need gptq)",
                              (long long)i, l->g_idx[i], want);
    }
    return 0;
}

/* Packs 8 channels' values v[ch] into one word with the interleave. */
static int32_t awq_word(const int32_t v[8])
{
    uint32_t w = 0;
    for (int i = 0; i < 8; i++) w |= ((uint32_t)v[awq_order[i]] & 0xFu) << (4 * i);
    return (int32_t)w;
}

static int32_t awq_get(const int32_t *words, int64_t ch)
{
    int64_t c = ch / 8;
    int j = (int)(ch % 8), i = 0;
    while (awq_order[i] != j) i++;
    return (int32_t)(((uint32_t)words[c] >> (4 * i)) & 0xFu);
}

static int awq_pack(const qd_qlayer *l, qd_packed *out, qd_err *err)
{
    int rc = awq_check(l, err);
    if (!rc) rc = fmt_packed_begin(l, out, err);
    if (rc) return rc;
    const int64_t n = l->n, k = l->k, g = l->n_groups, nw = n / 8;
    out->qweight = malloc((size_t)(k * nw) * sizeof *out->qweight);
    out->qzeros = malloc((size_t)(g * nw) * sizeof *out->qzeros);
    if (!out->qweight || !out->qzeros) {
        qd_packed_free(out);
        return qd_err_set(err, QD_ENOMEM, "awq_gemm: out of memory packing [%lld, %lld]",
                          (long long)n, (long long)k);
    }
    out->qweight_shape[0] = k;
    out->qweight_shape[1] = nw;
    out->qzeros_shape[0] = g;
    out->qzeros_shape[1] = nw;
    int32_t v[8];
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < nw; c++) {
            for (int j = 0; j < 8; j++) v[j] = l->q[(8 * c + j) * k + i];
            out->qweight[i * nw + c] = awq_word(v);
        }
    for (int64_t gi = 0; gi < g; gi++)
        for (int64_t c = 0; c < nw; c++) {
            for (int j = 0; j < 8; j++) v[j] = l->zeros[gi * n + 8 * c + j];
            out->qzeros[gi * nw + c] = awq_word(v);
        }
    return 0;
}

static int awq_check_packed(const qd_packed *p, qd_err *err)
{
    if (!p->qweight || !p->qzeros || !p->scales)
        return qd_err_set(err, QD_EINVAL, "awq_gemm: packed tensors missing");
    if (p->bits != 4)
        return qd_err_set(err, QD_EUNSUPPORTED, "awq_gemm: %d-bit tensors (the format is 4-bit only)",
                          p->bits);
    if (p->n <= 0 || p->k <= 0 || p->n % 8)
        return qd_err_set(err, QD_ESHAPE, "awq_gemm: out_features %lld is not a positive multiple of 8",
                          (long long)p->n);
    int64_t g_want = p->group_size > 0 ? p->k / p->group_size : 1;
    if ((p->group_size > 0 && p->k % p->group_size) || p->n_groups != g_want)
        return qd_err_set(err, QD_ESHAPE, "awq_gemm: %lld groups do not fit K %lld and group_size %lld",
                          (long long)p->n_groups, (long long)p->k, (long long)p->group_size);
    int rc = fmt_check_shape("awq_gemm", "qweight", p->qweight_shape, p->k, p->n / 8, err);
    if (!rc) rc = fmt_check_shape("awq_gemm", "qzeros", p->qzeros_shape, p->n_groups, p->n / 8, err);
    if (!rc) rc = fmt_check_shape("awq_gemm", "scales", p->scales_shape, p->n_groups, p->n, err);
    return rc;
}

static int awq_unpack(const qd_packed *p, qd_qlayer *out, qd_err *err)
{
    int rc = awq_check_packed(p, err);
    if (!rc) rc = fmt_unpack_begin("awq_gemm", p, out, err);
    if (rc) return rc;
    const int64_t n = p->n, k = p->k, nw = n / 8;
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < n; c++) out->q[c * k + i] = (uint8_t)awq_get(p->qweight + i * nw, c);
    int sym = 1;
    for (int64_t gi = 0; gi < p->n_groups; gi++)
        for (int64_t c = 0; c < n; c++) {
            out->zeros[gi * n + c] = awq_get(p->qzeros + gi * nw, c);
            if (out->zeros[gi * n + c] != 8) sym = 0;
        }
    out->sym = sym;
    return 0;
}

static int awq_dequant(const qd_packed *p, float *w, qd_err *err)
{
    int rc = awq_check_packed(p, err);
    if (rc) return rc;
    const int64_t n = p->n, k = p->k, nw = n / 8;
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++) {
            int64_t g = p->group_size > 0 ? i / p->group_size : 0;
            int32_t q = awq_get(p->qweight + i * nw, c), z = awq_get(p->qzeros + g * nw, c);
            w[c * k + i] = (float)(q - z) * qd_f16_to_f32(p->scales[g * n + c]);
        }
    return 0;
}

const qd_format qd_fmt_awq_gemm = {
    .name = "awq_gemm", .bits_mask = 1u << 4, .has_g_idx = 0, .zero_offset = 0,
    .check = awq_check, .pack = awq_pack, .unpack = awq_unpack, .dequant_ref = awq_dequant,
};
