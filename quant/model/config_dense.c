/* The config keys of the dense families whose block is Llama's with one thing changed:
 * SmolLM3 (layers without RoPE, windows on some of them), Granite (embedding, attention,
 * residual and logit multipliers), Ministral (a window per layer), Seed-OSS (q/k/v biases
 * apart from o_proj's), ERNIE 4.5 (interleaved RoPE, one use_bias for every linear) and
 * Apertus (xIELU in a non-gated MLP, q/k norms), Hunyuan dense (q/k norms after RoPE,
 * NTK-alpha RoPE; these two have their table entries in arch_dense.c) and Ministral 3
 * (YaRN with Llama 4's position-dependent query scale).
 * Defaults are those of the transformers config classes (SmolLM3Config, GraniteConfig,
 * MinistralConfig, SeedOssConfig, Ernie4_5Config, ApertusConfig, HunYuanDenseV1Config, Ministral3Config), including the ones where a family departs
 * from LlamaConfig's (config.c reads those first): a config.json that leaves a key out means
 * what it means to transformers. A key that changes the math and is not implemented is
 * refused by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

typedef enum dense_kind {
    DENSE_NONE = 0, DENSE_SMOLLM3, DENSE_GRANITE, DENSE_MINISTRAL, DENSE_SEED_OSS, DENSE_ERNIE, DENSE_APERTUS, DENSE_HUNYUAN,
    DENSE_MINISTRAL3,
} dense_kind;

/* Where a family's config class departs from LlamaConfig on a key config.c has read. */
typedef struct dense_family {
    const char *arch;
    dense_kind kind;
    float theta;          /* default_theta */
    int64_t kv_heads;     /* num_key_value_heads default; 0: num_attention_heads */
    int64_t head_dim;     /* head_dim default when the key is absent; 0: hidden / heads */
    int tie;              /* tie_word_embeddings default */
    float eps;            /* rms_norm_eps default */
} dense_family;

static const dense_family families[] = {
    {"SmolLM3ForCausalLM", DENSE_SMOLLM3, 2000000.0f, 4, 0, 1, 1e-6f},
    {"GraniteForCausalLM", DENSE_GRANITE, 10000.0f, 0, 0, 0, 1e-6f},
    {"MinistralForCausalLM", DENSE_MINISTRAL, 10000.0f, 8, 0, 0, 1e-6f},
    {"SeedOssForCausalLM", DENSE_SEED_OSS, 10000.0f, 8, 128, 0, 1e-6f},
    {"Ernie4_5ForCausalLM", DENSE_ERNIE, 500000.0f, 2, 128, 1, 1e-5f},
    {"ApertusForCausalLM", DENSE_APERTUS, 12000000.0f, 0, 0, 0, 1e-5f},
    {"HunYuanDenseV1ForCausalLM", DENSE_HUNYUAN, 10000.0f, 0, 0, 0, 1e-5f},
    {"Ministral3ForCausalLM", DENSE_MINISTRAL3, 1000000.0f, 8, 128, 0, 1e-5f},
};

static const dense_family *family_of(const char *arch)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].arch, arch)) return &families[i];
    return NULL;
}

int qd_config_dense_owns(const char *arch) { return family_of(arch) != NULL; }

static int absent(const cJSON *root, const char *key) { return !cJSON_GetObjectItemCaseSensitive(root, key); }

/* A positive finite float key, `dflt` when absent or null. */
static int get_positive(const cJSON *root, const char *key, float dflt, float *out, const char *what, qd_err *err)
{
    *out = dflt;
    int rc = qd_cfg_get_float(root, key, out, what, err);
    if (!rc && !(*out > 0 && isfinite(*out))) rc = qd_err_set(err, QD_EFORMAT, "%s: %s must be positive", what, key);
    return rc;
}

/* layer_types as written: 1 for "sliding_attention", 0 for "full_attention"; *given 0 when
 * absent or null (the family derives it). */
