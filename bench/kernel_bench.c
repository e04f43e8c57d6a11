/* Dequantizing-kernel benchmark (bench/kernels.sh builds and runs it).
 *
 *   kernel_bench --device cpu|cuda:N [--shapes llama7b|llama70b|all|small] [--max-batch B]
 *                [--reps R] [--gptq]
 *
 * For each weight shape K x N (Llama-2-7B: 4096x4096, 4096x11008, 11008x4096; Llama-2-70B
 * MLP: 8192x28672, 28672x8192) and batch 1..B, times the 4-bit g128 kernels on the plain
 * gptq layout, the naive act-order layout (g_idx read per row), the exllama-reordered
 * act-order layout and awq_gemm, and the float grids (fp8 per channel, nvfp4 group 16,
 * mxfp4 group 32, built by hand in the float layout); on CUDA also cuBLAS FP16 (GemmEx, F32 accumulation) on
 * the same shape, with CUDA events after warm-up, median of R, and L2 flushed before every
 * repetition (a memset of twice the L2 size, outside the timed region) so no repetition
 * reads a weight the previous one left in the cache. First it measures the device's copy
 * bandwidth (a 1 GiB device-to-device copy, bytes read + written, median of 20), and every
 * kernel line carries its packed-weight GB/s as a fraction of it. Prints one JSON line per
 * measurement: time, GB/s, fraction of copy bandwidth and the speed-up over FP16 cuBLAS.
 * With --gptq (CUDA) it also times the GPTQ quantization of one 4096x4096 and one
 * 8192x28672 layer. CPU timings use the wall clock (median of R), without a flush. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/algo/gptq.h"
#include "quant/backend/backend.h"
#include "quant/core/clock.h"
#include "quant/core/dtype.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"
#include "startup/runtime_env.h"

#ifdef QUANTD_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include "quant/backend/cuda/cuda_internal.h"
#endif

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2];
}

typedef struct bench_ctx {
    qd_backend *be;
    int reps;
    double copy_gbps;          /* measured device copy bandwidth (read + write), 0 unknown */
#ifdef QUANTD_HAVE_CUDA
    cudaEvent_t e0, e1;
    cublasHandle_t blas;
    void *flush;               /* 2 x L2 bytes, memset before each timed repetition */
    size_t flush_bytes;
#endif
} bench_ctx;

#define BENCH_MAX_REPS 1000

#ifdef QUANTD_HAVE_CUDA
/* Evicts the weights of the previous repetition from L2 (the GPU timings only use it). */
static void flush_l2(bench_ctx *c)
{
    if (c->be->device >= 0 && c->flush)
        cudaMemsetAsync(c->flush, c->reps & 0xff, c->flush_bytes, (cudaStream_t)qd_backend_cuda_stream(c->be));
}

/* Exits on a CUDA failure: a benchmark that times failed calls would print nonsense. */
#define BENCH_CU(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "kernel_bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),       \
                    __FILE__, __LINE__);                                                                 \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

/* Device copy bandwidth: a 1 GiB device-to-device copy timed with events, median of 20,
 * counting bytes read plus bytes written. */
static double measure_copy_gbps(bench_ctx *c)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    BENCH_CU(cudaMalloc(&a, bytes));
    BENCH_CU(cudaMalloc(&b, bytes));
    BENCH_CU(cudaMemset(a, 1, bytes));
    cudaStream_t st = (cudaStream_t)qd_backend_cuda_stream(c->be);
    double t[20];
    for (int i = -2; i < 20; i++) {
        float ms = 0;
        BENCH_CU(cudaEventRecord(c->e0, st));
        BENCH_CU(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, st));
        BENCH_CU(cudaEventRecord(c->e1, st));
        BENCH_CU(cudaEventSynchronize(c->e1));
        BENCH_CU(cudaEventElapsedTime(&ms, c->e0, c->e1));
        if (i >= 0) t[i] = ms * 1e-3;
    }
    cudaFree(a);
    cudaFree(b);
    double med = median(t, 20);
    printf("{\"copy_gbps\":%.1f,\"bytes\":%zu,\"median_us\":%.1f}\n", 2.0 * (double)bytes / med / 1e9, bytes,
           med * 1e6);
    return 2.0 * (double)bytes / med / 1e9;
}
#endif

