/* quant/core/minifloat.c: FP8 E4M3, FP4 E2M1 and E8M0 against their definitions.
 *  - every FP8 byte decodes to (1 + m/8) 2^(e-7) (subnormals m 2^-9), 0x7f/0xff to NaN,
 *    and every finite byte encodes back to itself (-0 included);
 *  - between two neighbours the midpoint rounds to the even code, a hair either side of it
 *    to the nearer one; beyond 448 saturates; NaN encodes to NaN;
 *  - FP4 rounds as compressed-tensors' table (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
 *    2.5 -> 2, 3.5 -> 4, 5 -> 4, above 5 -> 6), both signs;
 *  - E8M0 is 2^(e-127), 0xff NaN. */
#include "test_util.h"

#include <math.h>

#include "quant/core/minifloat.h"

static void test_fp8_decode(void)
{
    CHECK(isnan(qd_fp8_e4m3_to_f32(0x7f)) && isnan(qd_fp8_e4m3_to_f32(0xff)));
    CHECK(qd_fp8_e4m3_to_f32(0x7e) == 448.0f && qd_fp8_e4m3_to_f32(0xfe) == -448.0f);
    CHECK(qd_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    CHECK(qd_fp8_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
    CHECK(qd_fp8_e4m3_to_f32(0x38) == 1.0f);
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        float v = qd_fp8_e4m3_to_f32((uint8_t)b);
        int e = (b >> 3) & 0xf, m = b & 7;
        double want = e ? (1.0 + m / 8.0) * ldexp(1.0, e - 7) : m * ldexp(1.0, -9);
        CHECK((double)fabsf(v) == want);
        CHECK_INT(qd_f32_to_fp8_e4m3(v), b);
        CHECK(qd_f32_round_fp8_e4m3(v) == v);
    }
}

static void test_fp8_round(void)
{
    /* Neighbours a < b on the positive grid: bytes c and c + 1. */
    for (int c = 0; c < 0x7e; c++) {
        float a = qd_fp8_e4m3_to_f32((uint8_t)c), b = qd_fp8_e4m3_to_f32((uint8_t)(c + 1));
        float mid = (a + b) / 2;                                   /* exact in F32 */
        uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        CHECK_INT(qd_f32_to_fp8_e4m3(mid), even);
        CHECK_INT(qd_f32_to_fp8_e4m3(nextafterf(mid, 0.0f)), c);
        CHECK_INT(qd_f32_to_fp8_e4m3(nextafterf(mid, 1000.0f)), c + 1);
        CHECK_INT(qd_f32_to_fp8_e4m3(-mid), 0x80 | even);
    }
    CHECK_INT(qd_f32_to_fp8_e4m3(460.0f), 0x7e);
    CHECK_INT(qd_f32_to_fp8_e4m3(1e30f), 0x7e);
    CHECK_INT(qd_f32_to_fp8_e4m3(-INFINITY), 0xfe);
    CHECK_INT(qd_f32_to_fp8_e4m3(NAN), 0x7f);
    CHECK_INT(qd_f32_to_fp8_e4m3(ldexpf(1.0f, -11)), 0x00);        /* below half the smallest */
    CHECK_INT(qd_f32_to_fp8_e4m3(ldexpf(3.0f, -11)), 0x01);
}

static void test_fp4(void)
{
    static const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = qd_fp4_e2m1_to_f32((uint8_t)c);
        CHECK(v == ((c & 8) ? -vals[c & 7] : vals[c & 7]));
        if (c != 8) CHECK_INT(qd_f32_to_fp4_e2m1(v), c);
    }
    static const struct { float x, want; } table[] = {
        {0.25f, 0}, {0.2501f, 0.5f}, {0.75f, 1}, {0.7499f, 0.5f}, {1.25f, 1}, {1.2501f, 1.5f},
        {1.75f, 2}, {1.7499f, 1.5f}, {2.5f, 2}, {2.5001f, 3}, {3.5f, 4}, {3.4999f, 3},
        {5.0f, 4}, {5.0001f, 6}, {6.5f, 6}, {1e9f, 6}, {0.1f, 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        CHECK(qd_fp4_e2m1_to_f32(qd_f32_to_fp4_e2m1(table[i].x)) == table[i].want);
        CHECK(qd_fp4_e2m1_to_f32(qd_f32_to_fp4_e2m1(-table[i].x)) == -table[i].want);
    }
    CHECK_INT(qd_f32_to_fp4_e2m1(-0.1f), 0);                        /* a zero keeps no sign */
}

static void test_e8m0(void)
{
    CHECK(qd_e8m0_to_f32(127) == 1.0f);
    CHECK(qd_e8m0_to_f32(130) == 8.0f);
    CHECK(qd_e8m0_to_f32(0) == ldexpf(1.0f, -127));
    CHECK(qd_e8m0_to_f32(254) == ldexpf(1.0f, 127));
    CHECK(isnan(qd_e8m0_to_f32(255)));
}

int main(void)
{
    TEST_RUN(test_fp8_decode);
    TEST_RUN(test_fp8_round);
    TEST_RUN(test_fp4);
    TEST_RUN(test_e8m0);
    return test_finish();
}
