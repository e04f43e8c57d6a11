/* FP8-block weights as DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8, GLM-4.5-FP8 and MiniMax-M2 ship
 * them: a linear's `weight` is F8_E4M3 [N, K] and its `weight_scale_inv` F32 (or BF16)
 * [ceil(N/bn), ceil(K/bk)] for config.json's weight_block_size [bn, bk]; the float weight is
 * weight[i][j] * weight_scale_inv[i/bn][j/bk] (the name says "inv", but it multiplies).
 *
 * The loader (model_fp8.c, through model_internal.h) dequantizes such a linear when its block
 * is loaded; this header holds the decoding itself, pure, for the loader and the tests. */
#ifndef QUANT_MODEL_MODEL_FP8_H
#define QUANT_MODEL_MODEL_FP8_H

#include <stdint.h>

/* The scale tensor's suffix, beside "weight". */
#define QD_FP8_SCALE_SUFFIX "weight_scale_inv"

/* Rows [r0, r1) of the weight: out[i * k + j] = e4m3(codes[i * k + j]) * scales[(i / bn) *
 * ceil(k / bk) + j / bk], one F32 product per element (what torch computes for
 * `weight.to(torch.float32) * scale` with the scale expanded over its block), so the result is
 * exact to the bit and independent of how the rows are split. out points at row 0. */
void qd_fp8_block_dequant(const uint8_t *codes, int64_t n, int64_t k, const float *scales, int64_t bn, int64_t bk,
                          int64_t r0, int64_t r1, float *out);

#endif
