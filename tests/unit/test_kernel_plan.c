/* The CUDA matmul's launch plan (quant/kernels/kernel_plan.c), host C that every build
 * runs: path choice, grids, the GEMV's K split, per-launch row templates and workspace
 * size on Llama shapes, the grid limits refused with a message that names them, and bad
 * weights refused before anything would be launched. */
#include <string.h>

#include "quant/kernels/kernel_plan.h"
#include "test_util.h"

static int32_t dummy[4];
static uint16_t dummy16[4];

static qd_kmat mat(qd_kmat_layout layout, int bits, int64_t n, int64_t k)
{
    qd_kmat m;
    memset(&m, 0, sizeof m);
    m.layout = layout;
    m.bits = bits;
    m.n = n;
    m.k = k;
    m.group_size = 128;
    m.n_groups = (k + 127) / 128;
    m.qweight = dummy;
    m.qzeros = dummy;
    m.scales = dummy16;
    if (layout == QD_KMAT_GPTQ_REORDERED) m.perm = dummy;
    return m;
}

static void test_gemv_shapes(void)
{
    qd_err err = {0};
    qd_kplan p;
    /* 4096 x 11008 (K x N) at batch 1: 4 columns a thread, 512 a block, K split by 256. */
    qd_kmat m = mat(QD_KMAT_GPTQ, 4, 11008, 4096);
    CHECK_OK(qd_kplan_make(&m, 1, QD_KPATH_AUTO, &p, &err));
    CHECK_INT(p.gemv, 1);
    CHECK_INT(p.threads, KPLAN_GV_THREADS);
    CHECK_INT(p.cols_per_block, 4 * KPLAN_GV_THREADS);
    CHECK_INT(p.grid_x, (11008 + 511) / 512);
    CHECK_INT(p.grid_y, 4096 / KPLAN_GV_KC);
    CHECK_INT(p.ksplit, 16);
    CHECK_INT(p.launches, 1);
    CHECK_INT(p.workspace_bytes, 16 * 1 * 11008 * sizeof(float));
    CHECK_INT(p.reduce_blocks, (11008 + 255) / 256);
    /* Every output column is covered exactly: grid_x blocks of cols_per_block >= N. */
    CHECK((int64_t)p.grid_x * p.cols_per_block >= m.n && (int64_t)(p.grid_x - 1) * p.cols_per_block < m.n);
    /* K not a multiple of the split: the last block is partial. */
    m = mat(QD_KMAT_GPTQ, 3, 4096, 11008);
    CHECK_OK(qd_kplan_make(&m, 8, QD_KPATH_AUTO, &p, &err));
    CHECK_INT(p.ksplit, (11008 + 255) / 256);
    CHECK_INT(p.workspace_bytes, (size_t)p.ksplit * 8 * 4096 * sizeof(float));
    /* AWQ: a thread owns one word of 8 channels. */
    m = mat(QD_KMAT_AWQ, 4, 4096, 4096);
    CHECK_OK(qd_kplan_make(&m, 3, QD_KPATH_AUTO, &p, &err));
    CHECK_INT(p.cols_per_block, 8 * KPLAN_GV_THREADS);
    CHECK_INT(p.grid_x, 4);
    /* A forced GEMV over 20 rows runs 3 launches of 8, 8 and 4 rows; workspace for 8. */
    m = mat(QD_KMAT_GPTQ_REORDERED, 4, 4096, 4096);
    CHECK_OK(qd_kplan_make(&m, 20, QD_KPATH_GEMV, &p, &err));
    CHECK_INT(p.gemv, 1);
    CHECK_INT(p.launches, 3);
    CHECK_INT(p.workspace_bytes, 16 * 8 * 4096 * sizeof(float));
}

static void test_row_templates(void)
{
    static const int want[9] = {1, 1, 2, 4, 4, 8, 8, 8, 8};
    for (int mr = 1; mr <= 8; mr++) {
        int t = qd_kplan_gemv_mr(mr);
        CHECK_INT(t, want[mr]);
        CHECK(t >= mr);                    /* the template holds every row of the launch */
    }
}

