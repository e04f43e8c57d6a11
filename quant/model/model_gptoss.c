/* gpt-oss's experts as its checkpoints store them (transformers 5 save_pretrained and the
 * Hub's BF16 copies alike): per block, mlp.experts.gate_up_proj [E, H, 2 FF] — the input
 * dimension first, as GptOssExperts computes x @ gate_up_proj[e], and the gate and up
 * projections interleaved column by column (gate = [..., ::2], up = [..., 1::2]) —
 * gate_up_proj_bias [E, 2 FF] interleaved the same way, down_proj [E, FF, H] and
 * down_proj_bias [E, H]. quantd's block holds each expert as three nn.Linear-shaped linears
 * [N, K] (gate_proj and up_proj [FF, H], down_proj [H, FF]) with biases, so that its
 * quantizers, hooks and outputs treat them as any MoE's experts: expert e's gate_proj row f
 * is gate_up_proj[e][:, 2f], up_proj's is [:, 2f + 1], down_proj's row h is down_proj[e][:, h].
 * Every value read is scanned for NaN and infinity, named as the fused tensor's element.
 *
 * Granite-4's MoE experts (arch experts_stacked) are the other fused layout this file reads:
 * block_sparse_moe.input_linear.weight [E, 2 FF, H], expert e's slab nn.Linear-shaped with
 * the gate's rows first and the up's after (GraniteMoeHybridExperts chunks the output in
 * two), and output_linear.weight [E, H, FF], down_proj as it is; no biases.
 * Llama 4 (arch experts_fused_halves) stores its experts as gpt-oss does, without biases and
 * with gate_up_proj's gate in columns [0, FF) and up in [FF, 2 FF) (Llama4TextExperts'
 * chunk(2)): gate row f is column f, up's is column FF + f.
 * A quantd output in compressed-tensors holds gpt-oss's experts in vLLM's per-expert
 * w13_* / w2_* layout, which model_gptoss_w13.c reads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/finite.h"
#include "quant/model/model_internal.h"

static const char *const fused_names[8] = {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias",
                                           "gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                           "down_proj_scales"};
enum { F_GU = 0, F_GU_BIAS, F_DOWN, F_DOWN_BIAS, F_GU_BLOCKS, F_GU_SCALES, F_DOWN_BLOCKS, F_DOWN_SCALES };

/* FP4 (e2m1) codes, transformers' FP4_VALUES (integrations/mxfp4.py). */
static const float fp4_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* The name of fused tensor `which` relative to the block (NULL: the layout has none). */
static const char *fused_name(const qd_model *m, int which)
{
    if (!m->arch->experts_stacked) return fused_names[which];
    return which == F_GU ? "input_linear.weight" : which == F_DOWN ? "output_linear.weight" : NULL;
}

static const st_tensor *fused(const qd_model *m, int block, int which)
{
    char name[256];
    const char *rel = fused_name(m, which);
    if (!rel) return NULL;
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    snprintf(name + n, sizeof name - n, "%s%s", m->arch->experts_fused, rel);
    return qd_model_tfind(m, name);
}

int qd_fused_experts_replaced(const qd_model *m, const char *rel)
{
    const char *f = m->arch->experts_fused;
    size_t l = f ? strlen(f) : 0;
    if (!f || strncmp(rel, f, l)) return 0;
    if (m->arch->experts_stacked) return !strcmp(rel + l, fused_name(m, F_GU)) || !strcmp(rel + l, fused_name(m, F_DOWN));
    if (!(rel[l] >= '0' && rel[l] <= '9')) return 1;
    /* A quantd output in vLLM's layout: mlp.experts.N.w13_* and w2_* (model_gptoss_w13.c). */
    const char *dot = strchr(rel + l, '.');
    return dot && (!strncmp(dot + 1, "w13_", 4) || !strncmp(dot + 1, "w2_", 3));
}

