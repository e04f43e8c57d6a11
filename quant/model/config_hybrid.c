/* The config keys of the hybrids of attention with a recurrent mixer: LFM2 (Lfm2Config:
 * short-convolution and attention layers) and Granite-4 (GraniteMoeHybridConfig: Mamba-2
 * and attention layers). Defaults are the transformers config classes' (transformers 5):
 * a key left out of config.json means what it means there. What changes the math and is not
 * computed here (a RoPE kind that transformers does not apply, experts with another
 * activation than SiLU) is refused by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

int qd_config_is_hybrid(const char *architecture)
{
    return !strcmp(architecture, "Lfm2ForCausalLM") || !strcmp(architecture, "GraniteMoeHybridForCausalLM");
}

/* An integer key with the config class's default where config.json leaves it out (config.c
 * read it with the Llama default first). */
static int int_or(const cJSON *root, const char *key, int64_t dflt, int64_t *out, const char *what, qd_err *err)
{
    if (!cJSON_GetObjectItemCaseSensitive(root, key)) *out = dflt;
    return qd_cfg_get_int(root, key, out, what, err);
}

/* A number key read as a double (Python's int(2 * ff / 3) and int(multiplier * ff) are
 * double arithmetic). */
static int get_double(const cJSON *root, const char *key, double *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return qd_err_set(err, QD_EFORMAT, "%s: %s must be a number", what, key);
    *out = v->valuedouble;
    return 0;
}

/* layer_types (or its older spelling) into c->layer_mixer: each entry one of two names for
 * the mixer (as transformers 5 remaps "mamba" to "linear_attention" and "attention" to
 * "full_attention"). Absent: every layer is `dflt`. */
static int parse_layer_kinds(const cJSON *root, const char *key, const char *const *mixer_names,
                             qd_layer_mixer mixer, const char *const *attn_names, qd_layer_mixer dflt,
                             const char *what, qd_model_config *c, qd_err *err)
{
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!lt || cJSON_IsNull(lt)) {
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_mixer[i] = dflt;
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
        return qd_err_set(err, QD_EFORMAT, "%s: %s must be a list of num_hidden_layers (%lld) strings", what, key,
                          (long long)c->n_layers);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, lt) {
        const char *s = cJSON_IsString(e) ? e->valuestring : "?";
        if (!strcmp(s, mixer_names[0]) || (mixer_names[1] && !strcmp(s, mixer_names[1]))) c->layer_mixer[i] = mixer;
        else if (!strcmp(s, attn_names[0]) || (attn_names[1] && !strcmp(s, attn_names[1])))
            c->layer_mixer[i] = QD_MIXER_ATTENTION;
        else
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s[%d] \"%s\" is not supported for %s (%s, %s)", what, key, i, s,
                              c->architecture, mixer_names[0], attn_names[0]);
        i++;
    }
    return 0;
}

/* LFM2: short-convolution layers (in_proj into B, C, x; C * conv(B * x); out_proj) and
 * attention layers with per-head q/k RMSNorms, a SwiGLU feed_forward whose width the config
 * class derives from intermediate_size (block_auto_adjust_ff_dim), RMSNorms of norm_eps. */
