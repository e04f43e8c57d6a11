/* GPTQ checkpoints, v1 ("gptq") and v2 ("gptq_v2"): qweight [K*b/32, N] packed along K,
 * qzeros [G, N*b/32] packed along N, scales [G, N] F16, g_idx [K].
 *
 * The only difference between the two is the stored zero: v1 stores z - 1 and every v1
 * loader adds the 1 back, so a zero of 0 would be stored as -1, whose sign bits spill
 * into the neighbouring fields; v1 therefore refuses such layers (quantize with
 * zero_min1 or write v2). v2 stores z itself.
 *
 * Both write quant_method "gptq" (checkpoint_format tells them apart; AutoGPTQ, GPTQModel,
 * transformers and vLLM read it) and declare layers left in float as `dynamic` "-:" rules,
 * GPTQModel's per-module override. The packing routines are also compressed-tensors'
 * in-memory layout (fmt_ct.c), hence fmt_gptq_layout_*. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/dtype.h"
#include "quant/formats/fmt_gptq_dynamic.h"
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

static int gptq_misfit(int64_t n, int64_t k, char *why, size_t cap)
{
    if (k % 32 == 0 && n % 32 == 0) return 0;
    snprintf(why, cap, "shape [%lld, %lld] is not a multiple of 32 (GPTQ packing)", (long long)n, (long long)k);
    return 1;
}

void fmt_gptq_pack_zeros(int bits, const int32_t *z, int64_t g, int64_t n, int32_t *qzeros)
{
    const int64_t nw = n * bits / 32;
    for (int64_t gi = 0; gi < g; gi++) qd_pack_bits(bits, z + gi * n, n, 1, qzeros + gi * nw, 1);
}

int fmt_gptq_layout_pack(const qd_format *f, const qd_qlayer *l, qd_packed *out, qd_err *err)
{
    int rc = f->check(l, err);
    if (rc) return rc;
    rc = fmt_packed_begin(l, out, err);
    if (rc) return rc;
    const int b = l->bits;
    const int64_t n = l->n, k = l->k, g = l->n_groups, nw = n * b / 32, kw = k * b / 32;
    /* qweight is [k * b / 32, n]: a column's words lie n apart. Columns are packed PACK_TILE
     * at a time into cols (one column's words contiguous), then written out row by row, so
     * each write fills consecutive words instead of one word per cache line. */
    enum { PACK_TILE = 16 };
    int64_t tmp_len = k > n ? k : n;
    int32_t *tmp = malloc((size_t)tmp_len * sizeof *tmp);
    int32_t *cols = malloc((size_t)(PACK_TILE * kw) * sizeof *cols);
    out->qweight = calloc((size_t)(k * b / 32 * n), sizeof *out->qweight);
    out->qzeros = calloc((size_t)(g * nw), sizeof *out->qzeros);
    if (f->has_g_idx) out->g_idx = malloc((size_t)k * sizeof *out->g_idx);
    if (!tmp || !cols || !out->qweight || !out->qzeros || (f->has_g_idx && !out->g_idx)) {
        free(tmp);
        free(cols);
        qd_packed_free(out);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory packing [%lld, %lld]", f->name,
                          (long long)n, (long long)k);
    }
    out->qweight_shape[0] = k * b / 32;
    out->qweight_shape[1] = n;
    out->qzeros_shape[0] = g;
    out->qzeros_shape[1] = nw;
    out->g_idx_len = f->has_g_idx ? k : 0;
    out->sym = l->sym;
    for (int64_t c0 = 0; c0 < n; c0 += PACK_TILE) {
        const int64_t nt = n - c0 < PACK_TILE ? n - c0 : PACK_TILE;
        for (int64_t t = 0; t < nt; t++) {
            const uint8_t *q = l->q + (c0 + t) * k;
            for (int64_t i = 0; i < k; i++) tmp[i] = q[i];
            qd_pack_bits(b, tmp, k, 1, cols + t * kw, 1);
        }
        for (int64_t w = 0; w < kw; w++)
            for (int64_t t = 0; t < nt; t++) out->qweight[w * n + c0 + t] = cols[t * kw + w];
    }
    free(cols);
    for (int64_t gi = 0; gi < g; gi++) {
        for (int64_t c = 0; c < n; c++) tmp[c] = l->zeros[gi * n + c] - f->zero_offset;
        qd_pack_bits(b, tmp, n, 1, out->qzeros + gi * nw, 1);
    }
    if (f->has_g_idx)
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

