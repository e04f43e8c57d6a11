/* config.json → qd_model_config. Defaults follow the transformers config classes
 * (LlamaConfig, MistralConfig, Qwen2Config, OPTConfig; the other families' own keys in
 * config_family.c) so a minimal config.json behaves as
 * transformers would load it; every inconsistency is reported with the field's name. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/formats/format.h"
#include "quant/model/config_internal.h"

static const struct { const char *arch; qd_arch_family family; } arch_names[] = {
    {"LlamaForCausalLM", QD_ARCH_LLAMA},
    {"MistralForCausalLM", QD_ARCH_LLAMA},
    {"Qwen2ForCausalLM", QD_ARCH_LLAMA},
    {"Qwen3ForCausalLM", QD_ARCH_LLAMA},
    {"Gemma2ForCausalLM", QD_ARCH_LLAMA},
    {"Gemma3ForCausalLM", QD_ARCH_LLAMA},
    {"Phi3ForCausalLM", QD_ARCH_LLAMA},
    {"MixtralForCausalLM", QD_ARCH_LLAMA},
    {"Qwen2MoeForCausalLM", QD_ARCH_LLAMA},
    {"Qwen3MoeForCausalLM", QD_ARCH_LLAMA},
    {"DeepseekV2ForCausalLM", QD_ARCH_LLAMA},
    {"DeepseekV3ForCausalLM", QD_ARCH_LLAMA},
    {"DeepseekV32ForCausalLM", QD_ARCH_LLAMA},
    {"Glm4MoeForCausalLM", QD_ARCH_LLAMA},
    {"Dots1ForCausalLM", QD_ARCH_LLAMA},
    {"OlmoeForCausalLM", QD_ARCH_LLAMA},
    {"MiniMaxM2ForCausalLM", QD_ARCH_LLAMA},
    {"Ernie4_5_MoeForCausalLM", QD_ARCH_LLAMA},
    {"PhimoeForCausalLM", QD_ARCH_LLAMA},
    {"Lfm2ForCausalLM", QD_ARCH_LLAMA},
    {"GraniteMoeHybridForCausalLM", QD_ARCH_LLAMA},
    {"FalconH1ForCausalLM", QD_ARCH_LLAMA},
    {"Qwen3NextForCausalLM", QD_ARCH_LLAMA},
    {"Qwen3_5ForCausalLM", QD_ARCH_LLAMA},
    {"Qwen3_5MoeForCausalLM", QD_ARCH_LLAMA},
    {"Starcoder2ForCausalLM", QD_ARCH_LLAMA},
    {"PhiForCausalLM", QD_ARCH_LLAMA},
    {"GPTNeoXForCausalLM", QD_ARCH_LLAMA},
    {"Cohere2ForCausalLM", QD_ARCH_LLAMA},
    {"Olmo2ForCausalLM", QD_ARCH_LLAMA},
    {"Olmo3ForCausalLM", QD_ARCH_LLAMA},
    {"Exaone4ForCausalLM", QD_ARCH_LLAMA},
    {"Glm4ForCausalLM", QD_ARCH_LLAMA},
    {"SmolLM3ForCausalLM", QD_ARCH_LLAMA},
    {"GraniteForCausalLM", QD_ARCH_LLAMA},
    {"MinistralForCausalLM", QD_ARCH_LLAMA},
    {"SeedOssForCausalLM", QD_ARCH_LLAMA},
    {"Ernie4_5ForCausalLM", QD_ARCH_LLAMA},
    {"ApertusForCausalLM", QD_ARCH_LLAMA},
    {"HunYuanDenseV1ForCausalLM", QD_ARCH_LLAMA},
    {"Ministral3ForCausalLM", QD_ARCH_LLAMA},
    {"GptOssForCausalLM", QD_ARCH_LLAMA},
    {"Llama4ForCausalLM", QD_ARCH_LLAMA},
    {"OPTForCausalLM", QD_ARCH_OPT},
    /* Vision-language models: their text tower (config_vlm.c) */
    {"Qwen2VLForConditionalGeneration", QD_ARCH_LLAMA},
    {"Qwen2_5_VLForConditionalGeneration", QD_ARCH_LLAMA},
    {"Qwen3VLForConditionalGeneration", QD_ARCH_LLAMA},
    {"Gemma3ForConditionalGeneration", QD_ARCH_LLAMA},
    {"Mistral3ForConditionalGeneration", QD_ARCH_LLAMA},
    {"Llama4ForConditionalGeneration", QD_ARCH_LLAMA},
};