/* Granite-4's stacked experts: input_linear [E, 2 FF, H] and output_linear [E, H, FF], float. */
static int check_stacked(const qd_model *m, int block, qd_err *err)
{
    int64_t E = m->cfg.n_experts, H = m->cfg.hidden, F = m->cfg.moe_intermediate;
    for (int i = 0; i < 2; i++) {
        int which = i ? F_DOWN : F_GU;
        const st_tensor *t = fused(m, block, which);
        int64_t want[3] = {E, i ? H : 2 * F, i ? F : H};
        char name[256];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s%s", m->arch->experts_fused, fused_name(m, which));
        if (!t) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
        if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_F16 && t->dtype != QD_DTYPE_BF16)
            return qd_err_set(err, QD_EFORMAT, "tensor '%s': dtype %s is not F32, F16 or BF16", t->name,
                              qd_dtype_name(t->dtype));
        int ok = t->ndim == 3;
        for (int d = 0; ok && d < 3; d++) ok = t->shape[d] == want[d];
        if (!ok)
            return qd_err_set(err, QD_ESHAPE, "tensor '%s': shape does not match [%lld, %lld, %lld] from config.json "
                              "(num_local_experts, then %s)", t->name, (long long)want[0], (long long)want[1],
                              (long long)want[2], i ? "hidden_size, intermediate_size" : "2 intermediate_size, hidden_size");
    }
    return 0;
}

int qd_gptoss_fused_present(const qd_model *m, int block)
{
    return m->arch->experts_fused && (fused(m, block, F_GU) || fused(m, block, F_GU_BLOCKS) ||
                                      qd_gptoss_w13_present(m, block));
}

/* An MXFP4 tensor pair of the block: blocks U8 [E, n, k/32, 16] and scales U8 [E, n, k/32]. */
static int check_mxfp4(const qd_model *m, int block, int which, int64_t n, int64_t k, qd_err *err)
{
    int64_t E = m->cfg.n_experts;
    if (k % 32)
        return qd_err_set(err, QD_ESHAPE, "%s: MXFP4 experts need hidden_size and intermediate_size in multiples of 32 "
                          "(a scale per 32 values), not %lld", m->dir, (long long)k);
    for (int i = 0; i < 2; i++) {
        const st_tensor *t = fused(m, block, which + i);
        char name[256];
        int o = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + o, sizeof name - o, "%s%s", m->arch->experts_fused, fused_names[which + i]);
        if (!t) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
        int64_t want[4] = {E, n, k / 32, 16};
        int ok = t->dtype == QD_DTYPE_U8 && t->ndim == (i ? 3 : 4);
        for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == want[d];
        if (!ok)
            return qd_err_set(err, QD_ESHAPE, "tensor '%s': an MXFP4 %s must be U8 [%lld, %lld, %lld%s] (num_local_experts, "
                              "output features, groups of 32%s)", t->name, i ? "scale tensor" : "block tensor",
                              (long long)E, (long long)n, (long long)(k / 32), i ? "" : ", 16",
                              i ? "" : ", 16 bytes of two FP4 codes");
    }
    return 0;
}