static int read_layer_types(const cJSON *root, const char *what, qd_model_config *c, int *given, qd_err *err)
{
    int r = qd_cfg_layer_types_sliding(root, what, c, err);
    *given = r > 0;
    return r < 0 ? r : 0;
}

/* sliding_window: absent means `dflt`, null means none (0). */
static int read_window(const cJSON *root, const char *what, int64_t dflt, qd_model_config *c, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    c->sliding_window = v ? 0 : dflt;
    int rc = qd_cfg_get_int(root, "sliding_window", &c->sliding_window, what, err);
    if (!rc && c->sliding_window < 0) rc = qd_err_set(err, QD_EFORMAT, "%s: sliding_window must be positive or null", what);
    return rc;
}

/* SmolLM3: no_rope_layers[i] 1 = layer i uses RoPE, 0 = it does not (NoPE); without the list,
 * every no_rope_layer_interval-th layer is NoPE. layer_types, when absent, slides the NoPE
 * layers if use_sliding_window and sliding_window are set. transformers' eager and SDPA masks
 * follow layer_types, its flash attention follows use_sliding_window as well: a sliding layer
 * with use_sliding_window false means two things, and is refused. */
static int parse_smollm3(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc, use_sw = 0, given;
    int64_t interval = 4;
    if ((rc = qd_cfg_get_bool(root, "use_sliding_window", &use_sw, what, err)) ||
        (rc = read_window(root, what, 0, c, err)) ||
        (rc = qd_cfg_get_int(root, "no_rope_layer_interval", &interval, what, err)))
        return rc;
    const cJSON *nr = cJSON_GetObjectItemCaseSensitive(root, "no_rope_layers");
    if (nr && !cJSON_IsNull(nr)) {
        if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) < c->n_layers)
            return qd_err_set(err, QD_EFORMAT, "%s: no_rope_layers must be a list of at least num_hidden_layers (%lld) "
                              "0/1 entries", what, (long long)c->n_layers);
        for (int64_t i = 0; i < c->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(nr, (int)i);
            if (!cJSON_IsNumber(e) || (e->valuedouble != 0 && e->valuedouble != 1))
                return qd_err_set(err, QD_EFORMAT, "%s: no_rope_layers[%lld] must be 0 or 1", what, (long long)i);
            c->layer_nope[i] = e->valuedouble == 0;
        }
    } else {
        if (interval <= 0) return qd_err_set(err, QD_EFORMAT, "%s: no_rope_layer_interval must be positive", what);
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_nope[i] = (i + 1) % interval == 0;
    }
    if ((rc = read_layer_types(root, what, c, &given, err))) return rc;
    for (int64_t i = 0; !given && i < c->n_layers; i++) c->layer_sliding[i] = use_sw && c->sliding_window > 0 && c->layer_nope[i];
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (!c->layer_sliding[i]) continue;
        if (!use_sw)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types[%lld] is sliding_attention with use_sliding_window false "
                              "(transformers' eager attention slides there, its flash attention does not); not supported",
                              what, (long long)i);
        if (c->sliding_window <= 0)
            return qd_err_set(err, QD_EFORMAT, "%s: layer_types has sliding_attention layers but sliding_window is not set", what);
    }
    return 0;
}

/* Granite: embeddings times embedding_multiplier, attention_multiplier as the softmax scale
 * itself (not head_dim^-1/2), each sub-block's output times residual_multiplier before its
 * residual add, the logits divided by logits_scaling. All default to 1. */
static int parse_granite(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    float logits_scaling;
    int rc;
    if ((rc = get_positive(root, "embedding_multiplier", 1.0f, &c->embed_scale, what, err)) ||
        (rc = get_positive(root, "attention_multiplier", 1.0f, &c->attn_scale, what, err)) ||
        (rc = get_positive(root, "residual_multiplier", 1.0f, &c->residual_scale, what, err)) ||
        (rc = get_positive(root, "logits_scaling", 1.0f, &logits_scaling, what, err)))
        return rc;
    c->logit_scale = 1.0f / logits_scaling;
    return 0;
}

