/* The CPU backend: host memory, OpenBLAS for the dense linear algebra, LAPACKE for the
 * Cholesky factorisations, and a cache-friendly GPTQ block kernel. It also assembles the
 * ops table from the other cpu_*.c files (see cpu_internal.h).
 *
 * Everything is host memory, so upload/download/copy are memcpy. Results are deterministic
 * for a fixed thread count on a fixed machine: OpenBLAS partitions its work statically, and
 * the GPTQ kernel processes rows independently in a fixed order. */
#include "quant/backend/cpu/cpu_internal.h"

#include <cblas.h>
#include <stdio.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend_args.h"
#include "quant/backend/cpu/cpu_bf16.h"
#include "quant/core/parallel.h"
#include "quant/formats/quantizer.h"

/* ---- memory -------------------------------------------------------------------------- */

/* A fresh block at least this large has its pages faulted in by every thread at once. */
#define CPU_PREFAULT_MIN_BYTES ((size_t)16 << 20)
#define CPU_PAGE_BYTES 4096

static void prefault_range(void *ctx, int t, int64_t p0, int64_t p1)
{
    (void)t;
    volatile char *base = ctx;
    for (int64_t i = p0; i < p1; i++) base[i * CPU_PAGE_BYTES] = 0;
}

void *cpu_alloc(qd_backend *be, size_t bytes)
{
    cpu_impl *impl = be->impl;
    /* 64-byte alignment keeps AVX-512 loads and OpenBLAS panels on cache lines. */
    int fresh = 0;
    void *p = cpu_mem_alloc_ex(&impl->mem, bytes, &fresh);
    if (!p) {
        qd_err_set(&be->err, QD_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    /* A new large block's first writes are page faults, each a page the kernel zeroes; a
     * single-threaded writer (a copy, a permutation) would take them all on one core. The
     * block's contents are undefined to the caller, so zeros cost nothing. */
    if (fresh && bytes >= CPU_PREFAULT_MIN_BYTES && be->n_threads > 1)
        qd_parallel_for(be->n_threads, (int64_t)((bytes + CPU_PAGE_BYTES - 1) / CPU_PAGE_BYTES), 1024,
                        prefault_range, p);
    return p;
}

void cpu_free(qd_backend *be, void *p)
{
    cpu_impl *impl = be->impl;
    cpu_mem_free(&impl->mem, p);
}

void cpu_trim(qd_backend *be)
{
    cpu_impl *impl = be->impl;
    cpu_mem_trim(&impl->mem);
}

void qd_backend_cpu_close(qd_backend *be)
{
    cpu_impl *impl = be->impl;
    if (impl) cpu_mem_destroy(&impl->mem);
    free(impl);
    free(be);
}

static int cpu_memcpy(qd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes && (!dst || !src))
        return qd_err_set(&be->err, QD_EINVAL, "cpu backend: copy of %zu bytes with a NULL pointer", bytes);
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

/* Host memory: upload, download and copy are the same move. */
int cpu_upload(qd_backend *be, void *dst, const void *src, size_t bytes) { return cpu_memcpy(be, dst, src, bytes); }
int cpu_download(qd_backend *be, void *dst, const void *src, size_t bytes) { return cpu_memcpy(be, dst, src, bytes); }
int cpu_copy(qd_backend *be, void *dst, const void *src, size_t bytes) { return cpu_memcpy(be, dst, src, bytes); }

int cpu_memset0(qd_backend *be, void *dst, size_t bytes)
{
    if (bytes && !dst)
        return qd_err_set(&be->err, QD_EINVAL, "cpu backend: memset0 of %zu bytes on NULL", bytes);
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

int cpu_sync(qd_backend *be) { return 0; }

/* ---- linear algebra ------------------------------------------------------------------ */

int cpu_gemm(qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
             const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
             float *c, int64_t ldc)
{
    if (m < 0 || n < 0 || k < 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu gemm: negative shape m=%lld n=%lld k=%lld",
                          (long long)m, (long long)n, (long long)k);
    if (m == 0 || n == 0) return 0;
    int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
    if (!c || (k > 0 && (!a || !b)) || ldc < n || (k > 0 && (lda < a_cols || ldb < b_cols)))
        return qd_err_set(&be->err, QD_EINVAL,
                          "cpu gemm: bad operands (m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld)",
                          (long long)m, (long long)n, (long long)k, (long long)lda,
                          (long long)ldb, (long long)ldc);
    if (k == 0) {
        /* BLAS would still scale C; do it here so no zero-length operand reaches OpenBLAS. */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return 0;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
                c, (blasint)ldc);
    return 0;
}

/* Copies the upper triangle of the row-major k x k matrix h onto its lower triangle, in
 * 64 x 64 tiles so that the transposed reads stay in cache. */
void cpu_symmetrize_from_upper(float *h, int64_t k)
{
    const int64_t T = 64;
    for (int64_t i0 = 0; i0 < k; i0 += T)
        for (int64_t j0 = 0; j0 <= i0; j0 += T) {
            int64_t i1 = i0 + T < k ? i0 + T : k, j1 = j0 + T < k ? j0 + T : k;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1 && j < i; j++) h[i * k + j] = h[j * k + i];
        }
}

int cpu_hessian_accum(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows,
                      int64_t ldx, int64_t n_seen)
{
    if (!h || k <= 0 || rows < 0 || n_seen < 0 || (rows > 0 && (!x || ldx < k)))
        return qd_err_set(&be->err, QD_EINVAL,
                          "cpu hessian_accum: bad arguments (k=%lld rows=%lld ldx=%lld n_seen=%lld)",
                          (long long)k, (long long)rows, (long long)ldx, (long long)n_seen);
    if (rows == 0) return 0;
    float alpha, beta;
    qd_backend_hessian_weights(n_seen, rows, &alpha, &beta);
    /* H = beta H + alpha X^T X on the upper triangle; the reference scales X by
     * sqrt(2 / n) instead, the same quantity up to rounding. */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (blasint)k, (blasint)rows, alpha, x,
                (blasint)ldx, beta, h, (blasint)k);
    cpu_symmetrize_from_upper(h, k);
    return 0;
}

/* The tiles serve "compute": "bf16" where the CPU has them and the runtime options leave
 * the CPU kernels at auto (QUANTD_CPU_KERNEL=portable or avx2 keeps them off). */
int cpu_amx_on(const qd_backend *be)
{
    return be->rt.cpu_kernel == QD_CPU_KERNEL_AUTO && cpu_bf16_amx_usable();
}

int cpu_gemm_nt_bf16(qd_backend *be, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int skip = 0;
    int64_t lda_ok = lda, ldb_ok = ldb;
    int rc = qd_backend_gemm_args_check("cpu gemm_nt_bf16", 0, 1, m, n, k, a, lda, b, ldb, c, ldc, &skip, &lda_ok,
                                        &ldb_ok, &be->err);
    if (rc || skip) return rc;
    if (k == 0) {
        for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof *c);
        return 0;
    }
    if (cpu_bf16_gemm_nt(cpu_amx_on(be), be->n_threads, m, n, k, a, lda_ok, b, ldb_ok, c, ldc))
        return qd_err_set(&be->err, QD_ENOMEM, "cpu gemm_nt_bf16: cannot allocate the bf16 copies of a [%lld x %lld] "
                          "product's operands", (long long)m, (long long)n);
    return 0;
}

