/* The recurrent mixers of the hybrids, one module beside attention: a layer whose
 * layer_mixer is not QD_MIXER_ATTENTION runs one of these in place of attention, between the
 * same norm and residual add (model_forward.c), with the same hooks on its two linears.
 *
 *   LFM2's short convolution (Lfm2ShortConv): in_proj → B, C, x (thirds of its output);
 *     y = C * conv(B * x), a causal depthwise convolution of conv_L_cache taps; out_proj.
 *   Mamba-2 (GraniteMoeHybridMambaLayer, transformers' torch path): in_proj → z, xBC, dt;
 *     xBC = silu(conv(xBC)); the selective scan over x with B, C, dt, A = -exp(A_log), D and
 *     dt_bias (backend op ssd_scan, which also gates by silu(z)); the gated RMSNorm over
 *     n_groups groups of channels times its weight; out_proj. Falcon-H1's (FalconH1Mixer) is
 *     the same with its muP vector on in_proj's output (ssm_multipliers over z, x, B, C, dt)
 *     and, without mamba_rms_norm, no gated norm (y * silu(z) feeds out_proj).
 *
 * Their float parameters (conv1d weight and bias, A_log, D, dt_bias, the gated norm's
 * weight) stay in float, as vLLM keeps them: only in_proj and out_proj are quantized
 * linears. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

#define BE_CALL(m, err, call) do { int _rc = (call); \
    if (_rc) return qd_err_set((err), _rc, "%s: %s", #call, (m)->be->err.msg); } while (0)

enum { MIX_CONV_W = 0, MIX_CONV_B, MIX_A, MIX_D, MIX_DT_BIAS, MIX_NORM, MIX_MUP };

/* The parameters of a layer of kind `mixer`: names (relative to the block) and shapes. The
 * convolution weight is stored as Conv1d's [ch, 1, kernel]. Returns how many; NULL name:
 * absent (no bias). */
typedef struct mix_param { const char *name; int ndim; int64_t shape[3]; } mix_param;

static int mixer_params(const qd_model *m, int mixer, mix_param *p)
{
    const qd_mixer_config *x = &m->cfg.mixer;
    int64_t K = x->conv_kernel;
    memset(p, 0, sizeof(mix_param) * QD_MIXER_PARAMS);
    if (mixer == QD_MIXER_SHORT_CONV) {
        int64_t H = m->cfg.hidden;
        p[MIX_CONV_W] = (mix_param){"conv.conv.weight", 3, {H, 1, K}};
        if (x->conv_bias) p[MIX_CONV_B] = (mix_param){"conv.conv.bias", 1, {H}};
        return 2;
    }
    int64_t inner = x->ssm_heads * x->ssm_head_dim, conv_dim = inner + 2 * x->ssm_groups * x->ssm_state;
    p[MIX_CONV_W] = (mix_param){"mamba.conv1d.weight", 3, {conv_dim, 1, K}};
    if (x->conv_bias) p[MIX_CONV_B] = (mix_param){"mamba.conv1d.bias", 1, {conv_dim}};
    p[MIX_A] = (mix_param){"mamba.A_log", 1, {x->ssm_heads}};
    p[MIX_D] = (mix_param){"mamba.D", 1, {x->ssm_heads}};
    p[MIX_DT_BIAS] = (mix_param){"mamba.dt_bias", 1, {x->ssm_heads}};
    if (!x->no_norm) p[MIX_NORM] = (mix_param){"mamba.norm.weight", 1, {inner}};
    return MIX_NORM + 1;   /* MIX_MUP is the config's (mup_load) */
}

uint64_t qd_mixer_bytes(const qd_model *m)
{
    uint64_t most = 0;
    for (int kind = QD_MIXER_MAMBA2; kind <= QD_MIXER_SHORT_CONV; kind++) {
        int has = 0;
        for (int64_t b = 0; b < m->cfg.n_layers && b < QD_CFG_MAX_LAYERS && !has; b++) has = m->cfg.layer_mixer[b] == kind;
        if (!has || (kind != QD_MIXER_MAMBA2 && kind != QD_MIXER_SHORT_CONV)) continue;
        mix_param p[QD_MIXER_PARAMS];
        uint64_t n = 0;
        int np = mixer_params(m, kind, p);
        for (int i = 0; i < np; i++) {
            uint64_t e = p[i].name ? 1 : 0;
            for (int d = 0; d < p[i].ndim; d++) e *= (uint64_t)p[i].shape[d];
            n += e;
        }
        if (kind == QD_MIXER_MAMBA2 && m->cfg.layout == QD_LAYOUT_FALCON_H1) n += (uint64_t)qd_model_dim(m, QD_DIM_SSM_IN);
        if (n > most) most = n;
    }
    return most * sizeof(float);
}