/* Median seconds of one kernel call (x, y in backend memory). */
static double time_kernel(bench_ctx *c, const qd_kmat *m, const float *x, int64_t rows, float *y)
{
    qd_err err = {0};
    static double t[BENCH_MAX_REPS];
    int reps = c->reps;
    for (int i = 0; i < 3; i++)
        if (qd_kernel_matmul(c->be, m, x, rows, y, QD_KPATH_AUTO, &err)) {
            fprintf(stderr, "kernel_bench: %s\n", err.msg);
            return -1;
        }
    for (int i = 0; i < reps; i++) {
#ifdef QUANTD_HAVE_CUDA
        if (c->be->device >= 0) {
            cudaStream_t st = (cudaStream_t)qd_backend_cuda_stream(c->be);
            float ms = 0;
            flush_l2(c);
            BENCH_CU(cudaEventRecord(c->e0, st));
            if (qd_kernel_matmul(c->be, m, x, rows, y, QD_KPATH_AUTO, &err)) {
                fprintf(stderr, "kernel_bench: %s\n", err.msg);
                return -1;
            }
            BENCH_CU(cudaEventRecord(c->e1, st));
            BENCH_CU(cudaEventSynchronize(c->e1));
            BENCH_CU(cudaEventElapsedTime(&ms, c->e0, c->e1));
            t[i] = ms * 1e-3;
            continue;
        }
#endif
        double t0 = qd_clock_now_s();
        qd_kernel_matmul(c->be, m, x, rows, y, QD_KPATH_AUTO, &err);
        t[i] = qd_clock_now_s() - t0;
    }
    return median(t, reps);
}

#ifdef QUANTD_HAVE_CUDA
/* cuBLAS FP16 on the same shape: y[M,N] = x[M,K] W^T with half inputs, F32 accumulation. */
static double time_cublas_f16(bench_ctx *c, int64_t n, int64_t k, int64_t rows)
{
    void *w = NULL, *x = NULL, *y = NULL;
    BENCH_CU(cudaMalloc(&w, (size_t)(n * k) * 2));
    BENCH_CU(cudaMalloc(&x, (size_t)(rows * k) * 2));
    BENCH_CU(cudaMalloc(&y, (size_t)(rows * n) * 2));
    BENCH_CU(cudaMemset(w, 0x3c, (size_t)(n * k) * 2));  /* 0x3c3c: 1.06 in half, never zero */
    BENCH_CU(cudaMemset(x, 0x3c, (size_t)(rows * k) * 2));
    cudaStream_t st = (cudaStream_t)qd_backend_cuda_stream(c->be);
    cublasSetStream(c->blas, st);
    float one = 1, zero = 0;
    static double t[BENCH_MAX_REPS];
    int reps = c->reps;
    for (int i = -3; i < reps; i++) {
        float ms = 0;
        flush_l2(c);
        BENCH_CU(cudaEventRecord(c->e0, st));
        cublasStatus_t bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k, &one, w,
                                         CUDA_R_16F, (int)k, x, CUDA_R_16F, (int)k, &zero, y, CUDA_R_16F, (int)n,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "kernel_bench: cublasGemmEx failed: %s\n", cublasGetStatusString(bs));
            exit(1);
        }
        BENCH_CU(cudaEventRecord(c->e1, st));
        BENCH_CU(cudaEventSynchronize(c->e1));
        BENCH_CU(cudaEventElapsedTime(&ms, c->e0, c->e1));
        if (i >= 0) t[i] = ms * 1e-3;
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    return median(t, reps);
}
#endif

/* The float layouts the benchmark times: self-test cases built by hand. */
static const char *const bench_float_cases[] = {"fp8-channel", "nvfp4-g16", "mxfp4-g32"};
#define BENCH_N_FLOAT 3
#define BENCH_N_KMAT (4 + BENCH_N_FLOAT)

