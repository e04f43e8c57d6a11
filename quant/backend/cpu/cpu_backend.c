/* The CPU backend: host memory, OpenBLAS for the dense linear algebra, LAPACKE for the
 * Cholesky factorisations, and a cache-friendly GPTQ block kernel. It also assembles the
 * ops table from the other cpu_*.c files (see cpu_internal.h).
 *
 * Everything is host memory, so upload/download/copy are memcpy. Results are deterministic
 * for a fixed thread count on a fixed machine: OpenBLAS partitions its work statically, and
 * the GPTQ kernel processes rows independently in a fixed order. */
#include "quant/backend/cpu/cpu_internal.h"

#include <cblas.h>
#include <immintrin.h>
#include <lapacke.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quant/algo/gptq_block.h"
#include "quant/algo/quantizer.h"

/* The GPTQ block kernel for rows [r0, r1) of a block (see cpu_gptq_block), with per-thread
 * scratch of CPU_GPTQ_SCRATCH(B) floats. */
typedef void (*cpu_gptq_rows_fn)(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch);

#define CPU_GPTQ_MAX_THREADS 64

typedef struct cpu_impl {
    cpu_gptq_rows_fn gptq_rows; /* chosen once at open from the CPU's features */
    cpu_mem mem;                /* large blocks kept for reuse (cpu_mem.h) */
} cpu_impl;

/* ---- memory -------------------------------------------------------------------------- */

