/* The config keys particular to one rotary-decoder family (see config_internal.h): which
 * layers use a sliding window, q/k norms, and Gemma's and Phi-3's departures from the
 * Llama block. Defaults are those of the transformers config classes (Gemma2Config,
 * Gemma3TextConfig, Phi3Config, ...), so a config.json that leaves a key out means what it
 * means to transformers — Gemma 2 without final_logit_softcapping caps at 30, with it null
 * does not cap. A key that changes the math in a family that does not have it is refused
 * by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/core/dtype.h"
#include "quant/model/config_internal.h"

typedef enum fam_kind {
    FAM_LLAMA = 0, FAM_MISTRAL, FAM_QWEN2, FAM_QWEN3, FAM_GEMMA2, FAM_GEMMA3, FAM_PHI3,
    FAM_MIXTRAL, FAM_QWEN2_MOE, FAM_QWEN3_MOE, FAM_DEEPSEEK_V2, FAM_DEEPSEEK_V3, FAM_GPT_OSS,
} fam_kind;

static fam_kind kind_of(const char *arch)
{
    static const struct { const char *arch; fam_kind kind; } t[] = {
        {"MistralForCausalLM", FAM_MISTRAL}, {"Qwen2ForCausalLM", FAM_QWEN2}, {"Qwen3ForCausalLM", FAM_QWEN3},
        {"Gemma2ForCausalLM", FAM_GEMMA2},   {"Gemma3ForCausalLM", FAM_GEMMA3}, {"Phi3ForCausalLM", FAM_PHI3},
        {"MixtralForCausalLM", FAM_MIXTRAL}, {"Qwen2MoeForCausalLM", FAM_QWEN2_MOE},
        {"Qwen3MoeForCausalLM", FAM_QWEN3_MOE}, {"DeepseekV2ForCausalLM", FAM_DEEPSEEK_V2},
        {"DeepseekV3ForCausalLM", FAM_DEEPSEEK_V3}, {"GptOssForCausalLM", FAM_GPT_OSS},
        {"DeepseekV32ForCausalLM", FAM_DEEPSEEK_V3},   /* plus its indexer (config_dsa.c) */
        /* Vision-language models: the family of their text tower (config_vlm.c). */
        {"Qwen2VLForConditionalGeneration", FAM_QWEN2},   {"Qwen2_5_VLForConditionalGeneration", FAM_QWEN2},
        {"Qwen3VLForConditionalGeneration", FAM_QWEN3},
        {"Gemma3ForConditionalGeneration", FAM_GEMMA3},     {"Mistral3ForConditionalGeneration", FAM_MISTRAL},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].arch, arch)) return t[i].kind;
    return FAM_LLAMA;
}

/* A float key whose absence means `dflt` and whose null means "off" (0). */
static int get_float_or_off(const cJSON *root, const char *key, float dflt, float *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = !v ? dflt : 0.0f;
    if (!v || cJSON_IsNull(v)) return 0;
    int rc = qd_cfg_get_float(root, key, out, what, err);
    if (!rc && !(*out > 0 && isfinite(*out))) rc = qd_err_set(err, QD_EFORMAT, "%s: %s must be positive or null", what, key);
    return rc;
}

/* layer_types as written, or the pattern the older keys give (every `pattern`-th layer is
 * global, the others slide; Gemma 2's pattern is 2). Gemma only. */
