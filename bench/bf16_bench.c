/* The bfloat16 products of "compute": "bf16" (quant/backend/cpu/cpu_bf16.h) against the
 * F32 products they replace, on one shape:
 *
 *   bf16_bench M N K [THREADS [REPS]]     (defaults: 2 threads, best of 3)
 *
 * Times y = x W^T (x [M, K], W [N, K]) by OpenBLAS sgemm, by the AMX tiles and by the
 * portable bf16 path, and the Hessian H = X^T X (X [M, K]) by ssyrk and by the bf16 paths;
 * prints one JSON line per product with seconds and GFLOPS. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "quant/backend/cpu/cpu_bf16.h"
#include "quant/core/clock.h"

typedef struct run { long m, n, k; int threads, amx; float *x, *w, *y, *h; } run;

static void do_sgemm(run *r) { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->m, r->n, r->k, 1, r->x, r->k, r->w, r->k, 0, r->y, r->n); }
static void do_bgemm(run *r) { cpu_bf16_gemm_nt(r->amx, r->threads, r->m, r->n, r->k, r->x, r->k, r->w, r->k, r->y, r->n); }
static void do_ssyrk(run *r) { cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, r->k, r->m, 1, r->x, r->k, 0, r->h, r->k); }
static void do_bsyrk(run *r) { cpu_bf16_syrk(r->amx, r->threads, r->k, r->x, r->m, r->k, 1, 0, r->h); }

static void timed(const char *what, void (*fn)(run *), run *r, int reps, double flops)
{
    fn(r);
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = qd_clock_now_s();
        fn(r);
        double dt = qd_clock_now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("{\"what\":\"%s\",\"m\":%ld,\"n\":%ld,\"k\":%ld,\"threads\":%d,\"seconds\":%.5f,\"gflops\":%.1f}\n", what,
           r->m, r->n, r->k, r->threads, best, flops / best / 1e9);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bf16_bench M N K [THREADS [REPS]]\n");
        return 2;
    }
    run r = {.m = atol(argv[1]), .n = atol(argv[2]), .k = atol(argv[3])};
    r.threads = argc > 4 ? atoi(argv[4]) : 2;
    int reps = argc > 5 ? atoi(argv[5]) : 3;
    if (r.m < 1 || r.n < 1 || r.k < 1 || r.threads < 1 || reps < 1) return 2;
    openblas_set_num_threads(r.threads);
    r.x = malloc(sizeof(float) * r.m * r.k);
    r.w = malloc(sizeof(float) * r.n * r.k);
    r.y = malloc(sizeof(float) * r.m * r.n);
    r.h = malloc(sizeof(float) * r.k * r.k);
    if (!r.x || !r.w || !r.y || !r.h) return 1;
    unsigned s = 12345;
    for (long i = 0; i < r.m * r.k; i++) r.x[i] = (float)(((s = s * 1103515245u + 12345u) >> 8) & 0xffff) / 65536.0f - 0.5f;
    for (long i = 0; i < r.n * r.k; i++) r.w[i] = (float)(((s = s * 1103515245u + 12345u) >> 8) & 0xffff) / 65536.0f - 0.5f;
    double gf = 2.0 * r.m * r.n * r.k, hf = (double)r.m * r.k * (r.k + 1);
    timed("sgemm_f32", do_sgemm, &r, reps, gf);
    r.amx = cpu_bf16_amx_usable();
    if (r.amx) timed("gemm_bf16_amx", do_bgemm, &r, reps, gf);
    r.amx = 0;
    timed("gemm_bf16_portable", do_bgemm, &r, reps, gf);
    timed("ssyrk_f32", do_ssyrk, &r, reps, hf);
    r.amx = cpu_bf16_amx_usable();
    if (r.amx) timed("syrk_bf16_amx", do_bsyrk, &r, reps, hf);
    return 0;
}
