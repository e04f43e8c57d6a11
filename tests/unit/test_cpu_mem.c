/* The CPU backend's cache of large blocks (quant/backend/cpu/cpu_mem.h): reuse of freed
 * blocks of the same or a slightly smaller size, the byte cap, small blocks passing
 * through, the backend's alloc/free going through it, and its trim lowering the process's
 * resident set for the next peak measured. Leaks show under ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/backend/cpu/cpu_mem.h"
#include "quant/core/rss.h"
#include "test_util.h"

#define MB ((size_t)1 << 20)

static void test_reuse(void)
{
    cpu_mem m;
    cpu_mem_init(&m, 64 * MB);
    void *small = cpu_mem_alloc(&m, 1000);
    CHECK(small != NULL);
    cpu_mem_free(&m, small);
    CHECK_INT(m.n_idle, 0);                      /* below CPU_MEM_MIN_BYTES: not kept */
    CHECK_INT((int64_t)(m.hits + m.misses), 0);

    char *a = cpu_mem_alloc(&m, 4 * MB);
    CHECK(a != NULL && ((uintptr_t)a & 63) == 0);
    memset(a, 1, 4 * MB);
    cpu_mem_free(&m, a);
    CHECK_INT(m.n_idle, 1);
    CHECK_INT((int64_t)m.idle_bytes, (int64_t)(4 * MB));
    int fresh = -1;
    char *b = cpu_mem_alloc_ex(&m, 4 * MB, &fresh);   /* the same block back, not fresh */
    CHECK(b == a);
    CHECK_INT(fresh, 0);
    CHECK_INT((int64_t)m.hits, 1);
    CHECK_INT(m.n_idle, 0);
    cpu_mem_free(&m, b);
    char *c = cpu_mem_alloc(&m, 4 * MB - MB / 4);      /* the block is at most 1/8 larger: reused */
    CHECK(c == a);
    cpu_mem_free(&m, c);
    char *d = cpu_mem_alloc(&m, 2 * MB);        /* much smaller: a fresh block */
    CHECK(d != a);
    CHECK_INT(m.n_idle, 1);
    char *e = cpu_mem_alloc_ex(&m, 5 * MB, &fresh);   /* larger: a fresh block */
    CHECK(e != a);
    CHECK_INT(fresh, 1);
    memset(d, 2, 2 * MB);
    memset(e, 3, 5 * MB);
    cpu_mem_free(&m, d);
    cpu_mem_free(&m, e);
    CHECK_INT(m.n_idle, 3);
    cpu_mem_free(&m, NULL);
    cpu_mem_destroy(&m);
}

static void test_cap(void)
{
    cpu_mem m;
    cpu_mem_init(&m, 5 * MB);
    void *a = cpu_mem_alloc(&m, 2 * MB), *b = cpu_mem_alloc(&m, 2 * MB), *c = cpu_mem_alloc(&m, 2 * MB);
    void *big = cpu_mem_alloc(&m, 6 * MB);
    cpu_mem_free(&m, a);
    cpu_mem_free(&m, b);
    CHECK_INT((int64_t)m.idle_bytes, (int64_t)(4 * MB));
    cpu_mem_free(&m, c);                         /* the oldest (a) goes back */
    CHECK_INT(m.n_idle, 2);
    CHECK_INT((int64_t)m.idle_bytes, (int64_t)(4 * MB));
    CHECK(m.idle[0].p == b && m.idle[1].p == c);
    cpu_mem_free(&m, big);                       /* larger than the cap: not kept */
    CHECK_INT(m.n_idle, 2);
    /* Trim drops the idle blocks (a new job's start), and the cache goes on working. */
    void *live = cpu_mem_alloc(&m, 2 * MB);      /* b again, from the cache */
    CHECK(live == b);
    cpu_mem_trim(&m);
    CHECK_INT(m.n_idle, 0);
    CHECK_INT((int64_t)m.idle_bytes, 0);
    cpu_mem_free(&m, live);                      /* still tracked: kept */
    CHECK_INT(m.n_idle, 1);
    cpu_mem_destroy(&m);

    cpu_mem_init(&m, 0);                         /* cap 0: a plain allocator */
    void *p = cpu_mem_alloc(&m, 2 * MB);
    cpu_mem_free(&m, p);
    CHECK_INT(m.n_idle, 0);
    cpu_mem_destroy(&m);
}

static void test_many_live(void)
{
    /* More live blocks than slots: the extra ones are untracked and simply freed. */
    cpu_mem m;
    cpu_mem_init(&m, 256 * MB);
    void *p[CPU_MEM_SLOTS + 4];
    for (int i = 0; i < CPU_MEM_SLOTS + 4; i++) CHECK((p[i] = cpu_mem_alloc(&m, MB)) != NULL);
    for (int i = 0; i < CPU_MEM_SLOTS + 4; i++) cpu_mem_free(&m, p[i]);
    CHECK_INT(m.n_idle, CPU_MEM_SLOTS);
    cpu_mem_destroy(&m);
}

/* The runtime options' cpu_cache_mb: -1 the default, 0 off, else MB (test_startup_env
 * checks how QUANTD_CPU_CACHE_MB becomes that number). */
static void test_default_cap(void)
{
    size_t def = cpu_mem_default_cap(-1);
    CHECK(def > 0 && def <= ((size_t)4 << 30));
    CHECK_INT((int64_t)cpu_mem_default_cap(0), 0);
    CHECK_INT((int64_t)cpu_mem_default_cap(12), (int64_t)(12 * MB));
}

static void test_backend(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    float *a = qd_backend_alloc(be, 3 * MB);
    CHECK(a != NULL);
    a[0] = 1.0f;
    qd_backend_free(be, a);
    float *b = qd_backend_alloc(be, 3 * MB);
    CHECK(b == a);
    qd_backend_free(be, b);
    qd_backend_close(be);                        /* releases the idle block (ASan: no leak) */
}

#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_CHECKED 0
#endif
#endif
#ifndef RSS_CHECKED
#define RSS_CHECKED 1   /* ASan keeps freed memory in its quarantine: nothing goes back */
#endif

/* What a pipeline's open does (quant/pipeline/pipeline.c): the backend trims its cache of
 * an earlier job's blocks, then the peak resident set is lowered to what is left, so the
 * peak measured afterwards is the new job's. */
static void test_trim_and_peak(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    size_t n = 64 * MB;
    char *a = qd_backend_alloc(be, n);
    CHECK(a != NULL);
    if (a) memset(a, 1, n);                      /* resident */
    qd_backend_free(be, a);                      /* kept by the cache, still resident */
    uint64_t high = qd_rss_peak_bytes();
    CHECK(high >= n);
    qd_backend_trim(be);
    if (qd_rss_peak_reset() == 0 && RSS_CHECKED) CHECK(qd_rss_peak_bytes() + n / 2 < high);
    float *b = qd_backend_alloc(be, n);          /* a fresh block: the cache was emptied */
    CHECK(b != NULL);
    qd_backend_free(be, b);
    qd_backend_close(be);
}

int main(void)
{
    TEST_RUN(test_reuse);
    TEST_RUN(test_cap);
    TEST_RUN(test_many_live);
    TEST_RUN(test_default_cap);
    TEST_RUN(test_backend);
    TEST_RUN(test_trim_and_peak);
    return test_finish();
}