static void *cpu_alloc(qd_backend *be, size_t bytes)
{
    cpu_impl *impl = be->impl;
    /* 64-byte alignment keeps AVX-512 loads and OpenBLAS panels on cache lines. */
    void *p = cpu_mem_alloc(&impl->mem, bytes);
    if (!p) qd_err_set(&be->err, QD_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    return p;
}

static void cpu_free(qd_backend *be, void *p)
{
    cpu_impl *impl = be->impl;
    cpu_mem_free(&impl->mem, p);
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

static int cpu_memset0(qd_backend *be, void *dst, size_t bytes)
{
    if (bytes && !dst)
        return qd_err_set(&be->err, QD_EINVAL, "cpu backend: memset0 of %zu bytes on NULL", bytes);
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

static int cpu_sync(qd_backend *be) { return 0; }

/* ---- linear algebra ------------------------------------------------------------------ */

static int cpu_gemm(qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
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
static void cpu_symmetrize_from_upper(float *h, int64_t k)
{
    const int64_t T = 64;
    for (int64_t i0 = 0; i0 < k; i0 += T)
        for (int64_t j0 = 0; j0 <= i0; j0 += T) {
            int64_t i1 = i0 + T < k ? i0 + T : k, j1 = j0 + T < k ? j0 + T : k;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1 && j < i; j++) h[i * k + j] = h[j * k + i];
        }
}

static int cpu_hessian_accum(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows,
                             int64_t ldx, int64_t n_seen)
{
    if (!h || k <= 0 || rows < 0 || n_seen < 0 || (rows > 0 && (!x || ldx < k)))
        return qd_err_set(&be->err, QD_EINVAL,
                          "cpu hessian_accum: bad arguments (k=%lld rows=%lld ldx=%lld n_seen=%lld)",
                          (long long)k, (long long)rows, (long long)ldx, (long long)n_seen);
    if (rows == 0) return 0;
    double total = (double)n_seen + (double)rows;
    float beta = (float)((double)n_seen / total);
    float alpha = (float)(2.0 / total);
    /* H = beta H + alpha X^T X on the upper triangle; the reference scales X by
     * sqrt(2 / n) instead, the same quantity up to rounding. */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (blasint)k, (blasint)rows, alpha, x,
                (blasint)ldx, beta, h, (blasint)k);
    cpu_symmetrize_from_upper(h, k);
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
static int cpu_chol_inverse_upper(qd_backend *be, float *h, int64_t k)
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
 * zeroed; d is R's diagonal. Returns -1, or the flat index of a non-finite entry. */
static int64_t cpu_ldl_finish_row(float *row, int64_t i, int64_t k, const float *d)
{
    memset(row, 0, (size_t)i * sizeof(float));
    row[i] = 1.0f;
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

/* H -> A = R diag(R)^-1 with H = R R^T, R upper (GPTQ's LDL form, see gptq_block.h).
 * Factor J H J = L L^T (lower) as in cpu_chol_inverse_upper; then H = (J L J)(J L J)^T
 * and J L J is upper with a positive diagonal, so R = J L J: one potrf (k^3/3 flops) and
 * no trtri. */
static int cpu_chol_ldl_upper(qd_backend *be, float *h, int64_t k)
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

/* ---- GPTQ block ---------------------------------------------------------------------- */

/* Rows of the block processed together: each Hinv row is read once per batch, and the
 * SIMD kernels hold one column of a batch in one register (8 lanes with AVX2, 16 with
 * AVX-512). Threads split the rows in whole batches of the widest kernel. */
#define CPU_GPTQ_ROWS 16

/* Scratch floats per thread: the block copy, errors, Q, codes, the original weights and
 * the group-parameter state (LDL form), each [B][16], then k floats for one row. */
#define CPU_GPTQ_SCRATCH(B, k) (((size_t)(6 * CPU_GPTQ_ROWS) * (size_t)(B) + (size_t)(k) + 15) / 16 * 16)

/* Dynamic groups: the parameters of every group that starts inside the block, for row r,
 * from the U form's weights as they stood when the block started: w itself, or in the LDL
 * form w + D with D_c = acc_c - sum_{i1 <= i < c} D_i hinv[i][c] (see gptq_block.h), which
 * is solved here row by row into tmp [k] over the columns the groups need. */
static void cpu_gptq_find_params(const qd_gptq_block_args *a, int64_t r, float *tmp)
{
    const int64_t k = a->k, i1 = a->i1, i2 = a->i2;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : k;
    const int64_t j0 = (i1 + gs - 1) / gs * gs;
    const float *wr = a->w + r * a->ldw;
    if (a->ldl && a->acc && j0 < i2) {
        int64_t jl = j0 + (i2 - 1 - j0) / gs * gs;             /* the last group start in the block */
        int64_t end = jl + gs < k ? jl + gs : k;
        const float *ar = a->acc + r * a->lda;
        for (int64_t c = i1; c < end; c++) tmp[c - i1] = ar[c];
        for (int64_t i = i1; i < end; i++) {
            const float *hrow = a->hinv + i * a->ldh;
            float d = tmp[i - i1];
            for (int64_t c = i + 1; c < end; c++) tmp[c - i1] -= d * hrow[c];
        }
        for (int64_t c = i1; c < end; c++) tmp[c - i1] += wr[c];
    }
    for (int64_t j = j0; j < i2; j += gs) {
        int64_t len = j + gs <= k ? gs : k - j;
        int64_t g = a->col_group[j];
        const float *src = a->ldl && a->acc ? tmp + (j - i1) : wr + j;
        qd_quant_params(a->cfg, src, len, 1, &a->scales[g * a->n + r], &a->zeros[g * a->n + r]);
    }
}

/* Whether the LDL form's group parameters can be found on the block copy: dynamic groups,
 * corrections present, and every group that starts in the block ends inside it. */
static int cpu_gptq_ldl_vec_params(const qd_gptq_block_args *a)
{
    if (!a->find_params || !a->ldl || !a->acc) return 0;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : a->k;
    const int64_t j0 = (a->i1 + gs - 1) / gs * gs;
    if (j0 >= a->i2) return 0;                                  /* no group starts here */
    int64_t jl = j0 + (a->i2 - 1 - j0) / gs * gs;
    return (jl + gs < a->k ? jl + gs : a->k) <= a->i2;
}

/* The parameters of the groups in the block for the rows of a batch of `lanes` rows, from
 * pl [B][lanes] = w + D (see cpu_gptq_find_params), read with a stride. */
static void cpu_gptq_params_from_batch(const qd_gptq_block_args *a, int64_t rb, int nr, const float *pl,
                                       int lanes)
{
    const int64_t k = a->k, i1 = a->i1, i2 = a->i2;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : k;
    for (int rr = 0; rr < nr; rr++)
        for (int64_t j = (i1 + gs - 1) / gs * gs; j < i2; j += gs) {
            int64_t len = j + gs <= k ? gs : k - j, g = a->col_group[j], r = rb + rr;
            qd_quant_params(a->cfg, pl + (j - i1) * lanes + rr, len, lanes, &a->scales[g * a->n + r],
                            &a->zeros[g * a->n + r]);
        }
}

/* Where row r's Q goes: q when given, else w (see gptq_block.h). */
static inline float *cpu_gptq_qrow(const qd_gptq_block_args *a, int64_t r)
{
    return a->q ? a->q + r * a->ldq : a->w + r * a->ldw;
}

/* Row r's slice [i1, i2) of the updated weights (w, or w + acc) into dst with stride st. */
static void cpu_gptq_load_row(const qd_gptq_block_args *a, int64_t r, float *dst, int64_t st)
{
    const int64_t i1 = a->i1, B = a->i2 - a->i1;
    const float *src = a->w + r * a->ldw + i1;
    if (a->ldl && a->acc) {
        const float *ac = a->acc + r * a->lda + i1;
        for (int64_t i = 0; i < B; i++) dst[i * st] = src[i] + ac[i];
    } else {
        for (int64_t i = 0; i < B; i++) dst[i * st] = src[i];
    }
}

/* Portable kernel: rows [r0, r1) in batches, each row's slice of the block in scratch. */
static void cpu_gptq_rows_ref(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int maxq = qd_quant_maxq(a->cfg);
    const int64_t n = a->n, i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch;                                     /* [16][B] */
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    for (int64_t rb = r0; rb < r1; rb += CPU_GPTQ_ROWS) {
        int nr = (int)(r1 - rb < CPU_GPTQ_ROWS ? r1 - rb : CPU_GPTQ_ROWS);
        for (int rr = 0; rr < nr; rr++) {
            if (a->find_params) cpu_gptq_find_params(a, rb + rr, tmp);
            cpu_gptq_load_row(a, rb + rr, w1 + rr * B, 1);
        }
        for (int64_t i = 0; i < B; i++) {
            int64_t j = i1 + i, g = a->col_group[j];
            const float *hrow = a->hinv + j * a->ldh;
            for (int rr = 0; rr < nr; rr++) {
                int64_t r = rb + rr;
                float s = a->scales[g * n + r], z = a->zeros[g * n + r];
                float *y = w1 + rr * B;
                float x = y[i];
                int code = qd_quant_code(x, s, z, maxq);
                float qv = qd_quant_dequant(code, s, z);
                /* LDL form: the original weight's error, added (see gptq_block.h). */
                float e = a->ldl ? a->w[r * a->ldw + j] - qv : (x - qv) / hrow[j];
                if (a->ldl)
                    for (int64_t c = i + 1; c < B; c++) y[c] += e * hrow[i1 + c];
                else
                    for (int64_t c = i + 1; c < B; c++) y[c] -= e * hrow[i1 + c];
                a->err[r * a->lde + i] = e;
                a->codes[r * a->ldc + j] = (uint8_t)code;
                cpu_gptq_qrow(a, r)[j] = qv;
            }
        }
    }
}

/* AVX2 kernel: a batch of 8 rows is stored column-major ([B][8]), so one column of the
 * batch is one register: quantization runs on 8 rows at once with the same operations as
 * qd_quant_code / qd_quant_dequant (divide, round half to even, add zero, clamp), and the
 * in-block update of column c is one FMA with Hinv[j][c] broadcast. */
__attribute__((target("avx2,fma")))
static void cpu_gptq_rows_avx2(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t n = a->n, i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch, *el = w1 + B * 8, *ql = el + B * 8, *cl = ql + B * 8, *w0 = cl + B * 8, *pl = w0 + B * 8;
    const int vec_params = cpu_gptq_ldl_vec_params(a);
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    const __m256 v0 = _mm256_setzero_ps(), vmaxq = _mm256_set1_ps((float)qd_quant_maxq(a->cfg));
    for (int64_t rb = r0; rb < r1; rb += 8) {
        int nr = (int)(r1 - rb < 8 ? r1 - rb : 8);
        for (int rr = 0; rr < 8; rr++) {
            if (rr < nr && a->find_params && !vec_params) cpu_gptq_find_params(a, rb + rr, tmp);
            const float *src = a->w + (rb + rr) * a->ldw + i1;
            if (rr < nr) cpu_gptq_load_row(a, rb + rr, w1 + rr, 8);
            else for (int64_t i = 0; i < B; i++) w1[i * 8 + rr] = 0.0f;
            if (a->ldl) for (int64_t i = 0; i < B; i++) w0[i * 8 + rr] = rr < nr ? src[i] : 0.0f;
            if (vec_params) {
                const float *ac = a->acc + (rb + rr) * a->lda + i1;
                for (int64_t i = 0; i < B; i++) pl[i * 8 + rr] = rr < nr ? ac[i] : 0.0f;
            }
        }
        if (vec_params) {
            /* D_c = acc_c - sum_{i < c} D_i A[i][c], then w + D (cpu_gptq_find_params) */
            for (int64_t i = 0; i < B; i++) {
                __m256 dv = _mm256_loadu_ps(pl + i * 8);
                const float *hc = a->hinv + (i1 + i) * a->ldh + i1;
                for (int64_t c = i + 1; c < B; c++)
                    _mm256_storeu_ps(pl + c * 8, _mm256_fnmadd_ps(dv, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(pl + c * 8)));
                _mm256_storeu_ps(pl + i * 8, _mm256_add_ps(dv, _mm256_loadu_ps(w0 + i * 8)));
            }
            cpu_gptq_params_from_batch(a, rb, nr, pl, 8);
        }
        int64_t gcur = -1;
        __m256 vs = v0, vz = v0;
        for (int64_t i = 0; i < B; i++) {
            int64_t j = i1 + i, g = a->col_group[j];
            if (g != gcur) {
                /* Missing rows of a short batch get scale 1, zero 0: harmless, never stored. */
                float s8[8], z8[8];
                for (int rr = 0; rr < 8; rr++) {
                    s8[rr] = rr < nr ? a->scales[g * n + rb + rr] : 1.0f;
                    z8[rr] = rr < nr ? a->zeros[g * n + rb + rr] : 0.0f;
                }
                vs = _mm256_loadu_ps(s8);
                vz = _mm256_loadu_ps(z8);
                gcur = g;
            }
            const float *hrow = a->hinv + j * a->ldh;
            __m256 x = _mm256_loadu_ps(w1 + i * 8);
            __m256 v = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(x, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
            v = _mm256_min_ps(_mm256_max_ps(v, v0), vmaxq);
            __m256 qv = _mm256_mul_ps(vs, _mm256_sub_ps(v, vz));
            /* LDL form: e is the original weight's error and the update adds e * A, done
             * below as w1 - (-e) * A (negation is exact, so this is the fused w1 + e * A). */
            __m256 e = a->ldl ? _mm256_sub_ps(_mm256_loadu_ps(w0 + i * 8), qv)
                              : _mm256_div_ps(_mm256_sub_ps(x, qv), _mm256_set1_ps(hrow[j]));
            _mm256_storeu_ps(el + i * 8, e);
            if (a->ldl) e = _mm256_sub_ps(v0, e);
            _mm256_storeu_ps(ql + i * 8, qv);
            _mm256_storeu_ps(cl + i * 8, v);
            float *wc = w1 + (i + 1) * 8;
            const float *hc = hrow + j + 1;
            int64_t len = B - i - 1, c = 0;
            for (; c + 4 <= len; c += 4) {
                __m256 y0 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(wc + c * 8));
                __m256 y1 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 1]), _mm256_loadu_ps(wc + c * 8 + 8));
                __m256 y2 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 2]), _mm256_loadu_ps(wc + c * 8 + 16));
                __m256 y3 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 3]), _mm256_loadu_ps(wc + c * 8 + 24));
                _mm256_storeu_ps(wc + c * 8, y0);
                _mm256_storeu_ps(wc + c * 8 + 8, y1);
                _mm256_storeu_ps(wc + c * 8 + 16, y2);
                _mm256_storeu_ps(wc + c * 8 + 24, y3);
            }
            for (; c < len; c++)
                _mm256_storeu_ps(wc + c * 8, _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(wc + c * 8)));
        }
        for (int rr = 0; rr < nr; rr++) {
            int64_t r = rb + rr;
            float *er = a->err + r * a->lde, *wr = cpu_gptq_qrow(a, r) + i1;
            uint8_t *cr = a->codes + r * a->ldc + i1;
            for (int64_t i = 0; i < B; i++) {
                er[i] = el[i * 8 + rr];
                wr[i] = ql[i * 8 + rr];
                cr[i] = (uint8_t)(int)cl[i * 8 + rr];
            }
        }
    }
}

