/* config.json of the dense families with one change to the Llama block (config_dense.c):
 * SmolLM3's NoPE layers and windows, Granite's multipliers, Ministral's per-layer windows,
 * Seed-OSS's biases, ERNIE 4.5's use_bias and RoPE, Apertus's xIELU and default RoPE,
 * Hunyuan's NTK-alpha RoPE, Ministral 3's RoPE and query scale. The config classes' defaults where they
 * depart from LlamaConfig's, and what is refused by name. The forward parity itself is
 * test_model_families. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *arch, int layers, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":64,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":8,\"vocab_size\":256,\"max_position_embeddings\":64%s%s}",
             arch, layers, extra[0] ? "," : "", extra);
    memset(err, 0, sizeof *err);
    memset(c, 0, sizeof *c);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void refused(const char *arch, const char *extra, int code, const char *needle)
{
    qd_model_config c;
    qd_err err;
    CHECK_INT(parse(arch, 2, extra, &c, &err), code);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_smollm3(void)
{
    qd_model_config c;
    qd_err err;
    /* SmolLM3Config's defaults: every 4th layer NoPE, 4 kv heads, tied, theta 2e6, no window. */
    CHECK_OK(parse("SmolLM3ForCausalLM", 8, "", &c, &err));
    for (int i = 0; i < 8; i++) CHECK_INT(c.layer_nope[i], (i + 1) % 4 == 0);
    for (int i = 0; i < 8; i++) CHECK_INT(c.layer_sliding[i], 0);
    CHECK_INT(c.n_kv_heads, 4);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK(c.rope_theta == 2000000.0f);
    CHECK_INT(c.sliding_window, 0);
    CHECK_OK(parse("SmolLM3ForCausalLM", 6, "\"no_rope_layer_interval\":3", &c, &err));
    for (int i = 0; i < 6; i++) CHECK_INT(c.layer_nope[i], i == 2 || i == 5);
    /* The list wins; the derived layer_types slide the NoPE layers when asked. */
    CHECK_OK(parse("SmolLM3ForCausalLM", 3, "\"no_rope_layers\":[0,1,1,1],\"use_sliding_window\":true,\"sliding_window\":8",
                   &c, &err));
    CHECK_INT(c.layer_nope[0], 1);
    CHECK_INT(c.layer_nope[1], 0);
    CHECK_INT(c.layer_sliding[0], 1);
    CHECK_INT(c.layer_sliding[1], 0);
    CHECK_INT(c.sliding_window, 8);
    /* Written layer_types are taken as they are. */
    CHECK_OK(parse("SmolLM3ForCausalLM", 2, "\"no_rope_layers\":[1,0],\"use_sliding_window\":true,\"sliding_window\":8,"
                   "\"layer_types\":[\"sliding_attention\",\"full_attention\"]", &c, &err));
    CHECK_INT(c.layer_sliding[0], 1);
    CHECK_INT(c.layer_sliding[1], 0);
    refused("SmolLM3ForCausalLM", "\"sliding_window\":8,\"layer_types\":[\"sliding_attention\",\"full_attention\"]",
            QD_EUNSUPPORTED, "use_sliding_window false");
    refused("SmolLM3ForCausalLM", "\"use_sliding_window\":true,\"layer_types\":[\"sliding_attention\",\"full_attention\"]",
            QD_EFORMAT, "sliding_window is not set");
    refused("SmolLM3ForCausalLM", "\"no_rope_layers\":[1]", QD_EFORMAT, "no_rope_layers");
    refused("SmolLM3ForCausalLM", "\"no_rope_layers\":[1,2]", QD_EFORMAT, "no_rope_layers[1]");
    refused("SmolLM3ForCausalLM", "\"layer_types\":[\"chunked_attention\",\"full_attention\"]", QD_EUNSUPPORTED,
            "chunked_attention");
    refused("SmolLM3ForCausalLM", "\"logits_scaling\":2", QD_EUNSUPPORTED, "logits_scaling");
}

