/* The monotonic clock: the one source of elapsed time in every layer and program (timings
 * in reports and logs, deadlines, heartbeats, benchmarks). CLOCK_MONOTONIC never jumps
 * with the wall clock, so differences of two readings are durations; the values mean
 * nothing on their own and are not comparable across machines or boots. */
#ifndef QUANT_CORE_CLOCK_H
#define QUANT_CORE_CLOCK_H

#include <stdint.h>

/* Seconds since an arbitrary fixed point, with the clock's full resolution. */
double qd_clock_now_s(void);
/* Whole milliseconds on the same clock (for integer deadlines and timers). */
uint64_t qd_clock_now_ms(void);

#endif
