/* dtype names, sizes and F16/BF16 <-> F32 conversions (round to nearest even). */
#include "quant/core/dtype.h"
#include "quant/core/error.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; int rank; } dtype_info[QD_DTYPE_COUNT] = {
    [QD_DTYPE_INVALID] = {"INVALID", 0, -1},
    [QD_DTYPE_BOOL] = {"BOOL", 1, 0},
    [QD_DTYPE_U8] = {"U8", 1, 1},
    [QD_DTYPE_I8] = {"I8", 1, 2},
    [QD_DTYPE_F8_E5M2] = {"F8_E5M2", 1, 3},
    [QD_DTYPE_F8_E4M3] = {"F8_E4M3", 1, 4},
    [QD_DTYPE_I16] = {"I16", 2, 5},
    [QD_DTYPE_U16] = {"U16", 2, 6},
    [QD_DTYPE_F16] = {"F16", 2, 7},
    [QD_DTYPE_BF16] = {"BF16", 2, 8},
    [QD_DTYPE_I32] = {"I32", 4, 9},
    [QD_DTYPE_U32] = {"U32", 4, 10},
    [QD_DTYPE_F32] = {"F32", 4, 11},
    [QD_DTYPE_F64] = {"F64", 8, 12},
    [QD_DTYPE_I64] = {"I64", 8, 13},
    [QD_DTYPE_U64] = {"U64", 8, 14},
};

size_t qd_dtype_size(qd_dtype t) { return (t > 0 && t < QD_DTYPE_COUNT) ? dtype_info[t].size : 0; }
const char *qd_dtype_name(qd_dtype t) { return (t > 0 && t < QD_DTYPE_COUNT) ? dtype_info[t].name : "INVALID"; }
int qd_dtype_sort_rank(qd_dtype t) { return (t > 0 && t < QD_DTYPE_COUNT) ? dtype_info[t].rank : -1; }

qd_dtype qd_dtype_parse(const char *name)
{
    if (!name) return QD_DTYPE_INVALID;
    for (int t = 1; t < QD_DTYPE_COUNT; t++)
        if (strcmp(name, dtype_info[t].name) == 0) return (qd_dtype)t;
    return QD_DTYPE_INVALID;
}

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float qd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));   /* Inf / NaN */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* Subnormal: value = mant * 2^-24, exact in F32. */
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t qd_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)                       /* Inf or NaN; keep NaN quiet and non-zero */
        return sign | 0x7c00 | (a > 0x7f800000u ? (uint16_t)(0x200 | ((a >> 13) & 0x3ff)) : 0);
    if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: overflow to Inf */
    if (a < 0x38800000u) {                      /* below the smallest normal F16 (2^-14) */
        if (a < 0x33000000u) return sign;       /* < 2^-25 rounds to 0 */
        /* Subnormal: round a * 2^24 to an integer, nearest even. */
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
        int shift = 126 - (int)e;               /* m * 2^(e-150) * 2^24 = m >> (126 - e) */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfff + ((a >> 13) & 1);   /* round to nearest even on bit 13 */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float qd_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t qd_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float qd_f32_round_f16(float f) { return qd_f16_to_f32(qd_f32_to_f16(f)); }

int qd_convert_to_f32(qd_dtype from, const void *src, float *dst, size_t n)
{
    size_t i;
    switch (from) {
    case QD_DTYPE_F32: memmove(dst, src, n * 4); return 0;
    case QD_DTYPE_F16: { const uint16_t *s = src; for (i = 0; i < n; i++) dst[i] = qd_f16_to_f32(s[i]); return 0; }
    case QD_DTYPE_BF16: { const uint16_t *s = src; for (i = 0; i < n; i++) dst[i] = qd_bf16_to_f32(s[i]); return 0; }
    case QD_DTYPE_F64: { const double *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case QD_DTYPE_I32: { const int32_t *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case QD_DTYPE_I64: { const int64_t *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case QD_DTYPE_I16: { const int16_t *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case QD_DTYPE_I8: { const int8_t *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case QD_DTYPE_U8: { const uint8_t *s = src; for (i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    default: return QD_EUNSUPPORTED;
    }
}

int qd_convert_from_f32(qd_dtype to, const float *src, void *dst, size_t n)
{
    size_t i;
    switch (to) {
    case QD_DTYPE_F32: memmove(dst, src, n * 4); return 0;
    case QD_DTYPE_F16: { uint16_t *d = dst; for (i = 0; i < n; i++) d[i] = qd_f32_to_f16(src[i]); return 0; }
    case QD_DTYPE_BF16: { uint16_t *d = dst; for (i = 0; i < n; i++) d[i] = qd_f32_to_bf16(src[i]); return 0; }
    default: return QD_EUNSUPPORTED;
    }
}