static void test_granite(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("GraniteForCausalLM", 2, "", &c, &err));
    /* GraniteConfig: every multiplier 1, and attention_multiplier is the scale itself. */
    CHECK(c.embed_scale == 1.0f && c.attn_scale == 1.0f && c.residual_scale == 1.0f && c.logit_scale == 1.0f);
    CHECK_OK(parse("GraniteForCausalLM", 2, "\"embedding_multiplier\":12.0,\"attention_multiplier\":0.0078125,"
                   "\"residual_multiplier\":0.22,\"logits_scaling\":16.0", &c, &err));
    CHECK(c.embed_scale == 12.0f);
    CHECK(c.attn_scale == 0.0078125f);
    CHECK(c.residual_scale == 0.22f);
    CHECK(c.logit_scale == 1.0f / 16.0f);
    refused("GraniteForCausalLM", "\"logits_scaling\":0", QD_EFORMAT, "logits_scaling");
    refused("GraniteForCausalLM", "\"residual_multiplier\":-1", QD_EFORMAT, "residual_multiplier");
    refused("GraniteForCausalLM", "\"layer_types\":[\"sliding_attention\",\"full_attention\"]", QD_EUNSUPPORTED,
            "sliding_attention");
    refused("GraniteForCausalLM", "\"use_sliding_window\":true", QD_EUNSUPPORTED, "GraniteForCausalLM");
    refused("GraniteForCausalLM", "\"final_logit_softcapping\":30.0", QD_EUNSUPPORTED, "final_logit_softcapping");
    refused("GraniteForCausalLM", "\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,1],"
            "\"long_factor\":[1,1]}", QD_EUNSUPPORTED, "longrope");
}

static void test_ministral(void)
{
    qd_model_config c;
    qd_err err;
    /* MinistralConfig: window 4096 on every layer, 8 kv heads; no biases whatever
     * attention_bias says (transformers builds the projections without). */
    CHECK_OK(parse("MinistralForCausalLM", 2, "\"attention_bias\":true", &c, &err));
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.layer_sliding[0], 1);
    CHECK_INT(c.layer_sliding[1], 1);
    CHECK_INT(c.n_kv_heads, 8);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_INT(c.o_bias, 0);
    CHECK_OK(parse("MinistralForCausalLM", 2, "\"sliding_window\":null", &c, &err));
    CHECK_INT(c.layer_sliding[0], 0);
    CHECK_OK(parse("MinistralForCausalLM", 2, "\"sliding_window\":32,\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
                   &c, &err));
    CHECK_INT(c.layer_sliding[0], 0);
    CHECK_INT(c.layer_sliding[1], 1);
    CHECK_INT(c.sliding_window, 32);
    refused("MinistralForCausalLM", "\"sliding_window\":null,\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
            QD_EFORMAT, "sliding_window is null");
    refused("MinistralForCausalLM", "\"attention_multiplier\":0.5", QD_EUNSUPPORTED, "attention_multiplier");
}

static void test_seed_oss(void)
{
    qd_model_config c;
    qd_err err;
    /* SeedOssConfig: head_dim 128 when absent (hidden / heads when null), q/k/v biases on,
     * o_proj's off. */
    CHECK_OK(parse("SeedOssForCausalLM", 2, "", &c, &err));
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.o_bias, 0);
    CHECK_INT(c.mlp_bias, 0);
    CHECK_INT(c.n_kv_heads, 8);
    CHECK_OK(parse("SeedOssForCausalLM", 2, "\"head_dim\":null,\"attention_bias\":false,\"attention_out_bias\":true,"
                   "\"mlp_bias\":true", &c, &err));
    CHECK_INT(c.head_dim, 8);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_INT(c.o_bias, 1);
    CHECK_INT(c.mlp_bias, 1);
    refused("SeedOssForCausalLM", "\"layer_types\":[\"sliding_attention\",\"full_attention\"]", QD_EUNSUPPORTED,
            "SeedOssForCausalLM");
}

static void test_ernie(void)
{
    qd_model_config c;
    qd_err err;
    /* Ernie4_5Config: theta 500000, eps 1e-5, head_dim 128, 2 kv heads, tied, no biases. */
    CHECK_OK(parse("Ernie4_5ForCausalLM", 2, "", &c, &err));
    CHECK(c.rope_theta == 500000.0f);
    CHECK(c.norm_eps == 1e-5f);
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.n_kv_heads, 2);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.qkv_bias | c.o_bias | c.mlp_bias, 0);
    /* use_bias is every linear's; attention_bias is not a key of this family. */
    CHECK_OK(parse("Ernie4_5ForCausalLM", 2, "\"use_bias\":true,\"attention_bias\":false", &c, &err));
    CHECK_INT(c.qkv_bias & c.o_bias & c.mlp_bias, 1);
    refused("Ernie4_5ForCausalLM", "\"partial_rotary_factor\":0.5", QD_EUNSUPPORTED, "partial_rotary_factor");
}