static int parse_layer_types(const cJSON *root, const char *what, fam_kind k, qd_model_config *c, qd_err *err)
{
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    int given = qd_cfg_layer_types_sliding(root, what, c, err);
    if (given) return given < 0 ? given : 0;
    int64_t pattern = k == FAM_GEMMA2 ? 2 : 6;
    int rc;
    if ((rc = qd_cfg_get_int(root, "sliding_window_pattern", &pattern, what, err)) ||
        (rc = qd_cfg_get_int(root, "_sliding_window_pattern", &pattern, what, err)))
        return rc;
    if (pattern <= 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window_pattern must be positive", what);
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % pattern != 0;
    return 0;
}

static int parse_gemma(const cJSON *root, const char *what, fam_kind k, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = QD_LAYOUT_GEMMA;
    c->norm_offset = 1.0f;
    /* transformers scales by a tensor of sqrt(hidden) in the model's dtype (bf16 rounds it:
     * 3584 -> 59.75, not 59.87), and so does vLLM; F32 keeps it exact. */
    float s = sqrtf((float)c->hidden);
    if (!strcmp(c->torch_dtype, "bfloat16")) s = qd_bf16_to_f32(qd_f32_to_bf16(s));
    else if (!strcmp(c->torch_dtype, "float16")) s = qd_f32_round_f16(s);
    c->embed_scale = s;
    strcpy(c->activation, "gelu_pytorch_tanh");
    c->tie_word_embeddings = 1;
    c->sliding_window = 4096;
    c->query_pre_attn_scalar = 256.0f;
    if ((rc = qd_cfg_get_str(root, "hidden_activation", c->activation, sizeof c->activation, what, err)) ||
        (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, what, err)) ||
        (rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)) ||
        (rc = qd_cfg_get_float(root, "query_pre_attn_scalar", &c->query_pre_attn_scalar, what, err)) ||
        (rc = get_float_or_off(root, "attn_logit_softcapping", k == FAM_GEMMA2 ? 50.0f : 0.0f, &c->attn_softcap, what, err)) ||
        (rc = get_float_or_off(root, "final_logit_softcapping", k == FAM_GEMMA2 ? 30.0f : 0.0f, &c->final_softcap, what, err)))
        return rc;
    /* An explicit null window means none (transformers' None), not the class default. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && cJSON_IsNull(sw)) c->sliding_window = 0;
    if (strcmp(c->activation, "gelu_pytorch_tanh"))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: hidden_activation \"%s\" is not supported for %s (gelu_pytorch_tanh)",
                          what, c->activation, c->architecture);
    if (!(c->query_pre_attn_scalar > 0))
        return qd_err_set(err, QD_EFORMAT, "%s: query_pre_attn_scalar must be positive", what);
    int bidir = 0;
    if ((rc = qd_cfg_get_bool(root, "use_bidirectional_attention", &bidir, what, err))) return rc;
    if (bidir)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: use_bidirectional_attention true is not supported (causal LMs only)", what);
    if (k == FAM_GEMMA3) c->qk_norm = 1;
    return parse_layer_types(root, what, k, c, err);
}

/* Mixtral, Qwen2-MoE, Qwen3-MoE: the router and experts (defaults of MixtralConfig,
 * Qwen2MoeConfig, Qwen3MoeConfig). Every layer must be sparse: dense layers among sparse
 * ones (decoder_sparse_step > 1, mlp_only_layers) are refused by name. */
static int parse_moe(const cJSON *root, const char *what, fam_kind k, qd_model_config *c, qd_err *err)
{
    int rc;
    c->layout = k == FAM_MIXTRAL ? QD_LAYOUT_MIXTRAL : QD_LAYOUT_QWEN_MOE;
    c->n_experts = k == FAM_MIXTRAL ? 8 : k == FAM_QWEN2_MOE ? 60 : 128;
    c->top_k = k == FAM_MIXTRAL ? 2 : k == FAM_QWEN2_MOE ? 4 : 8;
    c->moe_intermediate = k == FAM_MIXTRAL ? c->intermediate : k == FAM_QWEN2_MOE ? 1408 : 768;
    c->norm_topk_prob = k == FAM_MIXTRAL;
    c->shared_intermediate = k == FAM_QWEN2_MOE ? 5632 : 0;
    /* transformers 5 writes num_local_experts for every family; older Qwen files num_experts. */
    if ((rc = qd_cfg_get_int(root, "num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_local_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)))
        return rc;
    if (k != FAM_MIXTRAL) {
        int64_t step = 1;
        if ((rc = qd_cfg_get_int(root, "moe_intermediate_size", &c->moe_intermediate, what, err)) ||
            (rc = qd_cfg_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, what, err)) ||
            (rc = qd_cfg_get_int(root, "decoder_sparse_step", &step, what, err)))
            return rc;
        if (step != 1)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: decoder_sparse_step %lld (dense layers between sparse ones) is not supported",
                              what, (long long)step);
        const cJSON *dense = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
        if (dense && !cJSON_IsNull(dense) && (!cJSON_IsArray(dense) || cJSON_GetArraySize(dense) > 0))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: mlp_only_layers (dense layers among sparse ones) is not supported", what);
    }
    if (k == FAM_QWEN2_MOE) {
        c->qkv_bias = 1;
        if ((rc = qd_cfg_get_bool(root, "qkv_bias", &c->qkv_bias, what, err)) ||
            (rc = qd_cfg_get_int(root, "shared_expert_intermediate_size", &c->shared_intermediate, what, err)))
            return rc;
    }
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
        c->moe_intermediate <= 0 || c->shared_intermediate < 0)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d), num_experts_per_tok %lld (1 to the experts) and "
                          "the expert widths must be positive", what, (long long)c->n_experts, QD_MAX_EXPERTS,
                          (long long)c->top_k);
    /* Routing variants this forward does not implement. */
    static const char *const foreign[] = {"n_group", "topk_group", "routed_scaling_factor", "scoring_func", "moe_layer_freq"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    return 0;
}

