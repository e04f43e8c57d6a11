/* The CPU backend's xielu op (Apertus's activation) against the formula of transformers'
 * XIELUActivation evaluated directly in double: both branches, the eps clamp of the negative
 * side, zero, and large magnitudes. The CUDA kernel is held to the CPU in
 * tests/gpu/test_backend_cuda.c. */
#include <math.h>
#include <stdlib.h>

#include "quant/backend/backend.h"
#include "test_util.h"

static double ref(double x, double ap, double an, double beta, double eps)
{
    if (x > 0) return ap * x * x + beta * x;
    return (expm1(x < eps ? x : eps) - x) * an + beta * x;
}

static void test_xielu(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    if (!be) return;
    /* Apertus's initial values (alpha_p 0.8, alpha_n 0.8, beta 0.5, eps -1e-6) and others. */
    static const float params[][4] = {{0.8f, 0.8f, 0.5f, -1e-6f}, {1.7f, 0.55f, 0.3f, -1e-3f}};
    static const float xs[] = {-30.0f, -5.0f, -1.0f, -0.01f, -2e-6f, -1e-6f, -5e-7f, 0.0f, 1e-7f, 0.3f, 2.0f, 40.0f};
    enum { N = sizeof xs / sizeof xs[0] };
    for (size_t p = 0; p < sizeof params / sizeof params[0]; p++) {
        float *x = qd_backend_alloc(be, N * sizeof *x);
        CHECK(x != NULL);
        if (!x) break;
        for (int i = 0; i < N; i++) x[i] = xs[i];
        const float *q = params[p];
        CHECK_OK(be->ops->xielu(be, x, N, q[0], q[1], q[2], q[3]));
        for (int i = 0; i < N; i++) {
            double r = ref(xs[i], q[0], q[1], q[2], q[3]);
            double tol = 1e-6 * fabs(r) + 1e-12;
            if (!(fabs(x[i] - r) <= tol))
                TEST_FAIL_("xielu(%g; %g %g %g %g) = %.9g, reference %.9g", xs[i], q[0], q[1], q[2], q[3], x[i], r);
            test_checks++;
        }
        qd_backend_free(be, x);
    }
    qd_backend_close(be);
}

int main(void)
{
    TEST_RUN(test_xielu);
    return test_finish();
}
