/* Internals shared by the safetensors files (st_header.c parses, st_reader.c maps and
 * looks up). Not part of the public API: include quant/core/safetensors.h instead. */
#ifndef QUANT_CORE_ST_INTERNAL_H
#define QUANT_CORE_ST_INTERNAL_H

#include "quant/core/safetensors.h"

typedef struct st_meta_kv {
    const char *key, *value;     /* into st_file.strings */
} st_meta_kv;

struct st_file {
    char *path;                  /* owned copy of the path or `what` */
    void *map;                   /* owned read-only mapping, or NULL */
    size_t map_len;
    char *strings;               /* owned arena holding every decoded name, key and value */
    st_tensor *tensors;          /* owned, data (offset) order */
    size_t count;
    const st_tensor **by_name;   /* owned, sorted by name (bytewise) for binary search */
    st_meta_kv *meta;            /* owned, sorted by key */
    size_t n_meta;
};

/* Formats a shape as "[4, 4]" into buf (always NUL-terminated). */
void st_shape_format(const int64_t *shape, int ndim, char *buf, size_t cap);

/* Offset of the first byte that is not valid UTF-8 (overlong forms and surrogates count as
 * invalid), or (size_t)-1 when all n bytes are valid. */
size_t st_utf8_invalid_at(const unsigned char *s, size_t n);

#endif
