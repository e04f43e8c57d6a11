/* Reading FP8-block source checkpoints (model_fp8.h; config.json quant_method "fp8"): the
 * checks of a linear's weight_scale_inv at open (present, F32 or BF16, exactly
 * [ceil(N/bn), ceil(K/bk)]), and the dequantization of the linear into the block's F32
 * weight when the block is loaded, on the backend's CPU threads straight from the mapped
 * file: no BF16 copy of the model is made, on disk or in memory.
 *
 * A scale that is not finite is refused naming the scale tensor and its element; a weight
 * code that is NaN (E4M3 has 0x7f and 0xff) is refused naming the weight and its element.
 * Zero and negative scales are read as they are: quantizers derive the scale from a block's
 * largest magnitude, so no real checkpoint is expected to hold a negative one, but an
 * all-zero block may well carry a zero scale, and refusing either would only guess. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/finite.h"
#include "quant/core/minifloat.h"
#include "quant/core/parallel.h"
#include "quant/model/model_fp8.h"
#include "quant/model/model_internal.h"

void qd_fp8_block_dequant(const uint8_t *codes, int64_t n, int64_t k, const float *scales, int64_t bn, int64_t bk,
                          int64_t r0, int64_t r1, float *out)
{
    float lut[256];
    for (int b = 0; b < 256; b++) lut[b] = qd_fp8_e4m3_to_f32((uint8_t)b);
    int64_t sk = (k + bk - 1) / bk;
    if (r1 > n) r1 = n;
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *c = codes + i * k;
        const float *s = scales + (i / bn) * sk;
        float *o = out + i * k;
        for (int64_t j0 = 0; j0 < k; j0 += bk) {
            int64_t j1 = j0 + bk < k ? j0 + bk : k;
            float sc = s[j0 / bk];
            for (int64_t j = j0; j < j1; j++) o[j] = lut[c[j]] * sc;
        }
    }
}

/* "<base>.weight_scale_inv" beside canonical "<base>.weight". */
static int scale_name(const char *weight_canonical, char *out, size_t cap)
{
    size_t l = strlen(weight_canonical);
    if (l < 6 || strcmp(weight_canonical + l - 6, "weight")) return -1;
    int n = snprintf(out, cap, "%.*s%s", (int)(l - 6), weight_canonical, QD_FP8_SCALE_SUFFIX);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int qd_fp8_check(const qd_model *m, const char *weight_canonical, const st_tensor *w, int64_t n, int64_t k,
                 const st_tensor **scale, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    if (w->dtype != QD_DTYPE_F8_E4M3 || w->ndim != 2 || w->shape[0] != n || w->shape[1] != k)
        return qd_err_set(err, QD_ESHAPE, "tensor '%s': an FP8 linear must be F8_E4M3 [%lld, %lld] from config.json "
                          "(got %s with %d dims)", w->name, (long long)n, (long long)k, qd_dtype_name(w->dtype), w->ndim);
    char sname[600];
    if (scale_name(weight_canonical, sname, sizeof sname))
        return qd_err_set(err, QD_EINVAL, "tensor '%s': not a linear's weight", w->name);
    const st_tensor *s = qd_model_tfind(m, sname);
    const char *stored = qd_model_tname(m, sname);
    if (!s)
        return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing: the F8_E4M3 weight '%s' needs its block "
                          "scales (quantization_config quant_method \"fp8\")", m->dir, stored, w->name);
    if (s->dtype != QD_DTYPE_F32 && s->dtype != QD_DTYPE_BF16)
        return qd_err_set(err, QD_EFORMAT, "tensor '%s': dtype %s is not F32 or BF16", s->name, qd_dtype_name(s->dtype));
    int64_t sn = (n + c->fp8_block_n - 1) / c->fp8_block_n, sk = (k + c->fp8_block_k - 1) / c->fp8_block_k;
    if (s->ndim != 2 || s->shape[0] != sn || s->shape[1] != sk) {
        char got[96] = "";
        for (int i = 0; i < s->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)s->shape[i]);
        return qd_err_set(err, QD_ESHAPE, "tensor '%s': shape [%s] does not match [%lld, %lld]: weight [%lld, %lld] in "
                          "blocks of [%lld, %lld] (quantization_config.weight_block_size)", s->name, got, (long long)sn,
                          (long long)sk, (long long)n, (long long)k, (long long)c->fp8_block_n, (long long)c->fp8_block_k);
    }
    *scale = s;
    return 0;
}

typedef struct fp8_job {
    const uint8_t *codes;
    const float *scales;
    int64_t n, k, bn, bk;
    float *out;
} fp8_job;

static void fp8_range(void *ctx, int th, int64_t lo, int64_t hi)
{
    (void)th;
    fp8_job *j = ctx;
    qd_fp8_block_dequant(j->codes, j->n, j->k, j->scales, j->bn, j->bk, lo, hi, j->out);
}

int qd_fp8_load(qd_model *m, const char *weight_canonical, const st_tensor *w, int64_t n, int64_t k, float *dst,
                qd_err *err)
{
    const st_tensor *s = NULL;
    int rc = qd_fp8_check(m, weight_canonical, w, n, k, &s, err);
    if (rc) return rc;
    if (!w->data || !s->data) return qd_err_set(err, QD_EINVAL, "tensor '%s': no data mapped", w->name);
    float *sc = malloc((s->numel ? s->numel : 1) * sizeof *sc);
    if (!sc) return qd_err_set(err, QD_ENOMEM, "tensor '%s': out of memory", s->name);
    if ((rc = st_tensor_read_f32(s, sc, err))) { free(sc); return rc; }
    int64_t bad = qd_f32_first_nonfinite(sc, (int64_t)s->numel);
    if (bad >= 0) {
        rc = qd_model_refuse_nonfinite(s->name, s->ndim, s->shape, bad, sc[bad], err);
        free(sc);
        return rc;
    }
    fp8_job j = {w->data, sc, n, k, m->cfg.fp8_block_n, m->cfg.fp8_block_k, dst};
    /* Rows in multiples of the block height, so a thread's rows share their scale rows. */
    int64_t grain = m->cfg.fp8_block_n;
    while (grain * k < (1 << 16) && grain < n) grain *= 2;
    qd_parallel_for(m->be->n_threads > 0 ? m->be->n_threads : 1, n, grain, fp8_range, &j);
    free(sc);
    /* A NaN code (E4M3's 0x7f and 0xff) dequantizes to NaN. */
    int64_t i = qd_f32_first_nonfinite(dst, n * k), shape[2] = {n, k};
    if (i >= 0) {
        char name[600];
        snprintf(name, sizeof name, "%s (FP8, dequantized)", w->name);
        return qd_model_refuse_nonfinite(name, 2, shape, i, dst[i], err);
    }
    /* Decoded: the mapped pages need not stay resident (the page cache keeps the bytes). */
    st_tensor_release(w);
    return 0;
}