static void test_apertus(void)
{
    qd_model_config c;
    qd_err err;
    /* ApertusConfig: xIELU, q/k norms, eps 1e-5, and without rope_parameters or rope_scaling
     * llama3 RoPE with theta 1.2e7 (a top-level rope_theta then changes nothing). */
    CHECK_OK(parse("ApertusForCausalLM", 2, "\"rope_theta\":10000", &c, &err));
    CHECK(!strcmp(c.activation, "xielu"));
    CHECK_INT(c.qk_norm, 1);
    CHECK(c.norm_eps == 1e-5f);
    CHECK_INT(c.rope.type, QD_ROPE_LLAMA3);
    CHECK(c.rope_theta == 12000000.0f);
    CHECK(c.rope.factor == 8.0f && c.rope.low_freq_factor == 1.0f && c.rope.high_freq_factor == 4.0f);
    CHECK_INT(c.rope.orig_max_pos, 8192);
    CHECK_OK(parse("ApertusForCausalLM", 2, "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6}", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_DEFAULT);
    CHECK(c.rope_theta == 1e6f);
    refused("ApertusForCausalLM", "\"hidden_act\":\"silu\"", QD_EUNSUPPORTED, "hidden_act \"silu\"");
    refused("LlamaForCausalLM", "\"hidden_act\":\"xielu\"", QD_EUNSUPPORTED, "hidden_act \"xielu\"");
}

static void test_hunyuan(void)
{
    qd_model_config c;
    qd_err err;
    /* HunYuanDenseV1Config: eps 1e-5, q/k norms, no MLP biases. "dynamic" with alpha is a
     * static NTK base theta * alpha^(d / (d - 2)) (d = head_dim 8 here), other keys unread. */
    CHECK_OK(parse("HunYuanDenseV1ForCausalLM", 2, "\"mlp_bias\":true,\"rope_scaling\":{\"type\":\"dynamic\",\"alpha\":1000.0,"
                   "\"factor\":1.0,\"beta_fast\":32,\"mscale\":1.0},\"rope_theta\":10000.0", &c, &err));
    CHECK(c.norm_eps == 1e-5f);
    CHECK_INT(c.qk_norm, 1);
    CHECK_INT(c.mlp_bias, 0);
    CHECK_INT(c.rope.type, QD_ROPE_DEFAULT);
    CHECK(fabs(c.rope_theta / (10000.0 * pow(1000.0, 8.0 / 6.0)) - 1) < 1e-6);
    /* Without alpha, dynamic NTK as Llama's. */
    CHECK_OK(parse("HunYuanDenseV1ForCausalLM", 2, "\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0,"
                   "\"rope_theta\":10000.0}", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_DYNAMIC);
    refused("HunYuanDenseV1ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"dynamic\",\"alpha\":-1}", QD_EFORMAT,
            "alpha");
    refused("HunYuanDenseV1ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2,\"alpha\":3}",
            QD_EUNSUPPORTED, "alpha");
}

static void test_ministral3(void)
{
    qd_model_config c;
    qd_err err;
    /* Ministral3Config without rope_parameters: YaRN factor 16, original 16384, theta 1e6 (a
     * top-level rope_theta changes nothing), llama_4_scaling_beta 0.1; head_dim 128, no window,
     * no biases. */
    CHECK_OK(parse("Ministral3ForCausalLM", 2, "\"rope_theta\":10000,\"attention_bias\":true", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_YARN);
    CHECK(c.rope_theta == 1e6f);
    CHECK(c.rope.factor == 16.0f);
    CHECK_INT(c.rope.orig_max_pos, 16384);
    CHECK(c.q_pos_scale_beta == 0.1f);
    CHECK_INT(c.q_pos_scale_orig, 16384);
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.sliding_window, 0);
    CHECK_INT(c.qkv_bias | c.o_bias, 0);
    CHECK(c.norm_eps == 1e-5f);
    /* As written, with the object's max_position_embeddings (not read by YaRN). */
    CHECK_OK(parse("Ministral3ForCausalLM", 2, "\"sliding_window\":32,\"rope_parameters\":{\"type\":\"yarn\","
                   "\"rope_type\":\"yarn\",\"rope_theta\":1e6,\"factor\":4.0,\"original_max_position_embeddings\":16,"
                   "\"max_position_embeddings\":64,\"llama_4_scaling_beta\":0.5}", &c, &err));
    CHECK(c.q_pos_scale_beta == 0.5f);
    CHECK_INT(c.q_pos_scale_orig, 16);
    CHECK_INT(c.layer_sliding[0] & c.layer_sliding[1], 1);
    CHECK_INT(c.sliding_window, 32);
    refused("Ministral3ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6}", QD_EFORMAT,
            "llama_4_scaling_beta");
    refused("Ministral3ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
            "\"original_max_position_embeddings\":16,\"llama_4_scaling_beta\":0.1,\"made_up\":1}", QD_EUNSUPPORTED, "made_up");
}

int main(void)
{
    TEST_RUN(test_smollm3);
    TEST_RUN(test_granite);
    TEST_RUN(test_ministral);
    TEST_RUN(test_seed_oss);
    TEST_RUN(test_ernie);
    TEST_RUN(test_apertus);
    TEST_RUN(test_hunyuan);
    TEST_RUN(test_ministral3);
    return test_finish();
}
