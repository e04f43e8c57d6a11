/* Backend dispatch of the dequantizing matmul, and the per-layer kernel check the
 * pipeline runs after packing a layer: the packed weights go through the device's kernel
 * on a slice of calibration inputs and are compared with the backend's float gemm of the
 * weights they must decode to, so a packing or kernel bug shows up on the layer that has it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/kernels/kernels.h"
#ifdef QUANTD_HAVE_CUDA
#include "quant/kernels/cuda/kcuda.h"
#endif

int qd_kernel_matmul(qd_backend *be, const qd_kmat *m, const float *x, int64_t rows, float *y,
                     qd_kpath path, qd_err *err)
{
    if (!be) return qd_err_set(err, QD_EINVAL, "kernel: NULL backend");
    if (be->device < 0) return qd_kernel_matmul_cpu(m, x, rows, y, path, QD_KCPU_AUTO, err);
#ifdef QUANTD_HAVE_CUDA
    return qd_kcuda_matmul(be, m, x, rows, y, path, err);
#else
    return qd_err_set(err, QD_EUNSUPPORTED, "kernel: backend '%s' has no dequantizing kernel in this build",
                      be->name ? be->name : "?");
#endif
}

int qd_kernel_check_layer(qd_backend *be, const qd_format *fmt, const qd_packed *p, const float *w_ref,
                          const float *x_host, int64_t rows, double *max_rel_err, qd_err *err)
{
    if (!be || !fmt || !p || !x_host || rows <= 0 || !max_rel_err)
        return qd_err_set(err, QD_EINVAL, "kernel check: missing argument or no input rows");
    *max_rel_err = 0.0;
    qd_kmat host, dev;
    memset(&dev, 0, sizeof dev);
    int rc = qd_kmat_from_packed(fmt, p, &host, err);
    if (rc) return rc;
    const int64_t n = p->n, k = p->k;
    float *w = w_ref ? NULL : malloc((size_t)(n * k) * sizeof *w);
    float *yk = malloc((size_t)(rows * n) * sizeof *yk);
    float *yf = malloc((size_t)(rows * n) * sizeof *yf);
    float *dw = NULL, *dx = NULL, *dyk = NULL, *dyf = NULL;
    if ((!w_ref && !w) || !yk || !yf) {
        rc = qd_err_set(err, QD_ENOMEM, "kernel check: out of memory for a [%lld, %lld] layer",
                        (long long)n, (long long)k);
        goto done;
    }
    if (!w_ref && (rc = fmt->dequant_ref(p, w, err))) goto done;
    if ((rc = qd_kmat_upload(be, &host, &dev, err))) goto done;
    /* On a host backend the given weights are backend memory already: used in place. */
    const int w_in_place = w_ref && be->device < 0;
    dw = w_in_place ? (float *)w_ref : qd_backend_alloc(be, (size_t)(n * k) * sizeof(float));
    dx = dw ? qd_backend_alloc(be, (size_t)(rows * k) * sizeof(float)) : NULL;
    dyk = dx ? qd_backend_alloc(be, (size_t)(rows * n) * sizeof(float)) : NULL;
    dyf = dyk ? qd_backend_alloc(be, (size_t)(rows * n) * sizeof(float)) : NULL;
    if (!dyf) {
        rc = qd_err_set(err, QD_ENOMEM, "kernel check: %s", be->err.msg);
        goto done;
    }
    if ((!w_in_place && qd_backend_upload(be, dw, w_ref ? w_ref : w, (size_t)(n * k) * sizeof(float))) ||
        qd_backend_upload(be, dx, x_host, (size_t)(rows * k) * sizeof(float)) ||
        be->ops->gemm(be, 0, 1, rows, n, k, 1.0f, dx, k, dw, k, 0.0f, dyf, n)) {
        rc = qd_err_set(err, QD_EBACKEND, "kernel check: float reference: %s", be->err.msg);
        goto done;
    }
    if ((rc = qd_kernel_matmul(be, &dev, dx, rows, dyk, QD_KPATH_AUTO, err))) goto done;
    if (qd_backend_download(be, yk, dyk, (size_t)(rows * n) * sizeof(float)) ||
        qd_backend_download(be, yf, dyf, (size_t)(rows * n) * sizeof(float))) {
        rc = qd_err_set(err, QD_EBACKEND, "kernel check: %s", be->err.msg);
        goto done;
    }
    double amax = 0.0, dmax = 0.0;
    for (int64_t i = 0; i < rows * n; i++) {
        if (!isfinite(yk[i])) {
            rc = qd_err_set(err, QD_ENUMERIC, "kernel check: %s kernel output [%lld][%lld] is not finite",
                            qd_kmat_layout_name(&host), (long long)(i / n), (long long)(i % n));
            goto done;
        }
        double a = fabs((double)yf[i]), d = fabs((double)yk[i] - (double)yf[i]);
        if (a > amax) amax = a;
        if (d > dmax) dmax = d;
    }
    *max_rel_err = amax > 0.0 ? dmax / amax : dmax;
done:
    if (dw != w_ref) qd_backend_free(be, dw);
    qd_backend_free(be, dx);
    qd_backend_free(be, dyk);
    qd_backend_free(be, dyf);
    qd_kmat_free(&dev);
    free(w);
    free(yk);
    free(yf);
    return rc;
}
