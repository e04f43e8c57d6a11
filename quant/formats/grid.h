/* The grids a weight is rounded onto, and the rule that picks each group's scale.
 *
 *   QD_GRID_INT       the uniform integer grid 0 .. 2^bits - 1 with a zero point
 *                     (quantizer.h's min-max rule, scales rounded to F16): gptq, gptq_v2,
 *                     awq_gemm, compressed-tensors pack-quantized.
 *   QD_GRID_FP8_E4M3  FP8 E4M3 values (minifloat.h), symmetric, no zero point. Scale rule
 *                     QD_SCALE_F32: s = amax / 448 in F32 (compressed-tensors'
 *                     calculate_qparams), 2^-126 where amax is 0. A code is the E4M3 byte.
 *   QD_GRID_FP4_E2M1  FP4 E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), symmetric.
 *                     A code is the 4-bit E2M1 nibble (bit 3 the sign). Two scale rules:
 *                     QD_SCALE_FP8_GLOBAL (NVFP4): the tensor has a global scale
 *                       gs = 448 * 6 / amax(tensor) (F32); a group's stored scale is
 *                       s = fp8(gs * amax(group) / 6) (E4M3, at least 2^-9), and values
 *                       decode as e2m1 * (s / gs);
 *                     QD_SCALE_E8M0 (MXFP4): s = 2^(floor(log2 amax') - 2), amax' being
 *                       amax rounded up to the next power of two when its mantissa is at
 *                       least 1.75 (compressed-tensors' round_to_power_2), exponent
 *                       clamped to E8M0's [-127, 127]; values decode as e2m1 * s.
 *
 * Every method (RTN, GPTQ, AWQ's search and clip) rounds through the same two functions,
 * qd_quant_code_cfg and qd_quant_dequant_cfg (quantizer.h), so they all agree on the codes
 * bit for bit, on every grid. Float grids keep qd_qlayer's layout: q holds codes, scales
 * the stored scale of each group as a float, zeros 0. */
#ifndef QUANT_FORMATS_GRID_H
#define QUANT_FORMATS_GRID_H

typedef enum qd_grid {
    QD_GRID_INT = 0,
    QD_GRID_FP8_E4M3 = 1,
    QD_GRID_FP4_E2M1 = 2,
} qd_grid;

typedef enum qd_scale_rule {
    QD_SCALE_F16 = 0,          /* integer grids (and f16_scales = 0: plain F32) */
    QD_SCALE_F32 = 1,          /* FP8 */
    QD_SCALE_FP8_GLOBAL = 2,   /* NVFP4 */
    QD_SCALE_E8M0 = 3,         /* MXFP4 */
} qd_scale_rule;

/* "int", "fp8_e4m3", "fp4_e2m1". */
const char *qd_grid_name(qd_grid g);

#endif
