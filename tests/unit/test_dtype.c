/* quant/core/dtype.c: names and sizes, and the F16/BF16 conversions. Every F16 and BF16
 * value is round-tripped exhaustively; F32 -> F16/BF16 rounding is compared with an
 * independent reference (scale by a power of two in double, round with nearbyint, which
 * is round-to-nearest-even) over a sweep of all F32 bit patterns, plus hand-picked ties,
 * subnormals, overflow and NaN cases. */
#include "test_util.h"

#include <float.h>
#include <stdlib.h>

#include "quant/core/dtype.h"
#include "quant/core/error.h"

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The F16 value of h computed from the definition. */
static double f16_value_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* What x becomes once rounded to F16 (finite x), by the reference method; *inf says it
 * overflows. */
static double f16_round_ref(float x, int *inf)
{
    double d = x;
    *inf = 0;
    if (d == 0) return d;
    int e;
    frexp(d, &e);              /* |d| in [2^(e-1), 2^e) */
    int ex = e - 1 < -14 ? -14 : e - 1;
    double q = ldexp(1.0, ex - 10);
    double r = nearbyint(d / q) * q;
    if (fabs(r) > 65504.0) *inf = 1;
    return r;
}

static double bf16_round_ref(float x, int *inf)
{
    double d = x;
    *inf = 0;
    if (d == 0) return d;
    int e;
    frexp(d, &e);
    int ex = e - 1 < -126 ? -126 : e - 1;
    double q = ldexp(1.0, ex - 7);
    double r = nearbyint(d / q) * q;
    if (fabs(r) > (double)from_bits(0x7f7f0000u)) *inf = 1;
    return r;
}

static void test_names(void)
{
    for (int t = 1; t < QD_DTYPE_COUNT; t++) {
        CHECK_INT(qd_dtype_parse(qd_dtype_name((qd_dtype)t)), t);
        CHECK(qd_dtype_size((qd_dtype)t) > 0);
    }
    CHECK_INT(qd_dtype_parse("F17"), QD_DTYPE_INVALID);
    CHECK_INT(qd_dtype_parse("f32"), QD_DTYPE_INVALID);   /* names are case-sensitive */
    CHECK_INT(qd_dtype_parse(NULL), QD_DTYPE_INVALID);
    CHECK_STR(qd_dtype_name(QD_DTYPE_INVALID), "INVALID");
    CHECK_INT(qd_dtype_size(QD_DTYPE_INVALID), 0);
    CHECK_INT(qd_dtype_size(QD_DTYPE_BF16), 2);
    CHECK_INT(qd_dtype_size(QD_DTYPE_F64), 8);
    CHECK_INT(qd_dtype_size(QD_DTYPE_F8_E4M3), 1);
    /* The Python library's order, highest first. */
    const qd_dtype order[] = {QD_DTYPE_U64, QD_DTYPE_I64, QD_DTYPE_F64, QD_DTYPE_F32, QD_DTYPE_U32, QD_DTYPE_I32,
                              QD_DTYPE_BF16, QD_DTYPE_F16, QD_DTYPE_U16, QD_DTYPE_I16, QD_DTYPE_F8_E4M3,
                              QD_DTYPE_F8_E5M2, QD_DTYPE_I8, QD_DTYPE_U8, QD_DTYPE_BOOL};
    for (size_t i = 1; i < sizeof order / sizeof order[0]; i++)
        CHECK(qd_dtype_sort_rank(order[i - 1]) > qd_dtype_sort_rank(order[i]));
}

static void test_f16_exhaustive(void)
{
    int bad_value = 0, bad_trip = 0, bad_nan = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qd_f16_to_f32((uint16_t)h);
        uint16_t back = qd_f32_to_f16(f);
        int is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        if (is_nan) {
            /* NaN stays NaN, keeps its sign and payload, and comes back quiet. */
            bad_nan += !isnan(f) || (signbit(f) != 0) != ((h >> 15) != 0) ||
                       ((back & 0x7c00) != 0x7c00) || (back & 0x3ff) != ((h & 0x3ff) | 0x200) ||
                       (back & 0x8000) != (h & 0x8000);
            continue;
        }
        if (((h >> 10) & 0x1f) == 0x1f) bad_value += !isinf(f) || (signbit(f) != 0) != ((h >> 15) != 0);
        else bad_value += (double)f != f16_value_ref((uint16_t)h) || (signbit(f) != 0) != ((h >> 15) != 0);
        bad_trip += back != h;
    }
    CHECK_INT(bad_value, 0);
    CHECK_INT(bad_trip, 0);
    CHECK_INT(bad_nan, 0);
}

