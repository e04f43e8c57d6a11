/* gpt-oss's config.json (config_gptoss.c): GptOssConfig's defaults where a key is absent
 * (the Hub config of openai/gpt-oss-20b written out, then its keys left out one by one),
 * and what this forward does not compute refused by name. Forward parity is
 * test_model_families (tests/data/families/gpt_oss). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *body, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{\"architectures\":[\"GptOssForCausalLM\"]%s%s}", body[0] ? "," : "", body);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

/* openai/gpt-oss-20b's config.json (the keys that matter to the forward). */
#define HUB "\"hidden_size\":2880,\"intermediate_size\":2880,\"num_hidden_layers\":24,\"num_attention_heads\":64," \
            "\"num_key_value_heads\":8,\"head_dim\":64,\"vocab_size\":201088,\"max_position_embeddings\":131072," \
            "\"num_local_experts\":32,\"num_experts_per_tok\":4,\"rms_norm_eps\":1e-05,\"sliding_window\":128," \
            "\"rope_theta\":150000,\"rope_scaling\":{\"beta_fast\":32.0,\"beta_slow\":1.0,\"factor\":32.0," \
            "\"original_max_position_embeddings\":4096,\"rope_type\":\"yarn\",\"truncate\":false}," \
            "\"swiglu_limit\":7.0,\"attention_bias\":true,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\""

static void test_hub_and_defaults(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse(HUB, &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_GPT_OSS);
    CHECK_INT(c.n_experts, 32);
    CHECK_INT(c.top_k, 4);
    CHECK_INT(c.moe_intermediate, 2880);
    CHECK_INT(c.moe_scoring, QD_MOE_TOPK_SOFTMAX);
    CHECK_INT(c.qkv_bias && c.o_bias && c.mlp_bias && c.attn_sinks, 1);
    CHECK_INT(c.rope.type, QD_ROPE_YARN);
    CHECK_INT(c.rope.truncate, 0);
    CHECK_NEAR(c.rope_theta, 150000.0, 0);
    CHECK_NEAR(c.rope.factor, 32.0, 0);
    CHECK_INT(c.rope.orig_max_pos, 4096);
    CHECK_NEAR(c.swiglu_alpha, 1.702f, 0);
    CHECK_NEAR(c.swiglu_limit, 7.0f, 0);
    CHECK_INT(c.sliding_window, 128);
    CHECK_INT(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[22] && !c.layer_sliding[23], 1);
    /* Nothing but the architecture: GptOssConfig's defaults (gpt-oss-120b's shape). */
    CHECK_OK(parse("", &c, &err));
    CHECK_INT(c.hidden, 2880);
    CHECK_INT(c.n_layers, 36);
    CHECK_INT(c.n_heads, 64);
    CHECK_INT(c.n_kv_heads, 8);
    CHECK_INT(c.head_dim, 64);
    CHECK_INT(c.vocab, 201088);
    CHECK_INT(c.max_pos, 131072);
    CHECK_INT(c.n_experts, 128);
    CHECK_INT(c.top_k, 4);
    CHECK_NEAR(c.norm_eps, 1e-5f, 0);
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.rope.type, QD_ROPE_YARN);
    CHECK_NEAR(c.rope.factor, 32.0, 0);
    CHECK_INT(c.rope.truncate, 0);
    CHECK_INT(c.rope.orig_max_pos, 4096);
    CHECK_NEAR(c.rope_theta, 150000.0, 0);
    CHECK_INT(c.sliding_window, 128);
    CHECK_INT(c.layer_sliding[0] && !c.layer_sliding[1], 1);
    /* hidden_act is not read by GptOssExperts (the clamped SwiGLU is its activation). */
    CHECK_OK(parse("\"hidden_act\":\"gelu\"", &c, &err));
    /* transformers 5's spelling: rope_parameters with rope_theta inside. */
    CHECK_OK(parse("\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":50000.0,\"factor\":4.0,"
                   "\"original_max_position_embeddings\":32,\"truncate\":true}", &c, &err));
    CHECK_NEAR(c.rope_theta, 50000.0, 0);
    CHECK_INT(c.rope.truncate, 1);
    /* layer_types as written; sliding_window null: no window at all. */
    CHECK_OK(parse("\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\",\"sliding_attention\"]", &c, &err));
    CHECK_INT(!c.layer_sliding[0] && c.layer_sliding[1], 1);
    CHECK_OK(parse("\"sliding_window\":null", &c, &err));
    CHECK_INT(c.sliding_window, 0);
}

static void test_refused(void)
{
    static const char *const cases[][2] = {
        {"\"layer_types\":[\"chunked_attention\",\"full_attention\"],\"num_hidden_layers\":2", "layer_types[0] \"chunked_attention\""},
        {"\"layer_types\":[\"full_attention\"],\"num_hidden_layers\":2", "layer_types must be a list of num_hidden_layers"},
        {"\"swiglu_limit\":0", "swiglu_alpha and swiglu_limit must be positive"},
        {"\"swiglu_alpha\":-1", "swiglu_alpha and swiglu_limit must be positive"},
        {"\"num_experts_per_tok\":200", "num_experts_per_tok 200"},
        {"\"num_local_experts\":600", "600 experts"},
        {"\"attn_logit_softcapping\":50.0", "attn_logit_softcapping is set"},
        {"\"routed_scaling_factor\":2.0", "routed_scaling_factor is set"},
        {"\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32,"
         "\"short_factor\":[1.0]}", "short_factor is not supported"},
        {"\"quantization_config\":{\"quant_method\":\"mxfp4\",\"group_size\":64}",
         "quantization_config.group_size is not supported for an MXFP4 source"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qd_model_config c;
        qd_err err;
        CHECK_ERR(parse(cases[i][0], &c, &err));
        CHECK_CONTAINS(err.msg, cases[i][1]);
    }
}

int main(void)
{
    TEST_RUN(test_hub_and_defaults);
    TEST_RUN(test_refused);
    return test_finish();
}
