/* Bulk dequantization benchmark: ns per weight of the format table's scalar dequant_ref
 * (what loading a quantized block used before) and of qd_kernel_dequant_cpu (what it uses
 * now) at 1 and 2 threads, on the linears of one block of the random 24-block model of
 * bench/results/eval-speed.md (hidden 1024, intermediate 2816), 4-bit g128. Build and run:
 *
 *   gcc -O2 -std=gnu11 -I. -o build/dequant_bench bench/dequant_bench.c build/libquant.a \
 *       build/libqadmit.a build/libqjob.a build/libqformats.a build/libqcore.a \
 *       $(pkg-config --libs openblas lapacke libcjson libpcre2-8) -lpthread -lm
 *   build/dequant_bench [FORMAT] [REPS]     (defaults: gptq, 5)
 *
 * Prints one JSON line per decoder: wall ns/weight (median of REPS over the block's seven
 * linears) and CPU ns/weight (process CPU time, all threads). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant/formats/format.h"
#include "quant/kernels/kernels.h"
#include "quant/kernels/selftest.h"

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "gptq";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 100) reps = 5;
    const qd_format *fmt = qd_format_find(name);
    if (!fmt) { fprintf(stderr, "dequant_bench: unknown format %s\n", name); return 2; }
    /* q, k, v, o [1024, 1024]; gate, up [2816, 1024]; down [1024, 2816]. */
    static const int64_t shapes[7][2] = {{1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024},
                                         {2816, 1024}, {2816, 1024}, {1024, 2816}};
    qd_packed p[7];
    qd_err err = {0};
    int64_t weights = 0, maxw = 0;
    for (int i = 0; i < 7; i++) {
        if (qd_selftest_make_layer(fmt, 4, 128, 0, shapes[i][0], shapes[i][1], (uint64_t)i + 1, &p[i], &err)) {
            fprintf(stderr, "dequant_bench: %s\n", err.msg);
            return 1;
        }
        int64_t nw = shapes[i][0] * shapes[i][1];
        weights += nw;
        if (nw > maxw) maxw = nw;
    }
    float *w = malloc((size_t)maxw * sizeof *w);
    if (!w) return 1;
    /* decoder 0: dequant_ref; 1, 2: qd_kernel_dequant_cpu with 1 and 2 threads. */
    static const char *names[3] = {"dequant_ref", "bulk-1t", "bulk-2t"};
    for (int d = 0; d < 3; d++) {
        double *wall = malloc((size_t)reps * sizeof *wall), cpu = 0.0;
        for (int r = 0; r < reps; r++) {
            double w0 = wall_now(), c0 = cpu_now();
            for (int i = 0; i < 7; i++) {
                int rc = d == 0 ? fmt->dequant_ref(&p[i], w, &err)
                                : qd_kernel_dequant_cpu(fmt, &p[i], w, d, QD_KCPU_AUTO, &err);
                if (rc) { fprintf(stderr, "dequant_bench: %s\n", err.msg); return 1; }
            }
            wall[r] = wall_now() - w0;
            cpu += cpu_now() - c0;
        }
        qsort(wall, (size_t)reps, sizeof *wall, cmp_d);
        printf("{\"format\": \"%s\", \"decoder\": \"%s\", \"isa\": \"%s\", \"weights\": %lld, "
               "\"wall_ns_per_weight\": %.3f, \"cpu_ns_per_weight\": %.3f}\n", name, names[d],
               qd_kernel_cpu_isa_name(), (long long)weights, 1e9 * wall[reps / 2] / (double)weights,
               1e9 * cpu / reps / (double)weights);
        free(wall);
    }
    for (int i = 0; i < 7; i++) qd_packed_free(&p[i]);
    free(w);
    return 0;
}
