/* One call's loop across threads (see parallel.h). */
#include "quant/core/parallel.h"

#include <pthread.h>

typedef struct par_share {
    qd_parallel_fn fn;
    void *ctx;
    int t;
    int64_t lo, hi;
} par_share;

static void *par_run(void *arg)
{
    par_share *s = arg;
    if (s->lo < s->hi) s->fn(s->ctx, s->t, s->lo, s->hi);
    return NULL;
}

int qd_parallel_shares(int n_threads, int64_t n, int64_t grain)
{
    if (grain < 1) grain = 1;
    int64_t grains = n > 0 ? (n + grain - 1) / grain : 0;
    int nt = n_threads < 1 ? 1 : n_threads > QD_PARALLEL_MAX_THREADS ? QD_PARALLEL_MAX_THREADS : n_threads;
    if (grains < nt) nt = grains > 0 ? (int)grains : 1;
    return nt;
}

void qd_parallel_for(int n_threads, int64_t n, int64_t grain, qd_parallel_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = qd_parallel_shares(n_threads, n, grain);
    if (nt == 1) { fn(ctx, 0, 0, n); return; }
    int64_t grains = (n + grain - 1) / grain;
    int64_t per = (grains + nt - 1) / nt * grain;   /* whole grains each */
    par_share shares[QD_PARALLEL_MAX_THREADS];
    pthread_t tid[QD_PARALLEL_MAX_THREADS];
    int started[QD_PARALLEL_MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++) {
        int64_t lo = t * per, hi = lo + per < n ? lo + per : n;
        if (lo > n) lo = n;
        shares[t] = (par_share){fn, ctx, t, lo, hi};
    }
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&tid[t], NULL, par_run, &shares[t]) == 0;
    par_run(&shares[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else par_run(&shares[t]);
    }
}
