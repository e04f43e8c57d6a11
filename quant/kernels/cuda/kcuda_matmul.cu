/* CUDA dequantizing matmul (see kcuda.h and quant/kernels/kernels.h).
 *
 * GEMV (M <= 8, memory-bound): each thread owns 4 adjacent output columns and streams
 * their packed words with 16-byte loads (one int4 = 4 columns' words of one K block of 32),
 * decoding in registers; the bit width is a template parameter so every shift is a
 * constant. A block covers 512 columns x 256 K-rows, x's slice (read through perm for the
 * reordered layout) sits in shared memory, and the K split across blocks is summed by a
 * second kernel in a fixed order, so the result does not depend on scheduling. AWQ: each
 * thread owns one word column (8 interleaved channels) with 4-byte coalesced loads.
 *
 * GEMM (M > 8): 64 x 64 output tiles, 4 warps of 2 x 2 WMMA 16x16x16 half fragments with
 * F32 accumulators; each K step of 32 stages x and the decoded weight in shared memory as
 * half. x and W are rounded to half, hence the looser tolerance the self-test names.
 *
 * Float grids (QD_KMAT_FLOAT: FP8 E4M3 bytes or FP4 E2M1 nibble pairs along K, F32 scales):
 * the GEMV gives each output row to a warp whose lanes stream the row's codes in 16-byte
 * chunks (16 FP8 or 32 FP4 codes), decode 8 at a time with the scale of their group, read x
 * through the read-only cache and reduce across the warp with a fixed shuffle tree (no K
 * split, deterministic); the GEMM is the same WMMA kernel with a float-grid tile decoder.
 *
 * Index arithmetic and decoding are kdecode.h's host/device functions (checked on the host
 * against the format table by tests/unit/test_kernel_decode.c) and the launch shapes come
 * from kernel_plan.c (tests/unit/test_kernel_plan.c). The kernels themselves have been
 * compiled but, at the time of writing, not yet run on a GPU: tests/gpu/test_backend_cuda.c,
 * `quantctl selftest --device cuda:0` and bench/gpu.sh check them where one is present. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

/* The C headers declare C functions (qd_err_set, ...): give them C linkage here. */
extern "C" {
#include "quant/core/error.h"
#include "quant/kernels/kernel_plan.h"
#include "quant/kernels/kernels.h"
}
#include "quant/backend/cuda/cuda_internal.h"
#include "quant/kernels/cuda/kcuda.h"
#include "quant/kernels/kdecode.h"

#define GV_THREADS KPLAN_GV_THREADS
#define GV_KC KPLAN_GV_KC

__device__ __forceinline__ uint32_t i4c(const int4 &v, int c)
{
    return (uint32_t)(c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w);
}

/* x slice [MR][GV_KC] of rows, through perm, zero-padded; and the group of each K-row. */
template <int MR>
__device__ void kc_load_x(float (*xs)[GV_KC], int *grp, const float *x, int64_t rows, int64_t K, int64_t k0,
                          int klen, const int32_t *perm, const int32_t *g_idx, int64_t gs)
{
    for (int idx = threadIdx.x; idx < MR * GV_KC; idx += blockDim.x) {
        int m = idx / GV_KC, i = idx % GV_KC;
        float v = 0.0f;
        if (m < rows && i < klen) v = x[m * K + kd_feature(perm, k0 + i)];
        xs[m][i] = v;
    }
    for (int i = threadIdx.x; i < GV_KC; i += blockDim.x)
        grp[i] = i >= klen ? 0 : (int)kd_group(g_idx, gs, k0 + i);
    __syncthreads();
}

