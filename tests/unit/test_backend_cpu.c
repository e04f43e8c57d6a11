/* The CPU backend's core ops against scalar references: gemm (all transposes, strides,
 * alpha/beta), the running-average Hessian, the Cholesky factor of the inverse, the GPTQ
 * block kernel, and backend specs. */
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/backend/gptq_block.h"
#include "test_util.h"

/* A two-thread CPU backend with the given GPTQ block kernel. */
static qd_backend *open_cpu_kernel(qd_cpu_kernel kernel)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    qd_runtime_opts rt = qd_runtime_opts_default();
    rt.cpu_kernel = kernel;
    if (qd_backend_cpu_open(2, &rt, &be, &err) != 0) {
        fprintf(stderr, "cannot open cpu backend: %s\n", err.msg);
        exit(1);
    }
    return be;
}

static qd_backend *open_cpu(void) { return open_cpu_kernel(QD_CPU_KERNEL_AUTO); }

static void test_open_specs(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_open("cpu", NULL, &be, &err));
    CHECK(be != NULL);
    if (be) {
        CHECK_STR(be->name, "cpu");
        CHECK_INT(be->device, -1);
        CHECK(be->n_threads >= 1);
    }
    qd_backend_close(be);
    qd_backend_close(NULL);
    be = NULL;
    CHECK_INT(qd_backend_open("gpu", NULL, &be, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "gpu");
    CHECK(be == NULL);
    CHECK_INT(qd_backend_open("cuda:x", NULL, &be, &err), QD_EINVAL);
#ifndef QUANTD_HAVE_CUDA
    CHECK_INT(qd_backend_cuda_device_count(), 0);
    CHECK_INT(qd_backend_open("cuda:0", NULL, &be, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "no CUDA");
#endif
    CHECK_INT(qd_backend_cpu_open(0, NULL, &be, &err), QD_EINVAL);
}

static void test_memory(void)
{
    qd_backend *be = open_cpu();
    float host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i * 0.5f;
    float *d = qd_backend_alloc(be, sizeof host);
    float *d2 = qd_backend_alloc(be, sizeof host);
    CHECK(d && d2);
    CHECK(((uintptr_t)d & 63) == 0);
    CHECK_OK(qd_backend_upload(be, d, host, sizeof host));
    CHECK_OK(be->ops->copy(be, d2, d, sizeof host));
    CHECK_OK(qd_backend_download(be, back, d2, sizeof host));
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK_OK(be->ops->memset0(be, d2, sizeof host));
    CHECK_OK(qd_backend_download(be, back, d2, sizeof host));
    CHECK(back[0] == 0.0f && back[99] == 0.0f);
    CHECK_OK(be->ops->sync(be));
    qd_backend_free(be, d);
    qd_backend_free(be, d2);
    qd_backend_free(be, NULL);
    qd_backend_close(be);
}

static void naive_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) {
                double av = ta ? a[p * lda + i] : a[i * lda + p];
                double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += av * bv;
            }
            c[i * ldc + j] = (float)(alpha * s + beta * c[i * ldc + j]);
        }
}