int cpu_hessian_accum_bf16(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows,
                           int64_t ldx, int64_t n_seen)
{
    int rc = qd_backend_hessian_args_check("cpu hessian_accum_bf16", h, k, x, rows, ldx, n_seen, &be->err);
    if (rc || rows == 0) return rc;
    float alpha, beta;
    qd_backend_hessian_weights(n_seen, rows, &alpha, &beta);
    if (cpu_bf16_syrk(cpu_amx_on(be), be->n_threads, k, x, rows, ldx, alpha, beta, h))
        return qd_err_set(&be->err, QD_ENOMEM, "cpu hessian_accum_bf16: cannot allocate the bf16 copies of %lld rows "
                          "of %lld features", (long long)rows, (long long)k);
    return 0;
}

/* Reverses the k*k elements of h: element (i, j) moves to (k-1-i, k-1-j), i.e. h becomes
 * J h J with J the exchange matrix. */
static void cpu_reverse_square(float *h, int64_t k)
{
    for (int64_t i = 0, j = k * k - 1; i < j; i++, j--) {
        float t = h[i];
        h[i] = h[j];
        h[j] = t;
    }
}

/* H -> U, the upper Cholesky factor of H^-1 (H^-1 = U^T U), the matrix the reference gets
 * from cholesky(cholesky_inverse(cholesky(H)), upper=True).
 *
 * We reach the same (unique) factor with half the flops and without forming H^-1: with J
 * the exchange matrix, factor J H J = L L^T (lower); then H^-1 = (J L^-T J)(J L^-1 J), and
 * J L^-1 J is upper triangular with a positive diagonal, so it is U. That is one potrf and
 * one trtri (k^3/3 flops each) instead of potrf + potri + potrf (4k^3/3); reversing the
 * flat array is J.J. A row-major lower triangle is a column-major upper one in the same
 * memory, so LAPACK runs column-major 'U' and never transposes a copy. */
