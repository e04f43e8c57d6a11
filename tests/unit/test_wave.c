/* A wave's capture passes under the Hessian budget (quant/pipeline/wave.h): the fewest
 * passes, of even sizes, each within the budget, whatever the groups' sizes. */
#include <stdint.h>

#include "quant/pipeline/wave.h"
#include "test_util.h"

#define MIB ((uint64_t)1 << 20)

/* The sizes of the passes over bytes[0..n), as qd_wave_take cuts them; returns their count. */
static int cut(const uint64_t *bytes, int n, uint64_t budget, int *sizes)
{
    int passes = 0;
    for (int i = 0; i < n; passes++) {
        int t = qd_wave_take(bytes + i, n - i, budget);
        CHECK(t >= 1 && t <= n - i);
        if (t < 1) t = 1;   /* keeps a failing run finite */
        sizes[passes] = t;
        i += t;
    }
    return passes;
}

static void fill(uint64_t *bytes, int n, uint64_t each)
{
    for (int i = 0; i < n; i++) bytes[i] = each;
}

/* Mixtral-8x7B's experts under the default 4 GiB: their gate/up Hessians (4096 wide,
 * 64 MiB) all in one pass; their down ones (14336 wide, 784 MiB) four and four, where
 * filling each pass in turn made five and three. */
static void test_mixtral(void)
{
    uint64_t bytes[8];
    int sizes[8];
    fill(bytes, 8, 64 * MIB);
    CHECK_INT(cut(bytes, 8, 4096 * MIB, sizes), 1);
    CHECK_INT(sizes[0], 8);
    fill(bytes, 8, 784 * MIB);
    CHECK_INT(cut(bytes, 8, 4096 * MIB, sizes), 2);
    CHECK_INT(sizes[0], 4);
    CHECK_INT(sizes[1], 4);
    CHECK_INT(qd_wave_most(8, 784 * MIB, 4096 * MIB), 4);
    CHECK_INT(qd_wave_most(8, 64 * MIB, 4096 * MIB), 8);
}

/* Groups of one size: the passes are as few as filling each gives, and differ by at most
 * one; qd_wave_most is the first's. */
static void test_even(void)
{
    uint64_t bytes[300];
    int sizes[300];
    for (int n = 1; n <= 300; n += 7)
        for (int per = 1; per <= 40; per += 3) {
            fill(bytes, n, 10);
            int passes = cut(bytes, n, (uint64_t)per * 10, sizes);
            CHECK_INT(passes, (n + per - 1) / per);
            int lo = n, hi = 0;
            for (int i = 0; i < passes; i++) {
                if (sizes[i] < lo) lo = sizes[i];
                if (sizes[i] > hi) hi = sizes[i];
            }
            CHECK(hi <= per && hi - lo <= 1);
            CHECK_INT(qd_wave_most((uint64_t)n, 10, (uint64_t)per * 10), sizes[0]);
        }
    /* DeepSeek-V3's 256 routed experts and its shared one: down Hessians (2048 wide,
     * 16 MiB) 129 and 128 (before, 256 and 1); gate/up (7168 wide, 196 MiB) 13 passes of
     * 20 and 19. */
    fill(bytes, 257, 16 * MIB);
    CHECK_INT(cut(bytes, 257, 4096 * MIB, sizes), 2);
    CHECK_INT(sizes[0], 129);
    CHECK_INT(sizes[1], 128);
    fill(bytes, 257, (uint64_t)7168 * 7168 * 4);
    CHECK_INT(cut(bytes, 257, 4096 * MIB, sizes), 13);
    for (int i = 0; i < 13; i++) CHECK(sizes[i] == 20 || sizes[i] == 19);
}

/* Groups of several sizes: never more passes than filling each in turn, every pass within
 * the budget unless one group alone is over it (it goes alone), and an even cut that would
 * leave a rest needing one pass more is not taken. */
static void test_mixed(void)
{
    const uint64_t odd[4] = {1, 1, 1, 3};   /* even would be 2 + (1, then 3): three passes */
    int sizes[64];
    CHECK_INT(cut(odd, 4, 3, sizes), 2);
    CHECK_INT(sizes[0], 3);
    const uint64_t big[3] = {5, 9, 2};      /* 9 over the budget of 8 goes alone */
    CHECK_INT(cut(big, 3, 8, sizes), 3);
    CHECK_INT(sizes[1], 1);
    test_rng r;
    test_rng_seed(&r, 34);
    uint64_t bytes[64];
    for (int round = 0; round < 500; round++) {
        int n = 1 + (int)(test_rng_u64(&r) % 64);
        uint64_t budget = 1 + test_rng_u64(&r) % 100;
        for (int i = 0; i < n; i++) bytes[i] = 1 + test_rng_u64(&r) % 60;
        int greedy = 0;
        for (int i = 0; i < n; greedy++) {
            uint64_t sum = bytes[i++];
            while (i < n && sum + bytes[i] <= budget) sum += bytes[i++];
        }
        int passes = cut(bytes, n, budget, sizes);
        CHECK_INT(passes, greedy);
        for (int p = 0, i = 0; p < passes; i += sizes[p++]) {
            uint64_t sum = 0;
            for (int j = i; j < i + sizes[p]; j++) sum += bytes[j];
            CHECK(sum <= budget || sizes[p] == 1);
        }
    }
}

int main(void)
{
    TEST_RUN(test_mixtral);
    TEST_RUN(test_even);
    TEST_RUN(test_mixed);
    return test_finish();
}
