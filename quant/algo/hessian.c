/* The streaming GPTQ Hessian accumulator (see hessian.h). */
#include "quant/algo/hessian.h"

#include <math.h>
#include <string.h>

#include "quant/core/finite.h"

/* Host rows go to non-CPU backends in chunks of this many rows, which bounds the staging
 * buffer; each chunk is one running-average step. */
#define HESSIAN_STAGE_ROWS 1024

int qd_gptq_hessian_init(qd_gptq_hessian *acc, qd_backend *be, int64_t k, qd_err *err)
{
    if (!acc) return qd_err_set(err, QD_EINVAL, "hessian: NULL accumulator");
    memset(acc, 0, sizeof *acc);
    if (!be) return qd_err_set(err, QD_EINVAL, "hessian: NULL backend");
    if (k <= 0 || k > (int64_t)1 << 20)
        return qd_err_set(err, QD_EINVAL, "hessian: %lld input features is out of range", (long long)k);
    size_t bytes = (size_t)k * (size_t)k * sizeof(float);
    float *h = qd_backend_alloc(be, bytes);
    if (!h) return qd_err_set(err, QD_ERESOURCE, "hessian: cannot allocate the %lld x %lld Hessian (%zu bytes)",
                              (long long)k, (long long)k, bytes);
    int rc = be->ops->memset0(be, h, bytes);
    if (rc) {
        qd_backend_free(be, h);
        return qd_err_set(err, rc, "hessian: %s", be->err.msg);
    }
    acc->be = be;
    acc->k = k;
    acc->h = h;
    return 0;
}

int qd_gptq_hessian_add_dev(qd_gptq_hessian *acc, const float *x, int64_t rows, int64_t ldx,
                            qd_err *err)
{
    if (!acc || !acc->h) return qd_err_set(err, QD_EINVAL, "hessian: accumulator is not initialised");
    if (rows < 0 || (rows > 0 && (!x || ldx < acc->k)))
        return qd_err_set(err, QD_EINVAL, "hessian: bad rows (%lld rows, row stride %lld, %lld features)",
                          (long long)rows, (long long)ldx, (long long)acc->k);
    if (rows == 0) return 0;
    qd_backend *be = acc->be;
    if (acc->bf16 && !be->ops->hessian_accum_bf16)
        return qd_err_set(err, QD_EUNSUPPORTED, "hessian: the %s backend has no bfloat16 products", be->name);
    int rc = acc->bf16 ? be->ops->hessian_accum_bf16(be, acc->h, acc->k, x, rows, ldx, acc->n_seen)
                       : be->ops->hessian_accum(be, acc->h, acc->k, x, rows, ldx, acc->n_seen);
    if (rc) return qd_err_set(err, rc, "hessian: %s", be->err.msg);
    float m = 0.0f;
    /* Rows of ldx > k: the gaps between rows are read too only when ldx == k. */
    for (int64_t r = 0; r < rows && !rc; r += ldx == acc->k ? rows : 1) {
        int64_t cnt = ldx == acc->k ? rows * acc->k : acc->k;
        float mr = 0.0f;
        rc = be->ops->abs_max(be, x + r * ldx, cnt, &mr);
        if (mr > m) m = mr;
    }
    if (rc) return qd_err_set(err, rc, "hessian: %s", be->err.msg);
    if (m > acc->x_amax) acc->x_amax = m;
    acc->n_seen += rows;
    return 0;
}

int qd_gptq_hessian_add(qd_gptq_hessian *acc, const float *x, int64_t rows, qd_err *err)
{
    if (!acc || !acc->h) return qd_err_set(err, QD_EINVAL, "hessian: accumulator is not initialised");
    if (rows < 0 || (rows > 0 && !x))
        return qd_err_set(err, QD_EINVAL, "hessian: bad rows (%lld)", (long long)rows);
    const int64_t k = acc->k;
    int64_t i = qd_f32_first_nonfinite(x, rows * k);
    if (i >= 0)
        return qd_err_set(err, QD_ENUMERIC, "hessian: input row %lld, feature %lld is %g (not finite)",
                          (long long)(i / k), (long long)(i % k), (double)x[i]);
    qd_backend *be = acc->be;
    /* On the CPU backend host memory is backend memory: no staging copy. */
    if (be->device < 0) return qd_gptq_hessian_add_dev(acc, x, rows, k, err);
    if (!acc->stage) {
        acc->stage = qd_backend_alloc(be, (size_t)HESSIAN_STAGE_ROWS * (size_t)k * sizeof(float));
        if (!acc->stage) return qd_err_set(err, QD_ERESOURCE, "hessian: cannot allocate staging rows: %s", be->err.msg);
        acc->stage_rows = HESSIAN_STAGE_ROWS;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += acc->stage_rows) {
        int64_t nr = rows - r0 < acc->stage_rows ? rows - r0 : acc->stage_rows;
        int rc = qd_backend_upload(be, acc->stage, x + r0 * k, (size_t)nr * (size_t)k * sizeof(float));
        if (rc) return qd_err_set(err, rc, "hessian: upload failed: %s", be->err.msg);
        rc = qd_gptq_hessian_add_dev(acc, acc->stage, nr, k, err);
        if (rc) return rc;
    }
    return 0;
}

int qd_gptq_hessian_download(const qd_gptq_hessian *acc, float *h_host, qd_err *err)
{
    if (!acc || !acc->h || !h_host) return qd_err_set(err, QD_EINVAL, "hessian: nothing to download");
    int rc = qd_backend_download(acc->be, h_host, acc->h, (size_t)acc->k * (size_t)acc->k * sizeof(float));
    if (rc) return qd_err_set(err, rc, "hessian: download failed: %s", acc->be->err.msg);
    return 0;
}

void qd_gptq_hessian_free(qd_gptq_hessian *acc)
{
    if (!acc) return;
    if (acc->be) {
        qd_backend_free(acc->be, acc->h);
        qd_backend_free(acc->be, acc->stage);
    }
    memset(acc, 0, sizeof *acc);
}

int qd_gptq_hessian_merge(qd_gptq_hessian *acc, qd_gptq_hessian *part, qd_err *err)
{
    if (!acc || !acc->h || !part || !part->h || part->k != acc->k || part->be != acc->be)
        return qd_err_set(err, QD_EINVAL, "hessian merge: accumulators of different widths or backends");
    if (part->n_seen == 0) return 0;
    qd_backend *be = acc->be;
    const int64_t kk = acc->k * acc->k;
    int rc;
    if (acc->n_seen == 0) {
        rc = be->ops->copy(be, acc->h, part->h, (size_t)kk * sizeof(float));
    } else {
        double n = (double)acc->n_seen, m = (double)part->n_seen;
        rc = be->ops->scale(be, acc->h, kk, (float)(n / (n + m)));
        if (!rc) rc = be->ops->scale(be, part->h, kk, (float)(m / (n + m)));
        if (!rc) rc = be->ops->add(be, acc->h, part->h, kk);
    }
    if (rc) return qd_err_set(err, rc, "hessian merge: %s", be->err.msg);
    acc->n_seen += part->n_seen;
    if (part->x_amax > acc->x_amax) acc->x_amax = part->x_amax;
    return 0;
}
