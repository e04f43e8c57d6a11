/* JSON files (see jsonfile.h). */
#include "quant/core/jsonfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "quant/core/fsutil.h"

/* The next number literal of text at or after *pos (document order, strings skipped);
 * NULL at the end. *len receives its length. */
static const char *next_number(const char *text, size_t n, size_t *pos, size_t *len)
{
    size_t i = *pos;
    while (i < n) {
        char c = text[i];
        if (c == '"') {
            for (i++; i < n && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            while (j < n && strchr("0123456789+-.eE", text[j])) j++;
            *pos = j;
            *len = j - i;
            return text + i;
        } else {
            i++;
        }
    }
    *pos = n;
    return NULL;
}

/* Depth-first, in document order (cJSON keeps it): number nodes whose literal has a
 * fraction or an exponent become raw nodes printing that literal. */
static int keep_literals(cJSON *node, const char *text, size_t n, size_t *pos)
{
    for (cJSON *c = node->child; c; c = c->next) {
        if (cJSON_IsNumber(c)) {
            size_t len = 0;
            const char *lit = next_number(text, n, pos, &len);
            if (!lit) return QD_EFORMAT;
            if (memchr(lit, '.', len) || memchr(lit, 'e', len) || memchr(lit, 'E', len)) {
                char *raw = malloc(len + 1);
                if (!raw) return QD_ENOMEM;
                memcpy(raw, lit, len);
                raw[len] = 0;
                c->type = cJSON_Raw;
                c->valuestring = raw;
            }
        } else if (c->child) {
            int rc = keep_literals(c, text, n, pos);
            if (rc) return rc;
        }
    }
    return 0;
}

static int read_object(const char *path, qd_input_kind kind, int literals, cJSON **out, qd_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = qd_input_read(path, kind, &buf, &len, err);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        size_t off = e && e >= buf && e <= buf + len ? (size_t)(e - buf) : 0;
        free(buf);
        return qd_err_set(err, QD_EFORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
    size_t pos = 0;
    rc = literals ? keep_literals(root, buf, len, &pos) : 0;
    free(buf);
    if (rc) {
        cJSON_Delete(root);
        return qd_err_set(err, rc, "%s: cannot keep its number literals", path);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return 0;
}

int qd_json_read_object(const char *path, qd_input_kind kind, cJSON **out, qd_err *err)
{
    return read_object(path, kind, 0, out, err);
}

int qd_json_read_object_literal(const char *path, qd_input_kind kind, cJSON **out, qd_err *err)
{
    return read_object(path, kind, 1, out, err);
}

cJSON *qd_json_add_exact(cJSON *o, const char *key, double v)
{
    if (!isfinite(v)) return cJSON_AddNullToObject(o, key);
    char buf[32];
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_AddRawToObject(o, key, buf);
}