template <int BITS, int MR>
__global__ void __launch_bounds__(GV_THREADS) k_gptq_gemv(const int32_t *qweight, const int32_t *qzeros,
                                                          const __half *scales, const int32_t *g_idx,
                                                          const int32_t *perm, int zero_offset, int64_t N, int64_t K,
                                                          int64_t gs, const float *x, int64_t rows, float *partial)
{
    __shared__ float xs[MR][GV_KC];
    __shared__ int grp[GV_KC];
    const int64_t k0 = (int64_t)blockIdx.y * GV_KC;
    const int klen = (int)(K - k0 < GV_KC ? K - k0 : GV_KC);
    kc_load_x<MR>(xs, grp, x, rows, K, k0, klen, perm, g_idx, gs);
    const int64_t n0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (n0 >= N) return;
    float acc[MR][4];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[m][c] = 0.0f;
    int gcur = -1;
    float s[4] = {0, 0, 0, 0}, z[4] = {0, 0, 0, 0};
    for (int kb = 0; kb < klen; kb += 32) {
        int4 W[BITS];
        const int32_t *base = qweight + ((k0 + kb) / 32 * BITS) * N + n0;
#pragma unroll
        for (int w = 0; w < BITS; w++) W[w] = __ldg(reinterpret_cast<const int4 *>(base + w * N));
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int g = grp[kb + j];
            if (g != gcur) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    s[c] = __half2float(scales[(int64_t)g * N + n0 + c]);
                    z[c] = (float)kd_gptq_zero(qzeros, N, BITS, zero_offset, g, n0 + c);
                }
                gcur = g;
            }
            const int wi = kd_block_word(BITS, j);
            float wv[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint32_t v = kd_block_value(i4c(W[wi], c), i4c(W[(wi + 1) % BITS], c), BITS, j);
                wv[c] = s[c] * ((float)v - z[c]);
            }
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float xv = xs[m][kb + j];
#pragma unroll
                for (int c = 0; c < 4; c++) acc[m][c] = fmaf(xv, wv[c], acc[m][c]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++)
        if (m < rows)
#pragma unroll
            for (int c = 0; c < 4; c++) partial[((int64_t)blockIdx.y * rows + m) * N + n0 + c] = acc[m][c];
}

template <int MR>
__global__ void __launch_bounds__(GV_THREADS) k_awq_gemv(const int32_t *qweight, const int32_t *qzeros,
                                                         const __half *scales, int64_t N, int64_t K, int64_t gs,
                                                         const float *x, int64_t rows, float *partial)
{
    __shared__ float xs[MR][GV_KC];
    __shared__ int grp[GV_KC];
    const int64_t k0 = (int64_t)blockIdx.y * GV_KC;
    const int klen = (int)(K - k0 < GV_KC ? K - k0 : GV_KC);
    kc_load_x<MR>(xs, grp, x, rows, K, k0, klen, NULL, NULL, gs);
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nw = N / 8;
    if (c >= nw) return;
    float acc[MR][8];
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int ch = 0; ch < 8; ch++) acc[m][ch] = 0.0f;
    int gcur = -1;
    float s[8], z[8];
    for (int i = 0; i < klen; i++) {
        const int g = grp[i];
        if (g != gcur) {
            const uint32_t zw = (uint32_t)qzeros[(int64_t)g * nw + c];
#pragma unroll
            for (int ch = 0; ch < 8; ch++) {
                s[ch] = __half2float(scales[(int64_t)g * N + 8 * c + ch]);
                z[ch] = (float)((zw >> kd_awq_shift(ch)) & 15u);
            }
            gcur = g;
        }
        const uint32_t wq = (uint32_t)__ldg(qweight + (k0 + i) * nw + c);
#pragma unroll
        for (int ch = 0; ch < 8; ch++) {
            const float wv = s[ch] * ((float)((wq >> kd_awq_shift(ch)) & 15u) - z[ch]);
#pragma unroll
            for (int m = 0; m < MR; m++) acc[m][ch] = fmaf(xs[m][i], wv, acc[m][ch]);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++)
        if (m < rows)
#pragma unroll
            for (int ch = 0; ch < 8; ch++) partial[((int64_t)blockIdx.y * rows + m) * N + 8 * c + ch] = acc[m][ch];
}

/* y[m][n] = sum over the K split of partial[ks][m][n], in ks order. */
__global__ void k_gemv_reduce(const float *partial, int ksplit, int64_t rows, int64_t N, float *y)
{
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= rows * N) return;
    float acc = 0.0f;
    for (int ks = 0; ks < ksplit; ks++) acc += partial[(int64_t)ks * rows * N + id];
    y[id] = acc;
}

/* ---- tensor-core GEMM ---------------------------------------------------------------- */

#define GM_BM KPLAN_GM_BM
#define GM_BN KPLAN_GM_BN
#define GM_BK KPLAN_GM_BK
#define GM_THREADS KPLAN_GM_THREADS

