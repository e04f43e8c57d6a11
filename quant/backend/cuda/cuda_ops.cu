/* Device kernels of the CUDA backend (launchers declared in cuda_internal.h): the GPTQ
 * block loop, fake quantization, column scaling, reductions, norms, RoPE,
 * activations, row gather / scatter-add and per-row NLL. They mirror the CPU backend (the reference) operation by
 * operation: the quantizer uses IEEE division and round-half-even like qd_quant_code, the
 * GPTQ in-block update is written with __fmul_rn/__fsub_rn so nvcc does not contract it into
 * an FMA the reference does not have, and the reductions that decide accuracy accumulate in
 * double in a fixed order, so results do not vary from run to run. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "quant/backend/backend.h"
#include "quant/backend/backend_args.h"
}
#include "quant/core/minifloat.h"
#include "quant/formats/grid.h"
#include "quant/backend/cuda/cuda_internal.h"

#define OP_THREADS 256

static unsigned op_blocks(int64_t n)
{
    int64_t b = (n + OP_THREADS - 1) / OP_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 32 ? 65535 * 32 : b);
}

static int op_launched(void) { return (int)cudaGetLastError(); }

/* ---- quantizer (device copy of quant/formats/quantizer.c) ------------------------------- */

__device__ static float dq_scale_to_f16(float s)
{
    float r = __half2float(__float2half_rn(s));
    if (r <= 0.0f) r = __half2float(__ushort_as_half((unsigned short)0x0001));
    if (isinf(r)) r = __half2float(__ushort_as_half((unsigned short)0x7bff));
    return r;
}

/* A float grid's scale from the group's largest magnitude (quantizer.c float_grid_scale). */
__device__ static float dq_float_scale(const cudaop_qcfg &c, float a)
{
    if (c.scale_rule == QD_SCALE_FP8_GLOBAL) {
        float s = qd_f32_round_fp8_e4m3(__fmul_rn(c.global_scale, __fdiv_rn(a, QD_FP4_E2M1_MAX)));
        return s > 0.0f ? s : qd_fp8_e4m3_to_f32(0x01);
    }
    if (c.scale_rule == QD_SCALE_E8M0) {
        if (!(a > 0.0f)) return qd_e8m0_to_f32(0);
        int e;
        float m = frexpf(a, &e);
        e -= 1;
        if (2.0f * m >= 1.75f) e += 1;
        e -= 2;
        e = e < -127 ? -127 : e > 127 ? 127 : e;
        return qd_e8m0_to_f32((uint8_t)(e + 127));
    }
    float s = __fdiv_rn(a, QD_FP8_E4M3_MAX);
    return s > 0.0f ? s : 0x1p-126f;
}

/* qd_quant_params_range: a group's parameters from its range, with c.clip_ratio applied. */
__device__ static void dq_params_range(const cudaop_qcfg &c, float xmin, float xmax, float *scale, float *zero)
{
    const int maxq = (1 << c.bits) - 1;
    if (c.grid != QD_GRID_INT) {
        float a = fabsf(xmin) > xmax ? fabsf(xmin) : xmax;
        if (c.clip_ratio > 0.0f && c.clip_ratio < 1.0f) a = __fmul_rn(a, c.clip_ratio);
        *scale = dq_float_scale(c, a);
        *zero = 0.0f;
        return;
    }
    if (c.sym) {
        float a = fabsf(xmin) > xmax ? fabsf(xmin) : xmax;
        xmax = a;
        xmin = -a;
    }
    if (c.clip_ratio > 0.0f && c.clip_ratio < 1.0f) {
        xmin = __fmul_rn(xmin, c.clip_ratio);
        xmax = __fmul_rn(xmax, c.clip_ratio);
    }
    if (xmin == xmax) {
        xmin = -1.0f;
        xmax = 1.0f;
    }
    float s = __fdiv_rn(xmax - xmin, (float)maxq);
    if (c.f16_scales) s = dq_scale_to_f16(s);
    float z;
    if (c.sym) {
        z = (float)((maxq + 1) / 2);
    } else {
        z = rintf(__fdiv_rn(-xmin, s));
        z = z < 0.0f ? 0.0f : z > (float)maxq ? (float)maxq : z;
        if (c.zero_min1 && z < 1.0f) {
            z = 1.0f;
            s = __fdiv_rn(xmax, (float)(maxq - 1));
            if (c.f16_scales) {
                s = dq_scale_to_f16(s);
                if (s * (float)(maxq - 1) < xmax) {
                    unsigned short h = __half_as_ushort(__float2half_rn(s));
                    if (h < 0x7bff) s = __half2float(__ushort_as_half((unsigned short)(h + 1)));
                }
            }
        }
    }
    *scale = s;
    *zero = z;
}