/* Transposes the 16 x 16 floats in r (r[i] lane j <-> r[j] lane i): the batch layout
 * [B][16] holds a row-major [16][B] slab transposed, so copies in and out go through this
 * in 16-column tiles instead of one strided scalar per element. */
__attribute__((target("avx512f")))
static inline void cpu_transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* AVX-512 kernel: the AVX2 kernel with 16 rows per batch, one column of a batch in one
 * 16-lane register. Every lane runs exactly the AVX2 kernel's operations (divide, round
 * half to even, add, clamp, multiply, subtract, divide, fused multiply-subtract), so the
 * results are bit-identical to it; only the width changes. */
__attribute__((target("avx512f,fma")))
static void cpu_gptq_rows_avx512(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t n = a->n, i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch, *el = w1 + B * 16, *ql = el + B * 16, *cl = ql + B * 16, *w0 = cl + B * 16;
    float *pl = w0 + B * 16;
    const int vec_params = cpu_gptq_ldl_vec_params(a);
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    const __m512 v0 = _mm512_setzero_ps(), vmaxq = _mm512_set1_ps((float)qd_quant_maxq(a->cfg));
    const int with_acc = a->ldl && a->acc;
    for (int64_t rb = r0; rb < r1; rb += 16) {
        int nr = (int)(r1 - rb < 16 ? r1 - rb : 16);
        /* Full batches copy in by 16 x 16 tiles, the rest (short batches, the last B % 16
         * columns) element by element: the same values either way. */
        const int64_t Bt = nr == 16 ? B / 16 * 16 : 0;
        for (int rr = 0; rr < 16; rr++) {
            if (rr < nr && a->find_params && !vec_params) cpu_gptq_find_params(a, rb + rr, tmp);
            const float *src = a->w + (rb + rr) * a->ldw + i1;
            const float *ac = with_acc ? a->acc + (rb + rr) * a->lda + i1 : NULL;
            for (int64_t i = Bt; i < B; i++) {
                w1[i * 16 + rr] = rr < nr ? (ac ? src[i] + ac[i] : src[i]) : 0.0f;
                if (a->ldl) w0[i * 16 + rr] = rr < nr ? src[i] : 0.0f;
                if (vec_params) pl[i * 16 + rr] = rr < nr ? ac[i] : 0.0f;
            }
        }
        for (int64_t i = 0; i < Bt; i += 16) {
            __m512 tw[16], ta[16];
            for (int rr = 0; rr < 16; rr++) tw[rr] = _mm512_loadu_ps(a->w + (rb + rr) * a->ldw + i1 + i);
            for (int rr = 0; rr < 16; rr++)
                ta[rr] = with_acc ? _mm512_loadu_ps(a->acc + (rb + rr) * a->lda + i1 + i) : v0;
            if (a->ldl) {
                __m512 t0[16];
                for (int rr = 0; rr < 16; rr++) t0[rr] = tw[rr];
                cpu_transpose16(t0);
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(w0 + (i + c) * 16, t0[c]);
            }
            if (with_acc)
                for (int rr = 0; rr < 16; rr++) tw[rr] = _mm512_add_ps(tw[rr], ta[rr]);
            cpu_transpose16(tw);
            for (int c = 0; c < 16; c++) _mm512_storeu_ps(w1 + (i + c) * 16, tw[c]);
            if (vec_params) {
                cpu_transpose16(ta);
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(pl + (i + c) * 16, ta[c]);
            }
        }
        if (vec_params) {
            /* D_c = acc_c - sum_{i < c} D_i A[i][c], then w + D (cpu_gptq_find_params) */
            for (int64_t i = 0; i < B; i++) {
                __m512 dv = _mm512_loadu_ps(pl + i * 16);
                const float *hc = a->hinv + (i1 + i) * a->ldh + i1;
                for (int64_t c = i + 1; c < B; c++)
                    _mm512_storeu_ps(pl + c * 16, _mm512_fnmadd_ps(dv, _mm512_set1_ps(hc[c]), _mm512_loadu_ps(pl + c * 16)));
                _mm512_storeu_ps(pl + i * 16, _mm512_add_ps(dv, _mm512_loadu_ps(w0 + i * 16)));
            }
            cpu_gptq_params_from_batch(a, rb, nr, pl, 16);
        }
        int64_t gcur = -1;
        __m512 vs = v0, vz = v0;
        for (int64_t i = 0; i < B; i++) {
            int64_t j = i1 + i, g = a->col_group[j];
            if (g != gcur) {
                /* Missing rows of a short batch get scale 1, zero 0: harmless, never stored. */
                float s16[16], z16[16];
                for (int rr = 0; rr < 16; rr++) {
                    s16[rr] = rr < nr ? a->scales[g * n + rb + rr] : 1.0f;
                    z16[rr] = rr < nr ? a->zeros[g * n + rb + rr] : 0.0f;
                }
                vs = _mm512_loadu_ps(s16);
                vz = _mm512_loadu_ps(z16);
                gcur = g;
            }
            const float *hrow = a->hinv + j * a->ldh;
            __m512 x = _mm512_loadu_ps(w1 + i * 16);
            __m512 v = _mm512_add_ps(_mm512_roundscale_ps(_mm512_div_ps(x, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
            v = _mm512_min_ps(_mm512_max_ps(v, v0), vmaxq);
            __m512 qv = _mm512_mul_ps(vs, _mm512_sub_ps(v, vz));
            __m512 e = a->ldl ? _mm512_sub_ps(_mm512_loadu_ps(w0 + i * 16), qv)
                              : _mm512_div_ps(_mm512_sub_ps(x, qv), _mm512_set1_ps(hrow[j]));
            _mm512_storeu_ps(el + i * 16, e);
            if (a->ldl) e = _mm512_sub_ps(v0, e);
            _mm512_storeu_ps(ql + i * 16, qv);
            _mm512_storeu_ps(cl + i * 16, v);
            float *wc = w1 + (i + 1) * 16;
            const float *hc = hrow + j + 1;
            int64_t len = B - i - 1, c = 0;
            for (; c + 4 <= len; c += 4) {
                __m512 y0 = _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c]), _mm512_loadu_ps(wc + c * 16));
                __m512 y1 = _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c + 1]), _mm512_loadu_ps(wc + c * 16 + 16));
                __m512 y2 = _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c + 2]), _mm512_loadu_ps(wc + c * 16 + 32));
                __m512 y3 = _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c + 3]), _mm512_loadu_ps(wc + c * 16 + 48));
                _mm512_storeu_ps(wc + c * 16, y0);
                _mm512_storeu_ps(wc + c * 16 + 16, y1);
                _mm512_storeu_ps(wc + c * 16 + 32, y2);
                _mm512_storeu_ps(wc + c * 16 + 48, y3);
            }
            for (; c < len; c++)
                _mm512_storeu_ps(wc + c * 16, _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c]), _mm512_loadu_ps(wc + c * 16)));
        }
        for (int64_t i = 0; i < Bt; i += 16) {
            __m512 te[16], tq[16], tc[16];
            for (int c = 0; c < 16; c++) {
                te[c] = _mm512_loadu_ps(el + (i + c) * 16);
                tq[c] = _mm512_loadu_ps(ql + (i + c) * 16);
                tc[c] = _mm512_loadu_ps(cl + (i + c) * 16);
            }
            cpu_transpose16(te);
            cpu_transpose16(tq);
            cpu_transpose16(tc);
            for (int rr = 0; rr < 16; rr++) {
                int64_t r = rb + rr;
                _mm512_storeu_ps(a->err + r * a->lde + i, te[rr]);
                _mm512_storeu_ps(cpu_gptq_qrow(a, r) + i1 + i, tq[rr]);
                /* codes are small exact integers: converting rounds nothing */
                _mm_storeu_si128((__m128i *)(a->codes + r * a->ldc + i1 + i),
                                 _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(tc[rr])));
            }
        }
        for (int rr = 0; rr < nr; rr++) {
            int64_t r = rb + rr;
            float *er = a->err + r * a->lde, *wr = cpu_gptq_qrow(a, r) + i1;
            uint8_t *cr = a->codes + r * a->ldc + i1;
            for (int64_t i = Bt; i < B; i++) {
                er[i] = el[i * 16 + rr];
                wr[i] = ql[i * 16 + rr];
                cr[i] = (uint8_t)(int)cl[i * 16 + rr];
            }
        }
    }
}

