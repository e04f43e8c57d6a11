/* The activation checkpoint files (quant/pipeline/acts.h): F32 and BF16 files read back to
 * exactly what was written (BF16: the values qd_acts_round left, widened in place), their size
 * is qd_acts_file_bytes, and a damaged file is refused with the reason: truncated, a flipped
 * byte (checksum), another shape, another version. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/pipeline/acts.h"
#include "quant/core/fsutil.h"
#include "test_util.h"

static const char *T;

static void round_trip(qd_dtype dtype, int64_t rows, int64_t cols)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/acts-%s-%lld.bin", T, qd_dtype_name(dtype), (long long)rows);
    size_t n = (size_t)(rows * cols);
    float *x = malloc(n * sizeof *x), *y = NULL;
    test_rng r;
    test_rng_seed(&r, (uint64_t)rows);
    test_fill_normal(&r, x, n, 3.0f);
    x[0] = 1e30f;   /* BF16 keeps F32's range */
    qd_acts_round(x, n, dtype);
    qd_err err = {0};
    CHECK_OK(qd_acts_write(path, x, rows, cols, dtype, &err));
    CHECK(qd_fs_file_size(path) == qd_acts_file_bytes(rows, cols, dtype));
    int64_t rr = 0, cc = 0;
    CHECK_OK(qd_acts_read(path, rows, cols, &y, &rr, &cc, &err));
    CHECK(rr == rows && cc == cols);
    if (y) CHECK(memcmp(x, y, n * sizeof *x) == 0);
    free(y);
    free(x);
}

static void test_round_trips(void)
{
    round_trip(QD_DTYPE_F32, 7, 33);
    round_trip(QD_DTYPE_BF16, 7, 33);
    round_trip(QD_DTYPE_BF16, 1, 1);
    round_trip(QD_DTYPE_BF16, 129, 64);
    /* Rounding: F32 leaves values alone, BF16 keeps 8 significant bits. */
    float v[2] = {1.0f + 1.0f / 1024, 3.14159265f}, w[2] = {v[0], v[1]};
    qd_acts_round(w, 2, QD_DTYPE_F32);
    CHECK(w[0] == v[0] && w[1] == v[1]);
    qd_acts_round(w, 2, QD_DTYPE_BF16);
    CHECK(w[0] == 1.0f && w[1] == 3.140625f);
    CHECK(qd_acts_dtype_for(QD_DTYPE_F16) == QD_DTYPE_BF16 && qd_acts_dtype_for(QD_DTYPE_BF16) == QD_DTYPE_BF16);
    CHECK(qd_acts_dtype_for(QD_DTYPE_F32) == QD_DTYPE_F32);
}

/* Rewrites byte `at` of path (negative: from the end) or cuts the file to `keep` bytes. */
static void damage(const char *path, long at, long keep)
{
    char *buf = NULL;
    size_t len = 0;
    qd_err err = {0};
    CHECK_OK(qd_fs_read_file(path, &buf, &len, &err));
    if (!buf) return;
    if (keep >= 0) len = (size_t)keep;
    else buf[at < 0 ? (long)len + at : at] ^= 0x40;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) { fwrite(buf, 1, len, f); fclose(f); }
    free(buf);
}

static void expect_refused(long at, long keep, int64_t want_rows, int code, const char *needle)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/bad.bin", T);
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    qd_err err = {0};
    CHECK_OK(qd_acts_write(path, x, 8, 8, QD_DTYPE_BF16, &err));
    if (at || keep >= 0) damage(path, at, keep);
    float *y = NULL;
    CHECK_INT(qd_acts_read(path, want_rows, 8, &y, NULL, NULL, &err), code);
    CHECK_CONTAINS(err.msg, needle);
    CHECK(y == NULL);
}

static void test_damaged(void)
{
    expect_refused(0, 40, 8, QD_EFORMAT, "truncated");                   /* header + 2 values */
    expect_refused(-3, -1, 8, QD_EFORMAT, "checksum mismatch");          /* a data byte */
    expect_refused(0, 0, 8, QD_EFORMAT, "not a quantd activation file"); /* empty */
    expect_refused(8, -1, 8, QD_EMISMATCH, "version");                   /* the version field */
    expect_refused(0, -1, 9, QD_EFORMAT, "expected [9, 8]");             /* another shape */
    float *y = NULL;
    qd_err err = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/none.bin", T);
    CHECK_INT(qd_acts_read(path, 0, 0, &y, NULL, NULL, &err), QD_ENOTFOUND);
    float x[4] = {0};
    CHECK_INT(qd_acts_write(path, x, 2, 2, QD_DTYPE_F16, &err), QD_EINVAL);   /* only F32, BF16 */
}

int main(void)
{
    T = test_tmpdir();
    TEST_RUN(test_round_trips);
    TEST_RUN(test_damaged);
    return test_finish();
}
