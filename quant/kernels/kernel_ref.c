/* qd_kmat plumbing (views of packed tensors, the exllama reorder, uploads) and the scalar
 * reference dequantizing matmul every faster kernel is tested against. The reference
 * decodes each weight exactly as the format table's dequant_ref does (scale * (q - zero),
 * the scale an F16 widened to F32; on the float grids the minifloat value times the scale,
 * divided by the global scale first under NVFP4's rule) and sums in double, so its own
 * rounding is far below any kernel's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/minifloat.h"
#include "quant/kernels/kernel_internal.h"

/* The float layout's own rules: grid and scale rule as grid.h pairs them, whole groups and
 * scale rows covering K and N. */
static int kmat_validate_float(const qd_kmat *m, qd_err *err)
{
    if (!m->fcodes || !m->fscales) return qd_err_set(err, QD_EINVAL, "kernel: float weight arrays missing");
    if (m->n <= 0 || m->k <= 0 || m->n_groups <= 0 || m->n_scale_rows <= 0)
        return qd_err_set(err, QD_ESHAPE, "kernel: bad float weight shape [%lld, %lld] with %lld x %lld scales",
                          (long long)m->n, (long long)m->k, (long long)m->n_scale_rows, (long long)m->n_groups);
    if (m->grid == QD_GRID_FP8_E4M3) {
        if (m->bits != 8 || m->scale_rule != QD_SCALE_F32)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel: fp8_e4m3 weights are 8-bit with F32 scales "
                              "(got %d bits, scale rule %d)", m->bits, (int)m->scale_rule);
    } else if (m->grid == QD_GRID_FP4_E2M1) {
        if (m->bits != 4 || (m->scale_rule != QD_SCALE_FP8_GLOBAL && m->scale_rule != QD_SCALE_E8M0))
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel: fp4_e2m1 weights are 4-bit with FP8 (global) or E8M0 "
                              "scales (got %d bits, scale rule %d)", m->bits, (int)m->scale_rule);
        if (m->k % 2)
            return qd_err_set(err, QD_ESHAPE, "kernel: fp4 weight K %lld is odd (two codes a byte)", (long long)m->k);
    } else {
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel: float layout with grid %d (%s)", (int)m->grid,
                          qd_grid_name(m->grid));
    }
    if (m->scale_rule == QD_SCALE_FP8_GLOBAL && !(m->global_scale > 0.0f && isfinite(m->global_scale)))
        return qd_err_set(err, QD_EINVAL, "kernel: nvfp4 global scale %g must be positive and finite",
                          (double)m->global_scale);
    if (m->group_size > 0 ? m->group_size * m->n_groups < m->k : (m->group_size != -1 || m->n_groups != 1))
        return qd_err_set(err, QD_ESHAPE, "kernel: %lld groups of %lld do not cover K %lld", (long long)m->n_groups,
                          (long long)m->group_size, (long long)m->k);
    if (m->row_block > 0 ? m->row_block * m->n_scale_rows < m->n : (m->row_block != -1 || m->n_scale_rows != 1))
        return qd_err_set(err, QD_ESHAPE, "kernel: %lld scale rows of %lld do not cover N %lld",
                          (long long)m->n_scale_rows, (long long)m->row_block, (long long)m->n);
    return 0;
}