int fmt_gptq_layout_unpack(const qd_format *f, const qd_packed *p, qd_qlayer *out, qd_err *err)
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

int fmt_gptq_layout_dequant(const qd_format *f, const qd_packed *p, float *w, qd_err *err)
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

/* ---- checkpoint tensors, quantization_config ---- */

static int gptq_tensors(const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err)
{
    int n = 0;
    fmt_tensor_set(&t[n++], "qweight", QD_DTYPE_I32, 2, p->qweight_shape[0], p->qweight_shape[1], p->qweight);
    fmt_tensor_set(&t[n++], "qzeros", QD_DTYPE_I32, 2, p->qzeros_shape[0], p->qzeros_shape[1], p->qzeros);
    fmt_tensor_set(&t[n++], "scales", QD_DTYPE_F16, 2, p->scales_shape[0], p->scales_shape[1], p->scales);
    if (p->g_idx) fmt_tensor_set(&t[n++], "g_idx", QD_DTYPE_I32, 1, p->g_idx_len, 0, p->g_idx);
    *n_out = n;
    return 0;
}

/* A mixed checkpoint's layer (d->bits 0: `dynamic` overrides of bits or group size): its bits
 * from qweight's rows (K * b / 32) and its group size from scales' rows (K / G; one group reads
 * as -1), which is what the module's rule says when the file is consistent: a tensor of
 * another width than its rule's would not load in vLLM, and quantd reads what is stored. */
static int gptq_layer_shape(const qd_format *f, qd_fmt_find_fn find, void *ud, int64_t n, int64_t k,
                            qd_fmt_detected *d, qd_err *err)
{
    qd_fmt_tensor qw, sc;
    if (!find(ud, "qweight", &qw) || !find(ud, "scales", &sc))
        return qd_err_set(err, QD_ENOTFOUND, "%s: qweight or scales is missing", f->name);
    if (qw.ndim != 2 || sc.ndim != 2 || qw.shape[1] != n || sc.shape[1] != n || k <= 0 || (qw.shape[0] * 32) % k ||
        sc.shape[0] < 1 || k % sc.shape[0])
        return qd_err_set(err, QD_ESHAPE, "%s: qweight [%lld, %lld] and scales [%lld, %lld] do not say the bits and "
                          "group size of a [%lld, %lld] layer", f->name, (long long)qw.shape[0], (long long)qw.shape[1],
                          (long long)sc.shape[0], (long long)sc.shape[1], (long long)n, (long long)k);
    d->bits = (int)(qw.shape[0] * 32 / k);
    d->group_size = sc.shape[0] == 1 ? -1 : k / sc.shape[0];
    if (d->bits < 1 || d->bits > 8 || !(f->bits_mask & (1u << d->bits)))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: qweight's %lld rows for %lld inputs are %d bits, not 2, 3, 4 or 8",
                          f->name, (long long)qw.shape[0], (long long)k, d->bits);
    return 0;
}

