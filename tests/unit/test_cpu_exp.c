/* quant/backend/cpu/cpu_exp.c: the forward's exp. The loop this CPU runs returns the same
 * bits as the portable reference loop over a sweep of [-100, 100] and every special value;
 * every value is within 2 ulp of exp (computed in double) over [-87.3, 88.3]; the clamps
 * give finite values at both ends and NaN passes through; y may alias x. */
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "quant/backend/cpu/cpu_exp.h"

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#define N_SWEEP (1 << 20)

static void test_same_bits_as_portable(void)
{
    float *x = malloc(N_SWEEP * sizeof *x), *a = malloc(N_SWEEP * sizeof *a), *b = malloc(N_SWEEP * sizeof *b);
    CHECK(x && a && b);
    for (int i = 0; i < N_SWEEP; i++) x[i] = -100.0f + 200.0f * (float)i / N_SWEEP;
    const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, FLT_MIN, from_bits(1),
                             -87.3365448f, 88.3762589f, 88.72f, -103.0f};
    memcpy(x, special, sizeof special);
    cpu_exp_f32(a, x, N_SWEEP - 3);   /* a length that leaves a tail for every vector width */
    cpu_exp_f32_portable(b, x, N_SWEEP - 3);
    CHECK(memcmp(a, b, (N_SWEEP - 3) * sizeof *a) == 0);
    for (int i = 0; i < 64; i++) CHECK(memcmp(&a[i], &(float){cpu_expf(x[i])}, 4) == 0);
    free(x);
    free(a);
    free(b);
}

static void test_accuracy(void)
{
    float *x = malloc(N_SWEEP * sizeof *x), *y = malloc(N_SWEEP * sizeof *y);
    CHECK(x && y);
    for (int i = 0; i < N_SWEEP; i++) x[i] = -87.3f + 175.6f * (float)i / N_SWEEP;
    cpu_exp_f32(y, x, N_SWEEP);
    double worst = 0;
    for (int i = 0; i < N_SWEEP; i++) {
        float e = (float)exp((double)x[i]);
        double ulp = (double)nextafterf(e, INFINITY) - (double)e;
        double d = fabs((double)y[i] - exp((double)x[i])) / ulp;
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "cpu_exp: worst %.3f ulp over [-87.3, 88.3]\n", worst);
    CHECK(worst <= 2.0);
    free(x);
    free(y);
}

static void test_specials_and_alias(void)
{
    CHECK(isnan(cpu_expf(NAN)));
    CHECK(cpu_expf(0.0f) == 1.0f);
    CHECK(isfinite(cpu_expf(INFINITY)) && cpu_expf(INFINITY) > 2e38f);
    CHECK(cpu_expf(-INFINITY) >= 0.0f && cpu_expf(-INFINITY) < 1.2e-38f);
    CHECK(cpu_expf(-1000.0f) == cpu_expf(-INFINITY));
    float v[37];
    for (int i = 0; i < 37; i++) v[i] = (float)i - 18.0f;
    cpu_exp_f32(v, v, 37);
    for (int i = 0; i < 37; i++) CHECK(v[i] == cpu_expf((float)i - 18.0f));
    v[5] = NAN;
    cpu_exp_f32(v, v, 37);
    CHECK(isnan(v[5]));
}

int main(void)
{
    TEST_RUN(test_same_bits_as_portable);
    TEST_RUN(test_accuracy);
    TEST_RUN(test_specials_and_alias);
    return test_finish();
}
