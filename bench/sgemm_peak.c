/* OpenBLAS SGEMM throughput on this machine: the yardstick the GPTQ benchmark divides by.
 *
 *   sgemm_peak [SIZE [THREADS [REPS]]]   (defaults 4096, 2, 3)
 *
 * Times C = A B for square SIZE matrices (row-major, as quantd calls it) after one warm-up
 * call and prints the best of REPS as one JSON line. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant/core/clock.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 4096;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (n < 16 || threads < 1 || reps < 1) {
        fprintf(stderr, "usage: sgemm_peak [SIZE [THREADS [REPS]]]\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n);
    float *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return 1;
    unsigned s = 12345;
    for (long i = 0; i < n * n; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        b[i] = (float)((s >> 4) & 0xffff) / 65536.0f - 0.5f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = qd_clock_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t = qd_clock_now_s() - t;
        if (t < best) best = t;
    }
    double gflops = 2.0 * n * n * n / best / 1e9;
    printf("{\"size\":%ld,\"threads\":%d,\"seconds\":%.4f,\"gflops\":%.2f,\"core\":\"%s\"}\n", n, threads,
           best, gflops, openblas_get_corename());
    free(a); free(b); free(c);
    return 0;
}
