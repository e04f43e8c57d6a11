/* compressed-tensors' FP4 formats: "nvfp4-pack-quantized" (schemes NVFP4A16, NVFP4) and
 * "mxfp4-pack-quantized" (MXFP4A16, MXFP4), what llm-compressor writes and vLLM's
 * CompressedTensorsW4A4Fp4 / W4A16Fp4 and MXFP4 schemes read
 * (../shared/ref/compressed-tensors.md). Per linear <m>:
 *   <m>.weight_packed        U8 [N, K/2]: two E2M1 codes a byte, the even k in the low nibble
 *                            (the package's pack_fp4_to_uint8 / unpack_fp4_from_uint8)
 *   NVFP4: <m>.weight_scale  F8_E4M3 [N, K/16]; <m>.weight_global_scale F32 [1]; NVFP4 also
 *          <m>.input_global_scale F32 [1] = 448 * 6 / amax of the calibration inputs
 *   MXFP4: <m>.weight_scale  U8 [N, K/32]: E8M0 exponents, scale = 2^(e - 127)
 * Dequant: NVFP4 W = e2m1 * (scale / global_scale), the division first in F32 (the package's
 * _dequantize); MXFP4 W = e2m1 * 2^(e - 127). The package hands decompressed FP4 weights back
 * in bfloat16; quantd's F32 decode rounded to bfloat16 is the package's, bit for bit (every
 * MXFP4 value is exact in bfloat16). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/minifloat.h"
#include "quant/formats/fmt_internal.h"
#include "quant/formats/scheme.h"

#define NV_FMT "nvfp4-pack-quantized"
#define MX_FMT "mxfp4-pack-quantized"

static int nv(const qd_format *f) { return f == &qd_fmt_nvfp4; }

static int fp4_tensors_for(const qd_format *f, const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err)
{
    const int64_t n = p->n, G = p->n_groups;
    uint8_t *sc = malloc((size_t)(n * G));
    if (!sc) return qd_err_set(err, QD_ENOMEM, "%s: out of memory writing [%lld, %lld]", f->name, (long long)n, (long long)p->k);
    for (int64_t i = 0; i < n * G; i++) {
        float s = p->fscales[i];
        if (nv(f)) {
            sc[i] = qd_f32_to_fp8_e4m3(s);
        } else {
            int e;
            frexpf(s, &e);
            sc[i] = (uint8_t)(e - 1 + 127);
        }
    }
    int cnt = 0;
    fmt_tensor_set(&t[cnt++], "weight_packed", QD_DTYPE_U8, 2, n, p->k / 2, p->fcodes);
    fmt_tensor_set(&t[cnt], "weight_scale", nv(f) ? QD_DTYPE_F8_E4M3 : QD_DTYPE_U8, 2, n, G, sc);
    t[cnt++].owned = sc;
    if (nv(f)) fmt_tensor_set(&t[cnt++], "weight_global_scale", QD_DTYPE_F32, 1, 1, 0, &p->global_scale);
    if (nv(f) && p->input_scale > 0.0f) fmt_tensor_set(&t[cnt++], "input_global_scale", QD_DTYPE_F32, 1, 1, 0, &p->input_scale);
    *n_out = cnt;
    return 0;
}

static int fp4_read_for(const qd_format *f, qd_fmt_find_fn find, void *ud, int64_t n, int64_t k,
                        const qd_fmt_detected *d, qd_packed *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    const int64_t gs = d->group_size;
    if (gs <= 0 || k % gs || k % 2)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: in_features %lld is not a multiple of group_size %lld", f->name,
                          (long long)k, (long long)gs);
    const int64_t G = k / gs;
    out->n = n; out->k = k; out->bits = 4; out->group_size = gs; out->n_groups = G; out->sym = 1;
    out->grid = QD_GRID_FP4_E2M1; out->scale_rule = nv(f) ? QD_SCALE_FP8_GLOBAL : QD_SCALE_E8M0; out->row_block = 1;
    out->fcodes_shape[0] = n; out->fcodes_shape[1] = k / 2;
    out->fscales_shape[0] = n; out->fscales_shape[1] = G;
    uint8_t *sc = NULL;
    float *gsv = NULL;
    int rc = fmt_read_bytes(find, ud, f->name, "weight_packed", QD_DTYPE_U8, n, k / 2, &out->fcodes, err);
    if (!rc && nv(f)) rc = fmt_read_f32(find, ud, f->name, "weight_scale", n, G, &out->fscales, err);
    if (!rc && !nv(f)) rc = fmt_read_bytes(find, ud, f->name, "weight_scale", QD_DTYPE_U8, n, G, &sc, err);
    if (!rc && !nv(f)) {
        out->fscales = malloc((size_t)(n * G) * sizeof *out->fscales);
        if (!out->fscales) rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", f->name);
        for (int64_t i = 0; !rc && i < n * G; i++) {
            if (sc[i] == 0xff)
                rc = qd_err_set(err, QD_ENUMERIC, "%s: tensor 'weight_scale' holds the E8M0 NaN (255) at element %lld",
                                f->name, (long long)i);
            else out->fscales[i] = qd_e8m0_to_f32(sc[i]);
        }
    }
    for (int64_t i = 0; !rc && nv(f) && i < n * G; i++)
        if (!(out->fscales[i] > 0.0f))
            rc = qd_err_set(err, QD_ENUMERIC, "%s: tensor 'weight_scale' holds %g at element %lld (not positive)",
                            f->name, (double)out->fscales[i], (long long)i);
    if (!rc && nv(f)) rc = fmt_read_f32(find, ud, f->name, "weight_global_scale", 1, 0, &gsv, err);
    if (!rc && nv(f)) {
        if (!(gsv[0] > 0.0f))
            rc = qd_err_set(err, QD_ENUMERIC, "%s: tensor 'weight_global_scale' is %g (not positive)", f->name,
                            (double)gsv[0]);
        out->global_scale = gsv[0];
    }
    free(sc);
    free(gsv);
    if (rc) qd_packed_free(out);
    return rc;
}

static cJSON *fp4_config_for(const qd_format *f, const qd_fmt_config_in *in)
{
    const qd_scheme *s = in->scheme;
    cJSON *w = cJSON_CreateObject();
    if (!w || !s) { cJSON_Delete(w); return NULL; }
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddNumberToObject(w, "group_size", (double)s->group_size);
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "scale_dtype", nv(f) ? "torch.float8_e4m3fn" : "torch.uint8");
    cJSON_AddStringToObject(w, "strategy", nv(f) ? "tensor_group" : "group");
    cJSON_AddBoolToObject(w, "symmetric", 1);
    cJSON_AddStringToObject(w, "type", "float");
    return fmt_ct_config(f->name, w, fmt_ct_acts(s), in);
}

static int fp4_detect_for(const qd_format *f, const cJSON *q, const char *what, qd_fmt_detected *d, qd_err *err)
{
    const cJSON *w = NULL;
    int rc = fmt_ct_group(q, f->name, what, &w, err);
    if (rc <= 0) return rc;
    int64_t bits = 0, gs = -1;
    int sym = 1;
    if ((rc = fmt_json_int(w, "num_bits", &bits, what, err)) || (rc = fmt_json_int(w, "group_size", &gs, what, err)) ||
        (rc = fmt_json_bool(w, "symmetric", &sym, what, err)))
        return rc;
    const int64_t want = nv(f) ? 16 : 32;
    if (bits != 4 || gs != want || !sym)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config: %s holds symmetric 4-bit weights in groups "
                          "of %lld (found %lld bits, group_size %lld%s)", what, f->name, (long long)want,
                          (long long)bits, (long long)gs, sym ? "" : ", asymmetric");
    d->bits = 4;
    d->act = fmt_ct_acts_declared(q);
    d->group_size = gs;
    d->sym = 1;
    d->grid = QD_GRID_FP4_E2M1;
    d->scale_rule = nv(f) ? QD_SCALE_FP8_GLOBAL : QD_SCALE_E8M0;
    d->row_block = 1;
    return 1;
}

static int fp4_misfit(int64_t n, int64_t k, char *why, size_t cap)
{
    (void)n;
    if (k % 2 == 0) return 0;
    snprintf(why, cap, "in_features %lld is odd (FP4 packs two values a byte)", (long long)k);
    return 1;
}

#define FP4_WRAPPERS(P, F)                                                                                          \
    static int P##_check(const qd_qlayer *l, qd_err *e) { return fmt_float_check(&F, l, e); }                     \
    static int P##_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return fmt_float_pack(&F, l, o, e); }       \
    static int P##_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e) { return fmt_float_unpack(&F, p, o, e); }   \
    static int P##_deq(const qd_packed *p, float *w, qd_err *e) { return fmt_float_dequant(&F, p, w, e); }         \
    static int P##_tensors(const qd_packed *p, qd_fmt_tensor *t, int *n, qd_err *e)                                \
    {                                                                                                               \
        return fp4_tensors_for(&F, p, t, n, e);                                                                     \
    }                                                                                                               \
    static int P##_read(qd_fmt_find_fn fi, void *ud, int64_t n, int64_t k, const qd_fmt_detected *d, qd_packed *o, \
                        qd_err *e)                                                                                  \
    {                                                                                                               \
        return fp4_read_for(&F, fi, ud, n, k, d, o, e);                                                             \
    }                                                                                                               \
    static cJSON *P##_config(const qd_fmt_config_in *in) { return fp4_config_for(&F, in); }                        \
    static int P##_detect(const cJSON *q, const char *w, qd_fmt_detected *d, qd_err *e)                            \
    {                                                                                                               \
        return fp4_detect_for(&F, q, w, d, e);                                                                      \
    }

FP4_WRAPPERS(nv, qd_fmt_nvfp4)
FP4_WRAPPERS(mx, qd_fmt_mxfp4)

#define FP4_DESC(P)                                                                                                 \
    .main_tensor = "weight_packed", .quant_method = "compressed-tensors", .bits_mask = 1u << 4,                    \
    .channel_groups = 0, .channel_why = "scales are per group of values", .act_order = QD_FMT_ACT_ORDER_STATIC,   \
    .act_order_why = "the format stores no g_idx", .has_g_idx = 0, .zero_offset = 0,                             \
    .kernel = QD_FMT_KERNEL_FLOAT, .f16_products = 0, .grid = QD_GRID_FP4_E2M1, .default_methods = 0,              \
    .default_rank = 0, .misfit = fp4_misfit, .check = P##_check, .pack = P##_pack, .unpack = P##_unpack,            \
    .dequant_ref = P##_deq, .tensors = P##_tensors, .read = P##_read, .quant_config = P##_config,                 \
    .detect = P##_detect

const qd_format qd_fmt_nvfp4 = {
    .name = NV_FMT,
    .summary = "compressed-tensors nvfp4-pack-quantized (schemes NVFP4A16, NVFP4): weight_packed U8 + F8_E4M3 "
               "weight_scale per 16 + weight_global_scale; vLLM CompressedTensorsW4A4Fp4 / W4A16Fp4 (Blackwell)",
    FP4_DESC(nv),
};

const qd_format qd_fmt_mxfp4 = {
    .name = MX_FMT,
    .summary = "compressed-tensors mxfp4-pack-quantized (schemes MXFP4A16, MXFP4): weight_packed U8 + E8M0 "
               "weight_scale per 32; vLLM MXFP4 (Blackwell)",
    FP4_DESC(mx),
};
