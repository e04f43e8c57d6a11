/* compressed-tensors "pack-quantized" (W4A16 / W8A16), what llm-compressor writes and vLLM's
 * CompressedTensorsWNA16 scheme and transformers' compressed-tensors quantizer read
 * (../shared/ref/compressed-tensors.md). Per linear <m>:
 *   <m>.weight_packed     I32 [N, K*b/32]  codes u = q + 2^(b-1), each row one LSB-first stream
 *   <m>.weight_scale      F16 [N, G]       ([N, 1] for the channel strategy)
 *   <m>.weight_shape      I64 [2]          [N, K]
 *   <m>.weight_zero_point I32 [N*b/32, G]  asymmetric only: z packed along N
 * Dequant: W = scale * (u - z), z = 2^(b-1) when symmetric, rounded to F16 (the scale
 * dtype, in which the package and the kernels compute). These are exactly the transposes
 * of GPTQ v2's qweight, scales and qzeros, so in memory a layer is held in the GPTQ kernel
 * layout without g_idx (the kernels and dequant_ref are GPTQ's) and tensors()/read()
 * transpose. Act-order is stored as actorder "weight": static groups, so the groups stay
 * contiguous and no g_idx is written (compressed-tensors 0.20 refuses actorder "group").
 * Layers left in float are listed in `ignore`, with lm_head (a Linear the "Linear" target
 * would otherwise match). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/formats/fmt_internal.h"
#include "quant/formats/scheme.h"

#define CT_FMT "compressed-tensors"

static int ct_misfit(int64_t n, int64_t k, char *why, size_t cap)
{
    if (k % 32 == 0 && n % 32 == 0) return 0;
    snprintf(why, cap, "shape [%lld, %lld] is not a multiple of 32 (quantd packs compressed-tensors in 32-value "
             "blocks)", (long long)n, (long long)k);
    return 1;
}

static int ct_check(const qd_qlayer *l, qd_err *err)
{
    int rc = fmt_check_common(&qd_fmt_ct, l, err);
    if (rc) return rc;
    char why[160];
    if (ct_misfit(l->n, l->k, why, sizeof why)) return qd_err_set(err, QD_ESHAPE, CT_FMT ": %s", why);
    for (int64_t i = 0; i < l->k; i++) {
        int32_t want = l->group_size > 0 ? (int32_t)(i / l->group_size) : 0;
        if (l->g_idx[i] != want)
            return qd_err_set(err, QD_EUNSUPPORTED, CT_FMT ": g_idx[%lld] = %d but the format stores no g_idx (needs %d "
                              "= k / group_size; act-order needs static groups, actorder \"weight\")",
                              (long long)i, l->g_idx[i], want);
    }
    if (l->sym) {
        const int32_t mid = 1 << (l->bits - 1);
        for (int64_t i = 0; i < l->n_groups * l->n; i++)
            if (l->zeros[i] != mid)
                return qd_err_set(err, QD_EINVAL, CT_FMT ": symmetric layer has zero %d at group %lld, column %lld "
                                  "(symmetric stores no zero point, so every zero must be %d)", l->zeros[i],
                                  (long long)(i / l->n), (long long)(i % l->n), mid);
    }
    return 0;
}

static int ct_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return fmt_gptq_layout_pack(&qd_fmt_ct, l, o, e); }
/* compressed-tensors dequantizes in the scale's dtype (forward_helpers._dequantize: (q - zp)
 * * scale in F16 for the F16 scales quantd writes), and so do the serving kernels: the
 * reference rounds each product to F16 so that quantd's decode of a checkpoint is the
 * package's, bit for bit. (The F32 product of an F16 scale and a code difference is exact,
 * so rounding it once gives the F16 product.) */
static int ct_deq(const qd_packed *p, float *w, qd_err *e)
{
    int rc = fmt_gptq_layout_dequant(&qd_fmt_ct, p, w, e);
    for (int64_t i = 0; !rc && i < p->n * p->k; i++) w[i] = qd_f32_round_f16(w[i]);
    return rc;
}

static int ct_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e)
{
    int rc = fmt_gptq_layout_unpack(&qd_fmt_ct, p, o, e);
    if (!rc) o->sym = p->sym;
    return rc;
}

