/* Private to the CUDA backend: the kernel launchers of cuda_ops.cu, called by
 * cuda_backend.c. Each enqueues its work on `stream` (a cudaStream_t) and returns the
 * cudaError_t of the launch (0 on success) so the caller can name the op in the error.
 * All pointers are device memory; `flag` is a device int that a kernel sets to nonzero
 * when it meets bad data (a NaN, a target outside the vocabulary), read back by the
 * caller. Also declares qd_backend_cuda_stream for quant/kernels/cuda. */
#ifndef QUANT_BACKEND_CUDA_CUDA_INTERNAL_H
#define QUANT_BACKEND_CUDA_CUDA_INTERNAL_H

#include <stdint.h>

#include "quant/backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a failed CUDA call as QD_EBACKEND in be->err and in *err (may be NULL), naming
 * the call, the CUDA error (a cudaError_t), file, line and device, and marks be broken
 * (backend.h). Returns QD_EBACKEND. */
int qd_backend_cuda_fail_err(qd_backend *be, qd_err *err, const char *call, int cuda_error, const char *file,
                             int line);
/* The stream (cudaStream_t) every op of be runs on. */
void *qd_backend_cuda_stream(qd_backend *be);
/* Allocates bytes of device memory from be's pool (NULL and be->err set on failure). */
void *qd_backend_cuda_scratch(qd_backend *be, size_t bytes);

/* Quantizer settings passed by value to device code (qd_quant_cfg without host pointers). */
typedef struct cudaop_qcfg {
    int bits, sym, f16_scales, zero_min1;
    int64_t group_size;
    float clip_ratio;
    int grid, scale_rule;      /* qd_grid, qd_scale_rule (quant/formats/grid.h) */
    float global_scale;        /* QD_SCALE_FP8_GLOBAL: set (the host refuses 0) */
    int search_mse;            /* 1: scale_search mse (quantizer.h), with: */
    int search_grid, search_count; /* qd_quant_cfg's grid and qd_quant_search_count (from the host) */
    float search_norm;         /* 1 or 2 (qd_backend_gptq_block_args_check) */
} cudaop_qcfg;

int cudaop_symmetrize_upper(void *stream, float *h, int64_t k);
/* dst (device, rows x cols bfloat16, dense) = src [rows, cols] (row stride ld) rounded to
 * bf16 as quant/backend/cpu/cpu_bf16.h defines it. */
int cudaop_to_bf16(void *stream, const float *src, int64_t rows, int64_t cols, int64_t ld, void *dst);
/* Zeroes the strict lower triangle of row-major h and sets *flag when an entry is not
 * finite or a diagonal entry is not positive. */
int cudaop_finish_upper(void *stream, float *h, int64_t k, int *flag);
int cudaop_gptq_block(void *stream, cudaop_qcfg cfg, int64_t n, int64_t k, int64_t i1, int64_t i2, float *w,
                      int64_t ldw, const float *hinv, int64_t ldh, float *err, int64_t lde, uint8_t *codes,
                      int64_t ldc, float *scales, float *zeros, const int32_t *col_group, int find_params,
                      const float *col_weight);
int cudaop_fake_quant(void *stream, cudaop_qcfg cfg, float *w, int64_t n, int64_t k, int *flag);
int cudaop_scale_cols(void *stream, float *w, int64_t rows, int64_t cols, const float *s, int inverse);
/* Writes sum((a-b)^2) as a double to *out_dev; partial holds CUDAOP_REDUCE_BLOCKS doubles. */
#define CUDAOP_REDUCE_BLOCKS 256
/* *out_dev (zeroed first) = the bits of max |x[i]| over n floats. */
int cudaop_abs_max(void *stream, const float *x, int64_t n, unsigned *out_dev);
int cudaop_sq_diff_sum(void *stream, const float *a, const float *b, int64_t n, double *partial, double *out_dev);
int cudaop_rmsnorm(void *stream, float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps);
int cudaop_layernorm(void *stream, float *y, const float *x, const float *w, const float *b, int64_t rows,
                     int64_t dim, float eps);