static void test_gemm(void)
{
    qd_backend *be = open_cpu();
    test_rng rng;
    test_rng_seed(&rng, 11);
    const int64_t m = 37, n = 29, k = 53, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
            int64_t arows = ta ? k : m, brows = tb ? n : k;
            float *a = malloc(sizeof(float) * arows * lda), *b = malloc(sizeof(float) * brows * ldb);
            float *c = malloc(sizeof(float) * m * ldc), *cref = malloc(sizeof(float) * m * ldc);
            test_fill_normal(&rng, a, arows * lda, 1.0f);
            test_fill_normal(&rng, b, brows * ldb, 1.0f);
            test_fill_normal(&rng, c, m * ldc, 1.0f);
            memcpy(cref, c, sizeof(float) * m * ldc);
            CHECK_OK(be->ops->gemm(be, ta, tb, m, n, k, -0.75f, a, lda, b, ldb, 0.5f, c, ldc));
            naive_gemm(ta, tb, m, n, k, -0.75f, a, lda, b, ldb, 0.5f, cref, ldc);
            double md = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double dd = fabs(c[i * ldc + j] - cref[i * ldc + j]);
                    if (dd > md) md = dd;
                }
            CHECK_NEAR(md, 0.0, 1e-4);
            /* The padding columns of C are untouched. */
            CHECK(c[0 * ldc + n] == cref[0 * ldc + n]);
            free(a); free(b); free(c); free(cref);
        }
    float dummy = 0;
    CHECK_ERR(be->ops->gemm(be, 0, 0, 4, 4, 4, 1.0f, &dummy, 2, &dummy, 4, 0.0f, &dummy, 4));
    qd_backend_close(be);
}

static void test_hessian_accum(void)
{
    qd_backend *be = open_cpu();
    test_rng rng;
    test_rng_seed(&rng, 12);
    const int64_t k = 45, r1 = 17, r2 = 30, ldx = k + 5;
    float *x = malloc(sizeof(float) * (r1 + r2) * ldx);
    test_fill_normal(&rng, x, (r1 + r2) * ldx, 1.0f);
    float *h = calloc(k * k, sizeof(float));
    CHECK_OK(be->ops->hessian_accum(be, h, k, x, r1, ldx, 0));
    CHECK_OK(be->ops->hessian_accum(be, h, k, x + r1 * ldx, r2, ldx, r1));
    double md = 0, sym = 0;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) {
            double s = 0;
            for (int64_t r = 0; r < r1 + r2; r++) s += (double)x[r * ldx + i] * x[r * ldx + j];
            s *= 2.0 / (double)(r1 + r2);
            double dd = fabs(s - h[i * k + j]);
            if (dd > md) md = dd;
            sym = fmax(sym, fabs(h[i * k + j] - h[j * k + i]));
        }
    CHECK_NEAR(md, 0.0, 2e-5);
    CHECK(sym == 0.0);
    /* Zero rows change nothing. */
    CHECK_OK(be->ops->hessian_accum(be, h, k, x, 0, ldx, r1 + r2));
    CHECK_ERR(be->ops->hessian_accum(be, h, k, x, 3, k - 1, 0));
    free(x);
    free(h);
    qd_backend_close(be);
}