int qd_gptoss_check(const qd_model *m, int block, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t E = c->n_experts, H = c->hidden, F = c->moe_intermediate;
    const int64_t shapes[4][3] = {{E, H, 2 * F}, {E, 2 * F, 0}, {E, F, H}, {E, H, 0}};
    if (m->arch->experts_stacked) return check_stacked(m, block, err);
    if (qd_gptoss_w13_present(m, block)) return qd_gptoss_w13_check(m, block, err);
    int mx = fused(m, block, F_GU_BLOCKS) != NULL;
    if (mx && !c->source_mxfp4)
        return qd_err_set(err, QD_EFORMAT, "%s: block %d holds MXFP4 experts (mlp.experts.*_blocks) but config.json's "
                          "quantization_config is not quant_method \"mxfp4\"", m->dir, block);
    if (mx) {
        int rc = check_mxfp4(m, block, F_GU_BLOCKS, 2 * F, H, err);
        if (!rc) rc = check_mxfp4(m, block, F_DOWN_BLOCKS, H, F, err);
        if (rc) return rc;
    }
    for (int i = 0; i < 4; i++) {
        if (mx && (i == F_GU || i == F_DOWN)) continue;
        if (!m->arch->expert_bias && (i == F_GU_BIAS || i == F_DOWN_BIAS)) continue;
        const st_tensor *t = fused(m, block, i);
        int nd = shapes[i][2] ? 3 : 2;
        char name[256];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s%s", m->arch->experts_fused, fused_names[i]);
        if (!t) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
        if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_F16 && t->dtype != QD_DTYPE_BF16)
            return qd_err_set(err, QD_EFORMAT, "tensor '%s': dtype %s is not F32, F16 or BF16", t->name,
                              qd_dtype_name(t->dtype));
        int ok = t->ndim == nd;
        for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == shapes[i][d];
        if (!ok)
            return qd_err_set(err, QD_ESHAPE, "tensor '%s': shape does not match [%lld, %lld%s%lld] from config.json "
                              "(num_local_experts, then %s)", t->name, (long long)shapes[i][0], (long long)shapes[i][1],
                              nd == 3 ? ", " : "", nd == 3 ? (long long)shapes[i][2] : 0LL,
                              i == 0 ? "hidden_size, 2 intermediate_size" : i == 1 ? "2 intermediate_size"
                              : i == 2 ? "intermediate_size, hidden_size" : "hidden_size");
    }
    return 0;
}

/* Elements [off, off + n) of t as F32 into dst (host); a non-finite one is refused, named as
 * t's element. */
static int read_span(const st_tensor *t, int64_t off, int64_t n, float *dst, qd_err *err)
{
    size_t esz = qd_dtype_size(t->dtype);
    if (qd_convert_to_f32(t->dtype, (const unsigned char *)t->data + (size_t)off * esz, dst, (size_t)n))
        return qd_err_set(err, QD_EFORMAT, "tensor '%s': cannot convert %s to F32", t->name, qd_dtype_name(t->dtype));
    int64_t i = qd_f32_first_nonfinite(dst, n);
    return i < 0 ? 0 : qd_model_refuse_nonfinite(t->name, t->ndim, t->shape, off + i, dst[i], err);
}

/* Expert e's gate (j 0), up (1) or down (2) from MXFP4, as transformers decodes it
 * (_convert_moe_packed_tensors): blocks [E, N, K/32, 16], scales [E, N, K/32]; row r's value
 * k is FP4_VALUES[code] * 2^(scale - 127), code the low nibble of byte k/2 of its group for
 * even k, the high one for odd k. N is gate_up's 2 FF output features interleaved as in
 * gate_up_proj (gate row f is row 2f, up's 2f + 1) or down's H. A scale of 255 (E8M0's NaN)
 * is refused. */
static int load_mxfp4(qd_model *m, int block, int e, int j, float *w, float *b, qd_err *err)
{
    int64_t H = m->cfg.hidden, F = m->cfg.moe_intermediate;
    int64_t N = j < 2 ? 2 * F : H, K = j < 2 ? H : F, rows = j < 2 ? F : H, G = K / 32;
    const st_tensor *tq = fused(m, block, j < 2 ? F_GU_BLOCKS : F_DOWN_BLOCKS);
    const st_tensor *ts = fused(m, block, j < 2 ? F_GU_SCALES : F_DOWN_SCALES);
    const st_tensor *tb = fused(m, block, j < 2 ? F_GU_BIAS : F_DOWN_BIAS);
    if (!tq || !ts || !tb) return qd_err_set(err, QD_ENOTFOUND, "block %d: gpt-oss's MXFP4 expert tensors are missing", block);
    const unsigned char *q = tq->data, *sc = ts->data;
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = j < 2 ? 2 * r + j : r, row = (int64_t)e * N + n;
        for (int64_t g = 0; g < G; g++) {
            unsigned s = sc[row * G + g];
            if (s == 255) {
                int64_t shape[3] = {ts->shape[0], ts->shape[1], ts->shape[2]};
                return qd_model_refuse_nonfinite(ts->name, 3, shape, row * G + g, NAN, err);
            }
            const unsigned char *byte = q + (row * G + g) * 16;
            float *o = w + r * K + g * 32;
            for (int i = 0; i < 16; i++) {
                o[2 * i] = ldexpf(fp4_values[byte[i] & 15], (int)s - 127);
                o[2 * i + 1] = ldexpf(fp4_values[byte[i] >> 4], (int)s - 127);
            }
        }
    }
    float *bias = malloc((size_t)N * sizeof *bias);
    if (!bias) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", tb->name);
    int rc = read_span(tb, (int64_t)e * N, N, bias, err);
    for (int64_t r = 0; !rc && r < rows; r++) b[r] = bias[j < 2 ? 2 * r + j : r];
    free(bias);
    return rc;
}