qd_arch_family qd_arch_family_of(const char *architecture)
{
    if (!architecture) return QD_ARCH_UNKNOWN;
    for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++)
        if (!strcmp(arch_names[i].arch, architecture)) return arch_names[i].family;
    return QD_ARCH_UNKNOWN;
}

int qd_cfg_layer_types_sliding(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!lt || cJSON_IsNull(lt)) return 0;
    if (c->n_layers > QD_CFG_MAX_LAYERS)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: num_hidden_layers %lld is more than the %d layers supported", what,
                          (long long)c->n_layers, QD_CFG_MAX_LAYERS);
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
        return qd_err_set(err, QD_EFORMAT, "%s: layer_types must be a list of num_hidden_layers (%lld) strings", what,
                          (long long)c->n_layers);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, lt) {
        if (cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")) c->layer_sliding[i] = 1;
        else if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types[%d] \"%s\" is not supported for %s (sliding_attention, "
                              "full_attention)", what, i, cJSON_IsString(e) ? e->valuestring : "?", c->architecture);
        i++;
    }
    return 1;
}

/* Reads an integer field; absent or null keeps *out (the default). */
int qd_cfg_get_int(const cJSON *o, const char *key, int64_t *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    /* Range first: converting a double outside int64 is undefined behaviour (found by fuzzing). */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -9223372036854775808.0 && v->valuedouble < 9223372036854775808.0) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return qd_err_set(err, QD_EFORMAT, "%s: %s must be an integer", what, key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

int qd_cfg_get_float(const cJSON *o, const char *key, float *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return qd_err_set(err, QD_EFORMAT, "%s: %s must be a number", what, key);
    *out = (float)v->valuedouble;
    return 0;
}

int qd_cfg_get_bool(const cJSON *o, const char *key, int *out, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return qd_err_set(err, QD_EFORMAT, "%s: %s must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int qd_cfg_absent(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v);
}

int qd_cfg_refuse_foreign(const cJSON *root, const char *const *keys, size_t n, int false_unset, const char *what,
                          const char *arch, qd_err *err)
{
    for (size_t i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (v && !cJSON_IsNull(v) && !(false_unset && cJSON_IsFalse(v)))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: %s is set, which %s does not have; not supported", what, keys[i],
                              arch);
    }
    return 0;
}

int qd_cfg_get_str(const cJSON *o, const char *key, char *out, size_t cap, const char *what, qd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return qd_err_set(err, QD_EFORMAT, "%s: %s must be a string", what, key);
    if (strlen(v->valuestring) >= cap)
        return qd_err_set(err, QD_EFORMAT, "%s: %s \"%.40s...\" is too long", what, key, v->valuestring);
    strcpy(out, v->valuestring);
    return 0;
}

/* quantization_config: which format wrote it and what it says is the format table's
 * business (qd_format_detect asks every descriptor). */
static int parse_quant(const cJSON *q, const char *what, qd_model_config *c, qd_err *err)
{
    qd_fmt_detected d;
    const qd_format *f = NULL;
    int rc = qd_format_detect(q, what, &f, &d, err);
    if (rc) return rc;
    c->quantized = 1;
    snprintf(c->quant_format, sizeof c->quant_format, "%s", f->name);
    c->quant_bits = d.bits;
    c->quant_group_size = d.group_size;
    c->quant_sym = d.sym;
    c->quant_desc_act = d.desc_act;
    c->quant_grid = (int)d.grid;
    c->quant_scale_rule = (int)d.scale_rule;
    c->quant_row_block = d.row_block;
    c->quant_act = d.act;
    return 0;
}

/* quant_method "fp8" (transformers' fine-grained FP8, as DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8,
 * GLM-4.5-FP8 and MiniMax-M2 ship): a source format the loader reads, dequantizing each FP8
 * linear block by block (model_fp8.c), not one of the format table's outputs, so
 * qd_format_detect is never asked. fmt is "e4m3" (Qwen3's configs leave it out, as
 * transformers' default does); weight_block_size [bn, bk] is required: without it there are
 * no weight_scale_inv blocks to read. activation_scheme concerns the serving kernels, and
 * modules_to_not_convert names linears whose weights are stored in float, which the loader
 * sees from their dtype: neither changes what is read. */
static int parse_source_fp8(const cJSON *q, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "fmt");
    if (fmt && !cJSON_IsNull(fmt) && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "e4m3")))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.fmt %s%.40s%s is not supported: FP8 checkpoints "
                          "are read in \"e4m3\" (F8_E4M3 weights)", what, cJSON_IsString(fmt) ? "\"" : "",
                          cJSON_IsString(fmt) ? fmt->valuestring : "(not a string)", cJSON_IsString(fmt) ? "\"" : "");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!bs || cJSON_IsNull(bs))
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.weight_block_size is missing: quantd reads FP8 "
                          "checkpoints whose linears carry weight_scale_inv blocks (weight_block_size [128, 128] as "
                          "DeepSeek-V3 ships), not one scale per tensor", what);
    int64_t b[2] = {0, 0};
    int ok = cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *v = cJSON_GetArrayItem(bs, i);
        ok = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= (double)(1 << 30) &&
             v->valuedouble == (double)(int64_t)v->valuedouble;
        if (ok) b[i] = (int64_t)v->valuedouble;
    }
    if (!ok)
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.weight_block_size must be two positive integers "
                          "[rows, columns] (e.g. [128, 128])", what);
    c->source_fp8 = 1;
    c->fp8_block_n = b[0];
    c->fp8_block_k = b[1];
    return 0;
}