static void test_chol_inverse_upper(void)
{
    qd_backend *be = open_cpu();
    test_rng rng;
    test_rng_seed(&rng, 13);
    const int64_t k = 70, t = 200;
    float *x = malloc(sizeof(float) * t * k), *h = calloc(k * k, sizeof(float));
    test_fill_normal(&rng, x, t * k, 1.0f);
    CHECK_OK(be->ops->hessian_accum(be, h, k, x, t, k, 0));
    for (int64_t i = 0; i < k; i++) h[i * k + i] += 0.01f;
    float *u = malloc(sizeof(float) * k * k);
    memcpy(u, h, sizeof(float) * k * k);
    CHECK_OK(be->ops->chol_inverse_upper(be, u, k));
    /* Lower triangle zeroed, positive diagonal, and U^T U H = I. */
    int lower_ok = 1;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < i; j++) if (u[i * k + j] != 0.0f) lower_ok = 0;
    CHECK(lower_ok);
    double md = 0;
    for (int64_t i = 0; i < k; i++) {
        CHECK(u[i * k + i] > 0.0f);
        for (int64_t j = 0; j < k; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) {
                double hinv_ip = 0;     /* (U^T U)[i][p] */
                for (int64_t q = 0; q <= (i < p ? i : p); q++) hinv_ip += (double)u[q * k + i] * u[q * k + p];
                s += hinv_ip * h[p * k + j];
            }
            double dd = fabs(s - (i == j ? 1.0 : 0.0));
            if (dd > md) md = dd;
        }
    }
    CHECK_NEAR(md, 0.0, 2e-3);

    /* The same factor as the reference's sequence cholesky -> cholesky_inverse ->
     * cholesky(upper), done here in double. */
    double *L = calloc(k * k, sizeof(double)), *Li = calloc(k * k, sizeof(double));
    double *Hi = calloc(k * k, sizeof(double)), *U = calloc(k * k, sizeof(double));
    for (int64_t j = 0; j < k; j++) {
        double s = h[j * k + j];
        for (int64_t p = 0; p < j; p++) s -= L[j * k + p] * L[j * k + p];
        L[j * k + j] = sqrt(s);
        for (int64_t i = j + 1; i < k; i++) {
            double v = h[i * k + j];
            for (int64_t p = 0; p < j; p++) v -= L[i * k + p] * L[j * k + p];
            L[i * k + j] = v / L[j * k + j];
        }
    }
    for (int64_t c = 0; c < k; c++)          /* Li = L^-1 by forward substitution */
        for (int64_t i = c; i < k; i++) {
            double v = i == c ? 1.0 : 0.0;
            for (int64_t p = c; p < i; p++) v -= L[i * k + p] * Li[p * k + c];
            Li[i * k + c] = v / L[i * k + i];
        }
    for (int64_t i = 0; i < k; i++)          /* H^-1 = Li^T Li */
        for (int64_t j = 0; j < k; j++) {
            double v = 0;
            for (int64_t p = 0; p < k; p++) v += Li[p * k + i] * Li[p * k + j];
            Hi[i * k + j] = v;
        }
    for (int64_t i = 0; i < k; i++) {        /* upper Cholesky: Hi = U^T U */
        double s = Hi[i * k + i];
        for (int64_t p = 0; p < i; p++) s -= U[p * k + i] * U[p * k + i];
        U[i * k + i] = sqrt(s);
        for (int64_t j = i + 1; j < k; j++) {
            double v = Hi[i * k + j];
            for (int64_t p = 0; p < i; p++) v -= U[p * k + i] * U[p * k + j];
            U[i * k + j] = v / U[i * k + i];
        }
    }
    double umax = 0, udiff = 0;
    for (int64_t i = 0; i < k * k; i++) {
        umax = fmax(umax, fabs(U[i]));
        udiff = fmax(udiff, fabs(U[i] - u[i]));
    }
    CHECK_NEAR(udiff / umax, 0.0, 1e-4);
    free(L); free(Li); free(Hi); free(U);

    /* Not positive definite: an error, not garbage. */
    float bad[4] = {1.0f, 3.0f, 3.0f, 1.0f};
    CHECK_INT(be->ops->chol_inverse_upper(be, bad, 2), QD_ENUMERIC);
    CHECK_CONTAINS(be->err.msg, "not positive definite");
    free(x); free(h); free(u);
    qd_backend_close(be);
}

/* chol_ldl_upper against A = R diag(R)^-1 with D = R_jj^2 on its diagonal, H = R R^T (R
 * upper), computed here in double by a Cholesky that runs from the last column back; odd
 * and even sizes (the op reverses rows in pairs and the middle row alone). */
