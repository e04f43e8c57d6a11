/* The config keys of the Gated DeltaNet hybrids: Qwen3-Next (Qwen3NextForCausalLM) and
 * Qwen3.5 (Qwen3_5ForCausalLM, dense; Qwen3_5MoeForCausalLM). Defaults are those of
 * transformers' Qwen3NextConfig, Qwen3_5TextConfig and Qwen3_5MoeTextConfig: layer_types (linear_attention / full_attention; absent, every
 * full_attention_interval-th layer is full), the linear attention's heads and conv, RoPE on
 * partial_rotary_factor (0.25 unless given) of each head, (1 + w) RMSNorms, and Qwen3-Next's
 * and Qwen3.5-MoE's experts (Qwen2-MoE's; Qwen3-Next's with dense layers where mlp_only_layers
 * or decoder_sparse_step say).
 * Qwen3.5's rope_parameters carry M-RoPE's mrope_section / mrope_interleaved: a text-only
 * forward gives the temporal, height and width sections the same positions, which is plain
 * RoPE, so they are read and set aside. Other RoPE types are refused by name. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/model/config_internal.h"

int qd_config_is_qwen_next(const qd_model_config *c)
{
    return !strcmp(c->architecture, "Qwen3NextForCausalLM") || !strcmp(c->architecture, "Qwen3_5ForCausalLM") ||
           !strcmp(c->architecture, "Qwen3_5MoeForCausalLM");
}

/* layer_types as written, or transformers' pattern from full_attention_interval. */
static int parse_mixers(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
            return qd_err_set(err, QD_EFORMAT, "%s: layer_types must be a list of num_hidden_layers (%lld) strings", what,
                              (long long)c->n_layers);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "linear_attention")) c->layer_mixer[i] = QD_MIXER_GATED_DELTANET;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")) c->layer_mixer[i] = QD_MIXER_ATTENTION;
            else
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types[%d] \"%s\" is not supported for %s "
                                  "(linear_attention, full_attention)", what, i, cJSON_IsString(e) ? e->valuestring : "?",
                                  c->architecture);
            i++;
        }
        return 0;
    }
    int64_t interval = 4;
    int rc = qd_cfg_get_int(root, "full_attention_interval", &interval, what, err);
    if (rc) return rc;
    if (interval <= 0) return qd_err_set(err, QD_EFORMAT, "%s: full_attention_interval must be positive", what);
    for (int64_t i = 0; i < c->n_layers; i++)
        c->layer_mixer[i] = (i + 1) % interval ? QD_MIXER_GATED_DELTANET : QD_MIXER_ATTENTION;
    return 0;
}

/* RoPE: rope_parameters (or the older top-level keys) with M-RoPE's keys set aside; only
 * rope_type "default" is computed for these families. */
static int parse_rope(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    cJSON *copy = cJSON_Duplicate(root, 1);
    if (!copy) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", what);
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(copy, "rope_parameters");
    int rc = 0;
    if (cJSON_IsObject(rp)) {
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(rp, "mrope_section");
        const cJSON *il = cJSON_GetObjectItemCaseSensitive(rp, "mrope_interleaved");
        if (sec && !cJSON_IsNull(sec) && !cJSON_IsArray(sec))
            rc = qd_err_set(err, QD_EFORMAT, "%s: rope_parameters.mrope_section must be a list", what);
        else if (il && !cJSON_IsNull(il) && !cJSON_IsBool(il))
            rc = qd_err_set(err, QD_EFORMAT, "%s: rope_parameters.mrope_interleaved must be true or false", what);
        else if ((sec || il) && !strcmp(c->architecture, "Qwen3NextForCausalLM"))
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_parameters.mrope_section is not supported for %s", what,
                            c->architecture);
        cJSON_DeleteItemFromObjectCaseSensitive(rp, "mrope_section");
        cJSON_DeleteItemFromObjectCaseSensitive(rp, "mrope_interleaved");
    }
    int given = (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor")) ||
                cJSON_GetObjectItemCaseSensitive(copy, "partial_rotary_factor");
    if (!rc) rc = qd_config_rope_parse(copy, what, 0, c, err);
    cJSON_Delete(copy);
    if (rc) return rc;
    if (c->rope.type != QD_ROPE_DEFAULT)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: RoPE scaling (rope_type other than \"default\") is not supported for %s",
                          what, c->architecture);
    /* The config classes' default: kwargs.setdefault("partial_rotary_factor", 0.25). */
    if (!given) c->rope.partial_rotary_factor = c->rope_local.partial_rotary_factor = 0.25f;
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    return 0;
}

/* The experts (Qwen2-MoE's, with the gated shared expert). Qwen3-Next (Qwen3NextConfig's
 * defaults): a layer is sparse unless it is in mlp_only_layers or (i + 1) %
 * decoder_sparse_step != 0, or num_experts is 0. Qwen3.5-MoE (Qwen3_5MoeTextConfig's): every
 * layer, the top-k weights always renormalised (its router has no norm_topk_prob, nor its
 * layers dense ones: transformers reads neither key). */
