/* The row gather and weighted scatter-add ops (backend.h: gather_rows, scatter_add_rows) on
 * the CPU backend, the reference the CUDA kernels are compared with (tests/gpu): both
 * against plain loops written here, bit for bit; the scatter's result independent of the
 * thread count; the refusals (an index out of range, a repeated scatter index, a NULL
 * array, a negative count), each leaving dst as it was; and the shared argument checks
 * (quant/backend/backend_args.c) that the CUDA backend runs on the host. */
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/backend/backend_args.h"
#include "test_util.h"

static qd_backend *open_cpu(int threads)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    if (qd_backend_cpu_open(threads, NULL, &be, &err) != 0) {
        fprintf(stderr, "cannot open cpu backend: %s\n", err.msg);
        exit(1);
    }
    return be;
}

/* n distinct row numbers of [0, rows) in a shuffled order (a partial Fisher-Yates). */
static void distinct_rows(test_rng *rng, int32_t *idx, int64_t n, int64_t rows)
{
    int32_t *all = malloc((size_t)rows * sizeof *all);
    for (int64_t i = 0; i < rows; i++) all[i] = (int32_t)i;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i + (int64_t)(test_rng_u64(rng) % (uint64_t)(rows - i));
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
        idx[i] = all[i];
    }
    free(all);
}

static void test_gather_scatter_vs_loops(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 3, 5}, {300, 200, 129}, {64, 64, 4096}};
    test_rng rng;
    test_rng_seed(&rng, 38);
    qd_backend *be = open_cpu(2), *be1 = open_cpu(1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], n = shapes[s][1], cols = shapes[s][2];
        float *src = malloc((size_t)(rows * cols) * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
        float *got = malloc((size_t)(rows * cols) * sizeof(float)), *want = malloc((size_t)(rows * cols) * sizeof(float));
        float *dst1 = malloc((size_t)(rows * cols) * sizeof(float));
        int32_t *idx = malloc((size_t)n * sizeof(int32_t));
        test_fill_normal(&rng, src, (size_t)(rows * cols), 1.0f);
        test_fill_normal(&rng, w, (size_t)n, 0.5f);
        distinct_rows(&rng, idx, n, rows);
        /* gather: got[i] = src[idx[i]] */
        CHECK_OK(be->ops->gather_rows(be, got, src, rows, idx, n, cols));
        for (int64_t i = 0; i < n; i++) memcpy(want + i * cols, src + (int64_t)idx[i] * cols, (size_t)cols * sizeof(float));
        CHECK(memcmp(got, want, (size_t)(n * cols) * sizeof(float)) == 0);
        /* scatter-add onto a random dst: dst[idx[i]] += w[i] * g[i], g the gathered rows */
        test_fill_normal(&rng, want, (size_t)(rows * cols), 1.0f);
        memcpy(dst1, want, (size_t)(rows * cols) * sizeof(float));
        float *dst = malloc((size_t)(rows * cols) * sizeof(float));
        memcpy(dst, want, (size_t)(rows * cols) * sizeof(float));
        CHECK_OK(be->ops->scatter_add_rows(be, dst, rows, got, idx, w, n, cols));
        CHECK_OK(be1->ops->scatter_add_rows(be1, dst1, rows, got, idx, w, n, cols));
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < cols; j++) {
                float p = got[i * cols + j] * w[i];
                want[(int64_t)idx[i] * cols + j] += p;
            }
        CHECK(memcmp(dst, want, (size_t)(rows * cols) * sizeof(float)) == 0);
        CHECK(memcmp(dst, dst1, (size_t)(rows * cols) * sizeof(float)) == 0);   /* 1 thread or 2: the same bits */
        free(src); free(w); free(got); free(want); free(dst); free(dst1); free(idx);
    }
    qd_backend_close(be);
    qd_backend_close(be1);
}

/* The identity list with weights 1 is y += x, the shared expert's ungated add, bit for bit. */
static void test_scatter_identity_is_add(void)
{
    qd_backend *be = open_cpu(2);
    enum { R = 5, C = 33 };
    float x[R * C], y[R * C], z[R * C], w[R];
    int32_t idx[R];
    test_rng rng;
    test_rng_seed(&rng, 7);
    test_fill_normal(&rng, x, R * C, 1.0f);
    test_fill_normal(&rng, y, R * C, 1.0f);
    memcpy(z, y, sizeof y);
    for (int i = 0; i < R; i++) { idx[i] = i; w[i] = 1.0f; }
    CHECK_OK(be->ops->scatter_add_rows(be, y, R, x, idx, w, R, C));
    CHECK_OK(be->ops->add(be, z, x, R * C));
    CHECK(memcmp(y, z, sizeof y) == 0);
    qd_backend_close(be);
}

