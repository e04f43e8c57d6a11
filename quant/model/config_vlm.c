/* Vision-language checkpoints whose text tower quantd quantizes (Qwen2-VL, Qwen2.5-VL,
 * Qwen3-VL, Gemma 3, Mistral-3, Llama 4): their config.json nests the text decoder's keys in
 * `text_config` (Qwen2-VL's and Qwen2.5-VL's Hub files keep them flat, at the top level,
 * which transformers reads the same way). This file turns such a config into the text config
 * the rotary-decoder parser reads (config.c, config_family.c): a copy of the text keys with
 * the text config class's defaults filled in where a key is absent (Gemma3TextConfig's, not
 * LlamaConfig's: the Hub's gemma-3 files leave out head_dim, vocab_size and the RoPE bases),
 * the word-embedding tie the outer config decides, and the multimodal RoPE spelled as the 1-D
 * RoPE it is for text.
 *
 * M-RoPE (Qwen2-VL's and Qwen2.5-VL's mrope_section, Qwen3-VL's interleaved one) rotates each
 * frequency by one of three position streams (time, height, width); for text-only ids
 * transformers' get_rope_index gives all three the token's position, so every frequency turns
 * by that position: the 1-D RoPE (tests/families make_goldens.py proves it against the
 * text-only CausalLM on the same weights). mrope_section must cover head_dim/2 frequencies;
 * any other RoPE key is left for config_rope.c, which refuses what it does not implement. The
 * vision tower and projector are not read: the output writer copies them byte for byte. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "quant/model/config_internal.h"

typedef struct vlm_family {
    const char *arch;          /* the ConditionalGeneration class */
    const char *text_types;    /* text_config model_type values accepted, space-separated */
    int flat_ok;               /* the text keys may sit at the top level (no text_config) */
    int tie_dflt;              /* the outer config's tie_word_embeddings default */
    int tie_from_text;         /* an older save's text_config tie true ties too (Qwen2-VL's, Qwen2.5-VL's BC) */
    const char *defaults;      /* the text config class's defaults, as JSON */
} vlm_family;

/* Defaults of Qwen2VLTextConfig, Qwen2_5_VLTextConfig, Qwen3VLTextConfig, Gemma3TextConfig and MistralConfig
 * (transformers 5.23), including each class's default_theta. */
static const vlm_family families[] = {
    /* Qwen2VLTextConfig's defaults are Qwen2_5_VLTextConfig's, key for key. */
    {"Qwen2VLForConditionalGeneration", "qwen2_vl_text", 1, 0, 1,
     "{\"vocab_size\":152064,\"hidden_size\":8192,\"intermediate_size\":29568,\"num_hidden_layers\":80,"
     "\"num_attention_heads\":64,\"num_key_value_heads\":8,\"hidden_act\":\"silu\",\"max_position_embeddings\":32768,"
     "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0}"},
    {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl_text", 1, 0, 1,
     "{\"vocab_size\":152064,\"hidden_size\":8192,\"intermediate_size\":29568,\"num_hidden_layers\":80,"
     "\"num_attention_heads\":64,\"num_key_value_heads\":8,\"hidden_act\":\"silu\",\"max_position_embeddings\":32768,"
     "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0}"},
    {"Qwen3VLForConditionalGeneration", "qwen3_vl_text", 0, 0, 0,
     "{\"vocab_size\":151936,\"hidden_size\":4096,\"intermediate_size\":22016,\"num_hidden_layers\":32,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":32,\"head_dim\":128,\"hidden_act\":\"silu\","
     "\"max_position_embeddings\":128000,\"rms_norm_eps\":1e-06,\"attention_bias\":false,\"rope_theta\":500000.0}"},
    {"Gemma3ForConditionalGeneration", "gemma3_text", 0, 1, 0,
     "{\"vocab_size\":262208,\"hidden_size\":2304,\"intermediate_size\":9216,\"num_hidden_layers\":26,"
     "\"num_attention_heads\":8,\"num_key_value_heads\":4,\"head_dim\":256,\"hidden_activation\":\"gelu_pytorch_tanh\","
     "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-06,\"attention_bias\":false,"
     "\"query_pre_attn_scalar\":256,\"sliding_window\":4096}"},
    /* Llama4TextConfig's defaults are config_llama4.c's (absent keys read there). */
    {"Llama4ForConditionalGeneration", "llama4_text", 0, 0, 0, "{}"},
    {"Mistral3ForConditionalGeneration", "mistral", 0, 1, 0,
     "{\"vocab_size\":32000,\"hidden_size\":4096,\"intermediate_size\":14336,\"num_hidden_layers\":32,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"hidden_act\":\"silu\",\"max_position_embeddings\":131072,"
     "\"rms_norm_eps\":1e-06,\"sliding_window\":4096,\"rope_theta\":10000.0}"},
};

