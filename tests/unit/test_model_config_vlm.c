/* Vision-language configs (config_vlm.c): the text tower's keys read from text_config (or
 * Qwen2-VL's and Qwen2.5-VL's flat Hub layout) with the text config class's defaults, the
 * outer config's tie, Qwen's M-RoPE read as the 1-D RoPE it is on text, and what is not
 * computed refused by name. Shapes follow the Hub configs of Qwen2-VL-7B, Qwen2.5-VL-7B,
 * Qwen3-VL-4B, gemma-3-4b-it and Mistral-Small-3.1 (sizes shrunk); the forward parity is
 * test_model_families. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *json, qd_model_config *c, qd_err *err)
{
    memset(err, 0, sizeof *err);
    memset(c, 0, sizeof *c);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void refused(const char *json, int code, const char *needle)
{
    qd_model_config c;
    qd_err err;
    CHECK_INT(parse(json, &c, &err), code);
    CHECK_CONTAINS(err.msg, needle);
}

/* Qwen2.5-VL as the Hub ships it: flat text keys, rope_scaling {"type": "mrope"}. */
#define QWEN25_FLAT "{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"model_type\":\"qwen2_5_vl\"," \
    "\"hidden_size\":128,\"intermediate_size\":256,\"num_hidden_layers\":2,\"num_attention_heads\":4," \
    "\"num_key_value_heads\":2,\"vocab_size\":300,\"rope_theta\":1000000.0,\"torch_dtype\":\"bfloat16\"," \
    "\"tie_word_embeddings\":%s,\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":%s}," \
    "\"vision_config\":{\"depth\":2,\"hidden_size\":32,\"out_hidden_size\":128}}"

static void test_qwen2_5_vl(void)
{
    char json[2048];
    qd_model_config c;
    qd_err err;
    snprintf(json, sizeof json, QWEN25_FLAT, "false", "[4,6,6]");
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.multimodal, 1);
    CHECK_INT(c.hidden, 128);
    CHECK_INT(c.head_dim, 32);
    CHECK_INT(c.qkv_bias, 1);          /* Qwen2's q/k/v biases */
    CHECK_INT(c.o_bias, 0);
    CHECK_INT(c.rope.type, QD_ROPE_DEFAULT);
    CHECK(c.rope_theta == 1000000.0f);
    CHECK(fabsf(c.norm_eps - 1e-5f) < 1e-12f);   /* Qwen2_5_VLTextConfig's, not Llama's 1e-6 */
    CHECK_INT(c.max_pos, 32768);
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK(!strcmp(c.torch_dtype, "bfloat16"));
    snprintf(json, sizeof json, QWEN25_FLAT, "true", "[4,6,6]");
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.tie_word_embeddings, 1);
    /* mrope_section must cover head_dim/2 = 16 frequencies. */
    snprintf(json, sizeof json, QWEN25_FLAT, "false", "[4,6,4]");
    refused(json, QD_EFORMAT, "mrope_section");
    snprintf(json, sizeof json, QWEN25_FLAT, "false", "[16]");
    refused(json, QD_EFORMAT, "mrope_section");
    /* transformers 5's nested spelling: text_config with rope_parameters; a pre-5 save's
     * text_config tie true ties (Qwen2_5_VLConfig forwards it). */
    CHECK_OK(parse("{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"text_config\":{\"model_type\":"
                   "\"qwen2_5_vl_text\",\"hidden_size\":64,\"intermediate_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"tie_word_embeddings\":true,"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0,\"mrope_section\":[2,3,3]}}}",
                   &c, &err));
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK(c.rope_theta == 500000.0f);
    /* A window, or a RoPE scaling the M-RoPE does not combine with here, is refused. */
    refused("{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"hidden_size\":64,\"num_attention_heads\":4,"
            "\"use_sliding_window\":true}", QD_EUNSUPPORTED, "use_sliding_window");
    refused("{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"hidden_size\":64,\"num_attention_heads\":4,"
            "\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[2,3,3],\"made_up\":1}}", QD_EUNSUPPORTED,
            "rope_scaling.made_up");
    refused("{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"text_config\":{\"model_type\":\"llama\"}}",
            QD_EUNSUPPORTED, "text_config.model_type \"llama\"");
}

