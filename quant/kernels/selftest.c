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
#include "quant/core/minifloat.h"
#include "quant/formats/quantizer.h"
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

/* ---- float layers -------------------------------------------------------------------- */

/* The variants of the float layout; fmt is filled per case. */
static const qd_selftest_fcase st_fvariants[] = {
    {NULL, "fp8-tensor", QD_GRID_FP8_E4M3, QD_SCALE_F32, -1, -1},
    {NULL, "fp8-channel", QD_GRID_FP8_E4M3, QD_SCALE_F32, -1, 1},
    {NULL, "fp8-block128", QD_GRID_FP8_E4M3, QD_SCALE_F32, 128, 128},
    {NULL, "fp8-g128", QD_GRID_FP8_E4M3, QD_SCALE_F32, 128, 1},
    {NULL, "nvfp4-g16", QD_GRID_FP4_E2M1, QD_SCALE_FP8_GLOBAL, 16, 1},
    {NULL, "mxfp4-g32", QD_GRID_FP4_E2M1, QD_SCALE_E8M0, 32, 1},
};
#define ST_N_FVARIANTS (int)(sizeof st_fvariants / sizeof st_fvariants[0])

/* A random code of the grid that is not NaN (E4M3 0x7f / 0xff). */
static uint8_t st_fcode(st_rng *r, qd_grid grid)
{
    if (grid == QD_GRID_FP4_E2M1) return (uint8_t)(st_next(r) & 15u);
    uint8_t b = (uint8_t)(st_next(r) & 0xffu);
    return (b & 0x7f) == 0x7f ? (uint8_t)(b - 1) : b;
}

/* A random stored scale of the rule (what fscales and a float qd_qlayer hold). */
static float st_fscale(st_rng *r, qd_scale_rule rule)
{
    switch (rule) {
    case QD_SCALE_FP8_GLOBAL:     /* a positive normal E4M3 value, 2^-6 .. 448 */
        return qd_fp8_e4m3_to_f32((uint8_t)(0x08 + st_next(r) % (0x7e - 0x08 + 1)));
    case QD_SCALE_E8M0:           /* 2^-12 .. 2^-4 */
        return qd_e8m0_to_f32((uint8_t)(127 - 12 + (int)(st_next(r) % 9)));
    default:
        return (float)(1e-3 + 2e-2 * st_unit(r));
    }
}

int qd_selftest_make_float_layer(const qd_selftest_fcase *c, int64_t n, int64_t k, uint64_t seed,
                                 qd_packed *out, qd_err *err)
{
    if (!c || !out) return qd_err_set(err, QD_EINVAL, "selftest: NULL case or output");
    memset(out, 0, sizeof *out);
    const int fp4 = c->grid == QD_GRID_FP4_E2M1;
    if (n <= 0 || k <= 0 || (fp4 && k % 2))
        return qd_err_set(err, QD_ESHAPE, "selftest: no %s layer [%lld, %lld]", c->name, (long long)n, (long long)k);
    st_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x51ull};
    const int64_t G = c->group_size > 0 ? (k + c->group_size - 1) / c->group_size : 1;
    const int64_t R = c->row_block > 0 ? (n + c->row_block - 1) / c->row_block : 1;
    /* NVFP4's global scale as the quantizer makes it, from a tensor amax in [0.5, 4]. */
    const float amax = (float)(0.5 + 3.5 * st_unit(&r));
    const float gscale = c->scale_rule == QD_SCALE_FP8_GLOBAL ? qd_quant_global_scale(amax) : 0.0f;
    float *sc = malloc((size_t)(R * G) * sizeof *sc);
    if (!sc) return qd_err_set(err, QD_ENOMEM, "selftest: out of memory");
    for (int64_t i = 0; i < R * G; i++) sc[i] = st_fscale(&r, c->scale_rule);
    int rc = 0;
    if (!c->fmt) {
        /* By hand: format.h's float fields. */
        const int64_t cols = fp4 ? k / 2 : k;
        out->fcodes = malloc((size_t)(n * cols));
        if (!out->fcodes) {
            free(sc);
            return qd_err_set(err, QD_ENOMEM, "selftest: out of memory");
        }
        for (int64_t i = 0; i < n * cols; i++)
            out->fcodes[i] = fp4 ? (uint8_t)(st_fcode(&r, c->grid) | st_fcode(&r, c->grid) << 4) : st_fcode(&r, c->grid);
        out->n = n;
        out->k = k;
        out->bits = fp4 ? 4 : 8;
        out->sym = 1;
        out->group_size = c->group_size;
        out->n_groups = G;
        out->grid = c->grid;
        out->scale_rule = c->scale_rule;
        out->global_scale = gscale;
        out->row_block = c->row_block;
        out->fcodes_shape[0] = n;
        out->fcodes_shape[1] = cols;
        out->fscales = sc;
        out->fscales_shape[0] = R;
        out->fscales_shape[1] = G;
        return 0;
    }
    /* Through the format: a float qd_qlayer (codes, stored scales [G, N], zeros 0). */
    qd_qlayer l;
    if ((rc = qd_qlayer_alloc(&l, n, k, fp4 ? 4 : 8, 1, c->group_size, 0, err))) {
        free(sc);
        return rc;
    }
    l.grid = c->grid;
    l.scale_rule = c->scale_rule;
    l.global_scale = gscale;
    l.row_block = c->row_block;
    for (int64_t i = 0; i < n * k; i++) l.q[i] = st_fcode(&r, c->grid);
    for (int64_t g = 0; g < l.n_groups; g++)
        for (int64_t row = 0; row < n; row++) {
            l.scales[g * n + row] = sc[(c->row_block > 0 ? row / c->row_block : 0) * G + g];
            l.zeros[g * n + row] = 0;
        }
    free(sc);
    rc = c->fmt->pack(&l, out, err);
    qd_qlayer_free(&l);
    return rc;
}

