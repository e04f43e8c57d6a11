/* exp over float arrays (see cpu_exp.h). */
#include "quant/backend/cpu/cpu_exp.h"

#include <math.h>
#include <string.h>

#define EXP_LO -87.3365448f      /* 2^-126: the smallest normal power of two n reaches */
#define EXP_HI 88.3762589f       /* 127.5 ln 2, rounded down: n stays at most 127 */
#define EXP_ROUND 12582912.0f    /* 1.5 * 2^23: adding it rounds to an integer in the low bits */

/* Cephes expf, every multiply-add an fmaf (never left to contraction, which the compiler
 * may or may not apply per target), the clamps as compares so NaN passes through. */
__attribute__((always_inline)) static inline float exp_one(float x)
{
    x = x < EXP_LO ? EXP_LO : x;
    x = x > EXP_HI ? EXP_HI : x;
    float t = fmaf(x, 1.44269504088896341f, EXP_ROUND);   /* n + 1.5 * 2^23 */
    float n = t - EXP_ROUND;
    float r = fmaf(n, -0.693359375f, x);                  /* x - n ln2, ln2 in two parts */
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;                           /* 1 + r + r^2 p(r) */
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    sb = (tb - 0x4b400000u + 127u) << 23;                   /* 2^n from n's integer bits */
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

float cpu_expf(float x) { return exp_one(x); }

void cpu_exp_f32_portable(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = exp_one(x[i]);
}

__attribute__((target("avx2,fma"))) static void exp_avx2(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = exp_one(x[i]);
}

__attribute__((target("avx512f,fma"))) static void exp_avx512(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = exp_one(x[i]);
}

typedef void (*exp_fn)(float *, const float *, int64_t);

static exp_fn exp_pick(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return exp_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return exp_avx2;
    return cpu_exp_f32_portable;
}

void cpu_exp_f32(float *y, const float *x, int64_t n)
{
    static exp_fn fn;   /* a benign race: every thread stores the same pointer */
    exp_fn f = __atomic_load_n(&fn, __ATOMIC_RELAXED);
    if (!f) {
        f = exp_pick();
        __atomic_store_n(&fn, f, __ATOMIC_RELAXED);
    }
    f(y, x, n);
}