/* A string key that, when present, must be `want` (a variant this forward does not compute
 * is refused by name). */
static int require_str(const cJSON *root, const char *key, const char *want, const char *what, qd_err *err)
{
    char v[32] = "";
    int rc = qd_cfg_get_str(root, key, v, sizeof v, what, err);
    if (!rc && v[0] && strcmp(v, want))
        rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: %s \"%s\" is not supported (%s)", what, key, v, want);
    return rc;
}

/* DeepSeek-V2 and V3 (the defaults of DeepseekV2Config, DeepseekV3Config): multi-head
 * latent attention, dense MLP layers [0, first_k_dense_replace), then MoE layers of
 * n_routed_experts routed experts and n_shared_experts shared ones (one SwiGLU
 * n_shared_experts * moe_intermediate_size wide, ungated). V3 routes by sigmoid scores with
 * the grouped, bias-corrected choice; V2 by softmax, greedy or group_limited_greedy, never
 * renormalised (transformers' DeepseekV2 router ignores norm_topk_prob, which the original
 * code applied: true is refused rather than read one way). V2's RoPE is always the
 * interleaved one (its complex rotation of pairs). */
static int parse_deepseek(const cJSON *root, const char *what, int v3, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t n_shared = v3 ? 1 : 2, freq = 1;
    if (c->qkv_bias || c->mlp_bias)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: attention_bias or mlp_bias true is not supported for %s", what,
                          c->architecture);
    /* Keys and values come out of kv_b_proj with a head per query head; transformers'
     * repeat_kv would break with fewer. */
    if (c->n_kv_heads && c->n_kv_heads != c->n_heads)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_key_value_heads %lld differs from num_attention_heads %lld; "
                          "multi-head latent attention has one key and value per head", what, (long long)c->n_kv_heads,
                          (long long)c->n_heads);
    c->layout = QD_LAYOUT_DEEPSEEK;
    c->q_lora_rank = 1536; c->kv_lora_rank = 512; c->qk_nope_dim = 128; c->qk_rope_dim = 64; c->v_head_dim = 128;
    c->rope_interleave = 1;
    if (v3) {
        c->moe_scoring = QD_MOE_SIGMOID_GROUPED;
        c->n_experts = 256; c->top_k = 8; c->moe_intermediate = 2048; c->norm_topk_prob = 1;
        c->n_group = 8; c->topk_group = 4; c->routed_scale = 2.5f; c->first_dense = 3;
    } else {
        c->moe_scoring = QD_MOE_SOFTMAX;
        c->n_experts = 64; c->top_k = 0; c->moe_intermediate = 1407; c->norm_topk_prob = 0;
        c->n_group = 0; c->topk_group = 0; c->routed_scale = 1.0f; c->first_dense = 0;
    }
    char method[32] = "";
    if ((rc = qd_cfg_get_int(root, "n_routed_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_intermediate_size", &c->moe_intermediate, what, err)) ||
        (rc = qd_cfg_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, what, err)) ||
        (rc = qd_cfg_get_int(root, "n_group", &c->n_group, what, err)) ||
        (rc = qd_cfg_get_int(root, "topk_group", &c->topk_group, what, err)) ||
        (rc = qd_cfg_get_float(root, "routed_scaling_factor", &c->routed_scale, what, err)) ||
        (rc = qd_cfg_get_int(root, "first_k_dense_replace", &c->first_dense, what, err)) ||
        (rc = qd_cfg_get_int(root, "n_shared_experts", &n_shared, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_layer_freq", &freq, what, err)) ||
        (rc = qd_cfg_get_int(root, "kv_lora_rank", &c->kv_lora_rank, what, err)) ||
        (rc = qd_cfg_get_int(root, "qk_nope_head_dim", &c->qk_nope_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "qk_rope_head_dim", &c->qk_rope_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "v_head_dim", &c->v_head_dim, what, err)) ||
        (rc = qd_cfg_get_str(root, "topk_method", method, sizeof method, what, err)) ||
        (rc = require_str(root, "scoring_func", v3 ? "sigmoid" : "softmax", what, err)))
        return rc;
    if (v3) {
        if ((rc = qd_cfg_get_bool(root, "rope_interleave", &c->rope_interleave, what, err))) return rc;
        if (method[0] && strcmp(method, "noaux_tc"))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported for %s (noaux_tc)", what, method,
                              c->architecture);
    } else {
        if (!method[0] || !strcmp(method, "greedy")) c->moe_scoring = QD_MOE_SOFTMAX;
        else if (!strcmp(method, "group_limited_greedy")) c->moe_scoring = QD_MOE_SOFTMAX_GROUPED;
        else
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported for %s (greedy, "
                              "group_limited_greedy)", what, method, c->architecture);
        if (c->norm_topk_prob)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: norm_topk_prob true is not supported for %s (transformers "
                              "ignores it, the original code renormalises)", what, c->architecture);
    }
    /* q_lora_rank null: one q_proj (DeepSeek-V2-Lite's shape). */
    const cJSON *ql = cJSON_GetObjectItemCaseSensitive(root, "q_lora_rank");
    if (ql && cJSON_IsNull(ql)) c->q_lora_rank = 0;
    else if ((rc = qd_cfg_get_int(root, "q_lora_rank", &c->q_lora_rank, what, err))) return rc;
    /* transformers' DeepSeek models ignore moe_layer_freq (every layer past the dense ones is
     * sparse); the original code skips layers when it is not 1, so only 1 means one thing. */
    if (freq != 1)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: moe_layer_freq %lld (dense layers between sparse ones) is not supported",
                          what, (long long)freq);
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
        c->moe_intermediate <= 0 || n_shared < 0 || c->first_dense < 0)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d), num_experts_per_tok %lld (1 to the experts), "
                          "moe_intermediate_size, n_shared_experts and first_k_dense_replace must be in range", what,
                          (long long)c->n_experts, QD_MAX_EXPERTS, (long long)c->top_k);
    /* Groups: the kept groups must hold top_k experts; V3 scores a group by the sum of its
     * 2 best experts, so each needs 2. */
    int64_t min_per = c->moe_scoring == QD_MOE_SIGMOID_GROUPED ? 2 : 1;
    if (c->moe_scoring != QD_MOE_SOFTMAX &&
        (c->n_group < 1 || c->n_experts % c->n_group || c->n_experts / c->n_group < min_per || c->topk_group < 1 ||
         c->topk_group > c->n_group || c->top_k > c->topk_group * (c->n_experts / c->n_group)))
        return qd_err_set(err, QD_EFORMAT, "%s: n_group %lld must divide n_routed_experts %lld into groups of %lld or more, "
                          "and topk_group %lld (1 to n_group) groups must hold num_experts_per_tok %lld experts", what,
                          (long long)c->n_group, (long long)c->n_experts, (long long)min_per, (long long)c->topk_group,
                          (long long)c->top_k);
    if (!(c->routed_scale > 0 && isfinite(c->routed_scale)))
        return qd_err_set(err, QD_EFORMAT, "%s: routed_scaling_factor must be positive", what);
    c->shared_intermediate = n_shared * c->moe_intermediate;
    if (c->q_lora_rank < 0 || c->kv_lora_rank <= 0 || c->qk_nope_dim < 0 || c->qk_rope_dim <= 0 || (c->qk_rope_dim & 1) ||
        c->v_head_dim <= 0)
        return qd_err_set(err, QD_EFORMAT, "%s: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (even) and "
                          "v_head_dim must be positive", what);
    /* Keys and values have a head per query head; RoPE turns the rope dims (the config
     * classes set head_dim to qk_rope_head_dim whatever config.json says). */
    c->head_dim = c->qk_rope_dim;
    c->n_kv_heads = c->n_heads;
    return 0;
}