static int check_kind(const qd_model *m, int block, int kind, qd_err *err)
{
    if (kind == QD_MIXER_SHORT_CONV || kind == QD_MIXER_MAMBA2) return 0;
    return qd_err_set(err, QD_EUNSUPPORTED, "block %d: layer mixer %d is not computed by %s", block, kind, m->arch->name);
}

int qd_mixer_validate(const qd_model *m, int block, qd_err *err)
{
    int kind = qd_model_block_mixer(m, block), rc = check_kind(m, block, kind, err);
    if (rc) return rc;
    mix_param p[QD_MIXER_PARAMS];
    int np = mixer_params(m, kind, p);
    char name[512];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    for (int i = 0; i < np; i++) {
        const st_tensor *t;
        if (!p[i].name) continue;
        snprintf(name + n, sizeof name - n, "%s", p[i].name);
        if ((rc = qd_model_find_float(m, name, p[i].ndim, p[i].shape, &t, err))) return rc;
    }
    return 0;
}

/* Falcon-H1's muP vector (compute_mup_vector): in_proj's output columns z [inner], x [inner],
 * B and C [groups * state] and dt [heads] times ssm_multipliers[0..4], into bw->mixer_w[MIX_MUP];
 * left NULL where every multiplier is 1 (the product changes nothing). */
static int mup_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    const qd_mixer_config *x = &m->cfg.mixer;
    int ones = 1;
    for (int i = 0; i < 5; i++) ones &= x->mup[i] == 1.0f;
    if (m->cfg.layout != QD_LAYOUT_FALCON_H1 || ones) return 0;
    int64_t inner = x->ssm_heads * x->ssm_head_dim, gn = x->ssm_groups * x->ssm_state, proj = qd_model_dim(m, QD_DIM_SSM_IN);
    int64_t end[5] = {inner, 2 * inner, 2 * inner + gn, 2 * inner + 2 * gn, proj};
    float *v = malloc((size_t)proj * sizeof *v);
    bw->mixer_w[MIX_MUP] = v ? qd_backend_alloc(m->be, (size_t)proj * sizeof(float)) : NULL;
    if (!bw->mixer_w[MIX_MUP]) { free(v); return qd_err_set(err, QD_ENOMEM, "block %d: out of memory for the muP vector", block); }
    for (int64_t j = 0, part = 0; j < proj; j++) {
        while (j >= end[part]) part++;
        v[j] = x->mup[part];
    }
    int rc = qd_backend_upload(m->be, bw->mixer_w[MIX_MUP], v, (size_t)proj * sizeof *v);
    free(v);
    return rc ? qd_err_set(err, rc, "block %d muP vector: %s", block, m->be->err.msg) : 0;
}

int qd_mixer_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    int kind = qd_model_block_mixer(m, block), rc = check_kind(m, block, kind, err);
    if (rc) return rc;
    mix_param p[QD_MIXER_PARAMS];
    int np = mixer_params(m, kind, p);
    char name[512];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    for (int i = 0; i < np && !rc; i++) {
        if (!p[i].name) continue;
        snprintf(name + n, sizeof name - n, "%s", p[i].name);
        rc = qd_model_load_f32(m, name, p[i].ndim, p[i].shape, &bw->mixer_w[i], err);
    }
    if (rc || kind != QD_MIXER_MAMBA2 || (rc = mup_load(m, block, bw, err))) return rc;
    /* A = -exp(A_log) in float32, as the layer computes it before the scan. */
    int64_t nh = m->cfg.mixer.ssm_heads;
    float *a = malloc((size_t)nh * sizeof *a);
    if (!a) return qd_err_set(err, QD_ENOMEM, "block %d: out of memory", block);
    if ((rc = qd_backend_download(m->be, a, bw->mixer_w[MIX_A], (size_t)nh * sizeof *a)))
        qd_err_set(err, rc, "block %d mamba.A_log: %s", block, m->be->err.msg);
    for (int64_t h = 0; h < nh && !rc; h++) a[h] = -expf(a[h]);
    if (!rc && (rc = qd_backend_upload(m->be, bw->mixer_w[MIX_A], a, (size_t)nh * sizeof *a)))
        qd_err_set(err, rc, "block %d mamba.A_log: %s", block, m->be->err.msg);
    free(a);
    return rc;
}

