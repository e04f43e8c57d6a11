/* The small float types of today's GPUs, as values: FP8 E4M3 ("e4m3fn": bias 7, no
 * infinities, 0x7f/0xff NaN, largest 448), FP4 E2M1 (the OCP MX element: 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 and their negatives; bit 3 the sign) and E8M0 (the MX scale: 2^(e - 127),
 * 0xff NaN).
 *
 * Encoders round to nearest, ties to even (what torch's casts and compressed-tensors'
 * FP4 table do) and saturate at the largest finite value, so an encoder never produces a
 * NaN from a finite input; a NaN input encodes to NaN for FP8 and to 0 for FP4, which has
 * none (callers refuse non-finite weights before quantizing). Decoders are exact. All
 * functions are pure. */
#ifndef QUANT_CORE_MINIFLOAT_H
#define QUANT_CORE_MINIFLOAT_H

#include <stdint.h>

#define QD_FP8_E4M3_MAX 448.0f
#define QD_FP4_E2M1_MAX 6.0f

float qd_fp8_e4m3_to_f32(uint8_t b);
uint8_t qd_f32_to_fp8_e4m3(float f);
/* What f becomes once stored as FP8 E4M3 (saturated, rounded). */
float qd_f32_round_fp8_e4m3(float f);

float qd_fp4_e2m1_to_f32(uint8_t code);        /* low 4 bits used */
uint8_t qd_f32_to_fp4_e2m1(float f);           /* 0..15 */

float qd_e8m0_to_f32(uint8_t e);               /* 2^(e - 127); NaN for 0xff */

#endif
