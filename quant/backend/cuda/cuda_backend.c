/* The CUDA backend: one per worker (thread), holding its device, stream, cuBLAS and
 * cuSOLVER handles, a stream-ordered memory pool and a small scratch area; no globals.
 * Dense linear algebra goes to cuBLAS (GemmEx with F32 compute for gemm, Ssyrk for the
 * Hessian) and cuSOLVER (potrf/potri/potrf for the inverse's Cholesky factor); everything
 * else is a kernel of cuda_ops.cu. Every CUDA, cuBLAS and cuSOLVER failure becomes
 * QD_EBACKEND with the call, file, line and device in be->err: the worker then fails the
 * task and is recycled, since a device error can leave the context unusable. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend_args.h"
#include "quant/backend/cuda/cuda_attention.h"
#include "quant/backend/cuda/cuda_internal.h"
#include "quant/backend/gptq_block.h"
#include "quant/formats/quantizer.h"

typedef struct cuda_impl {
    cudaStream_t stream;
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
    cudaMemPool_t pool;
    int *flag;                 /* device int for kernels that report bad data */
    double *red;               /* device: CUDAOP_REDUCE_BLOCKS partials + 1 result */
} cuda_impl;

static cuda_impl *cu_impl(qd_backend *be) { return (cuda_impl *)be->impl; }

/* Every CUDA, cuBLAS and cuSOLVER failure passes here: the backend is marked broken so its
 * owner stops using the context (backend.h). */
static int cu_fail(qd_backend *be, const char *call, const char *what, const char *file, int line)
{
    be->broken = 1;
    return qd_err_set(&be->err, QD_EBACKEND, "cuda:%d: %s failed: %s (%s:%d)", be->device, call, what, file, line);
}

int qd_backend_cuda_fail_err(qd_backend *be, qd_err *err, const char *call, int cuda_error, const char *file,
                             int line)
{
    int rc = cu_fail(be, call, cudaGetErrorString((cudaError_t)cuda_error), file, line);
    if (err && err != &be->err) *err = be->err;
    return rc;
}

#define CU_TRY(be, call)                                                                     \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) return cu_fail(be, #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define BLAS_TRY(be, call)                                                                   \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) return cu_fail(be, #call, cublasGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)

#define SOLVER_TRY(be, call)                                                                 \
    do {                                                                                     \
        cusolverStatus_t s_ = (call);                                                        \
        if (s_ != CUSOLVER_STATUS_SUCCESS) {                                                 \
            char m_[48];                                                                     \
            snprintf(m_, sizeof m_, "cusolver status %d", (int)s_);                          \
            return cu_fail(be, #call, m_, __FILE__, __LINE__);                               \
        }                                                                                    \
    } while (0)

/* A launcher from cuda_ops.cu returns a cudaError_t as int. */
#define LAUNCH(be, name, expr)                                                               \
    do {                                                                                     \
        int e_ = (expr);                                                                     \
        if (e_) return cu_fail(be, name, cudaGetErrorString((cudaError_t)e_), __FILE__, __LINE__); \
    } while (0)

void *qd_backend_cuda_stream(qd_backend *be) { return cu_impl(be)->stream; }

/* The required ops (backend.h's list), cu_<name> each, and the optional ones this backend
 * has: declared from the list, so each definition below is checked against it. */
#define CU_OP_DECLARE(ret, name, params) static ret cu_##name params;
QD_BACKEND_OPS_REQUIRED(CU_OP_DECLARE)
#undef CU_OP_DECLARE

/* ---- memory -------------------------------------------------------------------------- */

static void *cu_alloc(qd_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, cu_impl(be)->pool, cu_impl(be)->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* Out of memory leaves the context usable; any other error here is a device error
         * (often a sticky one from an earlier kernel). */
        if (e != cudaErrorMemoryAllocation) be->broken = 1;
        qd_err_set(&be->err, e == cudaErrorMemoryAllocation ? QD_ENOMEM : QD_EBACKEND,
                   "cuda:%d: cannot allocate %zu bytes: %s", be->device, bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void *qd_backend_cuda_scratch(qd_backend *be, size_t bytes) { return cu_alloc(be, bytes); }

static void cu_free(qd_backend *be, void *p)
{
    if (p) (void)cudaFreeAsync(p, cu_impl(be)->stream);
}

/* Host buffers may be freed by the caller as soon as these return, so both directions
 * wait for the stream. */
static int cu_upload(qd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return 0;
    CU_TRY(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu_impl(be)->stream));
    CU_TRY(be, cudaStreamSynchronize(cu_impl(be)->stream));
    return 0;
}

static int cu_download(qd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return 0;
    CU_TRY(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu_impl(be)->stream));
    CU_TRY(be, cudaStreamSynchronize(cu_impl(be)->stream));
    return 0;
}

static int cu_copy(qd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return 0;
    CU_TRY(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_impl(be)->stream));
    return 0;
}

static int cu_memset0(qd_backend *be, void *dst, size_t bytes)
{
    if (!bytes) return 0;
    CU_TRY(be, cudaMemsetAsync(dst, 0, bytes, cu_impl(be)->stream));
    return 0;
}

