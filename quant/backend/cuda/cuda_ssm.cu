/* Device kernels of the recurrent mixers' ops (backend.h conv1d_causal, ssd_scan), mirroring
 * the CPU reference (quant/backend/cpu/cpu_ssm.c) operation by operation: the convolution
 * one output element a thread, the scan one row of a head's state a thread, walking the
 * sequence in order as the reference does. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "quant/backend/cuda/cuda_internal.h"

#define SSM_THREADS 256

static unsigned ssm_blocks(int64_t n)
{
    int64_t b = (n + SSM_THREADS - 1) / SSM_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 32 ? 65535 * 32 : b);
}

__global__ static void k_conv1d_causal(float *y, const float *x, const float *gi, const float *go, int64_t ld,
                                       int64_t rows, int64_t seq, int64_t ch, const float *w, const float *bias,
                                       int64_t kernel, int silu)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * ch; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / ch, c = e % ch, t = r % seq;
        double sum = bias ? (double)bias[c] : 0.0;
        for (int64_t j = 0; j < kernel; j++) {
            int64_t back = kernel - 1 - j;
            if (back > t) continue;
            int64_t src = (r - back) * ld + c;
            float u = gi ? __fmul_rn(x[src], gi[src]) : x[src];
            sum = __dadd_rn(sum, __dmul_rn((double)w[c * kernel + j], (double)u));
        }
        float acc = (float)sum;
        if (silu) acc = acc / (1.0f + expf(-acc));
        if (go) acc = __fmul_rn(acc, go[r * ld + c]);
        y[e] = acc;
    }
}

extern "C" int cudaop_conv1d_causal(void *stream, float *y, const float *x, const float *gate_in, const float *gate_out,
                                    int64_t ld, int64_t batch, int64_t seq, int64_t ch, const float *w, const float *bias,
                                    int64_t kernel, int silu)
{
    int64_t n = batch * seq * ch;
    if (n <= 0) return 0;
    k_conv1d_causal<<<ssm_blocks(n), SSM_THREADS, 0, (cudaStream_t)stream>>>(y, x, gate_in, gate_out, ld, batch * seq,
                                                                              seq, ch, w, bias, kernel, silu);
    return (int)cudaGetLastError();
}

__device__ static float ssm_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* One thread per (sequence, head, state row i): S[i, :] lives in registers / local memory. */
__global__ static void k_ssd_scan(float *y, const float *x, const float *b, const float *c, int64_t ld, const float *dt,
                                  int64_t ld_dt, const float *z, int64_t ld_z, const float *a, const float *d,
                                  const float *dt_bias, float dt_min, float dt_max, int64_t batch, int64_t seq,
                                  int64_t n_heads, int64_t p, int64_t n_groups, int64_t n)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < batch * n_heads * p;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e % p, h = (e / p) % n_heads, bi = e / (p * n_heads), g = h / (n_heads / n_groups);
        float st[CUDAOP_SSD_MAX_STATE];
        for (int64_t k = 0; k < n; k++) st[k] = 0.0f;
        for (int64_t t = 0; t < seq; t++) {
            int64_t r = bi * seq + t;
            float dv = ssm_softplus(__fadd_rn(dt[r * ld_dt + h], dt_bias[h]));
            dv = dv < dt_min ? dt_min : dv > dt_max ? dt_max : dv;
            float decay = expf(__fmul_rn(dv, a[h]));
            float xv = x[r * ld + h * p + i], xd = __fmul_rn(xv, dv), acc = 0.0f;
            const float *br = b + r * ld + g * n, *cr = c + r * ld + g * n;
            for (int64_t k = 0; k < n; k++) {
                st[k] = __fadd_rn(__fmul_rn(st[k], decay), __fmul_rn(xd, br[k]));
                acc = __fadd_rn(acc, __fmul_rn(st[k], cr[k]));
            }
            float v = __fadd_rn(acc, __fmul_rn(d[h], xv));
            if (z) {
                float zv = z[r * ld_z + h * p + i];
                v = __fmul_rn(v, zv / (1.0f + expf(-zv)));
            }
            y[r * (n_heads * p) + h * p + i] = v;
        }
    }
}

extern "C" int cudaop_ssd_scan(void *stream, float *y, const float *x, const float *b, const float *c, int64_t ld,
                               const float *dt, int64_t ld_dt, const float *z, int64_t ld_z, const float *a,
                               const float *d, const float *dt_bias, float dt_min, float dt_max, int64_t batch,
                               int64_t seq, int64_t n_heads, int64_t head_dim, int64_t n_groups, int64_t d_state)
{
    int64_t n = batch * n_heads * head_dim;
    if (n <= 0 || seq <= 0) return 0;
    if (d_state > CUDAOP_SSD_MAX_STATE) return (int)cudaErrorInvalidValue;
    k_ssd_scan<<<ssm_blocks(n), SSM_THREADS, 0, (cudaStream_t)stream>>>(y, x, b, c, ld, dt, ld_dt, z, ld_z, a, d, dt_bias,
                                                                         dt_min, dt_max, batch, seq, n_heads, head_dim,
                                                                         n_groups, d_state);
    return (int)cudaGetLastError();
}