static int ct_tensors(const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err)
{
    const int64_t n = p->n, k = p->k, g = p->n_groups, rw = k * p->bits / 32, nw = n * p->bits / 32;
    int cnt = 0;
    int32_t *wp = malloc((size_t)(n * rw) * sizeof *wp);
    uint16_t *ws = malloc((size_t)(n * g) * sizeof *ws);
    int64_t *shape = malloc(2 * sizeof *shape);
    int32_t *zp = p->sym ? NULL : malloc((size_t)(nw * g) * sizeof *zp);
    if (!wp || !ws || !shape || (!p->sym && !zp)) {
        free(wp); free(ws); free(shape); free(zp);
        return qd_err_set(err, QD_ENOMEM, CT_FMT ": out of memory writing [%lld, %lld]", (long long)n, (long long)k);
    }
    for (int64_t j = 0; j < rw; j++)
        for (int64_t c = 0; c < n; c++) wp[c * rw + j] = p->qweight[j * n + c];
    for (int64_t gi = 0; gi < g; gi++)
        for (int64_t c = 0; c < n; c++) ws[c * g + gi] = p->scales[gi * n + c];
    shape[0] = n;
    shape[1] = k;
    fmt_tensor_set(&t[cnt], "weight_packed", QD_DTYPE_I32, 2, n, rw, wp);
    t[cnt++].owned = wp;
    fmt_tensor_set(&t[cnt], "weight_scale", QD_DTYPE_F16, 2, n, g, ws);
    t[cnt++].owned = ws;
    fmt_tensor_set(&t[cnt], "weight_shape", QD_DTYPE_I64, 1, 2, 0, shape);
    t[cnt++].owned = shape;
    if (zp) {
        for (int64_t gi = 0; gi < g; gi++)
            for (int64_t i = 0; i < nw; i++) zp[i * g + gi] = p->qzeros[gi * nw + i];
        fmt_tensor_set(&t[cnt], "weight_zero_point", QD_DTYPE_I32, 2, nw, g, zp);
        t[cnt++].owned = zp;
    }
    *n_out = cnt;
    return 0;
}

/* A mixed checkpoint's layer (d->bits 0): its bits from weight_packed's width (K * b / 32
 * words a row) and its group size from weight_scale's groups (K / G; one group: the channel
 * strategy, which decodes as a group of K). */
static int ct_layer_shape(qd_fmt_find_fn find, void *ud, int64_t n, int64_t k, qd_fmt_detected *d, qd_err *err)
{
    qd_fmt_tensor wp, ws;
    if (!find(ud, "weight_packed", &wp) || !find(ud, "weight_scale", &ws))
        return qd_err_set(err, QD_ENOTFOUND, CT_FMT ": weight_packed or weight_scale is missing");
    if (wp.ndim != 2 || ws.ndim != 2 || wp.shape[0] != n || ws.shape[0] != n || k <= 0 || (wp.shape[1] * 32) % k ||
        ws.shape[1] < 1 || k % ws.shape[1])
        return qd_err_set(err, QD_ESHAPE, CT_FMT ": weight_packed [%lld, %lld] and weight_scale [%lld, %lld] do not say the "
                          "bits and group size of a [%lld, %lld] layer", (long long)wp.shape[0], (long long)wp.shape[1],
                          (long long)ws.shape[0], (long long)ws.shape[1], (long long)n, (long long)k);
    d->bits = (int)(wp.shape[1] * 32 / k);
    d->group_size = ws.shape[1] == 1 ? -1 : k / ws.shape[1];
    return 0;
}

