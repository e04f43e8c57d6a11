/* RoPE frequencies (see rope.h). The formulas follow transformers' modeling_rope_utils
 * (_compute_*_parameters and dynamic_rope_update), evaluated in float32 like torch. */
#include "quant/model/rope.h"

#include <math.h>
#include <string.h>

static void plain_inv_freq(float base, int64_t dim, float *inv)
{
    /* 1 / base^(arange(0, dim, 2) / dim), the exponent and the power in float32. */
    for (int64_t i = 0; i < dim / 2; i++) inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
}

static float yarn_mscale(float scale, float m)
{
    return scale <= 1.0f ? 1.0f : 0.1f * m * logf(scale) + 1.0f;
}

static double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos)
{
    return ((double)dim * log(max_pos / (rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

static void yarn(const qd_model_config *c, const qd_rope_config *r, float theta, int64_t dim, qd_rope_freqs *f)
{
    float factor = r->factor;
    double orig = (double)(r->orig_max_pos > 0 ? r->orig_max_pos : c->max_pos);
    /* transformers 5: factor as given; only without one is it the ratio of the two context
     * lengths (Qwen2.5 ships factor 4 with both lengths equal). */
    if (!r->has_factor && r->orig_max_pos > 0) factor = (float)((double)c->max_pos / (double)r->orig_max_pos);
    float attn = r->attention_factor;
    if (!(attn > 0)) {
        if (r->mscale > 0 && r->mscale_all_dim > 0)
            attn = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
        else
            attn = yarn_mscale(factor, 1.0f);
    }
    double base = theta;
    double low = yarn_correction_dim(r->beta_fast, dim, base, orig);
    double high = yarn_correction_dim(r->beta_slow, dim, base, orig);
    if (r->truncate) { low = floor(low); high = ceil(high); }
    if (low < 0) low = 0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    float lo = (float)low, hi = (float)high;
    if (lo == hi) hi += 0.001f;
    for (int64_t i = 0; i < dim / 2; i++) {
        float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / (factor * pos_freq);
        float ramp = ((float)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extra_w = 1.0f - ramp;
        f->inv_freq[i] = inter * (1.0f - extra_w) + extra * extra_w;
    }
    f->attn_scale = attn;
}

static void llama3(const qd_rope_config *r, int64_t dim, qd_rope_freqs *f)
{
    float old_ctx = (float)r->orig_max_pos;
    float low_wavelen = old_ctx / r->low_freq_factor, high_wavelen = old_ctx / r->high_freq_factor;
    for (int64_t i = 0; i < dim / 2; i++) {
        float inv = f->inv_freq[i];
        float wavelen = 2.0f * (float)M_PI / inv;
        float out = wavelen > low_wavelen ? inv / r->factor : inv;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_ctx / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            out = (1.0f - smooth) * out / r->factor + smooth * out;
        }
        f->inv_freq[i] = out;
    }
}

int64_t qd_rope_max_seq(const qd_model_config *c)
{
    int64_t n = c->max_pos;
    for (int i = 0; i < 2 && c->family == QD_ARCH_LLAMA; i++) {
        const qd_rope_config *r = i ? &c->rope_local : &c->rope;
        int64_t d = (int64_t)((double)c->max_pos * (r->factor > 1 ? r->factor : 1.0));
        if (r->type == QD_ROPE_DYNAMIC && d > n) n = d;
    }
    return n;
}

int qd_rope_freqs_compute(const qd_model_config *c, int sliding, int64_t seq_len, qd_rope_freqs *f, qd_err *err)
{
    const qd_rope_config *r = sliding ? &c->rope_local : &c->rope;
    int64_t dim = (int64_t)((float)c->head_dim * r->partial_rotary_factor);
    dim &= ~(int64_t)1;
    if (dim <= 0 || dim / 2 > QD_ROPE_MAX_HALF)
        return qd_err_set(err, QD_EINVAL, "rope: %lld rotated dims per head is outside (0, %d]", (long long)dim,
                          2 * QD_ROPE_MAX_HALF);
    memset(f, 0, sizeof *f);
    f->rot_dim = dim;
    f->attn_scale = 1.0f;
    float base = sliding ? c->rope_theta_local : c->rope_theta;
    switch (r->type) {
    case QD_ROPE_DEFAULT:
        plain_inv_freq(base, dim, f->inv_freq);
        break;
    case QD_ROPE_LINEAR:
        plain_inv_freq(base, dim, f->inv_freq);
        for (int64_t i = 0; i < dim / 2; i++) f->inv_freq[i] /= r->factor;
        break;
    case QD_ROPE_DYNAMIC: {
        /* The base grows only once the sequence is longer than max_position_embeddings. */
        double len = seq_len > c->max_pos ? (double)seq_len : (double)c->max_pos;
        double b = (double)base * pow(r->factor * len / (double)c->max_pos - (r->factor - 1.0),
                                      (double)dim / (double)(dim - 2));
        plain_inv_freq((float)b, dim, f->inv_freq);
        break;
    }
    case QD_ROPE_LLAMA3:
        plain_inv_freq(base, dim, f->inv_freq);
        llama3(r, dim, f);
        break;
    case QD_ROPE_YARN:
        yarn(c, r, base, dim, f);
        break;
    case QD_ROPE_LONGROPE: {
        if (r->n_factors != dim / 2)
            return qd_err_set(err, QD_EFORMAT, "rope: longrope factors have %d entries, the rotated dims need %lld",
                              r->n_factors, (long long)(dim / 2));
        int64_t orig = r->orig_max_pos > 0 ? r->orig_max_pos : c->max_pos;
        float factor = r->orig_max_pos > 0 ? (float)((double)c->max_pos / (double)r->orig_max_pos) : r->factor;
        /* PhimoeRotaryEmbedding recomputes its frequencies without the sequence's length, so
         * short_factor always, and scales cos/sin by long_mscale past the original context,
         * short_mscale within it (in place of the attention factor). */
        int phimoe = c->layout == QD_LAYOUT_PHIMOE;
        const float *ext = seq_len > orig && !phimoe ? r->long_factor : r->short_factor;
        for (int64_t i = 0; i < dim / 2; i++)
            f->inv_freq[i] = 1.0f / (ext[i] * powf(base, (float)(2 * i) / (float)dim));
        f->attn_scale = phimoe ? (seq_len > orig ? r->long_mscale : r->short_mscale)
                        : r->attention_factor > 0 ? r->attention_factor
                        : factor <= 1.0f ? 1.0f
                        : sqrtf(1.0f + logf(factor) / logf((float)orig));
        break;
    }
    }
    return 0;
}
