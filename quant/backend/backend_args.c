/* Argument checks and launch choices of the device backend's ops (see backend_args.h). */
#include "quant/backend/backend_args.h"

#include <stddef.h>
#include <stdlib.h>

#include "quant/backend/gptq_block.h"

static int args_int_ok(int64_t v) { return v >= 0 && v <= INT32_MAX; }

int qd_backend_gemm_args_check(const char *who, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a,
                               int64_t lda, const void *b, int64_t ldb, const void *c, int64_t ldc, int *skip,
                               int64_t *lda_ok, int64_t *ldb_ok, qd_err *err)
{
    *skip = 0;
    *lda_ok = lda;
    *ldb_ok = ldb;
    if (!args_int_ok(m) || !args_int_ok(n) || !args_int_ok(k) || !args_int_ok(lda) || !args_int_ok(ldb) ||
        !args_int_ok(ldc))
        return qd_err_set(err, QD_EINVAL, "%s: shape m=%lld n=%lld k=%lld is negative or too large", who, (long long)m,
                          (long long)n, (long long)k);
    if (m == 0 || n == 0) {
        *skip = 1;
        return 0;
    }
    const int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
    if (!c || (k > 0 && (!a || !b)) || ldc < n || (k > 0 && (lda < a_cols || ldb < b_cols)))
        return qd_err_set(err, QD_EINVAL, "%s: bad operands (m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld)", who,
                          (long long)m, (long long)n, (long long)k, (long long)lda, (long long)ldb, (long long)ldc);
    if (k == 0) {
        *lda_ok = a_cols > 1 ? a_cols : 1;
        *ldb_ok = b_cols > 1 ? b_cols : 1;
    }
    return 0;
}

int qd_backend_hessian_args_check(const char *who, const void *h, int64_t k, const void *x, int64_t rows,
                                  int64_t ldx, int64_t n_seen, qd_err *err)
{
    if (!h || k <= 0 || rows < 0 || n_seen < 0 || (rows > 0 && (!x || ldx < k)) || !args_int_ok(k) ||
        !args_int_ok(rows) || !args_int_ok(ldx))
        return qd_err_set(err, QD_EINVAL, "%s: bad arguments (k=%lld rows=%lld ldx=%lld n_seen=%lld)", who,
                          (long long)k, (long long)rows, (long long)ldx, (long long)n_seen);
    return 0;
}

void qd_backend_hessian_weights(int64_t n_seen, int64_t rows, float *alpha, float *beta)
{
    double total = (double)n_seen + (double)rows;
    *beta = (float)((double)n_seen / total);
    *alpha = (float)(2.0 / total);
}

int qd_backend_chol_args_check(const char *who, const void *h, int64_t k, qd_err *err)
{
    if (!h || k <= 0 || !args_int_ok(k))
        return qd_err_set(err, QD_EINVAL, "%s: bad arguments (k=%lld)", who, (long long)k);
    return 0;
}

int qd_backend_gptq_block_rows(int64_t block_cols)
{
    if (block_cols <= 0) return 0;
    int rb = 64;
    while (rb > 1 && (int64_t)rb * block_cols * (int64_t)sizeof(float) > QD_BACKEND_GPTQ_SMEM) rb /= 2;
    return (int64_t)rb * block_cols * (int64_t)sizeof(float) > QD_BACKEND_GPTQ_SMEM ? 0 : rb;
}

int qd_backend_gptq_block_args_check(const char *who, const qd_gptq_block_args *a, qd_err *err)
{
    if (!a || !a->cfg || !a->w || !a->hinv || !a->err || !a->codes || !a->scales || !a->zeros || !a->col_group ||
        a->n < 0 || a->i1 < 0 || a->i2 <= a->i1 || a->i2 > a->k || a->ldw < a->k || a->ldh < a->k ||
        a->ldc < a->k || a->lde < a->i2 - a->i1)
        return qd_err_set(err, QD_EINVAL, "%s: bad arguments", who);
    if (a->ldl)        /* no chol_ldl_upper on the device, so the driver never asks for the LDL form */
        return qd_err_set(err, QD_EINVAL, "%s: the LDL form is not implemented", who);
    if (a->q)          /* the device op writes Q into w; only the LDL form asks otherwise */
        return qd_err_set(err, QD_EINVAL, "%s: writing Q to a separate array (q) is not implemented", who);
    if (a->loss)       /* gptq.c asks for the column losses on host backends only */
        return qd_err_set(err, QD_EINVAL, "%s: the column losses (loss) are not implemented", who);
    /* The device's search computes |d|^norm without powf (whose last bit is not the C
     * library's): only the exponents the reference computes exactly. */
    if (a->find_params && a->cfg->scale_search == QD_SCALE_SEARCH_MSE && a->cfg->search_norm != 1.0f &&
        a->cfg->search_norm != 2.0f)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: scale_search mse with the error's exponent %g is not implemented "
                          "on the device (1 or 2)", who, (double)a->cfg->search_norm);
    if (!qd_backend_gptq_block_rows(a->i2 - a->i1))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: a block of %lld columns does not fit %d bytes of shared memory "
                          "(at most %d columns)", who, (long long)(a->i2 - a->i1), QD_BACKEND_GPTQ_SMEM,
                          QD_BACKEND_GPTQ_SMEM / (int)sizeof(float));
    return 0;
}

int qd_backend_rows_args_check(const char *who, const void *dst, const void *src, int64_t rows, const void *idx,
                               const void *w, int want_w, int64_t n_idx, int64_t cols, int *skip, qd_err *err)
{
    *skip = 0;
    if (!args_int_ok(rows) || !args_int_ok(n_idx) || !args_int_ok(cols))
        return qd_err_set(err, QD_EINVAL, "%s: shape rows=%lld n_idx=%lld cols=%lld is negative or too large", who,
                          (long long)rows, (long long)n_idx, (long long)cols);
    if (n_idx == 0) {
        *skip = 1;
        return 0;
    }
    if (cols == 0 || rows == 0 || !dst || !src || !idx || (want_w && !w))
        return qd_err_set(err, QD_EINVAL, "%s: %lld indices into %lld rows of %lld columns with a NULL array or an "
                          "empty shape", who, (long long)n_idx, (long long)rows, (long long)cols);
    return 0;
}

int qd_backend_rows_idx_check(const char *who, const int32_t *idx, int64_t n_idx, int64_t rows, int distinct,
                              qd_err *err)
{
    unsigned char *seen = distinct && n_idx > 1 ? calloc((size_t)rows, 1) : NULL;
    if (distinct && n_idx > 1 && !seen)
        return qd_err_set(err, QD_ENOMEM, "%s: no memory to check %lld indices", who, (long long)n_idx);
    int rc = 0;
    for (int64_t i = 0; i < n_idx && !rc; i++) {
        if (idx[i] < 0 || idx[i] >= rows)
            rc = qd_err_set(err, QD_EINVAL, "%s: index %lld is %d, not a row in [0, %lld)", who, (long long)i,
                            (int)idx[i], (long long)rows);
        else if (seen && seen[idx[i]]++)
            rc = qd_err_set(err, QD_EINVAL, "%s: index %lld repeats row %d (the rows must be distinct)", who,
                            (long long)i, (int)idx[i]);
    }
    free(seen);
    return rc;
}