static int parse_lfm2(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t ff = 12288, multiple_of = 256;
    int auto_adjust = 1;
    double mult = 1.0;
    const cJSON *mj = cJSON_GetObjectItemCaseSensitive(root, "block_ffn_dim_multiplier");
    c->norm_eps = 1e-5f;
    c->tie_word_embeddings = 1;
    c->rope_theta = 1000000.0f;   /* Lfm2Config.default_theta */
    if ((rc = int_or(root, "vocab_size", 65536, &c->vocab, what, err)) ||
        (rc = int_or(root, "hidden_size", 2560, &c->hidden, what, err)) ||
        (rc = int_or(root, "num_hidden_layers", 32, &c->n_layers, what, err)) ||
        (rc = int_or(root, "num_attention_heads", 32, &c->n_heads, what, err)) ||
        (rc = int_or(root, "num_key_value_heads", 8, &c->n_kv_heads, what, err)) ||
        (rc = int_or(root, "max_position_embeddings", 128000, &c->max_pos, what, err)) ||
        (rc = qd_cfg_get_int(root, "intermediate_size", &ff, what, err)) ||
        (rc = qd_cfg_get_int(root, "block_ff_dim", &ff, what, err)) ||   /* the config class pops it over intermediate_size */
        (rc = qd_cfg_get_float(root, "norm_eps", &c->norm_eps, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_embedding", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_bool(root, "conv_bias", &c->mixer.conv_bias, what, err)) ||
        (rc = int_or(root, "conv_L_cache", 3, &c->mixer.conv_kernel, what, err)) ||
        (rc = qd_cfg_get_int(root, "block_multiple_of", &multiple_of, what, err)) ||
        (rc = qd_cfg_get_bool(root, "block_auto_adjust_ff_dim", &auto_adjust, what, err)) ||
        (rc = get_double(root, "block_ffn_dim_multiplier", &mult, what, err)))
        return rc;
    /* Lfm2MLP: int(2 * ff / 3), then, with a multiplier, int(multiplier * ff) rounded up to
     * block_multiple_of (a null multiplier skips both). */
    if (auto_adjust) {
        if (ff <= 0 || multiple_of <= 0) return qd_err_set(err, QD_EFORMAT, "%s: intermediate_size and block_multiple_of must be positive", what);
        ff = (int64_t)(2.0 * (double)ff / 3.0);
        if (!(mj && cJSON_IsNull(mj))) {
            if (!(mult > 0 && isfinite(mult))) return qd_err_set(err, QD_EFORMAT, "%s: block_ffn_dim_multiplier must be positive", what);
            ff = (int64_t)(mult * (double)ff);
            ff = multiple_of * ((ff + multiple_of - 1) / multiple_of);
        }
    }
    c->intermediate = ff;
    c->mixer.proj_bias = c->mixer.conv_bias;   /* in_proj, out_proj and the convolution: conv_bias */
    /* Lfm2Attention and Lfm2MLP have no biases and SiLU whatever the generic keys say. */
    c->qkv_bias = c->o_bias = c->mlp_bias = 0;
    strcpy(c->activation, "silu");
    c->qk_norm = 1;
    if (c->mixer.conv_kernel < 1) return qd_err_set(err, QD_EFORMAT, "%s: conv_L_cache must be positive", what);
    /* layer_types, or full_attn_idxs (default: every layer attends). */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        if (c->n_layers > QD_CFG_MAX_LAYERS || c->n_layers < 1)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is not in [1, %d]", what,
                              (long long)c->n_layers, QD_CFG_MAX_LAYERS);
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "full_attn_idxs"), *e;
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_mixer[i] = idx && !cJSON_IsNull(idx) ? QD_MIXER_SHORT_CONV : QD_MIXER_ATTENTION;
        if (idx && !cJSON_IsNull(idx) && !cJSON_IsArray(idx))
            return qd_err_set(err, QD_EFORMAT, "%s: full_attn_idxs must be a list of layer indices", what);
        cJSON_ArrayForEach(e, idx) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)c->n_layers ||
                e->valuedouble != (double)(int64_t)e->valuedouble)
                return qd_err_set(err, QD_EFORMAT, "%s: full_attn_idxs must hold layer indices in [0, %lld)", what,
                                  (long long)c->n_layers);
            c->layer_mixer[(int64_t)e->valuedouble] = QD_MIXER_ATTENTION;
        }
    } else {
        static const char *const conv[] = {"conv", NULL}, *const attn[] = {"full_attention", NULL};
        if ((rc = parse_layer_kinds(root, "layer_types", conv, QD_MIXER_SHORT_CONV, attn, QD_MIXER_ATTENTION, what, c, err)))
            return rc;
    }
    return qd_config_rope_parse(root, what, 0, c, err);
}

/* A number of time_step_limit: JSON's, or transformers 5's spelling of a non-finite one,
 * {"__float__": "Infinity"} (JSON has no inf). 0 when it is neither. */
static int limit_value(const cJSON *v, double *out)
{
    if (cJSON_IsNumber(v)) { *out = v->valuedouble; return 1; }
    const cJSON *f = cJSON_IsObject(v) && cJSON_GetArraySize(v) == 1 ? cJSON_GetObjectItemCaseSensitive(v, "__float__") : NULL;
    if (!cJSON_IsString(f)) return 0;
    if (!strcmp(f->valuestring, "Infinity")) *out = INFINITY;
    else if (!strcmp(f->valuestring, "-Infinity")) *out = -INFINITY;
    else return 0;
    return 1;
}

