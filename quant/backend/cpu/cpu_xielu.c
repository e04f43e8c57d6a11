/* xIELU (Apertus), the scalar reference: transformers' XIELUActivation._xielu_python in
 * float32, each product and sum rounded in the order torch evaluates the expression, so
 * the CUDA kernel (cuda_ops.cu) can be held to it. */
#include <math.h>

#include "quant/backend/cpu/cpu_internal.h"

int cpu_xielu(qd_backend *be, float *x, int64_t n, float ap, float an, float beta, float eps)
{
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        volatile float sq = ap * v;   /* volatile: no fused multiply-add, as torch */
        sq = sq * v;
        volatile float bx = beta * v;
        if (v > 0.0f) {
            x[i] = sq + bx;
        } else {
            volatile float e = expm1f(fminf(v, eps)) - v;
            volatile float t = e * an;
            x[i] = t + bx;
        }
    }
    return 0;
}