static int bench_shape(bench_ctx *c, int64_t k, int64_t n, int max_batch)
{
    qd_err err = {0};
    qd_packed plain, act, awq, fl[BENCH_N_FLOAT];
    memset(fl, 0, sizeof fl);
    if (qd_selftest_make_layer(qd_format_find("gptq_v2"), 4, 128, 0, n, k, 1, &plain, &err) ||
        qd_selftest_make_layer(qd_format_find("gptq_v2"), 4, 128, 1, n, k, 2, &act, &err) ||
        qd_selftest_make_layer(qd_format_find("awq_gemm"), 4, 128, 0, n, k, 3, &awq, &err)) {
        fprintf(stderr, "kernel_bench: %s\n", err.msg);
        return 1;
    }
    qd_kmat h[BENCH_N_KMAT], d[BENCH_N_KMAT];
    memset(d, 0, sizeof d);
    qd_kmat_from_packed(qd_format_find("gptq_v2"), &plain, &h[0], &err);
    qd_kmat_from_packed(qd_format_find("gptq_v2"), &act, &h[1], &err);
    qd_kmat_reorder(&h[1], &h[2], &err);
    qd_kmat_from_packed(qd_format_find("awq_gemm"), &awq, &h[3], &err);
    qd_selftest_fcase fc[QD_SELFTEST_MAX_FCASES];
    const int nfc = qd_selftest_float_cases(fc, QD_SELFTEST_MAX_FCASES);
    for (int f = 0; f < BENCH_N_FLOAT; f++) {
        const qd_selftest_fcase *pick = NULL;
        for (int i = 0; i < nfc && !pick; i++)
            if (!fc[i].fmt && !strcmp(fc[i].name, bench_float_cases[f])) pick = &fc[i];
        if (!pick || qd_selftest_make_float_layer(pick, n, k, 4 + (uint64_t)f, &fl[f], &err) ||
            qd_kmat_from_float(&fl[f], &h[4 + f], &err)) {
            fprintf(stderr, "kernel_bench: %s: %s\n", bench_float_cases[f], pick ? err.msg : "no such case");
            return 1;
        }
    }
    for (int i = 0; i < BENCH_N_KMAT; i++)
        if (qd_kmat_upload(c->be, &h[i], &d[i], &err)) {
            fprintf(stderr, "kernel_bench: %s\n", err.msg);
            return 1;
        }
    float *xh = malloc((size_t)(max_batch * k) * sizeof *xh);
    for (int64_t i = 0; i < max_batch * k; i++) xh[i] = (float)((i * 2654435761u) % 1000) / 1000.0f + 0.01f;
    float *x = qd_backend_alloc(c->be, (size_t)(max_batch * k) * sizeof(float));
    float *y = qd_backend_alloc(c->be, (size_t)(max_batch * n) * sizeof(float));
    qd_backend_upload(c->be, x, xh, (size_t)(max_batch * k) * sizeof(float));
    for (int b = 1; b <= max_batch; b = b < 8 ? b + 1 : b * 2) {
        double base = 0;
#ifdef QUANTD_HAVE_CUDA
        if (c->be->device >= 0) base = time_cublas_f16(c, n, k, b);
        if (base > 0)
            printf("{\"shape\":\"%lldx%lld\",\"batch\":%d,\"kernel\":\"cublas-f16\",\"us\":%.2f,\"gbps\":%.1f,"
                   "\"frac_copy\":%.3f}\n", (long long)k, (long long)n, b, base * 1e6, (double)(n * k * 2) / base / 1e9,
                   c->copy_gbps > 0 ? (double)(n * k * 2) / base / 1e9 / c->copy_gbps : 0.0);
#endif
        for (int i = 0; i < BENCH_N_KMAT; i++) {
            double t = time_kernel(c, &d[i], x, b, y);
            if (t < 0) return 1;
            printf("{\"shape\":\"%lldx%lld\",\"batch\":%d,\"kernel\":\"%s\",\"us\":%.2f,\"gbps\":%.2f",
                   (long long)k, (long long)n, b, qd_kmat_layout_name(&h[i]), t * 1e6,
                   (double)qd_kmat_bytes(&h[i]) / t / 1e9);
            if (c->copy_gbps > 0) printf(",\"frac_copy\":%.3f", (double)qd_kmat_bytes(&h[i]) / t / 1e9 / c->copy_gbps);
            if (base > 0) printf(",\"speedup_vs_f16\":%.2f", base / t);
            printf("}\n");
            fflush(stdout);
        }
    }
    qd_backend_free(c->be, x);
    qd_backend_free(c->be, y);
    free(xh);
    for (int i = 0; i < BENCH_N_KMAT; i++) qd_kmat_free(&d[i]);
    qd_kmat_free(&h[2]);
    qd_packed_free(&plain);
    qd_packed_free(&act);
    qd_packed_free(&awq);
    for (int f = 0; f < BENCH_N_FLOAT; f++) qd_packed_free(&fl[f]);
    return 0;
}

/* GPTQ quantization time of one layer (Hessian given, so this is damping, Cholesky and the
 * column loop), on the backend. */
