/* The RoPE part of config.json (see config.h, qd_rope_config): rope_theta and the scaling
 * type with its parameters, from transformers 5's `rope_parameters` (one object, or one per
 * layer type) or the older top-level `rope_theta` + `rope_scaling` (whose type key is "type"
 * or "rope_type"), plus Gemma 3's older `rope_local_base_freq`. Every key of the
 * RoPE object must be one this type uses: a key that would change the frequencies and that
 * quantd does not implement is refused by name, never ignored. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

static const struct { const char *name; qd_rope_type type; const char *keys; } rope_types[] = {
    {"default", QD_ROPE_DEFAULT, ""},
    {"linear", QD_ROPE_LINEAR, "factor"},
    {"dynamic", QD_ROPE_DYNAMIC, "factor"},
    {"llama3", QD_ROPE_LLAMA3, "factor low_freq_factor high_freq_factor original_max_position_embeddings"},
    {"yarn", QD_ROPE_YARN,
     "factor original_max_position_embeddings attention_factor beta_fast beta_slow mscale mscale_all_dim truncate"},
    {"longrope", QD_ROPE_LONGROPE,
     "short_factor long_factor factor original_max_position_embeddings attention_factor short_mscale long_mscale"},
};

/* 1 when key is a word of the space-separated list. */
static int in_list(const char *list, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = list; (p = strstr(p, key)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

static int get_factors(const cJSON *o, const char *key, float *out, int *n, const char *what, qd_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a)) return qd_err_set(err, QD_EFORMAT, "%s: rope %s must be a list of numbers", what, key);
    int k = cJSON_GetArraySize(a);
    if (k <= 0 || k > QD_ROPE_CFG_MAX_FACTORS)
        return qd_err_set(err, QD_EFORMAT, "%s: rope %s has %d entries (1 to %d)", what, key, k, QD_ROPE_CFG_MAX_FACTORS);
    if (*n && *n != k) return qd_err_set(err, QD_EFORMAT, "%s: rope short_factor and long_factor differ in length", what);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0))
            return qd_err_set(err, QD_EFORMAT, "%s: rope %s[%d] must be a positive number", what, key, i);
        out[i++] = (float)e->valuedouble;
    }
    *n = k;
    return 0;
}

static void rope_defaults(qd_rope_config *r)
{
    memset(r, 0, sizeof *r);
    r->factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->truncate = 1;
    r->partial_rotary_factor = 1.0f;
}

/* One RoPE object (rope_parameters, one of its per-layer-type entries, or rope_scaling) on
 * top of the top-level keys; src NULL: the top-level keys alone. */
static int parse_one(const cJSON *root, const cJSON *src, const char *src_name, int theta_inside,
                     qd_rope_config *r, float *theta, const char *what, qd_err *err)
{
    rope_defaults(r);
    int rc;
    if ((rc = qd_cfg_get_float(root, "partial_rotary_factor", &r->partial_rotary_factor, what, err))) return rc;
    /* rope_theta: top level (older files), or inside rope_parameters (transformers 5). */
    if ((rc = qd_cfg_get_float(root, "rope_theta", theta, what, err))) return rc;
    if (src && theta_inside && (rc = qd_cfg_get_float(src, "rope_theta", theta, what, err))) return rc;
    /* The original context may also sit at the top level (Phi-3's longrope). */
    if ((rc = qd_cfg_get_int(root, "original_max_position_embeddings", &r->orig_max_pos, what, err))) return rc;
    if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
        return qd_err_set(err, QD_EFORMAT, "%s: partial_rotary_factor must be in (0, 1]", what);
    if (!src) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(src, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(src, "type");
    const char *tname = cJSON_IsString(t) ? t->valuestring : "default";
    if (t && !cJSON_IsString(t)) return qd_err_set(err, QD_EFORMAT, "%s: %s.rope_type must be a string", what, src_name);
    size_t ti = 0, nt = sizeof rope_types / sizeof rope_types[0];
    while (ti < nt && strcmp(rope_types[ti].name, tname)) ti++;
    if (ti == nt)
        return qd_err_set(err, QD_EUNSUPPORTED,
                          "%s: %s rope_type \"%s\" is not supported (default, linear, dynamic, llama3, yarn, longrope)",
                          what, src_name, tname);
    r->type = rope_types[ti].type;
    const cJSON *e;
    cJSON_ArrayForEach(e, src) {
        const char *k = e->string;
        if (!strcmp(k, "rope_type") || !strcmp(k, "type") || !strcmp(k, "rope_theta") ||
            !strcmp(k, "partial_rotary_factor") || in_list(rope_types[ti].keys, k))
            continue;
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s.%s is not supported for rope_type \"%s\"", what, src_name, k, tname);
    }
    int64_t orig = 0;
    if ((rc = qd_cfg_get_float(src, "partial_rotary_factor", &r->partial_rotary_factor, what, err)) ||
        (rc = qd_cfg_get_float(src, "factor", &r->factor, what, err)) ||
        (rc = qd_cfg_get_float(src, "low_freq_factor", &r->low_freq_factor, what, err)) ||
        (rc = qd_cfg_get_float(src, "high_freq_factor", &r->high_freq_factor, what, err)) ||
        (rc = qd_cfg_get_int(src, "original_max_position_embeddings", &orig, what, err)) ||
        (rc = qd_cfg_get_float(src, "attention_factor", &r->attention_factor, what, err)) ||
        (rc = qd_cfg_get_float(src, "beta_fast", &r->beta_fast, what, err)) ||
        (rc = qd_cfg_get_float(src, "beta_slow", &r->beta_slow, what, err)) ||
        (rc = qd_cfg_get_float(src, "mscale", &r->mscale, what, err)) ||
        (rc = qd_cfg_get_float(src, "mscale_all_dim", &r->mscale_all_dim, what, err)) ||
        (rc = qd_cfg_get_bool(src, "truncate", &r->truncate, what, err)) ||
        (rc = qd_cfg_get_float(src, "short_mscale", &r->short_mscale, what, err)) ||
        (rc = qd_cfg_get_float(src, "long_mscale", &r->long_mscale, what, err)))
        return rc;
    if (orig) r->orig_max_pos = orig;
    r->has_factor = cJSON_GetObjectItemCaseSensitive(src, "factor") != NULL;
    if (r->type == QD_ROPE_LONGROPE &&
        ((rc = get_factors(src, "short_factor", r->short_factor, &r->n_factors, what, err)) ||
         (rc = get_factors(src, "long_factor", r->long_factor, &r->n_factors, what, err))))
        return rc;
    if (!(r->factor > 0) || !isfinite(r->factor))
        return qd_err_set(err, QD_EFORMAT, "%s: %s.factor must be positive", what, src_name);
    if ((r->type == QD_ROPE_LINEAR || r->type == QD_ROPE_DYNAMIC || r->type == QD_ROPE_LLAMA3 || r->type == QD_ROPE_YARN) &&
        !cJSON_GetObjectItemCaseSensitive(src, "factor"))
        return qd_err_set(err, QD_EFORMAT, "%s: %s rope_type \"%s\" needs factor", what, src_name, tname);
    /* high_freq_factor equal to low_freq_factor (Llama 4 Scout's 1 and 1): no band is smoothed,
     * every frequency is kept or divided, as transformers computes it (it only warns). */
    if (r->type == QD_ROPE_LLAMA3 && (!(r->low_freq_factor > 0) || !(r->high_freq_factor >= r->low_freq_factor) || orig <= 0))
        return qd_err_set(err, QD_EFORMAT,
                          "%s: %s llama3 needs low_freq_factor > 0, high_freq_factor >= low_freq_factor and "
                          "original_max_position_embeddings > 0", what, src_name);
    if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
        return qd_err_set(err, QD_EFORMAT, "%s: partial_rotary_factor must be in (0, 1]", what);
    return 0;
}

