/* FP8 E4M3, FP4 E2M1 and E8M0 conversions (minifloat.h). Rounding is done in float
 * arithmetic that is exact: a value divided by a power of two and rounded with rintf
 * (round half to even) lands on the grid of its binade, so no bit tricks on the F32
 * encoding are needed and the code reads as the definition of each type. */
#include "quant/core/minifloat.h"

#include <math.h>

float qd_fp8_e4m3_to_f32(uint8_t b)
{
    const int sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 7;
    float v;
    if (exp == 0xf && mant == 7) return NAN;
    if (exp == 0) v = ldexpf((float)mant, -9);                 /* subnormal: mant * 2^-9 */
    else v = ldexpf((float)(8 + mant), exp - 10);             /* (1 + mant/8) * 2^(exp - 7) */
    return sign ? -v : v;
}

float qd_f32_round_fp8_e4m3(float f)
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

uint8_t qd_f32_to_fp8_e4m3(float f)
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

static const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float qd_fp4_e2m1_to_f32(uint8_t code)
{
    float v = e2m1_values[code & 7];
    return (code & 8) ? -v : v;
}

uint8_t qd_f32_to_fp4_e2m1(float f)
{
    if (isnan(f)) return 0;
    float a = fabsf(f);
    /* Spacing 0.5 below 2, 1 in [2, 4), 2 from 4 up; ties to the even code. */
    float r = a < 2.0f ? rintf(a * 2.0f) * 0.5f : a < 4.0f ? rintf(a) : rintf(a * 0.5f) * 2.0f;
    if (r > QD_FP4_E2M1_MAX) r = QD_FP4_E2M1_MAX;
    uint8_t code = 0;
    for (uint8_t c = 0; c < 8; c++)
        if (e2m1_values[c] == r) code = c;
    return (uint8_t)((signbit(f) && r > 0.0f ? 8 : 0) | code);
}

float qd_e8m0_to_f32(uint8_t e)
{
    if (e == 0xff) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}