/* The group's range as qd_quant_params finds it (0 always inside it). */
__device__ static void dq_range(const float *w, int64_t n, float *xmin, float *xmax)
{
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = w[i];
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    *xmin = lo;
    *xmax = hi;
}

__device__ static void dq_params(const cudaop_qcfg &c, const float *w, int64_t n, float *scale, float *zero)
{
    float xmin, xmax;
    dq_range(w, n, &xmin, &xmax);
    dq_params_range(c, xmin, xmax, scale, zero);
}

__device__ static int dq_code(float w, float s, float z, int maxq)
{
    float v = rintf(__fdiv_rn(w, s)) + z;
    return v < 0.0f ? 0 : v > (float)maxq ? maxq : (int)v;
}

__device__ static float dq_dequant(int q, float s, float z) { return __fmul_rn(s, (float)q - z); }

/* The same on the configured grid (quantizer.h qd_quant_code_cfg / qd_quant_dequant_cfg). */
__device__ static float dq_scale_eff(const cudaop_qcfg &c, float s)
{
    return c.scale_rule == QD_SCALE_FP8_GLOBAL ? __fdiv_rn(s, c.global_scale) : s;
}
__device__ static int dq_code_g(const cudaop_qcfg &c, float w, float s, float z, int maxq)
{
    if (c.grid == QD_GRID_FP8_E4M3) return qd_f32_to_fp8_e4m3(__fdiv_rn(w, dq_scale_eff(c, s)));
    if (c.grid == QD_GRID_FP4_E2M1) return qd_f32_to_fp4_e2m1(__fdiv_rn(w, dq_scale_eff(c, s)));
    return dq_code(w, s, z, maxq);
}
__device__ static float dq_dequant_g(const cudaop_qcfg &c, int q, float s, float z)
{
    if (c.grid == QD_GRID_FP8_E4M3) return __fmul_rn(qd_fp8_e4m3_to_f32((uint8_t)q), dq_scale_eff(c, s));
    if (c.grid == QD_GRID_FP4_E2M1) return __fmul_rn(qd_fp4_e2m1_to_f32((uint8_t)q), dq_scale_eff(c, s));
    return dq_dequant(q, s, z);
}

/* ---- the scale search (device copy of quant/formats/scale_search.c) ---------------------- */

/* The weighted error of one candidate, given up once the partial sum reaches bound; eight
 * terms summed in float, then into the double, in the reference's order (so the choice is
 * the reference's). The host refuses norms other than 1 and 2 (powf is not the C library's). */
__device__ static double dq_search_err(const cudaop_qcfg &c, const float *w, int64_t n, const float *wt, float s,
                                       float z, double bound)
{
    const int maxq = (1 << c.bits) - 1;
    double e = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        const int64_t i1 = i0 + 8 < n ? i0 + 8 : n;
        float part = 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            float v = w[i];
            float d = fabsf(__fsub_rn(v, dq_dequant_g(c, dq_code_g(c, v, s, z, maxq), s, z)));
            float t = c.search_norm == 2.0f ? __fmul_rn(d, d) : d;
            part = __fadd_rn(part, wt ? __fmul_rn(wt[i], t) : t);
        }
        e += (double)part;
        if (e >= bound) return e;
    }
    return e;
}

