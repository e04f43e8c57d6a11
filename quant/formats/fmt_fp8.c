/* compressed-tensors "float-quantized": FP8 E4M3 weights, what llm-compressor's FP8,
 * FP8_DYNAMIC and FP8_BLOCK presets write and vLLM's CompressedTensorsW8A8Fp8 scheme reads
 * (../shared/ref/compressed-tensors.md). Per linear <m>:
 *   <m>.weight        F8_E4M3 [N, K]
 *   <m>.weight_scale  F32 [1] (tensor), [N, 1] (channel) or [ceil(N/bn), K/bk] (block bn x bk)
 *   <m>.input_scale   F32 [1]: static per-tensor activations only (scheme FP8), amax / 448 of
 *                     the linear's calibration inputs
 * Dequant: W = float(weight) * scale, in F32 (the package computes in the scale's dtype, F32
 * here, so its decode and quantd's agree bit for bit). Scales are written in F32 rather than
 * the model's dtype: the loaders convert whatever dtype they find, and F32 loses nothing of
 * what the quantizer chose. The layer is only ever written through a scheme (scheme.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/formats/fmt_internal.h"
#include "quant/formats/scheme.h"

#define FP8_FMT "float-quantized"

static int fp8_check(const qd_qlayer *l, qd_err *err) { return fmt_float_check(&qd_fmt_fp8, l, err); }
static int fp8_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return fmt_float_pack(&qd_fmt_fp8, l, o, e); }
static int fp8_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e) { return fmt_float_unpack(&qd_fmt_fp8, p, o, e); }
static int fp8_deq(const qd_packed *p, float *w, qd_err *e) { return fmt_float_dequant(&qd_fmt_fp8, p, w, e); }

static int fp8_tensors(const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err)
{
    (void)err;
    int cnt = 0;
    fmt_tensor_set(&t[cnt++], "weight", QD_DTYPE_F8_E4M3, 2, p->n, p->k, p->fcodes);
    if (p->row_block < 0) fmt_tensor_set(&t[cnt++], "weight_scale", QD_DTYPE_F32, 1, 1, 0, p->fscales);
    else fmt_tensor_set(&t[cnt++], "weight_scale", QD_DTYPE_F32, 2, p->fscales_shape[0], p->fscales_shape[1], p->fscales);
    if (p->input_scale > 0.0f) fmt_tensor_set(&t[cnt++], "input_scale", QD_DTYPE_F32, 1, 1, 0, &p->input_scale);
    *n_out = cnt;
    return 0;
}

static int fp8_read(qd_fmt_find_fn find, void *ud, int64_t n, int64_t k, const qd_fmt_detected *d, qd_packed *out,
                    qd_err *err)
{
    memset(out, 0, sizeof *out);
    const int64_t rb = d->row_block == 0 ? 1 : d->row_block, G = d->group_size > 0 ? k / d->group_size : 1;
    if (d->group_size > 0 && k % d->group_size)
        return qd_err_set(err, QD_EUNSUPPORTED, FP8_FMT ": in_features %lld is not a multiple of the block's %lld",
                          (long long)k, (long long)d->group_size);
    const int64_t R = fmt_float_scale_rows(n, rb);
    out->n = n; out->k = k; out->bits = 8; out->group_size = d->group_size; out->n_groups = G; out->sym = 1;
    out->grid = QD_GRID_FP8_E4M3; out->scale_rule = QD_SCALE_F32; out->row_block = rb;
    out->fcodes_shape[0] = n; out->fcodes_shape[1] = k;
    out->fscales_shape[0] = R; out->fscales_shape[1] = G;
    int rc = fmt_read_bytes(find, ud, FP8_FMT, "weight", QD_DTYPE_F8_E4M3, n, k, &out->fcodes, err);
    if (!rc) rc = fmt_read_f32(find, ud, FP8_FMT, "weight_scale", R, rb < 0 ? 0 : G, &out->fscales, err);
    for (int64_t i = 0; !rc && i < R * G; i++)
        if (!(out->fscales[i] > 0.0f))
            rc = qd_err_set(err, QD_ENUMERIC, FP8_FMT ": tensor 'weight_scale' holds %g at element %lld (not positive)",
                            (double)out->fscales[i], (long long)i);
    for (int64_t i = 0; !rc && i < n * k; i++)
        if ((out->fcodes[i] & 0x7f) == 0x7f)
            rc = qd_err_set(err, QD_ENUMERIC, FP8_FMT ": tensor 'weight' holds a NaN at row %lld, column %lld",
                            (long long)(i / k), (long long)(i % k));
    if (rc) qd_packed_free(out);
    return rc;
}

static cJSON *fp8_quant_config(const qd_fmt_config_in *in)
{
    const qd_scheme *s = in->scheme;
    cJSON *w = cJSON_CreateObject();
    if (!w || !s) { cJSON_Delete(w); return NULL; }
    cJSON_AddNullToObject(w, "actorder");
    if (s->row_block > 1) {
        cJSON *b = cJSON_AddArrayToObject(w, "block_structure");
        if (b) {
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)s->row_block));
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)s->group_size));
        }
    }
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddNullToObject(w, "group_size");
    cJSON_AddNumberToObject(w, "num_bits", 8);
    cJSON_AddStringToObject(w, "strategy", s->row_block > 1 ? "block" : s->row_block < 0 ? "tensor" : "channel");
    cJSON_AddBoolToObject(w, "symmetric", 1);
    cJSON_AddStringToObject(w, "type", "float");
    return fmt_ct_config(FP8_FMT, w, fmt_ct_acts(s), in);
}

static int fp8_detect(const cJSON *q, const char *what, qd_fmt_detected *d, qd_err *err)
{
    const cJSON *w = NULL;
    int rc = fmt_ct_group(q, FP8_FMT, what, &w, err);
    if (rc <= 0) return rc;
    int64_t bits = 0;
    char strategy[16] = "";
    if ((rc = fmt_json_int(w, "num_bits", &bits, what, err)) ||
        (rc = fmt_json_str(w, "strategy", strategy, sizeof strategy, what, err)))
        return rc;
    if (bits != 8)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: " FP8_FMT " with %lld-bit weights is not read "
                          "(FP8 E4M3 only)", what, (long long)bits);
    d->bits = 8;
    d->sym = 1;
    d->act = fmt_ct_acts_declared(q);
    d->grid = QD_GRID_FP8_E4M3;
    d->scale_rule = QD_SCALE_F32;
    d->group_size = -1;
    if (!strcmp(strategy, "tensor")) {
        d->row_block = -1;
    } else if (!strcmp(strategy, "channel")) {
        d->row_block = 1;
    } else if (!strcmp(strategy, "block")) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(w, "block_structure");
        const cJSON *b0 = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2 ? cJSON_GetArrayItem(b, 0) : NULL;
        const cJSON *b1 = b0 ? cJSON_GetArrayItem(b, 1) : NULL;
        if (!cJSON_IsNumber(b0) || !cJSON_IsNumber(b1) || b0->valuedouble < 1 || b1->valuedouble < 1 ||
            b0->valuedouble > 65536 || b1->valuedouble > 65536)
            return qd_err_set(err, QD_EFORMAT, "%s: quantization_config: block_structure must be two positive integers",
                              what);
        d->row_block = (int64_t)b0->valuedouble;
        d->group_size = (int64_t)b1->valuedouble;
    } else {
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: " FP8_FMT " weights.strategy \"%s\" is not read "
                          "(tensor, channel or block)", what, strategy);
    }
    return 1;
}

const qd_format qd_fmt_fp8 = {
    .name = FP8_FMT, .quant_method = "compressed-tensors", .main_tensor = "weight",
    .summary = "compressed-tensors float-quantized (schemes FP8, FP8_DYNAMIC, FP8_BLOCK): F8_E4M3 weight + F32 "
               "weight_scale (+ input_scale); vLLM CompressedTensorsW8A8Fp8 (CUTLASS FP8), transformers",
    .bits_mask = 1u << 8, .channel_groups = 1,
    .act_order = QD_FMT_ACT_ORDER_STATIC,
    .act_order_why = "the format stores no g_idx",
    .has_g_idx = 0, .zero_offset = 0, .kernel = QD_FMT_KERNEL_FLOAT, .f16_products = 0,
    .grid = QD_GRID_FP8_E4M3, .default_methods = 0, .default_rank = 0,
    .misfit = NULL, .check = fp8_check, .pack = fp8_pack, .unpack = fp8_unpack, .dequant_ref = fp8_deq,
    .tensors = fp8_tensors, .read = fp8_read, .quant_config = fp8_quant_config, .detect = fp8_detect,
};
