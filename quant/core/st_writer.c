/* safetensors writer: byte for byte what the Python library (safetensors 0.4 - 0.8, a
 * serde_json serializer) writes for the same tensors and metadata {"format": "pt"}.
 *
 * Its rules, checked against the library by tests/data/make_st_golden.py: tensors in data
 * order sorted by dtype (its enum order, descending) then name bytewise; compact JSON with
 * "__metadata__" first, then each tensor's {"dtype","shape","data_offsets"}; strings
 * escaped as serde_json does (only '"', '\\' and control characters, using the short forms
 * \b \f \n \r \t and otherwise lowercase \u00xx; non-ASCII stays raw UTF-8); the header
 * padded with spaces to a multiple of 8. Extra metadata keys follow "format" in the order
 * they were set (the library stores them in a hash map, so its order is not reproducible).
 * Names are checked for duplicates through a small open-addressing hash set.
 *
 * Writing is always streamed: st_writer_begin sorts the entries and writes the 8-byte length
 * and the header to a temp file, st_writer_append adds data bytes in that order, and
 * st_writer_finish renames the file into place once every byte has come. st_writer_write
 * does the three with the data the entries hold; a caller that makes tensors on the fly
 * (testgen) declares them without data and appends each one as it makes it. */
#include "quant/core/st_internal.h"
#include "quant/core/fsutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct st_wentry {
    char *name;          /* owned */
    qd_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;    /* borrowed, or == owned; NULL for a declared (streamed) tensor */
    void *owned;         /* owned copy for st_writer_add_copy, else NULL */
} st_wentry;

struct st_writer {
    st_wentry *e;        /* owned */
    size_t n, cap;
    size_t *slots;       /* owned hash set of entry index + 1 (0 = empty) */
    size_t nslots;
    char **mkey, **mval; /* owned; index 0 is always "format" */
    size_t nmeta, mcap;
    uint64_t data_bytes;
    /* Between st_writer_begin and st_writer_finish: */
    size_t *order;       /* owned: entry indices in data order */
    qd_fs_atomic *out;   /* owned: the temp file being written */
    uint64_t appended;   /* data bytes appended so far */
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int set_grow(st_writer *w)
{
    size_t ns = w->nslots ? w->nslots * 2 : 64;
    size_t *s = calloc(ns, sizeof *s);
    if (!s) return QD_ENOMEM;
    for (size_t i = 0; i < w->n; i++) {
        size_t j = (size_t)name_hash(w->e[i].name) & (ns - 1);
        while (s[j]) j = (j + 1) & (ns - 1);
        s[j] = i + 1;
    }
    free(w->slots);
    w->slots = s;
    w->nslots = ns;
    return 0;
}

/* Returns the slot where name is or would go. */
static size_t set_find(const st_writer *w, const char *name)
{
    size_t j = (size_t)name_hash(name) & (w->nslots - 1);
    while (w->slots[j] && strcmp(w->e[w->slots[j] - 1].name, name) != 0) j = (j + 1) & (w->nslots - 1);
    return j;
}

int st_writer_init(st_writer **out)
{
    st_writer *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w) return QD_ENOMEM;
    if (st_writer_set_metadata(w, "format", "pt") != 0) { st_writer_free(w); return QD_ENOMEM; }
    *out = w;
    return 0;
}

void st_writer_free(st_writer *w)
{
    if (!w) return;
    qd_fs_atomic_abort(w->out);
    free(w->order);
    for (size_t i = 0; i < w->n; i++) { free(w->e[i].name); free(w->e[i].owned); }
    for (size_t i = 0; i < w->nmeta; i++) { free(w->mkey[i]); free(w->mval[i]); }
    free(w->e);
    free(w->slots);
    free(w->mkey);
    free(w->mval);
    free(w);
}

enum add_mode { ADD_BORROW, ADD_COPY, ADD_DECLARE };

