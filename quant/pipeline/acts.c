/* Activation checkpoint files (see acts.h). */
#include "quant/pipeline/acts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"

static const char acts_magic[8] = {'Q', 'D', 'A', 'C', 'T', 'S', 0, 0};

typedef struct acts_header {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    int64_t rows, cols;
    uint64_t checksum;
} acts_header;

uint64_t qd_fnv1a64(const void *data, uint64_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t qd_acts_file_bytes(int64_t rows, int64_t cols)
{
    return (uint64_t)sizeof(acts_header) + (uint64_t)rows * (uint64_t)cols * sizeof(float);
}

int qd_acts_write(const char *path, const float *x, int64_t rows, int64_t cols, qd_err *err)
{
    if (rows < 0 || cols <= 0) return qd_err_set(err, QD_EINVAL, "%s: bad activation shape [%lld, %lld]", path, (long long)rows, (long long)cols);
    acts_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, acts_magic, 8);
    h.version = QD_ACTS_VERSION;
    h.rows = rows;
    h.cols = cols;
    uint64_t bytes = (uint64_t)rows * (uint64_t)cols * sizeof(float);
    h.checksum = qd_fnv1a64(x, bytes, QD_FNV1A64_INIT);
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)x, bytes}};
    return qd_fs_write_atomic_iov(path, iov, 2, err);
}

int qd_acts_read(const char *path, int64_t expect_rows, int64_t expect_cols, float **x,
                 int64_t *rows, int64_t *cols, qd_err *err)
{
    *x = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return qd_err_set(err, errno == ENOENT ? QD_ENOTFOUND : QD_EIO, "%s: %s", path, strerror(errno));
    acts_header h;
    int rc = 0;
    float *buf = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, acts_magic, 8) != 0) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: not a quantd activation file", path);
        goto out;
    }
    if (h.version != QD_ACTS_VERSION || h.dtype != 0) {
        rc = qd_err_set(err, QD_EMISMATCH, "%s: activation file version %u (dtype %u), expected version %d", path, h.version, h.dtype, QD_ACTS_VERSION);
        goto out;
    }
    if (h.rows < 0 || h.cols <= 0 || (expect_rows && h.rows != expect_rows) || (expect_cols && h.cols != expect_cols)) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: activations are [%lld, %lld], expected [%lld, %lld]", path,
                        (long long)h.rows, (long long)h.cols, (long long)expect_rows, (long long)expect_cols);
        goto out;
    }
    uint64_t n = (uint64_t)h.rows * (uint64_t)h.cols;
    buf = malloc(n ? n * sizeof(float) : 1);
    if (!buf) { rc = qd_err_set(err, QD_ENOMEM, "%s: cannot allocate %llu floats", path, (unsigned long long)n); goto out; }
    if (fread(buf, sizeof(float), n, f) != n) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: truncated activation file", path);
        goto out;
    }
    if (qd_fnv1a64(buf, n * sizeof(float), QD_FNV1A64_INIT) != h.checksum) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: activation checksum mismatch (damaged file)", path);
        goto out;
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
