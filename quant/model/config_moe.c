/* The config keys of the MoE families with standard attention added after DeepSeek:
 * GLM-4.5/4.6 (Glm4MoeConfig), dots.llm1 (Dots1Config), OLMoE (OlmoeConfig), MiniMax-M2
 * (MiniMaxM2Config), ERNIE 4.5 MoE (Ernie4_5_MoeConfig) and PhiMoE (PhimoeConfig). Defaults are those config
 * classes' in transformers 5.23; keys the forward does not compute are refused by name. Called from qd_config_family_parse once
 * RoPE is read; the family's whole parse is here, so the generic Llama checks there
 * (layer_types, sliding windows) do not apply to these families. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

typedef enum moe_kind { MK_NONE = 0, MK_GLM4_MOE, MK_DOTS1, MK_OLMOE, MK_MINIMAX_M2, MK_ERNIE_MOE, MK_PHIMOE } moe_kind;

static moe_kind kind_of(const char *arch)
{
    if (!strcmp(arch, "Glm4MoeForCausalLM")) return MK_GLM4_MOE;
    if (!strcmp(arch, "Dots1ForCausalLM")) return MK_DOTS1;
    if (!strcmp(arch, "OlmoeForCausalLM")) return MK_OLMOE;
    if (!strcmp(arch, "MiniMaxM2ForCausalLM")) return MK_MINIMAX_M2;
    if (!strcmp(arch, "Ernie4_5_MoeForCausalLM")) return MK_ERNIE_MOE;
    if (!strcmp(arch, "PhimoeForCausalLM")) return MK_PHIMOE;
    return MK_NONE;
}

int qd_config_moe_owns(const char *architecture) { return kind_of(architecture) != MK_NONE; }

/* Whether key is given at the top level or inside rope_parameters / rope_scaling. */
static int rope_key_given(const cJSON *root, const char *key)
{
    if (cJSON_GetObjectItemCaseSensitive(root, key)) return 1;
    static const char *const objs[] = {"rope_parameters", "rope_scaling"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, objs[i]);
        if (cJSON_IsObject(o) && cJSON_GetObjectItemCaseSensitive(o, key)) return 1;
    }
    return 0;
}

static void set_partial_rotary(qd_model_config *c, float f)
{
    c->rope.partial_rotary_factor = f;
    c->rope_local.partial_rotary_factor = f;
}

/* A string key that, when present (not null), must be one of want (NULL-terminated). */
static int require_one_of(const cJSON *root, const char *key, const char *const *want, const char *what, qd_err *err)
{
    char v[48] = "";
    int rc = qd_cfg_get_str(root, key, v, sizeof v, what, err);
    if (rc || !v[0]) return rc;
    for (size_t i = 0; want[i]; i++)
        if (!strcmp(v, want[i])) return 0;
    return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s \"%s\" is not supported (%s)", what, key, v, want[0]);
}

/* DeepSeek-V3's routing check: the kept groups must hold top_k experts, and a group is
 * scored by the sum of its two best, so each holds 2 or more. */
static int check_routing(const qd_model_config *c, int64_t n_shared, const char *what, qd_err *err)
{
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
        c->moe_intermediate <= 0 || n_shared < 0 || c->first_dense < 0)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d), num_experts_per_tok %lld (1 to the experts), the "
                          "expert widths, n_shared_experts and first_k_dense_replace must be in range", what,
                          (long long)c->n_experts, QD_MAX_EXPERTS, (long long)c->top_k);
    if (c->moe_scoring == QD_MOE_SIGMOID_GROUPED &&
        (c->n_group < 1 || c->n_experts % c->n_group || c->n_experts / c->n_group < 2 || c->topk_group < 1 ||
         c->topk_group > c->n_group || c->top_k > c->topk_group * (c->n_experts / c->n_group)))
        return qd_err_set(err, QD_EFORMAT, "%s: n_group %lld must divide the %lld experts into groups of 2 or more, and "
                          "topk_group %lld (1 to n_group) groups must hold num_experts_per_tok %lld experts", what,
                          (long long)c->n_group, (long long)c->n_experts, (long long)c->topk_group, (long long)c->top_k);
    if (!(c->routed_scale > 0 && isfinite(c->routed_scale)))
        return qd_err_set(err, QD_EFORMAT, "%s: routed_scaling_factor must be positive", what);
    return 0;
}

