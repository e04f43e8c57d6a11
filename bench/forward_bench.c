/* Forward throughput of the model runtime on the CPU backend.
 *
 *   forward_bench --block [--threads T] [--seq S] [--batch B] [--reps R]
 *   forward_bench --model DIR --tokens FILE [--threads T] [--seq S] [--windows W]
 *
 * --block: generates a 1B-shaped llama block (hidden 2048, intermediate 5632, 32 heads,
 * F16 on disk) with testgen, runs qd_block_forward on B sequences of S tokens and reports
 * tokens/s, GFLOP/s (linears 2*rows*N*K, attention as computed: causal chunks of 128 query
 * rows against the keys before the chunk's end) and the fraction of a plain OpenBLAS SGEMM (2048^3, same threads)
 * measured in the same run. --model: perplexity windows through qd_eval_ppl, tokens/s.
 * One JSON line on stdout. Built by bench/forward.sh against a build's libquant.a. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "quant/core/clock.h"
#include "quant/core/fsutil.h"
#include "quant/model/block.h"
#include "quant/model/eval.h"
#include "quant/model/testgen.h"
#include "quant/model/token_file.h"
#include "startup/runtime_env.h"

static double sgemm_peak(int n)
{
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) { a[i] = (float)(i % 17) * 0.01f; b[i] = (float)(i % 13) * 0.01f; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = qd_clock_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = qd_clock_now_s() - t0;
        if (t < best) best = t;
    }
    free(a); free(b); free(c);
    return 2.0 * n * (double)n * n / best / 1e9;
}

static int bench_block(qd_backend *be, int threads, int seq, int batch, int reps)
{
    qd_err err = {0};
    char dir[] = "/tmp/quantd-fwdbench-XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.hidden = 2048; o.intermediate = 5632; o.n_heads = 32; o.n_kv_heads = 32; o.n_layers = 1;
    o.vocab = 512; o.max_pos = 4096; o.dtype = QD_DTYPE_F16;
    qd_model *m = NULL;
    qd_block_weights *bw = NULL;
    int rc = qd_testgen_write(dir, &o, &err);
    double tl0 = qd_clock_now_s();
    if (!rc) rc = qd_model_open(dir, be, &m, &err);
    if (!rc) rc = qd_block_load(m, 0, &bw, &err);
    double tload = qd_clock_now_s() - tl0;
    if (rc) { fprintf(stderr, "forward_bench: %s\n", err.msg); return 1; }
    int64_t rows = (int64_t)seq * batch, H = o.hidden;
    float *x = malloc((size_t)(rows * H) * 4), *y = malloc((size_t)(rows * H) * 4);
    for (int64_t i = 0; i < rows * H; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    rc = qd_block_forward(m, bw, x, y, batch, seq, NULL, NULL, &err);   /* warm-up */
    double best = 1e30;
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = qd_clock_now_s();
        rc = qd_block_forward(m, bw, x, y, batch, seq, NULL, NULL, &err);
        double t = qd_clock_now_s() - t0;
        if (t < best) best = t;
    }
    if (rc) { fprintf(stderr, "forward_bench: %s\n", err.msg); return 1; }
    double lin = 0;
    for (int i = 0; i < qd_model_n_linears(m); i++) lin += 2.0 * rows * qd_model_linear(m, i)->n * qd_model_linear(m, i)->k;
    /* Causal attention as computed (query-row chunks of 128 against keys up to the chunk's
     * end): Q K^T and P V are 2 * rows * keys * head_dim each. */
    double att = 0;
    for (int r0 = 0; r0 < seq; r0 += 128) {
        int rows_c = seq - r0 < 128 ? seq - r0 : 128;
        att += 4.0 * rows_c * (double)(r0 + rows_c) * (o.hidden / o.n_heads);
    }
    att *= (double)batch * o.n_heads;
    double gf = (lin + att) / best / 1e9, peak = sgemm_peak(2048);
    printf("{\"bench\":\"block_1b\",\"threads\":%d,\"seq\":%d,\"batch\":%d,\"seconds\":%.4f,\"tokens_per_s\":%.1f,"
           "\"gflops\":%.2f,\"linear_gflop\":%.2f,\"attention_gflop\":%.2f,\"sgemm_peak_gflops\":%.2f,\"fraction_of_peak\":%.3f,"
           "\"block_load_s\":%.3f,\"block_mib\":%.1f}\n",
           threads, seq, batch, best, rows / best, gf, lin / 1e9, att / 1e9, peak, gf / peak, tload,
           qd_block_bytes(m) / 1048576.0);
    free(x); free(y);
    qd_block_free(m, bw);
    qd_model_close(m);
    qd_fs_remove_tree(dir, &err);
    return 0;
}

static int bench_model(qd_backend *be, int threads, const char *dir, const char *tokens, int seq, int windows)
{
    qd_err err = {0};
    qd_model *m = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = qd_token_file_read(tokens, &ids, &n, &err);
    if (!rc) rc = qd_model_open(dir, be, &m, &err);
    qd_eval_opts o = qd_eval_opts_default(seq);
    o.max_windows = windows;
    qd_eval_result r;
    if (!rc) rc = qd_eval_ppl(m, ids, n, &o, &r, &err);
    if (rc) { fprintf(stderr, "forward_bench: %s\n", err.msg); return 1; }
    printf("{\"bench\":\"model\",\"model\":\"%s\",\"threads\":%d,\"seq\":%d,\"windows\":%lld,\"seconds\":%.3f,"
           "\"tokens_per_s\":%.1f,\"ppl\":%.4f}\n",
           dir, threads, seq, (long long)r.windows, r.seconds, r.tokens / r.seconds, r.ppl);
    free(ids);
    qd_model_close(m);
    return 0;
}

int main(int argc, char **argv)
{
    qd_runtime_opts rt;             /* QUANTD_* settings (docs/daemon.md, "Environment variables") */
    qst_startup(argv, &rt);
    int threads = 2, seq = 512, batch = 4, reps = 3, windows = 16, block = 0;
    const char *model = NULL, *tokens = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--block")) block = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--seq")) seq = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--batch")) batch = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--windows")) windows = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--model")) model = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tokens")) tokens = argv[++i];
        else { fprintf(stderr, "usage: forward_bench --block | --model DIR --tokens FILE [--threads T] [--seq S] [--batch B] [--windows W]\n"); return 2; }
    }
    qd_err err = {0};
    qd_backend *be = NULL;
    if (qd_backend_cpu_open(threads, &rt, &be, &err)) { fprintf(stderr, "forward_bench: %s\n", err.msg); return 1; }
    int rc = block ? bench_block(be, threads, seq, batch, reps)
                   : model && tokens ? bench_model(be, threads, model, tokens, seq, windows) : 2;
    qd_backend_close(be);
    return rc;
}