typedef struct cpu_gptq_job {
    const qd_gptq_block_args *a;
    cpu_gptq_rows_fn rows;
    int64_t r0, r1;
    float *scratch;
} cpu_gptq_job;

static void *cpu_gptq_job_run(void *p)
{
    cpu_gptq_job *j = p;
    j->rows(j->a, j->r0, j->r1, j->scratch);
    return NULL;
}

static int cpu_gptq_block(qd_backend *be, const qd_gptq_block_args *a)
{
    if (!a || !a->cfg || !a->w || !a->hinv || !a->err || !a->codes || !a->scales || !a->zeros ||
        !a->col_group || a->n < 0 || a->i1 < 0 || a->i2 <= a->i1 || a->i2 > a->k ||
        a->ldw < a->k || a->ldh < a->k || a->ldc < a->k || a->lde < a->i2 - a->i1 ||
        (a->ldl && a->acc && a->lda < a->k) || (a->q && (!a->ldl || a->ldq < a->k)))
        return qd_err_set(&be->err, QD_EINVAL, "cpu gptq_block: bad arguments");
    const cpu_impl *impl = be->impl;
    const int64_t n = a->n, B = a->i2 - a->i1;
    /* Threads split the rows; below a few batches per thread the start-up is not worth it. */
    int nt = be->n_threads;
    if (nt > CPU_GPTQ_MAX_THREADS) nt = CPU_GPTQ_MAX_THREADS;
    if (n < (int64_t)nt * 128) nt = 1;
    const size_t per_thread = CPU_GPTQ_SCRATCH(B, a->k);
    float *scratch = cpu_alloc(be, (size_t)nt * per_thread * sizeof(float));
    if (!scratch) return QD_ENOMEM;
    cpu_gptq_job jobs[CPU_GPTQ_MAX_THREADS];
    pthread_t tid[CPU_GPTQ_MAX_THREADS];
    int started[CPU_GPTQ_MAX_THREADS] = {0};
    int64_t batches = (n + CPU_GPTQ_ROWS - 1) / CPU_GPTQ_ROWS;
    int64_t per = (batches + nt - 1) / nt * CPU_GPTQ_ROWS;               /* whole batches each */
    for (int t = 0; t < nt; t++) {
        int64_t r0 = t * per, r1 = r0 + per < n ? r0 + per : n;
        if (r0 > n) r0 = n;
        jobs[t] = (cpu_gptq_job){a, impl->gptq_rows, r0, r1, scratch + (size_t)t * per_thread};
    }
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&tid[t], NULL, cpu_gptq_job_run, &jobs[t]) == 0;
    /* The calling thread takes the first share, and any share whose thread did not start. */
    cpu_gptq_job_run(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else cpu_gptq_job_run(&jobs[t]);
    }
    free(scratch);
    return 0;
}

