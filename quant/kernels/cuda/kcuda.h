/* The CUDA dequantizing matmul (kcuda_matmul.cu), called by qd_kernel_matmul for a CUDA
 * backend. Declared only in builds with QUANTD_HAVE_CUDA. m, x and y are device memory of
 * be (qd_kmat_upload); the work runs on be's stream. GEMV: one pass over the packed weight
 * with a split of K across blocks and a fixed-order reduction (deterministic); GEMM: tiles
 * of x and of the decoded weight in shared memory as half, multiplied with WMMA into F32. */
#ifndef QUANT_KERNELS_CUDA_KCUDA_H
#define QUANT_KERNELS_CUDA_KCUDA_H

#include "quant/kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

int qd_kcuda_matmul(qd_backend *be, const qd_kmat *m, const float *x, int64_t rows, float *y,
                    qd_kpath path, qd_err *err);

#ifdef __cplusplus
}
#endif

#endif
