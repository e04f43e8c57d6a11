/* Implementation of the test harness declared in test_util.h. */
#define _GNU_SOURCE   /* nftw */
#include "test_util.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>
#include <ftw.h>

#include "quant/core/fsutil.h"

int test_failures = 0;
int test_checks = 0;
const char *test_current = "";
static char tmpdir_buf[256];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

int test_finish(void)
{
    if (tmpdir_buf[0] && !getenv("QUANTD_KEEP_TMP"))
        nftw(tmpdir_buf, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d checks, %d failed\n", test_checks, test_failures);
    if (test_checks == 0) {
        /* A binary that checked nothing proves nothing: a case list that lost its entries or
         * a set-up that quietly returned early would otherwise pass. */
        fprintf(stderr, "test_finish: no check ran; a test that cannot run here returns TEST_SKIP\n");
        return 1;
    }
    return test_failures ? 1 : 0;
}

void test_rng_seed(test_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

uint64_t test_rng_u64(test_rng *r)
{
    uint64_t x = r->s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float test_rng_uniform(test_rng *r) { return (float)((test_rng_u64(r) >> 40) * (1.0 / 16777216.0)); }

float test_rng_normal(test_rng *r)
{
    double u1 = ((test_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (test_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void test_fill_normal(test_rng *r, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rng_normal(r);
}

const char *test_tmpdir(void)
{
    if (!tmpdir_buf[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir_buf, sizeof tmpdir_buf, "%s/quantd-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(tmpdir_buf)) { perror("mkdtemp"); abort(); }
    }
    return tmpdir_buf;
}

const char *test_fresh_dir(const char *name)
{
    static char dirs[16][1024];
    static int slot;
    char *p = dirs[slot++ & 15];
    snprintf(p, 1024, "%s", test_path(test_tmpdir(), name));
    qd_err err = {0};
    qd_fs_remove_tree(p, &err);
    qd_fs_mkdir_p(p, &err);
    return p;
}

int test_count_entries(const char *dir, int *tmps)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (tmps) *tmps = 0;
    if (!d) return -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        n++;
        if (tmps && strstr(de->d_name, ".tmp.")) (*tmps)++;
    }
    closedir(d);
    return n;
}

int test_files_equal(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t la = 0, lb = 0;
    qd_err err = {0};
    if (qd_fs_read_file(a, &x, &la, &err) || qd_fs_read_file(b, &y, &lb, &err)) fprintf(stderr, "%s\n", err.msg);
    int eq = x && y && la == lb && memcmp(x, y, la) == 0;
    if (x && y && !eq) {
        size_t i = 0;
        while (i < la && i < lb && x[i] == y[i]) i++;
        fprintf(stderr, "files differ: %s (%zu bytes) vs %s (%zu bytes), first difference at byte %zu\n", a, la, b, lb, i);
    }
    free(x);
    free(y);
    return eq;
}

const char *test_source_dir(void)
{
    static char buf[4096];
    const char *s = getenv("QUANTD_SOURCE_DIR");
    if (s && *s) return s;
    snprintf(buf, sizeof buf, "%s", __FILE__);
    char *cut = strstr(buf, "/tests/test_util.c");
    if (cut) *cut = 0;
    else snprintf(buf, sizeof buf, ".");
    return buf;
}

const char *test_shared_data(void)
{
    const char *d = getenv("QUANTD_SHARED_DATA");
    if (!d || access(d, R_OK) != 0) return NULL;
    return d;
}

const char *test_path(const char *dir, const char *name)
{
    static char bufs[8][1024];
    static int slot;
    char *b = bufs[slot++ & 7];
    snprintf(b, 1024, "%s/%s", dir, name);
    return b;
}

double test_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}