static void test_f16_cases(void)
{
    /* Ties go to even. */
    CHECK_INT(qd_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);          /* halfway 1 and 1+2^-10: even is 1 */
    CHECK_INT(qd_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);      /* halfway, rounds up to even */
    CHECK_INT(qd_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);   /* just above halfway */
    CHECK_INT(qd_f32_to_f16(2049.0f), 0x6800);                   /* 2048 (even) */
    CHECK_INT(qd_f32_to_f16(2051.0f), 0x6802);                   /* 2052 (even) */
    /* Overflow to Inf. */
    CHECK_INT(qd_f32_to_f16(65504.0f), 0x7bff);
    CHECK_INT(qd_f32_to_f16(65519.0f), 0x7bff);                  /* below the halfway point 65520 */
    CHECK_INT(qd_f32_to_f16(65520.0f), 0x7c00);                  /* tie to even is 65536: Inf */
    CHECK_INT(qd_f32_to_f16(1e6f), 0x7c00);
    CHECK_INT(qd_f32_to_f16(-1e30f), 0xfc00);
    CHECK_INT(qd_f32_to_f16(INFINITY), 0x7c00);
    CHECK_INT(qd_f32_to_f16(-INFINITY), 0xfc00);
    CHECK_INT(qd_f32_to_f16(FLT_MAX), 0x7c00);
    /* Subnormals. */
    CHECK_INT(qd_f32_to_f16(0x1p-24f), 0x0001);
    CHECK_INT(qd_f32_to_f16(0x1p-25f), 0x0000);                  /* tie between 0 and 1: even is 0 */
    CHECK_INT(qd_f32_to_f16(0x1.000002p-25f), 0x0001);
    CHECK_INT(qd_f32_to_f16(3 * 0x1p-25f), 0x0002);              /* 1.5 -> 2 */
    CHECK_INT(qd_f32_to_f16(5 * 0x1p-25f), 0x0002);              /* 2.5 -> 2 */
    CHECK_INT(qd_f32_to_f16(-0x1p-24f), 0x8001);
    CHECK_INT(qd_f32_to_f16(1023 * 0x1p-24f), 0x03ff);           /* largest subnormal */
    CHECK_INT(qd_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);        /* rounds up into the normals */
    CHECK_INT(qd_f32_to_f16(0x1p-14f), 0x0400);                  /* smallest normal */
    CHECK_INT(qd_f32_to_f16(1e-30f), 0x0000);
    CHECK_INT(qd_f32_to_f16(-1e-30f), 0x8000);                   /* keeps the sign of zero */
    CHECK_INT(qd_f32_to_f16(from_bits(1)), 0x0000);              /* F32 subnormal */
    CHECK_INT(qd_f32_to_f16(-0.0f), 0x8000);
    /* NaN stays NaN, including one whose payload sits only in the low F32 bits. */
    uint16_t n1 = qd_f32_to_f16(NAN), n2 = qd_f32_to_f16(from_bits(0x7f800001u)), n3 = qd_f32_to_f16(from_bits(0xff800001u));
    CHECK((n1 & 0x7c00) == 0x7c00 && (n1 & 0x3ff));
    CHECK((n2 & 0x7c00) == 0x7c00 && (n2 & 0x3ff) && !(n2 & 0x8000));
    CHECK((n3 & 0x7c00) == 0x7c00 && (n3 & 0x3ff) && (n3 & 0x8000));
    CHECK(isnan(qd_f32_round_f16(NAN)));
    CHECK_NEAR(qd_f32_round_f16(0.1f), 0.0999755859375, 0);
}

/* Sweeps F32 bit patterns with a stride coprime to every field width, so every exponent
 * and many mantissa tails are hit, and compares with the reference rounding. */
static void test_f16_reference_sweep(void)
{
    int bad = 0, shown = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 251) {
        float x = from_bits((uint32_t)u);
        if (isnan(x) || isinf(x)) continue;
        int inf;
        double r = f16_round_ref(x, &inf);
        float got = qd_f16_to_f32(qd_f32_to_f16(x));
        int ok = inf ? (isinf(got) && (signbit(got) != 0) == (x < 0)) : ((double)got == r && signbit(got) == signbit(x));
        if (!ok && shown++ < 5) fprintf(stderr, "f16: x=%a (0x%08x) got %a want %a\n", x, (uint32_t)u, got, r);
        bad += !ok;
    }
    CHECK_INT(bad, 0);
#ifdef __FLT16_MAX__
    /* The compiler's own _Float16 conversion (IEEE, round to nearest even) agrees too. */
    int bad16 = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
        float x = from_bits((uint32_t)u);
        if (isnan(x)) continue;
        _Float16 h = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        bad16 += hb != qd_f32_to_f16(x);
    }
    CHECK_INT(bad16, 0);
#endif
}

