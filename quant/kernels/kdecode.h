/* Index arithmetic and dequantization of one packed weight value, shared by the CUDA
 * kernels (quant/kernels/cuda) and the host: under nvcc every function is
 * `__host__ __device__`, elsewhere plain `static inline` C. The host test
 * (tests/unit/test_kernel_decode.c) therefore checks the very code the GPU runs against
 * the format table's dequant_ref, for every format x bits x group size x layout, on a
 * machine without a GPU. Bodies live in this header on purpose: a device function must be
 * visible where it is inlined, and one copy for both sides is the point.
 *
 * The rules (../shared/ref/formats.md):
 *   - A block of 32 values of a `bits`-bit stream fills exactly `bits` 32-bit words, read
 *     as one little-endian bit stream: value j sits at bit bits*j. For 2, 4 and 8 bits no
 *     value crosses a word; for 3 bits values 10 and 21 straddle words 0/1 and 1/2.
 *   - gptq / gptq_v2: qweight [K*b/32, N] (column c's stream runs down the rows, word
 *     stride N), qzeros [G, N*b/32] (one stream per group row), zero = stored + offset
 *     (1 for gptq v1, added without masking as the loaders do).
 *   - awq_gemm: qweight [K, N/8], qzeros [G, N/8]; channel c of a word sits in nibble
 *     (c/2) + 4*(c%2), i.e. the order 0,2,4,6,1,3,5,7.
 *   - Group of storage row i: g_idx[i] with act-order, else i / group_size (0 for one
 *     group). In the reordered (exllama) layout rows are sorted by group, so the group is
 *     i / group_size and the input feature is perm[i]; elsewhere the feature is i.
 *   - W[c][feature] = scale[g][c] * (q - zero), the scale an F16 widened to F32.
 *   - Float grids (QD_KMAT_FLOAT, format.h's fcodes/fscales): codes [N, K] E4M3 bytes, or
 *     [N, K/2] bytes of two E2M1 nibbles, the even k in the low nibble; scales [R, G] F32;
 *     W[n][k] = value(code) * s, s = fscales[(n / row_block) * G + k / group_size] (row 0
 *     for row_block -1, group 0 for group_size -1), s / global_scale instead under NVFP4's
 *     rule, that division done first and in F32, as the quantizer's qd_quant_dequant_cfg. */
#ifndef QUANT_KERNELS_KDECODE_H
#define QUANT_KERNELS_KDECODE_H

#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define KD_FN static inline __host__ __device__
#else
#define KD_FN static inline
#endif

/* Which word of a 32-value block holds value j, and its bit offset there. */
KD_FN int kd_block_word(int bits, int j) { return (bits * j) >> 5; }
KD_FN int kd_block_off(int bits, int j) { return (bits * j) & 31; }

/* Value j (0..31) of a block, given the word holding its low bits (lo) and the next word
 * of the block (hi, read only when the value straddles the two: 3 bits, j = 10 or 21). */
KD_FN uint32_t kd_block_value(uint32_t lo, uint32_t hi, int bits, int j)
{
    const int off = kd_block_off(bits, j);
    uint32_t v = lo >> off;
    if (off + bits > 32) v |= hi << ((32 - off) & 31);
    return v & ((1u << bits) - 1u);
}

/* Value idx of a packed stream whose consecutive words sit `wstride` int32s apart. */
KD_FN int32_t kd_stream_get(const int32_t *words, int64_t wstride, int bits, int64_t idx)
{
    const int64_t blk = idx >> 5;
    const int j = (int)(idx & 31), w = kd_block_word(bits, j);
    const int32_t *base = words + blk * bits * wstride;
    const uint32_t lo = (uint32_t)base[w * wstride];
    const uint32_t hi = kd_block_off(bits, j) + bits > 32 ? (uint32_t)base[(w + 1) * wstride] : 0u;
    return (int32_t)kd_block_value(lo, hi, bits, j);
}

/* AWQ: bit shift of channel c (any column; c % 8 is its place in the word). */
KD_FN int kd_awq_shift(int64_t c) { return 4 * (int)(((c & 7) >> 1) + 4 * (c & 1)); }

/* gptq code of storage row i, column c; qweight [K*b/32, N]. */
KD_FN int32_t kd_gptq_code(const int32_t *qweight, int64_t n, int bits, int64_t i, int64_t c)
{
    return kd_stream_get(qweight + c, n, bits, i);
}

/* gptq zero of group g, column c, offset applied; qzeros [G, N*b/32]. */
KD_FN int32_t kd_gptq_zero(const int32_t *qzeros, int64_t n, int bits, int zero_offset, int64_t g, int64_t c)
{
    return kd_stream_get(qzeros + g * (n * bits / 32), 1, bits, c) + zero_offset;
}

/* awq code of row i and zero of group g, column c; qweight [K, N/8], qzeros [G, N/8]. */
KD_FN int32_t kd_awq_code(const int32_t *qweight, int64_t n, int64_t i, int64_t c)
{
    return (int32_t)(((uint32_t)qweight[i * (n / 8) + c / 8] >> kd_awq_shift(c)) & 15u);
}
KD_FN int32_t kd_awq_zero(const int32_t *qzeros, int64_t n, int64_t g, int64_t c)
{
    return (int32_t)(((uint32_t)qzeros[g * (n / 8) + c / 8] >> kd_awq_shift(c)) & 15u);
}

/* Group of storage row i: g_idx (act-order, may be NULL), else i / gs (gs <= 0: one group). */
KD_FN int64_t kd_group(const int32_t *g_idx, int64_t gs, int64_t i)
{
    return g_idx ? (int64_t)g_idx[i] : gs > 0 ? i / gs : 0;
}