int kmat_validate(const qd_kmat *m, qd_err *err)
{
    if (m && m->layout == QD_KMAT_FLOAT) return kmat_validate_float(m, err);
    if (!m || !m->qweight || !m->qzeros || !m->scales)
        return qd_err_set(err, QD_EINVAL, "kernel: packed weight arrays missing");
    if (m->n <= 0 || m->k <= 0 || m->n_groups <= 0)
        return qd_err_set(err, QD_ESHAPE, "kernel: bad weight shape [%lld, %lld] with %lld groups",
                          (long long)m->n, (long long)m->k, (long long)m->n_groups);
    if (m->layout == QD_KMAT_AWQ) {
        if (m->bits != 4 || m->n % 8)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel: awq weight must be 4-bit with N %% 8 == 0 "
                              "(got %d bits, N %lld)", m->bits, (long long)m->n);
    } else {
        if (m->bits != 2 && m->bits != 3 && m->bits != 4 && m->bits != 8)
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel: %d-bit gptq weights are not supported", m->bits);
        if (m->k % 32 || m->n % 32)
            return qd_err_set(err, QD_ESHAPE, "kernel: gptq weight [%lld, %lld] is not a multiple of 32",
                              (long long)m->n, (long long)m->k);
        if (m->act_order && !m->g_idx)
            return qd_err_set(err, QD_EINVAL, "kernel: act-order weight without g_idx");
        if (m->layout == QD_KMAT_GPTQ_REORDERED && (!m->perm || m->group_size <= 0))
            return qd_err_set(err, QD_EINVAL, "kernel: reordered weight without perm or group size");
    }
    if (m->group_size > 0 && m->layout != QD_KMAT_GPTQ && m->k > m->group_size * m->n_groups)
        return qd_err_set(err, QD_ESHAPE, "kernel: K %lld exceeds %lld groups of %lld", (long long)m->k,
                          (long long)m->n_groups, (long long)m->group_size);
    return 0;
}

int qd_kmat_from_packed(const qd_format *fmt, const qd_packed *p, qd_kmat *out, qd_err *err)
{
    if (!fmt || !p || !out) return qd_err_set(err, QD_EINVAL, "kernel: NULL format, tensors or output");
    memset(out, 0, sizeof *out);
    out->bits = p->bits;
    out->n = p->n;
    out->k = p->k;
    out->group_size = p->group_size;
    out->n_groups = p->n_groups;
    out->zero_offset = fmt->zero_offset;
    out->qweight = p->qweight;
    out->qzeros = p->qzeros;
    out->scales = p->scales;
    /* The descriptor says which in-memory layout its packed layers use. */
    if (fmt->kernel == QD_FMT_KERNEL_AWQ) {
        out->layout = QD_KMAT_AWQ;
    } else if (fmt->kernel == QD_FMT_KERNEL_GPTQ) {
        out->layout = QD_KMAT_GPTQ;
        if (p->g_idx) {
            if (p->g_idx_len != p->k)
                return qd_err_set(err, QD_ESHAPE, "kernel: %s g_idx has %lld entries, expected %lld",
                                  fmt->name, (long long)p->g_idx_len, (long long)p->k);
            for (int64_t i = 0; i < p->k; i++) {
                int32_t want = p->group_size > 0 ? (int32_t)(i / p->group_size) : 0;
                if (p->g_idx[i] < 0 || p->g_idx[i] >= p->n_groups)
                    return qd_err_set(err, QD_EFORMAT, "kernel: %s g_idx[%lld] = %d is outside [0, %lld)",
                                      fmt->name, (long long)i, p->g_idx[i], (long long)p->n_groups);
                if (p->g_idx[i] != want) out->act_order = 1;
            }
            if (out->act_order) out->g_idx = p->g_idx;
        }
    } else if (fmt->kernel == QD_FMT_KERNEL_FLOAT) {
        return qd_kmat_from_float(p, out, err);
    } else {
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel: no kernel reads format '%s'", fmt->name);
    }
    return kmat_validate(out, err);
}

