/* The CUDA recurrent mixers' ops (cuda_ssm.cu: conv1d_causal, ssd_scan) against the CPU
 * backend's (the reference, test_backend_ssm), on LFM2's and Granite-4.0-H-Micro's shapes:
 * the convolution with gates, bias and SiLU over strided rows, the scan over 4 sequences of
 * 300 tokens with 64 heads of 64 in 1 and 8 groups, d_state 128, the gate, dt clamped. The
 * kernels sum in the reference's order with the same roundings but libm's and CUDA's expf
 * may differ in the last bit: 1e-4 relative to the largest output. Skips (77) where no
 * CUDA device is visible, which includes every build without CUDA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "test_util.h"

static qd_backend *cpu, *gpu;
static test_rng rng;

static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    test_fill_normal(&rng, p, n, scale);
    return p;
}

static void *put(qd_backend *be, const void *h, size_t bytes)
{
    void *d = qd_backend_alloc(be, bytes);
    if (d) CHECK_OK(qd_backend_upload(be, d, h, bytes));
    return d;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

static void test_conv1d(void)
{
    const int64_t B = 3, S = 257, CH = 1536, LD = 3 * 1536, K = 3;
    float *x = rnd((size_t)(B * S * LD), 1), *w = rnd((size_t)(CH * K), 0.5f), *bias = rnd((size_t)CH, 0.5f);
    float *out[2];
    qd_backend *bes[2] = {cpu, gpu};
    for (int mode = 0; mode < 2; mode++) {
        for (int b = 0; b < 2; b++) {
            qd_backend *be = bes[b];
            float *xd = put(be, x, (size_t)(B * S * LD) * sizeof(float)), *wd = put(be, w, (size_t)(CH * K) * sizeof(float));
            float *bd = put(be, bias, (size_t)CH * sizeof(float));
            float *y = qd_backend_alloc(be, (size_t)(B * S * CH) * sizeof(float));
            CHECK_OK(be->ops->conv1d_causal(be, y, xd + 2 * CH, mode ? NULL : xd, mode ? NULL : xd + CH, LD, B, S, CH, wd,
                                            mode ? bd : NULL, K, mode));
            out[b] = malloc((size_t)(B * S * CH) * sizeof(float));
            CHECK_OK(qd_backend_download(be, out[b], y, (size_t)(B * S * CH) * sizeof(float)));
            qd_backend_free(be, xd); qd_backend_free(be, wd); qd_backend_free(be, bd); qd_backend_free(be, y);
        }
        double r = rel_diff(out[1], out[0], (size_t)(B * S * CH));
        if (!(r < 1e-5)) TEST_FAIL_("conv1d_causal mode %d: cuda differs from cpu by %.3g", mode, r);
        else test_checks++;
        free(out[0]); free(out[1]);
    }
    free(x); free(w); free(bias);
}

static void test_ssd_scan(void)
{
    const int64_t B = 4, S = 300, NH = 64, P = 64, N = 128;
    for (int64_t G = 1; G <= 8; G += 7) {
        int64_t conv_dim = NH * P + 2 * G * N, proj = 2 * NH * P + 2 * G * N + NH;
        float *xbc = rnd((size_t)(B * S * conv_dim), 0.3f), *zdt = rnd((size_t)(B * S * proj), 1);
        float a[64], d[64], dtb[64], *out[2];
        for (int h = 0; h < NH; h++) { a[h] = -(float)(h + 1) * 0.05f; d[h] = 1.0f; dtb[h] = -1.0f + 0.03f * (float)h; }
        qd_backend *bes[2] = {cpu, gpu};
        for (int b = 0; b < 2; b++) {
            qd_backend *be = bes[b];
            float *xd = put(be, xbc, (size_t)(B * S * conv_dim) * sizeof(float));
            float *zd = put(be, zdt, (size_t)(B * S * proj) * sizeof(float));
            float *ad = put(be, a, sizeof a), *dd = put(be, d, sizeof d), *bd = put(be, dtb, sizeof dtb);
            float *y = qd_backend_alloc(be, (size_t)(B * S * NH * P) * sizeof(float));
            CHECK_OK(be->ops->ssd_scan(be, y, xd, xd + NH * P, xd + NH * P + G * N, conv_dim, zd + NH * P + conv_dim, proj,
                                       zd, proj, ad, dd, bd, 0.001f, 2.0f, B, S, NH, P, G, N));
            out[b] = malloc((size_t)(B * S * NH * P) * sizeof(float));
            CHECK_OK(qd_backend_download(be, out[b], y, (size_t)(B * S * NH * P) * sizeof(float)));
            qd_backend_free(be, xd); qd_backend_free(be, zd); qd_backend_free(be, ad); qd_backend_free(be, dd);
            qd_backend_free(be, bd); qd_backend_free(be, y);
        }
        double r = rel_diff(out[1], out[0], (size_t)(B * S * NH * P));
        if (!(r < 1e-4)) TEST_FAIL_("ssd_scan groups %lld: cuda differs from cpu by %.3g", (long long)G, r);
        else test_checks++;
        free(out[0]); free(out[1]); free(xbc); free(zdt);
    }
}

int main(void)
{
    if (qd_backend_cuda_device_count() == 0) {
        fprintf(stderr, "test_backend_cuda_ssm: no CUDA device visible, skipping\n");
        return TEST_SKIP;
    }
    qd_err err = {0};
    test_rng_seed(&rng, 2027);
    if (qd_backend_cpu_open(2, NULL, &cpu, &err) || qd_backend_open("cuda:0", NULL, &gpu, &err)) {
        fprintf(stderr, "test_backend_cuda_ssm: %s\n", err.msg);
        return 1;
    }
    TEST_RUN(test_conv1d);
    TEST_RUN(test_ssd_scan);
    qd_backend_close(gpu);
    qd_backend_close(cpu);
    return test_finish();
}