static int gptq_read(const qd_format *f, qd_fmt_find_fn find, void *ud, int64_t n, int64_t k,
                     const qd_fmt_detected *din, qd_packed *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    qd_fmt_detected dd = *din;
    const qd_fmt_detected *d = &dd;
    if (dd.bits == 0) {
        int rc = gptq_layer_shape(f, find, ud, n, k, &dd, err);
        if (rc) return rc;
    }
    const int b = d->bits;
    const int64_t gs = d->group_size > 0 ? d->group_size : k, g = (k + gs - 1) / gs;
    out->n = n; out->k = k; out->bits = b; out->group_size = d->group_size; out->n_groups = g;
    out->qweight_shape[0] = k * b / 32; out->qweight_shape[1] = n;
    out->qzeros_shape[0] = g; out->qzeros_shape[1] = n * b / 32;
    out->scales_shape[0] = g; out->scales_shape[1] = n;
    int rc = fmt_read_i32(find, ud, f->name, "qweight", 1, k * b / 32, n, &out->qweight, err);
    if (!rc) rc = fmt_read_i32(find, ud, f->name, "qzeros", 1, g, n * b / 32, &out->qzeros, err);
    if (!rc) rc = fmt_read_f16(find, ud, f->name, "scales", g, n, &out->scales, err);
    if (!rc) rc = fmt_read_i32(find, ud, f->name, "g_idx", 0, k, 0, &out->g_idx, err);
    if (!rc && !out->g_idx) {
        /* Some writers drop g_idx when it is trivial; rebuild k / group_size. */
        out->g_idx = malloc((size_t)k * sizeof *out->g_idx);
        if (!out->g_idx) rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", f->name);
        for (int64_t i = 0; !rc && i < k; i++) out->g_idx[i] = (int32_t)(i / gs);
    }
    out->g_idx_len = k;
    if (rc) qd_packed_free(out);
    return rc;
}

static cJSON *gptq_quant_config(const qd_format *f, const qd_fmt_config_in *in)
{
    cJSON *q = cJSON_CreateObject();
    if (!q) return NULL;
    cJSON_AddStringToObject(q, "quant_method", "gptq");
    cJSON_AddNumberToObject(q, "bits", in->s.bits);
    cJSON_AddNumberToObject(q, "group_size", (double)in->s.group_size);
    /* With static groups g_idx is k / group_size: the plain layout, which a loader reads fastest
     * when told desc_act false (vLLM's has_g_idx = desc_act keeps Machete and Marlin's
     * un-permuted path); static_groups records how the weights were made. */
    cJSON_AddBoolToObject(q, "desc_act", in->s.desc_act && !in->s.static_groups);
    cJSON_AddBoolToObject(q, "sym", in->s.sym);
    cJSON_AddNumberToObject(q, "damp_percent", in->damp_percent);
    cJSON_AddBoolToObject(q, "static_groups", in->s.static_groups);
    cJSON_AddBoolToObject(q, "true_sequential", in->true_sequential);
    cJSON_AddStringToObject(q, "checkpoint_format", f->name);
    cJSON_AddBoolToObject(q, "lm_head", 0);
    if (in->n_float || in->n_trivial) {
        cJSON *dyn = cJSON_AddObjectToObject(q, "dynamic");
        char key[512], esc[480];
        for (size_t i = 0; i < in->n_float; i++) {
            /* "-:" = GPTQModel's "skip this module"; the name is matched as a regex. */
            size_t o = 0;
            for (const char *c = in->float_modules[i]; *c && o + 3 < sizeof esc; c++) {
                if (strchr(".^$*+?()[]{}|\\", *c)) esc[o++] = '\\';
                esc[o++] = *c;
            }
            esc[o] = 0;
            snprintf(key, sizeof key, "-:%s$", esc);
            cJSON_AddItemToObject(dyn, key, cJSON_CreateObject());
        }
        for (size_t i = 0; i < in->n_trivial; i++) {
            snprintf(key, sizeof key, "+:%s", in->trivial_g_idx[i]);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "desc_act", 0);
            cJSON_AddItemToObject(dyn, key, o);
        }
    }
    return q;
}