/* ---- assembly ------------------------------------------------------------------------ */

static const qd_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .memset0 = cpu_memset0,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .hessian_accum = cpu_hessian_accum,
    .chol_inverse_upper = cpu_chol_inverse_upper,
    .chol_ldl_upper = cpu_chol_ldl_upper,
    .gptq_block = cpu_gptq_block,
    .fake_quant = cpu_fake_quant,
    .scale_cols = cpu_scale_cols,
    .sq_diff_sum = cpu_sq_diff_sum,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .relu = cpu_relu,
    .gelu = cpu_gelu,
    .add = cpu_add,
    .add_bias = cpu_add_bias,
    .nll_rows = cpu_nll_rows,
};

int qd_backend_cpu_open(int n_threads, qd_backend **out, qd_err *err)
{
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
    __builtin_cpu_init();
    /* QUANTD_CPU_KERNEL=portable selects the plain C kernels (tests compare the two). */
    const char *kern = getenv("QUANTD_CPU_KERNEL");
    int simd = !(kern && !strcmp(kern, "portable"));
    /* QUANTD_CPU_KERNEL=avx2 keeps the 8-lane kernel on AVX-512 machines (tests compare). */
    int avx2_only = kern && !strcmp(kern, "avx2");
    int fma = __builtin_cpu_supports("fma");
    impl->gptq_rows = (simd && !avx2_only && fma && __builtin_cpu_supports("avx512f")) ? cpu_gptq_rows_avx512
                      : (simd && fma && __builtin_cpu_supports("avx2"))                ? cpu_gptq_rows_avx2
                                                                                       : cpu_gptq_rows_ref;
    cpu_mem_init(&impl->mem, cpu_mem_default_cap());
    be->ops = &cpu_ops;
    be->impl = impl;
    be->name = "cpu";
    be->device = -1;
    be->n_threads = n_threads;
    /* OpenBLAS keeps its thread count process-wide; a worker owns one backend, so the
     * last backend opened in a process sets it. */
    openblas_set_num_threads(n_threads);
    *out = be;
    return 0;
}
