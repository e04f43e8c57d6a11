/* Launch planning of the CUDA dequantizing matmul (see kernel_plan.h). Host C with no CUDA
 * dependency, so every build, GPU or not, compiles and tests the arithmetic the launches
 * rely on. */
#include "quant/kernels/kernel_plan.h"

#include <string.h>

int kmat_validate(const qd_kmat *m, qd_err *err);   /* kernel_ref.c */

int qd_kplan_float_gemv_ok(const qd_kmat *m)
{
    return m->layout == QD_KMAT_FLOAT && m->k % 32 == 0 &&
           (m->group_size == -1 || (m->group_size > 0 && m->group_size % 8 == 0));
}

int qd_kplan_gemv_mr(int64_t mr)
{
    return mr <= 1 ? 1 : mr == 2 ? 2 : mr <= 4 ? 4 : 8;
}

int qd_kplan_make(const qd_kmat *m, int64_t rows, qd_kpath path, qd_kplan *out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "kernel plan: NULL output");
    memset(out, 0, sizeof *out);
    int rc = kmat_validate(m, err);
    if (rc) return rc;
    if (rows <= 0) return qd_err_set(err, QD_EINVAL, "kernel plan: %lld input rows (at least 1)", (long long)rows);
    if (path != QD_KPATH_AUTO && path != QD_KPATH_GEMV && path != QD_KPATH_GEMM)
        return qd_err_set(err, QD_EINVAL, "kernel plan: unknown path %d", (int)path);
    const int64_t n = m->n, k = m->k;
    out->gemv = path == QD_KPATH_GEMV || (path == QD_KPATH_AUTO && rows <= QD_KERNEL_GEMV_MAX_ROWS);
    if (m->layout == QD_KMAT_FLOAT && !qd_kplan_float_gemv_ok(m)) out->gemv = 0;
    if (!out->gemv) {
        const int64_t gx = (n + KPLAN_GM_BN - 1) / KPLAN_GM_BN, gy = (rows + KPLAN_GM_BM - 1) / KPLAN_GM_BM;
        if (gy > KPLAN_GRID_Y_MAX)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: %lld input rows need %lld row tiles of %d, over "
                              "CUDA's grid limit of %lld (split the batch)", (long long)rows, (long long)gy,
                              KPLAN_GM_BM, KPLAN_GRID_Y_MAX);
        if (gx > KPLAN_GRID_X_MAX)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: N %lld is too large for the GEMM grid", (long long)n);
        out->threads = KPLAN_GM_THREADS;
        out->grid_x = (unsigned)gx;
        out->grid_y = (unsigned)gy;
        out->launches = 1;
        return 0;
    }
    if (m->layout == QD_KMAT_FLOAT) {
        const int64_t gx = (n + KPLAN_FV_ROWS - 1) / KPLAN_FV_ROWS;
        if (gx > KPLAN_GRID_X_MAX)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: N %lld is too large for the GEMV grid", (long long)n);
        out->threads = KPLAN_FV_THREADS;
        out->ksplit = 1;
        out->cols_per_block = KPLAN_FV_ROWS;
        out->grid_x = (unsigned)gx;
        out->grid_y = 1;
        out->launches = (rows + QD_KERNEL_GEMV_MAX_ROWS - 1) / QD_KERNEL_GEMV_MAX_ROWS;
        return 0;
    }
    out->threads = KPLAN_GV_THREADS;
    out->ksplit = 0;
    const int64_t ksplit = (k + KPLAN_GV_KC - 1) / KPLAN_GV_KC;
    if (ksplit > KPLAN_GRID_Y_MAX)
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: K %lld needs %lld GEMV K-blocks of %d, over CUDA's grid "
                          "limit of %lld", (long long)k, (long long)ksplit, KPLAN_GV_KC, KPLAN_GRID_Y_MAX);
    out->ksplit = (int)ksplit;
    /* gptq: 4 columns per thread (one int4 of words); awq: one word of 8 channels. */
    out->cols_per_block = (m->layout == QD_KMAT_AWQ ? 8 : 4) * (int64_t)KPLAN_GV_THREADS;
    const int64_t gx = (n + out->cols_per_block - 1) / out->cols_per_block;
    if (gx > KPLAN_GRID_X_MAX)
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: N %lld is too large for the GEMV grid", (long long)n);
    out->grid_x = (unsigned)gx;
    out->grid_y = (unsigned)ksplit;
    out->launches = (rows + QD_KERNEL_GEMV_MAX_ROWS - 1) / QD_KERNEL_GEMV_MAX_ROWS;
    const int64_t mr = rows < QD_KERNEL_GEMV_MAX_ROWS ? rows : QD_KERNEL_GEMV_MAX_ROWS;
    out->reduce_blocks = (mr * n + KPLAN_REDUCE_THREADS - 1) / KPLAN_REDUCE_THREADS;
    /* ksplit, mr and N are bounded (ksplit <= 65535, mr <= 8, N < 2^31 by the grid), so
     * the product fits in 64 bits; on a 32-bit size_t it may not. */
    const uint64_t ws = (uint64_t)ksplit * (uint64_t)mr * (uint64_t)n * sizeof(float);
    if (ws > (uint64_t)SIZE_MAX)
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel plan: the GEMV workspace of %llu bytes exceeds size_t",
                          (unsigned long long)ws);
    out->workspace_bytes = (size_t)ws;
    return 0;
}
