/* gpt-oss's experts read back from a quantd output in vLLM's layout (written by
 * quant/pipeline/output_experts.c, compressed-tensors pack-quantized): per expert N of a
 * block, mlp.experts.N.w13_weight_packed [2 FF, H b/32] and w13_weight_scale [2 FF, G] with
 * the gate's row f at 2f and the up projection's at 2f + 1, w13_bias [2 FF] interleaved the
 * same way, and w2_weight_packed, w2_weight_scale, w2_bias as down_proj's. No weight_shape
 * is stored (vLLM's loader cannot take one). Each of the block's gate, up and down linears is
 * read through the format's own read() on a view that gives it its rows under its usual
 * suffixes (weight_packed, weight_scale, and the shape it has), so the decode is the one
 * every compressed-tensors linear goes through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/finite.h"
#include "quant/model/model_internal.h"

static const st_tensor *expert_tensor(const qd_model *m, int block, int e, const char *rel)
{
    char name[320];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    snprintf(name + n, sizeof name - n, "%s%d.%s", m->arch->experts_fused, e, rel);
    return qd_model_tfind(m, name);
}

int qd_gptoss_w13_present(const qd_model *m, int block)
{
    return m->arch->experts_fused && !m->arch->experts_stacked && expert_tensor(m, block, 0, "w13_weight_packed");
}

int qd_gptoss_w13_check(const qd_model *m, int block, qd_err *err)
{
    static const char *const names[6] = {"w13_weight_packed", "w13_weight_scale", "w2_weight_packed", "w2_weight_scale",
                                         "w13_bias", "w2_bias"};
    int64_t F = m->cfg.moe_intermediate, H = m->cfg.hidden;
    for (int e = 0; e < m->cfg.n_experts; e++) {
        for (int i = 0; i < (m->arch->expert_bias ? 6 : 4); i++) {
            const st_tensor *t = expert_tensor(m, block, e, names[i]);
            char name[320];
            int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
            snprintf(name + n, sizeof name - n, "%s%d.%s", m->arch->experts_fused, e, names[i]);
            if (!t) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
            /* Rows: 2 FF for w13 (gate and up interleaved), H for w2; the packed widths and
             * the groups are read() checks. */
            int64_t rows = i == 0 || i == 1 || i == 4 ? 2 * F : H;
            int ok = t->ndim == (i < 4 ? 2 : 1) && t->shape[0] == rows;
            if (i >= 4) ok = ok && (t->dtype == QD_DTYPE_F32 || t->dtype == QD_DTYPE_F16 || t->dtype == QD_DTYPE_BF16);
            if (!ok)
                return qd_err_set(err, QD_ESHAPE, "tensor '%s': expected %s with %lld rows (%s from config.json)", t->name,
                                  i < 4 ? "a 2-D tensor" : "a float vector", (long long)rows,
                                  rows == H ? "hidden_size" : "2 intermediate_size");
        }
    }
    return 0;
}

/* The view read() sees: expert e's linear j (0 gate, 1 up, 2 down). */
typedef struct w13_view {
    const qd_model *m;
    int block, e, j;
    int64_t n, k;
    int64_t shape[2];     /* weight_shape's value, [n, k] */
    void *rows[2];        /* gate's or up's rows of weight_packed and weight_scale, owned */
} w13_view;

static int w13_find(void *ud, const char *suffix, qd_fmt_tensor *out)
{
    w13_view *v = ud;
    if (!strcmp(suffix, "weight_shape")) {
        memset(out, 0, sizeof *out);
        snprintf(out->suffix, sizeof out->suffix, "%s", suffix);
        out->dtype = QD_DTYPE_I64;
        out->ndim = 1;
        out->shape[0] = 2;
        out->data = v->shape;
        return 1;
    }
    int s = !strcmp(suffix, "weight_packed") ? 0 : !strcmp(suffix, "weight_scale") ? 1 : -1;
    if (s < 0) return 0;   /* zero points, g_idx: this layout has none */
    char rel[48];
    snprintf(rel, sizeof rel, "%s_%s", v->j < 2 ? "w13" : "w2", suffix);
    const st_tensor *t = expert_tensor(v->m, v->block, v->e, rel);
    if (!t) return 0;
    qd_fmt_tensor_view(t, suffix, out);
    if (v->j == 2 || t->ndim != 2 || t->shape[0] != 2 * v->n) return 1;   /* read() checks the shape */
    /* gate's rows are w13's even rows, up's the odd ones. */
    size_t row = qd_dtype_size(t->dtype) * (size_t)t->shape[1];
    unsigned char *dst = malloc((size_t)v->n * row + 1);
    if (!dst) return 0;
    for (int64_t r = 0; r < v->n; r++) memcpy(dst + r * row, (const unsigned char *)t->data + (2 * r + v->j) * row, row);
    free(v->rows[s]);
    v->rows[s] = dst;
    out->shape[0] = v->n;
    out->data = dst;
    return 1;
}

int qd_gptoss_w13_load(qd_model *m, int block, int e, int j, float *w, float *b, qd_err *err)
{
    int64_t F = m->cfg.moe_intermediate, H = m->cfg.hidden;
    w13_view v = {.m = m, .block = block, .e = e, .j = j, .n = j < 2 ? F : H, .k = j < 2 ? H : F};
    v.shape[0] = v.n;
    v.shape[1] = v.k;
    char base[320];
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    int o = snprintf(base, sizeof base, m->arch->block_fmt, block);
    snprintf(base + o, sizeof base - o, "%s%d.%s (in %s%d.%s)", m->arch->experts_fused, e, proj[j], m->arch->experts_fused,
             e, j < 2 ? "w13" : "w2");
    int rc = qd_model_load_packed_find(m, w13_find, &v, base, v.n, v.k, w, err);
    free(v.rows[0]);
    free(v.rows[1]);
    if (rc || !b || !m->arch->expert_bias) return rc;
    const st_tensor *t = expert_tensor(m, block, e, j < 2 ? "w13_bias" : "w2_bias");
    int64_t len = j < 2 ? 2 * F : H;
    float *all = malloc((size_t)len * sizeof *all);
    if (!t || !all) {
        free(all);
        return qd_err_set(err, t ? QD_ENOMEM : QD_ENOTFOUND, "block %d expert %d: its %s bias is %s", block, e,
                          j < 2 ? "w13" : "w2", t ? "out of memory" : "missing");
    }
    rc = st_tensor_read_f32(t, all, err);
    int64_t bad = rc ? -1 : qd_f32_first_nonfinite(all, len);
    if (bad >= 0) rc = qd_model_refuse_nonfinite(t->name, 1, &len, bad, all[bad], err);
    for (int64_t r = 0; !rc && r < v.n; r++) b[r] = all[j < 2 ? 2 * r + j : r];
    free(all);
    return rc;
}
