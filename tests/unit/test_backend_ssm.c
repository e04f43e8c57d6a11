/* The recurrent mixers' ops (backend.h: conv1d_causal, ssd_scan) on the CPU backend, the
 * reference the CUDA kernels mirror: the convolution against a plain loop in double (gates,
 * bias, SiLU, strided rows, sequences kept apart); the scan against Mamba-2's other form,
 * the one transformers computes in chunks — y_t = sum_{s <= t} (C_t . B_s)
 * exp(A sum_{s < r <= t} dt_r) dt_s x_s + D x_t, in double, with no recurrence — over
 * several groups, dt clamped on both sides; both independent of the thread count; and
 * bad shapes refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "test_util.h"

static qd_backend *open_cpu(int threads)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    if (qd_backend_cpu_open(threads, NULL, &be, &err) != 0) {
        fprintf(stderr, "cannot open cpu backend: %s\n", err.msg);
        exit(1);
    }
    return be;
}

static double max_rel(const float *got, const double *want, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(got[i] - want[i]) > d) d = fabs(got[i] - want[i]);
        if (fabs(want[i]) > r) r = fabs(want[i]);
    }
    return r > 0 ? d / r : d;
}

static void test_conv1d(void)
{
    enum { B = 2, S = 9, CH = 5, LD = 13, K = 4 };
    test_rng rng;
    test_rng_seed(&rng, 11);
    float x[B * S * LD], gi[B * S * LD], go[B * S * LD], w[CH * K], bias[CH], y[B * S * CH], y1[B * S * CH];
    double want[B * S * CH];
    test_fill_normal(&rng, x, B * S * LD, 1.0f);
    test_fill_normal(&rng, gi, B * S * LD, 1.0f);
    test_fill_normal(&rng, go, B * S * LD, 1.0f);
    test_fill_normal(&rng, w, CH * K, 0.5f);
    test_fill_normal(&rng, bias, CH, 0.5f);
    for (int mode = 0; mode < 2; mode++) {   /* 0: LFM2 (gates, no bias, no act); 1: Mamba-2 (bias, SiLU) */
        for (int b = 0; b < B; b++)
            for (int t = 0; t < S; t++)
                for (int c = 0; c < CH; c++) {
                    double acc = mode ? bias[c] : 0.0;
                    for (int j = 0; j < K; j++) {
                        int src = t - (K - 1) + j;
                        if (src < 0) continue;   /* zero padding before the sequence */
                        int64_t o = (int64_t)(b * S + src) * LD + c;
                        acc += (double)w[c * K + j] * (mode ? (double)x[o] : (double)x[o] * gi[o]);
                    }
                    if (mode) acc = acc / (1.0 + exp(-acc));
                    else acc *= go[(int64_t)(b * S + t) * LD + c];
                    want[(b * S + t) * CH + c] = acc;
                }
        for (int th = 1; th <= 3; th += 2) {
            qd_backend *be = open_cpu(th);
            CHECK_OK(be->ops->conv1d_causal(be, th == 1 ? y : y1, x, mode ? NULL : gi, mode ? NULL : go, LD, B, S, CH, w,
                                            mode ? bias : NULL, K, mode));
            qd_backend_close(be);
        }
        double rel = max_rel(y, want, B * S * CH);
        if (!(rel < 1e-6)) TEST_FAIL_("conv1d_causal mode %d: rel %.3g from the reference", mode, rel);
        else test_checks++;
        CHECK(memcmp(y, y1, sizeof y) == 0);
    }
    qd_backend *be = open_cpu(1);
    CHECK_INT(be->ops->conv1d_causal(be, y, x, NULL, NULL, CH - 1, B, S, CH, w, NULL, K, 0), QD_EINVAL);
    CHECK_INT(be->ops->conv1d_causal(be, y, x, NULL, NULL, LD, B, S, CH, w, NULL, 0, 0), QD_EINVAL);
    qd_backend_close(be);
}

static double softplus(double v) { return v > 20.0 ? v : log1p(exp(v)); }

