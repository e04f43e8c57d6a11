/* Strict parser and validator for the safetensors JSON header.
 *
 * The header has a fixed shape (an object of tensor entries plus an optional
 * "__metadata__" object of strings), so this is a small hand-written parser rather than a
 * general JSON library: that lets it keep 64-bit offsets exact (cJSON stores numbers as
 * doubles), catch duplicate keys (cJSON keeps both), and point at the byte where the input
 * went wrong. It never recurses, so hostile input cannot exhaust the stack; it is the
 * target of tests/fuzz. Decoded strings go to one arena sized from the header length, since
 * a decoded JSON string plus its NUL is never longer than its quoted source. */
#include "quant/core/st_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hp {
    const unsigned char *s;
    size_t n, pos;
    const char *what;
    char *arena;
    size_t arena_used;
    qd_err *err;
} hp;

void st_shape_format(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap == 0) return;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* Checks that s is valid UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF
 * (the Python library rejects such headers, so files we accept must be ones it reads). */
size_t st_utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned cp, min;
        if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += len;
    }
    return (size_t)-1;
}

static void skip_ws(hp *p)
{
    while (p->pos < p->n) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int syntax(hp *p, const char *expected)
{
    if (p->pos >= p->n)
        return qd_err_set(p->err, QD_EFORMAT, "%s: header is not valid JSON: expected %s but the header ends at byte %zu",
                          p->what, expected, p->n);
    return qd_err_set(p->err, QD_EFORMAT, "%s: header is not valid JSON: expected %s at byte %zu",
                      p->what, expected, p->pos);
}

static int expect(hp *p, char c, const char *desc)
{
    skip_ws(p);
    if (p->pos >= p->n || p->s[p->pos] != (unsigned char)c) return syntax(p, desc);
    p->pos++;
    return 0;
}

static int peek(hp *p)
{
    skip_ws(p);
    return p->pos < p->n ? p->s[p->pos] : -1;
}

static int hex4(hp *p, unsigned *out)
{
    unsigned v = 0;
    if (p->n - p->pos < 4) return syntax(p, "4 hex digits after \\u");
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[p->pos + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return syntax(p, "4 hex digits after \\u");
    }
    p->pos += 4;
    *out = v;
    return 0;
}

/* Parses a JSON string into the arena; *out is NUL-terminated. Strings with an escaped NUL
 * are refused because names and metadata are C strings everywhere else. */
static int parse_string(hp *p, const char **out)
{
    int rc = expect(p, '"', "'\"'");
    if (rc) return rc;
    char *d = p->arena + p->arena_used, *start = d;
    size_t open = p->pos - 1;
    for (;;) {
        if (p->pos >= p->n) return syntax(p, "a closing '\"'");
        unsigned char c = p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return syntax(p, "no raw control character inside a string");
        if (c != '\\') { *d++ = (char)c; p->pos++; continue; }
        p->pos++;
        if (p->pos >= p->n) return syntax(p, "an escape character");
        c = p->s[p->pos++];
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if ((rc = hex4(p, &cp))) return rc;
            if (cp >= 0xdc00 && cp <= 0xdfff) { p->pos -= 6; return syntax(p, "no lone low surrogate"); }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return syntax(p, "a low surrogate escape after a high surrogate");
                p->pos += 2;
                if ((rc = hex4(p, &lo))) return rc;
                if (lo < 0xdc00 || lo > 0xdfff) { p->pos -= 6; return syntax(p, "a low surrogate escape after a high surrogate"); }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0)
                return qd_err_set(p->err, QD_EFORMAT, "%s: header string at byte %zu contains an escaped NUL character",
                                  p->what, open);
            if (cp < 0x80) *d++ = (char)cp;
            else if (cp < 0x800) { *d++ = (char)(0xc0 | (cp >> 6)); *d++ = (char)(0x80 | (cp & 0x3f)); }
            else if (cp < 0x10000) {
                *d++ = (char)(0xe0 | (cp >> 12)); *d++ = (char)(0x80 | ((cp >> 6) & 0x3f));
                *d++ = (char)(0x80 | (cp & 0x3f));
            } else {
                *d++ = (char)(0xf0 | (cp >> 18)); *d++ = (char)(0x80 | ((cp >> 12) & 0x3f));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3f)); *d++ = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: p->pos--; return syntax(p, "a valid escape (one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
        }
    }
    *d++ = '\0';
    p->arena_used += (size_t)(d - start);
    *out = start;
    return 0;
}

