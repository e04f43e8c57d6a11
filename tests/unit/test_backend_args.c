/* The device backend's argument checks and launch choices (quant/backend/backend_args.c),
 * which the CUDA backend runs before any CUDA call: every build tests them, GPU or not.
 * Good calls pass (and k == 0 gets strides cuBLAS accepts), each bad argument is refused
 * with a message naming the op and the values, and the GPTQ block's rows per launch block
 * keep its shared-memory copy within the limit. */
#include <string.h>

#include "quant/backend/backend_args.h"
#include "quant/backend/gptq_block.h"
#include "test_util.h"

static float buf[16];

static void test_gemm(void)
{
    qd_err err = {0};
    int skip = -1;
    int64_t la = 0, lb = 0;
    CHECK_OK(qd_backend_gemm_args_check("cuda gemm", 0, 1, 4, 5, 6, buf, 6, buf, 6, buf, 5, &skip, &la, &lb, &err));
    CHECK_INT(skip, 0);
    CHECK_INT(la, 6);
    CHECK_INT(lb, 6);
    /* Nothing to compute. */
    CHECK_OK(qd_backend_gemm_args_check("cuda gemm", 0, 0, 0, 5, 6, NULL, 0, NULL, 0, NULL, 0, &skip, &la, &lb, &err));
    CHECK_INT(skip, 1);
    /* k == 0: operands never read, strides replaced by ones cuBLAS accepts. */
    CHECK_OK(qd_backend_gemm_args_check("cuda gemm", 1, 0, 3, 7, 0, NULL, 0, NULL, 0, buf, 7, &skip, &la, &lb, &err));
    CHECK_INT(skip, 0);
    CHECK_INT(la, 3);                       /* A^T: a row of A holds m values */
    CHECK_INT(lb, 7);
    /* Refusals. */
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, (int64_t)1 << 31, 5, 6, buf, 6, buf, 5, buf, 5, &skip,
                                         &la, &lb, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "cuda gemm: shape m=2147483648");
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, 4, 5, -1, buf, 6, buf, 5, buf, 5, &skip, &la, &lb, &err),
              QD_EINVAL);
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, 4, 5, 6, buf, 5, buf, 5, buf, 5, &skip, &la, &lb, &err),
              QD_EINVAL);                   /* lda < k */
    CHECK_CONTAINS(err.msg, "lda=5");
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 1, 4, 5, 6, buf, 6, buf, 5, buf, 5, &skip, &la, &lb, &err),
              QD_EINVAL);                   /* B^T: ldb < k */
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, 4, 5, 6, buf, 6, buf, 5, buf, 4, &skip, &la, &lb, &err),
              QD_EINVAL);                   /* ldc < n */
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, 4, 5, 6, NULL, 6, buf, 5, buf, 5, &skip, &la, &lb, &err),
              QD_EINVAL);
    CHECK_INT(qd_backend_gemm_args_check("cuda gemm", 0, 0, 4, 5, 6, buf, 6, buf, 5, NULL, 5, &skip, &la, &lb, &err),
              QD_EINVAL);
}

