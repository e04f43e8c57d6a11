/* Validating cJSON accessors shared by the job spec (job.c) and proto/'s status.c and wire
 * messages; see jsonutil.h. */
#include "quant/job/jsonutil.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *qpj_type_name(const cJSON *v)
{
    if (!v) return "nothing";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

const char *qpj_describe(const cJSON *v, char *buf, size_t cap)
{
    if (cJSON_IsNumber(v)) {
        char num[32];
        snprintf(buf, cap, "%s", qpj_fmt_double(v->valuedouble, num));
    } else if (cJSON_IsString(v)) {
        size_t n = strlen(v->valuestring);
        if (n > 40)
            snprintf(buf, cap, "\"%.37s...\"", v->valuestring);
        else
            snprintf(buf, cap, "\"%s\"", v->valuestring);
    } else if (cJSON_IsBool(v)) {
        snprintf(buf, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else {
        snprintf(buf, cap, "%s", qpj_type_name(v));
    }
    return buf;
}

/* Levenshtein distance, case-insensitive, capped: names are short, so O(n*m) is nothing. */
static int edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int prev[64], cur[64];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}

int qpj_check_keys(const cJSON *obj, const char *path, const char *const *allowed, qp_err *err)
{
    for (const cJSON *c = obj->child; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        int known = 0;
        for (size_t i = 0; allowed[i]; i++)
            if (strcmp(allowed[i], k) == 0) { known = 1; break; }
        if (!known) {
            const char *best = NULL;
            int bestd = 3;   /* suggest only close matches: a typo, not a different word */
            for (size_t i = 0; allowed[i]; i++) {
                int d = edit_distance(k, allowed[i]);
                if (d < bestd) { bestd = d; best = allowed[i]; }
            }
            if (best)
                return qp_err_set(err, QP_EINVAL, "%s.%s: unknown field (did you mean '%s'?)",
                                  path, k, best);
            return qp_err_set(err, QP_EINVAL, "%s.%s: unknown field", path, k);
        }
        for (const cJSON *d = c->next; d; d = d->next)
            if (d->string && strcmp(d->string, k) == 0)
                return qp_err_set(err, QP_EINVAL, "%s.%s: given more than once", path, k);
    }
    return 0;
}

const cJSON *qpj_field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

int qpj_get_int(const cJSON *obj, const char *path, const char *name, int64_t lo, int64_t hi,
                const char *rule, int64_t *out, int *present, qp_err *err)
{
    const cJSON *v = qpj_field(obj, name);
    if (present) *present = v != NULL;
    if (!v) return 0;
    char desc[64];
    if (!cJSON_IsNumber(v))
        return qp_err_set(err, QP_EINVAL, "%s.%s: %s, got %s", path, name, rule, qpj_type_name(v));
    double x = v->valuedouble;
    /* Range first, so the int64 conversion below is defined; it replaces floor(), so the job
     * spec's own code calls nothing of libm. */
    if (!isfinite(x) || x < (double)lo || x > (double)hi || x != (double)(int64_t)x)
        return qp_err_set(err, QP_EINVAL, "%s.%s: %s, got %s", path, name, rule,
                          qpj_describe(v, desc, sizeof desc));
    *out = (int64_t)x;
    return 0;
}

int qpj_get_double(const cJSON *obj, const char *path, const char *name, const char *rule,
                   double *out, int *present, qp_err *err)
{
    const cJSON *v = qpj_field(obj, name);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return qp_err_set(err, QP_EINVAL, "%s.%s: %s, got %s", path, name, rule, qpj_type_name(v));
    *out = v->valuedouble;
    return 0;
}

int qpj_get_bool(const cJSON *obj, const char *path, const char *name, int *out, int *present,
                 qp_err *err)
{
    const cJSON *v = qpj_field(obj, name);
    if (present) *present = v != NULL;
    if (!v) return 0;
    char desc[64];
    if (!cJSON_IsBool(v))
        return qp_err_set(err, QP_EINVAL, "%s.%s: must be true or false, got %s", path, name,
                          qpj_describe(v, desc, sizeof desc));
    *out = cJSON_IsTrue(v);
    return 0;
}

int qpj_get_str(const cJSON *obj, const char *path, const char *name, int allow_empty,
                char **out, int *present, qp_err *err)
{
    const cJSON *v = qpj_field(obj, name);
    if (present) *present = v != NULL;
    if (!v) return 0;
    char desc[64];
    if (!cJSON_IsString(v))
        return qp_err_set(err, QP_EINVAL, "%s.%s: must be a string, got %s", path, name,
                          qpj_describe(v, desc, sizeof desc));
    if (!allow_empty && !v->valuestring[0])
        return qp_err_set(err, QP_EINVAL, "%s.%s: must not be empty", path, name);
    char *s = strdup(v->valuestring);
    if (!s) return qp_err_set(err, QP_ENOMEM, "%s.%s: out of memory", path, name);
    free(*out);
    *out = s;
    return 0;
}

const char *qpj_fmt_double(double x, char buf[32])
{
    if (!isfinite(x)) {
        /* JSON has no NaN/Inf; callers never store them, but never print garbage either. */
        snprintf(buf, 32, "0");
        return buf;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, 32, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

int qpj_name_valid(const char *s, size_t max)
{
    if (!s || !s[0] || s[0] == '.' || s[0] == '-') return 0;
    size_t n = 0;
    for (const char *p = s; *p; p++, n++) {
        unsigned char c = (unsigned char)*p;
        if (!(isalnum(c) || c == '.' || c == '_' || c == '-')) return 0;
    }
    return n <= max;
}

int qpj_add_str(cJSON *obj, const char *name, const char *s)
{
    cJSON *v = s ? cJSON_CreateString(s) : cJSON_CreateNull();
    if (!v || !cJSON_AddItemToObject(obj, name, v)) { cJSON_Delete(v); return QP_ENOMEM; }
    return 0;
}

int qpj_add_num(cJSON *obj, const char *name, double x)
{
    cJSON *v = cJSON_CreateNumber(x);
    if (!v || !cJSON_AddItemToObject(obj, name, v)) { cJSON_Delete(v); return QP_ENOMEM; }
    return 0;
}

int qpj_add_bool(cJSON *obj, const char *name, int b)
{
    cJSON *v = cJSON_CreateBool(b);
    if (!v || !cJSON_AddItemToObject(obj, name, v)) { cJSON_Delete(v); return QP_ENOMEM; }
    return 0;
}

/* Converts v and everything under it (not its siblings). */
static int numbers_to_raw(cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        char buf[40];
        double x = v->valuedouble;
        if (x >= -9007199254740991.0 && x <= 9007199254740991.0 && x == (double)(int64_t)x)
            snprintf(buf, sizeof buf, "%.0f", x);
        else
            qpj_fmt_double(x, buf);
        char *raw = strdup(buf);
        if (!raw) return -1;
        v->type = cJSON_Raw;
        v->valuestring = raw;
        return 0;
    }
    for (cJSON *c = v->child; c; c = c->next)
        if (numbers_to_raw(c)) return -1;
    return 0;
}

char *qpj_print(cJSON *obj, int pretty)
{
    if (!obj || numbers_to_raw(obj)) return NULL;
    return pretty ? cJSON_Print(obj) : cJSON_PrintUnformatted(obj);
}

char *qpj_print_copy(const cJSON *v)
{
    cJSON *c = cJSON_Duplicate(v, 1);
    char *s = qpj_print(c, 0);
    cJSON_Delete(c);
    return s;
}

char *qpj_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}
