/* Reading a packed linear's checkpoint tensors (through the loader's find callback) and
 * quantization_config values, shared by the descriptors' read() and detect(). */
#include "quant/formats/fmt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/minifloat.h"
#include "quant/core/safetensors.h"

void qd_fmt_tensor_view(const st_tensor *t, const char *suffix, qd_fmt_tensor *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->suffix, sizeof out->suffix, "%s", suffix);
    out->dtype = t->dtype;
    out->ndim = t->ndim > 2 ? 3 : t->ndim;
    for (int d = 0; d < t->ndim && d < 2; d++) out->shape[d] = t->shape[d];
    out->data = t->data;
}

int qd_fmt_find_named(void *ud, const char *suffix, qd_fmt_tensor *out)
{
    const qd_fmt_named *c = ud;
    char name[640];
    snprintf(name, sizeof name, "%s.%s", c->base, suffix);
    const st_tensor *t = c->lookup(c->src, name);
    if (!t) return 0;
    qd_fmt_tensor_view(t, suffix, out);
    return 1;
}

static int find_checked(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int required,
                        qd_dtype want, int64_t r, int64_t c, qd_fmt_tensor *t, qd_err *err)
{
    memset(t, 0, sizeof *t);
    if (!find(ud, suffix, t)) {
        t->data = NULL;
        return required ? qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", fmt, suffix) : 0;
    }
    if (want != QD_DTYPE_INVALID && t->dtype != want)
        return qd_err_set(err, QD_EFORMAT, "%s: tensor '%s' has dtype %s, expected %s", fmt, suffix,
                          qd_dtype_name(t->dtype), qd_dtype_name(want));
    int ndim = c ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != r || (ndim == 2 && t->shape[1] != c)) {
        char got[64] = "[", wanted[64];
        size_t o = 1;
        for (int d = 0; d < t->ndim && d < 2 && o < sizeof got; d++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        snprintf(got + o, sizeof got - o, "%s]", t->ndim > 2 ? ", ..." : "");
        if (ndim == 2) snprintf(wanted, sizeof wanted, "[%lld, %lld]", (long long)r, (long long)c);
        else snprintf(wanted, sizeof wanted, "[%lld]", (long long)r);
        return qd_err_set(err, QD_ESHAPE, "%s: tensor '%s' has shape %s, expected %s", fmt, suffix, got, wanted);
    }
    return 0;
}

int fmt_read_i32(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int required,
                 int64_t r, int64_t c, int32_t **out, qd_err *err)
{
    *out = NULL;
    qd_fmt_tensor t;
    int rc = find_checked(find, ud, fmt, suffix, required, QD_DTYPE_I32, r, c, &t, err);
    if (rc || !t.data) return rc;
    size_t count = (size_t)(r * (c ? c : 1));
    *out = malloc(count * sizeof **out + 1);
    if (!*out) return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading '%s'", fmt, suffix);
    memcpy(*out, t.data, count * sizeof **out);
    return 0;
}

int fmt_read_f16(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int64_t r,
                 int64_t c, uint16_t **out, qd_err *err)
{
    *out = NULL;
    qd_fmt_tensor t;
    int rc = find_checked(find, ud, fmt, suffix, 1, QD_DTYPE_INVALID, r, c, &t, err);
    if (rc) return rc;
    size_t count = (size_t)(r * c);
    *out = malloc(count * sizeof **out + 1);
    if (!*out) return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading '%s'", fmt, suffix);
    if (t.dtype == QD_DTYPE_F16) {
        memcpy(*out, t.data, count * 2);
        return 0;
    }
    if (t.dtype != QD_DTYPE_BF16 && t.dtype != QD_DTYPE_F32) {
        free(*out);
        *out = NULL;
        return qd_err_set(err, QD_EFORMAT, "%s: tensor '%s' has dtype %s, expected F16, BF16 or F32", fmt, suffix,
                          qd_dtype_name(t.dtype));
    }
    /* Other float types are narrowed to F16 bits, the precision the format table decodes. */
    float *f = malloc(count * sizeof *f + 1);
    if (!f) {
        free(*out);
        *out = NULL;
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading '%s'", fmt, suffix);
    }
    qd_convert_to_f32(t.dtype, t.data, f, count);
    for (size_t i = 0; i < count; i++) (*out)[i] = qd_f32_to_f16(f[i]);
    free(f);
    return 0;
}

