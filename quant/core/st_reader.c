/* safetensors reader: maps a file read-only, hands the header to st_header.c for strict
 * validation, and answers lookups by index or by name (binary search over the name-sorted
 * index, since real checkpoints hold thousands of tensors). */
#include "quant/core/st_internal.h"

#include "quant/core/confine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int st_file_open_memory(const void *buf, size_t len, const char *what, st_file **out, qd_err *err)
{
    const unsigned char *b = buf;
    *out = NULL;
    if (!what) what = "safetensors data";
    if (len < 8)
        return qd_err_set(err, QD_EFORMAT, "%s: file is %zu bytes, too short for the 8-byte header length (truncated file)",
                          what, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    if (n > ST_HEADER_MAX)
        return qd_err_set(err, QD_EFORMAT, "%s: header length %" PRIu64 " exceeds the %llu-byte limit (header too long)",
                          what, n, ST_HEADER_MAX);
    if (n > len - 8)
        return qd_err_set(err, QD_EFORMAT,
                          "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes; truncated file?)", what,
                          n, len);
    st_file *f;
    int rc = st_header_parse((const char *)b + 8, (size_t)n, (uint64_t)(len - 8 - n), what, &f, err);
    if (rc) return rc;
    const unsigned char *data = b + 8 + n;
    for (size_t i = 0; i < f->count; i++) f->tensors[i].data = data + f->tensors[i].begin;
    *out = f;
    return 0;
}

int st_file_open(const char *path, st_file **out, qd_err *err)
{
    *out = NULL;
    int fd;
    uint64_t size;
    /* A regular file beneath the allowed roots (confine.h), checked on the open descriptor. */
    int orc = qd_input_open(path, QD_INPUT_WEIGHTS, &fd, &size, err);
    if (orc) return orc;
    size_t len = (size_t)size;
    if (len < 8) {
        close(fd);
        return qd_err_set(err, QD_EFORMAT, "%s: file is %zu bytes, too short for the 8-byte header length (truncated file)",
                          path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);   /* the mapping keeps the file referenced */
    if (map == MAP_FAILED) return qd_err_set(err, QD_EIO, "%s: cannot mmap %zu bytes: %s", path, len, strerror(e));
    st_file *f;
    int rc = st_file_open_memory(map, len, path, &f, err);
    if (rc) {
        munmap(map, len);
        return rc;
    }
    f->map = map;
    f->map_len = len;
    for (size_t i = 0; i < f->count; i++) f->tensors[i].mapped = f->tensors[i].data != NULL;
    *out = f;
    return 0;
}

void st_file_close(st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f->strings);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f);
}

size_t st_file_count(const st_file *f) { return f->count; }

const st_tensor *st_file_tensor(const st_file *f, size_t i)
{
    return i < f->count ? &f->tensors[i] : NULL;
}

const st_tensor *st_file_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *st_file_metadata(const st_file *f, const char *key)
{
    size_t lo = 0, hi = f->n_meta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->meta[mid].key, key);
        if (c == 0) return f->meta[mid].value;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void st_tensor_release(const st_tensor *t)
{
    if (!t || !t->data || !t->mapped) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)t->data + page - 1) / page * page;
    uintptr_t hi = ((uintptr_t)t->data + (uintptr_t)(t->end - t->begin)) / page * page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);   /* advice: failure changes nothing */
}

int st_tensor_rows(const st_tensor *t, int64_t r0, int64_t r1, st_tensor *view, qd_err *err)
{
    if (t->ndim < 1 || t->shape[0] <= 0 || r0 < 0 || r1 <= r0 || r1 > t->shape[0])
        return qd_err_set(err, QD_EINVAL, "tensor '%s': rows %lld..%lld are not inside its %lld", t->name,
                          (long long)r0, (long long)r1, (long long)(t->ndim < 1 ? 0 : t->shape[0]));
    uint64_t row = t->numel / (uint64_t)t->shape[0], esz = qd_dtype_size(t->dtype);
    *view = *t;
    view->shape[0] = r1 - r0;
    view->numel = row * (uint64_t)(r1 - r0);
    view->begin = t->begin + row * (uint64_t)r0 * esz;
    view->end = view->begin + view->numel * esz;
    view->data = t->data ? (const unsigned char *)t->data + row * (uint64_t)r0 * esz : NULL;
    return 0;
}

int st_tensor_read_f32(const st_tensor *t, float *dst, qd_err *err)
{
    if (!t->data && t->numel)
        return qd_err_set(err, QD_EINVAL, "tensor '%s': no data (header parsed without a file)", t->name);
    size_t esz = qd_dtype_size(t->dtype);
    /* Offsets in a safetensors file need not be aligned to the element size (a U8 tensor
     * can precede an F32 one), so unaligned data goes through an aligned bounce buffer. */
    if (((uintptr_t)t->data % esz) == 0 || t->numel == 0) {
        if (qd_convert_to_f32(t->dtype, t->data, dst, (size_t)t->numel) != 0)
            return qd_err_set(err, QD_EUNSUPPORTED, "tensor '%s': cannot convert dtype %s to F32", t->name,
                              qd_dtype_name(t->dtype));
        return 0;
    }
    _Alignas(8) unsigned char bounce[4096];
    size_t per = sizeof bounce / esz;
    const unsigned char *src = t->data;
    for (uint64_t i = 0; i < t->numel; i += per) {
        size_t k = (size_t)(t->numel - i < per ? t->numel - i : per);
        memcpy(bounce, src + i * esz, k * esz);
        if (qd_convert_to_f32(t->dtype, bounce, dst + i, k) != 0)
            return qd_err_set(err, QD_EUNSUPPORTED, "tensor '%s': cannot convert dtype %s to F32", t->name,
                              qd_dtype_name(t->dtype));
    }
    return 0;
}
