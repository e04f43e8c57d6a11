/* Falcon-H1's config.json (FalconH1Config, transformers 5): every layer runs llama attention
 * and a Mamba-2 mixer side by side on input_layernorm's output, then pre_ff_layernorm and a
 * SwiGLU feed_forward; muP multipliers on the embeddings, both branches' inputs and outputs,
 * the keys, in_proj's five parts (ssm_multipliers), the MLP's gate and down_proj, and the
 * logits. Defaults are the config class's: a key left out means what it means there.
 *
 * Refused by name, as not computed exactly: mamba_rms_norm with mamba_norm_before_gate (the
 * norm before the gate: transformers applies it so, vLLM's MambaMixer2 gates first, so no
 * output serves both), a mamba_proj_bias other than projectors_bias (transformers' in_proj
 * and out_proj biases; vLLM builds both from mamba_proj_bias), a non-positive
 * key_multiplier, embedding_multiplier or lm_head_multiplier (quantd scales by them through
 * scales that mean "none" at 0), another activation than SiLU, a null time_step_limit. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

int qd_config_falcon_h1_is(const char *architecture) { return !strcmp(architecture, "FalconH1ForCausalLM"); }

/* An integer key with the config class's default where config.json leaves it out (config.c
 * read it with the Llama default first); null keeps what is there. */
static int int_or(const cJSON *root, const char *key, int64_t dflt, int64_t *out, const char *what, qd_err *err)
{
    if (!cJSON_GetObjectItemCaseSensitive(root, key)) *out = dflt;
    return qd_cfg_get_int(root, key, out, what, err);
}

/* A list of n finite numbers (mlp_multipliers, ssm_multipliers); absent or null keeps out. */
static int float_list(const cJSON *root, const char *key, int n, float *out, const char *what, qd_err *err)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(root, key), *e;
    if (!l || cJSON_IsNull(l)) return 0;
    if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != n)
        return qd_err_set(err, QD_EFORMAT, "%s: %s must be a list of %d numbers", what, key, n);
    int i = 0;
    cJSON_ArrayForEach(e, l) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return qd_err_set(err, QD_EFORMAT, "%s: %s[%d] must be a finite number", what, key, i);
        out[i++] = (float)e->valuedouble;
    }
    return 0;
}

/* The Mamba-2 mixer's sizes: mamba_d_ssm (null: mamba_expand * hidden_size) is the inner
 * width, mamba_d_head "auto" that over mamba_n_heads. */
static int parse_mixer(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    qd_mixer_config *x = &c->mixer;
    int64_t d_ssm = 1024, expand = 2, d_head = 0, chunk = 256;
    int rms_norm = 0, before_gate = 1, proj_bias = 0, projectors_bias = 0, rc;
    x->ssm_heads = 128; x->ssm_groups = 1; x->ssm_state = 256; x->conv_kernel = 4; x->conv_bias = 1;
    x->dt_min = 0.0f; x->dt_max = INFINITY;
    for (int i = 0; i < 5; i++) x->mup[i] = 1.0f;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "mamba_d_ssm");
    if ((rc = qd_cfg_get_int(root, "mamba_n_heads", &x->ssm_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_n_groups", &x->ssm_groups, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_d_state", &x->ssm_state, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_d_conv", &x->conv_kernel, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_expand", &expand, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_d_ssm", &d_ssm, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_chunk_size", &chunk, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_conv_bias", &x->conv_bias, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_proj_bias", &proj_bias, what, err)) ||
        (rc = qd_cfg_get_bool(root, "projectors_bias", &projectors_bias, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_rms_norm", &rms_norm, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_norm_before_gate", &before_gate, what, err)) ||
        (rc = float_list(root, "ssm_multipliers", 5, x->mup, what, err)) ||
        (rc = qd_cfg_time_step_limit(root, what, c, err)))
        return rc;
    if (ds && cJSON_IsNull(ds)) d_ssm = expand * c->hidden;
    const cJSON *dh = cJSON_GetObjectItemCaseSensitive(root, "mamba_d_head");
    if (dh && !cJSON_IsNull(dh) && !(cJSON_IsString(dh) && !strcmp(dh->valuestring, "auto")) &&
        (rc = qd_cfg_get_int(root, "mamba_d_head", &d_head, what, err)))
        return rc;
    if (x->ssm_heads <= 0 || x->ssm_groups <= 0 || x->ssm_state <= 0 || x->conv_kernel <= 0 || d_ssm <= 0 || chunk <= 0 ||
        d_ssm % x->ssm_heads || x->ssm_heads % x->ssm_groups)
        return qd_err_set(err, QD_EFORMAT, "%s: mamba_n_heads %lld must divide mamba_d_ssm %lld, mamba_n_groups %lld must "
                          "divide the heads, and mamba_d_state, mamba_d_conv, mamba_chunk_size must be positive", what,
                          (long long)x->ssm_heads, (long long)d_ssm, (long long)x->ssm_groups);
    if (d_head == 0) d_head = d_ssm / x->ssm_heads;
    if (d_head * x->ssm_heads != d_ssm)
        return qd_err_set(err, QD_EFORMAT, "%s: mamba_d_head %lld times mamba_n_heads %lld is not mamba_d_ssm %lld", what,
                          (long long)d_head, (long long)x->ssm_heads, (long long)d_ssm);
    x->ssm_head_dim = d_head;
    if (rms_norm && before_gate)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: mamba_rms_norm true with mamba_norm_before_gate true is not supported "
                          "(transformers normalises before the gate, vLLM's MambaMixer2 after it)", what);
    if (proj_bias != projectors_bias)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: mamba_proj_bias %s with projectors_bias %s is not supported (vLLM "
                          "builds mamba.out_proj's bias from mamba_proj_bias, transformers from projectors_bias)", what,
                          proj_bias ? "true" : "false", projectors_bias ? "true" : "false");
    x->proj_bias = proj_bias;
    x->no_norm = !rms_norm;
    /* mamba_chunk_size only splits transformers' scan into chunks: the same recurrence. */
    return 0;
}

