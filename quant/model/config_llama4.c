/* Llama 4 text (Llama4ForCausalLM, model_type llama4_text) config keys, with
 * Llama4TextConfig's defaults (transformers 5.23): a config.json that leaves a key out
 * means what it means to transformers. The block is Llama attention with RoPE on the
 * complex (interleaved) pairs of every head, except on the NoPE layers (no_rope_layers[i]
 * 0; by default every no_rope_layer_interval-th), which see every earlier token and scale
 * their queries by 1 + attn_scale ln(1 + floor((pos + 1) / floor_scale))
 * (attn_temperature_tuning); the RoPE layers attend within chunks of attention_chunk_size
 * tokens (layer_types "chunked_attention") and, with use_qk_norm, L2-normalise q and k
 * after RoPE. The MLP is a dense SwiGLU of intermediate_size_mlp, or on moe_layers (by
 * default every interleave_moe_layer_step-th) a router whose num_experts_per_tok largest
 * logits go through a sigmoid that scales the chosen expert's input, num_local_experts
 * experts of intermediate_size and one shared expert of the same width, summed. A key
 * that changes the math in a way this forward does not compute is refused by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

/* Llama4ForConditionalGeneration's text tower is this config, from text_config (config_vlm.c). */
int qd_config_llama4_is(const char *architecture)
{
    return !strcmp(architecture, "Llama4ForCausalLM") || !strcmp(architecture, "Llama4ForConditionalGeneration");
}

/* Llama4TextConfig's defaults for the keys config.c read with Llama's. */
static void defaults(const cJSON *root, qd_model_config *c)
{
    if (qd_cfg_absent(root, "hidden_size")) c->hidden = 5120;
    if (qd_cfg_absent(root, "num_hidden_layers")) c->n_layers = 48;
    if (qd_cfg_absent(root, "num_attention_heads")) c->n_heads = 40;
    if (qd_cfg_absent(root, "num_key_value_heads")) c->n_kv_heads = 8;
    if (qd_cfg_absent(root, "head_dim")) c->head_dim = 128;
    if (qd_cfg_absent(root, "vocab_size")) c->vocab = 202048;
    if (qd_cfg_absent(root, "max_position_embeddings")) c->max_pos = 131072;
    if (qd_cfg_absent(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
}

/* A list of num_hidden_layers 0/1 integers (no_rope_layers) into flags; 0 when absent,
 * null or empty (the default then applies), 1 when read. Llama4TextConfig takes a longer
 * list and reads its first entries. */
static int layer_flags(const cJSON *root, const char *key, const qd_model_config *c, unsigned char *out,
                       const char *what, qd_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key), *e;
    if (!a || cJSON_IsNull(a) || (cJSON_IsArray(a) && cJSON_GetArraySize(a) == 0)) return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < c->n_layers)
        return qd_err_set(err, QD_EFORMAT, "%s: %s must be a list of at least num_hidden_layers (%lld) 0/1 entries", what,
                          key, (long long)c->n_layers);
    int i = 0;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || (e->valuedouble != 0 && e->valuedouble != 1) )
            return qd_err_set(err, QD_EFORMAT, "%s: %s[%d] must be 0 or 1", what, key, i);
        if (i < c->n_layers) out[i] = (unsigned char)e->valuedouble;
        i++;
    }
    return 1;
}

/* moe_layers (indices of the sparse layers) or every step-th layer from step - 1. */
static int moe_layers(const cJSON *root, qd_model_config *c, const char *what, qd_err *err)
{
    int64_t step = 1;
    int rc = qd_cfg_get_int(root, "interleave_moe_layer_step", &step, what, err);
    if (rc) return rc;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "moe_layers"), *e;
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_dense[i] = 1;
    if (!a || cJSON_IsNull(a)) {
        if (step < 1) return qd_err_set(err, QD_EFORMAT, "%s: interleave_moe_layer_step %lld must be positive", what, (long long)step);
        for (int64_t i = step - 1; i < c->n_layers; i += step) c->layer_dense[i] = 0;
        return 0;
    }
    if (!cJSON_IsArray(a)) return qd_err_set(err, QD_EFORMAT, "%s: moe_layers must be a list of layer indices", what);
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble || e->valuedouble < 0 ||
            e->valuedouble >= (double)c->n_layers)
            return qd_err_set(err, QD_EFORMAT, "%s: moe_layers entries must be layer indices in [0, %lld)", what,
                              (long long)c->n_layers);
        c->layer_dense[(int64_t)e->valuedouble] = 0;
    }
    return 0;
}

/* layer_types: chunked_attention or full_attention per layer; absent, the RoPE layers chunk. */
static int layer_types(const cJSON *root, qd_model_config *c, const char *what, qd_err *err)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *e;
    if (!lt || cJSON_IsNull(lt)) {
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_chunked[i] = !c->layer_nope[i];
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
        return qd_err_set(err, QD_EFORMAT, "%s: layer_types must be a list of num_hidden_layers (%lld) strings", what,
                          (long long)c->n_layers);
    int i = 0;
    cJSON_ArrayForEach(e, lt) {
        if (cJSON_IsString(e) && !strcmp(e->valuestring, "chunked_attention")) c->layer_chunked[i] = 1;
        else if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types[%d] \"%s\" is not supported for %s (chunked_attention, "
                              "full_attention)", what, i, cJSON_IsString(e) ? e->valuestring : "?", c->architecture);
        i++;
    }
    return 0;
}