/* Dots1Config's layers: layer_types as written, or sliding from max_window_layers on when
 * sliding_window is set (its __post_init__). */
static int dots1_layers(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int64_t max_window = 62;
    int rc;
    c->sliding_window = 4096;
    if ((rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)) ||
        (rc = qd_cfg_get_int(root, "max_window_layers", &max_window, what, err)))
        return rc;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && cJSON_IsNull(sw)) c->sliding_window = 0;
    if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    int given = qd_cfg_layer_types_sliding(root, what, c, err);
    if (given < 0) return given;
    if (!given) {
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = c->sliding_window > 0 && i >= max_window;
    }
    /* A window on no layer changes nothing; one on a layer with sliding_window null is
     * transformers' "no window" (None). */
    return 0;
}

/* GLM-4.5 and dots.llm1: DeepSeek-V3's MoE (sigmoid routing with e_score_correction_bias,
 * grouped choice, renormalised as asked, times routed_scaling_factor, plus
 * n_shared_experts ungated) after first_k_dense_replace dense layers. */
static int parse_deepseek_like(const cJSON *root, const char *what, moe_kind k, qd_model_config *c, qd_err *err)
{
    int rc;
    int glm = k == MK_GLM4_MOE;
    int64_t n_shared = glm ? 1 : -1;
    c->layout = QD_LAYOUT_MOE_SHARED;
    c->moe_scoring = QD_MOE_SIGMOID_GROUPED;
    /* Glm4MoeConfig's defaults; Dots1Config leaves the experts' counts None (required). */
    c->n_experts = glm ? 128 : 0;
    c->top_k = glm ? 8 : 0;
    c->moe_intermediate = 1408;
    c->norm_topk_prob = glm;
    c->n_group = 1;
    c->topk_group = 1;
    c->routed_scale = 1.0f;
    c->first_dense = glm ? 1 : 0;
    if ((rc = qd_cfg_get_int(root, "n_routed_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_intermediate_size", &c->moe_intermediate, what, err)) ||
        (rc = qd_cfg_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, what, err)) ||
        (rc = qd_cfg_get_int(root, "n_group", &c->n_group, what, err)) ||
        (rc = qd_cfg_get_int(root, "topk_group", &c->topk_group, what, err)) ||
        (rc = qd_cfg_get_float(root, "routed_scaling_factor", &c->routed_scale, what, err)) ||
        (rc = qd_cfg_get_int(root, "first_k_dense_replace", &c->first_dense, what, err)) ||
        (rc = qd_cfg_get_int(root, "n_shared_experts", &n_shared, what, err)))
        return rc;
    if (!glm && (c->n_experts == 0 || c->top_k == 0 || n_shared < 0))
        return qd_err_set(err, QD_EFORMAT, "%s: n_routed_experts, num_experts_per_tok and n_shared_experts are required "
                          "for %s (Dots1Config has no defaults for them)", what, c->architecture);
    /* The original checkpoints' configs name the routing; transformers computes this one only. */
    static const char *const sigmoid[] = {"sigmoid", NULL}, *const noaux[] = {"noaux_tc", NULL};
    if ((rc = require_one_of(root, "scoring_func", sigmoid, what, err)) ||
        (rc = require_one_of(root, "topk_method", noaux, what, err)))
        return rc;
    if ((rc = check_routing(c, n_shared, what, err))) return rc;
    c->shared_intermediate = n_shared * c->moe_intermediate;
    c->mlp_bias = 0;
    if (glm) {
        /* q/k/v take attention_bias, o_proj never; use_qk_norm per head; RoPE on
         * partial_rotary_factor of head_dim, 0.5 unless given (Glm4MoeConfig). */
        int qk = 0;
        if ((rc = qd_cfg_get_bool(root, "use_qk_norm", &qk, what, err))) return rc;
        c->qk_norm = qk ? QD_QK_NORM_HEAD : 0;
        c->o_bias = 0;
        if (!cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
        if (!rope_key_given(root, "partial_rotary_factor")) set_partial_rotary(c, 0.5f);
        return 0;
    }
    /* dots.llm1: Qwen3's attention, o_proj biased with attention_bias too. */
    c->qk_norm = QD_QK_NORM_HEAD;
    c->o_bias = c->qkv_bias;
    return dots1_layers(root, what, c, err);
}

