/* qd_parallel_for: every index of [0, n) is visited exactly once, by the share whose
 * contiguous range holds it; ranges start at multiples of grain; the share count is what
 * qd_parallel_shares says and never more than the grains; n 0 runs nothing. */
#include <stdatomic.h>
#include <stdlib.h>

#include "quant/core/parallel.h"
#include "test_util.h"

typedef struct visit_ctx {
    atomic_int *hits;           /* [n] */
    int64_t grain;
    atomic_int bad_start, max_t;
} visit_ctx;

static void visit(void *ctx, int t, int64_t lo, int64_t hi)
{
    visit_ctx *c = ctx;
    if (lo % c->grain != 0 || lo >= hi) atomic_fetch_add(&c->bad_start, 1);
    int m = atomic_load(&c->max_t);
    while (t > m && !atomic_compare_exchange_weak(&c->max_t, &m, t)) {}
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void check(int threads, int64_t n, int64_t grain)
{
    atomic_int *hits = calloc((size_t)(n > 0 ? n : 1), sizeof *hits);
    visit_ctx c = {hits, grain, 0, -1};
    qd_parallel_for(threads, n, grain, visit, &c);
    int once = 1;
    for (int64_t i = 0; i < n; i++) once &= atomic_load(&hits[i]) == 1;
    CHECK(once);
    CHECK_INT(atomic_load(&c.bad_start), 0);
    int shares = qd_parallel_shares(threads, n, grain);
    CHECK(atomic_load(&c.max_t) < shares);
    CHECK(shares >= 1 && shares <= (threads < 1 ? 1 : threads));
    if (n > 0) CHECK(shares <= (n + grain - 1) / grain);
    if (n == 0) CHECK_INT(atomic_load(&c.max_t), -1);
    free(hits);
}

int main(void)
{
    static const int threads[] = {1, 2, 3, 8, 100};
    static const int64_t ns[] = {0, 1, 7, 8, 64, 1000, 4097};
    static const int64_t grains[] = {1, 8, 64, 5000};
    for (size_t a = 0; a < sizeof threads / sizeof *threads; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) check(threads[a], ns[b], grains[g]);
    CHECK_INT(qd_parallel_shares(2, 1000, 64), 2);
    CHECK_INT(qd_parallel_shares(4, 100, 64), 2);
    CHECK_INT(qd_parallel_shares(1000, 1 << 20, 1), QD_PARALLEL_MAX_THREADS);
    return test_finish();
}
