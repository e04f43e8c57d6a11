/* The safetensors fuzz harness: runs one input through the reader and checks what every
 * accepted file must satisfy (contiguous in-bounds offsets, sizes that match shapes, names
 * found by lookup, readable data) and what every refusal must look like (a negative code, no
 * file, a message that names the source). Sanitizers catch the memory errors; this catches
 * the logic ones. */
#include "fuzz/st_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/safetensors.h"

#define WHAT "fuzz.safetensors"

static int fail(const char *why, const char *name)
{
    fprintf(stderr, "st_fuzz_one: invariant broken: %s%s%s\n", why, name ? ": " : "", name ? name : "");
    return -1;
}

static int check_refusal(int rc, const st_file *f, const qd_err *err)
{
    if (rc >= 0) return fail("an error path returned a non-negative code", NULL);
    if (f) return fail("a refused input still produced a file", NULL);
    if (strncmp(err->msg, WHAT ":", strlen(WHAT) + 1) != 0) return fail("the message does not name the source", err->msg);
    return 0;
}

/* Invariants of an accepted file whose data section starts at data (NULL for a bare
 * header) and holds data_len bytes. */
static int check_file(const st_file *f, const uint8_t *data, uint64_t data_len)
{
    uint64_t pos = 0;
    size_t n = st_file_count(f);
    static float buf[4096];
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_file_tensor(f, i);
        if (!t || !t->name) return fail("missing tensor", NULL);
        if (t->begin != pos) return fail("offsets not contiguous", t->name);
        if (t->end < t->begin || t->end > data_len) return fail("offsets out of bounds", t->name);
        if (t->dtype <= QD_DTYPE_INVALID || t->dtype >= QD_DTYPE_COUNT) return fail("bad dtype", t->name);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) return fail("bad ndim", t->name);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) return fail("negative dimension", t->name);
            numel *= (uint64_t)t->shape[d];
        }
        if (numel != t->numel || t->end - t->begin != numel * qd_dtype_size(t->dtype))
            return fail("size does not match shape", t->name);
        if (data ? t->data != data + t->begin : t->data != NULL) return fail("data pointer wrong", t->name);
        if (st_file_find(f, t->name) != t) return fail("lookup by name finds another tensor", t->name);
        if (data && t->numel <= 4096) {
            qd_err err = {0};
            int rc = st_tensor_read_f32(t, buf, &err);
            if (rc != 0 && rc != QD_EUNSUPPORTED) return fail("reading the data failed", t->name);
        }
        pos = t->end;
    }
    if (pos != data_len) return fail("tensors do not cover the data section", NULL);
    if (st_file_tensor(f, n) != NULL) return fail("index past the end returned a tensor", NULL);
    if (st_file_find(f, "\x01no such tensor") != NULL) return fail("lookup of a missing name succeeded", NULL);
    const char *fmt = st_file_metadata(f, "format");
    volatile size_t touch = fmt ? strlen(fmt) : 0;   /* lets the sanitizers check the string */
    (void)touch;
    return 0;
}

int st_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    st_file *f = NULL;
    qd_err err = {0};
    int rc, bad = 0;
    if (accepted) *accepted = 0;

    rc = st_file_open_memory(data, size, WHAT, &f, &err);
    if (rc == 0) {
        if (!f) return fail("success without a file", NULL);
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
        bad |= check_file(f, data + 8 + n, size - 8 - n);
        if (accepted) *accepted = 1;
        st_file_close(f);
    } else {
        bad |= check_refusal(rc, f, &err);
    }

    /* The same bytes as a bare header, claiming a small data section. */
    f = NULL;
    memset(&err, 0, sizeof err);
    uint64_t data_len = size ? data[size - 1] : 0;
    rc = st_header_parse((const char *)data, size, data_len, WHAT, &f, &err);
    if (rc == 0) {
        if (!f) return fail("success without a file", NULL);
        bad |= check_file(f, NULL, data_len);
        st_file_close(f);
    } else {
        bad |= check_refusal(rc, f, &err);
    }
    return bad ? -1 : 0;
}