int qd_cfg_time_step_limit(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    /* time_step_limit [min, max]: dt is clamped to it after the softplus. */
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "time_step_limit");
    if (tl && cJSON_IsNull(tl))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: time_step_limit null is not supported (transformers' scan needs "
                          "its bounds)", what);
    if (tl) {
        double lo = 0, hi = 0;
        int two = cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == 2;
        if (!two || !limit_value(cJSON_GetArrayItem(tl, 0), &lo) || !limit_value(cJSON_GetArrayItem(tl, 1), &hi) ||
            isnan(lo) || isnan(hi) || !(lo <= hi))
            return qd_err_set(err, QD_EFORMAT, "%s: time_step_limit must be [min, max] with min <= max", what);
        c->mixer.dt_min = (float)lo;
        c->mixer.dt_max = (float)hi;
    }
    return 0;
}

/* Granite-4 MoE hybrids (num_local_experts > 0: Granite-4.0-H-Tiny, -Small): every layer's
 * MLP half is GraniteMoeHybridMoE beside shared_mlp, on the same normed input, their outputs
 * added. GraniteMoeHybridTopKRouter: logits = x R^T in float, the top num_experts_per_tok
 * of them, softmaxed over those alone (no renormalisation: it sums to 1); experts of width
 * intermediate_size, act(gate) * up then down, act hidden_act (SiLU is what quantd's experts
 * compute: another is refused by name). */
static int parse_granite_experts(const cJSON *root, const char *what, int64_t experts, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t top_k = 2;   /* GraniteMoeHybridConfig.num_experts_per_tok */
    if ((rc = qd_cfg_get_int(root, "num_experts_per_tok", &top_k, what, err))) return rc;
    if (experts > QD_MAX_EXPERTS || top_k < 1 || top_k > experts)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_local_experts %lld (1 to %d supported) and num_experts_per_tok "
                          "%lld (1 to the experts) are not supported", what, (long long)experts, QD_MAX_EXPERTS,
                          (long long)top_k);
    if (strcmp(c->activation, "silu"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported for %s's experts (silu is)", what,
                          c->activation, c->architecture);
    if (c->intermediate <= 0) return qd_err_set(err, QD_EFORMAT, "%s: intermediate_size must be positive", what);
    c->n_experts = experts;
    c->top_k = top_k;
    c->moe_intermediate = c->intermediate;   /* intermediate_size: the experts' width (config.c read it) */
    c->moe_scoring = QD_MOE_TOPK_SOFTMAX;
    c->norm_topk_prob = 0;
    c->shared_intermediate = 0;              /* shared_mlp is the table's MLP, not a MoE shared expert */
    c->routed_scale = 1.0f;
    return 0;
}

/* Granite-4 hybrids: Mamba-2 layers and attention layers (RoPE or none: position_embedding_type),
 * each followed by the dense shared_mlp (input_linear holds gate and up); Granite's
 * multipliers on the embeddings, the attention scores, the residual branches and the
 * logits. num_local_experts > 0 adds MoE experts beside shared_mlp (parse_granite_experts;
 * GraniteMoeHybridConfig's default is 8, so a dense model says 0). */