int qd_kmat_from_float(const qd_packed *p, qd_kmat *out, qd_err *err)
{
    if (!p || !out) return qd_err_set(err, QD_EINVAL, "kernel: NULL tensors or output");
    memset(out, 0, sizeof *out);
    out->layout = QD_KMAT_FLOAT;
    out->bits = p->grid == QD_GRID_FP4_E2M1 ? 4 : p->grid == QD_GRID_FP8_E4M3 ? 8 : p->bits;
    out->n = p->n;
    out->k = p->k;
    out->group_size = p->group_size;
    out->n_groups = p->fscales_shape[1];
    out->n_scale_rows = p->fscales_shape[0];
    out->grid = p->grid;
    out->scale_rule = p->scale_rule;
    out->global_scale = p->global_scale;
    out->row_block = p->row_block ? p->row_block : 1;      /* qlayer's 0 means 1 */
    out->fcodes = p->fcodes;
    out->fscales = p->fscales;
    int rc = kmat_validate(out, err);
    if (rc) return rc;
    /* The arrays must be exactly what the rule reads: a mismatch is a packing error. */
    const int64_t cols = out->grid == QD_GRID_FP4_E2M1 ? p->k / 2 : p->k;
    if (p->bits != out->bits)
        return qd_err_set(err, QD_EFORMAT, "kernel: %s weight says %d bits", qd_grid_name(p->grid), p->bits);
    if (p->fcodes_shape[0] != p->n || p->fcodes_shape[1] != cols)
        return qd_err_set(err, QD_ESHAPE, "kernel: %s codes are [%lld, %lld], expected [%lld, %lld]",
                          qd_grid_name(p->grid), (long long)p->fcodes_shape[0], (long long)p->fcodes_shape[1],
                          (long long)p->n, (long long)cols);
    const int64_t G = p->group_size > 0 ? (p->k + p->group_size - 1) / p->group_size : 1;
    const int64_t R = out->row_block > 0 ? (p->n + out->row_block - 1) / out->row_block : 1;
    if (out->n_groups != G || out->n_scale_rows != R || (p->n_groups && p->n_groups != G))
        return qd_err_set(err, QD_ESHAPE, "kernel: %s scales are [%lld, %lld] (n_groups %lld), expected [%lld, %lld]",
                          qd_grid_name(p->grid), (long long)out->n_scale_rows, (long long)out->n_groups,
                          (long long)p->n_groups, (long long)R, (long long)G);
    return 0;
}

/* Stable order of K rows by group: perm[i] = the i-th feature in (group, k) order. */
static int kmat_sort_by_group(const qd_kmat *m, int32_t *perm, qd_err *err)
{
    const int64_t G = m->n_groups, gs = m->group_size;
    int64_t *fill = calloc((size_t)G, sizeof *fill);
    if (!fill) return qd_err_set(err, QD_ENOMEM, "kernel reorder: out of memory");
    for (int64_t i = 0; i < m->k; i++) fill[kmat_group(m, i)]++;
    for (int64_t g = 0; g < G; g++)
        if (fill[g] != gs) {
            int64_t have = fill[g];
            free(fill);
            return qd_err_set(err, QD_EUNSUPPORTED, "kernel reorder: group %lld holds %lld features, "
                              "not group_size %lld (the reordered layout needs equal groups)",
                              (long long)g, (long long)have, (long long)gs);
        }
    for (int64_t g = 0; g < G; g++) fill[g] = g * gs;
    for (int64_t i = 0; i < m->k; i++) perm[fill[kmat_group(m, i)]++] = (int32_t)i;
    free(fill);
    return 0;
}

int qd_kmat_reorder(const qd_kmat *src, qd_kmat *out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "kernel reorder: NULL output");
    memset(out, 0, sizeof *out);
    int rc = kmat_validate(src, err);
    if (rc) return rc;
    if (src->layout != QD_KMAT_GPTQ || src->group_size <= 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "kernel reorder: only grouped gptq weights can be reordered");
    const int b = src->bits;
    const int64_t n = src->n, k = src->k, G = src->n_groups, nw = n * b / 32;
    int32_t *perm = malloc((size_t)k * sizeof *perm);
    int32_t *qw = malloc((size_t)(k * b / 32 * n) * sizeof *qw);
    int32_t *qz = malloc((size_t)(G * nw) * sizeof *qz);
    uint16_t *sc = malloc((size_t)(G * n) * sizeof *sc);
    int32_t *col = malloc((size_t)k * sizeof *col);
    if (!perm || !qw || !qz || !sc || !col) {
        rc = qd_err_set(err, QD_ENOMEM, "kernel reorder: out of memory for [%lld, %lld]", (long long)n,
                        (long long)k);
        goto fail;
    }
    if ((rc = kmat_sort_by_group(src, perm, err))) goto fail;
    /* Repack each column with its K values in the new row order. */
    for (int64_t c = 0; c < n; c++) {
        for (int64_t i = 0; i < k; i++) col[i] = qd_bits_get(b, src->qweight + c, n, perm[i]);
        qd_pack_bits(b, col, k, 1, qw + c, n);
    }
    memcpy(qz, src->qzeros, (size_t)(G * nw) * sizeof *qz);
    memcpy(sc, src->scales, (size_t)(G * n) * sizeof *sc);
    free(col);
    *out = *src;
    out->layout = QD_KMAT_GPTQ_REORDERED;
    out->act_order = 0;
    out->g_idx = NULL;
    out->qweight = qw;
    out->qzeros = qz;
    out->scales = sc;
    out->perm = perm;
    out->owns_host = 1;
    out->owner = NULL;
    return 0;