/* qd_quant_params_w: min-max, or with scale_search mse the best of the shrunk ranges. */
__device__ static void dq_params_w(const cudaop_qcfg &c, const float *w, int64_t n, const float *wt, float *scale,
                                   float *zero)
{
    float xmin, xmax, bs, bz;
    dq_range(w, n, &xmin, &xmax);
    dq_params_range(c, xmin, xmax, &bs, &bz);
    if (!c.search_mse || (xmin == 0.0f && xmax == 0.0f)) {
        *scale = bs;
        *zero = bz;
        return;
    }
    double best = dq_search_err(c, w, n, wt, bs, bz, INFINITY);
    float ps = bs, pz = bz;
    for (int i = 1; i < c.search_count && best > 0.0; i++) {
        cudaop_qcfg cc = c;
        cc.clip_ratio = __fmul_rn(c.clip_ratio, __fsub_rn(1.0f, __fdiv_rn((float)i, (float)c.search_grid)));
        float s, z;
        dq_params_range(cc, xmin, xmax, &s, &z);
        if (s == ps && z == pz) continue;
        ps = s;
        pz = z;
        double e = dq_search_err(c, w, n, wt, s, z, best);
        if (e < best) {
            best = e;
            bs = s;
            bz = z;
        }
    }
    *scale = bs;
    *zero = bz;
}

/* ---- GPTQ block --------------------------------------------------------------------- */

/* One thread per row, RB rows per thread block; the block copy lives in shared memory as
 * [B][RB] so a column of the block is one contiguous, conflict-free row of threads. Hinv
 * reads are the same address across the block (a broadcast). Rows are independent
 * (gptq_block.h), so no barrier is needed after the copy. */
__global__ void k_gptq_block(cudaop_qcfg cfg, int64_t n, int64_t k, int64_t i1, int64_t i2, float *w,
                             int64_t ldw, const float *hinv, int64_t ldh, float *err, int64_t lde,
                             uint8_t *codes, int64_t ldc, float *scales, float *zeros, const int32_t *col_group,
                             int find_params, const float *col_weight, int rb)
{
    extern __shared__ float w1[];
    const int t = threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * rb + t, B = i2 - i1;
    if (r >= n) return;
    const int maxq = (1 << cfg.bits) - 1;
    float *wr = w + r * ldw;
    if (find_params) {
        const int64_t gs = cfg.group_size > 0 ? cfg.group_size : k;
        for (int64_t j = (i1 + gs - 1) / gs * gs; j < i2; j += gs) {
            int64_t len = j + gs <= k ? gs : k - j, g = col_group[j];
            dq_params_w(cfg, wr + j, len, col_weight ? col_weight + j : NULL, &scales[g * n + r], &zeros[g * n + r]);
        }
    }
    for (int64_t i = 0; i < B; i++) w1[i * rb + t] = wr[i1 + i];
    for (int64_t i = 0; i < B; i++) {
        const int64_t j = i1 + i, g = col_group[j];
        const float *hrow = hinv + j * ldh;
        const float s = scales[g * n + r], z = zeros[g * n + r];
        const float x = w1[i * rb + t];
        const int code = dq_code_g(cfg, x, s, z, maxq);
        const float qv = dq_dequant_g(cfg, code, s, z);
        const float e = __fdiv_rn(x - qv, hrow[j]);
        for (int64_t c = i + 1; c < B; c++) w1[c * rb + t] = __fsub_rn(w1[c * rb + t], __fmul_rn(e, hrow[i1 + c]));
        err[r * lde + i] = e;
        codes[r * ldc + j] = (uint8_t)code;
        wr[j] = qv;
    }
}

extern "C" int cudaop_gptq_block(void *stream, cudaop_qcfg cfg, int64_t n, int64_t k, int64_t i1, int64_t i2,
                                 float *w, int64_t ldw, const float *hinv, int64_t ldh, float *err, int64_t lde,
                                 uint8_t *codes, int64_t ldc, float *scales, float *zeros, const int32_t *col_group,
                                 int find_params, const float *col_weight)
{
    const int64_t B = i2 - i1;
    /* Rows per block: quant/backend/backend_args.c (tested on the host); the caller has
     * already refused a block too wide for shared memory. */
    const int rb = qd_backend_gptq_block_rows(B);
    if (!rb) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    unsigned blocks = (unsigned)((n + rb - 1) / rb);
    k_gptq_block<<<blocks, rb, (size_t)rb * B * sizeof(float), (cudaStream_t)stream>>>(
        cfg, n, k, i1, i2, w, ldw, hinv, ldh, err, lde, codes, ldc, scales, zeros, col_group, find_params, col_weight, rb);
    return op_launched();
}

