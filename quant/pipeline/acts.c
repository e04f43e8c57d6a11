/* Activation checkpoint files (see acts.h). */
#include "quant/pipeline/acts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"

static const char acts_magic[8] = {'Q', 'D', 'A', 'C', 'T', 'S', 0, 0};

enum { ACTS_F32 = 0, ACTS_BF16 = 2 };

typedef struct acts_header {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    int64_t rows, cols;
    uint64_t checksum;
} acts_header;

uint64_t qd_hash64(const void *data, uint64_t n, uint64_t h)
{
    const uint8_t *p = data;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= w;
        h *= 0x100000001b3ull;
    }
    for (; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

qd_dtype qd_acts_dtype_for(qd_dtype weights)
{
    return weights == QD_DTYPE_F16 || weights == QD_DTYPE_BF16 ? QD_DTYPE_BF16 : QD_DTYPE_F32;
}

int qd_acts_value_bytes(qd_dtype dtype) { return dtype == QD_DTYPE_BF16 ? 2 : 4; }

void qd_acts_round(float *x, uint64_t n, qd_dtype dtype)
{
    if (dtype != QD_DTYPE_BF16) return;
    for (uint64_t i = 0; i < n; i++) x[i] = qd_bf16_to_f32(qd_f32_to_bf16(x[i]));
}

uint64_t qd_acts_file_bytes(int64_t rows, int64_t cols, qd_dtype dtype)
{
    return (uint64_t)sizeof(acts_header) + (uint64_t)rows * (uint64_t)cols * (uint64_t)qd_acts_value_bytes(dtype);
}

int qd_acts_write(const char *path, const float *x, int64_t rows, int64_t cols, qd_dtype dtype, qd_err *err)
{
    if (rows < 0 || cols <= 0) return qd_err_set(err, QD_EINVAL, "%s: bad activation shape [%lld, %lld]", path, (long long)rows, (long long)cols);
    if (dtype != QD_DTYPE_F32 && dtype != QD_DTYPE_BF16)
        return qd_err_set(err, QD_EINVAL, "%s: activations cannot be stored as %s", path, qd_dtype_name(dtype));
    acts_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, acts_magic, 8);
    h.version = QD_ACTS_VERSION;
    h.dtype = dtype == QD_DTYPE_BF16 ? ACTS_BF16 : ACTS_F32;
    h.rows = rows;
    h.cols = cols;
    uint64_t n = (uint64_t)rows * (uint64_t)cols;
    uint64_t bytes = n * (uint64_t)qd_acts_value_bytes(dtype);
    uint16_t *half = NULL;
    const void *data = x;
    if (dtype == QD_DTYPE_BF16) {
        half = malloc(n ? n * sizeof *half : 1);
        if (!half) return qd_err_set(err, QD_ENOMEM, "%s: cannot allocate %llu bytes", path, (unsigned long long)bytes);
        for (uint64_t i = 0; i < n; i++) half[i] = qd_f32_to_bf16(x[i]);
        data = half;
    }
    h.checksum = qd_hash64(data, bytes, QD_HASH64_INIT);
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)data, bytes}};
    int rc = qd_fs_write_atomic_iov(path, iov, 2, err);
    free(half);
    return rc;
}

int qd_acts_read(const char *path, int64_t expect_rows, int64_t expect_cols, float **x,
                 int64_t *rows, int64_t *cols, qd_err *err)
{
    *x = NULL;
    int fd;
    int orc = qd_input_open(path, QD_INPUT_WEIGHTS, &fd, NULL, err);
    if (orc) return orc;
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); return qd_err_set(err, QD_ENOMEM, "%s: %s", path, strerror(errno)); }
    acts_header h;
    int rc = 0;
    float *buf = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, acts_magic, 8) != 0) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: not a quantd activation file", path);
        goto out;
    }
    if (h.version != QD_ACTS_VERSION || (h.dtype != ACTS_F32 && h.dtype != ACTS_BF16)) {
        rc = qd_err_set(err, QD_EMISMATCH, "%s: activation file version %u (dtype %u), expected version %d", path, h.version, h.dtype, QD_ACTS_VERSION);
        goto out;
    }
    if (h.rows < 0 || h.cols <= 0 || (expect_rows && h.rows != expect_rows) || (expect_cols && h.cols != expect_cols)) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: activations are [%lld, %lld], expected [%lld, %lld]", path,
                        (long long)h.rows, (long long)h.cols, (long long)expect_rows, (long long)expect_cols);
        goto out;
    }
    uint64_t n = (uint64_t)h.rows * (uint64_t)h.cols;
    size_t vb = h.dtype == ACTS_BF16 ? 2 : 4;
    buf = malloc(n ? n * sizeof(float) : 1);
    if (!buf) { rc = qd_err_set(err, QD_ENOMEM, "%s: cannot allocate %llu floats", path, (unsigned long long)n); goto out; }
    /* BF16 values are read into the upper half of the buffer and widened in place, front to
     * back: value i's F32 slot ends at or before bf16 value i + 1 starts. */
    uint8_t *dst = (uint8_t *)buf + (vb == 2 ? n * 2 : 0);
    if (fread(dst, vb, n, f) != n) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: truncated activation file", path);
        goto out;
    }
    if (qd_hash64(dst, n * vb, QD_HASH64_INIT) != h.checksum) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: activation checksum mismatch (damaged file)", path);
        goto out;
    }
    for (uint64_t i = 0; vb == 2 && i < n; i++) {
        uint16_t v;
        memcpy(&v, dst + 2 * i, 2);   /* byte access: the widened values overlap the source */
        buf[i] = qd_bf16_to_f32(v);
    }
    *x = buf;
    buf = NULL;
    if (rows) *rows = h.rows;
    if (cols) *cols = h.cols;
out:
    free(buf);
    fclose(f);
    return rc;
}