/* Hunyuan's RoPE: rope_type "dynamic" with an `alpha` is, in transformers'
 * HunYuanDenseV1RotaryEmbedding, a static NTK base theta * alpha^(d / (d - 2)) over the
 * head_dim d (the other keys of the object — factor, beta_fast, mscale... as the checkpoints
 * write them — are not read there). That is plain RoPE with that base; the RoPE parser sees
 * a copy of the config where the object says so. Without alpha, RoPE is read as for Llama. */
static int parse_hunyuan_rope(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const char *key = "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!rp || cJSON_IsNull(rp)) rp = cJSON_GetObjectItemCaseSensitive(root, key = "rope_scaling");
    const cJSON *alpha = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "alpha") : NULL;
    const cJSON *t = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (!t && cJSON_IsObject(rp)) t = cJSON_GetObjectItemCaseSensitive(rp, "type");
    if (!alpha || cJSON_IsNull(alpha) || (cJSON_IsNumber(alpha) && alpha->valuedouble == 0) || !cJSON_IsString(t) ||
        strcmp(t->valuestring, "dynamic"))
        return qd_config_rope_parse(root, what, 0, c, err);
    int rc;
    if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0))
        return qd_err_set(err, QD_EFORMAT, "%s: %s.alpha must be a positive number", what, key);
    /* theta: inside the object (transformers 5), else the top-level key. */
    float theta = c->rope_theta;
    if ((rc = qd_cfg_get_float(root, "rope_theta", &theta, what, err)) || (rc = qd_cfg_get_float(rp, "rope_theta", &theta, what, err)))
        return rc;
    int64_t d = c->head_dim ? c->head_dim : (c->n_heads > 0 ? c->hidden / c->n_heads : 0);
    if (d <= 2) return qd_err_set(err, QD_EFORMAT, "%s: head_dim %lld is too small for NTK-alpha RoPE", what, (long long)d);
    double base = (double)theta * pow(alpha->valuedouble, (double)d / (double)(d - 2));
    cJSON *copy = cJSON_Duplicate(root, 1);
    cJSON *obj = cJSON_CreateObject();
    if (!copy || !obj || !cJSON_AddStringToObject(obj, "rope_type", "default") || !cJSON_AddNumberToObject(obj, "rope_theta", base)) {
        cJSON_Delete(copy);
        cJSON_Delete(obj);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory", what);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_theta");
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_parameters");
    cJSON_AddItemToObject(copy, "rope_parameters", obj);
    rc = qd_config_rope_parse(copy, what, 0, c, err);
    cJSON_Delete(copy);
    return rc;
}

/* Ministral 3's RoPE object (rope_parameters, else rope_scaling; absent: Ministral3Config's
 * YaRN, factor 16, original 16384, theta 1e6, whatever a top-level rope_theta says) carries
 * llama_4_scaling_beta, which Ministral3Attention reads to scale the queries after RoPE by
 * 1 + beta ln(1 + floor(pos / original_max_position_embeddings)): required there (transformers
 * fails without it). It and the object's max_position_embeddings (which YaRN does not read)
 * are taken out of a copy before the RoPE parser sees it. */