static int ct_read(qd_fmt_find_fn find, void *ud, int64_t n, int64_t k, const qd_fmt_detected *din,
                   qd_packed *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    qd_fmt_detected dd = *din;
    const qd_fmt_detected *d = &dd;
    if (dd.bits == 0) {
        int rc = ct_layer_shape(find, ud, n, k, &dd, err);
        if (rc) return rc;
    }
    const int b = d->bits;
    if (b < 1 || b > 8 || !(qd_fmt_ct.bits_mask & (1u << b)))
        return qd_err_set(err, QD_EUNSUPPORTED, CT_FMT ": %d-bit weights are not read (4 or 8)", b);
    if (k % 32 || n % 32)
        return qd_err_set(err, QD_EUNSUPPORTED, CT_FMT ": linear [%lld, %lld] is not a multiple of 32 (quantd reads "
                          "compressed-tensors in 32-value blocks)", (long long)n, (long long)k);
    const int64_t gs = d->group_size > 0 ? d->group_size : k, g = (k + gs - 1) / gs;
    const int64_t rw = k * b / 32, nw = n * b / 32;
    out->n = n; out->k = k; out->bits = b; out->group_size = d->group_size; out->n_groups = g;
    out->sym = d->sym;
    out->qweight_shape[0] = rw; out->qweight_shape[1] = n;
    out->qzeros_shape[0] = g; out->qzeros_shape[1] = nw;
    out->scales_shape[0] = g; out->scales_shape[1] = n;
    int32_t *wp = NULL, *zp = NULL;
    uint16_t *ws = NULL;
    qd_fmt_tensor st;
    int rc = fmt_read_i32(find, ud, CT_FMT, "weight_packed", 1, n, rw, &wp, err);
    if (!rc) rc = fmt_read_f16(find, ud, CT_FMT, "weight_scale", n, g, &ws, err);
    if (!rc && !d->sym) rc = fmt_read_i32(find, ud, CT_FMT, "weight_zero_point", 1, nw, g, &zp, err);
    if (!rc && find(ud, "weight_shape", &st)) {
        int64_t v[2] = {0, 0};
        if (st.dtype == QD_DTYPE_I64 && st.ndim == 1 && st.shape[0] == 2) memcpy(v, st.data, sizeof v);
        if (v[0] != n || v[1] != k)
            rc = qd_err_set(err, QD_ESHAPE, CT_FMT ": weight_shape does not hold [%lld, %lld] as I64 [2]",
                            (long long)n, (long long)k);
    } else if (!rc) {
        rc = qd_err_set(err, QD_ENOTFOUND, CT_FMT ": tensor 'weight_shape' is missing");
    }
    if (!rc) {
        out->qweight = malloc((size_t)(rw * n) * sizeof *out->qweight);
        out->qzeros = malloc((size_t)(g * nw) * sizeof *out->qzeros);
        out->scales = malloc((size_t)(g * n) * sizeof *out->scales);
        if (!out->qweight || !out->qzeros || !out->scales) rc = qd_err_set(err, QD_ENOMEM, CT_FMT ": out of memory");
    }
    if (!rc) {
        for (int64_t j = 0; j < rw; j++)
            for (int64_t c = 0; c < n; c++) out->qweight[j * n + c] = wp[c * rw + j];
        for (int64_t gi = 0; gi < g; gi++)
            for (int64_t c = 0; c < n; c++) out->scales[gi * n + c] = ws[c * g + gi];
        if (zp) {
            for (int64_t gi = 0; gi < g; gi++)
                for (int64_t i = 0; i < nw; i++) out->qzeros[gi * nw + i] = zp[i * g + gi];
        } else {
            int32_t *mid = malloc((size_t)(g * n) * sizeof *mid);
            if (!mid) rc = qd_err_set(err, QD_ENOMEM, CT_FMT ": out of memory");
            for (int64_t i = 0; !rc && i < g * n; i++) mid[i] = 1 << (b - 1);
            if (!rc) fmt_gptq_pack_zeros(b, mid, g, n, out->qzeros);
            free(mid);
        }
    }
    free(wp); free(ws); free(zp);
    if (rc) qd_packed_free(out);
    return rc;
}