static int cu_sync(qd_backend *be)
{
    CU_TRY(be, cudaStreamSynchronize(cu_impl(be)->stream));
    return 0;
}

/* Reads the device flag and clears it; *set = its value. */
static int cu_flag_take(qd_backend *be, int *set)
{
    cuda_impl *im = cu_impl(be);
    CU_TRY(be, cudaMemcpyAsync(set, im->flag, sizeof *set, cudaMemcpyDeviceToHost, im->stream));
    CU_TRY(be, cudaMemsetAsync(im->flag, 0, sizeof(int), im->stream));
    CU_TRY(be, cudaStreamSynchronize(im->stream));
    return 0;
}

/* ---- linear algebra ------------------------------------------------------------------ */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. */
static int cu_gemm(qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    int skip = 0;
    int64_t lda_ok = lda, ldb_ok = ldb;
    int rc = qd_backend_gemm_args_check("cuda gemm", ta, tb, m, n, k, a, lda, b, ldb, c, ldc, &skip, &lda_ok,
                                        &ldb_ok, &be->err);
    if (rc || skip) return rc;
    BLAS_TRY(be, cublasGemmEx(cu_impl(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              (int)n, (int)m, (int)k, &alpha, b, CUDA_R_32F, (int)ldb_ok, a, CUDA_R_32F, (int)lda_ok,
                              &beta, c, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

static int cu_hessian_accum(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows, int64_t ldx,
                            int64_t n_seen)
{
    int rc = qd_backend_hessian_args_check("cuda hessian_accum", h, k, x, rows, ldx, n_seen, &be->err);
    if (rc) return rc;
    if (rows == 0) return 0;
    float alpha, beta;
    qd_backend_hessian_weights(n_seen, rows, &alpha, &beta);
    /* X [rows, k] row-major is X^T column-major (k x rows); syrk N gives X^T X. Column-major
     * lower is row-major upper, which the symmetrize kernel mirrors. */
    BLAS_TRY(be, cublasSsyrk(cu_impl(be)->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, (int)k, (int)rows, &alpha, x,
                             (int)ldx, &beta, h, (int)k));
    LAUNCH(be, "symmetrize kernel", cudaop_symmetrize_upper(cu_impl(be)->stream, h, k));
    return 0;
}

/* ---- bfloat16-input products ("compute": "bf16") ------------------------------------- */

/* Rows of A (or X) converted to bf16 at a time: a bounded scratch whatever the row count. */
#define BF16_CHUNK_ROWS 8192

/* GemmEx on bf16 operands with F32 sums. The handle is PEDANTIC for the F32 products (no
 * TF32, no reduced-precision reductions), and cuBLAS keeps that mode to the prescribed
 * arithmetic for numerical studies, "might not be as performant": this call runs in the
 * default mode, where bf16 inputs and CUBLAS_COMPUTE_32F go to the tensor cores (the
 * products of bf16 values are exact; the sums stay F32), and PEDANTIC is set back after. */
static cublasStatus_t gemm_ex_bf16(cuda_impl *im, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const float *alpha, const void *a, int lda, const void *b, int ldb,
                                   const float *beta, float *c, int ldc)
{
    cublasStatus_t st = cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGemmEx(im->blas, ta, tb, m, n, k, alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, beta, c,
                          CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t back = cublasSetMathMode(im->blas, CUBLAS_PEDANTIC_MATH);
    return st != CUBLAS_STATUS_SUCCESS ? st : back;
}

/* C = A B^T over bf16 copies on the tensor cores, F32 sums (CUBLAS_COMPUTE_32F). */
static int cu_gemm_nt_bf16(qd_backend *be, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                           const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int skip = 0;
    int64_t lda_ok = lda, ldb_ok = ldb;
    int rc = qd_backend_gemm_args_check("cuda gemm_nt_bf16", 0, 1, m, n, k, a, lda, b, ldb, c, ldc, &skip, &lda_ok,
                                        &ldb_ok, &be->err);
    if (rc || skip) return rc;
    if (k == 0) return cu_gemm(be, 0, 1, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    cuda_impl *im = cu_impl(be);
    int64_t chunk = m < BF16_CHUNK_ROWS ? m : BF16_CHUNK_ROWS;
    void *b16 = cu_alloc(be, (size_t)(n * k) * 2), *a16 = b16 ? cu_alloc(be, (size_t)(chunk * k) * 2) : NULL;
    if (!a16) {
        cu_free(be, b16);
        return be->err.code ? be->err.code : QD_ENOMEM;
    }
    const float one = 1.0f, zero = 0.0f;
    int e = cudaop_to_bf16(im->stream, b, n, k, ldb_ok, b16);
    for (int64_t r0 = 0; r0 < m && !e; r0 += chunk) {
        int64_t rows = m - r0 < chunk ? m - r0 : chunk;
        e = cudaop_to_bf16(im->stream, a + r0 * lda_ok, rows, k, lda_ok, a16);
        if (e) break;
        /* Column-major: C^T [n, rows] = B16 (as k x n, transposed) . A16^T (k x rows). */
        cublasStatus_t st = gemm_ex_bf16(im, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k, &one, b16, (int)k,
                                         a16, (int)k, &zero, c + r0 * ldc, (int)ldc);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cu_free(be, a16);
            cu_free(be, b16);
            return cu_fail(be, "cublasGemmEx (bf16)", cublasGetStatusString(st), __FILE__, __LINE__);
        }
    }
    cu_free(be, a16);
    cu_free(be, b16);
    if (e) return cu_fail(be, "bf16 kernel", cudaGetErrorString((cudaError_t)e), __FILE__, __LINE__);
    return 0;
}

/* H = beta H + alpha X^T X over bf16 copies of X: the whole square by GemmEx (cuBLAS has no
 * bf16 syrk), its upper triangle then mirrored so H is exactly symmetric. */
static int cu_hessian_accum_bf16(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows, int64_t ldx,
                                 int64_t n_seen)
{
    int rc = qd_backend_hessian_args_check("cuda hessian_accum_bf16", h, k, x, rows, ldx, n_seen, &be->err);
    if (rc) return rc;
    if (rows == 0) return 0;
    cuda_impl *im = cu_impl(be);
    float alpha, beta;
    qd_backend_hessian_weights(n_seen, rows, &alpha, &beta);
    int64_t chunk = rows < BF16_CHUNK_ROWS ? rows : BF16_CHUNK_ROWS;
    void *x16 = cu_alloc(be, (size_t)(chunk * k) * 2);
    if (!x16) return be->err.code ? be->err.code : QD_ENOMEM;
    int e = 0;
    for (int64_t r0 = 0; r0 < rows && !e; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        e = cudaop_to_bf16(im->stream, x + r0 * ldx, nr, k, ldx, x16);
        if (e) break;
        /* X16 row-major [nr, k] is column-major X^T (k x nr): X^T X = (X^T)(X^T)^T. */
        float b0 = r0 == 0 ? beta : 1.0f;
        cublasStatus_t st = gemm_ex_bf16(im, CUBLAS_OP_N, CUBLAS_OP_T, (int)k, (int)k, (int)nr, &alpha, x16, (int)k,
                                         x16, (int)k, &b0, h, (int)k);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cu_free(be, x16);
            return cu_fail(be, "cublasGemmEx (bf16 X^T X)", cublasGetStatusString(st), __FILE__, __LINE__);
        }
    }
    cu_free(be, x16);
    if (e) return cu_fail(be, "bf16 kernel", cudaGetErrorString((cudaError_t)e), __FILE__, __LINE__);
    LAUNCH(be, "symmetrize kernel", cudaop_symmetrize_upper(im->stream, h, k));
    return 0;
}

/* H -> U with H^-1 = U^T U. All three cuSOLVER calls work on the column-major lower
 * triangle (row-major upper): potrf gives L, potri turns it into the lower triangle of
 * H^-1, and potrf again gives L' with H^-1 = L' L'^T; in row-major memory L' reads as
 * U = L'^T, upper, with H^-1 = U^T U. The leftover strict row-major lower part is zeroed. */
static int cu_chol_inverse_upper(qd_backend *be, float *h, int64_t k)
{
    if (qd_backend_chol_args_check("cuda chol_inverse_upper", h, k, &be->err)) return be->err.code;
    cuda_impl *im = cu_impl(be);
    const int n = (int)k;
    const cublasFillMode_t lo = CUBLAS_FILL_MODE_LOWER;
    int lw1 = 0, lw2 = 0;
    SOLVER_TRY(be, cusolverDnSpotrf_bufferSize(im->solver, lo, n, h, n, &lw1));
    SOLVER_TRY(be, cusolverDnSpotri_bufferSize(im->solver, lo, n, h, n, &lw2));
    int lw = lw1 > lw2 ? lw1 : lw2;
    float *work = cu_alloc(be, (size_t)(lw > 0 ? lw : 1) * sizeof(float));
    if (!work) return QD_ENOMEM;
    int info[3] = {0, 0, 0}, rc = 0;
    int *dinfo = cu_alloc(be, 3 * sizeof(int));
    if (!dinfo) {
        cu_free(be, work);
        return QD_ENOMEM;
    }
    const char *step = NULL;
    if (cudaMemsetAsync(dinfo, 0, 3 * sizeof(int), im->stream) != cudaSuccess) step = "cudaMemsetAsync";
    else if (cusolverDnSpotrf(im->solver, lo, n, h, n, work, lw, dinfo) != CUSOLVER_STATUS_SUCCESS) step = "cusolverDnSpotrf(H)";
    else if (cusolverDnSpotri(im->solver, lo, n, h, n, work, lw, dinfo + 1) != CUSOLVER_STATUS_SUCCESS) step = "cusolverDnSpotri";
    else if (cusolverDnSpotrf(im->solver, lo, n, h, n, work, lw, dinfo + 2) != CUSOLVER_STATUS_SUCCESS) step = "cusolverDnSpotrf(H^-1)";
    else if (cudaMemcpyAsync(info, dinfo, sizeof info, cudaMemcpyDeviceToHost, im->stream) != cudaSuccess ||
             cudaStreamSynchronize(im->stream) != cudaSuccess) step = "reading the cuSOLVER info";
    if (step) rc = cu_fail(be, step, "the call returned an error status", __FILE__, __LINE__);
    cu_free(be, work);
    cu_free(be, dinfo);
    if (rc) return rc;
    if (info[0] != 0)
        return qd_err_set(&be->err, QD_ENUMERIC, "cuda chol_inverse_upper: the Hessian [%lld x %lld] is not positive "
                          "definite (Cholesky failed at column %d)", (long long)k, (long long)k, info[0]);
    if (info[1] != 0 || info[2] != 0)
        return qd_err_set(&be->err, QD_ENUMERIC, "cuda chol_inverse_upper: inverting the Cholesky factor failed "
                          "(info %d, %d)", info[1], info[2]);
    LAUNCH(be, "finish_upper kernel", cudaop_finish_upper(im->stream, h, k, im->flag));
    int bad = 0;
    if ((rc = cu_flag_take(be, &bad))) return rc;
    if (bad)
        return qd_err_set(&be->err, QD_ENUMERIC, "cuda chol_inverse_upper: the factor has a non-finite entry or a "
                          "non-positive diagonal");
    return 0;
}

static cudaop_qcfg cu_qcfg(const qd_quant_cfg *c)
{
    cudaop_qcfg q = {c->bits, c->sym, c->f16_scales, c->zero_min1, c->group_size, c->clip_ratio,
                     (int)c->grid, (int)c->scale_rule, c->global_scale, c->scale_search == QD_SCALE_SEARCH_MSE, c->search_grid,
                     qd_quant_search_count(c), c->search_norm};
    return q;
}

/* What the device quantizer cannot do on its own: NVFP4 without its global scale (the
 * whole tensor's amax, which a per-group kernel cannot see: fake_quant finds it first with
 * abs_max, the GPTQ op is always given one) and rows sharing a scale in fake quantization
 * (one thread a row and group). */
static int cu_qcfg_check(qd_backend *be, const char *op, const qd_quant_cfg *c, int fake)
{
    if (c->scale_rule == QD_SCALE_FP8_GLOBAL && !(c->global_scale > 0.0f))
        return qd_err_set(&be->err, QD_EUNSUPPORTED, "cuda %s: NVFP4 needs the tensor's global scale set", op);
    if (fake && c->scale_search != QD_SCALE_SEARCH_MINMAX)
        return qd_err_set(&be->err, QD_EUNSUPPORTED, "cuda %s: scale_search mse is not implemented on the GPU", op);
    if (fake && c->row_block != 1)
        return qd_err_set(&be->err, QD_EUNSUPPORTED, "cuda %s: rows sharing a scale (row_block %lld) are not "
                          "fake-quantized on the GPU", op, (long long)c->row_block);
    return 0;
}

static int cu_gptq_block(qd_backend *be, const qd_gptq_block_args *a)
{
    int rc = qd_backend_gptq_block_args_check("cuda gptq_block", a, &be->err);
    if (!rc) rc = cu_qcfg_check(be, "gptq_block", a->cfg, 0);
    if (rc) return rc;
    LAUNCH(be, "gptq_block kernel",
           cudaop_gptq_block(cu_impl(be)->stream, cu_qcfg(a->cfg), a->n, a->k, a->i1, a->i2, a->w, a->ldw, a->hinv,
                             a->ldh, a->err, a->lde, a->codes, a->ldc, a->scales, a->zeros, a->col_group,
                             a->find_params, a->col_weight));
    return 0;
}

static int cu_fake_quant(qd_backend *be, const qd_quant_cfg *cfg, float *w, int64_t n, int64_t k)
{
    if (!cfg || !w || n < 0 || k < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cuda fake_quant: null argument or negative shape");
    int rc = qd_quant_cfg_validate(cfg, &be->err), bad = 0;
    if (rc) return rc;
    /* NVFP4 without a global scale: the whole weight's, as the CPU's fake_quant finds it. */
    qd_quant_cfg cc = *cfg;
    if (cc.scale_rule == QD_SCALE_FP8_GLOBAL && cc.global_scale == 0.0f) {
        float amax = 0.0f;
        if ((rc = cu_abs_max(be, w, n * k, &amax))) return rc;
        cc.global_scale = qd_quant_global_scale(amax);
    }
    if ((rc = cu_qcfg_check(be, "fake_quant", &cc, 1))) return rc;
    LAUNCH(be, "fake_quant kernel", cudaop_fake_quant(cu_impl(be)->stream, cu_qcfg(&cc), w, n, k, cu_impl(be)->flag));
    if ((rc = cu_flag_take(be, &bad))) return rc;
    if (bad)
        return qd_err_set(&be->err, QD_ENUMERIC, "cuda fake_quant: weights [%lld, %lld] hold a non-finite value",
                          (long long)n, (long long)k);
    return 0;
}

static int cu_scale_cols(qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, int inverse)
{
    if (!w || !s || rows < 0 || cols < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cuda scale_cols: null argument or negative shape");
    LAUNCH(be, "scale_cols kernel", cudaop_scale_cols(cu_impl(be)->stream, w, rows, cols, s, inverse));
    return 0;
}

static int cu_sq_diff_sum(qd_backend *be, const float *a, const float *b, int64_t n, double *out)
{
    if (!a || !b || !out || n < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cuda sq_diff_sum: null argument or negative length");
    cuda_impl *im = cu_impl(be);
    LAUNCH(be, "sq_diff_sum kernel", cudaop_sq_diff_sum(im->stream, a, b, n, im->red, im->red + CUDAOP_REDUCE_BLOCKS));
    return cu_download(be, out, im->red + CUDAOP_REDUCE_BLOCKS, sizeof *out);
}

static int cu_abs_max(qd_backend *be, const float *x, int64_t n, float *out)
{
    if (!x || !out || n < 0) return qd_err_set(&be->err, QD_EINVAL, "cuda abs_max: null argument or negative length");
    cuda_impl *im = cu_impl(be);
    /* The reduction buffer's first word holds the bits of the maximum: non-negative floats
     * order as their unsigned bits do, so an atomic integer max is the float max. */
    LAUNCH(be, "abs_max kernel", cudaop_abs_max(im->stream, x, n, (unsigned *)im->red));
    unsigned bits = 0;
    int rc = cu_download(be, &bits, im->red, sizeof bits);
    if (rc) return rc;
    memcpy(out, &bits, sizeof *out);
    return 0;
}

/* ---- neural net ---------------------------------------------------------------------- */

static int cu_rmsnorm(qd_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t dim, float eps)
{
    if (rows < 0 || dim <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "rmsnorm: bad shape [%lld, %lld]", (long long)rows, (long long)dim);
    LAUNCH(be, "rmsnorm kernel", cudaop_rmsnorm(cu_impl(be)->stream, y, x, w, rows, dim, eps));
    return 0;
}

static int cu_layernorm(qd_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows,
                        int64_t dim, float eps)
{
    if (rows < 0 || dim <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "layernorm: bad shape [%lld, %lld]", (long long)rows, (long long)dim);
    LAUNCH(be, "layernorm kernel", cudaop_layernorm(cu_impl(be)->stream, y, x, w, b, rows, dim, eps));
    return 0;
}

static int cu_rope(qd_backend *be, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos,
                   const qd_rope_freqs *f)
{
    int64_t rot_dim = f->rot_dim;
    if (rot_dim <= 0 || rot_dim > head_dim || (rot_dim & 1) || rot_dim / 2 > CUDAOP_ROPE_MAX_HALF)
        return qd_err_set(&be->err, QD_EINVAL, "rope: rot_dim %lld must be even and in (0, head_dim %lld]",
                          (long long)rot_dim, (long long)head_dim);
    LAUNCH(be, "rope kernel", cudaop_rope(cu_impl(be)->stream, x, tokens, n_heads, head_dim, rot_dim, pos, f->inv_freq,
                                          f->attn_scale, f->interleaved));
    return 0;
}

static int cu_attention(qd_backend *be, float *out, const float *q, const float *k, const float *v, int64_t batch,
                        int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale, int64_t window,
                        float softcap)
{
    if (n_kv <= 0 || n_heads % n_kv != 0)
        return qd_err_set(&be->err, QD_EINVAL, "attention: n_heads %lld is not a multiple of n_kv %lld",
                          (long long)n_heads, (long long)n_kv);
    if (seq <= 0 || batch <= 0) return 0;
    return qd_backend_cuda_attention(be, cu_impl(be)->blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window,
                                     softcap);
}

static int cu_attention_sink(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                             int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                             int64_t window, const float *sinks)
{
    if (n_kv <= 0 || n_heads % n_kv != 0)
        return qd_err_set(&be->err, QD_EINVAL, "attention_sink: n_heads %lld is not a multiple of n_kv %lld",
                          (long long)n_heads, (long long)n_kv);
    if (!sinks) return qd_err_set(&be->err, QD_EINVAL, "attention_sink: no sinks");
    if (seq <= 0 || batch <= 0) return 0;
    return qd_backend_cuda_attention_sink(be, cu_impl(be)->blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale,
                                          window, sinks);
}

static int cu_attention_keep(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                             int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                             const uint8_t *keep)
{
    if (n_kv <= 0 || n_heads % n_kv != 0)
        return qd_err_set(&be->err, QD_EINVAL, "attention_keep: n_heads %lld is not a multiple of n_kv %lld",
                          (long long)n_heads, (long long)n_kv);
    if (!keep) return qd_err_set(&be->err, QD_EINVAL, "attention_keep: no keep mask");
    if (seq <= 0 || batch <= 0) return 0;
    return qd_backend_cuda_attention_keep(be, cu_impl(be)->blas, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale,
                                          keep);
}

static int cu_dsa_scores(qd_backend *be, float *out, const float *q, const float *k, const float *w, int64_t batch,
                         int64_t seq, int64_t n_heads, int64_t hd, float qk_scale, float w_scale)
{
    if (batch <= 0 || seq <= 0) return 0;
    if (n_heads <= 0 || hd <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "dsa_scores: n_heads %lld and hd %lld must be positive",
                          (long long)n_heads, (long long)hd);
    LAUNCH(be, "dsa_scores kernel", cudaop_dsa_scores(cu_impl(be)->stream, out, q, k, w, batch * seq, seq, n_heads, hd,
                                                      qk_scale, w_scale));
    return 0;
}

static int cu_swiglu_clamp_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n, float alpha,
                               float limit)
{
    LAUNCH(be, "swiglu_clamp_mul kernel", cudaop_swiglu_clamp_mul(cu_impl(be)->stream, out, gate, up, n, alpha, limit));
    return 0;
}

static int cu_silu_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    LAUNCH(be, "silu_mul kernel", cudaop_silu_mul(cu_impl(be)->stream, out, gate, up, n));
    return 0;
}

static int cu_sigmoid_mul(qd_backend *be, float *out, const float *gate, const float *x, int64_t n)
{
    LAUNCH(be, "sigmoid_mul kernel", cudaop_sigmoid_mul(cu_impl(be)->stream, out, gate, x, n));
    return 0;
}

static int cu_gated_delta_rule(qd_backend *be, float *out, const float *qkv, int64_t ld_qkv, const float *b,
                               const float *a, int64_t ld_ba, const float *a_log, const float *dt_bias, int64_t batch,
                               int64_t seq, int64_t nk, int64_t nv, int64_t dk, int64_t dv)
{
    if (batch < 0 || seq < 0 || nk <= 0 || nv <= 0 || nv % nk || dk <= 0 || dk > QD_GDN_MAX_DK || dv <= 0 || dv > 1024 ||
        ld_qkv < 2 * nk * dk + nv * dv || ld_ba < nv)
        return qd_err_set(&be->err, QD_EINVAL, "gated_delta_rule: bad shape (key heads %lld of %lld, value heads %lld of "
                          "%lld (at most 1024), row strides %lld and %lld)", (long long)nk, (long long)dk, (long long)nv,
                          (long long)dv, (long long)ld_qkv, (long long)ld_ba);
    LAUNCH(be, "gated_delta_rule kernel", cudaop_gated_delta_rule(cu_impl(be)->stream, out, qkv, ld_qkv, b, a, ld_ba, a_log,
                                                                  dt_bias, batch, seq, nk, nv, dk, dv));
    return 0;
}

static int cu_gelu_tanh_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    LAUNCH(be, "gelu_tanh_mul kernel", cudaop_gelu_tanh_mul(cu_impl(be)->stream, out, gate, up, n));
    return 0;
}

static int cu_softcap(qd_backend *be, float *x, int64_t n, float cap)
{
    if (!(cap > 0.0f)) return qd_err_set(&be->err, QD_EINVAL, "softcap: cap %g must be positive", (double)cap);
    LAUNCH(be, "softcap kernel", cudaop_softcap(cu_impl(be)->stream, x, n, cap));
    return 0;
}

static int cu_scale(qd_backend *be, float *x, int64_t n, float s)
{
    LAUNCH(be, "scale kernel", cudaop_scale(cu_impl(be)->stream, x, n, s));
    return 0;
}

static int cu_xielu(qd_backend *be, float *x, int64_t n, float ap, float an, float beta, float eps)
{
    LAUNCH(be, "xielu kernel", cudaop_xielu(cu_impl(be)->stream, x, n, ap, an, beta, eps));
    return 0;
}

static int cu_relu(qd_backend *be, float *x, int64_t n)
{
    LAUNCH(be, "relu kernel", cudaop_relu(cu_impl(be)->stream, x, n));
    return 0;
}

static int cu_gelu(qd_backend *be, float *x, int64_t n)
{
    LAUNCH(be, "gelu kernel", cudaop_gelu(cu_impl(be)->stream, x, n));
    return 0;
}

static int cu_gelu_tanh(qd_backend *be, float *x, int64_t n)
{
    LAUNCH(be, "gelu_tanh kernel", cudaop_gelu_tanh(cu_impl(be)->stream, x, n));
    return 0;
}

static int cu_copy_2d(qd_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0 || ldd < cols || lds < cols)
        return qd_err_set(&be->err, QD_EINVAL, "copy_2d: bad shape [%lld, %lld] with strides %lld, %lld", (long long)rows,
                          (long long)cols, (long long)ldd, (long long)lds);
    if (!rows || !cols) return 0;
    CU_TRY(be, cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof *dst, src, (size_t)lds * sizeof *src, (size_t)cols * sizeof *src,
                                 (size_t)rows, cudaMemcpyDeviceToDevice, cu_impl(be)->stream));
    return 0;
}

static int cu_add(qd_backend *be, float *y, const float *x, int64_t n)
{
    LAUNCH(be, "add kernel", cudaop_add(cu_impl(be)->stream, y, x, n));
    return 0;
}

static int cu_conv1d_causal(qd_backend *be, float *y, const float *x, const float *gate_in, const float *gate_out,
                            int64_t ld, int64_t batch, int64_t seq, int64_t ch, const float *w, const float *bias,
                            int64_t kernel, int silu)
{
    if (batch < 0 || seq < 0 || ch < 0 || kernel < 1 || ld < ch)
        return qd_err_set(&be->err, QD_EINVAL, "conv1d_causal: batch %lld, seq %lld, ch %lld, kernel %lld, ld %lld",
                          (long long)batch, (long long)seq, (long long)ch, (long long)kernel, (long long)ld);
    if (y == x || (gate_in && y == gate_in) || (gate_out && y == gate_out))
        return qd_err_set(&be->err, QD_EINVAL, "conv1d_causal: y aliases an input");
    LAUNCH(be, "conv1d_causal kernel", cudaop_conv1d_causal(cu_impl(be)->stream, y, x, gate_in, gate_out, ld, batch, seq,
                                                            ch, w, bias, kernel, silu));
    return 0;
}

static int cu_ssd_scan(qd_backend *be, float *y, const float *x, const float *b, const float *c, int64_t ld,
                       const float *dt, int64_t ld_dt, const float *z, int64_t ld_z, const float *a, const float *d,
                       const float *dt_bias, float dt_min, float dt_max, int64_t batch, int64_t seq, int64_t n_heads,
                       int64_t head_dim, int64_t n_groups, int64_t d_state)
{
    if (batch < 0 || seq < 0 || n_heads < 1 || head_dim < 1 || n_groups < 1 || n_heads % n_groups || d_state < 1 ||
        ld < n_heads * head_dim || ld_dt < n_heads || (z && ld_z < n_heads * head_dim))
        return qd_err_set(&be->err, QD_EINVAL, "ssd_scan: %lld heads of %lld in %lld groups, d_state %lld, ld %lld",
                          (long long)n_heads, (long long)head_dim, (long long)n_groups, (long long)d_state, (long long)ld);
    if (d_state > CUDAOP_SSD_MAX_STATE)
        return qd_err_set(&be->err, QD_EUNSUPPORTED, "ssd_scan: d_state %lld is more than the CUDA kernel's %d",
                          (long long)d_state, CUDAOP_SSD_MAX_STATE);
    LAUNCH(be, "ssd_scan kernel", cudaop_ssd_scan(cu_impl(be)->stream, y, x, b, c, ld, dt, ld_dt, z, ld_z, a, d, dt_bias,
                                                  dt_min, dt_max, batch, seq, n_heads, head_dim, n_groups, d_state));
    return 0;
}

static int cu_add_bias(qd_backend *be, float *y, const float *bias, int64_t rows, int64_t cols)
{
    LAUNCH(be, "add_bias kernel", cudaop_add_bias(cu_impl(be)->stream, y, bias, rows, cols));
    return 0;
}

/* The indices are device memory, so their range is checked by the kernels (a flag read
 * back here, which waits for the stream) and their distinctness is the caller's
 * precondition (backend.h); the shapes go through the shared checks first. */
static int cu_gather_rows(qd_backend *be, float *dst, const float *src, int64_t src_rows, const int32_t *idx,
                          int64_t n_idx, int64_t cols)
{
    int skip = 0, bad = 0;
    int rc = qd_backend_rows_args_check("cuda gather_rows", dst, src, src_rows, idx, NULL, 0, n_idx, cols, &skip,
                                        &be->err);
    if (rc || skip) return rc;
    LAUNCH(be, "gather_rows kernel",
           cudaop_gather_rows(cu_impl(be)->stream, dst, src, src_rows, idx, n_idx, cols, cu_impl(be)->flag));
    if ((rc = cu_flag_take(be, &bad))) return rc;
    if (bad)
        return qd_err_set(&be->err, QD_EINVAL, "cuda gather_rows: an index of the %lld is outside the %lld rows",
                          (long long)n_idx, (long long)src_rows);
    return 0;
}

static int cu_scatter_add_rows(qd_backend *be, float *dst, int64_t dst_rows, const float *src, const int32_t *idx,
                               const float *w, int64_t n_idx, int64_t cols)
{
    int skip = 0, bad = 0;
    int rc = qd_backend_rows_args_check("cuda scatter_add_rows", dst, src, dst_rows, idx, w, 1, n_idx, cols, &skip,
                                        &be->err);
    if (rc || skip) return rc;
    LAUNCH(be, "scatter_add_rows kernel",
           cudaop_scatter_add_rows(cu_impl(be)->stream, dst, dst_rows, src, idx, w, n_idx, cols, cu_impl(be)->flag));
    if ((rc = cu_flag_take(be, &bad))) return rc;
    if (bad)
        return qd_err_set(&be->err, QD_EINVAL, "cuda scatter_add_rows: an index of the %lld is outside the %lld rows "
                          "(those rows were skipped)", (long long)n_idx, (long long)dst_rows);
    return 0;
}

static int cu_nll_rows(qd_backend *be, const float *logits, const int32_t *targets, int64_t rows, int64_t vocab,
                       double *nll_host)
{
    if (rows <= 0) return 0;
    double *d = cu_alloc(be, (size_t)rows * sizeof(double));
    if (!d) return QD_ENOMEM;
    int bad = 0, rc = 0;
    int e = cudaop_nll_rows(cu_impl(be)->stream, logits, targets, rows, vocab, d, cu_impl(be)->flag);
    if (e) rc = cu_fail(be, "nll_rows kernel", cudaGetErrorString((cudaError_t)e), __FILE__, __LINE__);
    if (!rc) rc = cu_download(be, nll_host, d, (size_t)rows * sizeof(double));
    if (!rc) rc = cu_flag_take(be, &bad);
    cu_free(be, d);
    if (!rc && bad)
        rc = qd_err_set(&be->err, QD_EINVAL, "nll_rows: a target of the %lld rows is outside the vocabulary [0, %lld)",
                        (long long)rows, (long long)vocab);
    return rc;
}

/* ---- assembly ------------------------------------------------------------------------ */

/* No chol_ldl_upper (GPTQ's LDL form runs the Cholesky-inverse form here), attention_bf16
 * (a bf16 job's attention runs in F32) or trim. */
#define CU_OP_ENTRY(ret, name, params) .name = cu_##name,
static const qd_backend_ops cuda_ops = {
    QD_BACKEND_OPS_REQUIRED(CU_OP_ENTRY)
    .gemm_nt_bf16 = cu_gemm_nt_bf16,
    .hessian_accum_bf16 = cu_hessian_accum_bf16,
};
#undef CU_OP_ENTRY

void qd_backend_cuda_close(qd_backend *be)
{
    if (!be) return;
    cuda_impl *im = be->impl;
    if (im) {
        (void)cudaSetDevice(be->device);
        if (im->stream) (void)cudaStreamSynchronize(im->stream);
        if (im->flag) (void)cudaFree(im->flag);
        if (im->red) (void)cudaFree(im->red);
        if (im->solver) (void)cusolverDnDestroy(im->solver);
        if (im->blas) (void)cublasDestroy(im->blas);
        if (im->stream) (void)cudaStreamDestroy(im->stream);
        if (im->pool) (void)cudaMemPoolDestroy(im->pool);
        (void)cudaGetLastError();
        free(im);
    }
    free(be);
}

/* The setup steps of qd_backend_cuda_open; the error names the one that failed. */
static int cu_setup(qd_backend *be, cuda_impl *im)
{
    CU_TRY(be, cudaSetDevice(be->device));
    CU_TRY(be, cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = be->device;
    CU_TRY(be, cudaMemPoolCreate(&im->pool, &props));
    /* Keep freed blocks in the pool: the pipeline allocates the same sizes layer after layer. */
    uint64_t keep = UINT64_MAX;
    CU_TRY(be, cudaMemPoolSetAttribute(im->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    BLAS_TRY(be, cublasCreate(&im->blas));
    BLAS_TRY(be, cublasSetStream(im->blas, im->stream));
    /* Plain F32 arithmetic (no TF32) so results match the CPU reference within float rounding. */
    BLAS_TRY(be, cublasSetMathMode(im->blas, CUBLAS_PEDANTIC_MATH));
    SOLVER_TRY(be, cusolverDnCreate(&im->solver));
    SOLVER_TRY(be, cusolverDnSetStream(im->solver, im->stream));
    CU_TRY(be, cudaMalloc((void **)&im->flag, sizeof(int)));
    /* On the backend's own stream, and waited for: a plain cudaMemset goes to the legacy
     * stream, which this non-blocking stream does not wait for. */
    CU_TRY(be, cudaMemsetAsync(im->flag, 0, sizeof(int), im->stream));
    CU_TRY(be, cudaStreamSynchronize(im->stream));
    CU_TRY(be, cudaMalloc((void **)&im->red, (CUDAOP_REDUCE_BLOCKS + 1) * sizeof(double)));
    return 0;
}

int qd_backend_cuda_open(int device, qd_backend **out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "cuda backend: NULL output pointer");
    *out = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    if (device < 0 || device >= count)
        return qd_err_set(err, QD_ENOTFOUND, "cuda backend: device %d is not one of the %d visible", device, count);
    qd_backend *be = calloc(1, sizeof *be);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        return qd_err_set(err, QD_ENOMEM, "cuda backend: out of memory");
    }
    be->ops = &cuda_ops;
    be->impl = im;
    be->name = "cuda";
    be->device = device;
    be->n_threads = 1;
    int rc = cu_setup(be, im);
    int major = 0;   /* bf16 tensor cores from compute capability 8.0 (Ampere) */
    if (!rc && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess)
        be->bf16_native = major >= 8;
    int minor = 0;
    struct cudaDeviceProp prop;
    if (!rc && cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
        cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(be->desc, sizeof be->desc, "cuda %.80s sm_%d%d", prop.name, major, minor);
    else
        snprintf(be->desc, sizeof be->desc, "cuda sm_%d", major);
    if (rc) {
        qd_err_set(err, rc, "%s", be->err.msg);
        qd_backend_cuda_close(be);
        return rc;
    }
    *out = be;
    return 0;
}