/* OLMoE: softmax top-k over num_experts of width intermediate_size, renormalised with
 * norm_topk_prob (default false); q_norm and k_norm over the whole projections. */
static int parse_olmoe(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = QD_LAYOUT_QWEN_MOE;
    c->moe_scoring = QD_MOE_SOFTMAX;
    c->n_experts = 64;
    c->top_k = 8;
    c->moe_intermediate = c->intermediate;
    c->norm_topk_prob = 0;
    if ((rc = qd_cfg_get_int(root, "num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, what, err)))
        return rc;
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(root, "clip_qkv");
    if (clip && !cJSON_IsNull(clip))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: clip_qkv is set (q, k, v clamped); not supported for %s", what,
                          c->architecture);
    /* q_norm is [hidden_size] and k_norm [hidden / heads * kv heads]: they fit the
     * projections only when head_dim is hidden / heads. */
    if (c->head_dim && c->head_dim * c->n_heads != c->hidden)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: head_dim %lld with %lld heads is not hidden_size %lld; OLMoE's q/k "
                          "norms span hidden_size", what, (long long)c->head_dim, (long long)c->n_heads,
                          (long long)c->hidden);
    if (!cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
    c->qk_norm = QD_QK_NORM_WHOLE;
    c->mlp_bias = 0;
    return check_routing(c, 0, what, err);
}

/* MiniMax-M2: sigmoid routing with e_score_correction_bias over all experts (no groups),
 * always renormalised; q/k norms over all heads; rotary_dim of head_dim turned. */
static int parse_minimax_m2(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = QD_LAYOUT_MINIMAX;
    c->moe_scoring = QD_MOE_SIGMOID_GROUPED;
    c->n_group = 1;
    c->topk_group = 1;
    c->routed_scale = 1.0f;
    c->norm_topk_prob = 1;
    c->n_experts = 256;
    c->top_k = 8;
    c->moe_intermediate = c->intermediate;
    if (!cJSON_GetObjectItemCaseSensitive(root, "head_dim")) c->head_dim = 128;
    if ((rc = qd_cfg_get_int(root, "num_local_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)))
        return rc;
    /* The original config's keys for what transformers' MiniMaxM2 always does. */
    static const char *const per_layer[] = {"per_layer", NULL}, *const sigmoid[] = {"sigmoid", NULL};
    if ((rc = require_one_of(root, "qk_norm_type", per_layer, what, err)) ||
        (rc = require_one_of(root, "scoring_func", sigmoid, what, err)))
        return rc;
    static const char *const must_be_true[] = {"use_qk_norm", "use_routing_bias"};
    for (size_t i = 0; i < 2; i++) {
        int on = 1;
        if ((rc = qd_cfg_get_bool(root, must_be_true[i], &on, what, err))) return rc;
        if (!on)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s false is not supported for %s (transformers always applies it)",
                              what, must_be_true[i], c->architecture);
    }
    int64_t shared = 0;
    if ((rc = qd_cfg_get_int(root, "shared_intermediate_size", &shared, what, err))) return rc;
    if (shared > 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: shared_intermediate_size %lld (a shared expert) is not supported for %s",
                          what, (long long)shared, c->architecture);
    /* attn_type_list: 1 is softmax attention; 0 (MiniMax-01's lightning attention) is not. */
    const cJSON *atl = cJSON_GetObjectItemCaseSensitive(root, "attn_type_list"), *e;
    if (!cJSON_IsArray(atl)) atl = NULL;
    cJSON_ArrayForEach(e, atl)
        if (!cJSON_IsNumber(e) || e->valuedouble != 1)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: attn_type_list with linear-attention layers (0) is not supported "
                              "for %s", what, c->architecture);
    /* RoPE: theta 5e6 unless given; rotary_dim / head_dim turned unless partial_rotary_factor is given. */
    if (!rope_key_given(root, "rope_theta")) c->rope_theta = c->rope_theta_local = 5000000.0f;
    int64_t rotary = 0;
    if ((rc = qd_cfg_get_int(root, "rotary_dim", &rotary, what, err))) return rc;
    if (!rope_key_given(root, "partial_rotary_factor") && rotary) {
        if (rotary < 0 || rotary > c->head_dim)
            return qd_err_set(err, QD_EFORMAT, "%s: rotary_dim %lld must be in [1, head_dim %lld]", what, (long long)rotary,
                              (long long)c->head_dim);
        set_partial_rotary(c, (float)rotary / (float)c->head_dim);
    }
    c->qk_norm = QD_QK_NORM_WHOLE;
    c->qkv_bias = c->o_bias = c->mlp_bias = 0;
    return check_routing(c, 0, what, err);
}

/* ERNIE 4.5 MoE: layer i is MoE when (i + 1) % moe_layer_interval == 0 and it lies in
 * [moe_layer_start_index, moe_layer_end_index] (-1: the last layer), else a dense SwiGLU;
 * softmax routing whose choice adds mlp.moe_statics.e_score_correction_bias, the chosen
 * probabilities renormalised; moe_num_shared_experts ungated; RoPE on interleaved pairs. */
static int parse_ernie_moe(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t n_shared = 2, start = 1, end = -1, interval = 1;
    int use_bias = 0;
    c->layout = QD_LAYOUT_ERNIE_MOE;
    c->moe_scoring = QD_MOE_SOFTMAX_BIAS;
    c->norm_topk_prob = 1;
    c->routed_scale = 1.0f;
    c->n_experts = 64;
    c->top_k = 6;
    c->moe_intermediate = 1536;
    c->rope_interleave = 1;
    /* num_experts and num_experts_per_tok are Ernie4_5_MoeConfig's aliases (attribute_map). */
    if ((rc = qd_cfg_get_int(root, "num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_k", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_intermediate_size", &c->moe_intermediate, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_num_shared_experts", &n_shared, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_layer_start_index", &start, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_layer_end_index", &end, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_layer_interval", &interval, what, err)) ||
        (rc = qd_cfg_get_bool(root, "use_bias", &use_bias, what, err)))
        return rc;
    /* use_bias puts a bias on every linear, lm_head included, which the forward has not. */
    if (use_bias)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: use_bias true is not supported for %s (biases on every linear and "
                          "lm_head)", what, c->architecture);
    if (end == -1) end = c->n_layers - 1;
    if (interval < 1 || start < 0 || end < start)
        return qd_err_set(err, QD_EFORMAT, "%s: moe_layer_interval %lld must be positive and moe_layer_start_index %lld "
                          "at most moe_layer_end_index %lld", what, (long long)interval, (long long)start, (long long)end);
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_dense[i] = !((i + 1) % interval == 0 && i >= start && i <= end);
    /* Ernie4_5_MoeRotaryEmbedding turns all of head_dim whatever partial_rotary_factor says. */
    if (rope_key_given(root, "partial_rotary_factor") && c->rope.partial_rotary_factor != 1.0f)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (its RoPE turns all "
                          "of head_dim)", what, (double)c->rope.partial_rotary_factor, c->architecture);
    if (!rope_key_given(root, "rope_theta")) c->rope_theta = c->rope_theta_local = 500000.0f;
    if (!cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
    if (!cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings")) c->tie_word_embeddings = 1;
    c->qkv_bias = c->o_bias = c->mlp_bias = 0;
    c->qk_norm = 0;
    if ((rc = check_routing(c, n_shared, what, err))) return rc;
    c->shared_intermediate = n_shared * c->moe_intermediate;
    return 0;
}

/* PhiMoE: Mixtral's block with LayerNorms (weight and bias, eps rms_norm_eps), q/k/v/o
 * biased with attention_bias, lm_head with lm_head_bias, and the sparsemixer router
 * (model_moe.c), which picks 2 experts whatever num_experts_per_tok says: other values are
 * refused. PhimoeConfig's defaults where a key is absent. Its RoPE: the default one, or
 * longrope as PhimoeRotaryEmbedding computes it (rope.c): short_factor always, cos/sin times
 * short_mscale or long_mscale by the sequence's length; other scalings are refused. */
static int parse_phimoe(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = QD_LAYOUT_PHIMOE;
    c->moe_scoring = QD_MOE_SPARSEMIXER;
    c->norm_topk_prob = 0;
    c->routed_scale = 1.0f;
    c->n_experts = 16;
    c->top_k = 2;
    c->router_jitter = 0.01f;
    if (!cJSON_GetObjectItemCaseSensitive(root, "intermediate_size")) c->intermediate = 6400;
    if (!cJSON_GetObjectItemCaseSensitive(root, "vocab_size")) c->vocab = 32064;
    if (!cJSON_GetObjectItemCaseSensitive(root, "max_position_embeddings")) c->max_pos = 4096 * 32;
    if (!cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads")) c->n_kv_heads = 8;   /* null: the heads' */
    if (!cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps")) c->norm_eps = 1e-5f;
    if (!rope_key_given(root, "rope_theta")) c->rope_theta = c->rope_theta_local = 1000000.0f;
    if ((rc = qd_cfg_get_int(root, "num_local_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_float(root, "router_jitter_noise", &c->router_jitter, what, err)) ||
        (rc = qd_cfg_get_bool(root, "lm_head_bias", &c->lm_head_bias, what, err)))
        return rc;
    if (c->top_k != 2)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_experts_per_tok %lld is not supported for %s (its sparsemixer "
                          "router always picks 2 experts)", what, (long long)c->top_k, c->architecture);
    if (!(c->router_jitter >= 0 && isfinite(c->router_jitter)))
        return qd_err_set(err, QD_EFORMAT, "%s: router_jitter_noise must be a non-negative number", what);
    if (c->rope.type != QD_ROPE_DEFAULT && c->rope.type != QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: a RoPE scaling other than longrope (rope_type not \"default\") is "
                          "not supported for %s (PhimoeRotaryEmbedding scales it by short_mscale/long_mscale)", what,
                          c->architecture);
    if (c->rope.type == QD_ROPE_LONGROPE &&
        (!(c->rope.short_mscale > 0 && isfinite(c->rope.short_mscale)) ||
         !(c->rope.long_mscale > 0 && isfinite(c->rope.long_mscale)) || c->rope.orig_max_pos <= 0))
        return qd_err_set(err, QD_EFORMAT, "%s: %s's longrope needs short_mscale, long_mscale (positive) and "
                          "original_max_position_embeddings", what, c->architecture);
    if (c->rope.partial_rotary_factor != 1.0f)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (its RoPE turns all "
                          "of head_dim)", what, (double)c->rope.partial_rotary_factor, c->architecture);
    c->moe_intermediate = c->intermediate;
    c->o_bias = c->qkv_bias;   /* attention_bias: q, k, v and o */
    c->mlp_bias = 0;
    c->qk_norm = 0;
    /* sliding_window (null by default) masks every layer, as Mistral's. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && !cJSON_IsNull(sw) && (rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err))) return rc;
    if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = c->sliding_window > 0;
    return check_routing(c, 0, what, err);
}

int qd_config_moe_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    moe_kind k = kind_of(c->architecture);
    int use_sw = 0, rc;
    if ((rc = qd_cfg_get_bool(root, "use_sliding_window", &use_sw, what, err))) return rc;
    if (use_sw)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: use_sliding_window true is not supported for %s", what,
                          c->architecture);
    switch (k) {
    case MK_GLM4_MOE:
    case MK_DOTS1: return parse_deepseek_like(root, what, k, c, err);
    case MK_OLMOE: return parse_olmoe(root, what, c, err);
    case MK_MINIMAX_M2: return parse_minimax_m2(root, what, c, err);
    case MK_ERNIE_MOE: return parse_ernie_moe(root, what, c, err);
    case MK_PHIMOE: return parse_phimoe(root, what, c, err);
    default: return qd_err_set(err, QD_EINVAL, "%s: %s is not a MoE family of config_moe.c", what, c->architecture);
    }
}