static int add_entry(st_writer *w, const char *name, qd_dtype dtype, int ndim, const int64_t *shape,
                     const void *data, enum add_mode mode, qd_err *err)
{
    if (w->out) return qd_err_set(err, QD_EINVAL, "st_writer: '%s' added after st_writer_begin", name ? name : "(null)");
    if (!name) return qd_err_set(err, QD_EINVAL, "st_writer: tensor name is NULL");
    if (strcmp(name, "__metadata__") == 0)
        return qd_err_set(err, QD_EINVAL, "st_writer: '__metadata__' cannot be a tensor name");
    /* Readers (ours and the Python one) refuse headers that are not UTF-8. */
    if (st_utf8_invalid_at((const unsigned char *)name, strlen(name)) != (size_t)-1)
        return qd_err_set(err, QD_EINVAL, "st_writer: tensor name '%s' is not valid UTF-8", name);
    if (qd_dtype_size(dtype) == 0) return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': invalid dtype", name);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': %d dimensions is not in 0..%d", name, ndim, ST_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': shape[%d] is negative (%" PRId64 ")", name, i, shape[i]);
        if (shape[i] && numel > UINT64_MAX / (uint64_t)shape[i])
            return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': shape has too many elements", name);
        numel *= (uint64_t)shape[i];
    }
    size_t esz = qd_dtype_size(dtype);
    if (numel > (uint64_t)SIZE_MAX / esz)
        return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': shape has too many elements", name);
    uint64_t nbytes = numel * esz;
    if (!data && nbytes && mode != ADD_DECLARE) return qd_err_set(err, QD_EINVAL, "st_writer: tensor '%s': data is NULL", name);

    if ((w->n + 1) * 2 > w->nslots && set_grow(w) != 0)
        return qd_err_set(err, QD_ENOMEM, "st_writer: out of memory adding '%s'", name);
    size_t slot = set_find(w, name);
    if (w->slots[slot]) return qd_err_set(err, QD_EINVAL, "st_writer: duplicate tensor name '%s'", name);
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 16;
        st_wentry *ne = realloc(w->e, nc * sizeof *ne);
        if (!ne) return qd_err_set(err, QD_ENOMEM, "st_writer: out of memory adding '%s'", name);
        w->e = ne;
        w->cap = nc;
    }
    st_wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return qd_err_set(err, QD_ENOMEM, "st_writer: out of memory adding '%s'", name);
    if (mode == ADD_COPY && nbytes) {
        e->owned = malloc((size_t)nbytes);
        if (!e->owned) {
            free(e->name);
            return qd_err_set(err, QD_ENOMEM, "st_writer: out of memory copying %" PRIu64 " bytes of '%s'", nbytes, name);
        }
        memcpy(e->owned, data, (size_t)nbytes);
        data = e->owned;
    }
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    e->data = data;
    w->slots[slot] = ++w->n;
    w->data_bytes += nbytes;
    return 0;
}

int st_writer_add(st_writer *w, const char *name, qd_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, qd_err *err)
{
    return add_entry(w, name, dtype, ndim, shape, data, ADD_BORROW, err);
}

int st_writer_add_copy(st_writer *w, const char *name, qd_dtype dtype, int ndim,
                       const int64_t *shape, const void *data, qd_err *err)
{
    return add_entry(w, name, dtype, ndim, shape, data, ADD_COPY, err);
}

int st_writer_declare(st_writer *w, const char *name, qd_dtype dtype, int ndim, const int64_t *shape, qd_err *err)
{
    return add_entry(w, name, dtype, ndim, shape, NULL, ADD_DECLARE, err);
}

int st_writer_set_metadata(st_writer *w, const char *key, const char *value)
{
    if (!key || !value) return QD_EINVAL;
    if (st_utf8_invalid_at((const unsigned char *)key, strlen(key)) != (size_t)-1 ||
        st_utf8_invalid_at((const unsigned char *)value, strlen(value)) != (size_t)-1)
        return QD_EINVAL;
    char *v = strdup(value);
    if (!v) return QD_ENOMEM;
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkey[i], key) == 0) { free(w->mval[i]); w->mval[i] = v; return 0; }
    if (w->nmeta == w->mcap) {
        size_t nc = w->mcap ? w->mcap * 2 : 4;
        char **k = realloc(w->mkey, nc * sizeof *k);
        if (!k) { free(v); return QD_ENOMEM; }
        w->mkey = k;
        char **vv = realloc(w->mval, nc * sizeof *vv);
        if (!vv) { free(v); return QD_ENOMEM; }
        w->mval = vv;
        w->mcap = nc;
    }
    char *k = strdup(key);
    if (!k) { free(v); return QD_ENOMEM; }
    w->mkey[w->nmeta] = k;
    w->mval[w->nmeta] = v;
    w->nmeta++;
    return 0;
}

uint64_t st_writer_data_bytes(const st_writer *w) { return w->data_bytes; }

typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->len + n + 1 > nc) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof t, "%" PRIu64, v);
    sb_put(b, t, (size_t)n);
}

/* A JSON string escaped as serde_json escapes it. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        }
        if (esc) sb_str(b, esc);
        else sb_put(b, (const char *)p, 1);
    }
    sb_put(b, "\"", 1);
}

/* Entries are sorted as pointers (qsort passes no context to compare indices through) and
 * kept as indices in w->order. */
static int cmp_entry_ptr(const void *a, const void *b)
{
    const st_wentry *x = *(const st_wentry *const *)a, *y = *(const st_wentry *const *)b;
    int rx = qd_dtype_sort_rank(x->dtype), ry = qd_dtype_sort_rank(y->dtype);
    if (rx != ry) return rx > ry ? -1 : 1;
    return strcmp(x->name, y->name);   /* strcmp compares as unsigned char: bytewise */
}

