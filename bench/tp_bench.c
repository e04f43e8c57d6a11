/* Benchmark of the seed paper's (003, TP-aware dequantization) Algorithm 2 (naive) and
 * Algorithm 3 (TP-aware) on one MLP pair (a column-parallel K1 x N1 layer, a row-parallel
 * N1 x N2 layer, 4-bit GPTQ weights, group 128, g_idx already sorted per Algorithm 1) with
 * tp ranks emulated one after another on one device.
 *
 * Measured (on --device cpu): rank 0's local work, min over --reps: the fused 4-bit
 * dequant-GEMM of its column shard, the activation, and for the naive algorithm the copy
 * into the gathered buffer, the global permute Y1[:, P2] and the chunk; then the row-shard
 * dequant-GEMM. Ranks do identical work, so rank 0's time is the per-rank latency.
 * Modelled: the collectives, ring algorithms on a link of --link-gbps GB/s per direction with
 * --hop-us microseconds per step: all-gather (tp-1) x (hop + M*N1/tp*2 B / bw), all-reduce
 * 2(tp-1) x (hop + M*N2/tp*2 B / bw) (FP16 activations). Also modelled, to compare with the
 * paper's GPUs: a "projected" latency where each GEMM streams its packed weights at
 * --hbm-gbps (memory-bound at M <= 16) instead of the measured CPU time.
 *
 *   tp_bench [--shape K1,N1,N2] [--m 1,2,4,8,16] [--tp 1,2,4,8] [--reps 3]
 *            [--link-gbps 300] [--hop-us 2] [--hbm-gbps 3350] [--device cpu]
 * One JSON line per (shape, tp, M). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/core/clock.h"

#define GS 128

static uint64_t rng_s = 88172645463325252ull;
static uint32_t rng_u32(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}

/* y[M, nc] = x[M, K] @ dequant(W)[K, cols c0..c0+nc), W 4-bit GPTQ packed along K
 * (qw[K/8][ld]), symmetric zero 8, scales[K/GS][ld], sorted g_idx (group = k / GS). */
static void dq_gemm(const float *x, int64_t M, int64_t K, const int32_t *qw, const float *sc, int64_t ld, int64_t c0,
                    int64_t nc, float *y, float *wbuf)
{
    memset(y, 0, (size_t)(M * nc) * sizeof *y);
    for (int64_t kb = 0; kb < K / 8; kb++) {
        const int32_t *q = qw + kb * ld + c0;
        const float *s = sc + (kb * 8 / GS) * ld + c0;
        for (int j = 0; j < 8; j++) {
            float *w = wbuf + j * nc;
            for (int64_t n = 0; n < nc; n++) w[n] = (float)((int)(((uint32_t)q[n] >> (4 * j)) & 15u) - 8) * s[n];
        }
        for (int64_t m = 0; m < M; m++) {
            float *yr = y + m * nc;
            for (int j = 0; j < 8; j++) {
                const float a = x[m * K + kb * 8 + j];
                const float *w = wbuf + j * nc;
                for (int64_t n = 0; n < nc; n++) yr[n] += a * w[n];
            }
        }
    }
}

