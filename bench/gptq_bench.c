/* GPTQ on one layer, timed piece by piece on the CPU backend.
 *
 *   gptq_bench W.safetensors X.safetensors [--bits B] [--group-size G] [--desc-act]
 *              [--threads T] [--block-size 128] [--reps R]
 *
 * Measures (one JSON line on stdout):
 *   hessian: seconds and GFLOP/s of the running-average Hessian over all rows of X
 *            (flops counted as rows * K^2, the useful half of X^T X);
 *   gptq:    the quantization proper as qd_gptq_quantize reports it (damping, Cholesky,
 *            column loop, unpermute);
 *   and, replayed alone on the same shapes, in the form the driver uses (the LDL form where
 *   the backend has chol_ldl_upper, see quant/backend/gptq_block.h): the factorisation
 *   (chol_ldl_upper, else chol_inverse_upper); the lazy trailing updates, one GEMM per
 *   block of B columns (N * K^2 flops in all; LDL form acc[:, i2:] += Err1 @ A[i1:i2, i2:],
 *   U form W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:], the same shapes); the in-block kernel
 *   (gptq_block) for every block.
 * Built by bench/gptq_layer.sh against a build directory's libquant.a. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/backend/backend.h"
#include "quant/backend/gptq_block.h"
#include "quant/core/clock.h"
#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "startup/runtime_env.h"

static float *load_2d(const char *path, int64_t *rows, int64_t *cols)
{
    st_file *f = NULL;
    qd_err err = {0};
    if (st_file_open(path, &f, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    const st_tensor *t = st_file_tensor(f, 0);
    if (!t || t->ndim != 2) {
        fprintf(stderr, "%s: expected one 2-D tensor\n", path);
        exit(2);
    }
    *rows = t->shape[0];
    *cols = t->shape[1];
    float *x = malloc(sizeof(float) * t->numel);
    if (!x || st_tensor_read_f32(t, x, &err)) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        exit(2);
    }
    st_file_close(f);
    return x;
}

int main(int argc, char **argv)
{
    qd_runtime_opts rt;             /* QUANTD_* settings (docs/daemon.md, "Environment variables") */
    qst_startup(argv, &rt);
    if (argc < 3) {
        fprintf(stderr, "usage: gptq_bench W.safetensors X.safetensors [--bits B] [--group-size G] "
                        "[--desc-act] [--threads T] [--block-size B] [--reps R]\n");
        return 2;
    }
    qd_gptq_opts o = qd_gptq_opts_default();
    o.quant.sym = 1;
    int threads = 2, reps = 1;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--bits") && i + 1 < argc) o.quant.bits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--group-size") && i + 1 < argc) o.quant.group_size = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--desc-act")) o.desc_act = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--block-size") && i + 1 < argc) o.block_size = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    int64_t n, k, t, kx;
    float *w = load_2d(argv[1], &n, &k);
    float *x = load_2d(argv[2], &t, &kx);
    if (kx != k) { fprintf(stderr, "K mismatch: W has %lld, X has %lld\n", (long long)k, (long long)kx); return 2; }

    qd_backend *be = NULL;
    qd_err err = {0};
    if (qd_backend_cpu_open(threads, &rt, &be, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }

    /* Hessian */
    qd_gptq_hessian acc;
    if (qd_gptq_hessian_init(&acc, be, k, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double t0 = qd_clock_now_s();
    if (qd_gptq_hessian_add(&acc, x, t, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double t_hess = qd_clock_now_s() - t0;
    double hess_flops = (double)t * (double)k * (double)k;

    /* GPTQ proper, reps times in this process: the first call pays first-touch page faults
     * on its buffers; later ones reuse the backend's cached blocks, as the layers of a job
     * do. gptq_seconds is the best call, gptq_first_seconds the first. */
    qd_gptq_result res;
    double t_gptq_wall = 0, best = 0, first = 0;
    for (int rep = 0; rep < (reps < 1 ? 1 : reps); rep++) {
        if (rep) qd_gptq_result_free(&res);
        t0 = qd_clock_now_s();
        if (qd_gptq_quantize(be, &o, w, n, k, &acc, &res, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double wall = qd_clock_now_s() - t0;
        if (rep == 0) first = res.seconds;
        if (rep == 0 || res.seconds < best) { best = res.seconds; t_gptq_wall = wall; }
    }

    /* Replays on the same shapes. */
    float *hinv = malloc(sizeof(float) * k * k);
    memcpy(hinv, acc.h, sizeof(float) * k * k);
    double mean = 0;
    for (int64_t i = 0; i < k; i++) mean += hinv[i * k + i];
    for (int64_t i = 0; i < k; i++) hinv[i * k + i] += (float)(o.damp_percent * mean / k);
    const int ldl = be->ops->chol_ldl_upper != NULL;
    t0 = qd_clock_now_s();
    if ((ldl ? be->ops->chol_ldl_upper : be->ops->chol_inverse_upper)(be, hinv, k)) {
        fprintf(stderr, "%s\n", be->err.msg);
        return 1;
    }
    double t_chol = qd_clock_now_s() - t0;

    const int64_t B = o.block_size, S = B;           /* B * GPTQ_SUPER_BLOCKS (1) in gptq.c */
    float *wc = malloc(sizeof(float) * n * k), *e = malloc(sizeof(float) * n * S);
    float *corr = malloc(sizeof(float) * n * k);    /* LDL form: the corrections */
    memset(corr, 0, sizeof(float) * n * k);         /* first-touch page faults outside the timing */
    memcpy(wc, w, sizeof(float) * n * k);
    for (int64_t i = 0; i < n * S; i++) e[i] = 1e-3f * (float)((i * 7919) % 201 - 100);
    /* Two passes, the second timed: the first faults in corr's pages (the compiler may turn
     * malloc + memset into calloc, which leaves them untouched). */
    double t_lazy = 0, lazy_flops = 0;
    for (int pass = 0; pass < 2; pass++) {
        t_lazy = 0;
        lazy_flops = 0;
        for (int64_t s1 = 0; s1 < k; s1 += S) {
            int64_t s2 = s1 + S < k ? s1 + S : k;
            double s = qd_clock_now_s();
            for (int64_t i1 = s1; i1 < s2; i1 += B) {
                int64_t i2 = i1 + B < s2 ? i1 + B : s2;
                if (i2 >= s2) break;
                be->ops->gemm(be, 0, 0, n, s2 - i2, i2 - i1, 1.0f, e + (i1 - s1), S, hinv + i1 * k + i2, k, 1.0f,
                              corr + i2, k);
                lazy_flops += 2.0 * (double)n * (double)(i2 - i1) * (double)(s2 - i2);
            }
            if (s2 < k) {
                be->ops->gemm(be, 0, 0, n, k - s2, s2 - s1, 1.0f, e, S, hinv + s1 * k + s2, k, 1.0f, corr + s2, k);
                lazy_flops += 2.0 * (double)n * (double)(s2 - s1) * (double)(k - s2);
            }
            t_lazy += qd_clock_now_s() - s;
        }
    }

    int64_t G = res.layer.n_groups;
    float *sc = calloc(G * n, sizeof(float)), *zr = calloc(G * n, sizeof(float));
    uint8_t *codes = malloc(n * k);
    int32_t *cg = malloc(sizeof(int32_t) * k);
    int64_t gs = o.quant.group_size > 0 ? o.quant.group_size : k;
    for (int64_t j = 0; j < k; j++) cg[j] = o.quant.group_size > 0 ? (int32_t)(j / gs) : 0;
    if (o.quant.group_size <= 0)
        for (int64_t r = 0; r < n; r++) qd_quant_params(&o.quant, w + r * k, k, 1, &sc[r], &zr[r]);
    memcpy(wc, w, sizeof(float) * n * k);
    memset(codes, 0, (size_t)(n * k));          /* first-touch page faults out of the timing */
    double t_block = 0;
    for (int64_t i1 = 0; i1 < k; i1 += B) {
        int64_t i2 = i1 + B < k ? i1 + B : k;
        qd_gptq_block_args a = {.cfg = &o.quant, .n = n, .k = k, .i1 = i1, .i2 = i2, .w = wc, .ldw = k,
                                .hinv = hinv, .ldh = k, .err = e, .lde = B, .codes = codes, .ldc = k,
                                .scales = sc, .zeros = zr, .col_group = cg,
                                .find_params = o.quant.group_size > 0,
                                .ldl = ldl, .acc = ldl && i1 > 0 ? corr : NULL, .lda = k};
        double s = qd_clock_now_s();
        be->ops->gptq_block(be, &a);
        t_block += qd_clock_now_s() - s;
    }

    printf("{\"n\":%lld,\"k\":%lld,\"rows\":%lld,\"bits\":%d,\"group_size\":%lld,\"desc_act\":%s,"
           "\"threads\":%d,\"block_size\":%lld,"
           "\"hessian_seconds\":%.4f,\"hessian_gflops\":%.2f,"
           "\"gptq_seconds\":%.4f,\"gptq_first_seconds\":%.4f,\"reps\":%d,\"gptq_wall_seconds\":%.4f,\"damp\":%.6g,\"fallback\":%s,"
           "\"chol_seconds\":%.4f,\"lazy_gemm_seconds\":%.4f,\"lazy_gemm_gflops\":%.2f,"
           "\"lazy_gemm_gflop\":%.2f,\"block_kernel_seconds\":%.4f}\n",
           (long long)n, (long long)k, (long long)t, o.quant.bits, (long long)o.quant.group_size,
           o.desc_act ? "true" : "false", threads, (long long)B, t_hess, hess_flops / t_hess / 1e9,
           best, first, reps < 1 ? 1 : reps, t_gptq_wall, res.damp, res.fallback_rtn ? "true" : "false", t_chol, t_lazy,
           lazy_flops / t_lazy / 1e9, lazy_flops / 1e9, t_block);

    free(sc); free(zr); free(codes); free(cg); free(wc); free(e); free(corr); free(hinv);
    qd_gptq_result_free(&res);
    qd_gptq_hessian_free(&acc);
    qd_backend_close(be);
    free(w); free(x);
    return 0;
}