/* ---- fake quantization, scaling, reductions ------------------------------------------ */

/* Sets *flag when any of the n values is not finite. */
__global__ void k_flag_nonfinite(const float *w, int64_t n, int *flag)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (!isfinite(w[i])) { atomicOr(flag, 1); return; }
}

/* One thread a (row, group), grid-stride; nothing is written once k_flag_nonfinite (the
 * launch before, on the same stream) found a non-finite value, so a refusal leaves W as it
 * was, as the CPU's does. */
__global__ void k_fake_quant(cudaop_qcfg cfg, float *w, int64_t n, int64_t k, int64_t gl, int64_t ng, const int *flag)
{
    if (*flag) return;
    const int maxq = (1 << cfg.bits) - 1;
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < n * ng; id += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = id / ng, g = id % ng, k0 = g * gl, len = k - k0 < gl ? k - k0 : gl;
        float *p = w + r * k + k0;
        float s, z;
        dq_params(cfg, p, len, &s, &z);
        for (int64_t i = 0; i < len; i++) p[i] = dq_dequant_g(cfg, dq_code_g(cfg, p[i], s, z, maxq), s, z);
    }
}

extern "C" int cudaop_fake_quant(void *stream, cudaop_qcfg cfg, float *w, int64_t n, int64_t k, int *flag)
{
    int64_t gl = cfg.group_size > 0 ? cfg.group_size : k, ng = cfg.group_size > 0 ? (k + gl - 1) / gl : 1;
    if (n == 0 || k == 0) return 0;
    k_flag_nonfinite<<<op_blocks(n * k), OP_THREADS, 0, (cudaStream_t)stream>>>(w, n * k, flag);
    int e = op_launched();
    if (e) return e;
    k_fake_quant<<<op_blocks(n * ng), OP_THREADS, 0, (cudaStream_t)stream>>>(cfg, w, n, k, gl, ng, flag);
    return op_launched();
}

__global__ void k_scale_cols(float *w, int64_t rows, int64_t cols, const float *s, int inverse)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
        float v = s[i % cols];
        w[i] = inverse ? w[i] / v : w[i] * v;
    }
}

extern "C" int cudaop_scale_cols(void *stream, float *w, int64_t rows, int64_t cols, const float *s, int inverse)
{
    if (rows * cols == 0) return 0;
    k_scale_cols<<<op_blocks(rows * cols), OP_THREADS, 0, (cudaStream_t)stream>>>(w, rows, cols, s, inverse);
    return op_launched();
}

/* Block-wide sum of one double per thread (OP_THREADS threads), fixed order. */
__device__ static double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ static float block_max(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__global__ void k_sq_diff_partial(const float *a, const float *b, int64_t n, double *partial)
{
    __shared__ double sh[OP_THREADS];
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double d = (double)a[i] - (double)b[i];
        acc += d * d;
    }
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sum_partials(const double *partial, int count, double *out)
{
    __shared__ double sh[OP_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) *out = s;
}

__global__ void k_abs_max(const float *x, int64_t n, unsigned *out)
{
    float m = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(x[i]));                        /* fmaxf drops a NaN */
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));
}

extern "C" int cudaop_abs_max(void *stream, const float *x, int64_t n, unsigned *out_dev)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (cudaMemsetAsync(out_dev, 0, sizeof *out_dev, st) != cudaSuccess) return op_launched();
    k_abs_max<<<CUDAOP_REDUCE_BLOCKS, OP_THREADS, 0, st>>>(x, n, out_dev);
    return op_launched();
}

extern "C" int cudaop_sq_diff_sum(void *stream, const float *a, const float *b, int64_t n, double *partial,
                                  double *out_dev)
{
    cudaStream_t st = (cudaStream_t)stream;
    k_sq_diff_partial<<<CUDAOP_REDUCE_BLOCKS, OP_THREADS, 0, st>>>(a, b, n, partial);
    k_sum_partials<<<1, OP_THREADS, 0, st>>>(partial, CUDAOP_REDUCE_BLOCKS, out_dev);
    return op_launched();
}

