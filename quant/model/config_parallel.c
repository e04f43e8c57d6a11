/* The config keys of the LayerNorm rotary families with a plain (ungated) MLP: StarCoder2,
 * Phi (phi-1/1.5/2) and GPT-NeoX (Pythia), the last two with the parallel block (attention
 * and MLP both read the block's input). Defaults are those of Starcoder2Config, PhiConfig
 * and GPTNeoXConfig in transformers 5, read again here over the Llama defaults config.c
 * filled in (the families' names and values differ: norm_epsilon, layer_norm_eps, rotary_pct,
 * rotary_emb_base). A key that changes the math and that the forward does not compute
 * (Phi's qk_layernorm, another activation) is refused by name. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

typedef struct plain_family {
    const char *arch;
    qd_block_layout layout;
    int64_t vocab, hidden, intermediate, layers, heads, kv_heads, max_pos;
    const char *act;            /* hidden_act's default */
    const char *eps_key;        /* the LayerNorm epsilon's key (default 1e-5 in all three) */
    int tie;                    /* tie_word_embeddings' default */
    float partial;              /* partial_rotary_factor's default */
} plain_family;

static const plain_family families[] = {
    {"Starcoder2ForCausalLM", QD_LAYOUT_STARCODER2, 49152, 3072, 12288, 30, 24, 2, 4096, "gelu_pytorch_tanh",
     "norm_epsilon", 1, 1.0f},
    {"PhiForCausalLM", QD_LAYOUT_PHI, 51200, 2048, 8192, 24, 32, 0, 2048, "gelu_new", "layer_norm_eps", 0, 0.5f},
    {"GPTNeoXForCausalLM", QD_LAYOUT_NEOX, 50432, 6144, 24576, 44, 64, 0, 2048, "gelu", "layer_norm_eps", 0, 0.25f},
};

int qd_config_is_plain_family(const char *arch)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].arch, arch)) return 1;
    return 0;
}

/* The object RoPE's keys come from (rope_parameters, else the legacy rope_scaling), or NULL. */
static const cJSON *rope_object(const cJSON *root)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!cJSON_IsObject(p)) p = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    return cJSON_IsObject(p) ? p : NULL;
}

/* GPT-NeoX names RoPE its own way (GPTNeoXConfig.convert_rope_params_to_dict): the theta is
 * rope_parameters' rope_theta, else rotary_emb_base, else 10000; the rotated share is
 * rope_parameters' partial_rotary_factor, else rotary_pct, else 0.25. Top-level rope_theta
 * and partial_rotary_factor are not read by it, so they are not here either. */
static int neox_rope(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *ro = rope_object(root);
    float theta = 10000.0f, pct = 0.25f;
    int rc;
    if ((rc = qd_cfg_get_float(root, "rotary_emb_base", &theta, what, err)) ||
        (rc = qd_cfg_get_float(root, "rotary_pct", &pct, what, err)))
        return rc;
    if (ro && ((rc = qd_cfg_get_float(ro, "rope_theta", &theta, what, err)) ||
               (rc = qd_cfg_get_float(ro, "partial_rotary_factor", &pct, what, err))))
        return rc;
    if (!(pct > 0 && pct <= 1)) return qd_err_set(err, QD_EFORMAT, "%s: rotary_pct (partial_rotary_factor) must be in (0, 1]", what);
    c->rope_theta = c->rope_theta_local = theta;
    c->rope.partial_rotary_factor = c->rope_local.partial_rotary_factor = pct;
    return 0;
}