static void ldl_upper_case(qd_backend *be, int64_t k, uint64_t seed)
{
    test_rng rng;
    test_rng_seed(&rng, seed);
    const int64_t t = 3 * k;
    float *x = malloc(sizeof(float) * t * k), *h = calloc(k * k, sizeof(float)), *a = malloc(sizeof(float) * k * k);
    double *R = calloc(k * k, sizeof(double));
    test_fill_normal(&rng, x, t * k, 1.0f);
    CHECK_OK(be->ops->hessian_accum(be, h, k, x, t, k, 0));
    for (int64_t i = 0; i < k; i++) h[i * k + i] += 0.01f;
    memcpy(a, h, sizeof(float) * k * k);
    CHECK_OK(be->ops->chol_ldl_upper(be, a, k));
    for (int64_t j = k - 1; j >= 0; j--) {
        double s = h[j * k + j];
        for (int64_t c = j + 1; c < k; c++) s -= R[j * k + c] * R[j * k + c];
        R[j * k + j] = sqrt(s);
        for (int64_t i = 0; i < j; i++) {
            double v = h[i * k + j];
            for (int64_t c = j + 1; c < k; c++) v -= R[i * k + c] * R[j * k + c];
            R[i * k + j] = v / R[j * k + j];
        }
    }
    double md = 0;
    int lower_ok = 1;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) {
            if (j < i) { lower_ok &= a[i * k + j] == 0.0f; continue; }
            /* the diagonal carries D_jj = R_jj^2, relative to its size */
            double want = j == i ? R[j * k + j] * R[j * k + j] : R[i * k + j] / R[j * k + j];
            md = fmax(md, j == i ? fabs(a[i * k + j] - want) / want : fabs(a[i * k + j] - want));
        }
    CHECK(lower_ok);
    CHECK_NEAR(md, 0.0, 1e-4);
    free(x); free(h); free(a); free(R);
}

static void test_chol_ldl_upper(void)
{
    qd_backend *be = open_cpu();
    ldl_upper_case(be, 1, 3);
    ldl_upper_case(be, 8, 4);
    ldl_upper_case(be, 33, 5);
    ldl_upper_case(be, 70, 6);
    float bad[4] = {1.0f, 3.0f, 3.0f, 1.0f};
    CHECK_INT(be->ops->chol_ldl_upper(be, bad, 2), QD_ENUMERIC);
    CHECK_CONTAINS(be->err.msg, "not positive definite");
    qd_backend_close(be);
}

/* The block kernel against a transliteration of the reference's inner loop, processed
 * column by column over all rows. */