/* Qwen2-VL as the Hub ships it (Qwen2-VL-7B-Instruct, shrunk): flat text keys, rope_scaling
 * {"type": "mrope"}, a window set but off (use_sliding_window false). Qwen2-VL-2B ties. */
#define QWEN2VL_FLAT "{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"model_type\":\"qwen2_vl\"," \
    "\"hidden_size\":128,\"intermediate_size\":256,\"num_hidden_layers\":2,\"num_attention_heads\":4," \
    "\"num_key_value_heads\":2,\"vocab_size\":300,\"rope_theta\":1000000.0,\"torch_dtype\":\"bfloat16\"," \
    "\"use_sliding_window\":false,\"sliding_window\":32768,\"max_window_layers\":28," \
    "\"tie_word_embeddings\":%s,\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":%s}," \
    "\"vision_config\":{\"depth\":2,\"embed_dim\":32,\"mlp_ratio\":4,\"num_heads\":2,\"hidden_size\":128}}"

static void test_qwen2_vl(void)
{
    char json[2048];
    qd_model_config c;
    qd_err err;
    snprintf(json, sizeof json, QWEN2VL_FLAT, "false", "[4,6,6]");
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.multimodal, 1);
    CHECK_INT(c.hidden, 128);
    CHECK_INT(c.head_dim, 32);
    CHECK_INT(c.qkv_bias, 1);          /* Qwen2's q/k/v biases */
    CHECK_INT(c.o_bias, 0);
    CHECK_INT(c.sliding_window, 0);    /* use_sliding_window false: no window */
    CHECK_INT(c.rope.type, QD_ROPE_DEFAULT);
    CHECK(c.rope_theta == 1000000.0f);
    CHECK(fabsf(c.norm_eps - 1e-5f) < 1e-12f);   /* Qwen2VLTextConfig's */
    CHECK_INT(c.max_pos, 32768);
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK(!strcmp(c.torch_dtype, "bfloat16"));
    snprintf(json, sizeof json, QWEN2VL_FLAT, "true", "[4,6,6]");
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.tie_word_embeddings, 1);
    snprintf(json, sizeof json, QWEN2VL_FLAT, "false", "[4,6,4]");
    refused(json, QD_EFORMAT, "mrope_section");
    /* transformers 5's nested spelling; a pre-5 save's text_config tie true ties. */
    CHECK_OK(parse("{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"text_config\":{\"model_type\":"
                   "\"qwen2_vl_text\",\"hidden_size\":64,\"intermediate_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"tie_word_embeddings\":true,"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0,\"mrope_section\":[2,3,3]}}}",
                   &c, &err));
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK(c.rope_theta == 500000.0f);
    refused("{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"hidden_size\":64,\"num_attention_heads\":4,"
            "\"use_sliding_window\":true}", QD_EUNSUPPORTED, "use_sliding_window");
    refused("{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"hidden_size\":64,\"num_attention_heads\":4,"
            "\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[2,3,3],\"made_up\":1}}", QD_EUNSUPPORTED,
            "rope_scaling.made_up");
    refused("{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"text_config\":{\"model_type\":\"qwen2_5_vl_text\"}}",
            QD_EUNSUPPORTED, "text_config.model_type \"qwen2_5_vl_text\"");
}

static void test_qwen3_vl(void)
{
    qd_model_config c;
    qd_err err;
    const char *json = "{\"architectures\":[\"Qwen3VLForConditionalGeneration\"],\"tie_word_embeddings\":true,"
        "\"text_config\":{\"model_type\":\"qwen3_vl_text\",\"hidden_size\":64,\"intermediate_size\":64,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":256,"
        "\"rope_scaling\":{\"rope_type\":\"default\",\"mrope_section\":[8,4,4],\"mrope_interleaved\":true},"
        "\"rope_theta\":5000000}}";
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.qk_norm, 1);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK(c.rope_theta == 5000000.0f);
    CHECK_INT(c.max_pos, 128000);
    /* The class's default base where the file gives none: 500000. */
    CHECK_OK(parse("{\"architectures\":[\"Qwen3VLForConditionalGeneration\"],\"text_config\":{\"model_type\":"
                   "\"qwen3_vl_text\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"mrope_section\":[4,2,2]}}}", &c, &err));
    CHECK(c.rope_theta == 500000.0f);
    CHECK_INT(c.tie_word_embeddings, 0);   /* Qwen3VLConfig's default */
    refused("{\"architectures\":[\"Qwen3VLForConditionalGeneration\"],\"hidden_size\":64}", QD_EUNSUPPORTED,
            "without text_config");
    refused("{\"architectures\":[\"Qwen3VLForConditionalGeneration\"],\"text_config\":{\"model_type\":\"qwen3_vl_text\","
            "\"hidden_size\":64,\"num_attention_heads\":4,\"head_dim\":16,\"rope_parameters\":{\"rope_type\":\"yarn\","
            "\"factor\":2,\"mrope_section\":[4,2,2],\"mrope_interleaved\":\"yes\"}}}", QD_EFORMAT, "mrope_interleaved");
}