/* The 8-byte length and the padded header of the entries in order into h. */
static int build_header(const st_writer *w, const st_wentry *const *order, sbuf *h, const char *path, qd_err *err)
{
    sb_put(h, "\0\0\0\0\0\0\0\0", 8);   /* the length, filled in below */
    sb_str(h, "{\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
        if (i) sb_put(h, ",", 1);
        sb_json_str(h, w->mkey[i]);
        sb_put(h, ":", 1);
        sb_json_str(h, w->mval[i]);
    }
    sb_put(h, "}", 1);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_wentry *e = order[i];
        sb_put(h, ",", 1);
        sb_json_str(h, e->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, qd_dtype_name(e->dtype));
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_put(h, ",", 1);
            sb_u64(h, (uint64_t)e->shape[d]);
        }
        sb_str(h, "],\"data_offsets\":[");
        sb_u64(h, off);
        sb_put(h, ",", 1);
        off += e->nbytes;
        sb_u64(h, off);
        sb_str(h, "]}");
    }
    sb_put(h, "}", 1);
    while (!h->oom && (h->len - 8) % 8) sb_put(h, " ", 1);
    if (h->oom) return qd_err_set(err, QD_ENOMEM, "%s: out of memory building the header", path);
    uint64_t hlen = h->len - 8;
    if (hlen > ST_HEADER_MAX)
        return qd_err_set(err, QD_EINVAL, "%s: header of %" PRIu64 " bytes exceeds the %llu-byte limit", path, hlen, ST_HEADER_MAX);
    for (int i = 0; i < 8; i++) h->p[i] = (char)(unsigned char)(hlen >> (8 * i));
    return 0;
}

/* Ends a stream that failed: the temp file is removed. */
static void stream_abort(st_writer *w)
{
    qd_fs_atomic_abort(w->out);
    w->out = NULL;
}

int st_writer_begin(st_writer *w, const char *path, qd_err *err)
{
    if (w->out) return qd_err_set(err, QD_EINVAL, "%s: st_writer_begin while another file is being written", path);
    int rc = 0;
    sbuf h = {0};
    const st_wentry **order = NULL;
    free(w->order);
    w->order = malloc((w->n ? w->n : 1) * sizeof *w->order);
    if (w->n) order = malloc(w->n * sizeof *order);
    if (!w->order || (w->n && !order)) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory building the header", path); goto done; }
    for (size_t i = 0; i < w->n; i++) order[i] = &w->e[i];
    if (w->n) qsort(order, w->n, sizeof *order, cmp_entry_ptr);
    for (size_t i = 0; i < w->n; i++) w->order[i] = (size_t)(order[i] - w->e);
    if ((rc = build_header(w, order, &h, path, err))) goto done;
    if ((rc = qd_fs_atomic_open(path, &w->out, err))) goto done;
    w->appended = 0;
    if ((rc = qd_fs_atomic_write(w->out, h.p, h.len, err))) stream_abort(w);
done:
    free(order);
    free(h.p);
    return rc;
}

size_t st_writer_tensor_at(const st_writer *w, size_t i)
{
    return w->order && i < w->n ? w->order[i] : (size_t)-1;
}

int st_writer_append(st_writer *w, const void *buf, size_t n, qd_err *err)
{
    if (!w->out) return qd_err_set(err, QD_EINVAL, "st_writer: append without st_writer_begin");
    if (n > w->data_bytes - w->appended) {
        stream_abort(w);
        return qd_err_set(err, QD_EINVAL, "st_writer: %zu bytes appended past the %" PRIu64 " bytes of tensor data",
                          n, w->data_bytes);
    }
    int rc = qd_fs_atomic_write(w->out, buf, n, err);
    if (rc) stream_abort(w);
    else w->appended += n;
    return rc;
}

int st_writer_finish(st_writer *w, qd_err *err)
{
    if (!w->out) return qd_err_set(err, QD_EINVAL, "st_writer: finish without st_writer_begin");
    qd_fs_atomic *out = w->out;
    w->out = NULL;
    if (w->appended != w->data_bytes) {
        qd_fs_atomic_abort(out);
        return qd_err_set(err, QD_EINVAL, "st_writer: %" PRIu64 " of %" PRIu64 " bytes of tensor data were appended",
                          w->appended, w->data_bytes);
    }
    return qd_fs_atomic_commit(out, err);
}

int st_writer_write(st_writer *w, const char *path, qd_err *err)
{
    for (size_t i = 0; i < w->n; i++)
        if (!w->e[i].data && w->e[i].nbytes)
            return qd_err_set(err, QD_EINVAL, "%s: tensor '%s' was declared without data", path, w->e[i].name);
    int rc = st_writer_begin(w, path, err);
    for (size_t i = 0; i < w->n && !rc; i++) {
        const st_wentry *e = &w->e[w->order[i]];
        rc = st_writer_append(w, e->data, (size_t)e->nbytes, err);
    }
    if (!rc) return st_writer_finish(w, err);
    stream_abort(w);
    return rc;
}