static int parse_ministral3_rope(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const char *key = "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!rp || cJSON_IsNull(rp)) rp = cJSON_GetObjectItemCaseSensitive(root, key = "rope_scaling");
    if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp)) return qd_err_set(err, QD_EFORMAT, "%s: %s must be an object", what, key);
    cJSON *copy = cJSON_Duplicate(root, 1);
    cJSON *obj = rp && !cJSON_IsNull(rp) ? cJSON_Duplicate(rp, 1)
                                         : cJSON_Parse("{\"rope_type\":\"yarn\",\"rope_theta\":1000000.0,\"factor\":16.0,"
                                                       "\"original_max_position_embeddings\":16384,\"beta_fast\":32.0,"
                                                       "\"beta_slow\":1.0,\"mscale_all_dim\":1.0,\"mscale\":1.0,"
                                                       "\"llama_4_scaling_beta\":0.1}");
    if (!copy || !obj) {
        cJSON_Delete(copy);
        cJSON_Delete(obj);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory", what);
    }
    if (!rp || cJSON_IsNull(rp)) cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_theta");
    int64_t orig = 0;
    float beta = 0;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(obj, "llama_4_scaling_beta");
    int rc = qd_cfg_get_int(obj, "original_max_position_embeddings", &orig, what, err);
    if (!rc && (!cJSON_IsNumber(b) || !(b->valuedouble >= 0) || orig <= 0))
        rc = qd_err_set(err, QD_EFORMAT, "%s: %s needs llama_4_scaling_beta (a number >= 0) and "
                        "original_max_position_embeddings for %s's query scale", what, key, c->architecture);
    if (!rc) {
        beta = (float)b->valuedouble;
        cJSON_DeleteItemFromObjectCaseSensitive(obj, "llama_4_scaling_beta");
        cJSON_DeleteItemFromObjectCaseSensitive(obj, "max_position_embeddings");
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_scaling");
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "rope_parameters");
        cJSON_AddItemToObject(copy, "rope_parameters", obj);
        obj = NULL;
        rc = qd_config_rope_parse(copy, what, 0, c, err);
    }
    cJSON_Delete(obj);
    cJSON_Delete(copy);
    if (rc) return rc;
    c->q_pos_scale_beta = beta;
    c->q_pos_scale_orig = orig;
    return 0;
}