fail:
    free(perm);
    free(qw);
    free(qz);
    free(sc);
    free(col);
    return rc;
}

/* Bytes of a float weight's codes and scales. */
static int64_t kmat_fcodes_bytes(const qd_kmat *m)
{
    return m->grid == QD_GRID_FP4_E2M1 ? m->n * (m->k / 2) : m->n * m->k;
}
static int64_t kmat_fscales_bytes(const qd_kmat *m) { return m->n_scale_rows * m->n_groups * 4; }

static int64_t kmat_qweight_words(const qd_kmat *m)
{
    return m->layout == QD_KMAT_AWQ ? m->k * (m->n / 8) : m->k * m->bits / 32 * m->n;
}

static int64_t kmat_qzeros_words(const qd_kmat *m)
{
    return m->layout == QD_KMAT_AWQ ? m->n_groups * (m->n / 8) : m->n_groups * (m->n * m->bits / 32);
}

int64_t qd_kmat_bytes(const qd_kmat *m)
{
    if (m->layout == QD_KMAT_FLOAT) return kmat_fcodes_bytes(m) + kmat_fscales_bytes(m);
    int64_t b = (kmat_qweight_words(m) + kmat_qzeros_words(m)) * 4 + m->n_groups * m->n * 2;
    if (m->g_idx) b += m->k * 4;
    if (m->perm) b += m->k * 4;
    return b;
}

const char *qd_kmat_layout_name(const qd_kmat *m)
{
    if (m->layout == QD_KMAT_AWQ) return "awq";
    if (m->layout == QD_KMAT_FLOAT)
        return m->grid == QD_GRID_FP8_E4M3 ? "fp8" : m->scale_rule == QD_SCALE_E8M0 ? "mxfp4" : "nvfp4";
    if (m->layout == QD_KMAT_GPTQ_REORDERED) return "gptq-reordered";
    return m->act_order ? "gptq-actorder" : "gptq";
}

/* Allocates dev->field in be and uploads `bytes` from src. */
static int kmat_put(qd_backend *be, const void *src, size_t bytes, const void **field, qd_err *err)
{
    *field = NULL;
    if (!src) return 0;
    void *d = qd_backend_alloc(be, bytes);
    if (!d) return qd_err_set(err, QD_ENOMEM, "kernel upload: %s", be->err.msg);
    *field = d;
    if (qd_backend_upload(be, d, src, bytes))
        return qd_err_set(err, QD_EBACKEND, "kernel upload: %s", be->err.msg);
    return 0;
}

int qd_kmat_upload(qd_backend *be, const qd_kmat *host, qd_kmat *dev, qd_err *err)
{
    if (!be || !dev) return qd_err_set(err, QD_EINVAL, "kernel upload: NULL backend or output");
    memset(dev, 0, sizeof *dev);
    int rc = kmat_validate(host, err);
    if (rc) return rc;
    *dev = *host;
    dev->qweight = dev->qzeros = dev->g_idx = dev->perm = NULL;
    dev->scales = NULL;
    dev->fcodes = NULL;
    dev->fscales = NULL;
    dev->owns_host = 0;
    dev->owner = be;
    if (host->layout == QD_KMAT_FLOAT) {
        const void *fc = NULL, *fs = NULL;
        if (!(rc = kmat_put(be, host->fcodes, (size_t)kmat_fcodes_bytes(host), &fc, err)))
            rc = kmat_put(be, host->fscales, (size_t)kmat_fscales_bytes(host), &fs, err);
        dev->fcodes = fc;
        dev->fscales = fs;
        if (rc) qd_kmat_free(dev);
        return rc;
    }
    const void *p[5] = {0};
    if (!(rc = kmat_put(be, host->qweight, (size_t)kmat_qweight_words(host) * 4, &p[0], err)) &&
        !(rc = kmat_put(be, host->qzeros, (size_t)kmat_qzeros_words(host) * 4, &p[1], err)) &&
        !(rc = kmat_put(be, host->scales, (size_t)(host->n_groups * host->n) * 2, &p[2], err)) &&
        !(rc = kmat_put(be, host->act_order ? host->g_idx : NULL, (size_t)host->k * 4, &p[3], err)))
        rc = kmat_put(be, host->layout == QD_KMAT_GPTQ_REORDERED ? host->perm : NULL, (size_t)host->k * 4,
                      &p[4], err);
    dev->qweight = p[0];
    dev->qzeros = p[1];
    dev->scales = p[2];
    dev->g_idx = p[3];
    dev->perm = p[4];
    if (rc) qd_kmat_free(dev);
    return rc;
}