/* ---- bfloat16 copies ("compute": "bf16", quant/backend/cpu/cpu_bf16.h) ---------------- */

/* dst [rows, cols] (dense) = src rounded to bf16: nearest even, a subnormal to a zero of its
 * sign (the CPU path's rounding). */
__global__ void k_to_bf16(const float *src, int64_t rows, int64_t cols, int64_t ld, __nv_bfloat16 *dst)
{
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < rows * cols;
         id += (int64_t)gridDim.x * blockDim.x) {
        float x = src[(id / cols) * ld + id % cols];
        if (fabsf(x) < 1.17549435e-38f) x = copysignf(0.0f, x);
        dst[id] = __float2bfloat16_rn(x);
    }
}

extern "C" int cudaop_to_bf16(void *stream, const float *src, int64_t rows, int64_t cols, int64_t ld, void *dst)
{
    k_to_bf16<<<op_blocks(rows * cols), OP_THREADS, 0, (cudaStream_t)stream>>>(src, rows, cols, ld,
                                                                               (__nv_bfloat16 *)dst);
    return op_launched();
}

/* ---- triangles (Hessian, Cholesky) --------------------------------------------------- */

__global__ void k_symmetrize_upper(float *h, int64_t k)
{
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < k * k; id += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = id / k, j = id % k;
        if (j < i) h[id] = h[j * k + i];
    }
}

extern "C" int cudaop_symmetrize_upper(void *stream, float *h, int64_t k)
{
    k_symmetrize_upper<<<op_blocks(k * k), OP_THREADS, 0, (cudaStream_t)stream>>>(h, k);
    return op_launched();
}

__global__ void k_finish_upper(float *h, int64_t k, int *flag)
{
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < k * k; id += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = id / k, j = id % k;
        if (j < i) { h[id] = 0.0f; continue; }
        float v = h[id];
        if (!isfinite(v) || (i == j && !(v > 0.0f))) atomicOr(flag, 1);
    }
}

extern "C" int cudaop_finish_upper(void *stream, float *h, int64_t k, int *flag)
{
    k_finish_upper<<<op_blocks(k * k), OP_THREADS, 0, (cudaStream_t)stream>>>(h, k, flag);
    return op_launched();
}

/* ---- norms ------------------------------------------------------------------------- */

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int64_t dim, float eps)
{
    __shared__ double sh[OP_THREADS];
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * (w ? w[i] : 1.0f);
}

extern "C" int cudaop_rmsnorm(void *stream, float *y, const float *x, const float *w, int64_t rows, int64_t dim,
                              float eps)
{
    if (rows == 0) return 0;
    k_rmsnorm<<<(unsigned)rows, OP_THREADS, 0, (cudaStream_t)stream>>>(y, x, w, dim, eps);
    return op_launched();
}

__global__ void k_layernorm(float *y, const float *x, const float *w, const float *b, int64_t dim, float eps)
{
    __shared__ double sh[OP_THREADS];
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    double mean = block_sum(s, sh) / (double)dim, var = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) { double d = xr[i] - mean; var += d * d; }
    var = block_sum(var, sh);
    float inv = (float)(1.0 / sqrt(var / (double)dim + (double)eps)), m = (float)mean;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = (xr[i] - m) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        yr[i] = v;
    }
}

extern "C" int cudaop_layernorm(void *stream, float *y, const float *x, const float *w, const float *b,
                                int64_t rows, int64_t dim, float eps)
{
    if (rows == 0) return 0;
    k_layernorm<<<(unsigned)rows, OP_THREADS, 0, (cudaStream_t)stream>>>(y, x, w, b, dim, eps);
    return op_launched();
}

/* ---- RoPE (the attention is in cuda_attention.cu) ----------------------------------- */

/* The frequency table travels as a kernel argument (2 KiB), so no device buffer is needed. */
struct rope_tab { float inv_freq[CUDAOP_ROPE_MAX_HALF]; };