/* The weight tile of either kind of layout: B[kk][nn] = W[n][k] decoded, the input feature
 * a K-row multiplies, and which index adjacent threads should take (the one the codes run
 * along: N for the integer layouts, whose words are [K/32, N], K for the float grids). */
__device__ __forceinline__ float kc_weight(const kd_wdesc &d, int64_t k, int64_t n) { return kd_weight(&d, k, n); }
__device__ __forceinline__ float kc_weight(const kd_fdesc &d, int64_t k, int64_t n) { return kd_float_weight(&d, n, k); }
__device__ __forceinline__ const int32_t *kc_perm(const kd_wdesc &d) { return d.perm; }
__device__ __forceinline__ const int32_t *kc_perm(const kd_fdesc &) { return NULL; }
template <class D> struct kc_k_major { static const bool value = false; };
template <> struct kc_k_major<kd_fdesc> { static const bool value = true; };

template <class D>
__global__ void __launch_bounds__(GM_THREADS) k_gemm_wmma(D d, const float *x, int64_t rows, float *y)
{
    using namespace nvcuda;
    /* WMMA loads and stores need 256-bit aligned fragment pointers. */
    __shared__ __align__(32) __half As[GM_BM][GM_BK + 8];
    __shared__ __align__(32) __half Bs[GM_BK][GM_BN + 8];
    __shared__ __align__(32) float Cs[GM_BM][GM_BN + 4];
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    const int64_t m0 = (int64_t)blockIdx.y * GM_BM, n0 = (int64_t)blockIdx.x * GM_BN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int64_t k0 = 0; k0 < d.k; k0 += GM_BK) {
        for (int idx = tid; idx < GM_BM * GM_BK; idx += GM_THREADS) {
            const int r = idx / GM_BK, kk = idx % GM_BK;
            const int64_t m = m0 + r, k = k0 + kk;
            float v = 0.0f;
            if (m < rows && k < d.k) v = x[m * d.k + kd_feature(kc_perm(d), k)];
            As[r][kk] = __float2half_rn(v);
        }
        for (int idx = tid; idx < GM_BK * GM_BN; idx += GM_THREADS) {
            const bool km = kc_k_major<D>::value;
            const int kk = km ? idx % GM_BK : idx / GM_BN, nn = km ? idx / GM_BK : idx % GM_BN;
            const int64_t k = k0 + kk, n = n0 + nn;
            Bs[kk][nn] = __float2half_rn(k < d.k && n < d.n ? kc_weight(d, k, n) : 0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], GM_BK + 8);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[kk][wn * 32 + j * 16], GM_BN + 8);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], GM_BN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < GM_BM * GM_BN; idx += GM_THREADS) {
        const int r = idx / GM_BN, c = idx % GM_BN;
        const int64_t m = m0 + r, n = n0 + c;
        if (m < rows && n < d.n) y[m * d.n + n] = Cs[r][c];
    }
}

/* ---- float-grid GEMV ------------------------------------------------------------------ */

/* Group of K-index k: a shift for power-of-two group sizes (gs_shift >= 0), else a division;
 * 0 for one group (gs -1). */
__device__ __forceinline__ int64_t kc_fgroup(int64_t k, int64_t gs, int gs_shift)
{
    return gs_shift >= 0 ? (k >> gs_shift) : gs > 0 ? k / gs : 0;
}

/* y[m][n] = sum_k x[m][k] W[n][k] for rows m < rows <= MR, one warp per n. Needs K % 32 == 0
 * and a group size of -1 or a multiple of 8 (kernel_plan.c sends other weights to the
 * GEMM), so every 16-byte chunk is aligned and every 8 codes share one scale. */
template <int MR, bool FP4>
__global__ void __launch_bounds__(KPLAN_FV_THREADS) k_float_gemv(kd_fdesc d, int gs_shift, const float *x,
                                                                 int64_t rows, float *y)
{
    constexpr int VALS = FP4 ? 32 : 16;       /* codes per 16-byte chunk */
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * KPLAN_FV_ROWS + (threadIdx.x >> 5);
    if (n >= d.n) return;                     /* the whole warp: n is the warp's */
    const int64_t K = d.k, rowbytes = FP4 ? K / 2 : K, chunks = rowbytes / 16;
    const uint4 *codes = reinterpret_cast<const uint4 *>(d.fcodes + n * rowbytes);
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) acc[m] = 0.0f;
    int64_t gcur = -1;
    float s = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
        const uint4 q = __ldg(codes + c);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int sub = 0; sub < VALS / 8; sub++) {
            const int64_t k8 = c * VALS + sub * 8;
            const int64_t g = kc_fgroup(k8, d.gs, gs_shift);
            if (g != gcur) {
                s = kd_float_scale_g(&d, n, g);
                gcur = g;
            }
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t code = FP4 ? (w[sub] >> (4 * j)) & 15u : (w[sub * 2 + j / 4] >> (8 * (j % 4))) & 255u;
                v[j] = kd_float_value(FP4, code) * s;
            }