int qd_config_dense_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const dense_family *f = family_of(c->architecture);
    int rc, given;
    if (!f) return qd_err_set(err, QD_EINVAL, "%s: %s is not a dense family of config_dense.c", what, c->architecture);
    /* The class defaults config.c (LlamaConfig's) does not know. */
    if (absent(root, "num_key_value_heads")) c->n_kv_heads = f->kv_heads;
    if (absent(root, "head_dim")) c->head_dim = f->head_dim;
    if (absent(root, "tie_word_embeddings")) c->tie_word_embeddings = f->tie;
    if (absent(root, "rms_norm_eps")) c->norm_eps = f->eps;
    c->rope_theta = f->theta;
    if (f->kind == DENSE_HUNYUAN) rc = parse_hunyuan_rope(root, what, c, err);
    else if (f->kind == DENSE_MINISTRAL3) rc = parse_ministral3_rope(root, what, c, err);
    else rc = qd_config_rope_parse(root, what, 0, c, err);
    if (rc) return rc;
    if (c->rope.type == QD_ROPE_LONGROPE)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_type \"longrope\" is supported for Phi3ForCausalLM only, not %s",
                          what, c->architecture);
    if (!(c->rope_theta > 0)) return qd_err_set(err, QD_EFORMAT, "%s: rope_theta must be positive", what);
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    switch (f->kind) {
    case DENSE_SMOLLM3:
        if ((rc = parse_smollm3(root, what, c, err))) return rc;
        break;
    case DENSE_GRANITE:
        if ((rc = parse_granite(root, what, c, err))) return rc;
        break;
    case DENSE_MINISTRAL:
        /* Every layer slides unless layer_types says otherwise; q/k/v/o and the MLP have no
         * biases whatever attention_bias says (MinistralAttention builds them without). */
        c->qkv_bias = c->o_bias = c->mlp_bias = 0;
        if ((rc = read_window(root, what, 4096, c, err)) || (rc = read_layer_types(root, what, c, &given, err))) return rc;
        for (int64_t i = 0; !given && i < c->n_layers; i++) c->layer_sliding[i] = c->sliding_window > 0;
        for (int64_t i = 0; i < c->n_layers; i++)
            if (c->layer_sliding[i] && c->sliding_window <= 0)
                return qd_err_set(err, QD_EFORMAT, "%s: layer_types has sliding_attention layers but sliding_window is null",
                                  what);
        break;
    case DENSE_SEED_OSS:
        /* attention_bias (q, k, v; default true) and attention_out_bias (o_proj) apart. */
        c->qkv_bias = 1;
        c->o_bias = 0;
        if ((rc = qd_cfg_get_bool(root, "attention_bias", &c->qkv_bias, what, err)) ||
            (rc = qd_cfg_get_bool(root, "attention_out_bias", &c->o_bias, what, err)))
            return rc;
        break;
    case DENSE_ERNIE: {
        /* use_bias: every linear of the block; RoPE rotates the pairs (x0, x1), (x2, x3), ...
         * over the whole head (its own default RoPE takes no partial_rotary_factor). */
        int use_bias = 0;
        if ((rc = qd_cfg_get_bool(root, "use_bias", &use_bias, what, err))) return rc;
        c->qkv_bias = c->o_bias = c->mlp_bias = use_bias;
        c->rope_interleave = 1;
        if (c->rope.partial_rotary_factor != 1.0f)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported for %s (its RoPE turns "
                              "the whole head)", what, (double)c->rope.partial_rotary_factor, c->architecture);
        break;
    }
    case DENSE_APERTUS: {
        /* ApertusConfig: xIELU (its parameters are the block's tensors), q/k norms before
         * RoPE, no MLP biases; without rope_parameters and rope_scaling, llama3 RoPE with
         * theta 1.2e7, factor 8, original 8192 (a top-level rope_theta is then ignored). */
        c->qk_norm = QD_QK_NORM_HEAD;
        c->mlp_bias = 0;
        if (absent(root, "hidden_act")) strcpy(c->activation, "xielu");
        const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
        if ((!rp || cJSON_IsNull(rp)) && (!rs || cJSON_IsNull(rs))) {
            c->rope.type = QD_ROPE_LLAMA3;
            c->rope.factor = 8.0f;
            c->rope.has_factor = 1;
            c->rope.low_freq_factor = 1.0f;
            c->rope.high_freq_factor = 4.0f;
            c->rope.orig_max_pos = 8192;
            c->rope_theta = 12000000.0f;
        }
        break;
    }
    case DENSE_MINISTRAL3:
        /* No biases (Ministral3Attention and its MLP are built without); sliding_window, when
         * set, windows every layer; layer_types is not read by transformers here (it warns). */
        c->qkv_bias = c->o_bias = c->mlp_bias = 0;
        if ((rc = read_window(root, what, 0, c, err))) return rc;
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sliding[i] = c->sliding_window > 0;
        break;
    case DENSE_HUNYUAN:
        /* query_layernorm and key_layernorm on every layer (after RoPE, arch_dense.c); the
         * MLP has no biases whatever mlp_bias says. */
        c->qk_norm = QD_QK_NORM_HEAD;
        c->mlp_bias = 0;
        break;
    default:
        break;
    }
    /* Families without windows: a sliding layer or a window key is refused by name. */
    if (f->kind != DENSE_SMOLLM3 && f->kind != DENSE_MINISTRAL && f->kind != DENSE_MINISTRAL3) {
        int use_sw = 0;
        if ((rc = qd_cfg_get_bool(root, "use_sliding_window", &use_sw, what, err)) ||
            (rc = read_layer_types(root, what, c, &given, err)))
            return rc;
        for (int64_t i = 0; i < c->n_layers; i++)
            if (c->layer_sliding[i] || use_sw)
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: sliding_attention layers (layer_types, use_sliding_window) are "
                                  "not supported for %s", what, c->architecture);
        c->sliding_window = 0;
    }
    /* Keys that change the math in other families and that these do not have. */
    static const char *const foreign[] = {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                                          "rope_local_base_freq"};
    if ((rc = qd_cfg_refuse_foreign(root, foreign, QD_CFG_NKEYS(foreign), 0, what, c->architecture, err))) return rc;
    if (f->kind != DENSE_GRANITE) {
        static const char *const granite[] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier",
                                              "logits_scaling"};
        if ((rc = qd_cfg_refuse_foreign(root, granite, QD_CFG_NKEYS(granite), 0, what, c->architecture, err))) return rc;
    }
    c->rope_local = c->rope;
    c->rope_theta_local = c->rope_theta;
    return 0;
}