void qd_kmat_free(qd_kmat *m)
{
    if (!m) return;
    const void *arr[7] = {m->qweight, m->qzeros, m->scales, m->g_idx, m->perm, m->fcodes, m->fscales};
    for (int i = 0; i < 7; i++) {
        if (m->owner) qd_backend_free(m->owner, (void *)arr[i]);
        else if (m->owns_host) free((void *)arr[i]);
    }
    memset(m, 0, sizeof *m);
}

/* Row c of a float weight, W[c][0..K), by the rule itself with the minifloat decoders of
 * quant/core (not kdecode.h's, which the kernels run and which are tested against these):
 * value(code) * s, where s is the stored scale divided by the global scale (F32) first
 * under NVFP4's rule, as qd_quant_dequant_cfg computes it. */
static void kref_float_row(const qd_kmat *m, int64_t c, float *w)
{
    const int64_t k = m->k, G = m->n_groups;
    const int64_t r = m->row_block > 0 ? c / m->row_block : 0;
    for (int64_t i = 0; i < k; i++) {
        float s = m->fscales[r * G + (m->group_size > 0 ? i / m->group_size : 0)];
        if (m->scale_rule == QD_SCALE_FP8_GLOBAL) s = s / m->global_scale;
        if (m->grid == QD_GRID_FP4_E2M1) {
            const uint8_t byte = m->fcodes[c * (k / 2) + i / 2];
            w[i] = qd_fp4_e2m1_to_f32((uint8_t)(i & 1 ? byte >> 4 : byte & 15)) * s;
        } else {
            w[i] = qd_fp8_e4m3_to_f32(m->fcodes[c * k + i]) * s;
        }
    }
}

int qd_kernel_matmul_ref(const qd_kmat *m, const float *x, int64_t rows, float *y, double *mag,
                         qd_err *err)
{
    int rc = kmat_validate(m, err);
    if (rc) return rc;
    if (rows < 0 || (rows > 0 && (!x || !y)))
        return qd_err_set(err, QD_EINVAL, "kernel ref: bad input (rows %lld)", (long long)rows);
    const int64_t n = m->n, k = m->k;
    float *wcol = malloc((size_t)k * sizeof *wcol);
    int64_t *feat = malloc((size_t)k * sizeof *feat);
    if (!wcol || !feat) {
        free(wcol);
        free(feat);
        return qd_err_set(err, QD_ENOMEM, "kernel ref: out of memory");
    }
    const int fl = m->layout == QD_KMAT_FLOAT;
    for (int64_t i = 0; i < k; i++) feat[i] = fl ? i : kmat_feature(m, i);
    for (int64_t c = 0; c < n; c++) {
        if (fl) kref_float_row(m, c, wcol);
        else
            for (int64_t i = 0; i < k; i++) {
                int64_t g = kmat_group(m, i);
                float s = qd_f16_to_f32(m->scales[g * n + c]);
                wcol[i] = s * (float)(kmat_code(m, i, c) - kmat_zero(m, g, c));
            }
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * k;
            double acc = 0.0, a = 0.0;
            for (int64_t i = 0; i < k; i++) {
                double t = (double)xr[feat[i]] * (double)wcol[i];
                acc += t;
                a += fabs(t);
            }
            y[r * n + c] = (float)acc;
            if (mag) mag[r * n + c] = a;
        }
    }
    free(wcol);
    free(feat);
    return 0;
}