/* The text keys of the flat layout: what transformers moves into text_config (the text
 * config class's arguments). The others (vision_config, token ids of the images, the
 * quantization_config) stay with the outer config. */
static const char *const flat_keys[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "use_sliding_window",
    "sliding_window", "max_window_layers", "layer_types", "attention_bias", "rope_parameters", "rope_scaling",
    "rope_theta", "bos_token_id", "eos_token_id", "tie_word_embeddings", "mlp_bias",
};

static const vlm_family *family_of(const char *arch)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].arch, arch)) return &families[i];
    return NULL;
}

int qd_config_vlm_is(const char *arch) { return family_of(arch) != NULL; }

static int in_words(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

/* Qwen's multimodal RoPE keys in one RoPE object: mrope_section (three counts of
 * frequencies, summing to head_dim/2) and mrope_interleaved are checked and removed, and
 * rope_type "mrope" (Qwen2(.5)-VL's older spelling, which transformers reads as "default")
 * becomes "default". */
static int strip_mrope(cJSON *rope, const char *name, int64_t head_dim, const char *what, qd_err *err)
{
    if (!cJSON_IsObject(rope)) return 0;
    const char *tkey = cJSON_GetObjectItemCaseSensitive(rope, "rope_type") ? "rope_type" : "type";
    cJSON *t = cJSON_GetObjectItemCaseSensitive(rope, tkey);
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "mrope"))
        cJSON_ReplaceItemInObjectCaseSensitive(rope, tkey, cJSON_CreateString("default"));
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(rope, "mrope_section");
    if (sec && !cJSON_IsNull(sec)) {
        int64_t sum = 0;
        int ok = cJSON_IsArray(sec) && cJSON_GetArraySize(sec) == 3;
        const cJSON *e;
        cJSON_ArrayForEach(e, sec) {
            ok = ok && cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble == (double)(int64_t)e->valuedouble;
            if (ok) sum += (int64_t)e->valuedouble;
        }
        if (!ok || sum != head_dim / 2)
            return qd_err_set(err, QD_EFORMAT, "%s: %s.mrope_section must be three counts of frequencies summing to "
                              "head_dim/2 = %lld", what, name, (long long)(head_dim / 2));
    }
    cJSON_DeleteItemFromObjectCaseSensitive(rope, "mrope_section");
    const cJSON *il = cJSON_GetObjectItemCaseSensitive(rope, "mrope_interleaved");
    if (il && !cJSON_IsNull(il) && !cJSON_IsBool(il))
        return qd_err_set(err, QD_EFORMAT, "%s: %s.mrope_interleaved must be true or false", what, name);
    cJSON_DeleteItemFromObjectCaseSensitive(rope, "mrope_interleaved");
    return 0;
}

/* Gemma3TextConfig's RoPE defaults: the global layers' base 1000000, the sliding layers'
 * 10000, in whichever spelling the file uses. */
static void gemma_rope_defaults(cJSON *text)
{
    cJSON *p = cJSON_GetObjectItemCaseSensitive(text, "rope_parameters");
    cJSON *full = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "full_attention") : NULL;
    cJSON *slide = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "sliding_attention") : NULL;
    if (cJSON_IsObject(full) && !cJSON_GetObjectItemCaseSensitive(full, "rope_theta"))
        cJSON_AddNumberToObject(full, "rope_theta", 1000000.0);
    if (cJSON_IsObject(slide) && !cJSON_GetObjectItemCaseSensitive(slide, "rope_theta"))
        cJSON_AddNumberToObject(slide, "rope_theta", 10000.0);
    if (full || slide) return;
    if (cJSON_IsObject(p) && !cJSON_GetObjectItemCaseSensitive(p, "rope_theta") &&
        !cJSON_GetObjectItemCaseSensitive(text, "rope_theta"))
        cJSON_AddNumberToObject(p, "rope_theta", 1000000.0);
    if (!cJSON_GetObjectItemCaseSensitive(text, "rope_theta") && !cJSON_IsObject(p))
        cJSON_AddNumberToObject(text, "rope_theta", 1000000.0);
    if (!cJSON_GetObjectItemCaseSensitive(text, "rope_local_base_freq"))
        cJSON_AddNumberToObject(text, "rope_local_base_freq", 10000.0);
}

