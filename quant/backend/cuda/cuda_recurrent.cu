/* Device kernels of the recurrent mixers (launchers in cuda_internal.h): the causal
 * depthwise short conv (one thread per (sequence, channel, token), the sum in double as the
 * CPU reference) and the gated delta rule (one thread block per (sequence, value head), one
 * thread per value column holding its column of the state S [dk, dv] in registers; the
 * token's q and k are normalised by every thread from shared memory, so no reduction order
 * depends on the launch). The state is float here, double on the CPU: both round around the
 * same recurrence. And the sigmoid output gate of gated attention. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "quant/backend/backend.h"
}
#include "quant/backend/cuda/cuda_internal.h"

#define RC_THREADS 256

static int rc_launched(void) { return (int)cudaGetLastError(); }

__global__ void k_sigmoid_mul(float *out, const float *gate, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}

extern "C" int cudaop_sigmoid_mul(void *stream, float *out, const float *gate, const float *x, int64_t n)
{
    if (n <= 0) return 0;
    int64_t blocks = (n + RC_THREADS - 1) / RC_THREADS;
    if (blocks > 65535 * 32) blocks = 65535 * 32;
    k_sigmoid_mul<<<(unsigned)blocks, RC_THREADS, 0, (cudaStream_t)stream>>>(out, gate, x, n);
    return rc_launched();
}

__device__ static float rc_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Block (s, h): blockDim.x >= dv threads, shared q, k [dk] each. */
__global__ void k_gated_delta_rule(float *out, const float *qkv, int64_t ld_qkv, const float *b, const float *a,
                                   int64_t ld_ba, const float *a_log, const float *dt_bias, int64_t seq, int64_t nk,
                                   int64_t nv, int64_t dk, int64_t dv)
{
    __shared__ float q[QD_GDN_MAX_DK], k[QD_GDN_MAX_DK];
    int64_t s = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), kd = nk * dk;
    int64_t e = threadIdx.x;
    float S[QD_GDN_MAX_DK];
    for (int64_t j = 0; j < dk; j++) S[j] = 0.0f;
    float A = expf(a_log[h]), qs = (float)(1.0 / sqrt((double)dk));
    for (int64_t i = 0; i < seq; i++) {
        int64_t r = s * seq + i;
        const float *row = qkv + r * ld_qkv;
        for (int64_t j = threadIdx.x; j < dk; j += blockDim.x) {
            q[j] = row[kh * dk + j];
            k[j] = row[kd + kh * dk + j];
        }
        __syncthreads();
        double sq = 0.0, sk = 0.0;
        for (int64_t j = 0; j < dk; j++) { sq += (double)q[j] * q[j]; sk += (double)k[j] * k[j]; }
        float iq = (float)(1.0 / sqrt((double)(float)sq + 1e-6)) , ik = (float)(1.0 / sqrt((double)(float)sk + 1e-6));
        float beta = 1.0f / (1.0f + expf(-b[r * ld_ba + h]));
        float decay = expf(-A * rc_softplus(a[r * ld_ba + h] + dt_bias[h]));
        if (e < dv) {
            float kv = 0.0f;
            for (int64_t j = 0; j < dk; j++) {
                S[j] *= decay;
                kv += S[j] * (k[j] * ik);
            }
            float delta = (row[2 * kd + h * dv + e] - kv) * beta, acc = 0.0f;
            for (int64_t j = 0; j < dk; j++) {
                S[j] += (k[j] * ik) * delta;
                acc += S[j] * ((q[j] * iq) * qs);
            }
            out[r * (nv * dv) + h * dv + e] = acc;
        }
        __syncthreads();   /* q and k are rewritten for the next token */
    }
}

extern "C" int cudaop_gated_delta_rule(void *stream, float *out, const float *qkv, int64_t ld_qkv, const float *b,
                                       const float *a, int64_t ld_ba, const float *a_log, const float *dt_bias,
                                       int64_t batch, int64_t seq, int64_t nk, int64_t nv, int64_t dk, int64_t dv)
{
    if (batch <= 0 || seq <= 0) return 0;
    int threads = (int)((dv + 31) / 32 * 32);
    k_gated_delta_rule<<<(unsigned)(batch * nv), (unsigned)threads, 0, (cudaStream_t)stream>>>(
        out, qkv, ld_qkv, b, a, ld_ba, a_log, dt_bias, seq, nk, nv, dk, dv);
    return rc_launched();
}