static void test_hessian_chol(void)
{
    qd_err err = {0};
    CHECK_OK(qd_backend_hessian_args_check("cuda hessian_accum", buf, 8, buf, 3, 8, 0, &err));
    CHECK_OK(qd_backend_hessian_args_check("cuda hessian_accum", buf, 8, NULL, 0, 0, 5, &err));   /* no rows */
    CHECK_INT(qd_backend_hessian_args_check("cuda hessian_accum", buf, 8, buf, 3, 7, 0, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "cuda hessian_accum: bad arguments (k=8 rows=3 ldx=7");
    CHECK_INT(qd_backend_hessian_args_check("cuda hessian_accum", buf, 0, buf, 3, 8, 0, &err), QD_EINVAL);
    CHECK_INT(qd_backend_hessian_args_check("cuda hessian_accum", buf, 8, buf, 3, 8, -1, &err), QD_EINVAL);
    CHECK_INT(qd_backend_hessian_args_check("cuda hessian_accum", NULL, 8, buf, 3, 8, 0, &err), QD_EINVAL);
    CHECK_INT(qd_backend_hessian_args_check("cuda hessian_accum", buf, (int64_t)1 << 32, buf, 3, (int64_t)1 << 32, 0,
                                            &err), QD_EINVAL);
    /* The running mean's weights: the first rows replace H, later ones are weighed by count. */
    float alpha = -1, beta = -1;
    qd_backend_hessian_weights(0, 4, &alpha, &beta);
    CHECK(alpha == 0.5f && beta == 0.0f);
    qd_backend_hessian_weights(6, 2, &alpha, &beta);
    CHECK(alpha == 0.25f && beta == 0.75f);
    CHECK_OK(qd_backend_chol_args_check("cuda chol_inverse_upper", buf, 48, &err));
    CHECK_INT(qd_backend_chol_args_check("cuda chol_inverse_upper", buf, 0, &err), QD_EINVAL);
    CHECK_INT(qd_backend_chol_args_check("cuda chol_inverse_upper", NULL, 4, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "k=4");
}

static void test_gptq_block(void)
{
    /* Rows per launch block: the most (<= 64) whose copy fits 48 KB. */
    CHECK_INT(qd_backend_gptq_block_rows(128), 64);      /* 64 x 128 x 4 = 32 KB */
    CHECK_INT(qd_backend_gptq_block_rows(256), 32);      /* 48 KB would need 48 rows: halves to 32 */
    CHECK_INT(qd_backend_gptq_block_rows(12288), 1);
    CHECK_INT(qd_backend_gptq_block_rows(12289), 0);
    CHECK_INT(qd_backend_gptq_block_rows(0), 0);
    for (int64_t b = 1; b <= 13000; b += 97) {
        int rb = qd_backend_gptq_block_rows(b);
        if (rb) CHECK(rb >= 1 && rb <= 64 && (int64_t)rb * b * 4 <= QD_BACKEND_GPTQ_SMEM);
        else CHECK(b * 4 > QD_BACKEND_GPTQ_SMEM);
    }
    qd_quant_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    float w[8 * 256], hinv[256 * 256], e[8 * 128], sc[16], z[16];
    uint8_t codes[8 * 256];
    int32_t cg[256] = {0};
    qd_gptq_block_args a = {.cfg = &cfg, .n = 8, .k = 256, .i1 = 0, .i2 = 128, .w = w, .ldw = 256, .hinv = hinv,
                            .ldh = 256, .err = e, .lde = 128, .codes = codes, .ldc = 256, .scales = sc, .zeros = z,
                            .col_group = cg};
    qd_err err = {0};
    CHECK_OK(qd_backend_gptq_block_args_check("cuda gptq_block", &a, &err));
    qd_gptq_block_args b = a;
    b.i2 = 257;                               /* past k */
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EINVAL);
    b = a;
    b.lde = 100;                              /* narrower than the block */
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EINVAL);
    b = a;
    b.ldl = 1;
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "LDL form");
    b = a;
    b.q = w;
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EINVAL);
    b = a;
    b.col_group = NULL;
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EINVAL);
    /* A block too wide for shared memory is refused up front, not launched. */
    b = a;
    b.k = b.ldw = b.ldh = b.ldc = 20000;
    b.i2 = 13000;
    b.lde = 13000;
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "13000 columns");
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", NULL, &err), QD_EINVAL);
    /* The scale search on dynamic groups runs on the device with the exponents it computes
     * exactly (2, the default, and 1); another is refused, naming it. */
    qd_quant_cfg mse = cfg;
    mse.scale_search = QD_SCALE_SEARCH_MSE;
    mse.search_norm = 2.0f;
    b = a;
    b.cfg = &mse;
    b.find_params = 1;
    CHECK_OK(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err));
    mse.search_norm = 2.4f;
    CHECK_INT(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "exponent 2.4");
    b.find_params = 0;                        /* static groups: no search in the op */
    CHECK_OK(qd_backend_gptq_block_args_check("cuda gptq_block", &b, &err));
}

int main(void)
{
    TEST_RUN(test_gemm);
    TEST_RUN(test_hessian_chol);
    TEST_RUN(test_gptq_block);
    return test_finish();
}