__global__ void k_rope(float *x, int64_t tokens, int64_t n_heads, int64_t head_dim, int64_t half,
                       const int32_t *pos, rope_tab tab, float attn_scale, int interleaved)
{
    int64_t total = tokens * n_heads * half;
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = id % half, th = id / half, t = th / n_heads, h = th % n_heads;
        float a = (float)pos[t] * tab.inv_freq[i];   /* float32, as transformers and the CPU backend */
        float c = (float)cos((double)a) * attn_scale, s = (float)sin((double)a) * attn_scale;
        float *xh = x + t * n_heads * head_dim + h * head_dim;
        int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
        float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = x0 * c - x1 * s;
        xh[i1] = x1 * c + x0 * s;
    }
}

extern "C" int cudaop_rope(void *stream, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim,
                           int64_t rot_dim, const int32_t *pos, const float *inv_freq, float attn_scale,
                           int interleaved)
{
    int64_t half = rot_dim / 2;
    if (tokens * n_heads * half == 0) return 0;
    if (half > CUDAOP_ROPE_MAX_HALF) return (int)cudaErrorInvalidValue;
    rope_tab tab;
    memset(&tab, 0, sizeof tab);
    memcpy(tab.inv_freq, inv_freq, (size_t)half * sizeof(float));
    k_rope<<<op_blocks(tokens * n_heads * half), OP_THREADS, 0, (cudaStream_t)stream>>>(x, tokens, n_heads, head_dim,
                                                                                       half, pos, tab, attn_scale,
                                                                                       interleaved);
    return op_launched();
}


/* ---- elementwise ------------------------------------------------------------------- */

#define ELEMENTWISE(name, params, body)                                                               \
    __global__ void k_##name params                                                                   \
    {                                                                                                 \
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) \
            body;                                                                                     \
    }

ELEMENTWISE(silu_mul, (float *out, const float *gate, const float *up, int64_t n),
            { float g = gate[i]; out[i] = g / (1.0f + expf(-g)) * up[i]; })
ELEMENTWISE(gelu_tanh_mul, (float *out, const float *gate, const float *up, int64_t n),
            { float g = gate[i]; float t = 0.79788456080286536f * (g + 0.044715f * g * g * g);
              out[i] = 0.5f * g * (1.0f + tanhf(t)) * up[i]; })
ELEMENTWISE(swiglu_clamp_mul, (float *out, const float *gate, const float *up, int64_t n, float alpha, float limit),
            { float g = gate[i];
              float u = up[i];
              g = g > limit ? limit : g;
              u = u > limit ? limit : u < -limit ? -limit : u;
              float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
              out[i] = (u + 1.0f) * glu; })
ELEMENTWISE(softcap, (float *x, int64_t n, float cap), { x[i] = tanhf(x[i] / cap) * cap; })
ELEMENTWISE(scale, (float *x, int64_t n, float s), { x[i] *= s; })
ELEMENTWISE(relu, (float *x, int64_t n), { if (!(x[i] > 0.0f)) x[i] = 0.0f; })
ELEMENTWISE(gelu, (float *x, int64_t n), { x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f)); })
ELEMENTWISE(gelu_tanh, (float *x, int64_t n),
            { float g = x[i]; float t = 0.79788456080286536f * (g + 0.044715f * g * g * g);
              x[i] = 0.5f * g * (1.0f + tanhf(t)); })
/* The order of transformers' float32 expression (activations.py, XIELUActivation._xielu_python). */
ELEMENTWISE(xielu, (float *x, int64_t n, float ap, float an, float beta, float eps),
            { float v = x[i];
              x[i] = v > 0.0f ? __fadd_rn(__fmul_rn(__fmul_rn(ap, v), v), __fmul_rn(beta, v))
                              : __fadd_rn(__fmul_rn(__fsub_rn(expm1f(fminf(v, eps)), v), an), __fmul_rn(beta, v)); })
ELEMENTWISE(add, (float *y, const float *x, int64_t n), { y[i] += x[i]; })
ELEMENTWISE(add_bias, (float *y, const float *bias, int64_t cols, int64_t n), { y[i] += bias[i % cols]; })

