/* The config keys of the post-norm families (see config_internal.h): OLMo 2 and OLMo 3
 * (no norm before attention or the MLP, one on each sub-block's output, q_norm/k_norm over
 * the whole projections), EXAONE 4 (the same block with per-head q/k norms and sliding
 * layers whose global ones take no RoPE) and GLM-4 (a norm before and after each
 * sub-block, fused gate_up_proj, RoPE on interleaved pairs of part of each head).
 * Defaults are the transformers config classes' (Olmo2Config, Olmo3Config, Exaone4Config,
 * Glm4Config); where they differ from LlamaConfig's, which config.c starts from, a key
 * left out takes the family's. */
#include <cjson/cJSON.h>
#include <string.h>

#include "quant/model/config_internal.h"

typedef enum pn_kind { PN_NONE = 0, PN_OLMO2, PN_OLMO3, PN_EXAONE4, PN_GLM4 } pn_kind;

static pn_kind kind_of(const char *arch)
{
    if (!strcmp(arch, "Olmo2ForCausalLM")) return PN_OLMO2;
    if (!strcmp(arch, "Olmo3ForCausalLM")) return PN_OLMO3;
    if (!strcmp(arch, "Exaone4ForCausalLM")) return PN_EXAONE4;
    if (!strcmp(arch, "Glm4ForCausalLM")) return PN_GLM4;
    return PN_NONE;
}

int qd_config_postnorm_is(const char *architecture)
{
    return kind_of(architecture) != PN_NONE;
}

/* The class defaults that differ from LlamaConfig's, for the keys config.json leaves out. */
static void class_defaults(const cJSON *root, pn_kind k, qd_model_config *c)
{
    if (qd_cfg_absent(root, "rms_norm_eps")) c->norm_eps = k == PN_GLM4 ? 1.5625e-7f : 1e-5f;
    if (qd_cfg_absent(root, "vocab_size")) c->vocab = k == PN_GLM4 ? 151552 : k == PN_EXAONE4 ? 102400 : 50304;
    if (k == PN_EXAONE4) {
        if (qd_cfg_absent(root, "intermediate_size")) c->intermediate = 16384;
        if (qd_cfg_absent(root, "num_key_value_heads")) c->n_kv_heads = 32;
        c->qkv_bias = c->o_bias = c->mlp_bias = 0;   /* no bias keys: nn.Linear(..., bias=False) */
    }
    if (k == PN_GLM4) {
        if (qd_cfg_absent(root, "intermediate_size")) c->intermediate = 13696;
        if (qd_cfg_absent(root, "num_hidden_layers")) c->n_layers = 40;
        if (qd_cfg_absent(root, "num_key_value_heads")) c->n_kv_heads = 2;
        if (qd_cfg_absent(root, "head_dim")) c->head_dim = 128;
        if (qd_cfg_absent(root, "max_position_embeddings")) c->max_pos = 131072;
        if (qd_cfg_absent(root, "attention_bias")) c->qkv_bias = 1;
        c->o_bias = 0;    /* o_proj and the MLP never have biases */
        c->mlp_bias = 0;
    }
    if (k == PN_OLMO2 || k == PN_OLMO3) c->mlp_bias = 0;   /* attention_bias covers q/k/v/o; the MLP has none */
}

/* layer_types as written (sliding_attention / full_attention); 1 when given. */
static int read_layer_types(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    return qd_cfg_layer_types_sliding(root, what, c, err);
}

/* sliding_window: the class default, an integer, or null (none). */
static int read_window(const cJSON *root, int64_t dflt, const char *what, qd_model_config *c, qd_err *err)
{
    c->sliding_window = dflt;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && cJSON_IsNull(sw)) { c->sliding_window = 0; return 0; }
    int rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err);
    if (!rc && c->sliding_window <= 0)
        rc = qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    return rc;
}

/* transformers builds a sliding-window mask from config.sliding_window for every sliding
 * layer and fails without one; quantd refuses the same config instead. */
static int check_window(const char *what, qd_model_config *c, qd_err *err)
{
    for (int64_t i = 0; i < c->n_layers; i++)
        if (c->layer_sliding[i] && c->sliding_window <= 0)
            return qd_err_set(err, QD_EFORMAT, "%s: layer_types has sliding_attention layers but sliding_window is null",
                              what);
    return 0;
}

/* OLMo 3: layer_types (default: every 4th layer full, the others sliding) and one RoPE per
 * layer type. transformers 5 writes rope_parameters per type; an older file's rope_theta
 * and rope_scaling apply to the full layers only (Olmo3Config.convert_rope_params_to_dict
 * pops rope_theta for them), the sliding ones keeping plain RoPE with default_theta. */