/* Parses a JSON number that must be an integer. *neg is set for a leading '-'; *big when it
 * does not fit in 64 bits. Fractions and exponents are valid JSON but not valid here. */
static int parse_int(hp *p, uint64_t *v, int *neg, int *big, int *frac)
{
    skip_ws(p);
    *v = 0; *neg = 0; *big = 0; *frac = 0;
    if (p->pos < p->n && p->s[p->pos] == '-') { *neg = 1; p->pos++; }
    if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9') return syntax(p, "a number");
    if (p->s[p->pos] == '0' && p->pos + 1 < p->n && p->s[p->pos + 1] >= '0' && p->s[p->pos + 1] <= '9')
        return syntax(p, "a number without leading zeros");
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        unsigned d = p->s[p->pos++] - '0';
        if (*v > (UINT64_MAX - d) / 10) *big = 1;
        else *v = *v * 10 + d;
    }
    if (p->pos < p->n && p->s[p->pos] == '.') {
        p->pos++;
        if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9') return syntax(p, "a digit after '.'");
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        *frac = 1;
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9') return syntax(p, "a digit in the exponent");
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        *frac = 1;
    }
    return 0;
}

/* One non-negative integer for field[idx] of tensor `name`; `limit` bounds the value. */
static int parse_count(hp *p, const char *name, const char *field, int idx, uint64_t limit, uint64_t *out)
{
    uint64_t v;
    int neg, big, frac, rc;
    if ((rc = parse_int(p, &v, &neg, &big, &frac))) return rc;
    if (frac)
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': %s[%d] is not an integer", p->what, name, field, idx);
    if (neg && (v != 0 || big))
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': %s[%d] is negative (-%s%" PRIu64 ")", p->what, name,
                          field, idx, big ? ">" : "", v);
    if (big || v > limit)
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': %s[%d] is too large", p->what, name, field, idx);
    *out = v;
    return 0;
}

static int parse_shape(hp *p, st_tensor *t)
{
    int rc;
    if ((rc = expect(p, '[', "'[' to start the shape"))) return rc;
    t->ndim = 0;
    if (peek(p) == ']') { p->pos++; return 0; }
    for (;;) {
        uint64_t v;
        if (t->ndim == ST_MAX_DIMS)
            return qd_err_set(p->err, QD_EUNSUPPORTED, "%s: tensor '%s': shape has more than %d dimensions", p->what,
                              t->name, ST_MAX_DIMS);
        if ((rc = parse_count(p, t->name, "shape", t->ndim, INT64_MAX, &v))) return rc;
        t->shape[t->ndim++] = (int64_t)v;
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == ']') { p->pos++; return 0; }
        return syntax(p, "',' or ']' in the shape");
    }
}

static int parse_offsets(hp *p, st_tensor *t)
{
    int rc;
    uint64_t v[2];
    if ((rc = expect(p, '[', "'[' to start data_offsets"))) return rc;
    for (int i = 0; i < 2; i++) {
        if (i && (rc = expect(p, ',', "',' between the two data_offsets"))) return rc;
        if (peek(p) == ']')
            return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': data_offsets must hold two integers [begin, end]",
                              p->what, t->name);
        if ((rc = parse_count(p, t->name, "data_offsets", i, UINT64_MAX, &v[i]))) return rc;
    }
    if (peek(p) != ']')
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': data_offsets must hold two integers [begin, end]",
                          p->what, t->name);
    p->pos++;
    t->begin = v[0];
    t->end = v[1];
    return 0;
}

/* Parses {"dtype":..,"shape":..,"data_offsets":..} for the tensor whose name is set, and
 * checks what a single entry can check: all fields present, known dtype, a size that
 * matches the shape. */