static void test_gemm_shapes(void)
{
    qd_err err = {0};
    qd_kplan p;
    qd_kmat m = mat(QD_KMAT_GPTQ, 4, 4096, 4096);
    CHECK_OK(qd_kplan_make(&m, 9, QD_KPATH_AUTO, &p, &err));   /* above 8 rows: GEMM */
    CHECK_INT(p.gemv, 0);
    CHECK_INT(p.threads, KPLAN_GM_THREADS);
    CHECK_INT(p.grid_x, 4096 / KPLAN_GM_BN);
    CHECK_INT(p.grid_y, 1);
    CHECK_INT(p.workspace_bytes, 0);
    CHECK_OK(qd_kplan_make(&m, 2048 * 8, QD_KPATH_AUTO, &p, &err));
    CHECK_INT(p.grid_y, 2048 * 8 / KPLAN_GM_BM);
    CHECK_OK(qd_kplan_make(&m, 1, QD_KPATH_GEMM, &p, &err));   /* forced, one row */
    CHECK_INT(p.gemv, 0);
    CHECK_INT(p.grid_y, 1);
}

static void test_refusals(void)
{
    qd_err err = {0};
    qd_kplan p;
    qd_kmat m = mat(QD_KMAT_GPTQ, 4, 4096, 4096);
    /* More row tiles than CUDA's grid y allows. */
    CHECK_INT(qd_kplan_make(&m, (KPLAN_GRID_Y_MAX + 1) * KPLAN_GM_BM, QD_KPATH_GEMM, &p, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "grid limit");
    CHECK_INT(qd_kplan_make(&m, 0, QD_KPATH_AUTO, &p, &err), QD_EINVAL);
    CHECK_INT(qd_kplan_make(&m, 1, (qd_kpath)7, &p, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "unknown path");
    /* Bad weights never reach a launch. */
    qd_kmat b = mat(QD_KMAT_GPTQ, 5, 4096, 4096);
    CHECK_INT(qd_kplan_make(&b, 1, QD_KPATH_AUTO, &p, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "5-bit");
    b = mat(QD_KMAT_GPTQ, 4, 4096, 4010);
    CHECK_INT(qd_kplan_make(&b, 1, QD_KPATH_AUTO, &p, &err), QD_ESHAPE);
    b = mat(QD_KMAT_AWQ, 4, 4100, 4096);
    CHECK_INT(qd_kplan_make(&b, 1, QD_KPATH_AUTO, &p, &err), QD_EUNSUPPORTED);
    b = mat(QD_KMAT_GPTQ, 4, 4096, 4096);
    b.act_order = 1;                       /* act-order without g_idx */
    CHECK_INT(qd_kplan_make(&b, 1, QD_KPATH_AUTO, &p, &err), QD_EINVAL);
    b = mat(QD_KMAT_GPTQ_REORDERED, 4, 4096, 4096);
    b.perm = NULL;
    CHECK_INT(qd_kplan_make(&b, 1, QD_KPATH_AUTO, &p, &err), QD_EINVAL);
    CHECK_INT(qd_kplan_make(NULL, 1, QD_KPATH_AUTO, &p, &err), QD_EINVAL);
    CHECK_INT(qd_kplan_make(&m, 1, QD_KPATH_AUTO, NULL, &err), QD_EINVAL);
    /* K beyond 65535 GEMV blocks of 256. */
    qd_kmat big = mat(QD_KMAT_GPTQ, 4, 32, (KPLAN_GRID_Y_MAX + 1) * KPLAN_GV_KC);
    CHECK_INT(qd_kplan_make(&big, 1, QD_KPATH_GEMV, &p, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "K-blocks");
}

int main(void)
{
    TEST_RUN(test_gemv_shapes);
    TEST_RUN(test_row_templates);
    TEST_RUN(test_gemm_shapes);
    TEST_RUN(test_refusals);
    return test_finish();
}