int cpu_chol_inverse_upper(qd_backend *be, float *h, int64_t k)
{
    if (!h || k <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu chol_inverse_upper: bad arguments (k=%lld)", (long long)k);
    lapack_int n = (lapack_int)k, info;
    cpu_reverse_square(h, k);
    info = LAPACKE_spotrf_work(LAPACK_COL_MAJOR, 'U', n, h, n);
    if (info != 0) {
        return qd_err_set(&be->err, QD_ENUMERIC,
                          "cpu chol_inverse_upper: the Hessian [%lld x %lld] is not positive definite "
                          "(Cholesky failed at column %lld)", (long long)k, (long long)k,
                          (long long)(info > 0 ? k - info : -1));
    }
    info = LAPACKE_strtri_work(LAPACK_COL_MAJOR, 'U', 'N', n, h, n);
    if (info != 0)
        return qd_err_set(&be->err, QD_ENUMERIC,
                          "cpu chol_inverse_upper: inverting the Cholesky factor failed (info %d)", (int)info);
    cpu_reverse_square(h, k);
    for (int64_t i = 1; i < k; i++) memset(h + i * k, 0, (size_t)i * sizeof(float));
    for (int64_t i = 0; i < k; i++)
        if (!isfinite(h[i * k + i]) || h[i * k + i] <= 0.0f)
            return qd_err_set(&be->err, QD_ENUMERIC,
                              "cpu chol_inverse_upper: factor diagonal %lld is %g", (long long)i,
                              (double)h[i * k + i]);
    for (int64_t i = 0; i < k * k; i++)
        if (!isfinite(h[i]))
            return qd_err_set(&be->err, QD_ENUMERIC, "cpu chol_inverse_upper: factor entry [%lld][%lld] is not finite",
                              (long long)(i / k), (long long)(i % k));
    return 0;
}

/* Row i of R (entries j >= i set) becomes row i of A = R diag(R)^-1 with its lower part
 * zeroed and D_ii = R_ii^2 on the diagonal; d is R's diagonal. Returns -1, or the flat
 * index of a non-finite entry. */
static int64_t cpu_ldl_finish_row(float *row, int64_t i, int64_t k, const float *d)
{
    memset(row, 0, (size_t)i * sizeof(float));
    row[i] = d[i] * d[i];
    if (!isfinite(row[i])) return i * k + i;
    int ok = 1;
    for (int64_t j = i + 1; j < k; j++) {
        row[j] /= d[j];
        ok &= isfinite(row[j]) != 0;
    }
    if (ok) return -1;
    for (int64_t j = i + 1; j < k; j++)
        if (!isfinite(row[j])) return i * k + j;
    return -1;
}

/* H -> A = R diag(R)^-1 with H = R R^T, R upper, and D = R_jj^2 on A's diagonal (GPTQ's
 * LDL form, see gptq_block.h).
 * Factor J H J = L L^T (lower) as in cpu_chol_inverse_upper; then H = (J L J)(J L J)^T
 * and J L J is upper with a positive diagonal, so R = J L J: one potrf (k^3/3 flops) and
 * no trtri. */
int cpu_chol_ldl_upper(qd_backend *be, float *h, int64_t k)
{
    if (!h || k <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "cpu chol_ldl_upper: bad arguments (k=%lld)", (long long)k);
    lapack_int n = (lapack_int)k;
    cpu_reverse_square(h, k);
    lapack_int info = LAPACKE_spotrf_work(LAPACK_COL_MAJOR, 'U', n, h, n);
    if (info != 0)
        return qd_err_set(&be->err, QD_ENUMERIC,
                          "cpu chol_ldl_upper: the Hessian [%lld x %lld] is not positive definite "
                          "(Cholesky failed at column %lld)", (long long)k, (long long)k,
                          (long long)(info > 0 ? k - info : -1));
    /* R = J P J where P is potrf's output (the flat array reversed): R[i][j] = P[k-1-i][k-1-j].
     * R's diagonal first, then rows i and k-1-i together in one pass that reverses only
     * the halves R keeps, divides column j by R[j][j], zeroes the lower triangle and checks
     * every entry. */
    float *d = malloc((size_t)(2 * k) * sizeof *d), *tmp = d ? d + k : NULL;
    if (!d) return qd_err_set(&be->err, QD_ENOMEM, "cpu chol_ldl_upper: out of memory");
    for (int64_t j = 0; j < k; j++) {
        const float dj = h[(k - 1 - j) * k + (k - 1 - j)];
        if (!isfinite(dj) || dj <= 0.0f) {
            free(d);
            return qd_err_set(&be->err, QD_ENUMERIC, "cpu chol_ldl_upper: factor diagonal %lld is %g",
                              (long long)j, (double)dj);
        }
        d[j] = dj;
    }
    int64_t bad = -1;
    for (int64_t a = 0; a <= (k - 1) / 2 && bad < 0; a++) {
        const int64_t b = k - 1 - a;
        float *ra = h + a * k, *rb = h + b * k;
        for (int64_t j = 0; j <= a; j++) tmp[j] = ra[j];          /* P[a][0..a] */
        for (int64_t j = a; j < k; j++) ra[j] = rb[k - 1 - j];     /* R[a][j] = P[b][k-1-j] */
        for (int64_t j = b; j < k; j++) rb[j] = tmp[k - 1 - j];    /* R[b][j] = P[a][k-1-j] */
        bad = cpu_ldl_finish_row(ra, a, k, d);
        if (bad < 0 && b != a) bad = cpu_ldl_finish_row(rb, b, k, d);
    }
    free(d);
    if (bad >= 0)
        return qd_err_set(&be->err, QD_ENUMERIC, "cpu chol_ldl_upper: factor entry [%lld][%lld] is not finite",
                          (long long)(bad / k), (long long)(bad % k));
    return 0;
}

/* ---- assembly ------------------------------------------------------------------------ */

/* Every op of the list, cpu_<name> (cpu_internal.h declares them from the same list). */
#define CPU_OP_ENTRY(ret, name, params) .name = cpu_##name,
static const qd_backend_ops cpu_ops = {
    QD_BACKEND_OPS_REQUIRED(CPU_OP_ENTRY)
    QD_BACKEND_OPS_OPTIONAL(CPU_OP_ENTRY)
};
#undef CPU_OP_ENTRY

int qd_backend_cpu_open(int n_threads, const qd_runtime_opts *rt, qd_backend **out, qd_err *err)
{
    qd_runtime_opts def = qd_runtime_opts_default();
    if (!rt) rt = &def;
    if (!out) return qd_err_set(err, QD_EINVAL, "cpu backend: NULL output pointer");
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return qd_err_set(err, QD_EINVAL, "cpu backend: %d threads is not in 1..1024", n_threads);
    qd_backend *be = calloc(1, sizeof *be);
    cpu_impl *impl = calloc(1, sizeof *impl);
    if (!be || !impl) {
        free(be);
        free(impl);
        return qd_err_set(err, QD_ENOMEM, "cpu backend: out of memory");
    }
    impl->gptq_rows = cpu_gptq_rows_pick(rt->cpu_kernel);
    cpu_mem_init(&impl->mem, cpu_mem_default_cap(rt->cpu_cache_mb));
    be->ops = &cpu_ops;
    be->impl = impl;
    be->name = "cpu";
    be->device = -1;
    be->n_threads = n_threads;
    be->rt = *rt;
    be->rt.fault_inject = NULL;
    be->bf16_native = cpu_amx_on(be);
    snprintf(be->desc, sizeof be->desc, "cpu openblas=%s gptq=%s amx=%d threads=%d", openblas_get_corename(),
             cpu_gptq_rows_name(impl->gptq_rows), be->bf16_native, n_threads);
    /* OpenBLAS keeps its thread count process-wide; a worker owns one backend, so the
     * last backend opened in a process sets it. */
    openblas_set_num_threads(n_threads);
    *out = be;
    return 0;
}