int fmt_read_bytes(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, qd_dtype want,
                   int64_t r, int64_t c, uint8_t **out, qd_err *err)
{
    *out = NULL;
    qd_fmt_tensor t;
    int rc = find_checked(find, ud, fmt, suffix, 1, want, r, c, &t, err);
    if (rc) return rc;
    size_t count = (size_t)(r * (c ? c : 1));
    *out = malloc(count + 1);
    if (!*out) return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading '%s'", fmt, suffix);
    memcpy(*out, t.data, count);
    return 0;
}

int fmt_read_f32(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int64_t r,
                 int64_t c, float **out, qd_err *err)
{
    *out = NULL;
    qd_fmt_tensor t;
    int rc = find_checked(find, ud, fmt, suffix, 1, QD_DTYPE_INVALID, r, c, &t, err);
    if (rc) return rc;
    size_t count = (size_t)(r * (c ? c : 1));
    if (t.dtype != QD_DTYPE_F32 && t.dtype != QD_DTYPE_BF16 && t.dtype != QD_DTYPE_F16 && t.dtype != QD_DTYPE_F8_E4M3)
        return qd_err_set(err, QD_EFORMAT, "%s: tensor '%s' has dtype %s, expected F32, BF16, F16 or F8_E4M3", fmt,
                          suffix, qd_dtype_name(t.dtype));
    *out = malloc(count * sizeof **out + 1);
    if (!*out) return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading '%s'", fmt, suffix);
    if (t.dtype == QD_DTYPE_F8_E4M3) {
        const uint8_t *b = t.data;
        for (size_t i = 0; i < count; i++) (*out)[i] = qd_fp8_e4m3_to_f32(b[i]);
    } else {
        qd_convert_to_f32(t.dtype, t.data, *out, count);
    }
    for (size_t i = 0; i < count; i++)
        if (!isfinite((*out)[i])) {
            float v = (*out)[i];
            free(*out);
            *out = NULL;
            return qd_err_set(err, QD_ENUMERIC, "%s: tensor '%s' holds %g at element %zu (not finite)", fmt, suffix,
                              (double)v, i);
        }
    return 0;
}

void fmt_tensor_set(qd_fmt_tensor *t, const char *suffix, qd_dtype dtype, int ndim, int64_t r,
                    int64_t c, const void *data)
{
    memset(t, 0, sizeof *t);
    snprintf(t->suffix, sizeof t->suffix, "%s", suffix);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = r;
    t->shape[1] = c;
    t->data = data;
}

int fmt_json_int(const cJSON *o, const char *key, int64_t *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble)
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config: %s must be an integer", what, key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

int fmt_json_bool(const cJSON *o, const char *key, int *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return qd_err_set(err, QD_EFORMAT, "%s: quantization_config: %s must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int fmt_json_str(const cJSON *o, const char *key, char *out, size_t cap, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return qd_err_set(err, QD_EFORMAT, "%s: quantization_config: %s must be a string", what, key);
    if (strlen(v->valuestring) >= cap)
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config: %s \"%.40s...\" is too long", what, key, v->valuestring);
    strcpy(out, v->valuestring);
    return 0;
}

cJSON *fmt_json_strings(const char *const *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) {
        cJSON *s = cJSON_CreateString(v[i]);
        if (!s) { cJSON_Delete(a); return NULL; }
        cJSON_AddItemToArray(a, s);
    }
    return a;
}
