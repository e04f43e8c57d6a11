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
 * These kernels have been compiled but, at the time of writing, not yet run on a GPU:
 * tests/unit/test_backend_cuda.c and `quantctl selftest --device cuda:0` check them. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

/* The C headers declare C functions (qd_err_set, ...): give them C linkage here. */
extern "C" {
#include "quant/core/error.h"
#include "quant/kernels/kernels.h"
int kmat_validate(const qd_kmat *m, qd_err *err);   /* kernel_ref.c */
}
#include "quant/backend/cuda/cuda_internal.h"
#include "quant/kernels/cuda/kcuda.h"

#define GV_THREADS 128
#define GV_KC 256              /* K-rows per GEMV block (a multiple of 32) */

__device__ __forceinline__ uint32_t i4c(const int4 &v, int c)
{
    return (uint32_t)(c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w);
}

/* Value idx of a packed little-endian bit stream of `bits`-bit values (qzeros rows). */
__device__ __forceinline__ int32_t kc_bits_get(const int32_t *words, int bits, int64_t idx)
{
    int64_t pos = (int64_t)bits * idx;
    int64_t w = pos >> 5;
    int off = (int)(pos & 31);
    uint32_t v = (uint32_t)words[w] >> off;
    if (off + bits > 32) v |= (uint32_t)words[w + 1] << (32 - off);
    return (int32_t)(v & ((1u << bits) - 1u));
}

__device__ __constant__ int kc_awq_nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* x slice [MR][GV_KC] of rows, through perm, zero-padded; and the group of each K-row. */
template <int MR>
__device__ void kc_load_x(float (*xs)[GV_KC], int *grp, const float *x, int64_t rows, int64_t K, int64_t k0,
                          int klen, const int32_t *perm, const int32_t *g_idx, int64_t gs)
{
    for (int idx = threadIdx.x; idx < MR * GV_KC; idx += blockDim.x) {
        int m = idx / GV_KC, i = idx % GV_KC;
        float v = 0.0f;
        if (m < rows && i < klen) v = x[m * K + (perm ? perm[k0 + i] : k0 + i)];
        xs[m][i] = v;
    }
    for (int i = threadIdx.x; i < GV_KC; i += blockDim.x)
        grp[i] = i >= klen ? 0 : g_idx ? g_idx[k0 + i] : gs > 0 ? (int)((k0 + i) / gs) : 0;
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
    const int64_t nw = N * BITS / 32;
    const uint32_t mask = (1u << BITS) - 1u;
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
                    z[c] = (float)(kc_bits_get(qzeros + (int64_t)g * nw, BITS, n0 + c) + zero_offset);
                }
                gcur = g;
            }
            const int pos = BITS * j, wi = pos >> 5, off = pos & 31;
            float wv[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                uint32_t v = i4c(W[wi], c) >> off;
                if (off + BITS > 32) v |= i4c(W[(wi + 1) % BITS], c) << ((32 - off) & 31);
                wv[c] = s[c] * ((float)(v & mask) - z[c]);
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
                z[ch] = (float)((zw >> (4 * kc_awq_nib[ch])) & 15u);
            }
            gcur = g;
        }
        const uint32_t wq = (uint32_t)__ldg(qweight + (k0 + i) * nw + c);