static void test_bf16(void)
{
    int bad_trip = 0, bad_nan = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = qd_bf16_to_f32((uint16_t)b);
        CHECK_INT(bits(f), b << 16);   /* BF16 is the top half of F32 */
        uint16_t back = qd_f32_to_bf16(f);
        if (isnan(f)) bad_nan += (back & 0x7f80) != 0x7f80 || !(back & 0x40) || (back & 0x8000) != (b & 0x8000);
        else bad_trip += back != b;
    }
    CHECK_INT(bad_trip, 0);
    CHECK_INT(bad_nan, 0);

    CHECK_INT(qd_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          /* tie: even is 1 */
    CHECK_INT(qd_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie: up to even */
    CHECK_INT(qd_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_INT(qd_f32_to_bf16(FLT_MAX), 0x7f80);                  /* overflows to Inf */
    CHECK_INT(qd_f32_to_bf16(-FLT_MAX), 0xff80);
    CHECK_INT(qd_f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);   /* largest finite stays */
    CHECK_INT(qd_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_INT(qd_f32_to_bf16(from_bits(0x00008000u)), 0x0000);   /* subnormal tie: even is 0 */
    CHECK_INT(qd_f32_to_bf16(from_bits(0x00018000u)), 0x0002);   /* subnormal tie: up to even */
    CHECK_INT(qd_f32_to_bf16(from_bits(0x007fffffu)), 0x0080);   /* rounds up into the normals */
    uint16_t n = qd_f32_to_bf16(from_bits(0x7f800001u));         /* payload only in the low bits */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f));
    CHECK(isnan(qd_bf16_to_f32(qd_f32_to_bf16(-NAN))));

    int bad = 0, shown = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 251) {
        float x = from_bits((uint32_t)u);
        if (isnan(x) || isinf(x)) continue;
        int inf;
        double r = bf16_round_ref(x, &inf);
        float got = qd_bf16_to_f32(qd_f32_to_bf16(x));
        int ok = inf ? (isinf(got) && (signbit(got) != 0) == (x < 0)) : ((double)got == r && signbit(got) == signbit(x));
        if (!ok && shown++ < 5) fprintf(stderr, "bf16: x=%a got %a want %a\n", x, got, r);
        bad += !ok;
    }
    CHECK_INT(bad, 0);
}

static void test_convert(void)
{
    float out[4];
    const int32_t i32[4] = {-5, 0, 7, 2147483647};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_I32, i32, out, 4));
    CHECK_NEAR(out[0], -5, 0);
    CHECK_NEAR(out[3], 2147483648.0, 0);
    const int64_t i64[2] = {-3, 1ll << 40};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_I64, i64, out, 2));
    CHECK_NEAR(out[1], 1099511627776.0, 0);
    const int16_t i16[2] = {-32768, 5};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_I16, i16, out, 2));
    CHECK_NEAR(out[0], -32768, 0);
    const int8_t i8[2] = {-128, 127};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_I8, i8, out, 2));
    CHECK_NEAR(out[0], -128, 0);
    const uint8_t u8[2] = {255, 1};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_U8, u8, out, 2));
    CHECK_NEAR(out[0], 255, 0);
    const double f64[2] = {0.1, -1e300};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_F64, f64, out, 2));
    CHECK_NEAR(out[0], 0.1f, 0);
    CHECK(isinf(out[1]) && out[1] < 0);
    const uint16_t h[3] = {0x3c00, 0xc000, 0x7c00};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_F16, h, out, 3));
    CHECK_NEAR(out[0], 1, 0);
    CHECK_NEAR(out[1], -2, 0);
    CHECK(isinf(out[2]));
    const uint16_t bf[2] = {0x3f80, 0x4049};
    CHECK_OK(qd_convert_to_f32(QD_DTYPE_BF16, bf, out, 2));
    CHECK_NEAR(out[1], 3.140625, 0);
    CHECK_INT(qd_convert_to_f32(QD_DTYPE_U64, i64, out, 1), QD_EUNSUPPORTED);
    CHECK_INT(qd_convert_to_f32(QD_DTYPE_INVALID, i64, out, 1), QD_EUNSUPPORTED);

    const float src[3] = {1.0f, 0.1f, -65520.0f};
    uint16_t dst[3];
    CHECK_OK(qd_convert_from_f32(QD_DTYPE_F16, src, dst, 3));
    CHECK_INT(dst[0], 0x3c00);
    CHECK_INT(dst[1], 0x2e66);
    CHECK_INT(dst[2], 0xfc00);
    CHECK_OK(qd_convert_from_f32(QD_DTYPE_BF16, src, dst, 3));
    CHECK_INT(dst[0], 0x3f80);
    CHECK_INT(dst[1], 0x3dcd);
    float back[3];
    CHECK_OK(qd_convert_from_f32(QD_DTYPE_F32, src, back, 3));
    CHECK(memcmp(back, src, sizeof src) == 0);
    CHECK_INT(qd_convert_from_f32(QD_DTYPE_I32, src, dst, 1), QD_EUNSUPPORTED);
}

int main(void)
{
    TEST_RUN(test_names);
    TEST_RUN(test_f16_exhaustive);
    TEST_RUN(test_f16_cases);
    TEST_RUN(test_f16_reference_sweep);
    TEST_RUN(test_bf16);
    TEST_RUN(test_convert);
    return test_finish();
}
