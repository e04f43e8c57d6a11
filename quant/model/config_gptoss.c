/* gpt-oss (GptOssForCausalLM) config keys, with GptOssConfig's defaults (transformers 5):
 * a config.json that leaves a key out means what it means to transformers. The block is
 * Llama attention with q/k/v/o biases and learned sinks, sliding and full layers by
 * layer_types (alternating from a sliding first layer when absent), YaRN RoPE (factor 32
 * over 4096 positions, beta 32/1, truncate false, base 150000 when absent), and a MoE MLP
 * of every layer: a router with a bias whose top num_experts_per_tok logits are
 * softmaxed, and intermediate_size-wide experts with biases and the clamped SwiGLU
 * (swiglu_alpha, swiglu_limit). A key that changes the math in a way this forward does not
 * compute is refused by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

/* A key absent from config.json takes GptOssConfig's default; present, config.c read it. */
static void defaults(const cJSON *root, qd_model_config *c)
{
    if (qd_cfg_absent(root, "hidden_size")) c->hidden = 2880;
    if (qd_cfg_absent(root, "intermediate_size")) c->intermediate = 2880;
    if (qd_cfg_absent(root, "num_hidden_layers")) c->n_layers = 36;
    if (qd_cfg_absent(root, "num_attention_heads")) c->n_heads = 64;
    if (qd_cfg_absent(root, "num_key_value_heads")) c->n_kv_heads = 8;
    if (qd_cfg_absent(root, "head_dim")) c->head_dim = 64;
    if (qd_cfg_absent(root, "vocab_size")) c->vocab = 201088;
    if (qd_cfg_absent(root, "max_position_embeddings")) c->max_pos = 131072;
    if (qd_cfg_absent(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
    if (qd_cfg_absent(root, "attention_bias")) c->qkv_bias = 1;
}

static int parse_layer_types(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    int r = qd_cfg_layer_types_sliding(root, what, c, err);
    if (r < 0) return r;
    for (int64_t i = 0; !r && i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % 2 != 0;
    return 0;
}

int qd_config_gptoss_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    defaults(root, c);
    /* RoPE: GptOssConfig's YaRN when config.json has neither spelling; theta 150000
     * (default_theta) where neither the top level nor rope_parameters gives one. */
    c->rope_theta = 150000.0f;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if ((!params || cJSON_IsNull(params)) && (!legacy || cJSON_IsNull(legacy))) {
        cJSON *r = cJSON_Duplicate(root, 1);
        cJSON *y = r ? cJSON_Parse("{\"rope_type\":\"yarn\",\"factor\":32.0,\"beta_fast\":32.0,\"beta_slow\":1.0,"
                                   "\"truncate\":false,\"original_max_position_embeddings\":4096}") : NULL;
        if (!y || (!cJSON_ReplaceItemInObjectCaseSensitive(r, "rope_parameters", y) &&
                   !cJSON_AddItemToObject(r, "rope_parameters", y))) {
            cJSON_Delete(y);
            cJSON_Delete(r);
            return qd_err_set(err, QD_ENOMEM, "%s: out of memory", what);
        }
        rc = qd_config_rope_parse(r, what, 0, c, err);
        cJSON_Delete(r);
    } else {
        rc = qd_config_rope_parse(root, what, 0, c, err);
    }
    if (rc) return rc;
    if (c->rope.type == QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only, not %s",
                          what, c->architecture);
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    c->layout = QD_LAYOUT_GPT_OSS;
    /* GptOssExperts never reads hidden_act (its activation is the clamped SwiGLU below). */
    strcpy(c->activation, "silu");
    c->o_bias = c->qkv_bias;   /* attention_bias covers o_proj too */
    c->attn_sinks = 1;
    c->sliding_window = 128;
    c->n_experts = 128;
    c->top_k = 4;
    c->moe_scoring = QD_MOE_TOPK_SOFTMAX;
    c->swiglu_alpha = 1.702f;
    c->swiglu_limit = 7.0f;
    if ((rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_local_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_float(root, "swiglu_alpha", &c->swiglu_alpha, what, err)) ||
        (rc = qd_cfg_get_float(root, "swiglu_limit", &c->swiglu_limit, what, err)))
        return rc;
    /* sliding_window null: GptOssAttention then gives the sliding layers no window. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && cJSON_IsNull(sw)) c->sliding_window = 0;
    if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    if ((rc = parse_layer_types(root, what, c, err))) return rc;
    c->moe_intermediate = c->intermediate;
    c->mlp_bias = 1;            /* the experts' biases */
    c->norm_topk_prob = 0;      /* the softmax over the chosen logits sums to 1 already */
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d) and num_experts_per_tok %lld (1 to the experts) "
                          "must be in range", what, (long long)c->n_experts, QD_MAX_EXPERTS, (long long)c->top_k);
    if (!(c->swiglu_alpha > 0 && isfinite(c->swiglu_alpha)) || !(c->swiglu_limit > 0 && isfinite(c->swiglu_limit)))
        return qd_err_set(err, QD_EFORMAT, "%s: swiglu_alpha and swiglu_limit must be positive numbers", what);
    /* Keys of other families that would change this forward. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                                          "n_group", "topk_group", "routed_scaling_factor", "scoring_func",
                                          "moe_intermediate_size", "shared_expert_intermediate_size", "use_sliding_window",
                                          "rope_local_base_freq", "mlp_only_layers"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 1, what, c->architecture, err))) return rc;
    return 0;
}