/* quantization_config: a source format quantd reads as it ships (FP8 blocks, gpt-oss's
 * MXFP4 experts), or a quantd output format. */
static int parse_quant_config(const cJSON *q, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *m = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "quant_method") : NULL;
    const char *method = cJSON_IsString(m) ? m->valuestring : "";
    if (!strcmp(method, "fp8")) return parse_source_fp8(q, what, c, err);
    if (!strcmp(method, "mxfp4")) {
        if (c->layout != QD_LAYOUT_GPT_OSS)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.quant_method \"mxfp4\" (gpt-oss's MXFP4 "
                              "experts in mlp.experts.*_blocks and *_scales tensors) is read for GptOssForCausalLM only; "
                              "this checkpoint is a %s", what, c->architecture);
        /* modules_to_not_convert names what is stored in float, which the loader sees from
         * the tensors; dequantize concerns transformers' loading. Anything else is refused. */
        const cJSON *e;
        cJSON_ArrayForEach(e, q)
            if (strcmp(e->string, "quant_method") && strcmp(e->string, "modules_to_not_convert") &&
                strcmp(e->string, "dequantize"))
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.%s is not supported for an MXFP4 "
                                  "source (quant_method, modules_to_not_convert)", what, e->string);
        c->source_mxfp4 = 1;
        return 0;
    }
    return parse_quant(q, what, c, err);
}