static int parse_entry(hp *p, st_tensor *t)
{
    int rc, have_dtype = 0, have_shape = 0, have_off = 0;
    int c0 = peek(p);
    if (c0 < 0) return syntax(p, "a tensor entry object");
    if (c0 != '{')
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': entry is not an object (at byte %zu)", p->what, t->name,
                          p->pos);
    p->pos++;
    if (peek(p) == '}') p->pos++;
    else for (;;) {
        const char *key;
        size_t key_at = p->pos;
        if ((rc = parse_string(p, &key))) return rc;
        if ((rc = expect(p, ':', "':'"))) return rc;
        int *seen = strcmp(key, "dtype") == 0 ? &have_dtype : strcmp(key, "shape") == 0 ? &have_shape
                  : strcmp(key, "data_offsets") == 0 ? &have_off : NULL;
        if (!seen)
            return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': unknown field '%.64s' at byte %zu", p->what, t->name,
                              key, key_at);
        if (*seen)
            return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': duplicate field '%s' at byte %zu", p->what, t->name,
                              key, key_at);
        *seen = 1;
        if (seen == &have_dtype) {
            const char *dt;
            if (peek(p) != '"')
                return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': dtype is not a string", p->what, t->name);
            if ((rc = parse_string(p, &dt))) return rc;
            t->dtype = qd_dtype_parse(dt);
            if (t->dtype == QD_DTYPE_INVALID)
                return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': unknown dtype '%.32s'", p->what, t->name, dt);
        } else if (seen == &have_shape) {
            if ((rc = parse_shape(p, t))) return rc;
        } else {
            if ((rc = parse_offsets(p, t))) return rc;
        }
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == '}') { p->pos++; break; }
        return syntax(p, "',' or '}' in a tensor entry");
    }
    if (!have_dtype || !have_shape || !have_off)
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': entry has no '%s'", p->what, t->name,
                          !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");

    char sh[160];
    uint64_t numel = 1, bytes;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (d && numel > UINT64_MAX / d) {
            st_shape_format(t->shape, t->ndim, sh, sizeof sh);
            return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': shape %s has too many elements", p->what, t->name, sh);
        }
        numel *= d;
    }
    size_t esz = qd_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esz) {
        st_shape_format(t->shape, t->ndim, sh, sizeof sh);
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': shape %s has too many elements", p->what, t->name, sh);
    }
    t->numel = numel;
    bytes = numel * esz;
    if (t->end < t->begin)
        return qd_err_set(p->err, QD_EFORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin",
                          p->what, t->name, t->begin, t->end);
    if (t->end - t->begin != bytes) {
        st_shape_format(t->shape, t->ndim, sh, sizeof sh);
        return qd_err_set(p->err, QD_EFORMAT,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64 " bytes but shape %s x %s needs %" PRIu64 " bytes (wrong size)",
                          p->what, t->name, t->begin, t->end, t->end - t->begin, sh, qd_dtype_name(t->dtype), bytes);
    }
    return 0;
}

static int parse_metadata(hp *p, st_file *f, size_t *cap)
{
    int rc;
    int c0 = peek(p);
    if (c0 < 0) return syntax(p, "the __metadata__ object");
    if (c0 != '{')
        return qd_err_set(p->err, QD_EFORMAT, "%s: __metadata__ is not an object of strings (at byte %zu)", p->what, p->pos);
    p->pos++;
    if (peek(p) == '}') { p->pos++; return 0; }
    for (;;) {
        const char *k, *v;
        if ((rc = parse_string(p, &k))) return rc;
        if ((rc = expect(p, ':', "':'"))) return rc;
        if (peek(p) != '"')
            return qd_err_set(p->err, QD_EFORMAT, "%s: __metadata__ value for '%.64s' is not a string (at byte %zu)",
                              p->what, k, p->pos);
        if ((rc = parse_string(p, &v))) return rc;
        if (f->n_meta == *cap) {
            size_t nc = *cap ? *cap * 2 : 4;
            st_meta_kv *m = realloc(f->meta, nc * sizeof *m);
            if (!m) return qd_err_set(p->err, QD_ENOMEM, "%s: out of memory parsing the header", p->what);
            f->meta = m;
            *cap = nc;
        }
        f->meta[f->n_meta].key = k;
        f->meta[f->n_meta].value = v;
        f->n_meta++;
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == '}') { p->pos++; return 0; }
        return syntax(p, "',' or '}' in __metadata__");
    }
}

static int cmp_data_order(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const st_meta_kv *)a)->key, ((const st_meta_kv *)b)->key);
}

