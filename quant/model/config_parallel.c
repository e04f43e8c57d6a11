/* The config keys of the LayerNorm rotary families with a plain (ungated) MLP: StarCoder2,
 * Phi (phi-1/1.5/2) and GPT-NeoX (Pythia), the last two with the parallel block (attention
 * and MLP both read the block's input); and Cohere2, a parallel block with SwiGLU. Defaults are those of Starcoder2Config, PhiConfig
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
    return !strcmp(arch, "Cohere2ForCausalLM");
}

/* Cohere2 (Command R7B; Cohere2Config's defaults): the parallel block from one mean-centred
 * LayerNorm without bias (Cohere2LayerNorm), llama attention and SwiGLU, interleaved RoPE
 * pairs (repeat_interleave of the frequencies) on the sliding layers only (the full ones
 * have none), layer_types or the older
 * sliding_window_pattern (4), the head size always hidden / heads (__post_init__ sets it),
 * logits times logit_scale. */
static int parse_cohere2(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = QD_LAYOUT_COHERE2;
    c->vocab = 256000; c->hidden = 8192; c->intermediate = 22528; c->n_layers = 40; c->n_heads = 64;
    c->n_kv_heads = 0; c->max_pos = 8192; c->norm_eps = 1e-5f; c->tie_word_embeddings = 1;
    c->qkv_bias = 0; c->logit_scale = 0.0625f; c->sliding_window = 4096;
    strcpy(c->activation, "silu");
    if ((rc = qd_cfg_get_int(root, "vocab_size", &c->vocab, what, err)) ||
        (rc = qd_cfg_get_int(root, "hidden_size", &c->hidden, what, err)) ||
        (rc = qd_cfg_get_int(root, "intermediate_size", &c->intermediate, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_hidden_layers", &c->n_layers, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_attention_heads", &c->n_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_key_value_heads", &c->n_kv_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "max_position_embeddings", &c->max_pos, what, err)) ||
        (rc = qd_cfg_get_float(root, "layer_norm_eps", &c->norm_eps, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_bool(root, "attention_bias", &c->qkv_bias, what, err)) ||
        (rc = qd_cfg_get_float(root, "logit_scale", &c->logit_scale, what, err)) ||
        (rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)) ||
        (rc = qd_cfg_get_str(root, "hidden_act", c->activation, sizeof c->activation, what, err)))
        return rc;
    c->o_bias = c->qkv_bias;
    c->mlp_bias = 0;
    c->parallel_block = 1;
    c->rope_interleave = 1;
    c->head_dim = 0;   /* hidden / heads (config.c), whatever head_dim says */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && cJSON_IsNull(sw)) c->sliding_window = 0;
    if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    if (strcmp(c->activation, "silu"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported for %s (silu)", what, c->activation,
                          c->architecture);
    if (!(c->logit_scale > 0)) return qd_err_set(err, QD_EUNSUPPORTED, "%s: logit_scale must be positive", what);
    if ((rc = qd_config_rope_parse(root, what, 0, c, err))) return rc;
    /* Cohere2's RoPE turns the whole head (compute_default_rope_parameters reads no
     * partial_rotary_factor). */
    if (c->rope.partial_rotary_factor != 1.0f)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (the whole head "
                          "turns)", what, (double)c->rope.partial_rotary_factor, c->architecture);
    if (c->rope.type == QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only, not %s",
                          what, c->architecture);
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    int given = qd_cfg_layer_types_sliding(root, what, c, err);
    if (given < 0) return given;
    if (!given) {
        int64_t pattern = 4;
        if ((rc = qd_cfg_get_int(root, "sliding_window_pattern", &pattern, what, err))) return rc;
        if (pattern <= 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window_pattern must be positive", what);
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % pattern != 0;
    }
    /* RoPE only where the layer has a window (Cohere2Attention applies it when its
     * sliding_window is not None); transformers cannot build the sliding layers' mask
     * without a window, so neither is guessed here. */
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->layer_sliding[i] && c->sliding_window == 0)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: sliding_window null with sliding_attention layers is not "
                              "supported for %s (transformers has no window for their mask)", what, c->architecture);
        c->layer_nope[i] = !c->layer_sliding[i];
    }
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
    if (!strcmp(c->architecture, "Cohere2ForCausalLM")) return parse_cohere2(root, what, c, err);
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
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    return 0;
}