int qd_config_family_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    if (qd_config_is_hybrid(c->architecture)) return qd_config_hybrid_parse(root, what, c, err);
    if (qd_config_falcon_h1_is(c->architecture)) return qd_config_falcon_h1_parse(root, what, c, err);
    if (qd_config_is_qwen_next(c)) return qd_config_qwen_next_parse(root, what, c, err);
    if (qd_config_is_plain_family(c->architecture)) return qd_config_plain_parse(root, what, c, err);
    if (qd_config_postnorm_is(c->architecture)) return qd_config_postnorm_parse(root, what, c, err);
    if (qd_config_dense_owns(c->architecture)) return qd_config_dense_parse(root, what, c, err);
    if (qd_config_llama4_is(c->architecture)) return qd_config_llama4_parse(root, what, c, err);
    fam_kind k = kind_of(c->architecture);
    int gemma = k == FAM_GEMMA2 || k == FAM_GEMMA3;
    int rc;
    if (k == FAM_GPT_OSS) return qd_config_gptoss_parse(root, what, c, err);
    /* RoPE: theta and the scaling in either spelling; per layer type where layers differ. */
    if ((rc = qd_config_rope_parse(root, what, gemma, c, err))) return rc;
    int phimoe = !strcmp(c->architecture, "PhimoeForCausalLM");   /* its own longrope (config_moe.c) */
    if ((c->rope.type == QD_ROPE_LONGROPE || c->rope_local.type == QD_ROPE_LONGROPE) && k != FAM_PHI3 && !phimoe)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only "
                          "(and PhimoeForCausalLM's own), not %s", what, c->architecture);
    if (!phimoe && (c->rope.short_mscale > 0 || c->rope.long_mscale > 0))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope short_mscale/long_mscale are PhiMoE's; not supported for %s",
                          what, c->architecture);
    if (!(c->rope_theta > 0) || !(c->rope_theta_local > 0))
        return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    if (qd_config_moe_owns(c->architecture)) return qd_config_moe_parse(root, what, c, err);   /* config_moe.c */
    if (k == FAM_QWEN2) { c->qkv_bias = 1; c->o_bias = 0; c->mlp_bias = 0; }
    if (k == FAM_QWEN3 || k == FAM_QWEN3_MOE) { c->qkv_bias = 0; c->o_bias = 0; c->qk_norm = 1; }
    if (k == FAM_QWEN2_MOE) { c->o_bias = 0; c->mlp_bias = 0; }
    if ((k == FAM_MIXTRAL || k == FAM_QWEN2_MOE || k == FAM_QWEN3_MOE) && (rc = parse_moe(root, what, k, c, err))) return rc;
    if ((k == FAM_DEEPSEEK_V2 || k == FAM_DEEPSEEK_V3) && (rc = parse_deepseek(root, what, k == FAM_DEEPSEEK_V3, c, err)))
        return rc;
    if (qd_config_dsa_is(c->architecture) && (rc = qd_config_dsa_parse(root, what, c, err))) return rc;
    if (k == FAM_PHI3) {
        c->layout = QD_LAYOUT_PHI3;
        c->qkv_bias = c->o_bias = c->mlp_bias = 0;
        if (!cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps")) c->norm_eps = 1e-5f;   /* Phi3Config's */
    }
    /* Qwen2/3 slide only with use_sliding_window (and then per layer), which is refused. */
    int use_sw = 0;
    if ((rc = qd_cfg_get_bool(root, "use_sliding_window", &use_sw, what, err))) return rc;
    if (use_sw && (k == FAM_QWEN2 || k == FAM_QWEN3 || k == FAM_QWEN2_MOE || k == FAM_QWEN3_MOE))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: use_sliding_window true is not supported for %s", what, c->architecture);
    if (gemma) {
        if ((rc = parse_gemma(root, what, k, c, err))) return rc;
    } else {
        /* Mistral, Mixtral and Phi-3 apply `sliding_window` to every layer. */
        if ((k == FAM_MISTRAL || k == FAM_MIXTRAL || k == FAM_PHI3) && (rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err)))
            return rc;
        if (c->sliding_window > 0 && c->n_layers > QD_CFG_MAX_LAYERS)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                              (long long)c->n_layers, QD_CFG_MAX_LAYERS);
        for (int64_t i = 0; c->sliding_window > 0 && i < c->n_layers; i++) c->layer_sliding[i] = 1;
        /* Keys that change the math in Gemma and that these families do not have. */
        static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"};
        if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *e;
        if (!cJSON_IsArray(lt) || qd_config_dsa_is(c->architecture)) lt = NULL;   /* V3.2's: config_dsa.c */
        cJSON_ArrayForEach(e, lt)
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types with \"%s\" layers is not supported for %s", what,
                                  cJSON_IsString(e) ? e->valuestring : "?", c->architecture);
    }
    if (c->sliding_window < 0) return qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    return 0;
}
