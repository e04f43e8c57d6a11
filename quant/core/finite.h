/* Finiteness scans of float arrays: the checks that refuse a NaN or infinite weight,
 * Hessian entry or activation before it can reach an output. One pass that the compiler
 * vectorises (the exponent bits of a chunk OR-ed together, no branch per element); the
 * element is only looked for in a chunk that has one. */
#ifndef QUANT_CORE_FINITE_H
#define QUANT_CORE_FINITE_H

#include <stdint.h>

/* The index of the first NaN or infinity among x[0..n), or -1 when all are finite (n <= 0:
 * -1). x may be NULL when n <= 0. */
int64_t qd_f32_first_nonfinite(const float *x, int64_t n);

#endif
