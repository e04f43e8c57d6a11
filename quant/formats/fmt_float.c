/* What the float-grid formats (FP8 float-quantized, NVFP4, MXFP4: fmt_fp8.c, fmt_fp4.c)
 * share: the layer checks, packing a qd_qlayer into qd_packed's float fields and back, the
 * scalar decode every kernel is tested against, and compressed-tensors' quantization_config
 * around a float scheme. In memory: fcodes (E4M3 bytes [N, K], or E2M1 nibbles two a byte,
 * [N, K/2], the even k low) and fscales [R, G] F32, R = N / row_block (format.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/minifloat.h"
#include "quant/formats/fmt_internal.h"
#include "quant/formats/quantizer.h"
#include "quant/formats/scheme.h"
#include "quant/formats/serving.h"

static int fp4(const qd_format *f) { return f->grid == QD_GRID_FP4_E2M1; }
static int packed_shapes_ok(const qd_format *f, const qd_packed *p, qd_err *err);

int64_t fmt_float_scale_rows(int64_t n, int64_t row_block)
{
    if (row_block < 0) return 1;
    if (row_block <= 1) return n;
    return (n + row_block - 1) / row_block;
}

/* The row of scales row r reads. */
static int64_t scale_row(int64_t r, int64_t row_block)
{
    return row_block < 0 ? 0 : row_block <= 1 ? r : r / row_block;
}

/* Whether s can be stored as the format's scale type (F32 always; E4M3 for NVFP4, a
 * power of two in E8M0's range for MXFP4). */
static int scale_storable(qd_scale_rule rule, float s)
{
    if (!(s > 0.0f) || !isfinite(s)) return 0;
    if (rule == QD_SCALE_FP8_GLOBAL) return qd_f32_round_fp8_e4m3(s) == s && s <= QD_FP8_E4M3_MAX;
    if (rule == QD_SCALE_E8M0) {
        int e;
        float m = frexpf(s, &e);
        return m == 0.5f && e - 1 >= -127 && e - 1 <= 127;
    }
    return 1;
}

int fmt_float_check(const qd_format *f, const qd_qlayer *l, qd_err *err)
{
    const char *fn = f->name;
    if (!l || !l->q || !l->scales || !l->g_idx) return qd_err_set(err, QD_EINVAL, "%s: layer arrays missing", fn);
    if (l->n <= 0 || l->k <= 0)
        return qd_err_set(err, QD_ESHAPE, "%s: shape [%lld, %lld] must be positive", fn, (long long)l->n,
                          (long long)l->k);
    if (l->grid != f->grid)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: the layer is on the %s grid, the format holds %s", fn,
                          qd_grid_name(l->grid), qd_grid_name(f->grid));
    if (fp4(f) && l->scale_rule != (f == &qd_fmt_nvfp4 ? QD_SCALE_FP8_GLOBAL : QD_SCALE_E8M0))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: the layer's scales follow another rule", fn);
    if (f == &qd_fmt_nvfp4 && (!(l->global_scale > 0.0f) || !isfinite(l->global_scale)))
        return qd_err_set(err, QD_ENUMERIC, "%s: global scale %g is not positive and finite", fn, (double)l->global_scale);
    if (l->group_size == 0 || l->group_size < -1 || (l->group_size > 0 && l->k % l->group_size))
        return qd_err_set(err, QD_ESHAPE, "%s: in_features %lld is not a multiple of group_size %lld", fn,
                          (long long)l->k, (long long)l->group_size);
    if (fp4(f) && l->k % 2)
        return qd_err_set(err, QD_ESHAPE, "%s: in_features %lld is odd (two values a byte)", fn, (long long)l->k);
    const int64_t G = l->group_size > 0 ? l->k / l->group_size : 1;
    if (l->n_groups != G) return qd_err_set(err, QD_ESHAPE, "%s: n_groups %lld does not match", fn, (long long)l->n_groups);
    for (int64_t i = 0; i < l->k; i++)
        if (l->g_idx[i] != (l->group_size > 0 ? (int32_t)(i / l->group_size) : 0))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: g_idx[%lld] = %d, but the format stores no g_idx (act-order "
                              "needs static groups)", fn, (long long)i, l->g_idx[i]);
    const int maxq = fp4(f) ? 15 : 255;
    for (int64_t i = 0; i < l->n * l->k; i++)
        if (l->q[i] > maxq || (!fp4(f) && (l->q[i] & 0x7f) == 0x7f))
            return qd_err_set(err, QD_EINVAL, "%s: code %d at row %lld, column %lld is not a %s value", fn, l->q[i],
                              (long long)(i / l->k), (long long)(i % l->k), fp4(f) ? "4-bit E2M1" : "finite E4M3");
    for (int64_t g = 0; g < G; g++)
        for (int64_t r = 0; r < l->n; r++) {
            float s = l->scales[g * l->n + r];
            if (!scale_storable(l->scale_rule, s))
                return qd_err_set(err, QD_ENUMERIC, "%s: scale %g of group %lld, row %lld cannot be stored", fn, (double)s,
                                  (long long)g, (long long)r);
            int64_t first = l->row_block < 0 ? 0 : l->row_block > 1 ? r / l->row_block * l->row_block : r;
            if (s != l->scales[g * l->n + first])
                return qd_err_set(err, QD_EINVAL, "%s: rows %lld and %lld share a scale block but not a scale", fn,
                                  (long long)first, (long long)r);
        }
    return 0;
}