static void test_ssd_scan(void)
{
    enum { B = 2, S = 23, NH = 4, P = 3, G = 2, N = 5, LD = NH * P + 2 * G * N + 3, LDT = NH + 2, LDZ = NH * P + 1 };
    const float dt_min = 0.05f, dt_max = 1.2f;
    test_rng rng;
    test_rng_seed(&rng, 12);
    float *in = malloc(B * S * LD * sizeof *in), *dt = malloc(B * S * LDT * sizeof *dt), *z = malloc(B * S * LDZ * sizeof *z);
    float *y = malloc(B * S * NH * P * sizeof *y), *y1 = malloc(B * S * NH * P * sizeof *y1);
    double *want = malloc(B * S * NH * P * sizeof *want);
    float a[NH], d[NH], dtb[NH];
    test_fill_normal(&rng, in, B * S * LD, 1.0f);
    test_fill_normal(&rng, dt, B * S * LDT, 1.5f);
    test_fill_normal(&rng, z, B * S * LDZ, 1.0f);
    for (int h = 0; h < NH; h++) {
        a[h] = -(float)(h + 1) * 0.7f;
        d[h] = 1.0f + 0.3f * (float)h;
        dtb[h] = 0.4f * (float)h - 0.6f;
    }
    const float *x = in, *bm = in + NH * P, *cm = in + NH * P + G * N;
    for (int gate = 0; gate < 2; gate++) {
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                int g = h / (NH / G);
                double dts[S];
                for (int t = 0; t < S; t++) {
                    float v = (float)softplus((double)(dt[(b * S + t) * LDT + h] + dtb[h]));
                    dts[t] = v < dt_min ? dt_min : v > dt_max ? dt_max : v;
                }
                for (int t = 0; t < S; t++)
                    for (int i = 0; i < P; i++) {
                        int64_t rt = (int64_t)(b * S + t);
                        double acc = 0, cum = 0;   /* cum: sum of dt over (s, t] */
                        for (int s = t; s >= 0; s--) {
                            int64_t rs = (int64_t)(b * S + s);
                            double cb = 0;
                            for (int k = 0; k < N; k++) cb += (double)cm[rt * LD + g * N + k] * bm[rs * LD + g * N + k];
                            acc += cb * exp(a[h] * cum) * dts[s] * x[rs * LD + h * P + i];
                            cum += dts[s];
                        }
                        double v = acc + (double)d[h] * x[rt * LD + h * P + i];
                        if (gate) {
                            double zv = z[rt * LDZ + h * P + i];
                            v *= zv / (1.0 + exp(-zv));
                        }
                        want[rt * NH * P + h * P + i] = v;
                    }
            }
        for (int th = 1; th <= 3; th += 2) {
            qd_backend *be = open_cpu(th);
            CHECK_OK(be->ops->ssd_scan(be, th == 1 ? y : y1, x, bm, cm, LD, dt, LDT, gate ? z : NULL, LDZ, a, d, dtb, dt_min,
                                       dt_max, B, S, NH, P, G, N));
            qd_backend_close(be);
        }
        double rel = max_rel(y, want, B * S * NH * P);
        if (!(rel < 1e-5)) TEST_FAIL_("ssd_scan gate %d: rel %.3g from the chunk-free reference", gate, rel);
        else test_checks++;
        CHECK(memcmp(y, y1, B * S * NH * P * sizeof *y) == 0);
    }
    qd_backend *be = open_cpu(1);
    CHECK_INT(be->ops->ssd_scan(be, y, x, bm, cm, LD, dt, LDT, NULL, 0, a, d, dtb, 0, INFINITY, B, S, NH, P, 3, N), QD_EINVAL);
    CHECK_INT(be->ops->ssd_scan(be, y, x, bm, cm, NH * P - 1, dt, LDT, NULL, 0, a, d, dtb, 0, INFINITY, B, S, NH, P, G, N),
              QD_EINVAL);
    qd_backend_close(be);
    free(in); free(dt); free(z); free(y); free(y1); free(want);
}

int main(void)
{
    TEST_RUN(test_conv1d);
    TEST_RUN(test_ssd_scan);
    return test_finish();
}