int qd_config_llama4_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    defaults(root, c);
    if (c->n_layers < 1 || c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is not in 1 to %d", what, (long long)c->n_layers,
                          QD_CFG_MAX_LAYERS);
    /* RoPE: default_theta 500000; Llama4TextRotaryEmbedding multiplies the complex pairs of
     * all of head_dim by the frequencies of the default, linear or llama3 type. */
    c->rope_theta = 500000.0f;
    if ((rc = qd_config_rope_parse(root, what, 0, c, err))) return rc;
    if (c->rope.type != QD_ROPE_DEFAULT && c->rope.type != QD_ROPE_LINEAR && c->rope.type != QD_ROPE_LLAMA3)
    {
        static const char *const names[] = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"};
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"%s\" is not supported for %s (default, linear, llama3)",
                          what, names[c->rope.type], c->architecture);
    }
    if (c->rope.partial_rotary_factor != 1.0f)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (its RoPE turns all "
                          "of head_dim)", what, (double)c->rope.partial_rotary_factor, c->architecture);
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    c->rope_interleave = 1;
    c->layout = QD_LAYOUT_LLAMA4;
    c->o_bias = c->qkv_bias;   /* attention_bias covers o_proj too */
    c->mlp_bias = 0;
    int64_t ff = 8192, ff_mlp = 16384, interval = 4, floor_scale = 8192;
    int qk = 1, tune = 1;
    float attn_scale = 0.1f;
    c->n_experts = 16;
    c->top_k = 1;
    c->attn_chunk = 8192;
    if ((rc = qd_cfg_get_int(root, "intermediate_size", &ff, what, err)) ||
        (rc = qd_cfg_get_int(root, "intermediate_size_mlp", &ff_mlp, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_local_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "no_rope_layer_interval", &interval, what, err)) ||
        (rc = qd_cfg_get_int(root, "attention_chunk_size", &c->attn_chunk, what, err)) ||
        (rc = qd_cfg_get_int(root, "floor_scale", &floor_scale, what, err)) ||
        (rc = qd_cfg_get_float(root, "attn_scale", &attn_scale, what, err)) ||
        (rc = qd_cfg_get_bool(root, "use_qk_norm", &qk, what, err)))
        return rc;
    /* meta-llama's Llama 4 configs write attn_temperature_tuning as a number (4), which
     * Llama4TextAttention reads for its truth: any non-zero number is on. */
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(root, "attn_temperature_tuning");
    if (cJSON_IsNumber(tt)) tune = tt->valuedouble != 0;
    else if ((rc = qd_cfg_get_bool(root, "attn_temperature_tuning", &tune, what, err))) return rc;
    /* Llama4TextModel builds the chunked mask for every forward: without a chunk size
     * transformers itself refuses to run. */
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(root, "attention_chunk_size");
    if (ch && cJSON_IsNull(ch))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: attention_chunk_size null is not supported for %s (transformers "
                          "builds its chunked mask on every forward and needs one)", what, c->architecture);
    if (ff <= 0 || ff_mlp <= 0 || c->attn_chunk <= 0 || interval < 1 || floor_scale <= 0 || !isfinite(attn_scale))
        return qd_err_set(err, QD_EFORMAT, "%s: intermediate_size, intermediate_size_mlp, attention_chunk_size, "
                          "no_rope_layer_interval and floor_scale must be positive", what);
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d) and num_experts_per_tok %lld (1 to the experts) "
                          "must be in range", what, (long long)c->n_experts, QD_MAX_EXPERTS, (long long)c->top_k);
    c->intermediate = ff_mlp;            /* the dense layers' MLP */
    c->moe_intermediate = ff;            /* each expert's, */
    c->shared_intermediate = ff;         /* and the shared expert's (Llama4TextMLP of intermediate_size) */
    c->moe_scoring = QD_MOE_SIGMOID_INPUT;
    c->norm_topk_prob = 0;
    c->routed_scale = 1.0f;
    /* no_rope_layers[i] 1: layer i turns RoPE; by default every interval-th layer does not. */
    unsigned char rope[QD_CFG_MAX_LAYERS];
    int given = layer_flags(root, "no_rope_layers", c, rope, what, err);
    if (given < 0) return given;
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_nope[i] = given ? !rope[i] : (i + 1) % interval == 0;
    if ((rc = moe_layers(root, c, what, err)) || (rc = layer_types(root, c, what, err))) return rc;
    c->qk_l2norm = qk;
    if (tune) {
        c->q_pos_scale_beta = attn_scale;
        c->q_pos_scale_orig = floor_scale;
        c->q_pos_scale_nope = 1;
    }
    /* Keys of other families that would change this forward. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                                          "n_group", "topk_group", "routed_scaling_factor", "scoring_func",
                                          "moe_intermediate_size", "shared_expert_intermediate_size", "sliding_window",
                                          "use_sliding_window", "rope_local_base_freq", "mlp_only_layers", "norm_topk_prob"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 1, what, c->architecture, err))) return rc;
    return 0;
}
