/* The backend fault hook (see backend_fault.h). Empty unless QUANTD_FAULT_HOOKS is
 * defined, so production builds carry no trace of it. The wrapper's state lives in a copy
 * of the ops table that be->ops points to (its first member), so nothing is global and
 * struct qd_backend needs no field for it. */
#include "quant/backend/backend_fault.h"

#ifdef QUANTD_FAULT_HOOKS
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault_wrap {
    qd_backend_ops ops;               /* first: be->ops points here */
    const qd_backend_ops *inner;      /* the backend's own ops */
    char op[16];
    long at, calls;
    int tripped;
} fault_wrap;

static int fault_gemm(qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
static int fault_upload(qd_backend *be, void *d, const void *s, size_t n);
static int fault_download(qd_backend *be, void *d, const void *s, size_t n);
static int fault_sync(qd_backend *be);
static int fault_gemm_nt_bf16(qd_backend *be, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float *c, int64_t ldc);
static int fault_hessian_accum_bf16(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows,
                                    int64_t ldx, int64_t n_seen);

static fault_wrap *fault_of(qd_backend *be)
{
    return be && be->ops && be->ops->gemm == fault_gemm ? (fault_wrap *)(void *)be->ops : NULL;
}

/* Counts a call of op (the spec's OP; call names the backend op, which for the bfloat16
 * products differs: they count as gemm); returns QD_EBACKEND once the fault has tripped. */
static int fault_check_call(qd_backend *be, const char *op, const char *call, int line)
{
    fault_wrap *w = fault_of(be);
    if (!w->tripped && !strcmp(op, w->op) && ++w->calls == w->at) w->tripped = 1;
    if (!w->tripped) return 0;
    be->broken = 1;
    char dev[32];
    if (be->device >= 0) snprintf(dev, sizeof dev, "cuda:%d", be->device);
    else snprintf(dev, sizeof dev, "%s", be->name ? be->name : "cpu");
    return qd_err_set(&be->err, QD_EBACKEND, "%s: %s failed: injected device fault (%s call %ld of the "
                      "QUANTD_FAULT_INJECT hook; the context is now unusable) (%s:%d)", dev, call, w->op, w->at,
                      __FILE__, line);
}

static int fault_check(qd_backend *be, const char *op, int line)
{
    return fault_check_call(be, op, op, line);
}

static int fault_gemm(qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    int rc = fault_check(be, "gemm", __LINE__);
    return rc ? rc : fault_of(be)->inner->gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int fault_upload(qd_backend *be, void *d, const void *s, size_t n)
{
    int rc = fault_check(be, "upload", __LINE__);
    return rc ? rc : fault_of(be)->inner->upload(be, d, s, n);
}

static int fault_download(qd_backend *be, void *d, const void *s, size_t n)
{
    int rc = fault_check(be, "download", __LINE__);
    return rc ? rc : fault_of(be)->inner->download(be, d, s, n);
}

static int fault_sync(qd_backend *be)
{
    int rc = fault_check(be, "sync", __LINE__);
    return rc ? rc : fault_of(be)->inner->sync(be);
}

static int fault_gemm_nt_bf16(qd_backend *be, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int rc = fault_check_call(be, "gemm", "gemm_nt_bf16", __LINE__);
    return rc ? rc : fault_of(be)->inner->gemm_nt_bf16(be, m, n, k, a, lda, b, ldb, c, ldc);
}

static int fault_hessian_accum_bf16(qd_backend *be, float *h, int64_t k, const float *x, int64_t rows,
                                    int64_t ldx, int64_t n_seen)
{
    int rc = fault_check_call(be, "gemm", "hessian_accum_bf16", __LINE__);
    return rc ? rc : fault_of(be)->inner->hessian_accum_bf16(be, h, k, x, rows, ldx, n_seen);
}

int qd_backend_fault_wrap(qd_backend *be, const char *spec, qd_err *err)
{
    if (!be || !spec) return qd_err_set(err, QD_EINVAL, "QUANTD_FAULT_INJECT: no backend or spec");
    const char *colon = strchr(spec, ':');
    char *end = NULL;
    errno = 0;
    long at = colon ? strtol(colon + 1, &end, 10) : 0;
    size_t oplen = colon ? (size_t)(colon - spec) : 0;
    static const char *const ops[] = {"gemm", "upload", "download", "sync"};
    int known = 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (oplen == strlen(ops[i]) && !strncmp(spec, ops[i], oplen)) known = 1;
    if (!colon || !known || !end || *end || errno || at < 1)
        return qd_err_set(err, QD_EINVAL, "QUANTD_FAULT_INJECT: '%s' is not OP:N with OP one of gemm, upload, "
                          "download, sync and N >= 1", spec);
    if (fault_of(be)) return qd_err_set(err, QD_EINVAL, "QUANTD_FAULT_INJECT: the backend is already wrapped");
    fault_wrap *w = calloc(1, sizeof *w);
    if (!w) return qd_err_set(err, QD_ENOMEM, "QUANTD_FAULT_INJECT: out of memory");
    w->inner = be->ops;
    w->ops = *be->ops;
    w->ops.gemm = fault_gemm;
    w->ops.upload = fault_upload;
    w->ops.download = fault_download;
    w->ops.sync = fault_sync;
    /* The bfloat16 products ("compute": "bf16") are GEMMs on the device too; absent stays absent. */
    if (w->ops.gemm_nt_bf16) w->ops.gemm_nt_bf16 = fault_gemm_nt_bf16;
    if (w->ops.hessian_accum_bf16) w->ops.hessian_accum_bf16 = fault_hessian_accum_bf16;
    memcpy(w->op, spec, oplen);
    w->at = at;
    be->ops = &w->ops;
    return 0;
}

void qd_backend_fault_unwrap(qd_backend *be)
{
    fault_wrap *w = fault_of(be);
    if (!w) return;
    be->ops = w->inner;
    free(w);
}
#endif