int fmt_float_pack(const qd_format *f, const qd_qlayer *l, qd_packed *o, qd_err *err)
{
    memset(o, 0, sizeof *o);
    int rc = fmt_float_check(f, l, err);
    if (rc) return rc;
    const int64_t n = l->n, k = l->k, G = l->n_groups, R = fmt_float_scale_rows(n, l->row_block);
    const int64_t cols = fp4(f) ? k / 2 : k;
    o->n = n;
    o->k = k;
    o->bits = l->bits;
    o->group_size = l->group_size;
    o->n_groups = G;
    o->sym = 1;
    o->grid = l->grid;
    o->scale_rule = l->scale_rule;
    o->global_scale = l->scale_rule == QD_SCALE_FP8_GLOBAL ? l->global_scale : 0.0f;
    o->row_block = l->row_block == 0 ? 1 : l->row_block;
    o->fcodes_shape[0] = n;
    o->fcodes_shape[1] = cols;
    o->fscales_shape[0] = R;
    o->fscales_shape[1] = G;
    o->fcodes = malloc((size_t)(n * cols));
    o->fscales = malloc((size_t)(R * G) * sizeof *o->fscales);
    if (l->bias) o->bias = malloc((size_t)n * sizeof *o->bias);
    if (!o->fcodes || !o->fscales || (l->bias && !o->bias)) {
        qd_packed_free(o);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory packing [%lld, %lld]", f->name, (long long)n, (long long)k);
    }
    if (fp4(f)) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < cols; j++)
                o->fcodes[r * cols + j] = (uint8_t)(l->q[r * k + 2 * j] | (l->q[r * k + 2 * j + 1] << 4));
    } else {
        memcpy(o->fcodes, l->q, (size_t)(n * k));
    }
    for (int64_t rr = 0; rr < R; rr++)
        for (int64_t g = 0; g < G; g++) {
            int64_t r = l->row_block < 0 ? 0 : l->row_block > 1 ? rr * l->row_block : rr;
            o->fscales[rr * G + g] = l->scales[g * n + r];
        }
    if (l->bias) {
        o->bias_len = n;
        for (int64_t i = 0; i < n; i++) o->bias[i] = qd_f32_to_f16(l->bias[i]);
    }
    return 0;
}

int fmt_float_unpack(const qd_format *f, const qd_packed *p, qd_qlayer *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = packed_shapes_ok(f, p, err);
    if (rc) return rc;
    rc = qd_qlayer_alloc(out, p->n, p->k, p->bits, 1, p->group_size, p->bias != NULL, err);
    if (rc) return rc;
    out->grid = p->grid;
    out->scale_rule = p->scale_rule;
    out->global_scale = p->global_scale;
    out->row_block = p->row_block;
    const int64_t n = p->n, k = p->k, G = p->n_groups, cols = fp4(f) ? k / 2 : k;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < k; i++)
            out->q[r * k + i] = fp4(f) ? (uint8_t)((p->fcodes[r * cols + i / 2] >> (4 * (i & 1))) & 15)
                                       : p->fcodes[r * k + i];
        for (int64_t g = 0; g < G; g++) {
            out->scales[g * n + r] = p->fscales[scale_row(r, p->row_block) * G + g];
            out->zeros[g * n + r] = 0;
        }
    }
    for (int64_t i = 0; p->bias && i < n; i++) out->bias[i] = qd_f16_to_f32(p->bias[i]);
    return 0;
}

/* The packed layer's arrays have the shapes its header says (a damaged or hand-made
 * qd_packed is refused before anything is read through it). */