static void test_gemma3(void)
{
    qd_model_config c;
    qd_err err;
    /* gemma-3-4b-it's text_config leaves head_dim, vocab_size and the RoPE bases out. */
    const char *json = "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"torch_dtype\":\"bfloat16\","
        "\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,\"model_type\":\"gemma3_text\","
        "\"num_attention_heads\":8,\"num_hidden_layers\":34,\"num_key_value_heads\":4,"
        "\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},\"sliding_window\":1024},"
        "\"vision_config\":{\"model_type\":\"siglip_vision_model\"}}";
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.head_dim, 256);
    CHECK_INT(c.vocab, 262208);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.qk_norm, 1);
    CHECK(c.rope_theta == 1000000.0f);
    CHECK(c.rope_theta_local == 10000.0f);
    CHECK_INT(c.rope.type, QD_ROPE_LINEAR);       /* scaling on the global layers only */
    CHECK_INT(c.rope_local.type, QD_ROPE_DEFAULT);
    CHECK_INT(c.sliding_window, 1024);
    CHECK_INT(c.layer_sliding[0], 1);
    CHECK_INT(c.layer_sliding[5], 0);             /* every 6th layer global */
    CHECK(c.query_pre_attn_scalar == 256.0f);
    CHECK(c.embed_scale == 50.5f);                /* sqrt(2560) = 50.596 in bfloat16 */
    refused("{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"text_config\":{\"model_type\":\"gemma3_text\","
            "\"final_logit_softcapping\":30.0}}", QD_EUNSUPPORTED, "final_logit_softcapping");
    refused("{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"text_config\":{\"model_type\":\"gemma3_text\","
            "\"use_bidirectional_attention\":true}}", QD_EUNSUPPORTED, "use_bidirectional_attention");
}

static void test_mistral3(void)
{
    qd_model_config c;
    qd_err err;
    const char *json = "{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"text_config\":{\"model_type\":"
        "\"mistral\",\"hidden_size\":5120,\"head_dim\":128,\"intermediate_size\":32768,\"num_attention_heads\":32,"
        "\"num_hidden_layers\":40,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,\"rope_theta\":1000000000.0,"
        "\"sliding_window\":null,\"vocab_size\":131072},\"vision_config\":{\"model_type\":\"pixtral\"}}";
    CHECK_OK(parse(json, &c, &err));
    CHECK_INT(c.sliding_window, 0);
    CHECK(c.rope_theta == 1e9f);
    CHECK_INT(c.tie_word_embeddings, 1);   /* Mistral3Config's default; a stored lm_head unties at load */
    CHECK_INT(c.intermediate, 32768);
    /* MistralConfig's window where text_config leaves it out. */
    CHECK_OK(parse("{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"tie_word_embeddings\":false,"
                   "\"text_config\":{\"model_type\":\"mistral\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2}}", &c, &err));
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.tie_word_embeddings, 0);
    refused("{\"architectures\":[\"Mistral3ForConditionalGeneration\"],\"text_config\":{\"model_type\":\"ministral3\"}}",
            QD_EUNSUPPORTED, "\"ministral3\"");
}

int main(void)
{
    TEST_RUN(test_qwen2_vl);
    TEST_RUN(test_qwen2_5_vl);
    TEST_RUN(test_qwen3_vl);
    TEST_RUN(test_gemma3);
    TEST_RUN(test_mistral3);
    return test_finish();
}
