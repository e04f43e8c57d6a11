/* The small float types of today's GPUs, as values: FP8 E4M3 ("e4m3fn": bias 7, no
 * infinities, 0x7f/0xff NaN, largest 448), FP4 E2M1 (the OCP MX element: 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 and their negatives; bit 3 the sign) and E8M0 (the MX scale: 2^(e - 127),
 * 0xff NaN).
 *
 * Encoders round to nearest, ties to even (what torch's casts and compressed-tensors'
 * FP4 table do) and saturate at the largest finite value, so an encoder never produces a
 * NaN from a finite input; a NaN input encodes to NaN for FP8 and to 0 for FP4, which has
 * none (callers refuse non-finite weights before quantizing). Decoders are exact. All
 * functions are pure, static inline, and compile as CUDA device code too (the GPTQ kernels
 * and the dequantizing kernels round and decode with these very functions). Rounding is
 * done in float arithmetic that is exact: a value scaled by a power of two and rounded with
 * rintf (half to even) lands on the grid of its binade. */
#ifndef QUANT_CORE_MINIFLOAT_H
#define QUANT_CORE_MINIFLOAT_H

#include <math.h>
#include <stdint.h>

#define QD_FP8_E4M3_MAX 448.0f
#define QD_FP4_E2M1_MAX 6.0f

#ifdef __CUDACC__
#define QD_MF_FN __host__ __device__ static inline
#else
#define QD_MF_FN static inline
#endif

/* qd_fp8_e4m3_to_f32, qd_f32_to_fp8_e4m3, qd_f32_round_fp8_e4m3 (what f becomes once stored
 * as E4M3: saturated, rounded), qd_fp4_e2m1_to_f32 (low 4 bits used), qd_f32_to_fp4_e2m1
 * (0..15), qd_e8m0_to_f32 (2^(e - 127); NaN for 0xff). */
QD_MF_FN float qd_fp8_e4m3_to_f32(uint8_t b)
{
    const int sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 7;
    float v;
    if (exp == 0xf && mant == 7) return NAN;
    if (exp == 0) v = ldexpf((float)mant, -9);                 /* subnormal: mant * 2^-9 */
    else v = ldexpf((float)(8 + mant), exp - 10);             /* (1 + mant/8) * 2^(exp - 7) */
    return sign ? -v : v;
}

QD_MF_FN float qd_f32_round_fp8_e4m3(float f)
{
    if (isnan(f)) return f;
    float a = fabsf(f);
    if (a >= QD_FP8_E4M3_MAX) return copysignf(QD_FP8_E4M3_MAX, f);
    /* The spacing of the grid at a: 2^(e - 3) in the binade [2^e, 2^(e+1)), e >= -6;
     * 2^-9 below 2^-6 (subnormals). */
    int e;
    frexpf(a, &e);                                            /* a = m * 2^e, m in [0.5, 1) */
    int q = e - 1 - 3;
    if (q < -9) q = -9;
    float r = ldexpf(rintf(ldexpf(a, -q)), q);
    if (r > QD_FP8_E4M3_MAX) r = QD_FP8_E4M3_MAX;
    return copysignf(r, f);
}

QD_MF_FN uint8_t qd_f32_to_fp8_e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    float r = qd_f32_round_fp8_e4m3(f);
    uint8_t sign = signbit(r) ? 0x80 : 0;
    float a = fabsf(r);
    if (a == 0.0f) return sign;
    if (a < 0.015625f) return (uint8_t)(sign | (uint8_t)ldexpf(a, 9));   /* subnormal */
    int e;
    float m = frexpf(a, &e);                                  /* a = m * 2^e, m in [0.5, 1) */
    int mant = (int)ldexpf(m, 4) - 8;                         /* m * 16 in [8, 16) */
    return (uint8_t)(sign | ((e - 1 + 7) << 3) | mant);
}

QD_MF_FN float qd_fp4_e2m1_to_f32(uint8_t code)
{
    /* 0, 0.5, 1, 1.5, 2, 3, 4, 6: (2 + m) 2^(e - 2) for e >= 1, m / 2 for e = 0. */
    const int e = (code >> 1) & 3, m = code & 1;
    float v = e ? ldexpf((float)(2 + m), e - 2) : 0.5f * (float)m;
    return (code & 8) ? -v : v;
}

QD_MF_FN uint8_t qd_f32_to_fp4_e2m1(float f)
{
    if (isnan(f)) return 0;
    float a = fabsf(f);
    /* Spacing 0.5 below 2, 1 in [2, 4), 2 from 4 up; ties to the even code. */
    float r = a < 2.0f ? rintf(a * 2.0f) * 0.5f : a < 4.0f ? rintf(a) : rintf(a * 0.5f) * 2.0f;
    if (r > QD_FP4_E2M1_MAX) r = QD_FP4_E2M1_MAX;
    /* r is on the grid: 2r is 0, 1, 2, 3 (codes 0-3), 4, 6 (codes 4, 5), 8, 12 (6, 7). */
    int t = (int)(r * 2.0f);
    uint8_t code = (uint8_t)(t < 4 ? t : t < 8 ? 4 + (t - 4) / 2 : 6 + (t - 8) / 4);
    return (uint8_t)((signbit(f) && r > 0.0f ? 8 : 0) | code);
}

QD_MF_FN float qd_e8m0_to_f32(uint8_t e)
{
    if (e == 0xff) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

#endif
