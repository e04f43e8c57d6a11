/* What every program's allocator does (startup/runtime_env.c, qst_malloc_tune): a large
 * buffer freed is kept for the next allocation of its size, so that allocation touches no
 * fresh page (the kernel would zero each one); qd_rss_release hands what is kept back, and
 * an allocation after it starts from fresh pages again. Counted in minor page faults
 * (getrusage), not timed. */
#include <stdlib.h>
#include <sys/resource.h>

#include "quant/core/rss.h"
#include "startup/runtime_env.h"
#include "test_util.h"

/* Under AddressSanitizer malloc is the sanitizer's: mallopt does not reach it. */
#if defined(__SANITIZE_ADDRESS__)
#define KEEP_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEEP_CHECKED 0
#endif
#endif
#ifndef KEEP_CHECKED
#define KEEP_CHECKED 1
#endif

#define BUF (64u << 20)

static long minflt(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

/* Minor faults of allocating BUF bytes, writing each of its pages, and freeing them. */
static long faults_of_one_buffer(void)
{
    long f0 = minflt();
    volatile char *p = malloc(BUF);   /* volatile: the stores, and so the buffer, stay */
    CHECK(p != NULL);
    for (size_t i = 0; p && i < BUF; i += 4096) p[i] = 1;   /* every page, whatever its size */
    free((void *)p);
    return minflt() - f0;
}

static void test_kept_then_released(void)
{
    qst_malloc_tune();
    long first = faults_of_one_buffer();   /* fresh pages */
    long again = faults_of_one_buffer();   /* the first buffer's, kept */
    qd_rss_release();
    long released = faults_of_one_buffer();   /* fresh again */
    if (!KEEP_CHECKED) return;
    /* Relative to the first: pages of 4 KiB or 64 KiB, or huge pages, give other counts. */
    CHECK(first > 0);
    CHECK(again * 8 < first);
    CHECK(released * 2 >= first);
}

int main(void)
{
    TEST_RUN(test_kept_then_released);
    return test_finish();
}