/* quant_method "gptq"; checkpoint_format absent or "gptq" is v1, "gptq_v2" is v2. */
static int gptq_detect(const qd_format *f, const cJSON *q, const char *what, qd_fmt_detected *d, qd_err *err)
{
    char method[32] = "", cf[32] = "gptq";
    int rc = fmt_json_str(q, "quant_method", method, sizeof method, what, err);
    if (rc) return rc;
    if (strcmp(method, "gptq")) return 0;
    if ((rc = fmt_json_str(q, "checkpoint_format", cf, sizeof cf, what, err))) return rc;
    if (strcmp(cf, "gptq") && strcmp(cf, "gptq_v2"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.checkpoint_format \"%s\" is not gptq or gptq_v2",
                          what, cf);
    if (strcmp(cf, f->name)) return 0;
    int64_t bits = 0;
    if ((rc = fmt_json_int(q, "bits", &bits, what, err)) || (rc = fmt_json_int(q, "group_size", &d->group_size, what, err)) ||
        (rc = fmt_json_bool(q, "desc_act", &d->desc_act, what, err)) || (rc = fmt_json_bool(q, "sym", &d->sym, what, err)))
        return rc;
    d->bits = bits >= 0 && bits <= 64 ? (int)bits : -1;
    /* `dynamic`: each rule checked (what quantd does not read is refused by name); bits or
     * group sizes per module make the checkpoint mixed, read per layer (gptq_read). */
    int mixed = 0;
    if ((rc = qd_gptq_dynamic_check(q, d->bits, d->group_size, d->sym, &mixed, what, err))) return rc;
    if (mixed) {
        d->mixed = 1;
        d->bits = 0;
        d->group_size = 0;
    }
    return 1;
}

#define GPTQ_BIND(tag, fmt)                                                                                  \
    static int tag##_pack(const qd_qlayer *l, qd_packed *o, qd_err *e) { return fmt_gptq_layout_pack(&fmt, l, o, e); } \
    static int tag##_unpack(const qd_packed *p, qd_qlayer *o, qd_err *e) { return fmt_gptq_layout_unpack(&fmt, p, o, e); } \
    static int tag##_deq(const qd_packed *p, float *w, qd_err *e) { return fmt_gptq_layout_dequant(&fmt, p, w, e); } \
    static int tag##_read(qd_fmt_find_fn fd, void *ud, int64_t n, int64_t k, const qd_fmt_detected *d, qd_packed *o, \
                          qd_err *e) { return gptq_read(&fmt, fd, ud, n, k, d, o, e); }                       \
    static cJSON *tag##_qcfg(const qd_fmt_config_in *in) { return gptq_quant_config(&fmt, in); }               \
    static int tag##_detect(const cJSON *q, const char *w, qd_fmt_detected *d, qd_err *e) { return gptq_detect(&fmt, q, w, d, e); }
GPTQ_BIND(v1, qd_fmt_gptq)
GPTQ_BIND(v2, qd_fmt_gptq_v2)

#define GPTQ_COMMON                                                                                          \
    .quant_method = "gptq", .main_tensor = "qweight", .bits_mask = GPTQ_BITS, .channel_groups = 1, .act_order = QD_FMT_ACT_ORDER_G_IDX, \
    .has_g_idx = 1, .kernel = QD_FMT_KERNEL_GPTQ, .misfit = gptq_misfit, .tensors = gptq_tensors

const qd_format qd_fmt_gptq = {
    .name = "gptq", GPTQ_COMMON, .zero_offset = 1,
    .summary = "GPTQ v1 (AutoGPTQ): qweight/qzeros/scales/g_idx, stored zero = z - 1; transformers (gptqmodel), "
               "vLLM gptq/gptq_marlin, GPTQModel (symmetric; asymmetric v1 only from GPTQModel itself)",
    .default_methods = QD_FMT_METHOD_ALL, .default_rank = 0,
    .check = gptq_v1_check, .pack = v1_pack, .unpack = v1_unpack, .dequant_ref = v1_deq,
    .read = v1_read, .quant_config = v1_qcfg, .detect = v1_detect,
};

const qd_format qd_fmt_gptq_v2 = {
    .name = "gptq_v2", GPTQ_COMMON, .zero_offset = 0,
    .summary = "GPTQ v2 (GPTQModel): the v1 tensors with the zero stored as is; transformers, GPTQModel, "
               "vLLM gptq_marlin",
    .check = gptq_v2_check, .pack = v2_pack, .unpack = v2_unpack, .dequant_ref = v2_deq,
    .read = v2_read, .quant_config = v2_qcfg, .detect = v2_detect,
};
