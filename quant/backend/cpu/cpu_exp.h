/* exp over float arrays for the CPU forward (softmax, SiLU): the calibration forward calls
 * exp once per attention score and per MLP activation, and libm's expf, one call per
 * element, was 5% of a whole GPTQ job's CPU time (SmolLM2-135M, 128 x 512 tokens).
 *
 * One algorithm (Cephes' expf: n = round(x log2 e), r = x - n ln 2 in two parts, a degree-6
 * polynomial, times 2^n), every multiply-add an explicit fmaf, so the AVX2 and AVX-512
 * loops and the portable one return the same bits on every machine (tested). Within 2 ulp
 * of exp over [-87.3, 88.3]; x below that gives exp(-87.3) (about 1.2e-38, 0 for a softmax),
 * above it exp(88.38) (about 2.4e38, never infinity); NaN stays NaN. The portable loop is for
 * CPUs without FMA (before 2013), where fmaf is a libm call: correct, not fast. */
#ifndef QUANT_BACKEND_CPU_EXP_H
#define QUANT_BACKEND_CPU_EXP_H

#include <stdint.h>

/* y[i] = exp(x[i]), i < n (y may be x): the fastest loop this CPU runs. */
void cpu_exp_f32(float *y, const float *x, int64_t n);
/* The same values by the portable loop (the reference the SIMD loops are tested against). */
void cpu_exp_f32_portable(float *y, const float *x, int64_t n);
/* One value, the same algorithm. */
float cpu_expf(float x);

#endif