int qd_model_config_parse(const char *json, const char *what, qd_model_config *out, qd_err *err)
{
    qd_model_config c;
    memset(&c, 0, sizeof c);
    int rc = 0;
    cJSON *root = cJSON_Parse(json), *outer = root, *text = NULL;
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: not a JSON object", what);
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) { rc = qd_err_set(err, QD_EFORMAT, "%s: architectures is missing or not a list of strings", what); goto done; }
    snprintf(c.architecture, sizeof c.architecture, "%s", a0->valuestring);
    c.family = qd_arch_family_of(c.architecture);
    if (c.family == QD_ARCH_UNKNOWN) {
        /* The supported list has outgrown one error message: the docs keep it. */
        rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: architecture \"%s\" is not supported (the supported architectures "
                        "are listed in docs/methods.md, Architectures)",
                        what, a0->valuestring);
        goto done;
    }
    if ((rc = qd_cfg_get_str(root, "model_type", c.model_type, sizeof c.model_type, what, err))) goto done;
    /* A vision-language checkpoint: the keys below are its text tower's (quantization_config
     * stays the outer config's). */
    if ((rc = qd_config_vlm_text(outer, what, c.architecture, &text, err))) goto done;
    c.multimodal = text != NULL;
    if (text) root = text;
    /* transformers 5 writes `dtype`, older versions `torch_dtype`. */
    if ((rc = qd_cfg_get_str(root, "dtype", c.torch_dtype, sizeof c.torch_dtype, what, err)) ||
        (rc = qd_cfg_get_str(root, "torch_dtype", c.torch_dtype, sizeof c.torch_dtype, what, err)))
        goto done;
    int64_t bos = -1, eos = -1;
    if ((rc = qd_cfg_get_int(root, "bos_token_id", &bos, what, err)) || (rc = qd_cfg_get_int(root, "eos_token_id", &eos, what, err))) goto done;
    c.bos_id = (int)bos;
    c.eos_id = (int)eos;
    c.n_kv_heads = 0;
    c.rope_theta = 10000.0f;
    c.routed_scale = 1.0f;
    c.pos_offset = 0;
    c.do_layer_norm_before = 1;

    if (c.family == QD_ARCH_LLAMA) {
        c.hidden = 4096; c.intermediate = 11008; c.n_layers = 32; c.n_heads = 32; c.vocab = 32000;
        c.max_pos = 2048; c.norm_eps = 1e-6f;
        strcpy(c.activation, "silu");
        if ((rc = qd_cfg_get_int(root, "hidden_size", &c.hidden, what, err)) ||
            (rc = qd_cfg_get_int(root, "intermediate_size", &c.intermediate, what, err)) ||
            (rc = qd_cfg_get_int(root, "num_hidden_layers", &c.n_layers, what, err)) ||
            (rc = qd_cfg_get_int(root, "num_attention_heads", &c.n_heads, what, err)) ||
            (rc = qd_cfg_get_int(root, "num_key_value_heads", &c.n_kv_heads, what, err)) ||
            (rc = qd_cfg_get_int(root, "head_dim", &c.head_dim, what, err)) ||
            (rc = qd_cfg_get_int(root, "vocab_size", &c.vocab, what, err)) ||
            (rc = qd_cfg_get_int(root, "max_position_embeddings", &c.max_pos, what, err)) ||
            (rc = qd_cfg_get_float(root, "rms_norm_eps", &c.norm_eps, what, err)) ||
            (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c.tie_word_embeddings, what, err)) ||
            (rc = qd_cfg_get_bool(root, "attention_bias", &c.qkv_bias, what, err)) ||
            (rc = qd_cfg_get_bool(root, "mlp_bias", &c.mlp_bias, what, err)) ||
            (rc = qd_cfg_get_str(root, "hidden_act", c.activation, sizeof c.activation, what, err)))
            goto done;
        c.o_bias = c.qkv_bias;
        c.rope_theta_local = c.rope_theta;
        /* RoPE, windows, and what each family changes in the Llama block. */
        if ((rc = qd_config_family_parse(root, what, &c, err))) goto done;
        /* Apertus's MLP is xIELU's (config_dense.c), Gemma's GeGLU, every other gated one SwiGLU. */
        const char *act = c.layout == QD_LAYOUT_GEMMA ? "gelu_pytorch_tanh"
                          : !strcmp(c.architecture, "ApertusForCausalLM") ? "xielu" : "silu";
        if (!c.mlp_plain && strcmp(c.activation, act)) {
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported for %s (%s)", what, c.activation,
                            c.architecture, act);
            goto done;
        }
        c.word_embed_proj_dim = c.hidden;
    } else {
        c.hidden = 768; c.intermediate = 3072; c.n_layers = 12; c.n_heads = 12; c.vocab = 50272;
        c.max_pos = 2048; c.norm_eps = 1e-5f; c.tie_word_embeddings = 1; c.pos_offset = 2;
        strcpy(c.activation, "relu");
        int enable_bias = 1, affine = 1, remove_final = 0;
        c.word_embed_proj_dim = -1;
        if ((rc = qd_cfg_get_int(root, "hidden_size", &c.hidden, what, err)) ||
            (rc = qd_cfg_get_int(root, "ffn_dim", &c.intermediate, what, err)) ||
            (rc = qd_cfg_get_int(root, "num_hidden_layers", &c.n_layers, what, err)) ||
            (rc = qd_cfg_get_int(root, "num_attention_heads", &c.n_heads, what, err)) ||
            (rc = qd_cfg_get_int(root, "vocab_size", &c.vocab, what, err)) ||
            (rc = qd_cfg_get_int(root, "max_position_embeddings", &c.max_pos, what, err)) ||
            (rc = qd_cfg_get_int(root, "word_embed_proj_dim", &c.word_embed_proj_dim, what, err)) ||
            (rc = qd_cfg_get_bool(root, "do_layer_norm_before", &c.do_layer_norm_before, what, err)) ||
            (rc = qd_cfg_get_bool(root, "enable_bias", &enable_bias, what, err)) ||
            (rc = qd_cfg_get_bool(root, "layer_norm_elementwise_affine", &affine, what, err)) ||
            (rc = qd_cfg_get_bool(root, "_remove_final_layer_norm", &remove_final, what, err)) ||
            (rc = qd_cfg_get_bool(root, "tie_word_embeddings", &c.tie_word_embeddings, what, err)) ||
            (rc = qd_cfg_get_str(root, "activation_function", c.activation, sizeof c.activation, what, err)))
            goto done;
        if (!enable_bias || !affine || remove_final) {
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: OPT without biases, affine layer norms or the final layer norm is not supported", what);
            goto done;
        }
        if (strcmp(c.activation, "relu") && strcmp(c.activation, "gelu")) {
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: activation_function \"%s\" is not supported (relu, gelu)", what, c.activation);
            goto done;
        }
        /* -1 is the "absent" default; any other non-positive size is an error, not a model
         * with empty projections (found by fuzzing). */
        if (c.word_embed_proj_dim == 0 || c.word_embed_proj_dim < -1) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: word_embed_proj_dim %lld must be positive", what, (long long)c.word_embed_proj_dim);
            goto done;
        }
        if (c.word_embed_proj_dim < 0) c.word_embed_proj_dim = c.hidden;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
    }
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.hidden <= 0 || c.intermediate <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.vocab <= 0 || c.max_pos <= 0) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size and max_position_embeddings must be positive", what);
        goto done;
    }
    if (c.head_dim == 0) {
        if (c.hidden % c.n_heads) {
            rc = qd_err_set(err, QD_ESHAPE, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", what,
                            (long long)c.hidden, (long long)c.n_heads);
            goto done;
        }
        c.head_dim = c.hidden / c.n_heads;
    }
    if (c.head_dim <= 0 || (c.head_dim & 1)) {
        rc = qd_err_set(err, QD_ESHAPE, "%s: head_dim %lld must be positive and even", what, (long long)c.head_dim);
        goto done;
    }
    if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads) {
        rc = qd_err_set(err, QD_ESHAPE, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                        (long long)c.n_heads, (long long)c.n_kv_heads);
        goto done;
    }
    if (c.norm_eps <= 0.0f || c.rope_theta <= 0.0f) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: rms_norm_eps and rope_theta must be positive", what);
        goto done;
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(outer, "quantization_config");
    if (q && !cJSON_IsNull(q) && (rc = parse_quant_config(q, what, &c, err))) goto done;
    *out = c;
done:
    cJSON_Delete(text);
    cJSON_Delete(outer);
    return rc;
}

int qd_model_config_load_quant(const char *dir, qd_model_config *out, cJSON **quant, qd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *buf = NULL;
    size_t len = 0;
    int rc = qd_input_read(path, QD_INPUT_JSON, &buf, &len, err);
    if (rc) return rc;
    rc = qd_model_config_parse(buf, path, out, err);
    if (!rc && quant) {
        cJSON *root = cJSON_Parse(buf);
        *quant = root ? cJSON_DetachItemFromObjectCaseSensitive(root, "quantization_config") : NULL;
        if (!root) rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
        cJSON_Delete(root);
    }
    free(buf);
    return rc;
}

int qd_model_config_load(const char *dir, qd_model_config *out, qd_err *err)
{
    return qd_model_config_load_quant(dir, out, NULL, err);
}
