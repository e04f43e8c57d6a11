/* The CUDA backend's attention (cuda_attention.h): per chunk of quant/backend/attn_plan.h,
 * S = scale Q K^T by one strided-batched SGEMM per query head over the chunk's sequences,
 * one softmax block per row of S, then O = P V the same way, written straight into the
 * op's output rows. It follows the CPU backend's F32 attention (cpu_nn.c) step by step: the
 * scale as the GEMM's alpha, the soft-cap on the scaled scores, the row maximum
 * subtracted, the sum in double, P normalised before P V. Grouped-query heads read their kv
 * head through the offsets, so K and V are never copied. The GEMMs run in the handle's
 * PEDANTIC mode (F32 products, no TF32), as the other F32 products of this backend do. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "quant/backend/attn_plan.h"
#include "quant/backend/backend.h"
#include "quant/core/error.h"
}
#include "quant/backend/cuda/cuda_attention.h"
#include "quant/backend/cuda/cuda_internal.h"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)

__device__ static float attn_block_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = sh[0];
    for (int w = 1; w < ATTN_WARPS; w++) v = fmaxf(v, sh[w]);
    __syncthreads();
    return v;
}

/* A fixed order (lanes, then warps in turn): the same sum on every run. */
__device__ static double attn_block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = sh[0];
    for (int w = 1; w < ATTN_WARPS; w++) v += sh[w];
    __syncthreads();
    return v;
}

/* One block per row of the chunk's S (rows x keys per matrix, matrices back to back): query
 * row qi = r0 + (row % rows) sees keys [lo, qi] (qd_attn_key_range), columns [lo - k0,
 * qi + 1 - k0) of its row; the others become 0, so P V ignores them. Every row sees at
 * least its own key, so no row is fully masked. */
__global__ void k_attn_softmax(float *s, int64_t rows, int64_t keys, int64_t r0, int64_t k0, int64_t window,
                               float softcap, const float *sinks, int64_t h0, int64_t nb, const uint8_t *keep,
                               int64_t seq, int64_t b0)
{
    __shared__ float shf[ATTN_WARPS];
    __shared__ double shd[ATTN_WARPS];
    const int64_t t = blockIdx.x, qi = r0 + t % rows;
    float *row = s + t * keys;
    const int64_t lo = window > 0 && qi + 1 > window ? qi + 1 - window : 0;   /* qd_attn_key_range */
    const int64_t c0 = lo - k0, c1 = qi + 1 - k0;
    /* gpt-oss: the head's sink joins the max and the sum (matrix t / rows is head h0 + it / nb). */
    const float sink = sinks ? sinks[h0 + (t / rows) / nb] : -INFINITY;
    /* DeepSeek-V3.2 (attention_keep): the keys its indexer left out weigh exactly 0 (sequence
     * b0 + (t / rows) % nb); the row keeps one or more, so the max stays finite. */
    const uint8_t *kr = keep ? keep + ((b0 + (t / rows) % nb) * seq + qi) * seq : NULL;
    float mx = sink;
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        float x = row[c];
        if (softcap > 0.0f) x = tanhf(x / softcap) * softcap;   /* Gemma 2 */
        if (kr && !kr[k0 + c]) x = -INFINITY;
        row[c] = x;
        mx = fmaxf(mx, x);
    }
    mx = attn_block_max(mx, shf);
    double sum = 0.0;
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        float e = expf(row[c] - mx);
        row[c] = e;
        sum += e;
    }
    sum = attn_block_sum(sum, shd);                         /* also orders the row writes */
    if (sinks) sum += (double)expf(sink - mx);
    const float inv = (float)(1.0 / sum);
    for (int64_t c = threadIdx.x; c < keys; c += blockDim.x) row[c] = c >= c0 && c < c1 ? row[c] * inv : 0.0f;
}

static int attn_fail(qd_backend *be, const char *call, const char *what, int line)
{
    be->broken = 1;
    return qd_err_set(&be->err, QD_EBACKEND, "cuda:%d: %s failed: %s (%s:%d)", be->device, call, what, __FILE__,
                      line);
}