static int packed_shapes_ok(const qd_format *f, const qd_packed *p, qd_err *err)
{
    if (!p->fcodes || !p->fscales || p->grid != f->grid)
        return qd_err_set(err, QD_EINVAL, "%s: the packed layer holds no %s weights", f->name, qd_grid_name(f->grid));
    const int64_t gl = p->group_size > 0 ? p->group_size : p->k;
    const int64_t G = p->group_size > 0 ? p->k / gl : 1, R = fmt_float_scale_rows(p->n, p->row_block);
    const int64_t cols = fp4(f) ? p->k / 2 : p->k;
    if (p->n <= 0 || p->k <= 0 || (p->group_size > 0 && p->k % gl) || (fp4(f) && p->k % 2) || p->n_groups != G ||
        p->fscales_shape[0] != R || p->fscales_shape[1] != G || p->fcodes_shape[0] != p->n || p->fcodes_shape[1] != cols)
        return qd_err_set(err, QD_ESHAPE, "%s: packed layer [%lld, %lld] has codes [%lld, %lld] and scales [%lld, %lld] "
                          "for %lld groups, expected [%lld, %lld] and [%lld, %lld]", f->name, (long long)p->n,
                          (long long)p->k, (long long)p->fcodes_shape[0], (long long)p->fcodes_shape[1],
                          (long long)p->fscales_shape[0], (long long)p->fscales_shape[1], (long long)p->n_groups,
                          (long long)p->n, (long long)cols, (long long)R, (long long)G);
    return 0;
}

int fmt_float_dequant(const qd_format *f, const qd_packed *p, float *w, qd_err *err)
{
    int rc = packed_shapes_ok(f, p, err);
    if (rc) return rc;
    qd_quant_cfg c = qd_quant_cfg_default();
    c.grid = p->grid;
    c.scale_rule = p->scale_rule;
    c.global_scale = p->global_scale;
    const int64_t n = p->n, k = p->k, G = p->n_groups, gl = p->group_size > 0 ? p->group_size : k;
    const int64_t cols = fp4(f) ? k / 2 : k;
    for (int64_t r = 0; r < n; r++) {
        const float *srow = p->fscales + scale_row(r, p->row_block) * G;
        for (int64_t i = 0; i < k; i++) {
            int code = fp4(f) ? (p->fcodes[r * cols + i / 2] >> (4 * (i & 1))) & 15 : p->fcodes[r * k + i];
            w[r * k + i] = qd_quant_dequant_cfg(&c, code, srow[i / gl], 0.0f);
        }
    }
    return 0;
}

/* ---- compressed-tensors' quantization_config ---- */

cJSON *fmt_ct_acts(const qd_scheme *s)
{
    if (!s || s->act == QD_ACT_NONE) return NULL;
    cJSON *a = cJSON_CreateObject();
    if (!a) return NULL;
    const int fp4a = s->act == QD_ACT_NVFP4 || s->act == QD_ACT_MXFP4;
    cJSON_AddNumberToObject(a, "num_bits", fp4a ? 4 : 8);
    cJSON_AddStringToObject(a, "type", "float");
    cJSON_AddBoolToObject(a, "symmetric", 1);
    switch (s->act) {
    case QD_ACT_FP8_TOKEN:
        cJSON_AddNullToObject(a, "group_size");
        cJSON_AddStringToObject(a, "strategy", "token");
        cJSON_AddBoolToObject(a, "dynamic", 1);
        break;
    case QD_ACT_FP8_GROUP128:
        cJSON_AddNumberToObject(a, "group_size", 128);
        cJSON_AddStringToObject(a, "strategy", "group");
        cJSON_AddBoolToObject(a, "dynamic", 1);
        break;
    case QD_ACT_FP8_TENSOR:
        cJSON_AddNullToObject(a, "group_size");
        cJSON_AddStringToObject(a, "strategy", "tensor");
        cJSON_AddBoolToObject(a, "dynamic", 0);
        cJSON_AddStringToObject(a, "observer", "static_minmax");
        break;
    case QD_ACT_NVFP4:
        cJSON_AddNumberToObject(a, "group_size", 16);
        cJSON_AddStringToObject(a, "strategy", "tensor_group");
        cJSON_AddStringToObject(a, "dynamic", "local");
        cJSON_AddStringToObject(a, "scale_dtype", "torch.float8_e4m3fn");
        cJSON_AddStringToObject(a, "observer", "static_minmax");
        break;
    default: /* QD_ACT_MXFP4 */
        cJSON_AddNumberToObject(a, "group_size", 32);
        cJSON_AddStringToObject(a, "strategy", "group");
        cJSON_AddBoolToObject(a, "dynamic", 1);
        cJSON_AddStringToObject(a, "scale_dtype", "torch.uint8");
        break;
    }
    return a;
}