/* Input feature (column of x) that storage row i multiplies: perm (reordered layout) or i. */
KD_FN int64_t kd_feature(const int32_t *perm, int64_t i) { return perm ? (int64_t)perm[i] : i; }

/* F16 bits to F32: the hardware conversion on the device, exact bit arithmetic on the host
 * (the same value as quant/core/dtype.c's qd_f16_to_f32, subnormals included). */
KD_FN float kd_half_to_float(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (!man) {
        bits = sign;
    } else {                   /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400u)) { man <<= 1; exp--; }
        bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    union { uint32_t u; float f; } cv;
    cv.u = bits;
    return cv.f;
#endif
}

KD_FN float kd_dequant(float scale, int32_t q, int32_t zero) { return scale * ((float)q - (float)zero); }

/* One packed weight as the kernels see it (device or host pointers alike). */
typedef struct kd_wdesc {
    const int32_t *qweight, *qzeros;
    const uint16_t *scales;        /* [G, N] F16 bits */
    const int32_t *g_idx;          /* act-order groups per storage row, or NULL */
    const int32_t *perm;           /* reordered layout: feature of each storage row, or NULL */
    int64_t n, k, gs;
    int bits, zero_offset, awq;
} kd_wdesc;

/* Dequantized weight of storage row i, output column c: W[c][kd_feature(perm, i)]. */
KD_FN float kd_weight(const kd_wdesc *d, int64_t i, int64_t c)
{
    const int64_t g = kd_group(d->g_idx, d->gs, i);
    const float s = kd_half_to_float(d->scales[g * d->n + c]);
    if (d->awq) return kd_dequant(s, kd_awq_code(d->qweight, d->n, i, c), kd_awq_zero(d->qzeros, d->n, g, c));
    return kd_dequant(s, kd_gptq_code(d->qweight, d->n, d->bits, i, c),
                      kd_gptq_zero(d->qzeros, d->n, d->bits, d->zero_offset, g, c));
}

/* ---- Float grids ------------------------------------------------------------------- */

/* The F32 whose bits are u. */
KD_FN float kd_bits_to_float(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    union { uint32_t u; float f; } cv;
    cv.u = u;
    return cv.f;
#endif
}

/* FP8 E4M3 byte to F32, exact: the same value as quant/core/minifloat.h's
 * qd_fp8_e4m3_to_f32, bits included (a NaN code, 0x7f or 0xff, is the positive quiet NaN
 * 0x7fc00000, as NAN there; 0x80 is -0). Normals move their exponent and mantissa into F32
 * position and rescale by 2^(127 - 7), which is exact; subnormals (exponent 0) are
 * mant * 2^-9, computed without F32 subnormals so a flush-to-zero mode cannot change them. */
KD_FN float kd_fp8_e4m3_value(uint32_t b)
{
    const uint32_t mag = b & 0x7fu;
    if (mag == 0x7fu) return kd_bits_to_float(0x7fc00000u);
    const float v = mag < 8u ? (float)mag * 0x1p-9f : kd_bits_to_float(mag << 20) * 0x1p120f;
    return (b & 0x80u) ? -v : v;
}

/* FP4 E2M1 code (low 4 bits) to F32, exact, as qd_fp4_e2m1_to_f32 (code 8 is -0): the
 * same move to F32 position, rescaled by 2^(127 - 1); codes 0 and 1 (exponent 0) are
 * mant * 0.5. */
KD_FN float kd_fp4_e2m1_value(uint32_t code)
{
    const uint32_t mag = code & 7u;
    const float v = mag < 2u ? (float)mag * 0.5f : kd_bits_to_float(mag << 22) * 0x1p126f;
    return (code & 8u) ? -v : v;
}

/* One float-grid weight as the kernels see it (device or host pointers alike). */
typedef struct kd_fdesc {
    const uint8_t *fcodes;         /* FP8 [N, K]; FP4 [N, K/2] */
    const float *fscales;          /* [R, G] */
    int64_t n, k;
    int64_t gs;                    /* > 0, or -1: one group */
    int64_t n_groups;              /* G */
    int64_t row_block;             /* > 0, or -1: one scale row */
    float global_scale;            /* divides every scale when global (NVFP4) */
    int fp4, global;
} kd_fdesc;

/* Code of W[n][k]: the E4M3 byte, or the E2M1 nibble (even k low, odd k high). */
KD_FN uint32_t kd_float_code(const kd_fdesc *d, int64_t n, int64_t k)
{
    if (d->fp4) return ((uint32_t)d->fcodes[n * (d->k / 2) + k / 2] >> (4 * (int)(k & 1))) & 15u;
    return d->fcodes[n * d->k + k];
}

KD_FN float kd_float_value(int fp4, uint32_t code) { return fp4 ? kd_fp4_e2m1_value(code) : kd_fp8_e4m3_value(code); }

/* The scale of row n, group g, global scale applied (the division in F32). */
KD_FN float kd_float_scale_g(const kd_fdesc *d, int64_t n, int64_t g)
{
    const int64_t r = d->row_block > 0 ? n / d->row_block : 0;
    const float s = d->fscales[r * d->n_groups + g];
    return d->global ? s / d->global_scale : s;
}

/* The scale W[n][k] is multiplied by. */
KD_FN float kd_float_scale(const kd_fdesc *d, int64_t n, int64_t k)
{
    return kd_float_scale_g(d, n, d->gs > 0 ? k / d->gs : 0);
}

/* Dequantized W[n][k]. */
KD_FN float kd_float_weight(const kd_fdesc *d, int64_t n, int64_t k)
{
    return kd_float_value(d->fp4, kd_float_code(d, n, k)) * kd_float_scale(d, n, k);
}

#endif
