/* quant/core/finite.c: the first non-finite element of an array, against isfinite at every
 * position of the chunk boundaries, for NaN (quiet, signalling, negative) and both
 * infinities; the largest finite values, subnormals and zeros are finite. */
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "quant/core/finite.h"

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_all_finite(void)
{
    CHECK(qd_f32_first_nonfinite(NULL, 0) == -1);
    const float edge[] = {0.0f, -0.0f, FLT_MAX, -FLT_MAX, FLT_MIN, from_bits(1), from_bits(0x807fffffu), 1.0f};
    CHECK(qd_f32_first_nonfinite(edge, 8) == -1);
    const int64_t n = 3 * 2048 + 17;
    float *x = malloc((size_t)n * sizeof *x);
    CHECK(x != NULL);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 97) - 48.0f;
    CHECK(qd_f32_first_nonfinite(x, n) == -1);
    free(x);
}

static void test_positions(void)
{
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, from_bits(0x7f800001u), from_bits(0xffc00000u)};
    const int64_t n = 3 * 2048 + 17;
    const int64_t pos[] = {0, 1, 2047, 2048, 2049, 4095, 4096, n - 18, n - 1};
    float *x = malloc((size_t)n * sizeof *x);
    CHECK(x != NULL);
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            for (int64_t i = 0; i < n; i++) x[i] = 0.5f * (float)i;
            x[pos[p]] = bad[b];
            CHECK(qd_f32_first_nonfinite(x, n) == pos[p]);
            CHECK(qd_f32_first_nonfinite(x, pos[p]) == -1);   /* the prefix before it */
            if (pos[p] + 5 < n) {                              /* a later one does not hide it */
                x[pos[p] + 5] = INFINITY;
                CHECK(qd_f32_first_nonfinite(x, n) == pos[p]);
                CHECK(qd_f32_first_nonfinite(x + pos[p] + 1, n - pos[p] - 1) == 4);
            }
        }
    free(x);
}

int main(void)
{
    TEST_RUN(test_all_finite);
    TEST_RUN(test_positions);
    return test_finish();
}