/* inv_freq: host array of rot_dim / 2 <= CUDAOP_ROPE_MAX_HALF floats (passed by value);
 * interleaved: pairs (2i, 2i + 1) instead of (i, i + rot_dim / 2). */
#define CUDAOP_ROPE_MAX_HALF 512
int cudaop_rope(void *stream, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
                const int32_t *pos, const float *inv_freq, float attn_scale, int interleaved);
int cudaop_silu_mul(void *stream, float *out, const float *gate, const float *up, int64_t n);
/* cuda_recurrent.cu: the recurrent mixers' ops and sigmoid_mul, as backend.h describes them. */
int cudaop_sigmoid_mul(void *stream, float *out, const float *gate, const float *x, int64_t n);
int cudaop_gated_delta_rule(void *stream, float *out, const float *qkv, int64_t ld_qkv, const float *b, const float *a,
                            int64_t ld_ba, const float *a_log, const float *dt_bias, int64_t batch, int64_t seq,
                            int64_t nk, int64_t nv, int64_t dk, int64_t dv);
int cudaop_swiglu_clamp_mul(void *stream, float *out, const float *gate, const float *up, int64_t n, float alpha,
                            float limit);
int cudaop_gelu_tanh_mul(void *stream, float *out, const float *gate, const float *up, int64_t n);
int cudaop_softcap(void *stream, float *x, int64_t n, float cap);
int cudaop_scale(void *stream, float *x, int64_t n, float s);
int cudaop_relu(void *stream, float *x, int64_t n);
int cudaop_dsa_scores(void *stream, float *out, const float *q, const float *k, const float *w, int64_t rows,
                      int64_t seq, int64_t nh, int64_t hd, float qk_scale, float w_scale);
int cudaop_gelu(void *stream, float *x, int64_t n);
int cudaop_gelu_tanh(void *stream, float *x, int64_t n);
int cudaop_xielu(void *stream, float *x, int64_t n, float ap, float an, float beta, float eps);
int cudaop_add(void *stream, float *y, const float *x, int64_t n);
int cudaop_add_bias(void *stream, float *y, const float *bias, int64_t rows, int64_t cols);
/* dst[i] = src[idx[i]] (rows of cols floats); an index outside [0, src_rows) zeroes its row
 * and sets *flag. */
int cudaop_gather_rows(void *stream, float *dst, const float *src, int64_t src_rows, const int32_t *idx,
                       int64_t n_idx, int64_t cols, int *flag);
/* dst[idx[i]] += w[i] * src[i], indices distinct; one outside [0, dst_rows) is skipped and
 * sets *flag. */
int cudaop_scatter_add_rows(void *stream, float *dst, int64_t dst_rows, const float *src, const int32_t *idx,
                            const float *w, int64_t n_idx, int64_t cols, int *flag);
int cudaop_nll_rows(void *stream, const float *logits, const int32_t *targets, int64_t rows, int64_t vocab,
                    double *nll_dev, int *flag);
/* The recurrent mixers' ops (cuda_ssm.cu; backend.h's conv1d_causal and ssd_scan). The scan
 * keeps a head's [head_dim, d_state] state one row a thread, d_state at most
 * CUDAOP_SSD_MAX_STATE. */
#define CUDAOP_SSD_MAX_STATE 256
int cudaop_conv1d_causal(void *stream, float *y, const float *x, const float *gate_in, const float *gate_out, int64_t ld,
                         int64_t batch, int64_t seq, int64_t ch, const float *w, const float *bias, int64_t kernel,
                         int silu);
int cudaop_ssd_scan(void *stream, float *y, const float *x, const float *b, const float *c, int64_t ld, const float *dt,
                    int64_t ld_dt, const float *z, int64_t ld_z, const float *a, const float *d, const float *dt_bias,
                    float dt_min, float dt_max, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                    int64_t n_groups, int64_t d_state);

#ifdef __cplusplus
}
#endif

#endif