int qd_config_rope_parse(const cJSON *root, const char *what, int layer_types, qd_model_config *c, qd_err *err)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (params && cJSON_IsNull(params)) params = NULL;
    if (legacy && cJSON_IsNull(legacy)) legacy = NULL;
    if ((params && !cJSON_IsObject(params)) || (legacy && !cJSON_IsObject(legacy)))
        return qd_err_set(err, QD_EFORMAT, "%s: %s must be an object", what, params ? "rope_parameters" : "rope_scaling");
    const cJSON *full = params ? cJSON_GetObjectItemCaseSensitive(params, "full_attention") : NULL;
    const cJSON *slide = params ? cJSON_GetObjectItemCaseSensitive(params, "sliding_attention") : NULL;
    int rc;
    if (full || slide) {
        /* transformers 5 writes one RoPE per layer type for families that have layer types
         * (Gemma 3: a local base for the sliding layers, scaling on the global ones). */
        if (!layer_types)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_parameters per layer type is not supported for %s", what,
                              c->architecture);
        const cJSON *e;
        cJSON_ArrayForEach(e, params)
            if (strcmp(e->string, "full_attention") && strcmp(e->string, "sliding_attention"))
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_parameters.%s: layer type not supported (full_attention, sliding_attention)",
                                  what, e->string);
        if (!full || !slide || !cJSON_IsObject(full) || !cJSON_IsObject(slide))
            return qd_err_set(err, QD_EFORMAT, "%s: rope_parameters per layer type needs full_attention and sliding_attention objects", what);
        if ((rc = parse_one(root, full, "rope_parameters.full_attention", 1, &c->rope, &c->rope_theta, what, err)) ||
            (rc = parse_one(root, slide, "rope_parameters.sliding_attention", 1, &c->rope_local, &c->rope_theta_local, what, err)))
            return rc;
        return 0;
    }
    const cJSON *src = params ? params : legacy;
    if ((rc = parse_one(root, src, params ? "rope_parameters" : "rope_scaling", params != NULL, &c->rope, &c->rope_theta,
                        what, err)))
        return rc;
    /* One RoPE for every layer; Gemma 3's older files give the local layers their own base
     * (rope_local_base_freq) and apply rope_scaling to the global ones only. */
    c->rope_local = c->rope;
    c->rope_theta_local = c->rope_theta;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "rope_local_base_freq");
    if (lb && !cJSON_IsNull(lb)) {
        if (!layer_types)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_local_base_freq is set, which %s does not have; not supported",
                              what, c->architecture);
        rope_defaults(&c->rope_local);
        c->rope_local.partial_rotary_factor = c->rope.partial_rotary_factor;
        if ((rc = qd_cfg_get_float(root, "rope_local_base_freq", &c->rope_theta_local, what, err))) return rc;
        if (!(c->rope_theta_local > 0))
            return qd_err_set(err, QD_EFORMAT, "%s: rope_local_base_freq must be positive", what);
    }
    return 0;
}