/* The whole-header checks: unique names, contiguous offsets from 0, total = data_len. */
static int validate(hp *p, st_file *f, uint64_t data_len)
{
    if (f->count) qsort(f->tensors, f->count, sizeof *f->tensors, cmp_data_order);
    if (f->count) {
        f->by_name = malloc(f->count * sizeof *f->by_name);
        if (!f->by_name) return qd_err_set(p->err, QD_ENOMEM, "%s: out of memory parsing the header", p->what);
        for (size_t i = 0; i < f->count; i++) f->by_name[i] = &f->tensors[i];
        qsort(f->by_name, f->count, sizeof *f->by_name, cmp_tensor_ptr_name);
        for (size_t i = 1; i < f->count; i++)
            if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
                return qd_err_set(p->err, QD_EFORMAT, "%s: duplicate tensor name '%s'", p->what, f->by_name[i]->name);
    }
    if (f->n_meta) {
        qsort(f->meta, f->n_meta, sizeof *f->meta, cmp_meta);
        for (size_t i = 1; i < f->n_meta; i++)
            if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0)
                return qd_err_set(p->err, QD_EFORMAT, "%s: duplicate __metadata__ key '%s'", p->what, f->meta[i].key);
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i], *prev = i ? &f->tensors[i - 1] : NULL;
        if (t->begin > pos) {
            if (!prev)
                return qd_err_set(p->err, QD_EFORMAT,
                                  "%s: tensor '%s': data starts at %" PRIu64 ", leaving a gap of %" PRIu64 " bytes at the start of the data section",
                                  p->what, t->name, t->begin, t->begin);
            return qd_err_set(p->err, QD_EFORMAT,
                              "%s: tensor '%s': data starts at %" PRIu64 ", leaving a gap of %" PRIu64 " bytes after tensor '%s' (which ends at %" PRIu64 ")",
                              p->what, t->name, t->begin, t->begin - pos, prev->name, prev->end);
        }
        if (t->begin < pos)
            return qd_err_set(p->err, QD_EFORMAT,
                              "%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' [%" PRIu64 ", %" PRIu64 ")",
                              p->what, t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
        pos = t->end;
    }
    if (pos != data_len)
        return qd_err_set(p->err, QD_EFORMAT,
                          "%s: the tensors end at data byte %" PRIu64 " but the data section holds %" PRIu64 " bytes (file length must be 8 + header + %" PRIu64 ")",
                          p->what, pos, data_len, pos);
    return 0;
}

int st_header_parse(const char *buf, size_t n, uint64_t data_len, const char *what,
                    st_file **out, qd_err *err)
{
    int rc;
    size_t tcap = 0, mcap = 0;
    *out = NULL;
    if (!what) what = "safetensors header";
    if (n > ST_HEADER_MAX)
        return qd_err_set(err, QD_EFORMAT, "%s: header length %zu exceeds the %llu-byte limit (header too long)", what, n,
                          ST_HEADER_MAX);
    if (n == 0 || buf[0] != '{')
        return qd_err_set(err, QD_EFORMAT, "%s: header is not valid JSON: it does not start with '{'", what);
    size_t bad = st_utf8_invalid_at((const unsigned char *)buf, n);
    if (bad != (size_t)-1)
        return qd_err_set(err, QD_EFORMAT, "%s: header is not valid UTF-8 at byte %zu", what, bad);

    st_file *f = calloc(1, sizeof *f);
    if (!f) return qd_err_set(err, QD_ENOMEM, "%s: out of memory parsing the header", what);
    f->path = strdup(what);
    f->strings = malloc(n + 1);
    if (!f->path || !f->strings) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory parsing the header", what); goto fail; }

    hp p = { (const unsigned char *)buf, n, 0, what, f->strings, 0, err };
    int seen_meta = 0;
    p.pos = 1;
    if (peek(&p) == '}') p.pos++;
    else for (;;) {
        const char *name;
        size_t name_at = p.pos;
        if ((rc = parse_string(&p, &name))) goto fail;
        if ((rc = expect(&p, ':', "':'"))) goto fail;
        if (strcmp(name, "__metadata__") == 0) {
            if (seen_meta) {
                rc = qd_err_set(err, QD_EFORMAT, "%s: duplicate __metadata__ at byte %zu", what, name_at);
                goto fail;
            }
            seen_meta = 1;
            if ((rc = parse_metadata(&p, f, &mcap))) goto fail;
        } else {
            if (f->count == tcap) {
                size_t nc = tcap ? tcap * 2 : 16;
                st_tensor *t = realloc(f->tensors, nc * sizeof *t);
                if (!t) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory parsing the header", what); goto fail; }
                f->tensors = t;
                tcap = nc;
            }
            st_tensor *t = &f->tensors[f->count];
            memset(t, 0, sizeof *t);
            t->name = name;
            if ((rc = parse_entry(&p, t))) goto fail;
            f->count++;
        }
        int c = peek(&p);
        if (c == ',') { p.pos++; continue; }
        if (c == '}') { p.pos++; break; }
        rc = syntax(&p, "',' or '}' after a tensor entry");
        goto fail;
    }
    skip_ws(&p);
    if (p.pos != n) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: header is not valid JSON: unexpected byte 0x%02x after the closing '}' at byte %zu",
                        what, p.s[p.pos], p.pos);
        goto fail;
    }
    if ((rc = validate(&p, f, data_len))) goto fail;
    *out = f;
    return 0;
fail:
    st_file_close(f);
    return rc;
}
