/* The CPU kernel's tile decoders for the float grids (QD_KMAT_FLOAT, see kernels.h): 32
 * K-rows x 8 output columns of W[n][k] = value(code) * s into T [len][8], the layout the
 * integer decoders of kernel_cpu.c fill, so the GEMV, the GEMM and the bulk dequantization
 * run unchanged on top of them.
 *
 * The codes are stored along K ([N, K] bytes, or [N, K/2] nibble pairs), the transpose of
 * the tile, so the AVX2 decoder decodes 8 codes of each of the 8 rows into one register per
 * row (FP8 by moving its exponent and mantissa into F32 position, FP4 through an 8-entry
 * permute table and its sign bit), transposes the 8 x 8 block and multiplies each K-row by
 * the 8 rows' scales of its group. Both decoders compute every weight as kdecode.h's
 * kd_float_weight does: the same exact value, the same F32 scale (divided by the global
 * scale under NVFP4's rule) and one F32 product, so the tile holds the reference's bits.
 * A tile's columns past N (the last tile of a weight whose N is not a multiple of 8) are
 * 0, and the drivers never store them. */
#include <immintrin.h>
#include <string.h>

#include "quant/kernels/kernel_internal.h"

void kcpu_decode_float_portable(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T)
{
    const qd_kmat *m = c->m;
    const kd_fdesc d = kmat_fdesc(m);
    const int nc = kcpu_tile_cols(m, n0);
    for (int l = 0; l < 8; l++) {
        if (l >= nc) {
            for (int j = 0; j < len; j++) T[j * 8 + l] = 0.0f;
            continue;
        }
        const int64_t row = n0 + l;
        int64_t gcur = -1;
        float s = 0.0f;
        for (int j = 0; j < len; j++) {
            const int64_t i = i0 + j, g = d.gs > 0 ? i / d.gs : 0;
            if (g != gcur) {
                s = kd_float_scale_g(&d, row, g);
                gcur = g;
            }
            T[j * 8 + l] = kd_float_value(d.fp4, kd_float_code(&d, row, i)) * s;
        }
    }
}

/* ---- AVX2 ---------------------------------------------------------------------------- */

/* Eight E4M3 bytes (the low 8 of b) to F32, bit for bit kd_fp8_e4m3_value. */
__attribute__((target("avx2,fma")))
static __m256 kfl_fp8x8(__m128i b8)
{
    const __m256i b = _mm256_cvtepu8_epi32(b8);
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256 norm = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
    __m256 v = _mm256_blendv_ps(norm, sub, _mm256_castsi256_ps(is_sub));
    v = _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
    const __m256i is_nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f));
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), _mm256_castsi256_ps(is_nan));
}

/* Eight E2M1 nibbles of a little-endian word (code j in bits 4j..4j+3) to F32, bit for bit
 * kd_fp4_e2m1_value: the magnitude from a table of the 8 values, then the sign bit. */
__attribute__((target("avx2,fma")))
static __m256 kfl_fp4x8(uint32_t w)
{
    const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                                         _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(15));
    const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 v = _mm256_permutevar8x32_ps(lut, c);      /* the index's low 3 bits */
    return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28)));
}

/* The scales of group g for the tile's rows (0 past N), into sv. */
static void kfl_scales(const kd_fdesc *d, int64_t n0, int nc, int64_t g, float *sv)
{
    for (int l = 0; l < 8; l++) sv[l] = l < nc ? kd_float_scale_g(d, n0 + l, g) : 0.0f;
}

__attribute__((target("avx2,fma")))
void kcpu_decode_float_avx2(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T)
{
    const qd_kmat *m = c->m;
    const kd_fdesc d = kmat_fdesc(m);
    const int nc = kcpu_tile_cols(m, n0);
    float sv[8] __attribute__((aligned(32)));
    int64_t gcur = -1;
    __m256 vs = _mm256_setzero_ps();
    int j0 = 0;
    /* i0 is a multiple of 32 (the drivers' tiles and panels), so i0 + j0 is even: whole
     * bytes of FP4 codes. */
    for (; j0 + 8 <= len; j0 += 8) {
        const int64_t i = i0 + j0;
        __m256 r[8];
        for (int l = 0; l < 8; l++) {
            if (l >= nc) {
                r[l] = _mm256_setzero_ps();
            } else if (d.fp4) {
                uint32_t w;
                memcpy(&w, d.fcodes + (n0 + l) * (d.k / 2) + i / 2, 4);
                r[l] = kfl_fp4x8(w);
            } else {
                r[l] = kfl_fp8x8(_mm_loadl_epi64((const __m128i *)(d.fcodes + (n0 + l) * d.k + i)));
            }
        }
        kd_transpose8_avx2(r);
        const int64_t ga = d.gs > 0 ? i / d.gs : 0, gb = d.gs > 0 ? (i + 7) / d.gs : 0;
        if (ga == gb) {
            /* The 8 K-rows share a group (always, for group sizes that are multiples of 8). */
            if (ga != gcur) {
                kfl_scales(&d, n0, nc, ga, sv);
                vs = _mm256_load_ps(sv);
                gcur = ga;
            }
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(T + (j0 + j) * 8, _mm256_mul_ps(r[j], vs));
        } else {
            for (int j = 0; j < 8; j++) {
                const int64_t g = (i + j) / d.gs;
                if (g != gcur) {
                    kfl_scales(&d, n0, nc, g, sv);
                    vs = _mm256_load_ps(sv);
                    gcur = g;
                }
                _mm256_storeu_ps(T + (j0 + j) * 8, _mm256_mul_ps(r[j], vs));
            }
        }
    }
    /* The tail of a K that is not a multiple of 8. */
    for (int j = j0; j < len; j++)
        for (int l = 0; l < 8; l++) T[j * 8 + l] = l < nc ? kd_float_weight(&d, n0 + l, i0 + j) : 0.0f;
}