#pragma unroll
            for (int m = 0; m < MR; m++) {
                if (m >= rows) break;
                const float4 a = __ldg(reinterpret_cast<const float4 *>(x + m * K + k8));
                const float4 b = __ldg(reinterpret_cast<const float4 *>(x + m * K + k8 + 4));
                float t = acc[m];
                t = fmaf(a.x, v[0], t);
                t = fmaf(a.y, v[1], t);
                t = fmaf(a.z, v[2], t);
                t = fmaf(a.w, v[3], t);
                t = fmaf(b.x, v[4], t);
                t = fmaf(b.y, v[5], t);
                t = fmaf(b.z, v[6], t);
                t = fmaf(b.w, v[7], t);
                acc[m] = t;
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < MR; m++)
            if (m < rows) y[m * d.n + n] = acc[m];
}

/* ---- dispatch ------------------------------------------------------------------------ */

/* A failed launch: QD_EBACKEND naming the launch, file, line and device, and the backend
 * marked broken (the worker recycles itself). */
#define KC_FAIL(be, err, what) qd_backend_cuda_fail_err(be, err, what, cudaGetLastError(), __FILE__, __LINE__)

template <int MR>
static void kc_launch_gemv(const qd_kmat *m, const float *x, int64_t rows, float *partial, dim3 grid, cudaStream_t st)
{
    const __half *sc = reinterpret_cast<const __half *>(m->scales);
    const int32_t *gi = m->act_order ? m->g_idx : NULL;
    const int32_t *pm = m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL;
    if (m->layout == QD_KMAT_AWQ) {
        k_awq_gemv<MR><<<grid, GV_THREADS, 0, st>>>(m->qweight, m->qzeros, sc, m->n, m->k, m->group_size, x, rows,
                                                    partial);
        return;
    }
#define KC_GPTQ(B) k_gptq_gemv<B, MR><<<grid, GV_THREADS, 0, st>>>(m->qweight, m->qzeros, sc, gi, pm, m->zero_offset, \
                                                                   m->n, m->k, m->group_size, x, rows, partial)
    switch (m->bits) {
    case 2: KC_GPTQ(2); break;
    case 3: KC_GPTQ(3); break;
    case 4: KC_GPTQ(4); break;
    default: KC_GPTQ(8); break;
    }
#undef KC_GPTQ
}

template <int MR>
static void kc_launch_float_gemv(const kd_fdesc &d, int gs_shift, const float *x, int64_t rows, float *y, dim3 grid,
                                 cudaStream_t st)
{
    if (d.fp4) k_float_gemv<MR, true><<<grid, KPLAN_FV_THREADS, 0, st>>>(d, gs_shift, x, rows, y);
    else k_float_gemv<MR, false><<<grid, KPLAN_FV_THREADS, 0, st>>>(d, gs_shift, x, rows, y);
}