int qd_config_plain_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const plain_family *f = NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].arch, c->architecture)) f = &families[i];
    if (!f) return qd_err_set(err, QD_EINVAL, "%s: %s is not a plain-MLP family", what, c->architecture);
    int rc;
    c->layout = f->layout;
    c->mlp_plain = 1;
    /* The Llama defaults config.c read these keys over are not this family's. */
    c->vocab = f->vocab; c->hidden = f->hidden; c->intermediate = f->intermediate; c->n_layers = f->layers;
    c->n_heads = f->heads; c->n_kv_heads = f->kv_heads; c->max_pos = f->max_pos; c->norm_eps = 1e-5f;
    c->tie_word_embeddings = f->tie;
    snprintf(c->activation, sizeof c->activation, "%s", f->act);
    if ((rc = qd_cfg_get_int(root, "vocab_size", &c->vocab, what, err)) ||
        (rc = qd_cfg_get_int(root, "hidden_size", &c->hidden, what, err)) ||
        (rc = qd_cfg_get_int(root, "intermediate_size", &c->intermediate, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_hidden_layers", &c->n_layers, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_attention_heads", &c->n_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "max_position_embeddings", &c->max_pos, what, err)) ||
        (rc = qd_cfg_get_float(root, f->eps_key, &c->norm_eps, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_str(root, "hidden_act", c->activation, sizeof c->activation, what, err)))
        return rc;
    if (f->layout != QD_LAYOUT_NEOX && (rc = qd_cfg_get_int(root, "num_key_value_heads", &c->n_kv_heads, what, err)))
        return rc;
    if (strcmp(c->activation, "gelu") && strcmp(c->activation, "gelu_new") && strcmp(c->activation, "gelu_pytorch_tanh") &&
        strcmp(c->activation, "relu"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported for %s (gelu, gelu_new, "
                          "gelu_pytorch_tanh, relu)", what, c->activation, c->architecture);
    /* RoPE: one for every layer; the rotated share is the family's default unless given. */
    if ((rc = qd_config_rope_parse(root, what, 0, c, err))) return rc;
    const cJSON *ro = rope_object(root);
    if (!cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor") &&
        !(ro && cJSON_GetObjectItemCaseSensitive(ro, "partial_rotary_factor")))
        c->rope.partial_rotary_factor = c->rope_local.partial_rotary_factor = f->partial;
    if (f->layout == QD_LAYOUT_NEOX && (rc = neox_rope(root, what, c, err))) return rc;
    if (c->rope.type == QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only, not %s",
                          what, c->architecture);
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *e;
    if (!cJSON_IsArray(lt)) lt = NULL;
    cJSON_ArrayForEach(e, lt)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types with \"%s\" layers is not supported for %s", what,
                              cJSON_IsString(e) ? e->valuestring : "?", c->architecture);

    if (f->layout == QD_LAYOUT_STARCODER2) {
        /* use_bias: every linear's bias; sliding_window (null: none) on every layer. */
        int use_bias = 1;
        if ((rc = qd_cfg_get_bool(root, "use_bias", &use_bias, what, err)) ||
            (rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)))
            return rc;
        c->qkv_bias = c->o_bias = c->mlp_bias = use_bias;
        if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
        if (c->sliding_window > 0 && c->n_layers > QD_CFG_MAX_LAYERS)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                              (long long)c->n_layers, QD_CFG_MAX_LAYERS);
        for (int64_t i = 0; c->sliding_window > 0 && i < c->n_layers; i++) c->layer_sliding[i] = 1;
    } else if (f->layout == QD_LAYOUT_PHI) {
        /* Every linear has a bias, lm_head too; q_layernorm / k_layernorm are not computed. */
        int qk_ln = 0;
        if ((rc = qd_cfg_get_bool(root, "qk_layernorm", &qk_ln, what, err))) return rc;
        if (qk_ln)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: qk_layernorm true (LayerNorm of each query and key head) is not "
                              "supported for %s", what, c->architecture);
        c->qkv_bias = c->o_bias = c->mlp_bias = 1;
        c->lm_head_bias = 1;
        c->parallel_block = 1;
    } else {
        /* GPT-NeoX: attention_bias covers query_key_value and dense, the MLP always has
         * biases; the head size is always hidden / heads, one key and value per head. */
        int attn_bias = 1, parallel = 1;
        if ((rc = qd_cfg_get_bool(root, "attention_bias", &attn_bias, what, err)) ||
            (rc = qd_cfg_get_bool(root, "use_parallel_residual", &parallel, what, err)))
            return rc;
        c->qkv_bias = c->o_bias = attn_bias;
        c->mlp_bias = 1;
        c->parallel_block = parallel;
        c->n_kv_heads = c->n_heads;
        if (c->n_heads > 0 && c->head_dim && c->head_dim * c->n_heads != c->hidden)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: head_dim %lld is not hidden_size / num_attention_heads, the "
                              "head size %s always uses", what, (long long)c->head_dim, c->architecture);
        c->head_dim = 0;   /* hidden / heads (config.c) */
    }
    /* Gemma's keys, which these families do not have. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, foreign[i]);
        if (v && !cJSON_IsNull(v))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s is set, which %s does not have; not supported", what, foreign[i],
                              c->architecture);
    }
    return 0;
}