int qd_config_falcon_h1_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    float emb = 1.0f, lm = 1.0f, key = 1.0f, mlp[2] = {1.0f, 1.0f};
    qd_falcon_mul *f = &c->falcon;
    *f = (qd_falcon_mul){1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    c->norm_eps = 1e-5f;
    c->tie_word_embeddings = 0;
    c->attn_scale = 0;
    if ((rc = int_or(root, "vocab_size", 128000, &c->vocab, what, err)) ||
        (rc = int_or(root, "hidden_size", 4096, &c->hidden, what, err)) ||
        (rc = int_or(root, "intermediate_size", 14336, &c->intermediate, what, err)) ||
        (rc = int_or(root, "num_hidden_layers", 32, &c->n_layers, what, err)) ||
        (rc = int_or(root, "num_attention_heads", 32, &c->n_heads, what, err)) ||
        (rc = int_or(root, "num_key_value_heads", 8, &c->n_kv_heads, what, err)) ||
        (rc = int_or(root, "max_position_embeddings", 8192, &c->max_pos, what, err)) ||
        (rc = qd_cfg_get_float(root, "rms_norm_eps", &c->norm_eps, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_float(root, "embedding_multiplier", &emb, what, err)) ||
        (rc = qd_cfg_get_float(root, "lm_head_multiplier", &lm, what, err)) ||
        (rc = qd_cfg_get_float(root, "key_multiplier", &key, what, err)) ||
        (rc = qd_cfg_get_float(root, "attention_in_multiplier", &f->attn_in, what, err)) ||
        (rc = qd_cfg_get_float(root, "attention_out_multiplier", &f->attn_out, what, err)) ||
        (rc = qd_cfg_get_float(root, "ssm_in_multiplier", &f->ssm_in, what, err)) ||
        (rc = qd_cfg_get_float(root, "ssm_out_multiplier", &f->ssm_out, what, err)) ||
        (rc = float_list(root, "mlp_multipliers", 2, mlp, what, err)))
        return rc;
    if (c->n_layers > QD_CFG_MAX_LAYERS || c->n_layers < 1)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is not in [1, %d]", what, (long long)c->n_layers,
                          QD_CFG_MAX_LAYERS);
    if (!isfinite(f->attn_in) || !isfinite(f->attn_out) || !isfinite(f->ssm_in) || !isfinite(f->ssm_out))
        return qd_err_set(err, QD_EFORMAT, "%s: the attention and ssm multipliers must be finite", what);
    if (!(emb > 0 && isfinite(emb)) || !(lm > 0 && isfinite(lm)) || !(key > 0 && isfinite(key)))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: embedding_multiplier %g, lm_head_multiplier %g and key_multiplier %g "
                          "must be positive and finite", what, emb, lm, key);
    f->mlp_gate = mlp[0];
    f->mlp_down = mlp[1];
    c->layout = QD_LAYOUT_FALCON_H1;
    c->parallel_block = 1;
    c->o_bias = c->qkv_bias;   /* attention_bias: q, k, v and o_proj */
    c->embed_scale = emb;
    c->logit_scale = lm;
    if ((rc = parse_mixer(root, what, c, err))) return rc;
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_mixer[i] = QD_MIXER_MAMBA2;   /* beside attention */
    if ((rc = qd_config_rope_parse(root, what, 0, c, err))) return rc;
    /* The keys scale only the scores q.k: the softmax scale times key_multiplier. head_dim is
     * config.json's or hidden / heads (config.c checks it after this). */
    int64_t hd = c->head_dim ? c->head_dim : (c->n_heads > 0 ? c->hidden / c->n_heads : 0);
    if (hd <= 0) return qd_err_set(err, QD_EFORMAT, "%s: head_dim must be positive", what);
    c->attn_scale = (float)((double)key / sqrt((double)hd));
    static const char *const foreign[] = {"sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                                          "query_pre_attn_scalar"};
    return qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err);
}