/* The float-grid matmul on the plan's path. */
static int kc_float_matmul(qd_backend *be, const qd_kmat *m, const qd_kplan *plan, const float *x, int64_t rows,
                           float *y, cudaStream_t st, qd_err *err)
{
    const kd_fdesc d = {m->fcodes, m->fscales, m->n, m->k, m->group_size, m->n_groups, m->row_block,
                        m->global_scale, m->grid == QD_GRID_FP4_E2M1, m->scale_rule == QD_SCALE_FP8_GLOBAL};
    if (!plan->gemv) {
        k_gemm_wmma<kd_fdesc><<<dim3(plan->grid_x, plan->grid_y), plan->threads, 0, st>>>(d, x, rows, y);
        if (cudaPeekAtLastError() != cudaSuccess) return KC_FAIL(be, err, "k_gemm_wmma (float) launch");
        return 0;
    }
    int gs_shift = -1;                        /* log2 of a power-of-two group size */
    if (m->group_size > 0 && !(m->group_size & (m->group_size - 1))) {
        gs_shift = 0;
        while (((int64_t)1 << gs_shift) < m->group_size) gs_shift++;
    }
    const dim3 grid(plan->grid_x, plan->grid_y);
    for (int64_t r0 = 0; r0 < rows; r0 += QD_KERNEL_GEMV_MAX_ROWS) {
        const int64_t mr = rows - r0 < QD_KERNEL_GEMV_MAX_ROWS ? rows - r0 : QD_KERNEL_GEMV_MAX_ROWS;
        const float *xr = x + r0 * m->k;
        float *yr = y + r0 * m->n;
        switch (qd_kplan_gemv_mr(mr)) {
        case 1: kc_launch_float_gemv<1>(d, gs_shift, xr, mr, yr, grid, st); break;
        case 2: kc_launch_float_gemv<2>(d, gs_shift, xr, mr, yr, grid, st); break;
        case 4: kc_launch_float_gemv<4>(d, gs_shift, xr, mr, yr, grid, st); break;
        default: kc_launch_float_gemv<8>(d, gs_shift, xr, mr, yr, grid, st); break;
        }
        if (cudaPeekAtLastError() != cudaSuccess) return KC_FAIL(be, err, "float GEMV launch");
    }
    return 0;
}

extern "C" int qd_kcuda_matmul(qd_backend *be, const qd_kmat *m, const float *x, int64_t rows, float *y,
                               qd_kpath path, qd_err *err)
{
    if (rows < 0 || (rows > 0 && (!x || !y)))
        return qd_err_set(err, QD_EINVAL, "cuda kernel: bad input (rows %lld)", (long long)rows);
    if (rows == 0) return 0;
    qd_kplan plan;
    int rc = qd_kplan_make(m, rows, path, &plan, err);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)qd_backend_cuda_stream(be);
    if (m->layout == QD_KMAT_FLOAT) return kc_float_matmul(be, m, &plan, x, rows, y, st, err);
    const int64_t N = m->n, K = m->k;
    if (!plan.gemv) {
        kd_wdesc d = {m->qweight, m->qzeros, m->scales, m->act_order ? m->g_idx : NULL,
                      m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL, N, K, m->group_size, m->bits,
                      m->zero_offset, m->layout == QD_KMAT_AWQ};
        k_gemm_wmma<kd_wdesc><<<dim3(plan.grid_x, plan.grid_y), plan.threads, 0, st>>>(d, x, rows, y);
        if (cudaPeekAtLastError() != cudaSuccess) return KC_FAIL(be, err, "k_gemm_wmma launch");
        return 0;
    }
    float *partial = (float *)qd_backend_cuda_scratch(be, plan.workspace_bytes);
    if (!partial) return qd_err_set(err, QD_ENOMEM, "cuda kernel: %s", be->err.msg);
    const dim3 grid(plan.grid_x, plan.grid_y);
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += QD_KERNEL_GEMV_MAX_ROWS) {
        const int64_t mr = rows - r0 < QD_KERNEL_GEMV_MAX_ROWS ? rows - r0 : QD_KERNEL_GEMV_MAX_ROWS;
        const float *xr = x + r0 * K;
        switch (qd_kplan_gemv_mr(mr)) {
        case 1: kc_launch_gemv<1>(m, xr, mr, partial, grid, st); break;
        case 2: kc_launch_gemv<2>(m, xr, mr, partial, grid, st); break;
        case 4: kc_launch_gemv<4>(m, xr, mr, partial, grid, st); break;
        default: kc_launch_gemv<8>(m, xr, mr, partial, grid, st); break;
        }
        if (cudaPeekAtLastError() != cudaSuccess) { rc = KC_FAIL(be, err, "dequantizing GEMV launch"); break; }
        k_gemv_reduce<<<(unsigned)((mr * N + KPLAN_REDUCE_THREADS - 1) / KPLAN_REDUCE_THREADS), KPLAN_REDUCE_THREADS,
                        0, st>>>(partial, plan.ksplit, mr, N, y + r0 * N);
        if (cudaPeekAtLastError() != cudaSuccess) rc = KC_FAIL(be, err, "GEMV reduction launch");
    }
    qd_backend_free(be, partial);
    return rc;
}