static cJSON *ct_quant_config(const qd_fmt_config_in *in)
{
    cJSON *w = cJSON_CreateObject();
    if (!w) return NULL;
    if (in->s.desc_act) cJSON_AddStringToObject(w, "actorder", "weight");
    else cJSON_AddNullToObject(w, "actorder");
    cJSON_AddBoolToObject(w, "dynamic", 0);
    if (in->s.group_size > 0) cJSON_AddNumberToObject(w, "group_size", (double)in->s.group_size);
    else cJSON_AddNullToObject(w, "group_size");
    cJSON_AddNumberToObject(w, "num_bits", in->s.bits);
    cJSON_AddStringToObject(w, "strategy", in->s.group_size > 0 ? "group" : "channel");
    cJSON_AddBoolToObject(w, "symmetric", in->s.sym);
    cJSON_AddStringToObject(w, "type", "int");
    /* W4AFP8 declares FP8 activations, dynamic per token (CutlassW4A8 on Hopper). */
    return fmt_ct_config("pack-quantized", w, fmt_ct_acts(in->scheme), in);
}

/* One config group g0 of q (fmt: q's format): 1 with d filled when it is pack-quantized
 * integer weights quantd reads, 0 when it is another descriptor's (a float format), or an
 * error. */
static int ct_group_detect(const cJSON *q, const cJSON *g0, const char *fmt, const char *what, qd_fmt_detected *d,
                           qd_err *err)
{
    char gfmt[32] = "", type[16] = "int", strategy[16] = "", actorder[16] = "";
    int rc;
    const cJSON *w = cJSON_IsObject(g0) ? cJSON_GetObjectItemCaseSensitive(g0, "weights") : NULL;
    if (!cJSON_IsObject(w))
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.config_groups.%s.weights must be an object", what,
                          g0->string ? g0->string : "?");
    if ((rc = fmt_json_str(g0, "format", gfmt, sizeof gfmt, what, err))) return rc;
    const char *eff = gfmt[0] ? gfmt : fmt;
    /* The float formats are other descriptors' (fmt_fp8.c, fmt_fp4.c). */
    for (size_t i = 0; i < qd_format_count(); i++)
        if (qd_format_at(i)->grid != QD_GRID_INT && !strcmp(qd_format_at(i)->name, eff)) return 0;
    if (strcmp(eff, "pack-quantized"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.format \"%s\" is not read (pack-quantized, "
                          "float-quantized, nvfp4-pack-quantized or mxfp4-pack-quantized)", what, eff);
    /* Activations are the server's to quantize; the weights read the same with or without
     * them, as long as they are what a scheme declares (W4AFP8: FP8, dynamic per token). */
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g0, "input_activations");
    if (ia && !cJSON_IsNull(ia)) {
        char atype[16] = "", astrat[16] = "";
        int64_t abits = 0;
        int adyn = 0;
        if ((rc = fmt_json_str(ia, "type", atype, sizeof atype, what, err)) ||
            (rc = fmt_json_str(ia, "strategy", astrat, sizeof astrat, what, err)) ||
            (rc = fmt_json_int(ia, "num_bits", &abits, what, err)))
            return rc;
        const cJSON *dv = cJSON_GetObjectItemCaseSensitive(ia, "dynamic");
        adyn = cJSON_IsTrue(dv);
        if (strcmp(atype, "float") || abits != 8 || strcmp(astrat, "token") || !adyn)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: input_activations %s %lld-bit %s%s are not "
                              "read with pack-quantized weights (weight-only, or W4AFP8's FP8 dynamic per token)", what,
                              atype, (long long)abits, astrat, adyn ? " dynamic" : " static");
    }
    int64_t bits = 0;
    int dynamic = 0;
    const cJSON *ao = cJSON_GetObjectItemCaseSensitive(w, "actorder");
    if (cJSON_IsBool(ao))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: actorder %s is not read (only null or "
                          "\"weight\")", what, cJSON_IsTrue(ao) ? "true" : "false");
    if ((rc = fmt_json_int(w, "num_bits", &bits, what, err)) || (rc = fmt_json_int(w, "group_size", &d->group_size, what, err)) ||
        (rc = fmt_json_bool(w, "symmetric", &d->sym, what, err)) || (rc = fmt_json_bool(w, "dynamic", &dynamic, what, err)) ||
        (rc = fmt_json_str(w, "type", type, sizeof type, what, err)) ||
        (rc = fmt_json_str(w, "strategy", strategy, sizeof strategy, what, err)) ||
        (rc = fmt_json_str(w, "actorder", actorder, sizeof actorder, what, err)))
        return rc;
    if (strcmp(type, "int"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: weights.type \"%s\" is not read (only int)", what, type);
    if (dynamic)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: weights.dynamic true is not read", what);
    if (!strcmp(strategy, "channel") || (!strategy[0] && d->group_size <= 0)) {
        d->group_size = -1;
    } else if (strcmp(strategy, "group") && strategy[0]) {
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: weights.strategy \"%s\" is not read (group or "
                          "channel)", what, strategy);
    }
    if (!actorder[0]) {
        d->desc_act = 0;
    } else if (!strcmp(actorder, "weight") || !strcmp(actorder, "static")) {
        d->desc_act = 1;
    } else {
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: actorder \"%s\" (weight_g_idx) is not read; "
                          "only null or \"weight\" (static groups)", what, actorder);
    }
    d->act = fmt_ct_acts_declared(q);
    d->bits = bits >= 0 && bits <= 64 ? (int)bits : -1;
    return 1;
}