static int parse_experts(const cJSON *root, const char *what, int next, qd_model_config *c, qd_err *err)
{
    int rc;
    int64_t step = 1;
    c->n_experts = next ? 512 : 256; c->top_k = next ? 10 : 8; c->moe_intermediate = 512; c->shared_intermediate = 512;
    c->norm_topk_prob = 1;
    if ((rc = qd_cfg_get_int(root, "num_experts", &c->n_experts, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_experts_per_tok", &c->top_k, what, err)) ||
        (rc = qd_cfg_get_int(root, "moe_intermediate_size", &c->moe_intermediate, what, err)) ||
        (rc = qd_cfg_get_int(root, "shared_expert_intermediate_size", &c->shared_intermediate, what, err)))
        return rc;
    if (next && ((rc = qd_cfg_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, what, err)) ||
                 (rc = qd_cfg_get_int(root, "decoder_sparse_step", &step, what, err))))
        return rc;
    if (c->n_experts == 0 && next) return 0;   /* every layer dense, as transformers builds it */
    if (c->n_experts < 1 || c->n_experts > QD_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
        c->moe_intermediate <= 0 || c->shared_intermediate < 0 || step <= 0)
        return qd_err_set(err, QD_EFORMAT, "%s: %lld experts (1 to %d), num_experts_per_tok %lld (1 to the experts), the "
                          "expert widths and decoder_sparse_step must be positive", what, (long long)c->n_experts,
                          QD_MAX_EXPERTS, (long long)c->top_k);
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_dense[i] = (i + 1) % step != 0;
    const cJSON *dense = next ? cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers") : NULL, *e;
    if (dense && !cJSON_IsNull(dense) && !cJSON_IsArray(dense))
        return qd_err_set(err, QD_EFORMAT, "%s: mlp_only_layers must be a list of layer indices", what);
    const cJSON *list = cJSON_IsArray(dense) ? dense : NULL;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble)
            return qd_err_set(err, QD_EFORMAT, "%s: mlp_only_layers must be a list of layer indices", what);
        /* transformers tests `layer_idx in mlp_only_layers`: an index past the layers is inert. */
        if (e->valuedouble >= 0 && e->valuedouble < (double)c->n_layers) c->layer_dense[(int64_t)e->valuedouble] = 1;
    }
    /* Routing variants of other MoE families, which Qwen3-Next does not have. */
    static const char *const foreign[] = {"n_group", "topk_group", "routed_scaling_factor", "scoring_func",
                                          "first_k_dense_replace", "n_shared_experts"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    return 0;
}

int qd_config_qwen_next_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int next = !strcmp(c->architecture, "Qwen3NextForCausalLM"), moe = next || !strcmp(c->architecture, "Qwen3_5MoeForCausalLM");
    int rc;
    /* The config class's defaults where config.json leaves a size out (config.c read them
     * over LlamaConfig's). */
    c->hidden = next ? 2048 : 4096; c->intermediate = next ? 5632 : 12288; c->n_layers = next ? 48 : 32;
    if (moe && !next) { c->hidden = 2048; c->n_layers = 40; }   /* Qwen3_5MoeTextConfig */
    c->n_heads = 16; c->n_kv_heads = moe ? 2 : 4; c->head_dim = 256; c->vocab = next ? 151936 : 248320;
    c->max_pos = 32768;
    c->gdn_k_heads = 16; c->gdn_v_heads = 32; c->gdn_k_dim = 128; c->gdn_v_dim = 128; c->gdn_conv = 4;
    if ((rc = qd_cfg_get_int(root, "hidden_size", &c->hidden, what, err)) ||
        (rc = qd_cfg_get_int(root, "intermediate_size", &c->intermediate, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_hidden_layers", &c->n_layers, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_attention_heads", &c->n_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "num_key_value_heads", &c->n_kv_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "head_dim", &c->head_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "vocab_size", &c->vocab, what, err)) ||
        (rc = qd_cfg_get_int(root, "max_position_embeddings", &c->max_pos, what, err)) ||
        (rc = qd_cfg_get_int(root, "linear_num_key_heads", &c->gdn_k_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "linear_num_value_heads", &c->gdn_v_heads, what, err)) ||
        (rc = qd_cfg_get_int(root, "linear_key_head_dim", &c->gdn_k_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "linear_value_head_dim", &c->gdn_v_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "linear_conv_kernel_dim", &c->gdn_conv, what, err)))
        return rc;
    if (c->n_layers <= 0 || c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is outside the 1 to %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    if (c->gdn_k_heads <= 0 || c->gdn_v_heads <= 0 || c->gdn_v_heads % c->gdn_k_heads || c->gdn_k_dim <= 0 ||
        c->gdn_k_dim > QD_GDN_MAX_DK || c->gdn_v_dim <= 0 || c->gdn_conv <= 0)
        return qd_err_set(err, QD_EFORMAT, "%s: linear_num_value_heads %lld must be a multiple of linear_num_key_heads %lld, "
                          "linear_key_head_dim %lld in 1 to %d, linear_value_head_dim and linear_conv_kernel_dim positive",
                          what, (long long)c->gdn_v_heads, (long long)c->gdn_k_heads, (long long)c->gdn_k_dim,
                          QD_GDN_MAX_DK);
    if (c->mlp_bias)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: mlp_bias true is not supported for %s (its MLPs have no biases)", what,
                          c->architecture);
    c->layout = next ? QD_LAYOUT_QWEN_NEXT : QD_LAYOUT_QWEN35;
    c->norm_offset = 1.0f;   /* Qwen3NextRMSNorm: x * (1 + w) */
    c->qk_norm = 1;
    c->attn_gate = 1;
    if ((rc = parse_rope(root, what, c, err)) || (rc = parse_mixers(root, what, c, err))) return rc;
    if (moe && (rc = parse_experts(root, what, next, c, err))) return rc;
    /* Keys that change the math in other families and that these do not have. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                                          "sliding_window", "use_sliding_window", "rope_local_base_freq"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 1, what, c->architecture, err))) return rc;
    return 0;
}