cJSON *fmt_ct_config(const char *format, cJSON *weights, cJSON *acts, const qd_fmt_config_in *in)
{
    /* The keys and values compressed-tensors' ModelCompressor writes, in its (sorted) order. */
    cJSON *q = cJSON_CreateObject();
    cJSON *groups = q ? cJSON_AddObjectToObject(q, "config_groups") : NULL;
    cJSON *g0 = groups ? cJSON_AddObjectToObject(groups, "group_0") : NULL;
    if (!g0 || !weights) {
        cJSON_Delete(q);
        cJSON_Delete(weights);
        cJSON_Delete(acts);
        return NULL;
    }
    cJSON_AddStringToObject(g0, "format", format);
    if (acts) cJSON_AddItemToObject(g0, "input_activations", acts);
    else cJSON_AddNullToObject(g0, "input_activations");
    cJSON_AddNullToObject(g0, "output_activations");
    static const char *const linear[] = {"Linear"};
    cJSON_AddItemToObject(g0, "targets", fmt_json_strings(linear, 1));
    cJSON_AddItemToObject(g0, "weights", weights);
    cJSON_AddStringToObject(q, "format", format);
    cJSON_AddNullToObject(q, "global_compression_ratio");
    cJSON *ign = cJSON_AddArrayToObject(q, "ignore");
    if (!ign) { cJSON_Delete(q); return NULL; }
    cJSON_AddItemToArray(ign, cJSON_CreateString("lm_head"));
    for (size_t i = 0; i < in->n_float; i++) cJSON_AddItemToArray(ign, cJSON_CreateString(in->float_modules[i]));
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON_AddItemToObject(q, "sparsity_config", cJSON_CreateObject());
    cJSON_AddItemToObject(q, "transform_config", cJSON_CreateObject());
    cJSON_AddStringToObject(q, "version", "0.20.0");
    return q;
}

int fmt_ct_acts_declared(const cJSON *q)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    const cJSON *g0 = cJSON_IsObject(groups) ? groups->child : NULL;
    const cJSON *ia = cJSON_IsObject(g0) ? cJSON_GetObjectItemCaseSensitive(g0, "input_activations") : NULL;
    if (!cJSON_IsObject(ia)) return QD_SRV_ACT_NONE;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ia, "type"), *b = cJSON_GetObjectItemCaseSensitive(ia, "num_bits");
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "float") || !cJSON_IsNumber(b)) return QD_SRV_ACT_NONE;
    return b->valuedouble == 8 ? QD_SRV_ACT_FP8 : b->valuedouble == 4 ? QD_SRV_ACT_FP4 : QD_SRV_ACT_NONE;
}

int fmt_ct_group(const cJSON *q, const char *format, const char *what, const cJSON **w, qd_err *err)
{
    char method[32] = "", status[32] = "compressed", fmt[32] = "", gfmt[32] = "";
    int rc = fmt_json_str(q, "quant_method", method, sizeof method, what, err);
    if (rc) return rc;
    if (strcmp(method, "compressed-tensors")) return 0;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    const cJSON *g0 = cJSON_IsObject(groups) && cJSON_GetArraySize(groups) == 1 ? groups->child : NULL;
    if ((rc = fmt_json_str(q, "format", fmt, sizeof fmt, what, err))) return rc;
    if (cJSON_IsObject(g0) && (rc = fmt_json_str(g0, "format", gfmt, sizeof gfmt, what, err))) return rc;
    if (strcmp(gfmt[0] ? gfmt : fmt, format)) return 0;
    if ((rc = fmt_json_str(q, "quantization_status", status, sizeof status, what, err))) return rc;
    if (strcmp(status, "compressed"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.quantization_status \"%s\" is not read (only "
                          "\"compressed\" checkpoints hold packed weights)", what, status);
    if (!g0)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.config_groups must hold exactly one scheme", what);
    *w = cJSON_GetObjectItemCaseSensitive(g0, "weights");
    if (!cJSON_IsObject(*w))
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.config_groups.%s.weights must be an object", what,
                          g0->string ? g0->string : "?");
    char type[16] = "";
    int dynamic = 0;
    if ((rc = fmt_json_str(*w, "type", type, sizeof type, what, err)) ||
        (rc = fmt_json_bool(*w, "dynamic", &dynamic, what, err)))
        return rc;
    if (strcmp(type, "float"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: %s weights of type \"%s\" are not read (float)",
                          what, format, type);
    if (dynamic) return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: weights.dynamic true is not read", what);
    return 1;
}
