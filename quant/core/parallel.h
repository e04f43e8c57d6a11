/* Splitting a loop over [0, n) across threads for one call: the calling thread takes the
 * first share, pthreads the others, all joined before returning. For loops whose items are
 * independent (rows of a norm, elements of an activation, heads of attention): each item is
 * computed by one thread exactly as a single thread would compute it, so the results do not
 * depend on the thread count. */
#ifndef QUANT_CORE_PARALLEL_H
#define QUANT_CORE_PARALLEL_H

#include <stdint.h>

#define QD_PARALLEL_MAX_THREADS 64

/* fn(ctx, t, lo, hi) for share t (0 .. threads-1) of [0, n): contiguous ranges whose
 * starts are multiples of grain (the last may be shorter); fewer threads when there are
 * fewer than n_threads grains. A share whose thread cannot be started runs on the calling
 * thread. */
typedef void (*qd_parallel_fn)(void *ctx, int t, int64_t lo, int64_t hi);
void qd_parallel_for(int n_threads, int64_t n, int64_t grain, qd_parallel_fn fn, void *ctx);
/* The number of shares qd_parallel_for(n_threads, n, grain, ...) will use (for per-share
 * scratch buffers). */
int qd_parallel_shares(int n_threads, int64_t n, int64_t grain);

#endif