static void test_refusals(void)
{
    qd_backend *be = open_cpu(2);
    float src[4 * 3], dst[4 * 3], keep[4 * 3], w[3] = {1, 2, 3};
    for (int i = 0; i < 12; i++) src[i] = dst[i] = keep[i] = (float)i;
    int32_t out_of_range[2] = {1, 4}, negative[2] = {0, -1}, repeated[3] = {2, 0, 2}, ok[2] = {3, 1};
    CHECK_INT(be->ops->gather_rows(be, dst, src, 4, out_of_range, 2, 3), QD_EINVAL);
    CHECK_CONTAINS(be->err.msg, "index 1 is 4, not a row in [0, 4)");
    CHECK_INT(be->ops->scatter_add_rows(be, dst, 4, src, negative, w, 2, 3), QD_EINVAL);
    CHECK_CONTAINS(be->err.msg, "cpu scatter_add_rows: index 1 is -1");
    CHECK_INT(be->ops->scatter_add_rows(be, dst, 4, src, repeated, w, 3, 3), QD_EINVAL);
    CHECK_CONTAINS(be->err.msg, "index 2 repeats row 2");
    /* A gather may repeat a row (it only reads it). */
    CHECK_OK(be->ops->gather_rows(be, dst, src, 4, repeated, 3, 3));
    CHECK(dst[0] == src[6] && dst[6] == src[6]);
    memcpy(dst, keep, sizeof dst);
    CHECK_INT(be->ops->scatter_add_rows(be, dst, 4, src, ok, NULL, 2, 3), QD_EINVAL);
    CHECK_INT(be->ops->gather_rows(be, NULL, src, 4, ok, 2, 3), QD_EINVAL);
    CHECK_INT(be->ops->gather_rows(be, dst, src, 4, ok, -1, 3), QD_EINVAL);
    CHECK_INT(be->ops->gather_rows(be, dst, src, 4, ok, 2, 0), QD_EINVAL);
    CHECK(memcmp(dst, keep, sizeof dst) == 0);                  /* every refusal left dst alone */
    /* No indices: nothing to do, whatever the pointers. */
    CHECK_OK(be->ops->gather_rows(be, NULL, NULL, 4, NULL, 0, 3));
    CHECK_OK(be->ops->scatter_add_rows(be, NULL, 4, NULL, NULL, NULL, 0, 3));
    CHECK_INT(be->broken, 0);
    qd_backend_close(be);
}

/* The host-side checks the CUDA backend runs before its launch. */
static void test_shared_checks(void)
{
    qd_err err = {0};
    float f[4] = {0};
    int32_t idx[3] = {0, 2, 1};
    int skip = -1;
    CHECK_OK(qd_backend_rows_args_check("cuda scatter_add_rows", f, f, 3, idx, f, 1, 3, 4, &skip, &err));
    CHECK_INT(skip, 0);
    CHECK_OK(qd_backend_rows_args_check("cuda gather_rows", NULL, NULL, 0, NULL, NULL, 0, 0, 0, &skip, &err));
    CHECK_INT(skip, 1);
    CHECK_INT(qd_backend_rows_args_check("cuda gather_rows", f, f, (int64_t)1 << 32, idx, NULL, 0, 3, 4, &skip, &err),
              QD_EINVAL);
    CHECK_CONTAINS(err.msg, "cuda gather_rows: shape rows=4294967296");
    CHECK_INT(qd_backend_rows_args_check("cuda scatter_add_rows", f, f, 3, idx, NULL, 1, 3, 4, &skip, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "NULL array");
    CHECK_OK(qd_backend_rows_idx_check("x", idx, 3, 3, 1, &err));
    CHECK_INT(qd_backend_rows_idx_check("x", idx, 3, 2, 0, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "x: index 1 is 2, not a row in [0, 2)");
}

int main(void)
{
    TEST_RUN(test_gather_scatter_vs_loops);
    TEST_RUN(test_scatter_identity_is_add);
    TEST_RUN(test_refusals);
    TEST_RUN(test_shared_checks);
    return test_finish();
}