int qd_config_vlm_text(const cJSON *root, const char *what, const char *arch, cJSON **out, qd_err *err)
{
    *out = NULL;
    const vlm_family *f = family_of(arch);
    if (!f) return 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && cJSON_IsNull(tc)) tc = NULL;
    if (tc && !cJSON_IsObject(tc)) return qd_err_set(err, QD_EFORMAT, "%s: text_config must be an object", what);
    if (!tc && !f->flat_ok)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s without text_config is not supported (the text decoder's keys "
                          "are read from text_config)", what, arch);
    cJSON *text = NULL;
    if (tc) {
        text = cJSON_Duplicate(tc, 1);
    } else {
        text = cJSON_CreateObject();
        for (size_t i = 0; text && i < sizeof flat_keys / sizeof flat_keys[0]; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, flat_keys[i]);
            if (v) cJSON_AddItemToObject(text, flat_keys[i], cJSON_Duplicate(v, 1));
        }
    }
    cJSON *dflt = cJSON_Parse(f->defaults);
    if (!text || !dflt) {
        cJSON_Delete(text);
        cJSON_Delete(dflt);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory", what);
    }
    int rc = 0;
    char mt[32] = "";
    if ((rc = qd_cfg_get_str(text, "model_type", mt, sizeof mt, what, err))) goto fail;
    if (tc && mt[0] && !in_words(f->text_types, mt)) {   /* absent: the class's own, as transformers reads it */
        rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: text_config.model_type \"%s\" is not supported for %s (%s)", what,
                        mt, arch, f->text_types);
        goto fail;
    }
    /* Keys the text config class defaults and the file leaves out. RoPE's base goes where the
     * file puts RoPE (rope_parameters carries its own in transformers 5). */
    const cJSON *e;
    cJSON_ArrayForEach(e, dflt) {
        if (cJSON_GetObjectItemCaseSensitive(text, e->string)) continue;
        if (!strcmp(e->string, "rope_theta")) {
            cJSON *p = cJSON_GetObjectItemCaseSensitive(text, "rope_parameters");
            if (cJSON_IsObject(p) && !cJSON_GetObjectItemCaseSensitive(p, "rope_theta"))
                cJSON_AddNumberToObject(p, "rope_theta", e->valuedouble);
            if (cJSON_IsObject(p)) continue;
        }
        cJSON_AddItemToObject(text, e->string, cJSON_Duplicate(e, 1));
    }
    if (!strcmp(arch, "Gemma3ForConditionalGeneration")) {
        gemma_rope_defaults(text);
        /* Gemma3ForConditionalGeneration's forward never applies it (Gemma3ForCausalLM's
         * does, and so does vLLM's gemma3_mm through its language model): the two
         * references differ, so neither is computed. */
        const cJSON *cap = cJSON_GetObjectItemCaseSensitive(text, "final_logit_softcapping");
        if (cap && !cJSON_IsNull(cap)) {
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: text_config.final_logit_softcapping is set, which transformers' "
                            "Gemma3ForConditionalGeneration does not apply (its CausalLM and vLLM do); not supported",
                            what);
            goto fail;
        }
    }
    /* The dtype the weights are stored in: the outer config's (the text one when only it
     * has one). */
    static const char *const dkeys[] = {"dtype", "torch_dtype"};
    for (int i = 0; i < 2; i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, dkeys[i]);
        if (!cJSON_IsString(d)) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(text, dkeys[i]);
        cJSON_AddStringToObject(text, dkeys[i], d->valuestring);
    }
    /* The tie is the outer config's (transformers 5 ties where the outer config says so);
     * Qwen2(.5)-VL's pre-5 saves put it in text_config, which transformers forwards. */
    int tie = f->tie_dflt, text_tie = 0;
    if ((rc = qd_cfg_get_bool(root, "tie_word_embeddings", &tie, what, err))) goto fail;
    if (tc && (rc = qd_cfg_get_bool(tc, "tie_word_embeddings", &text_tie, what, err))) goto fail;
    if (f->tie_from_text && text_tie) tie = 1;
    cJSON_DeleteItemFromObjectCaseSensitive(text, "tie_word_embeddings");
    cJSON_AddBoolToObject(text, "tie_word_embeddings", tie);
    /* Qwen's multimodal RoPE, the 1-D RoPE for text. */
    if (!strncmp(arch, "Qwen", 4)) {
        int64_t heads = 0, hidden = 0, hd = 0;
        if ((rc = qd_cfg_get_int(text, "num_attention_heads", &heads, what, err)) ||
            (rc = qd_cfg_get_int(text, "hidden_size", &hidden, what, err)) ||
            (rc = qd_cfg_get_int(text, "head_dim", &hd, what, err)))
            goto fail;
        if (!hd && heads > 0) hd = hidden / heads;
        if ((rc = strip_mrope(cJSON_GetObjectItemCaseSensitive(text, "rope_parameters"), "rope_parameters", hd, what, err)) ||
            (rc = strip_mrope(cJSON_GetObjectItemCaseSensitive(text, "rope_scaling"), "rope_scaling", hd, what, err)))
            goto fail;
    }
    cJSON_Delete(dflt);
    *out = text;
    return 0;
fail:
    cJSON_Delete(dflt);
    cJSON_Delete(text);
    return rc;
}