int qd_gptoss_load_expert(qd_model *m, int block, int li, float *w, float *b, qd_err *err)
{
    const qd_linear_info *L = &m->lin[li];
    int e = L->expert, j = li - m->lin_exp0 - 3 * e;   /* 0 gate, 1 up, 2 down */
    int64_t H = m->cfg.hidden, F = m->cfg.moe_intermediate;
    int biased = m->arch->expert_bias, halves = m->arch->experts_fused_halves;
    if (e < 0 || j < 0 || j > 2) return qd_err_set(err, QD_EINVAL, "%s: not a fused expert linear", L->name);
    if (fused(m, block, F_GU_BLOCKS)) return load_mxfp4(m, block, e, j, w, b, err);
    if (qd_gptoss_w13_present(m, block)) return qd_gptoss_w13_load(m, block, e, j, w, b, err);
    if (m->arch->experts_stacked) {
        /* Granite: gate is rows [0, FF) of expert e's [2 FF, H] slab, up rows [FF, 2 FF); down
         * its [H, FF] slab. */
        const st_tensor *t = fused(m, block, j < 2 ? F_GU : F_DOWN);
        if (!t) return qd_err_set(err, QD_ENOTFOUND, "block %d: the fused expert tensors are missing", block);
        int64_t off = j < 2 ? (int64_t)e * 2 * F * H + j * F * H : (int64_t)e * H * F;
        return read_span(t, off, F * H, w, err);
    }
    const st_tensor *tw = fused(m, block, j < 2 ? F_GU : F_DOWN), *tb = biased ? fused(m, block, j < 2 ? F_GU_BIAS : F_DOWN_BIAS) : NULL;
    if (!tw || (biased && !tb)) return qd_err_set(err, QD_ENOTFOUND, "block %d: the fused expert tensors are missing", block);
    int64_t cols = j < 2 ? 2 * F : H, rows = j < 2 ? H : F;   /* expert e's slab [rows, cols] */
    float *slab = malloc((size_t)(rows * cols) * sizeof *slab), *bias = malloc((size_t)cols * sizeof *bias);
    int rc = slab && bias ? 0 : qd_err_set(err, QD_ENOMEM, "%s: out of memory", tw->name);
    if (!rc) rc = read_span(tw, (int64_t)e * rows * cols, rows * cols, slab, err);
    if (!rc && tb) rc = read_span(tb, (int64_t)e * cols, cols, bias, err);
    if (!rc && j < 2) {
        /* gate (j 0) row f is column 2f of the slab, up's (j 1) column 2f + 1; in halves,
         * columns f and FF + f. */
        for (int64_t f = 0; f < F; f++) {
            int64_t col = halves ? j * F + f : 2 * f + j;
            for (int64_t h = 0; h < H; h++) w[f * H + h] = slab[h * cols + col];
            if (b && tb) b[f] = bias[col];
        }
    } else if (!rc) {
        /* down row h is column h of the [F, H] slab. */
        for (int64_t h = 0; h < H; h++) {
            for (int64_t f = 0; f < F; f++) w[h * F + f] = slab[f * cols + h];
            if (b && tb) b[h] = bias[h];
        }
    }
    free(slab);
    free(bias);
    return rc;
}