static int ct_detect(const cJSON *q, const char *what, qd_fmt_detected *d, qd_err *err)
{
    char method[32] = "", status[32] = "compressed", fmt[32] = "";
    int rc = fmt_json_str(q, "quant_method", method, sizeof method, what, err);
    if (rc) return rc;
    if (strcmp(method, "compressed-tensors")) return 0;
    if ((rc = fmt_json_str(q, "quantization_status", status, sizeof status, what, err)) ||
        (rc = fmt_json_str(q, "format", fmt, sizeof fmt, what, err)))
        return rc;
    if (strcmp(status, "compressed"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.quantization_status \"%s\" is not read (only "
                          "\"compressed\" checkpoints hold packed weights)", what, status);
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    int ng = cJSON_IsObject(groups) ? cJSON_GetArraySize(groups) : 0;
    if (ng < 1)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.config_groups holds no scheme", what);
    rc = ct_group_detect(q, groups->child, fmt, what, d, err);
    if (rc != 1 || ng == 1) return rc;
    /* Several groups (job.target_bpw writes one per bits and group size, each naming its
     * modules): read when they differ only in bits and group size, which each layer's
     * tensors then say (ct_read, d->bits 0). */
    for (const cJSON *g = groups->child->next; g; g = g->next) {
        qd_fmt_detected o;
        memset(&o, 0, sizeof o);
        rc = ct_group_detect(q, g, fmt, what, &o, err);
        if (rc < 0) return rc;
        if (rc == 0 || o.sym != d->sym || o.desc_act != d->desc_act)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.config_groups: group %s differs from %s in more "
                              "than bits and group size (quantd reads mixed pack-quantized checkpoints whose groups share "
                              "format, symmetry and act-order)", what, g->string ? g->string : "?",
                              groups->child->string ? groups->child->string : "?");
        if (o.bits != d->bits || o.group_size != d->group_size) d->mixed = 1;
    }
    if (d->mixed) {
        d->bits = 0;
        d->group_size = 0;
    }
    return 1;
}
const qd_format qd_fmt_ct = {
    .name = CT_FMT, .quant_method = "compressed-tensors", .main_tensor = "weight_packed",
    .summary = "compressed-tensors pack-quantized (llm-compressor's W4A16/W8A16): weight_packed/weight_scale/"
               "weight_shape(/weight_zero_point); transformers (CompressedTensorsConfig), vLLM "
               "CompressedTensorsWNA16 (Machete, Marlin)",
    .bits_mask = (1u << 4) | (1u << 8), .channel_groups = 1,
    .act_order = QD_FMT_ACT_ORDER_STATIC,
    .act_order_why = "the compressed-tensors package refuses actorder \"group\" with a g_idx, so act-order is "
                     "written as actorder \"weight\"",
    .has_g_idx = 0, .zero_offset = 0, .kernel = QD_FMT_KERNEL_GPTQ, .f16_products = 1,
    .default_methods = 0, .default_rank = 0,
    .misfit = ct_misfit, .check = ct_check, .pack = ct_pack, .unpack = ct_unpack, .dequant_ref = ct_deq,
    .tensors = ct_tensors, .read = ct_read, .quant_config = ct_quant_config, .detect = ct_detect,
};