static int bench_gptq(bench_ctx *c, int64_t n, int64_t k)
{
    float *w = malloc((size_t)(n * k) * sizeof *w), *h = malloc((size_t)(k * k) * sizeof *h);
    if (!w || !h) return 1;
    for (int64_t i = 0; i < n * k; i++) w[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    /* A diagonally dominant SPD Hessian with some structure. */
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) h[i * k + j] = i == j ? 2.0f + (float)(i % 7) : 1.0f / (float)(1 + llabs(i - j));
    qd_gptq_opts o = qd_gptq_opts_default();
    qd_gptq_result r;
    qd_err err = {0};
    double t0 = qd_clock_now_s();
    int rc = qd_gptq_quantize_h(c->be, &o, w, n, k, h, &r, &err);
    double t = qd_clock_now_s() - t0;
    if (rc) fprintf(stderr, "kernel_bench: gptq: %s\n", err.msg);
    else
        printf("{\"gptq_layer\":\"%lldx%lld\",\"device\":\"%s\",\"seconds\":%.3f,\"loop_seconds\":%.3f}\n",
               (long long)k, (long long)n, c->be->name, t, r.seconds);
    qd_gptq_result_free(&r);
    free(w);
    free(h);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    qd_runtime_opts rt;             /* QUANTD_* settings (docs/daemon.md, "Environment variables") */
    qst_startup(argv, &rt);
    const char *device = "cpu", *shapes = "llama7b";
    int max_batch = 16, reps = 50, gptq = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--max-batch") && i + 1 < argc) max_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gptq")) gptq = 1;
        else {
            fprintf(stderr, "usage: kernel_bench [--device cpu|cuda:N] [--shapes llama7b|llama70b|all|small] "
                            "[--max-batch B] [--reps R] [--gptq]\n");
            return 2;
        }
    }
    if (max_batch < 1) max_batch = 1;
    if (reps < 1) reps = 1;
    if (reps > BENCH_MAX_REPS) reps = BENCH_MAX_REPS;
    bench_ctx c = {.reps = reps};
    qd_err err = {0};
    if (qd_backend_open(device, &rt, &c.be, &err)) {
        fprintf(stderr, "kernel_bench: %s\n", err.msg);
        return 1;
    }
#ifdef QUANTD_HAVE_CUDA
    if (c.be->device >= 0) {
        BENCH_CU(cudaEventCreate(&c.e0));
        BENCH_CU(cudaEventCreate(&c.e1));
        if (cublasCreate(&c.blas) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "kernel_bench: cublasCreate failed\n");
            return 1;
        }
        int l2 = 0;
        BENCH_CU(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, c.be->device));
        c.flush_bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
        BENCH_CU(cudaMalloc(&c.flush, c.flush_bytes));
        struct cudaDeviceProp prop;
        BENCH_CU(cudaGetDeviceProperties(&prop, c.be->device));
        printf("{\"device\":\"%s\",\"sm\":\"%d.%d\",\"sms\":%d,\"l2_bytes\":%d,\"flush_bytes\":%zu,\"reps\":%d}\n",
               prop.name, prop.major, prop.minor, prop.multiProcessorCount, l2, c.flush_bytes, reps);
        c.copy_gbps = measure_copy_gbps(&c);
    }
#endif
    static const int64_t s7[][2] = {{4096, 4096}, {4096, 11008}, {11008, 4096}};
    static const int64_t s70[][2] = {{8192, 28672}, {28672, 8192}};
    static const int64_t ssmall[][2] = {{4096, 4096}};
    int rc = 0;
    if (!strcmp(shapes, "small"))
        rc |= bench_shape(&c, ssmall[0][0], ssmall[0][1], max_batch);
    if (!strcmp(shapes, "llama7b") || !strcmp(shapes, "all"))
        for (int i = 0; i < 3 && !rc; i++) rc |= bench_shape(&c, s7[i][0], s7[i][1], max_batch);
    if (!strcmp(shapes, "llama70b") || !strcmp(shapes, "all"))
        for (int i = 0; i < 2 && !rc; i++) rc |= bench_shape(&c, s70[i][0], s70[i][1], max_batch);
    if (gptq && !rc) {
        rc |= bench_gptq(&c, 4096, 4096);
        if (!rc) rc |= bench_gptq(&c, 28672, 8192);
    }
#ifdef QUANTD_HAVE_CUDA
    if (c.be->device >= 0) {
        cublasDestroy(c.blas);
        cudaFree(c.flush);
    }
#endif
    qd_backend_close(c.be);
    return rc;
}