/* LFM2: y = out_proj(C * conv(B * x)), [B; C; x] = in_proj(xn). */
static int short_conv(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                      const qd_block_hooks *hooks, qd_err *err)
{
    const qd_arch *a = m->arch;
    int64_t rows = batch * seq, H = m->cfg.hidden;
    /* The attention's scratch: a recurrent layer does not attend. */
    float *bcx = qd_model_scratch(m, QD_SCRATCH_Q, (size_t)(rows * 3 * H) * sizeof(float), err);
    float *y = bcx ? qd_model_scratch(m, QD_SCRATCH_K, (size_t)(rows * H) * sizeof(float), err) : NULL;
    if (!y) return QD_ENOMEM;
    int rc;
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_mix_in].group, xn, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, a->lin_mix_in, 0, 3 * H, xn, rows, bcx, hooks, err)))
        return rc;
    BE_CALL(m, err, m->be->ops->conv1d_causal(m->be, y, bcx + 2 * H, bcx, bcx + H, 3 * H, batch, seq, H,
                                              bw->mixer_w[MIX_CONV_W], bw->mixer_w[MIX_CONV_B],
                                              m->cfg.mixer.conv_kernel, 0));
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_mix_out].group, y, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, a->lin_mix_out, 0, H, y, rows, out, hooks, err)))
        return rc;
    return 0;
}

/* Mamba-2, transformers' torch path (no cache, no padding mask). */
static int mamba2(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                  const qd_block_hooks *hooks, qd_err *err)
{
    const qd_arch *a = m->arch;
    const qd_mixer_config *x = &m->cfg.mixer;
    int64_t rows = batch * seq, inner = x->ssm_heads * x->ssm_head_dim, gn = x->ssm_groups * x->ssm_state;
    int64_t conv_dim = inner + 2 * gn, proj = inner + conv_dim + x->ssm_heads;
    float *zxbcdt = qd_model_scratch(m, QD_SCRATCH_Q, (size_t)(rows * proj) * sizeof(float), err);
    float *xbc = zxbcdt ? qd_model_scratch(m, QD_SCRATCH_K, (size_t)(rows * conv_dim) * sizeof(float), err) : NULL;
    float *y = xbc ? qd_model_scratch(m, QD_SCRATCH_V, (size_t)(rows * inner) * sizeof(float), err) : NULL;
    if (!y) return QD_ENOMEM;
    int rc;
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_mix_in].group, xn, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, a->lin_mix_in, 0, proj, xn, rows, zxbcdt, hooks, err)))
        return rc;
    if (bw->mixer_w[MIX_MUP]) BE_CALL(m, err, m->be->ops->scale_cols(m->be, zxbcdt, rows, proj, bw->mixer_w[MIX_MUP], 0));
    BE_CALL(m, err, m->be->ops->conv1d_causal(m->be, xbc, zxbcdt + inner, NULL, NULL, proj, batch, seq, conv_dim,
                                              bw->mixer_w[MIX_CONV_W], bw->mixer_w[MIX_CONV_B], x->conv_kernel, 1));
    BE_CALL(m, err, m->be->ops->ssd_scan(m->be, y, xbc, xbc + inner, xbc + inner + gn, conv_dim, zxbcdt + inner + conv_dim,
                                         proj, zxbcdt, proj, bw->mixer_w[MIX_A], bw->mixer_w[MIX_D],
                                         bw->mixer_w[MIX_DT_BIAS], x->dt_min, x->dt_max, batch, seq, x->ssm_heads,
                                         x->ssm_head_dim, x->ssm_groups, x->ssm_state));
    /* The gated RMSNorm: y * silu(z) (done by the scan), normalised over each group's
     * inner / n_groups channels, times the weight (none in Falcon-H1 without mamba_rms_norm). */
    if (x->no_norm) {
    } else if (x->ssm_groups == 1) {
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, y, y, bw->mixer_w[MIX_NORM], rows, inner, m->cfg.norm_eps));
    } else {
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, y, y, NULL, rows * x->ssm_groups, inner / x->ssm_groups, m->cfg.norm_eps));
        BE_CALL(m, err, m->be->ops->scale_cols(m->be, y, rows, inner, bw->mixer_w[MIX_NORM], 0));
    }
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_mix_out].group, y, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, a->lin_mix_out, 0, m->cfg.hidden, y, rows, out, hooks, err)))
        return rc;
    return 0;
}

int qd_mixer_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                     const qd_block_hooks *hooks, qd_err *err)
{
    int kind = qd_model_block_mixer(m, bw->block);
    if (kind == QD_MIXER_SHORT_CONV) return short_conv(m, bw, xn, out, batch, seq, hooks, err);
    if (kind == QD_MIXER_MAMBA2) return mamba2(m, bw, xn, out, batch, seq, hooks, err);
    return check_kind(m, bw->block, kind, err);
}