static int parse_olmo3(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc = read_window(root, 4096, what, c, err);
    if (rc) return rc;
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    if ((rc = read_layer_types(root, what, c, err)) < 0) return rc;
    if (rc == 0)
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % 4 != 0;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (params && !cJSON_IsNull(params) && !cJSON_GetObjectItemCaseSensitive(params, "full_attention") &&
        !cJSON_GetObjectItemCaseSensitive(params, "sliding_attention"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_parameters without full_attention / sliding_attention entries is "
                          "not supported for %s (transformers reads it per layer type)", what, c->architecture);
    if (!params || cJSON_IsNull(params)) {
        /* Legacy rope_scaling: the full layers' only. */
        c->rope_local = c->rope;
        c->rope_local.type = QD_ROPE_DEFAULT;
        c->rope_local.factor = 1.0f;
        c->rope_local.has_factor = 0;
        c->rope_local.attention_factor = 0.0f;
        c->rope_local.n_factors = 0;
        c->rope_theta_local = 500000.0f;
    }
    return check_window(what, c, err);
}

/* EXAONE 4: layer_types, or sliding_window_pattern (an integer n: every n-th layer is full,
 * default 4) when they are absent; with a sliding_window, the full layers take no RoPE
 * (NoPE), and without one every layer is full and rotary (Exaone4Attention). A pattern
 * string ("LLLG") without layer_types is what transformers' config cannot read either. */
static int parse_exaone4(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc = read_window(root, 4096, what, c, err);
    if (rc) return rc;
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    if ((rc = read_layer_types(root, what, c, err)) < 0) return rc;
    if (rc == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "sliding_window_pattern");
        if (p && !cJSON_IsNull(p) && !cJSON_IsNumber(p))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: sliding_window_pattern %s without layer_types is not supported "
                              "(an integer, or layer_types)", what, cJSON_IsString(p) ? p->valuestring : "(not a number)");
        int64_t pattern = 4;
        if ((rc = qd_cfg_get_int(root, "sliding_window_pattern", &pattern, what, err))) return rc;
        if (c->sliding_window <= 0 || pattern <= 0)
            return qd_err_set(err, QD_EFORMAT, "%s: without layer_types, sliding_window and sliding_window_pattern must be "
                              "positive (transformers divides by the pattern)", what);
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % pattern != 0;
    }
    if ((rc = check_window(what, c, err))) return rc;
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_nope[i] = c->sliding_window > 0 && !c->layer_sliding[i];
    c->qk_norm = QD_QK_NORM_HEAD;
    return 0;
}

/* GLM-4: partial_rotary_factor defaults to 0.5 (Glm4Config sets it when the file does not),
 * and RoPE turns the pairs (x0, x1), (x2, x3), ... of the rotated part. */
static void glm4_rope(const cJSON *root, qd_model_config *c)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    int given = !qd_cfg_absent(root, "partial_rotary_factor") ||
                (cJSON_IsObject(params) && !qd_cfg_absent(params, "partial_rotary_factor"));
    if (!given) c->rope.partial_rotary_factor = c->rope_local.partial_rotary_factor = 0.5f;
    c->rope_interleave = 1;
}

int qd_config_postnorm_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    pn_kind k = kind_of(c->architecture);
    int rc;
    class_defaults(root, k, c);
    /* OLMo 3's default_theta is 500000; the others keep 10000. */
    if (k == PN_OLMO3) c->rope_theta = c->rope_theta_local = 500000.0f;
    if ((rc = qd_config_rope_parse(root, what, k == PN_OLMO3, c, err))) return rc;
    if (c->rope.type == QD_ROPE_LONGROPE || c->rope_local.type == QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only, not %s",
                          what, c->architecture);
    if (!(c->rope_theta > 0) || !(c->rope_theta_local > 0))
        return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    /* Only GLM-4's rotary embedding reads partial_rotary_factor. */
    if (k != PN_GLM4 && (c->rope.partial_rotary_factor != 1.0f || c->rope_local.partial_rotary_factor != 1.0f))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (it rotates every "
                          "dim of a head)", what, (double)c->rope.partial_rotary_factor, c->architecture);
    /* Keys of other families that would change the math here. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                                          "rope_local_base_freq"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    switch (k) {
    case PN_OLMO2:
    case PN_OLMO3:
        c->layout = QD_LAYOUT_POSTNORM;
        c->qk_norm = QD_QK_NORM_WHOLE;
        if (k == PN_OLMO3) return parse_olmo3(root, what, c, err);
        {
            static const char *const olmo2[] = {"sliding_window", "layer_types"};
            return qd_cfg_refuse_foreign(root, olmo2, 2, 0, what, c->architecture, err);
        }
    case PN_EXAONE4:
        c->layout = QD_LAYOUT_POSTNORM;
        return parse_exaone4(root, what, c, err);
    case PN_GLM4:
        c->layout = QD_LAYOUT_GLM4;
        glm4_rope(root, c);
        {
            static const char *const glm4[] = {"sliding_window", "layer_types"};
            return qd_cfg_refuse_foreign(root, glm4, 2, 0, what, c->architecture, err);
        }
    default:
        return qd_err_set(err, QD_EINVAL, "%s: %s is not a post-norm family", what, c->architecture);
    }
}
