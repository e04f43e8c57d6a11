/* AWQ "gemm" checkpoints (AutoAWQ WQLinear_GEMM; vLLM awq and awq_marlin): 4-bit only,
 * qweight [K, N/8] and qzeros [G, N/8] packed along N with the interleave
 * ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (nibble i of word column c holds output channel
 * 8c + ORDER[i]), scales [G, N] F16, raw zeros, no g_idx. The AWQ per-channel scales are
 * folded into the previous operator before quantization, so nothing else is stored.
 * quantization_config is AutoAWQ's (quant_method "awq", version "gemm", zero_point) and
 * layers left in float go in modules_to_not_convert. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int awq_misfit(int64_t n, int64_t k, char *why, size_t cap)
{
    if (n % 8 == 0) return 0;
    snprintf(why, cap, "out_features %lld is not a multiple of 8 (awq_gemm packs 8 per word)", (long long)n);
    return 1;
}

static int awq_tensors(const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err)
{
    fmt_tensor_set(&t[0], "qweight", QD_DTYPE_I32, 2, p->qweight_shape[0], p->qweight_shape[1], p->qweight);
    fmt_tensor_set(&t[1], "qzeros", QD_DTYPE_I32, 2, p->qzeros_shape[0], p->qzeros_shape[1], p->qzeros);
    fmt_tensor_set(&t[2], "scales", QD_DTYPE_F16, 2, p->scales_shape[0], p->scales_shape[1], p->scales);
    *n_out = 3;
    return 0;
}

static int awq_read(qd_fmt_find_fn find, void *ud, int64_t n, int64_t k, const qd_fmt_detected *d,
                    qd_packed *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    const int b = d->bits;
    const int64_t gs = d->group_size > 0 ? d->group_size : k, g = (k + gs - 1) / gs;
    out->n = n; out->k = k; out->bits = b; out->group_size = d->group_size; out->n_groups = g;
    out->qweight_shape[0] = k; out->qweight_shape[1] = n * b / 32;
    out->qzeros_shape[0] = g; out->qzeros_shape[1] = n * b / 32;
    out->scales_shape[0] = g; out->scales_shape[1] = n;
    int rc = fmt_read_i32(find, ud, "awq_gemm", "qweight", 1, k, n * b / 32, &out->qweight, err);
    if (!rc) rc = fmt_read_i32(find, ud, "awq_gemm", "qzeros", 1, g, n * b / 32, &out->qzeros, err);
    if (!rc) rc = fmt_read_f16(find, ud, "awq_gemm", "scales", g, n, &out->scales, err);
    if (rc) qd_packed_free(out);
    return rc;
}

static cJSON *awq_quant_config(const qd_fmt_config_in *in)
{
    cJSON *q = cJSON_CreateObject();
    if (!q) return NULL;
    cJSON_AddStringToObject(q, "quant_method", "awq");
    cJSON_AddNumberToObject(q, "bits", in->s.bits);
    cJSON_AddNumberToObject(q, "group_size", (double)in->s.group_size);
    cJSON_AddBoolToObject(q, "zero_point", !in->s.sym);
    cJSON_AddStringToObject(q, "version", "gemm");
    if (in->n_float)
        cJSON_AddItemToObject(q, "modules_to_not_convert", fmt_json_strings(in->float_modules, in->n_float));
    else
        cJSON_AddNullToObject(q, "modules_to_not_convert");
    return q;
}

static int awq_detect(const cJSON *q, const char *what, qd_fmt_detected *d, qd_err *err)
{
    char method[32] = "", version[32] = "gemm";
    int rc = fmt_json_str(q, "quant_method", method, sizeof method, what, err);
    if (rc) return rc;
    if (strcmp(method, "awq")) return 0;
    int64_t bits = 0;
    int zp = 1;
    if ((rc = fmt_json_int(q, "bits", &bits, what, err)) || (rc = fmt_json_int(q, "group_size", &d->group_size, what, err)) ||
        (rc = fmt_json_bool(q, "desc_act", &d->desc_act, what, err)) ||
        (rc = fmt_json_str(q, "version", version, sizeof version, what, err)))
        return rc;
    if (strcmp(version, "gemm") && strcmp(version, "GEMM"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: AWQ version \"%s\" is not supported (only gemm)", what, version);
    if ((rc = fmt_json_bool(q, "zero_point", &zp, what, err))) return rc;
    d->sym = !zp;
    d->bits = bits >= 0 && bits <= 64 ? (int)bits : -1;
    return 1;
}

const qd_format qd_fmt_awq_gemm = {
    .name = "awq_gemm", .quant_method = "awq", .main_tensor = "qweight", .bits_mask = 1u << 4, .has_g_idx = 0, .zero_offset = 0,
    .summary = "AutoAWQ GEMM: qweight/qzeros packed along N in AWQ's interleave, no g_idx; transformers, "
               "AutoAWQ, GPTQModel, vLLM awq/awq_marlin",
    .channel_groups = 0, .channel_why = "its loaders divide in_features by it",
    .act_order = QD_FMT_ACT_ORDER_NONE, .kernel = QD_FMT_KERNEL_AWQ,
    .default_methods = QD_FMT_METHOD_AWQ | QD_FMT_METHOD_AWQ_GPTQ, .default_rank = 1,
    .misfit = awq_misfit, .check = awq_check, .pack = awq_pack, .unpack = awq_unpack, .dequant_ref = awq_dequant,
    .tensors = awq_tensors, .read = awq_read, .quant_config = awq_quant_config, .detect = awq_detect,
};