/* A GEMM of the plan (qd_attn_gemm_qk / _pv, tested on the host) on cuBLAS. */
static cublasStatus_t attn_gemm(cublasHandle_t blas, const qd_attn_gemm *g, float alpha, const float *a,
                                const float *b, float *c)
{
    const float zero = 0.0f;
    return cublasSgemmStridedBatched(blas, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->m, (int)g->n, (int)g->k, &alpha,
                                     a + g->a_off, (int)g->lda, (long long)g->stride_a, b + g->b_off, (int)g->ldb,
                                     (long long)g->stride_b, &zero, c + g->c_off, (int)g->ldc, (long long)g->stride_c,
                                     (int)g->batch);
}

/* One chunk: its Q K^T GEMMs, the softmax, its P V GEMMs. */
static int attn_chunk(qd_backend *be, cublasHandle_t blas, cudaStream_t stream, const qd_attn_plan *p,
                      const qd_attn_chunk *c, float *ws, float *out, const float *q, const float *k, const float *v,
                      float scale, float softcap, const float *sinks, const uint8_t *keep, int64_t seq)
{
    qd_attn_gemm g;
    for (int64_t hh = 0; hh < c->nh; hh++) {
        qd_attn_gemm_qk(p, c, hh, &g);
        cublasStatus_t st = attn_gemm(blas, &g, scale, k, q, ws);
        if (st != CUBLAS_STATUS_SUCCESS)
            return attn_fail(be, "cublasSgemmStridedBatched (Q K^T)", cublasGetStatusString(st), __LINE__);
    }
    k_attn_softmax<<<(unsigned)(c->nh * c->nb * c->rows), ATTN_THREADS, 0, stream>>>(ws, c->rows, c->keys, c->r0,
                                                                                      c->k0, p->window, softcap,
                                                                                      sinks, c->h0, c->nb, keep, seq,
                                                                                      c->b0);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return attn_fail(be, "attention softmax kernel", cudaGetErrorString(e), __LINE__);
    for (int64_t hh = 0; hh < c->nh; hh++) {
        qd_attn_gemm_pv(p, c, hh, &g);
        cublasStatus_t st = attn_gemm(blas, &g, 1.0f, v, ws, out);
        if (st != CUBLAS_STATUS_SUCCESS)
            return attn_fail(be, "cublasSgemmStridedBatched (P V)", cublasGetStatusString(st), __LINE__);
    }
    return 0;
}

static int attn_run(qd_backend *be, void *blas, float *out, const float *q, const float *k, const float *v,
                    int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale, int64_t window,
                    float softcap, const float *sinks, const uint8_t *keep)
{
    qd_attn_plan p;
    const char *why = NULL;
    if (qd_attn_plan_make(&p, batch, seq, n_heads, n_kv, hd, window, QD_ATTN_WORKSPACE_DEFAULT, &why))
        return qd_err_set(&be->err, QD_EINVAL, "%s (n_heads %lld, n_kv %lld, head_dim %lld, seq %lld, batch %lld)",
                          why, (long long)n_heads, (long long)n_kv, (long long)hd, (long long)seq, (long long)batch);
    int64_t n = qd_attn_plan_chunks(&p);
    if (n == 0) return 0;
    cudaStream_t stream = (cudaStream_t)qd_backend_cuda_stream(be);
    float *ws = (float *)qd_backend_cuda_scratch(be, p.ws_bytes);
    if (!ws) return be->err.code;
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        qd_attn_chunk c;
        qd_attn_plan_chunk(&p, i, &c);
        rc = attn_chunk(be, (cublasHandle_t)blas, stream, &p, &c, ws, out, q, k, v, scale, softcap, sinks, keep, seq);
    }
    (void)cudaFreeAsync(ws, stream);
    return rc;
}

extern "C" int qd_backend_cuda_attention(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                                         const float *v, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv,
                                         int64_t hd, float scale, int64_t window, float softcap)
{
    return attn_run(be, blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window, softcap, NULL, NULL);
}

extern "C" int qd_backend_cuda_attention_sink(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                                              const float *v, int64_t batch, int64_t seq, int64_t n_heads,
                                              int64_t n_kv, int64_t hd, float scale, int64_t window,
                                              const float *sinks)
{
    return attn_run(be, blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window, 0.0f, sinks, NULL);
}

extern "C" int qd_backend_cuda_attention_keep(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                                              const float *v, int64_t batch, int64_t seq, int64_t n_heads,
                                              int64_t n_kv, int64_t hd, float scale, const uint8_t *keep)
{
    return attn_run(be, blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, 0, 0.0f, NULL, keep);
}
