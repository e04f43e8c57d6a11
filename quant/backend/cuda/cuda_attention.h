/* Private to the CUDA backend: its attention op (cuda_attention.cu), batched cuBLAS GEMMs
 * around a softmax kernel, chunked by quant/backend/attn_plan.h. */
#ifndef QUANT_BACKEND_CUDA_CUDA_ATTENTION_H
#define QUANT_BACKEND_CUDA_CUDA_ATTENTION_H

#include <stdint.h>

#include "quant/backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* backend.h's attention op on be's stream, with blas (be's cublasHandle_t, bound to that
 * stream, in CUBLAS_PEDANTIC_MATH: the products stay F32, no TF32). The workspace for the
 * scores comes from be's pool and goes back to it, stream-ordered, before the return. 0, or
 * a negative code with be->err set (a cuBLAS or launch failure marks be broken). */
int qd_backend_cuda_attention(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                              const float *v, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv,
                              int64_t hd, float scale, int64_t window, float softcap);

/* The same with a sink logit per query head (backend.h's attention_sink; softcap none):
 * sinks [n_heads] device memory. */
int qd_backend_cuda_attention_sink(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                                   const float *v, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv,
                                   int64_t hd, float scale, int64_t window, const float *sinks);

/* The same where only the keys keep marks are seen (backend.h's attention_keep; window and
 * softcap none): keep [batch, seq, seq] device memory. */
int qd_backend_cuda_attention_keep(qd_backend *be, void *blas, float *out, const float *q, const float *k,
                                   const float *v, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv,
                                   int64_t hd, float scale, const uint8_t *keep);

#ifdef __cplusplus
}
#endif

#endif