int qd_selftest_float_cases(qd_selftest_fcase *out, int cap)
{
    int n = 0;
    for (int v = 0; v < ST_N_FVARIANTS; v++) {
        if (n < cap) out[n] = st_fvariants[v];
        n++;
    }
    for (size_t f = 0; f < qd_format_count(); f++) {
        const qd_format *fmt = qd_format_at(f);
        if (fmt->kernel != QD_FMT_KERNEL_FLOAT) continue;
        for (int v = 0; v < ST_N_FVARIANTS; v++) {
            qd_selftest_fcase c = st_fvariants[v];
            c.fmt = fmt;
            if (!(fmt->bits_mask & (1u << (c.grid == QD_GRID_FP4_E2M1 ? 4 : 8)))) continue;
            /* The format's pack says whether it holds the variant. */
            qd_packed p;
            if (qd_selftest_make_float_layer(&c, 128, 256, 1, &p, NULL) == 0) {
                if (n < cap) out[n] = c;
                n++;
            }
            qd_packed_free(&p);
        }
    }
    return n < cap ? n : cap;
}

int qd_selftest_make_layer(const qd_format *fmt, int bits, int64_t group_size, int act_order,
                           int64_t n, int64_t k, uint64_t seed, qd_packed *out, qd_err *err)
{
    if (!fmt || !out) return qd_err_set(err, QD_EINVAL, "selftest: NULL format or output");
    memset(out, 0, sizeof *out);
    if (fmt->kernel == QD_FMT_KERNEL_FLOAT) {
        qd_selftest_fcase fc[QD_SELFTEST_MAX_FCASES];
        const int nf = qd_selftest_float_cases(fc, QD_SELFTEST_MAX_FCASES);
        const qd_selftest_fcase *pick = NULL;
        for (int i = 0; i < nf; i++) {
            if (fc[i].fmt != fmt || (fc[i].grid == QD_GRID_FP4_E2M1 ? 4 : 8) != bits) continue;
            if (fc[i].group_size == group_size) { pick = &fc[i]; break; }
            if (!pick) pick = &fc[i];
        }
        if (!pick)
            return qd_err_set(err, QD_EUNSUPPORTED, "selftest: format %s packs no %d-bit float layer", fmt->name, bits);
        return qd_selftest_make_float_layer(pick, n, k, seed, out, err);
    }
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
        if (fmt->kernel == QD_FMT_KERNEL_FLOAT) continue;     /* qd_selftest_float_cases */
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

/* All kernel variants on the host weight m for the given batch sizes; label names it in
 * the log ("gptq 4-bit g128 gptq", "by-hand fp8-block128 fp8"). */
static int st_weight(st_ctx *c, const qd_kmat *m, const char *label, const int *batches, int nb, uint64_t seed)
{
    const int64_t n = m->n, k = m->k;
    qd_kmat dev;
    memset(&dev, 0, sizeof dev);
    int rc = 0;
    int64_t maxb = 0;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    float *x = malloc((size_t)(maxb * k) * sizeof *x);
    float *y = malloc((size_t)(maxb * n) * sizeof *y);
    float *ref = malloc((size_t)(maxb * n) * sizeof *ref);
    double *mag = malloc((size_t)(maxb * n) * sizeof *mag);
    float *dx = NULL, *dy = NULL;
    if (!x || !y || !ref || !mag) {
        rc = qd_err_set(c->err, QD_ENOMEM, "selftest: out of memory");
        goto done;
    }
    if (c->be->device >= 0) {
        if ((rc = qd_kmat_upload(c->be, m, &dev, c->err))) goto done;
        dx = qd_backend_alloc(c->be, (size_t)(maxb * k) * sizeof(float));
        dy = dx ? qd_backend_alloc(c->be, (size_t)(maxb * n) * sizeof(float)) : NULL;
        if (!dy) {
            rc = qd_err_set(c->err, QD_ENOMEM, "selftest: %s", c->be->err.msg);
            goto done;
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
            char what[200];
            snprintf(what, sizeof what, "%s %s [%lldx%lld] M=%lld", kv->name, label, (long long)n, (long long)k,
                     (long long)rows);
            st_compare(c, what, &kv->tol, y, ref, mag, rows, n);
        }
    }
done:
    if (c->be->device >= 0) {
        qd_backend_free(c->be, dx);
        qd_backend_free(c->be, dy);
    }
    free(x);
    free(y);
    free(ref);
    free(mag);
    qd_kmat_free(&dev);
    return rc;
}

/* An integer-grid layer of the table (optionally in the exllama layout) through st_weight. */
static int st_layer(st_ctx *c, const qd_format *fmt, int bits, int64_t gs, int act, int reorder,
                    int64_t n, int64_t k, const int *batches, int nb, uint64_t seed)
{
    qd_packed p;
    qd_kmat view, re;
    memset(&re, 0, sizeof re);
    int rc = qd_selftest_make_layer(fmt, bits, gs, act, n, k, seed, &p, c->err);
    if (rc) return rc;
    if ((rc = qd_kmat_from_packed(fmt, &p, &view, c->err))) goto done;
    const qd_kmat *m = &view;
    if (reorder) {
        if ((rc = qd_kmat_reorder(&view, &re, c->err))) goto done;
        m = &re;
    }
    char label[128];
    snprintf(label, sizeof label, "%s %d-bit g%lld %s", fmt->name, bits, (long long)gs, qd_kmat_layout_name(m));
    rc = st_weight(c, m, label, batches, nb, seed);
done:
    qd_kmat_free(&re);
    qd_packed_free(&p);
    return rc;
}

/* A float-grid layer (by hand or packed by its format) through st_weight. */
static int st_float_layer(st_ctx *c, const qd_selftest_fcase *fc, int64_t n, int64_t k, const int *batches, int nb,
                          uint64_t seed)
{
    qd_packed p;
    qd_kmat view;
    int rc = qd_selftest_make_float_layer(fc, n, k, seed, &p, c->err);
    if (!rc) rc = fc->fmt ? qd_kmat_from_packed(fc->fmt, &p, &view, c->err) : qd_kmat_from_float(&p, &view, c->err);
    if (!rc) {
        char label[128];
        snprintf(label, sizeof label, "%s %s %s", fc->fmt ? fc->fmt->name : "by-hand", fc->name,
                 qd_kmat_layout_name(&view));
        rc = st_weight(c, &view, label, batches, nb, seed);
    }
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
    /* The float grids, every case even in quick mode (they are few), on an N that is not a
     * multiple of 8 so that the tiles' and warps' edges are crossed too. */
    qd_selftest_fcase fcases[QD_SELFTEST_MAX_FCASES];
    const int n_fcases = qd_selftest_float_cases(fcases, QD_SELFTEST_MAX_FCASES);
    for (int ci = 0; ci < n_fcases && !rc; ci++) rc = st_float_layer(&c, &fcases[ci], n + 3, k, batches, nb, seed++);
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