static void gptq_block_vs_reference(qd_cpu_kernel kernel)
{
    qd_backend *be = open_cpu_kernel(kernel);
    test_rng rng;
    test_rng_seed(&rng, 14);
    const int64_t n = 9, k = 40, i1 = 8, i2 = 40, gs = 16, G = (k + gs - 1) / gs;
    qd_quant_cfg cfg = qd_quant_cfg_default();
    cfg.bits = 3;
    cfg.sym = 0;
    cfg.group_size = gs;
    float *w = malloc(sizeof(float) * n * k), *wref = malloc(sizeof(float) * n * k);
    float *hinv = calloc(k * k, sizeof(float));
    test_fill_normal(&rng, w, n * k, 1.0f);
    memcpy(wref, w, sizeof(float) * n * k);
    for (int64_t i = 0; i < k; i++) {
        hinv[i * k + i] = 0.5f + test_rng_uniform(&rng);
        for (int64_t j = i + 1; j < k; j++) hinv[i * k + j] = 0.2f * test_rng_normal(&rng);
    }
    float *err = calloc(n * (i2 - i1), sizeof(float));
    uint8_t *codes = calloc(n * k, 1);
    float *scales = calloc(G * n, sizeof(float)), *zeros = calloc(G * n, sizeof(float));
    int32_t col_group[40];
    for (int64_t j = 0; j < k; j++) col_group[j] = (int32_t)(j / gs);
    /* Group 0 starts before the block: its parameters are given. */
    for (int64_t r = 0; r < n; r++) qd_quant_params(&cfg, w + r * k, gs, 1, &scales[r], &zeros[r]);
    float scales_ref[3 * 9], zeros_ref[3 * 9];
    memcpy(scales_ref, scales, sizeof(float) * G * n);
    memcpy(zeros_ref, zeros, sizeof(float) * G * n);

    qd_gptq_block_args a = {.cfg = &cfg, .n = n, .k = k, .i1 = i1, .i2 = i2, .w = w, .ldw = k,
                            .hinv = hinv, .ldh = k, .err = err, .lde = i2 - i1, .codes = codes,
                            .ldc = k, .scales = scales, .zeros = zeros, .col_group = col_group,
                            .find_params = 1};
    CHECK_OK(be->ops->gptq_block(be, &a));

    /* Reference: W1 = W[:, i1:i2] copy; params on W (block start state) at group starts. */
    const int maxq = qd_quant_maxq(&cfg);
    const int64_t B = i2 - i1;
    float *w1 = malloc(sizeof(float) * n * B), *eref = malloc(sizeof(float) * n * B);
    uint8_t *cref = calloc(n * k, 1);
    for (int64_t r = 0; r < n; r++) memcpy(w1 + r * B, wref + r * k + i1, sizeof(float) * B);
    for (int64_t i = 0; i < B; i++) {
        int64_t j = i1 + i, g = j / gs;
        if (j % gs == 0)
            for (int64_t r = 0; r < n; r++) qd_quant_params(&cfg, wref + r * k + j, j + gs <= k ? gs : k - j, 1, &scales_ref[g * n + r], &zeros_ref[g * n + r]);
        for (int64_t r = 0; r < n; r++) {
            float s = scales_ref[g * n + r], z = zeros_ref[g * n + r], x = w1[r * B + i];
            int c = qd_quant_code(x, s, z, maxq);
            float qv = qd_quant_dequant(c, s, z);
            float e = (x - qv) / hinv[j * k + j];
            for (int64_t cc = i + 1; cc < B; cc++) w1[r * B + cc] -= e * hinv[j * k + i1 + cc];
            eref[r * B + i] = e;
            cref[r * k + j] = (uint8_t)c;
            wref[r * k + j] = qv;
        }
    }
    int codes_same = 0;
    double md = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = i1; j < i2; j++) {
            codes_same += codes[r * k + j] == cref[r * k + j];
            md = fmax(md, fabs(err[r * B + j - i1] - eref[r * B + j - i1]));
        }
    CHECK_INT(codes_same, n * B);
    CHECK_NEAR(md, 0.0, 1e-4);
    CHECK(memcmp(scales, scales_ref, sizeof(float) * G * n) == 0);
    CHECK(memcmp(zeros, zeros_ref, sizeof(float) * G * n) == 0);
    CHECK_NEAR(test_max_abs_diff(w, wref, n * k), 0.0, 1e-5);    /* Q written, rest untouched */
    a.i2 = k + 1;
    CHECK_ERR(be->ops->gptq_block(be, &a));
    free(w); free(wref); free(hinv); free(err); free(codes); free(scales); free(zeros);
    free(w1); free(eref); free(cref);
    qd_backend_close(be);
}

static void test_gptq_block(void)
{
    gptq_block_vs_reference(QD_CPU_KERNEL_AUTO);       /* SIMD kernel where the CPU has one */
    gptq_block_vs_reference(QD_CPU_KERNEL_PORTABLE);   /* the portable kernel */
}

/* Threads split rows; the result must not depend on how many. The SIMD and portable
 * kernels agree up to FMA rounding. */
