/* Test harness: typed asserts that print both values, a seeded RNG, temp dirs and the
 * location of ../shared/data. Each test binary calls its cases from main() through
 * TEST_RUN and returns test_finish(); a binary that cannot run here returns TEST_SKIP. */
#ifndef QUANTD_TEST_UTIL_H
#define QUANTD_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#define TEST_SKIP 77

extern int test_failures;
extern int test_checks;
extern const char *test_current;

#define TEST_FAIL_(...) do { \
    test_failures++; \
    fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, test_current); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } while (0)

#define CHECK(cond) do { test_checks++; if (!(cond)) TEST_FAIL_("CHECK(%s) failed", #cond); } while (0)
#define CHECK_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); test_checks++; \
    if (_a != _b) TEST_FAIL_("%s == %s: %lld != %lld", #a, #b, _a, _b); } while (0)
#define CHECK_OK(expr) do { int _rc = (expr); test_checks++; \
    if (_rc != 0) TEST_FAIL_("%s returned %d", #expr, _rc); } while (0)
#define CHECK_ERR(expr) do { int _rc = (expr); test_checks++; \
    if (_rc >= 0) TEST_FAIL_("%s returned %d, expected an error", #expr, _rc); } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); test_checks++; \
    if (!(fabs(_a - _b) <= (tol)) ) TEST_FAIL_("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, _a, _b, (double)(tol)); } while (0)
#define CHECK_STR(a, b) do { const char *_a = (a), *_b = (b); test_checks++; \
    if (!_a || !_b || strcmp(_a, _b) != 0) TEST_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, _a ? _a : "(null)", _b ? _b : "(null)"); } while (0)
#define CHECK_CONTAINS(hay, needle) do { const char *_h = (hay), *_n = (needle); test_checks++; \
    if (!_h || !strstr(_h, _n)) TEST_FAIL_("\"%s\" does not contain \"%s\"", _h ? _h : "(null)", _n); } while (0)

#define TEST_RUN(fn) do { test_current = #fn; fn(); } while (0)

/* Prints a summary line and returns the process exit code: 1 when a check failed or when
 * no check ran at all, else 0. */
int test_finish(void);

/* Deterministic xorshift RNG so failures reproduce. */
typedef struct test_rng { uint64_t s; } test_rng;
void test_rng_seed(test_rng *r, uint64_t seed);
uint64_t test_rng_u64(test_rng *r);
float test_rng_uniform(test_rng *r);          /* [0, 1) */
float test_rng_normal(test_rng *r);           /* N(0, 1) */
void test_fill_normal(test_rng *r, float *x, size_t n, float scale);

/* Creates a fresh temp directory; the path lives until test_finish() removes it. */
const char *test_tmpdir(void);
/* A new empty directory test_tmpdir()/name (emptied if it exists); the path stays valid for
 * the next 15 calls (its own rotating slots, apart from test_path's). */
const char *test_fresh_dir(const char *name);
/* Entries of dir other than "." and ".." (-1 when it cannot be opened); names containing
 * ".tmp." (an atomic write's leftovers) are also counted in *tmps when tmps is not NULL. */
int test_count_entries(const char *dir, int *tmps);
/* 1 when files a and b hold the same bytes; otherwise 0, with the first difference (or the
 * read error) on stderr. */
int test_files_equal(const char *a, const char *b);
/* The source tree: QUANTD_SOURCE_DIR (ctest sets it), else found from this file's path. */
const char *test_source_dir(void);
/* Returns the shared data directory when it exists (QUANTD_SHARED_DATA), else NULL. */
const char *test_shared_data(void);
/* Joins dir and name into a static rotating buffer (8 slots). */
const char *test_path(const char *dir, const char *name);
/* Max |a-b| and max relative error helper. */
double test_max_abs_diff(const float *a, const float *b, size_t n);

#endif
