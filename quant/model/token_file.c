/* Reading and writing token-id files (see token_file.h). A whole-stream ids file holds ~1M
 * numbers, so the array form is read with a small dedicated scanner instead of building a
 * cJSON tree of a million nodes; the object form locates its array by key with the same
 * scanner. Writes go through qd_fs_write_atomic, so a reader never sees half a file. */
#include "quant/model/token_file.h"
#include "quant/model/tokenizer/tok_internal.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t skip_ws(const char *b, size_t i, size_t n)
{
    while (i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    return i;
}

/* Parses an array of integers starting at b[i] == '['. */
static int parse_array(const char *name, const char *b, size_t i, size_t n, int32_t **ids, size_t *count, qd_err *err)
{
    int32_t *v = NULL;
    size_t k = 0, cap = 0;
    i = skip_ws(b, i + 1, n);
    if (i < n && b[i] == ']') goto done;
    for (;;) {
        i = skip_ws(b, i, n);
        size_t start = i;
        int64_t x = 0;
        int digits = 0;
        if (i < n && b[i] == '-') { free(v); return qd_err_set(err, QD_EFORMAT, "%s: element %zu (byte %zu) is negative", name, k, start); }
        while (i < n && b[i] >= '0' && b[i] <= '9' && digits < 12) { x = x * 10 + (b[i] - '0'); i++; digits++; }
        /* A float such as 3.0 is not an id; reject it rather than truncate. */
        if (!digits || (i < n && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || (b[i] >= '0' && b[i] <= '9')))) {
            free(v);
            return qd_err_set(err, QD_EFORMAT, "%s: element %zu (byte %zu) is not a non-negative integer", name, k, start);
        }
        if (x > INT32_MAX) { free(v); return qd_err_set(err, QD_EFORMAT, "%s: element %zu = %lld does not fit an int32 id", name, k, (long long)x); }
        if (tok_ids_push(&v, &k, &cap, (int32_t)x)) { free(v); return qd_err_set(err, QD_ENOMEM, "%s: out of memory", name); }
        i = skip_ws(b, i, n);
        if (i < n && b[i] == ',') { i++; continue; }
        if (i < n && b[i] == ']') break;
        free(v);
        return qd_err_set(err, QD_EFORMAT, "%s: expected ',' or ']' at byte %zu", name, i);
    }
done:
    if (!v && !(v = malloc(sizeof *v))) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", name);
    *ids = v;
    *count = k;
    return 0;
}

/* Finds "key" followed by ':' and '[' at the top level of an object; returns the '[' offset
 * or n. Strings are skipped with their escapes, so a key inside a value does not match. */
static size_t find_key_array(const char *b, size_t n, const char *key)
{
    size_t kl = strlen(key);
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == '"') {
            size_t s = i + 1, j = s;
            while (j < n && b[j] != '"') j += b[j] == '\\' ? 2 : 1;
            if (depth == 1 && j - s == kl && !memcmp(b + s, key, kl)) {
                size_t k = skip_ws(b, j + 1, n);
                if (k < n && b[k] == ':') {
                    k = skip_ws(b, k + 1, n);
                    if (k < n && b[k] == '[') return k;
                }
            }
            i = j;
        }
    }
    return n;
}

int qd_token_json_parse(const char *name, const char *b, size_t n, int32_t **ids, size_t *count, qd_err *err)
{
    size_t i = skip_ws(b, 0, n);
    if (i < n && b[i] == '[') return parse_array(name, b, i, n, ids, count, err);
    if (i < n && b[i] == '{') {
        static const char *keys[] = {"tokens", "ids", "input_ids"};
        for (size_t k = 0; k < 3; k++) {
            size_t at = find_key_array(b, n, keys[k]);
            if (at < n) return parse_array(name, b, at, n, ids, count, err);
        }
        return qd_err_set(err, QD_EFORMAT, "%s: JSON object has no \"tokens\" (or \"ids\", \"input_ids\") array", name);
    }
    return qd_err_set(err, QD_EFORMAT, "%s: not a JSON array of ids or an object with \"tokens\"", name);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int qd_token_file_read(const char *path, int32_t **ids, size_t *n, qd_err *err)
{
    char *buf;
    size_t len;
    int rc = qd_input_read(path, QD_INPUT_TEXT, &buf, &len, err);
    if (rc) return rc;
    if (ends_with(path, ".bin")) {
        if (len % 4) { free(buf); return qd_err_set(err, QD_EFORMAT, "%s: size %zu is not a multiple of 4 (uint32 ids)", path, len); }
        int32_t *v = malloc(len ? len : 4);
        if (!v) { free(buf); return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path); }
        const uint8_t *u = (const uint8_t *)buf;
        for (size_t i = 0; i < len / 4; i++) {
            uint32_t x = (uint32_t)u[4 * i] | (uint32_t)u[4 * i + 1] << 8 | (uint32_t)u[4 * i + 2] << 16 | (uint32_t)u[4 * i + 3] << 24;
            if (x > INT32_MAX) {
                free(v); free(buf);
                return qd_err_set(err, QD_EFORMAT, "%s: id %zu = %u does not fit an int32 id", path, i, x);
            }
            v[i] = (int32_t)x;
        }
        free(buf);
        *ids = v;
        *n = len / 4;
        return 0;
    }
    rc = qd_token_json_parse(path, buf, len, ids, n, err);
    free(buf);
    return rc;
}

int qd_token_file_write_json(const char *path, const int32_t *ids, size_t n, qd_err *err)
{
    size_t cap = n * 12 + 4, len = 0;
    char *buf = malloc(cap);
    if (!buf) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    buf[len++] = '[';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ",%d" : "%d", (int)ids[i]);
    buf[len++] = ']';
    buf[len++] = '\n';
    int rc = qd_fs_write_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

int qd_token_file_write_bin(const char *path, const int32_t *ids, size_t n, qd_err *err)
{
    uint8_t *buf = malloc(n * 4 + 1);
    if (!buf) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)ids[i];
        buf[4 * i] = (uint8_t)x; buf[4 * i + 1] = (uint8_t)(x >> 8);
        buf[4 * i + 2] = (uint8_t)(x >> 16); buf[4 * i + 3] = (uint8_t)(x >> 24);
    }
    int rc = qd_fs_write_atomic(path, (const char *)buf, n * 4, err);
    free(buf);
    return rc;
}