extern "C" int cudaop_silu_mul(void *stream, float *out, const float *gate, const float *up, int64_t n)
{
    if (n <= 0) return 0;
    k_silu_mul<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(out, gate, up, n);
    return op_launched();
}

extern "C" int cudaop_swiglu_clamp_mul(void *stream, float *out, const float *gate, const float *up, int64_t n,
                                       float alpha, float limit)
{
    if (n <= 0) return 0;
    k_swiglu_clamp_mul<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(out, gate, up, n, alpha, limit);
    return op_launched();
}

extern "C" int cudaop_gelu_tanh_mul(void *stream, float *out, const float *gate, const float *up, int64_t n)
{
    if (n <= 0) return 0;
    k_gelu_tanh_mul<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(out, gate, up, n);
    return op_launched();
}

extern "C" int cudaop_softcap(void *stream, float *x, int64_t n, float cap)
{
    if (n <= 0) return 0;
    k_softcap<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n, cap);
    return op_launched();
}

extern "C" int cudaop_scale(void *stream, float *x, int64_t n, float s)
{
    if (n <= 0) return 0;
    k_scale<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n, s);
    return op_launched();
}

extern "C" int cudaop_xielu(void *stream, float *x, int64_t n, float ap, float an, float beta, float eps)
{
    if (n <= 0) return 0;
    k_xielu<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n, ap, an, beta, eps);
    return op_launched();
}

extern "C" int cudaop_relu(void *stream, float *x, int64_t n)
{
    if (n <= 0) return 0;
    k_relu<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n);
    return op_launched();
}

/* DeepSeek-V3.2's index scores (backend.h's dsa_scores): one thread per (row, key), the
 * CPU's loop order (the dot over the dims, then the heads). */
__global__ void k_dsa_scores(float *out, const float *q, const float *k, const float *w, int64_t rows, int64_t seq,
                             int64_t nh, int64_t hd, float qk_scale, float w_scale)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < rows * seq;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = idx / seq, j = idx % seq, b = r / seq, i = r % seq;
        if (j > i) { out[idx] = 0.0f; continue; }
        const float *qi = q + r * nh * hd, *wi = w + r * nh, *kj = k + (b * seq + j) * hd;
        float acc = 0.0f;   /* each product and sum rounded on its own (no FMA) */
        for (int64_t h = 0; h < nh; h++) {
            float d = 0.0f;
            for (int64_t e = 0; e < hd; e++) d = __fadd_rn(d, __fmul_rn(qi[h * hd + e], kj[e]));
            d = __fmul_rn(d, qk_scale);
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(wi[h], w_scale), d > 0.0f ? d : 0.0f));
        }
        out[idx] = acc;
    }
}

extern "C" int cudaop_dsa_scores(void *stream, float *out, const float *q, const float *k, const float *w, int64_t rows,
                                 int64_t seq, int64_t nh, int64_t hd, float qk_scale, float w_scale)
{
    if (rows <= 0 || seq <= 0) return 0;
    k_dsa_scores<<<op_blocks(rows * seq), OP_THREADS, 0, (cudaStream_t)stream>>>(out, q, k, w, rows, seq, nh, hd,
                                                                                 qk_scale, w_scale);
    return op_launched();
}

extern "C" int cudaop_gelu(void *stream, float *x, int64_t n)
{
    if (n <= 0) return 0;
    k_gelu<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n);
    return op_launched();
}

extern "C" int cudaop_gelu_tanh(void *stream, float *x, int64_t n)
{
    if (n <= 0) return 0;
    k_gelu_tanh<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(x, n);
    return op_launched();
}

extern "C" int cudaop_add(void *stream, float *y, const float *x, int64_t n)
{
    if (n <= 0) return 0;
    k_add<<<op_blocks(n), OP_THREADS, 0, (cudaStream_t)stream>>>(y, x, n);
    return op_launched();
}

extern "C" int cudaop_add_bias(void *stream, float *y, const float *bias, int64_t rows, int64_t cols)
{
    if (rows * cols <= 0) return 0;
    k_add_bias<<<op_blocks(rows * cols), OP_THREADS, 0, (cudaStream_t)stream>>>(y, bias, cols, rows * cols);
    return op_launched();
}

