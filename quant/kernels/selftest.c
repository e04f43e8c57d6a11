/* The kernel self-test (see selftest.h): random packed layers of every supported format,
 * bit width, group size and layout; every kernel path of the backend compared with the
 * scalar reference; then the batch-1 kernel's bandwidth against a measured copy.
 * Nothing here is timed with more care than a wall clock around a synchronised call:
 * bench/kernel_bench.c does the careful timing. */
#include "quant/kernels/selftest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/core/clock.h"
#include "quant/core/dtype.h"
#include "quant/kernels/kernels.h"

typedef struct st_rng { uint64_t s; } st_rng;

static uint64_t st_next(st_rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

static double st_unit(st_rng *r) { return (double)(st_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Never exactly zero: zeros would hide unwritten outputs and wrong indexing. */
static float st_value(st_rng *r)
{
    double u = st_unit(r) * 2.0 - 1.0;
    return (float)(u >= 0 ? u + 0.05 : u - 0.05);
}

int qd_selftest_make_layer(const qd_format *fmt, int bits, int64_t group_size, int act_order,
                           int64_t n, int64_t k, uint64_t seed, qd_packed *out, qd_err *err)
{
    if (!fmt || !out) return qd_err_set(err, QD_EINVAL, "selftest: NULL format or output");
    memset(out, 0, sizeof *out);
    qd_qlayer l;
    int rc = qd_qlayer_alloc(&l, n, k, bits, 0, group_size, 0, err);
    if (rc) return rc;
    st_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x1234567ull};
    const int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < n * k; i++) l.q[i] = (uint8_t)(st_next(&r) % (uint64_t)(maxq + 1));
    for (int64_t i = 0; i < l.n_groups * n; i++) {
        l.scales[i] = qd_f32_round_f16((float)(0.002 + 0.05 * st_unit(&r)));
        /* gptq v1 cannot store a zero of 0 */
        int lo = fmt->zero_offset ? 1 : 0;
        l.zeros[i] = lo + (int32_t)(st_next(&r) % (uint64_t)(maxq + 1 - lo));
    }
    if (act_order && group_size > 0) {
        /* g_idx of a random permutation: equal groups, scattered over K as desc_act does. */
        int32_t *perm = malloc((size_t)k * sizeof *perm);
        if (!perm) {
            qd_qlayer_free(&l);
            return qd_err_set(err, QD_ENOMEM, "selftest: out of memory");
        }
        for (int64_t i = 0; i < k; i++) perm[i] = (int32_t)i;
        for (int64_t i = k - 1; i > 0; i--) {
            int64_t j = (int64_t)(st_next(&r) % (uint64_t)(i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < k; i++) l.g_idx[perm[i]] = (int32_t)(i / group_size);
        free(perm);
    }
    rc = fmt->pack(&l, out, err);
    qd_qlayer_free(&l);
    return rc;
}

int qd_selftest_cases(qd_selftest_case *out, int cap)
{
    static const int bits_all[] = {2, 3, 4, 8};
    static const int64_t groups[] = {32, 64, 128, -1};
    int n = 0;
    for (size_t f = 0; f < qd_format_count(); f++) {
        const qd_format *fmt = qd_format_at(f);
        for (int bi = 0; bi < 4; bi++) {
            if (!(fmt->bits_mask & (1u << bits_all[bi]))) continue;
            for (int gi = 0; gi < 4; gi++)
                for (int act = 0; act < 2; act++) {
                    if (act && (!fmt->has_g_idx || groups[gi] <= 0)) continue;
                    if (n < cap) out[n] = (qd_selftest_case){fmt, bits_all[bi], groups[gi], act};
                    n++;
                }
        }
    }
    return n < cap ? n : cap;
}

static int st_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One kernel variant of the backend under test. */
typedef struct st_kernel {
    const char *name;
    qd_kcpu_isa isa;          /* CPU variants */
    qd_kpath path;
    qd_selftest_tol tol;
} st_kernel;

static const qd_selftest_tol st_tol_f32 = {"f32-accum", 5e-5, 1e-5};
static const qd_selftest_tol st_tol_f16 = {"f16-tensor-core", 3e-3, 1e-3};

typedef struct st_ctx {
    qd_backend *be;
    FILE *log;
    qd_selftest_report *rep;
    qd_err *err;
    st_kernel kern[4];
    int n_kern;
} st_ctx;

/* Runs kernel kv on (host) m and x, leaving y on the host. */
static int st_run_kernel(st_ctx *c, const st_kernel *kv, const qd_kmat *m, const qd_kmat *mdev,
                         const float *x, float *dx, int64_t rows, float *y, float *dy)
{
    qd_backend *be = c->be;
    if (be->device < 0) return qd_kernel_matmul_cpu(m, x, rows, y, kv->path, kv->isa, c->err);
    size_t xb = (size_t)(rows * m->k) * sizeof(float), yb = (size_t)(rows * m->n) * sizeof(float);
    if (qd_backend_upload(be, dx, x, xb) || be->ops->memset0(be, dy, yb))
        return qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
    int rc = qd_kernel_matmul(be, mdev, dx, rows, dy, kv->path, c->err);
    if (rc) return rc;
    if (qd_backend_download(be, y, dy, yb)) return qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
    return 0;
}

/* Compares y with ref; records a failure with the first mismatches. */
static void st_compare(st_ctx *c, const char *what, const qd_selftest_tol *tol, const float *y,
                       const float *ref, const double *mag, int64_t rows, int64_t n)
{
    int bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < rows * n; i++) {
        double d = fabs((double)y[i] - (double)ref[i]);
        double lim = tol->abs * mag[i] + tol->rel * fabs((double)ref[i]);
        if (mag[i] > 0 && d / mag[i] > worst) worst = d / mag[i];
        if (!(d <= lim)) {
            if (bad < 5 && c->log)
                fprintf(c->log, "  MISMATCH %s y[%lld][%lld] = %.9g, ref %.9g (|diff| %.3g > %.3g, tol %s)\n",
                        what, (long long)(i / n), (long long)(i % n), (double)y[i], (double)ref[i], d, lim,
                        tol->name);
            bad++;
        }
    }
    c->rep->cases++;
    if (bad) {
        if (!c->rep->failures)
            snprintf(c->rep->first_failure, sizeof c->rep->first_failure, "%s: %d of %lld outputs outside %s",
                     what, bad, (long long)(rows * n), tol->name);
        c->rep->failures++;
    }
    if (c->log) fprintf(c->log, "%-4s %-62s max|diff|/mag %.2e\n", bad ? "FAIL" : "ok", what, worst);
}

/* All kernel variants on one layer for the given batch sizes. */
static int st_layer(st_ctx *c, const qd_format *fmt, int bits, int64_t gs, int act, int reorder,
                    int64_t n, int64_t k, const int *batches, int nb, uint64_t seed)
{
    qd_packed p;
    qd_kmat view, re, dev;
    memset(&re, 0, sizeof re);
    memset(&dev, 0, sizeof dev);
    int rc = qd_selftest_make_layer(fmt, bits, gs, act, n, k, seed, &p, c->err);
    if (rc) return rc;
    if ((rc = qd_kmat_from_packed(fmt, &p, &view, c->err))) goto done;
    const qd_kmat *m = &view;
    if (reorder) {
        if ((rc = qd_kmat_reorder(&view, &re, c->err))) goto done;
        m = &re;
    }
    int64_t maxb = 0;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    float *x = malloc((size_t)(maxb * k) * sizeof *x);
    float *y = malloc((size_t)(maxb * n) * sizeof *y);
    float *ref = malloc((size_t)(maxb * n) * sizeof *ref);
    double *mag = malloc((size_t)(maxb * n) * sizeof *mag);
    float *dx = NULL, *dy = NULL;
    if (!x || !y || !ref || !mag) {
        rc = qd_err_set(c->err, QD_ENOMEM, "selftest: out of memory");
        goto done2;
    }
    if (c->be->device >= 0) {
        if ((rc = qd_kmat_upload(c->be, m, &dev, c->err))) goto done2;
        dx = qd_backend_alloc(c->be, (size_t)(maxb * k) * sizeof(float));
        dy = dx ? qd_backend_alloc(c->be, (size_t)(maxb * n) * sizeof(float)) : NULL;
        if (!dy) {
            rc = qd_err_set(c->err, QD_ENOMEM, "selftest: %s", c->be->err.msg);
            goto done2;
        }
    }
    st_rng r = {seed + 77};
    for (int bi = 0; bi < nb && !rc; bi++) {
        int64_t rows = batches[bi];
        for (int64_t i = 0; i < rows * k; i++) x[i] = st_value(&r);
        if ((rc = qd_kernel_matmul_ref(m, x, rows, ref, mag, c->err))) break;
        for (int ki = 0; ki < c->n_kern && !rc; ki++) {
            const st_kernel *kv = &c->kern[ki];
            /* Poison y so an unwritten output cannot pass. */
            for (int64_t i = 0; i < rows * n; i++) y[i] = NAN;
            if ((rc = st_run_kernel(c, kv, m, &dev, x, dx, rows, y, dy))) break;
            char what[160];
            snprintf(what, sizeof what, "%s %s %d-bit g%lld %s [%lldx%lld] M=%lld", kv->name, fmt->name, bits,
                     (long long)gs, qd_kmat_layout_name(m), (long long)n, (long long)k, (long long)rows);
            st_compare(c, what, &kv->tol, y, ref, mag, rows, n);
        }
    }
done2:
    if (c->be->device >= 0) {
        qd_backend_free(c->be, dx);
        qd_backend_free(c->be, dy);
    }
    free(x);
    free(y);
    free(ref);
    free(mag);
done:
    qd_kmat_free(&dev);
    qd_kmat_free(&re);
    qd_packed_free(&p);
    return rc;
}

/* Copy bandwidth (read + write) of the backend's memory, median of several copies. */
static int st_copy_bw(st_ctx *c, size_t bytes, double *gbps)
{
    qd_backend *be = c->be;
    void *a = qd_backend_alloc(be, bytes), *b = a ? qd_backend_alloc(be, bytes) : NULL;
    if (!b) {
        qd_backend_free(be, a);
        return qd_err_set(c->err, QD_ENOMEM, "selftest: %s", be->err.msg);
    }
    int rc = 0;
    double t[7];
    if (be->ops->memset0(be, a, bytes) || be->ops->memset0(be, b, bytes) || be->ops->copy(be, b, a, bytes) ||
        be->ops->sync(be))
        rc = qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
    for (int i = 0; i < 7 && !rc; i++) {
        double t0 = qd_clock_now_s();
        if (be->ops->copy(be, i & 1 ? a : b, i & 1 ? b : a, bytes) || be->ops->sync(be))
            rc = qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
        t[i] = qd_clock_now_s() - t0;
    }
    if (!rc) {
        qsort(t, 7, sizeof t[0], st_cmp_double);
        *gbps = 2.0 * (double)bytes / t[3] / 1e9;
    }
    qd_backend_free(be, a);
    qd_backend_free(be, b);
    return rc;
}

/* Packed-weight GB/s of the batch-1 kernel on a 4-bit g128 gptq layer. */
static int st_gemv_bw(st_ctx *c, int64_t n, int64_t k, double *gbps)
{
    qd_backend *be = c->be;
    qd_packed p;
    qd_kmat view, dev;
    memset(&dev, 0, sizeof dev);
    int rc = qd_selftest_make_layer(qd_format_find("gptq_v2"), 4, 128, 0, n, k, 99, &p, c->err);
    if (rc) return rc;
    float *x = malloc((size_t)k * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *dx = NULL, *dy = NULL;
    const qd_kmat *m = &view;
    if (!x || !y) { rc = qd_err_set(c->err, QD_ENOMEM, "selftest: out of memory"); goto done; }
    st_rng r = {5};
    for (int64_t i = 0; i < k; i++) x[i] = st_value(&r);
    if ((rc = qd_kmat_from_packed(qd_format_find("gptq_v2"), &p, &view, c->err))) goto done;
    if (be->device >= 0) {
        if ((rc = qd_kmat_upload(be, &view, &dev, c->err))) goto done;
        m = &dev;
        dx = qd_backend_alloc(be, (size_t)k * sizeof(float));
        dy = dx ? qd_backend_alloc(be, (size_t)n * sizeof(float)) : NULL;
        if (!dy || qd_backend_upload(be, dx, x, (size_t)k * sizeof(float))) {
            rc = qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
            goto done;
        }
    }
    double t[9];
    int reps = be->device >= 0 ? 9 : 5;
    for (int i = 0; i <= reps && !rc; i++) {             /* the first run warms up */
        double t0 = qd_clock_now_s();
        rc = be->device >= 0 ? qd_kernel_matmul(be, m, dx, 1, dy, QD_KPATH_GEMV, c->err)
                             : qd_kernel_matmul_cpu(m, x, 1, y, QD_KPATH_GEMV, QD_KCPU_AUTO, c->err);
        if (!rc && be->ops->sync(be)) rc = qd_err_set(c->err, QD_EBACKEND, "selftest: %s", be->err.msg);
        if (i) t[i - 1] = qd_clock_now_s() - t0;
    }
    if (!rc) {
        qsort(t, (size_t)reps, sizeof t[0], st_cmp_double);
        *gbps = (double)qd_kmat_bytes(&view) / t[reps / 2] / 1e9;
    }
done:
    if (be->device >= 0) {
        qd_backend_free(be, dx);
        qd_backend_free(be, dy);
    }
    qd_kmat_free(&dev);
    qd_packed_free(&p);
    free(x);
    free(y);
    return rc;
}

int qd_selftest_run(qd_backend *be, int quick, FILE *log, qd_selftest_report *rep, qd_err *err)
{
    if (!be || !rep) return qd_err_set(err, QD_EINVAL, "selftest: NULL backend or report");
    memset(rep, 0, sizeof *rep);
    st_ctx c = {.be = be, .log = log, .rep = rep, .err = err};
    if (be->device < 0) {
        snprintf(rep->device, sizeof rep->device, "cpu (%s)", qd_kernel_cpu_isa_name());
        c.kern[c.n_kern++] = (st_kernel){"cpu-portable-gemv", QD_KCPU_PORTABLE, QD_KPATH_GEMV, st_tol_f32};
        c.kern[c.n_kern++] = (st_kernel){"cpu-portable-gemm", QD_KCPU_PORTABLE, QD_KPATH_GEMM, st_tol_f32};
        if (!strcmp(qd_kernel_cpu_isa_name(), "avx2")) {
            c.kern[c.n_kern++] = (st_kernel){"cpu-avx2-gemv", QD_KCPU_AVX2, QD_KPATH_GEMV, st_tol_f32};
            c.kern[c.n_kern++] = (st_kernel){"cpu-avx2-gemm", QD_KCPU_AVX2, QD_KPATH_GEMM, st_tol_f32};
        }
    } else {
        snprintf(rep->device, sizeof rep->device, "cuda:%d", be->device);
        c.kern[c.n_kern++] = (st_kernel){"cuda-gemv", QD_KCPU_AUTO, QD_KPATH_GEMV, st_tol_f32};
        c.kern[c.n_kern++] = (st_kernel){"cuda-gemm-wmma", QD_KCPU_AUTO, QD_KPATH_GEMM, st_tol_f16};
    }
    static const int b_quick[] = {1, 5, 16};
    static const int b_full[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33};
    const int *batches = quick ? b_quick : b_full;
    int nb = quick ? 3 : (int)(sizeof b_full / sizeof b_full[0]);
    const int64_t n = quick ? 64 : 192, k = quick ? 256 : 1024;
    qd_selftest_case cases[QD_SELFTEST_MAX_CASES];
    const int n_cases = qd_selftest_cases(cases, QD_SELFTEST_MAX_CASES);
    uint64_t seed = 1;
    int rc = 0;
    for (int ci = 0; ci < n_cases && !rc; ci++) {
        const qd_selftest_case *t = &cases[ci];
        /* Quick mode: every bit width on gptq_v2, 4-bit only on the other formats. */
        if (quick && t->bits != 4 && strcmp(t->fmt->name, "gptq_v2")) continue;
        if (quick && t->group_size != 128 && t->group_size != -1 && !(t->bits == 4 && t->group_size == 32)) continue;
        /* Act-order runs both the naive layout and the exllama reorder. */
        rc = st_layer(&c, t->fmt, t->bits, t->group_size, t->act_order, 0, n, k, batches, nb, seed++);
        if (!rc && t->act_order) rc = st_layer(&c, t->fmt, t->bits, t->group_size, 1, 1, n, k, batches, nb, seed++);
    }
    if (!rc) rc = st_copy_bw(&c, (size_t)(quick ? 32 : 128) << 20, &rep->copy_gbps);
    if (!rc) {
        int64_t d = be->device >= 0 ? (quick ? 4096 : 8192) : (quick ? 1024 : 4096);
        rc = st_gemv_bw(&c, d, d, &rep->gemv_gbps);
    }
    if (rc) return rc;
    rep->gemv_frac = rep->copy_gbps > 0 ? rep->gemv_gbps / rep->copy_gbps : 0.0;
    if (log)
        fprintf(log, "selftest %s: %d cases, %d failed; copy %.1f GB/s, batch-1 kernel %.1f GB/s (%.0f%% of copy)\n",
                rep->device, rep->cases, rep->failures, rep->copy_gbps, rep->gemv_gbps, 100.0 * rep->gemv_frac);
    if (rep->failures)
        return qd_err_set(err, QD_EMISMATCH, "selftest %s: %d of %d kernel checks failed (first: %s)", rep->device,
                          rep->failures, rep->cases, rep->first_failure);
    return 0;
}