static int parse_list(const char *s, long *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        out[n++] = strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    long shape[3] = {8192, 28672, 8192}, ms[16] = {1, 2, 4, 8, 16}, tps[8] = {1, 2, 4, 8};
    int n_m = 5, n_tp = 4, reps = 3;
    double link_gbps = 300, hop_us = 2, hbm_gbps = 3350;
    const char *device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape")) parse_list(argv[i + 1], shape, 3);
        else if (!strcmp(argv[i], "--m")) n_m = parse_list(argv[i + 1], ms, 16);
        else if (!strcmp(argv[i], "--tp")) n_tp = parse_list(argv[i + 1], tps, 8);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--link-gbps")) link_gbps = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--hop-us")) hop_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--hbm-gbps")) hbm_gbps = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else { fprintf(stderr, "tp_bench: unknown option %s\n", argv[i]); return 2; }
    }
    if (strcmp(device, "cpu")) {
        fprintf(stderr, "tp_bench: --device %s: only cpu is implemented (a CUDA path belongs with quant/kernels)\n", device);
        return 2;
    }
    const int64_t K1 = shape[0], N1 = shape[1], N2 = shape[2];
    if (K1 % GS || N1 % (8 * GS) || N2 % 8) { fprintf(stderr, "tp_bench: shape must be multiples of 128/1024/8\n"); return 2; }
    /* W1 [K1, N1] and W2 [N1, N2], packed 4-bit: 8 values per int32 along K. */
    int32_t *w1 = malloc((size_t)(K1 / 8 * N1) * 4), *w2 = malloc((size_t)(N1 / 8 * N2) * 4);
    float *s1 = malloc((size_t)(K1 / GS * N1) * 4), *s2 = malloc((size_t)(N1 / GS * N2) * 4);
    int64_t *p2 = malloc((size_t)N1 * sizeof *p2);
    long mmax = 1;
    for (int i = 0; i < n_m; i++) if (ms[i] > mmax) mmax = ms[i];
    float *x = malloc((size_t)(mmax * K1) * 4), *y1 = malloc((size_t)(mmax * N1) * 4), *y1g = malloc((size_t)(mmax * N1) * 4);
    float *y1c = malloc((size_t)(mmax * N1) * 4), *y2 = malloc((size_t)(mmax * N2) * 4);
    float *wbuf = malloc((size_t)(8 * (N1 > N2 ? N1 : N2)) * 4);
    if (!w1 || !w2 || !s1 || !s2 || !p2 || !x || !y1 || !y1g || !y1c || !y2 || !wbuf) { fprintf(stderr, "tp_bench: out of memory\n"); return 1; }
    for (int64_t i = 0; i < K1 / 8 * N1; i++) w1[i] = (int32_t)rng_u32();
    for (int64_t i = 0; i < N1 / 8 * N2; i++) w2[i] = (int32_t)rng_u32();
    for (int64_t i = 0; i < K1 / GS * N1; i++) s1[i] = 1e-3f * (1 + (float)(rng_u32() % 100) / 100);
    for (int64_t i = 0; i < N1 / GS * N2; i++) s2[i] = 1e-3f * (1 + (float)(rng_u32() % 100) / 100);
    for (int64_t i = 0; i < mmax * K1; i++) x[i] = (float)(rng_u32() % 2000) / 1000.0f - 1.0f;
    /* P2: the act-order permutation the naive algorithm applies to the gathered Y1. */
    for (int64_t i = 0; i < N1; i++) p2[i] = i;
    for (int64_t i = N1 - 1; i > 0; i--) { int64_t j = rng_u32() % (i + 1), t = p2[i]; p2[i] = p2[j]; p2[j] = t; }
    const double bw = link_gbps * 1e9, hop = hop_us * 1e-6, hbm = hbm_gbps * 1e9;
    for (int ti = 0; ti < n_tp; ti++) {
        const int64_t tp = tps[ti], S = N1 / tp;
        for (int mi = 0; mi < n_m; mi++) {
            const int64_t M = ms[mi];
            double best[2] = {1e30, 1e30};
            for (int rep = 0; rep < reps; rep++)
                for (int algo = 0; algo < 2; algo++) {
                    double t0 = qd_clock_now_s();
                    /* Rank 0: column shard [0, S), Y1_local [M, S]; relu stands in for the activation. */
                    dq_gemm(x, M, K1, w1, s1, N1, 0, S, y1, wbuf);
                    for (int64_t i = 0; i < M * S; i++) y1[i] = y1[i] > 0 ? y1[i] : 0;
                    const float *yl = y1;
                    if (algo == 0) {
                        /* Naive: place the local shard in the gathered buffer (the other
                         * shards arrive over the link: modelled), permute globally, chunk. */
                        for (int64_t m = 0; m < M; m++) memcpy(y1g + m * N1, y1 + m * S, (size_t)S * 4);
                        for (int64_t m = 0; m < M; m++)
                            for (int64_t c = 0; c < S; c++) y1c[m * S + c] = y1g[m * N1 + p2[c]];
                        yl = y1c;
                    }
                    /* Row shard [0, S) of W2: packed rows [0, S/8). */
                    dq_gemm(yl, M, S, w2, s2, N2, 0, N2, y2, wbuf);
                    double t = qd_clock_now_s() - t0;
                    if (t < best[algo]) best[algo] = t;
                }
            double ag = tp > 1 ? (double)(tp - 1) * (hop + (double)(M * S * 2) / bw) : 0;
            double ar = tp > 1 ? 2.0 * (double)(tp - 1) * (hop + (double)(M * N2 * 2) / (double)tp / bw) : 0;
            double wbytes = (double)(K1 * S) / 2 + (double)(K1 / GS * S) * 2 + (double)(S * N2) / 2 + (double)(S / GS * N2) * 2;
            double gemm_proj = wbytes / hbm;
            double naive = best[0] + ag + ar, aware = best[1] + ar;
            double pn = gemm_proj + ag + ar, pa = gemm_proj + ar;
            printf("{\"K1\":%lld,\"N1\":%lld,\"N2\":%lld,\"tp\":%lld,\"M\":%lld,\"measured_rank_ms_naive\":%.3f,"
                   "\"measured_rank_ms_aware\":%.3f,\"modelled_allgather_ms\":%.4f,\"modelled_allreduce_ms\":%.4f,"
                   "\"cpu_total_ms_naive\":%.3f,\"cpu_total_ms_aware\":%.3f,\"cpu_speedup\":%.3f,"
                   "\"projected_ms_naive\":%.4f,\"projected_ms_aware\":%.4f,\"projected_speedup\":%.3f,"
                   "\"allgather_bytes_per_token_fp16\":%lld}\n",
                   (long long)K1, (long long)N1, (long long)N2, (long long)tp, (long long)M, best[0] * 1e3, best[1] * 1e3,
                   ag * 1e3, ar * 1e3, naive * 1e3, aware * 1e3, naive / aware, pn * 1e3, pa * 1e3, pn / pa,
                   (long long)((tp - 1) * N1 * 2));
            fflush(stdout);
        }
    }
    free(w1); free(w2); free(s1); free(s2); free(p2); free(x); free(y1); free(y1g); free(y1c); free(y2); free(wbuf);
    return 0;
}
