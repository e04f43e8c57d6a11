/* config.json of StarCoder2, Phi and GPT-NeoX (config_parallel.c): the config classes'
 * defaults where a key is absent (Phi's partial_rotary_factor 0.5, GPT-NeoX's rotary_pct 0.25
 * and parallel residual), GPT-NeoX's own RoPE spellings (rotary_pct, rotary_emb_base, with
 * rope_parameters first), and the keys whose math the forward does not compute refused by
 * name. The forward parity itself is test_model_families. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

#define BASE "\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2," \
             "\"num_attention_heads\":4,\"vocab_size\":256,\"max_position_embeddings\":64"

static int parse(const char *arch, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{" BASE "%s%s}", arch, extra[0] ? "," : "", extra);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void refused(const char *arch, const char *extra, const char *needle)
{
    qd_model_config c;
    qd_err err;
    CHECK_INT(parse(arch, extra, &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_starcoder2(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Starcoder2ForCausalLM", "\"num_key_value_heads\":2,\"sliding_window\":16,\"norm_epsilon\":1e-6,"
                   "\"rms_norm_eps\":0.5", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_STARCODER2);
    CHECK_INT(c.mlp_plain, 1);
    CHECK_INT(c.parallel_block, 0);
    CHECK_INT(c.qkv_bias && c.o_bias && c.mlp_bias, 1);   /* use_bias defaults to true */
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.n_kv_heads, 2);
    CHECK_INT(c.sliding_window, 16);
    CHECK_INT(c.layer_sliding[0] && c.layer_sliding[1], 1);
    CHECK_NEAR(c.norm_eps, 1e-6, 1e-12);                   /* norm_epsilon, not rms_norm_eps */
    CHECK(!strcmp(c.activation, "gelu_pytorch_tanh"));
    CHECK_NEAR(c.rope.partial_rotary_factor, 1.0, 0);
    CHECK_OK(parse("Starcoder2ForCausalLM", "\"use_bias\":false,\"sliding_window\":null", &c, &err));
    CHECK_INT(c.qkv_bias || c.o_bias || c.mlp_bias, 0);
    CHECK_INT(c.sliding_window, 0);
    refused("Starcoder2ForCausalLM", "\"hidden_act\":\"silu\"", "hidden_act \"silu\"");
    refused("Starcoder2ForCausalLM", "\"layer_types\":[\"sliding_attention\",\"full_attention\"]", "layer_types");
    refused("Starcoder2ForCausalLM", "\"attn_logit_softcapping\":30.0", "attn_logit_softcapping");
}

static void test_phi(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("PhiForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_PHI);
    CHECK_INT(c.parallel_block, 1);
    CHECK_INT(c.lm_head_bias, 1);
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK_INT(c.n_kv_heads, 4);                            /* num_key_value_heads null: the heads */
    CHECK(!strcmp(c.activation, "gelu_new"));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.5, 0);      /* PhiConfig's default */
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_OK(parse("PhiForCausalLM", "\"partial_rotary_factor\":0.4", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.4f, 0);
    CHECK_OK(parse("PhiForCausalLM", "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0,"
                   "\"partial_rotary_factor\":0.75},\"layer_norm_eps\":1e-6", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.75, 0);
    CHECK_NEAR(c.norm_eps, 1e-6, 1e-12);
    refused("PhiForCausalLM", "\"qk_layernorm\":true", "qk_layernorm");
    refused("PhiForCausalLM", "\"hidden_act\":\"silu\"", "hidden_act");
    refused("PhiForCausalLM", "\"rope_parameters\":{\"rope_type\":\"longrope\",\"rope_theta\":10000.0,"
            "\"short_factor\":[1,1,1,1],\"long_factor\":[1,1,1,1]}", "longrope");
}

static void test_neox(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("GPTNeoXForCausalLM", "\"num_key_value_heads\":2", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_NEOX);
    CHECK_INT(c.parallel_block, 1);                        /* use_parallel_residual defaults to true */
    CHECK_INT(c.n_kv_heads, 4);                            /* GPT-NeoX has no GQA: the key is not its */
    CHECK_INT(c.head_dim, 16);
    CHECK_INT(c.qkv_bias && c.o_bias && c.mlp_bias, 1);
    CHECK(!strcmp(c.activation, "gelu"));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.25, 0);
    CHECK_NEAR(c.rope_theta, 10000.0, 0);
    /* The older spellings, and rope_parameters before them. */
    CHECK_OK(parse("GPTNeoXForCausalLM", "\"rotary_pct\":0.5,\"rotary_emb_base\":500,\"use_parallel_residual\":false,"
                   "\"attention_bias\":false", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.5, 0);
    CHECK_NEAR(c.rope_theta, 500.0, 0);
    CHECK_INT(c.parallel_block, 0);
    CHECK_INT(c.qkv_bias || c.o_bias, 0);
    CHECK_INT(c.mlp_bias, 1);
    CHECK_OK(parse("GPTNeoXForCausalLM", "\"rotary_pct\":0.5,\"rotary_emb_base\":500,\"rope_parameters\":{\"rope_type\":"
                   "\"default\",\"rope_theta\":2000.0,\"partial_rotary_factor\":1.0}", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 1.0, 0);
    CHECK_NEAR(c.rope_theta, 2000.0, 0);
    refused("GPTNeoXForCausalLM", "\"head_dim\":32", "head_dim 32");
    refused("GPTNeoXForCausalLM", "\"hidden_act\":\"gelu_fast\"", "hidden_act \"gelu_fast\"");
}

static void test_cohere2(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Cohere2ForCausalLM", "\"num_key_value_heads\":2,\"head_dim\":32", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_COHERE2);
    CHECK_INT(c.parallel_block, 1);
    CHECK_INT(c.mlp_plain, 0);
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.head_dim, 16);                             /* hidden / heads, as Cohere2Config sets it */
    CHECK_NEAR(c.logit_scale, 0.0625, 0);
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.qkv_bias || c.o_bias || c.mlp_bias, 0);
    /* sliding_window_pattern 4 by default: with 2 layers both slide and both turn. */
    CHECK_INT(c.layer_sliding[0] && c.layer_sliding[1], 1);
    CHECK_INT(c.layer_nope[0] || c.layer_nope[1], 0);
    CHECK_OK(parse("Cohere2ForCausalLM", "\"layer_types\":[\"sliding_attention\",\"full_attention\"],\"logit_scale\":0.5",
                   &c, &err));
    CHECK_INT(c.layer_nope[0], 0);
    CHECK_INT(c.layer_nope[1], 1);                          /* the full layer has no RoPE */
    CHECK_NEAR(c.logit_scale, 0.5, 0);
    CHECK_OK(parse("Cohere2ForCausalLM", "\"sliding_window_pattern\":2", &c, &err));
    CHECK_INT(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_nope[1], 1);
    refused("Cohere2ForCausalLM", "\"sliding_window\":null", "sliding_window null");
    refused("Cohere2ForCausalLM", "\"partial_rotary_factor\":0.5", "partial_rotary_factor");
    refused("Cohere2ForCausalLM", "\"hidden_act\":\"gelu\"", "hidden_act");
}

int main(void)
{
    TEST_RUN(test_starcoder2);
    TEST_RUN(test_phi);
    TEST_RUN(test_neox);
    TEST_RUN(test_cohere2);
    return test_finish();
}