static void test_gptq_block_threads(void)
{
    qd_backend *b1 = NULL, *b2 = NULL;
    qd_err e = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &b1, &e));
    CHECK_OK(qd_backend_cpu_open(2, NULL, &b2, &e));
    test_rng rng;
    test_rng_seed(&rng, 15);
    const int64_t n = 301, k = 96, gs = 32, G = 3;
    qd_quant_cfg cfg = qd_quant_cfg_default();
    cfg.group_size = gs;
    float *w = malloc(sizeof(float) * n * k), *w2 = malloc(sizeof(float) * n * k);
    float *hinv = calloc(k * k, sizeof(float));
    test_fill_normal(&rng, w, n * k, 1.0f);
    memcpy(w2, w, sizeof(float) * n * k);
    for (int64_t i = 0; i < k; i++) {
        hinv[i * k + i] = 1.0f;
        for (int64_t j = i + 1; j < k; j++) hinv[i * k + j] = 0.1f * test_rng_normal(&rng);
    }
    float *err1 = calloc(n * k, sizeof(float)), *err2 = calloc(n * k, sizeof(float));
    uint8_t *c1 = calloc(n * k, 1), *c2 = calloc(n * k, 1);
    float *s1 = calloc(G * n, sizeof(float)), *s2 = calloc(G * n, sizeof(float));
    float *z1 = calloc(G * n, sizeof(float)), *z2 = calloc(G * n, sizeof(float));
    int32_t cg[96];
    for (int64_t j = 0; j < k; j++) cg[j] = (int32_t)(j / gs);
    qd_gptq_block_args a = {.cfg = &cfg, .n = n, .k = k, .i1 = 0, .i2 = k, .w = w, .ldw = k,
                            .hinv = hinv, .ldh = k, .err = err1, .lde = k, .codes = c1, .ldc = k,
                            .scales = s1, .zeros = z1, .col_group = cg, .find_params = 1};
    CHECK_OK(b1->ops->gptq_block(b1, &a));
    a.w = w2; a.err = err2; a.codes = c2; a.scales = s2; a.zeros = z2;
    CHECK_OK(b2->ops->gptq_block(b2, &a));
    CHECK(memcmp(w, w2, sizeof(float) * n * k) == 0);
    CHECK(memcmp(err1, err2, sizeof(float) * n * k) == 0);
    CHECK(memcmp(c1, c2, n * k) == 0);
    CHECK(memcmp(s1, s2, sizeof(float) * G * n) == 0);
    /* portable kernel: same codes for all but a rare rounding tie, close errors */
    qd_backend *b3 = open_cpu_kernel(QD_CPU_KERNEL_PORTABLE);
    float *w3 = malloc(sizeof(float) * n * k), *err3 = calloc(n * k, sizeof(float));
    uint8_t *c3 = calloc(n * k, 1);
    float *s3 = calloc(G * n, sizeof(float)), *z3 = calloc(G * n, sizeof(float));
    memcpy(w3, w2, sizeof(float) * n * k);
    test_rng_seed(&rng, 15);
    test_fill_normal(&rng, w3, n * k, 1.0f);
    a.w = w3; a.err = err3; a.codes = c3; a.scales = s3; a.zeros = z3;
    CHECK_OK(b3->ops->gptq_block(b3, &a));
    int64_t same = 0;
    for (int64_t i = 0; i < n * k; i++) same += c3[i] == c1[i];
    CHECK(same >= n * k - n * k / 500);
    CHECK(memcmp(s1, s3, sizeof(float) * G * n) == 0);
    free(w3); free(err3); free(c3); free(s3); free(z3);
    qd_backend_close(b3);
    /* every row was processed: the last row's codes are not all zero */
    int any = 0;
    for (int64_t j = 0; j < k; j++) any |= c2[(n - 1) * k + j];
    CHECK(any);
    free(w); free(w2); free(hinv); free(err1); free(err2); free(c1); free(c2);
    free(s1); free(s2); free(z1); free(z2);
    qd_backend_close(b1);
    qd_backend_close(b2);
}

/* The AVX-512 kernel (16 rows per batch, 16-column sub-blocks) must be bit-identical to
 * the AVX2 one (8 rows, column by column): the same operations per lane in the same order.
 * Odd n and a short group cover partial batches; blocks of 48 and 42 columns cover whole
 * sub-blocks and a 10-column tail. Runs the default kernel twice where the CPU has no
 * AVX-512 (still a determinism check). */