static int parse_granite_hybrid(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t experts = 8, shared = 1024, expand = 2, d_head = 0;
    float emb = 1.0f, att = 1.0f, res = 1.0f, logits = 1.0f;
    char pos[32] = "";
    c->mixer.ssm_heads = 128; c->mixer.ssm_groups = 1; c->mixer.ssm_state = 256; c->mixer.conv_kernel = 4;
    c->mixer.conv_bias = 1; c->mixer.proj_bias = 0;
    c->mixer.dt_min = 0.0f; c->mixer.dt_max = INFINITY;
    c->tie_word_embeddings = 0;
    if ((rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_local_experts", &experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "shared_intermediate_size", &shared, what, err)) ||
        (rc = qd_cfg_get_float(root, "embedding_multiplier", &emb, what, err)) ||
        (rc = qd_cfg_get_float(root, "attention_multiplier", &att, what, err)) ||
        (rc = qd_cfg_get_float(root, "residual_multiplier", &res, what, err)) ||
        (rc = qd_cfg_get_float(root, "logits_scaling", &logits, what, err)) ||
        (rc = qd_cfg_get_str(root, "position_embedding_type", pos, sizeof pos, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_n_heads", &c->mixer.ssm_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_n_groups", &c->mixer.ssm_groups, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_d_state", &c->mixer.ssm_state, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_d_conv", &c->mixer.conv_kernel, what, err)) ||
        (rc = qd_cfg_get_int(root, "mamba_expand", &expand, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_conv_bias", &c->mixer.conv_bias, what, err)) ||
        (rc = qd_cfg_get_bool(root, "mamba_proj_bias", &c->mixer.proj_bias, what, err)))
        return rc;
    if (experts < 0) return qd_err_set(err, QD_EFORMAT, "%s: num_local_experts must not be negative", what);
    if (experts > 0 && (rc = parse_granite_experts(root, what, experts, c, err))) return rc;
    if (shared <= 0) return qd_err_set(err, QD_EFORMAT, "%s: shared_intermediate_size must be positive", what);
    c->intermediate = shared;   /* the table's MLP is shared_mlp (beside the experts where there are some) */
    c->mlp_bias = 0;
    c->o_bias = c->qkv_bias;   /* attention_bias: q, k, v and o_proj */
    /* mamba_d_head: "auto" (or absent) is mamba_expand * hidden_size / mamba_n_heads. */
    const cJSON *dh = cJSON_GetObjectItemCaseSensitive(root, "mamba_d_head");
    if (dh && !cJSON_IsNull(dh) && !(cJSON_IsString(dh) && !strcmp(dh->valuestring, "auto")) &&
        (rc = qd_cfg_get_int(root, "mamba_d_head", &d_head, what, err)))
        return rc;
    int64_t inner = expand * c->hidden;
    if (c->mixer.ssm_heads <= 0 || c->mixer.ssm_groups <= 0 || c->mixer.ssm_state <= 0 || c->mixer.conv_kernel <= 0 ||
        expand <= 0 || inner % c->mixer.ssm_heads || c->mixer.ssm_heads % c->mixer.ssm_groups)
        return qd_err_set(err, QD_EFORMAT, "%s: mamba_n_heads %lld must divide mamba_expand * hidden_size %lld, "
                          "mamba_n_groups %lld must divide the heads, and mamba_d_state, mamba_d_conv must be positive",
                          what, (long long)c->mixer.ssm_heads, (long long)inner, (long long)c->mixer.ssm_groups);
    if (d_head == 0) d_head = inner / c->mixer.ssm_heads;
    if (d_head * c->mixer.ssm_heads != inner)
        return qd_err_set(err, QD_EFORMAT, "%s: mamba_d_head %lld times mamba_n_heads %lld is not mamba_expand * "
                          "hidden_size %lld", what, (long long)d_head, (long long)c->mixer.ssm_heads, (long long)inner);
    c->mixer.ssm_head_dim = d_head;
    if ((rc = qd_cfg_time_step_limit(root, what, c, err))) return rc;
    /* transformers builds a rotary embedding for "rope" only; null and "nope" have none. */
    int rope = !strcmp(pos, "rope");
    if (pos[0] && !rope && strcmp(pos, "nope"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: position_embedding_type \"%s\" is not supported (rope, nope or null)",
                          what, pos);
    if (!(emb > 0 && isfinite(emb)) || !(att > 0 && isfinite(att)) || !(res > 0 && isfinite(res)) ||
        !(logits > 0 && isfinite(logits)))
        return qd_err_set(err, QD_EFORMAT, "%s: embedding_multiplier, attention_multiplier, residual_multiplier and "
                          "logits_scaling must be positive", what);
    c->embed_scale = emb;
    c->attn_scale = att;          /* the softmax scale itself (not head_dim^-1/2) */
    c->residual_scale = res;
    c->logit_scale = 1.0f / logits;
    static const char *const mamba[] = {"mamba", "linear_attention"}, *const attn[] = {"attention", "full_attention"};
    const char *key = cJSON_GetObjectItemCaseSensitive(root, "layer_types") ? "layer_types" : "layers_block_type";
    if ((rc = parse_layer_kinds(root, key, mamba, QD_MIXER_MAMBA2, attn, QD_MIXER_MAMBA2, what, c, err))) return rc;
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_nope[i] = !rope;
    return qd_config_rope_parse(root, what, 0, c, err);
}

int qd_config_hybrid_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int lfm2 = !strcmp(c->architecture, "Lfm2ForCausalLM");
    c->layout = lfm2 ? QD_LAYOUT_LFM2 : QD_LAYOUT_GRANITE_HYBRID;
    int rc = lfm2 ? parse_lfm2(root, what, c, err) : parse_granite_hybrid(root, what, c, err);
    if (rc) return rc;
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    /* Keys of other families that would change the math here. */
    static const char *const foreign[] = {"sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                                          "query_pre_attn_scalar"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    return 0;
}