/* ---- row gather and scatter-add ---------------------------------------------------- */

/* Rows of both ops are spread over a grid-stride loop of thread blocks, one row per block at
 * a time, its columns over the block's threads. The scatter's indices are distinct (its
 * precondition, backend.h), so each dst row is one block's: no atomics, and each element is
 * dst + src * w in the CPU reference's order (__fmul_rn/__fadd_rn keep nvcc from contracting
 * it into an FMA the reference does not have). An index outside [0, rows) is skipped (the
 * gather zeroes its row) and sets *flag. */
static unsigned rows_blocks(int64_t n) { return (unsigned)(n < 65535 * 32 ? n : 65535 * 32); }

__global__ void k_gather_rows(float *dst, const float *src, int64_t src_rows, const int32_t *idx, int64_t n_idx,
                              int64_t cols, int *flag)
{
    for (int64_t i = blockIdx.x; i < n_idx; i += gridDim.x) {
        const int64_t r = idx[i];
        float *d = dst + i * cols;
        if (r < 0 || r >= src_rows) {
            if (threadIdx.x == 0) atomicOr(flag, 1);
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = 0.0f;
            continue;
        }
        const float *s = src + r * cols;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = s[j];
    }
}

__global__ void k_scatter_add_rows(float *dst, int64_t dst_rows, const float *src, const int32_t *idx,
                                   const float *w, int64_t n_idx, int64_t cols, int *flag)
{
    for (int64_t i = blockIdx.x; i < n_idx; i += gridDim.x) {
        const int64_t r = idx[i];
        if (r < 0 || r >= dst_rows) {
            if (threadIdx.x == 0) atomicOr(flag, 1);
            continue;
        }
        const float wi = w[i], *s = src + i * cols;
        float *d = dst + r * cols;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) d[j] = __fadd_rn(d[j], __fmul_rn(s[j], wi));
    }
}

extern "C" int cudaop_gather_rows(void *stream, float *dst, const float *src, int64_t src_rows, const int32_t *idx,
                                  int64_t n_idx, int64_t cols, int *flag)
{
    if (n_idx <= 0) return 0;
    k_gather_rows<<<rows_blocks(n_idx), OP_THREADS, 0, (cudaStream_t)stream>>>(dst, src, src_rows, idx, n_idx, cols,
                                                                              flag);
    return op_launched();
}

extern "C" int cudaop_scatter_add_rows(void *stream, float *dst, int64_t dst_rows, const float *src,
                                       const int32_t *idx, const float *w, int64_t n_idx, int64_t cols, int *flag)
{
    if (n_idx <= 0) return 0;
    k_scatter_add_rows<<<rows_blocks(n_idx), OP_THREADS, 0, (cudaStream_t)stream>>>(dst, dst_rows, src, idx, w,
                                                                                   n_idx, cols, flag);
    return op_launched();
}

/* ---- NLL ----------------------------------------------------------------------------- */

__global__ void k_nll_rows(const float *logits, const int32_t *targets, int64_t vocab, double *nll, int *flag)
{
    __shared__ float shf[OP_THREADS];
    __shared__ double shd[OP_THREADS];
    const float *lr = logits + blockIdx.x * vocab;
    int32_t t = targets[blockIdx.x];
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
    mx = block_max(mx, shf);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp((double)lr[j] - mx);
    sum = block_sum(sum, shd);
    if (threadIdx.x == 0) {
        if (t < 0 || t >= vocab) {
            atomicOr(flag, 1);
            nll[blockIdx.x] = 0.0;
        } else {
            nll[blockIdx.x] = (double)mx + log(sum) - (double)lr[t];
        }
    }
}

extern "C" int cudaop_nll_rows(void *stream, const float *logits, const int32_t *targets, int64_t rows,
                               int64_t vocab, double *nll_dev, int *flag)
{
    if (rows <= 0) return 0;
    k_nll_rows<<<(unsigned)rows, OP_THREADS, 0, (cudaStream_t)stream>>>(logits, targets, vocab, nll_dev, flag);
    return op_launched();
}