#pragma unroll
        for (int ch = 0; ch < 8; ch++) {
            const float wv = s[ch] * ((float)((wq >> (4 * kc_awq_nib[ch])) & 15u) - z[ch]);
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

#define GM_BM 64
#define GM_BN 64
#define GM_BK 32
#define GM_THREADS 128

struct kc_wdesc {
    const int32_t *qweight, *qzeros, *g_idx, *perm;
    const __half *scales;
    int64_t N, K, gs;
    int bits, zero_offset, awq;
};

/* Dequantized weight of qweight row k, column n (the reference's decode, one value). */
__device__ __forceinline__ float kc_weight(const kc_wdesc &d, int64_t k, int64_t n)
{
    const int64_t g = d.g_idx ? d.g_idx[k] : d.gs > 0 ? k / d.gs : 0;
    const float s = __half2float(d.scales[g * d.N + n]);
    if (d.awq) {
        const int sh = 4 * kc_awq_nib[n & 7];
        const int64_t nw = d.N / 8;
        const float q = (float)(((uint32_t)d.qweight[k * nw + n / 8] >> sh) & 15u);
        const float z = (float)(((uint32_t)d.qzeros[g * nw + n / 8] >> sh) & 15u);
        return s * (q - z);
    }
    const int64_t blk = k / 32, j = k % 32, pos = (int64_t)d.bits * j, w = pos >> 5;
    const int off = (int)(pos & 31);
    const int32_t *col = d.qweight + blk * d.bits * d.N + n;
    uint32_t v = (uint32_t)col[w * d.N] >> off;
    if (off + d.bits > 32) v |= (uint32_t)col[(w + 1) * d.N] << (32 - off);
    v &= (1u << d.bits) - 1u;
    const float z = (float)(kc_bits_get(d.qzeros + g * (d.N * d.bits / 32), d.bits, n) + d.zero_offset);
    return s * ((float)v - z);
}

__global__ void __launch_bounds__(GM_THREADS) k_gemm_wmma(kc_wdesc d, const float *x, int64_t rows, float *y)
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
    for (int64_t k0 = 0; k0 < d.K; k0 += GM_BK) {
        for (int idx = tid; idx < GM_BM * GM_BK; idx += GM_THREADS) {
            const int r = idx / GM_BK, kk = idx % GM_BK;
            const int64_t m = m0 + r, k = k0 + kk;
            float v = 0.0f;
            if (m < rows && k < d.K) v = x[m * d.K + (d.perm ? d.perm[k] : k)];
            As[r][kk] = __float2half_rn(v);
        }
        for (int idx = tid; idx < GM_BK * GM_BN; idx += GM_THREADS) {
            const int kk = idx / GM_BN, nn = idx % GM_BN;     /* adjacent threads: adjacent columns */
            const int64_t k = k0 + kk, n = n0 + nn;
            Bs[kk][nn] = __float2half_rn(k < d.K && n < d.N ? kc_weight(d, k, n) : 0.0f);
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
        if (m < rows && n < d.N) y[m * d.N + n] = Cs[r][c];
    }
}

/* ---- dispatch ------------------------------------------------------------------------ */

#define KC_FAIL(be, err, what)                                                                          \
    qd_err_set(err, QD_EBACKEND, "cuda:%d: %s failed: %s (%s:%d)", (be)->device, what,                  \
               cudaGetErrorString(cudaGetLastError()), __FILE__, __LINE__)

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

extern "C" int qd_kcuda_matmul(qd_backend *be, const qd_kmat *m, const float *x, int64_t rows, float *y,
                               qd_kpath path, qd_err *err)
{
    int rc = kmat_validate(m, err);
    if (rc) return rc;
    if (rows < 0 || (rows > 0 && (!x || !y)))
        return qd_err_set(err, QD_EINVAL, "cuda kernel: bad input (rows %lld)", (long long)rows);
    if (rows == 0) return 0;
    cudaStream_t st = (cudaStream_t)qd_backend_cuda_stream(be);
    const int64_t N = m->n, K = m->k;
    const int gemv = path == QD_KPATH_GEMV || (path == QD_KPATH_AUTO && rows <= QD_KERNEL_GEMV_MAX_ROWS);
    if (!gemv) {
        kc_wdesc d = {m->qweight, m->qzeros, m->act_order ? m->g_idx : NULL,
                      m->layout == QD_KMAT_GPTQ_REORDERED ? m->perm : NULL,
                      reinterpret_cast<const __half *>(m->scales), N, K, m->group_size, m->bits, m->zero_offset,
                      m->layout == QD_KMAT_AWQ};
        dim3 grid((unsigned)((N + GM_BN - 1) / GM_BN), (unsigned)((rows + GM_BM - 1) / GM_BM));
        k_gemm_wmma<<<grid, GM_THREADS, 0, st>>>(d, x, rows, y);
        if (cudaPeekAtLastError() != cudaSuccess) return KC_FAIL(be, err, "k_gemm_wmma launch");
        return 0;
    }
    const int ksplit = (int)((K + GV_KC - 1) / GV_KC);
    const int64_t mr_max = rows < QD_KERNEL_GEMV_MAX_ROWS ? rows : QD_KERNEL_GEMV_MAX_ROWS;
    float *partial = (float *)qd_backend_cuda_scratch(be, (size_t)ksplit * (size_t)mr_max * (size_t)N * sizeof(float));
    if (!partial) return qd_err_set(err, QD_ENOMEM, "cuda kernel: %s", be->err.msg);
    const int64_t cols_per_block = m->layout == QD_KMAT_AWQ ? 8 * GV_THREADS : 4 * GV_THREADS;
    dim3 grid((unsigned)((N + cols_per_block - 1) / cols_per_block), (unsigned)ksplit);
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += QD_KERNEL_GEMV_MAX_ROWS) {
        const int64_t mr = rows - r0 < QD_KERNEL_GEMV_MAX_ROWS ? rows - r0 : QD_KERNEL_GEMV_MAX_ROWS;
        const float *xr = x + r0 * K;
        if (mr == 1) kc_launch_gemv<1>(m, xr, mr, partial, grid, st);
        else if (mr == 2) kc_launch_gemv<2>(m, xr, mr, partial, grid, st);
        else if (mr <= 4) kc_launch_gemv<4>(m, xr, mr, partial, grid, st);
        else kc_launch_gemv<8>(m, xr, mr, partial, grid, st);
        if (cudaPeekAtLastError() != cudaSuccess) { rc = KC_FAIL(be, err, "dequantizing GEMV launch"); break; }
        k_gemv_reduce<<<(unsigned)((mr * N + 255) / 256), 256, 0, st>>>(partial, ksplit, mr, N, y + r0 * N);
        if (cudaPeekAtLastError() != cudaSuccess) rc = KC_FAIL(be, err, "GEMV reduction launch");
    }
    qd_backend_free(be, partial);
    return rc;
}