static void gptq_block_avx512_vs_avx2(int ldl)
{
    qd_backend *b1 = NULL, *b2 = NULL;
    qd_err e = {0};
    CHECK_OK(qd_backend_cpu_open(2, NULL, &b1, &e));
    b2 = open_cpu_kernel(QD_CPU_KERNEL_AVX2);
    test_rng rng;
    test_rng_seed(&rng, 21);
    const int64_t n = 283, k = 90, gs = 32, G = 3;
    qd_quant_cfg cfg = qd_quant_cfg_default();
    cfg.group_size = gs;
    cfg.sym = 0;
    float *w = malloc(sizeof(float) * n * k), *w2 = malloc(sizeof(float) * n * k);
    float *hinv = calloc(k * k, sizeof(float));
    test_fill_normal(&rng, w, n * k, 1.0f);
    memcpy(w2, w, sizeof(float) * n * k);
    for (int64_t i = 0; i < k; i++) {
        hinv[i * k + i] = 0.5f + 0.5f * fabsf(test_rng_normal(&rng));
        for (int64_t j = i + 1; j < k; j++) hinv[i * k + j] = 0.1f * test_rng_normal(&rng);
    }
    float *err1 = calloc(n * k, sizeof(float)), *err2 = calloc(n * k, sizeof(float));
    uint8_t *c1 = calloc(n * k, 1), *c2 = calloc(n * k, 1);
    float *s1 = calloc(G * n, sizeof(float)), *s2 = calloc(G * n, sizeof(float));
    float *z1 = calloc(G * n, sizeof(float)), *z2 = calloc(G * n, sizeof(float));
    int32_t cg[90];
    for (int64_t j = 0; j < k; j++) cg[j] = (int32_t)(j / gs);
    float *acc = malloc(sizeof(float) * n * k);               /* LDL form: corrections to w */
    test_fill_normal(&rng, acc, n * k, 0.1f);
    for (int64_t i1 = 0; i1 < k; i1 += 48) {                 /* blocks of 48 and 42 columns */
        int64_t i2 = i1 + 48 < k ? i1 + 48 : k;
        qd_gptq_block_args a = {.cfg = &cfg, .n = n, .k = k, .i1 = i1, .i2 = i2, .w = w, .ldw = k,
                                .hinv = hinv, .ldh = k, .err = err1 + i1, .lde = k, .codes = c1, .ldc = k,
                                .scales = s1, .zeros = z1, .col_group = cg, .find_params = 1,
                                .ldl = ldl, .acc = ldl && i1 > 0 ? acc : NULL, .lda = k};
        CHECK_OK(b1->ops->gptq_block(b1, &a));
        a.w = w2; a.err = err2 + i1; a.codes = c2; a.scales = s2; a.zeros = z2;
        CHECK_OK(b2->ops->gptq_block(b2, &a));
    }
    CHECK(memcmp(w, w2, sizeof(float) * n * k) == 0);
    CHECK(memcmp(err1, err2, sizeof(float) * n * k) == 0);
    CHECK(memcmp(c1, c2, n * k) == 0);
    CHECK(memcmp(s1, s2, sizeof(float) * G * n) == 0);
    CHECK(memcmp(z1, z2, sizeof(float) * G * n) == 0);
    int any = 0;
    for (int64_t j = 0; j < k; j++) any |= c1[(n - 1) * k + j];
    CHECK(any);
    free(w); free(w2); free(hinv); free(err1); free(err2); free(c1); free(c2);
    free(s1); free(s2); free(z1); free(z2); free(acc);
    qd_backend_close(b1);
    qd_backend_close(b2);
}

static void test_gptq_block_avx512_vs_avx2(void)
{
    gptq_block_avx512_vs_avx2(0);
    gptq_block_avx512_vs_avx2(1);           /* the LDL form, with corrections after block 0 */
}

int main(void)
{
    TEST_RUN(test_open_specs);
    TEST_RUN(test_memory);
    TEST_RUN(test_gemm);
    TEST_RUN(test_hessian_accum);
    TEST_RUN(test_chol_inverse_upper);
    TEST_RUN(test_chol_ldl_upper);
    TEST_RUN(test_gptq_block);
    TEST_RUN(test_gptq_block_threads);
    TEST_RUN(test_gptq_block_avx512_vs_avx2);
    return test_finish();
}
