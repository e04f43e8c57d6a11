/* config.json of the post-norm families (OLMo 2/3, EXAONE 4, GLM-4): the config classes'
 * defaults where a key is left out, the layer types each derives (windows, EXAONE 4's NoPE
 * global layers, OLMo 3's RoPE per layer type), and what quantd does not implement or what
 * transformers itself cannot read refused by name. The forward parity is
 * test_model_families. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

#define BASE "\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":64,\"num_hidden_layers\":4," \
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"max_position_embeddings\":64"

static int parse(const char *arch, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{" BASE "%s%s}", arch, extra[0] ? "," : "", extra);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void refused(const char *arch, const char *extra, int code, const char *needle)
{
    qd_model_config c;
    qd_err err;
    CHECK_INT(parse(arch, extra, &c, &err), code);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_defaults(void)
{
    qd_model_config c;
    qd_err err;
    /* Olmo2Config: rms_norm_eps 1e-5, no window, q/k norms over the whole projections. */
    CHECK_OK(parse("Olmo2ForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_POSTNORM);
    CHECK_INT(c.qk_norm, QD_QK_NORM_WHOLE);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.rope_theta, 10000.0, 0);
    CHECK_INT(c.sliding_window, 0);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_OK(parse("Olmo2ForCausalLM", "\"attention_bias\":true", &c, &err));
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.o_bias, 1);
    CHECK_INT(c.mlp_bias, 0);
    /* Olmo3Config: default_theta 500000, every 4th layer full, window 4096. */
    CHECK_OK(parse("Olmo3ForCausalLM", "", &c, &err));
    CHECK_NEAR(c.rope_theta, 500000.0, 0);
    CHECK_NEAR(c.rope_theta_local, 500000.0, 0);
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.layer_sliding[0] + c.layer_sliding[1] + c.layer_sliding[2], 3);
    CHECK_INT(c.layer_sliding[3], 0);
    /* Exaone4Config: sliding_window_pattern 4 without layer_types; the full layers NoPE. */
    CHECK_OK(parse("Exaone4ForCausalLM", "", &c, &err));
    CHECK_INT(c.qk_norm, QD_QK_NORM_HEAD);
    CHECK_INT(c.layer_sliding[0] + c.layer_sliding[1] + c.layer_sliding[2], 3);
    CHECK_INT(c.layer_nope[0] + c.layer_nope[1] + c.layer_nope[2], 0);
    CHECK_INT(c.layer_sliding[3], 0);
    CHECK_INT(c.layer_nope[3], 1);
    CHECK_OK(parse("Exaone4ForCausalLM", "\"sliding_window_pattern\":2", &c, &err));
    CHECK_INT(c.layer_nope[1] + c.layer_nope[3], 2);
    /* Without a window every layer is full and takes RoPE. */
    CHECK_OK(parse("Exaone4ForCausalLM", "\"sliding_window\":null,\"layer_types\":[\"full_attention\","
                   "\"full_attention\",\"full_attention\",\"full_attention\"]", &c, &err));
    CHECK_INT(c.layer_nope[0] + c.layer_nope[1] + c.layer_nope[2] + c.layer_nope[3], 0);
    CHECK_INT(c.sliding_window, 0);
    /* Glm4Config: attention_bias true (q/k/v only), partial_rotary_factor 0.5, interleaved
     * pairs, head_dim 128, rms_norm_eps 1.5625e-7. */
    CHECK_OK(parse("Glm4ForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_GLM4);
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.o_bias, 0);
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.head_dim, 128);
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.5, 0);
    CHECK_NEAR(c.norm_eps, 1.5625e-7, 1e-14);
    CHECK_OK(parse("Glm4ForCausalLM", "\"head_dim\":16,\"rope_parameters\":{\"rope_type\":\"default\","
                   "\"rope_theta\":10000,\"partial_rotary_factor\":1.0}", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 1.0, 0);
}

/* OLMo 3's older rope_theta and rope_scaling apply to the full layers only: the sliding
 * ones keep plain RoPE at default_theta 500000, as Olmo3Config reads such a file. */
static void test_olmo3_rope(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Olmo3ForCausalLM", "\"rope_theta\":1e6,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8,"
                   "\"original_max_position_embeddings\":32}", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_YARN);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK_INT(c.rope_local.type, QD_ROPE_DEFAULT);
    CHECK_NEAR(c.rope_theta_local, 500000.0, 0);
    CHECK_OK(parse("Olmo3ForCausalLM", "\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\",\"factor\":2,"
                   "\"rope_theta\":1e6},\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":1e4}}", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_LINEAR);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK_NEAR(c.rope_theta_local, 1e4, 0);
}

static void test_refusals(void)
{
    refused("Olmo3ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e4}", QD_EUNSUPPORTED,
            "per layer type");
    refused("Olmo2ForCausalLM", "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6},"
            "\"sliding_attention\":{\"rope_theta\":1e4}}", QD_EUNSUPPORTED, "per layer type");
    refused("Olmo2ForCausalLM", "\"sliding_window\":16", QD_EUNSUPPORTED, "sliding_window");
    refused("Olmo2ForCausalLM", "\"partial_rotary_factor\":0.5", QD_EUNSUPPORTED, "partial_rotary_factor");
    refused("Olmo2ForCausalLM", "\"query_pre_attn_scalar\":32", QD_EUNSUPPORTED, "query_pre_attn_scalar");
    refused("Olmo3ForCausalLM", "\"layer_types\":[\"sliding_attention\",\"chunked_attention\",\"full_attention\","
            "\"full_attention\"]", QD_EUNSUPPORTED, "chunked_attention");
    refused("Olmo3ForCausalLM", "\"sliding_window\":null", QD_EFORMAT, "sliding_window is null");
    refused("Exaone4ForCausalLM", "\"sliding_window_pattern\":\"LLLG\"", QD_EUNSUPPORTED, "LLLG");
    refused("Exaone4ForCausalLM", "\"sliding_window\":null", QD_EFORMAT, "sliding_window_pattern");
    refused("Exaone4ForCausalLM", "\"sliding_window\":null,\"layer_types\":[\"sliding_attention\",\"full_attention\","
            "\"full_attention\",\"full_attention\"]", QD_EFORMAT, "sliding_window is null");
    refused("Exaone4ForCausalLM", "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6},"
            "\"sliding_attention\":{\"rope_theta\":1e4}}", QD_EUNSUPPORTED, "per layer type");
    refused("Glm4ForCausalLM", "\"layer_types\":[\"full_attention\",\"full_attention\",\"full_attention\","
            "\"full_attention\"]", QD_EUNSUPPORTED, "layer_types");
    refused("Glm4ForCausalLM", "\"hidden_act\":\"gelu\"", QD_EUNSUPPORTED, "hidden_act");
    refused("Glm4ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,1,1,1],"
            "\"long_factor\":[1,1,1,1]}", QD_EUNSUPPORTED, "longrope");
}

int main(void)
{
    TEST_RUN(test_defaults);
    TEST_RUN(test_olmo3_rope);
    TEST_RUN(test_refusals);
    return test_finish();
}
