/* config.json of the hybrids (config_hybrid.c): LFM2's and Granite-4's keys read with their
 * config classes' defaults and spellings (LFM2's feed-forward width rule, tie_embedding and
 * block_ff_dim, full_attn_idxs; Granite's legacy layer names, mamba_d_head "auto", its
 * multipliers, its MoE experts: 8 by default), and what is not computed refused by name
 * (experts past QD_MAX_EXPERTS or top-k past them, another activation, a
 * position_embedding_type other than rope / nope, a null
 * time_step_limit, an unknown layer kind); Falcon-H1's defaults and multipliers, and its refusals
 * (the gated norm before the gate, in_proj and out_proj biases apart, non-positive scales).
 * The forward parity is test_model_families. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

#define BASE "\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":3," \
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"max_position_embeddings\":64"

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

#define LFM2 "Lfm2ForCausalLM"
#define GRANITE "GraniteMoeHybridForCausalLM"

static void test_lfm2(void)
{
    qd_model_config c;
    qd_err err;
    /* Lfm2Config's defaults: every layer attends, theta 1e6, norm_eps 1e-5, tied, 3 taps;
     * the width: int(2 * 96 / 3) = 64, times 1.0, rounded up to 256. */
    CHECK_OK(parse(LFM2, "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_LFM2);
    CHECK_INT(c.intermediate, 256);
    CHECK_NEAR(c.rope_theta, 1e6, 1);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-9);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.mixer.conv_kernel, 3);
    CHECK_INT(c.qk_norm, 1);
    for (int i = 0; i < 3; i++) CHECK_INT(c.layer_mixer[i], QD_MIXER_ATTENTION);
    /* A multiplier and a multiple: int(1.5 * 64) = 96 -> 96; a null multiplier skips both. */
    CHECK_OK(parse(LFM2, "\"block_ffn_dim_multiplier\":1.5,\"block_multiple_of\":64", &c, &err));
    CHECK_INT(c.intermediate, 128);
    CHECK_OK(parse(LFM2, "\"block_ffn_dim_multiplier\":null", &c, &err));
    CHECK_INT(c.intermediate, 64);
    CHECK_OK(parse(LFM2, "\"block_auto_adjust_ff_dim\":false", &c, &err));
    CHECK_INT(c.intermediate, 96);
    /* The config class's own spellings: block_ff_dim over intermediate_size, tie_embedding. */
    CHECK_OK(parse(LFM2, "\"block_ff_dim\":192,\"block_multiple_of\":16,\"tie_embedding\":false", &c, &err));
    CHECK_INT(c.intermediate, 128);
    CHECK_INT(c.tie_word_embeddings, 0);
    /* full_attn_idxs without layer_types: the others convolve. */
    CHECK_OK(parse(LFM2, "\"full_attn_idxs\":[1]", &c, &err));
    CHECK_INT(c.layer_mixer[0], QD_MIXER_SHORT_CONV);
    CHECK_INT(c.layer_mixer[1], QD_MIXER_ATTENTION);
    CHECK_INT(c.layer_mixer[2], QD_MIXER_SHORT_CONV);
    CHECK_OK(parse(LFM2, "\"layer_types\":[\"conv\",\"conv\",\"full_attention\"],\"conv_bias\":true,\"conv_L_cache\":4",
                   &c, &err));
    CHECK_INT(c.layer_mixer[1], QD_MIXER_SHORT_CONV);
    CHECK_INT(c.layer_mixer[2], QD_MIXER_ATTENTION);
    CHECK_INT(c.mixer.conv_bias, 1);
    CHECK_INT(c.mixer.proj_bias, 1);
    CHECK_INT(c.mixer.conv_kernel, 4);
    refused(LFM2, "\"layer_types\":[\"conv\",\"sliding_attention\",\"conv\"]", "layer_types[1] \"sliding_attention\"");
    refused(LFM2, "\"sliding_window\":16", "sliding_window");
    CHECK_INT(parse(LFM2, "\"layer_types\":[\"conv\"]", &c, &err), QD_EFORMAT);
}

static void test_granite(void)
{
    qd_model_config c;
    qd_err err;
    /* num_local_experts defaults to 8: MoE experts beside shared_mlp, of intermediate_size,
     * num_experts_per_tok 2 by default, the top-k logits softmaxed (no renormalisation). */
    CHECK_OK(parse(GRANITE, "\"mamba_n_heads\":8,\"shared_intermediate_size\":32", &c, &err));
    CHECK_INT(c.n_experts, 8);
    CHECK_INT(c.top_k, 2);
    CHECK_INT(c.moe_intermediate, 96);               /* intermediate_size */
    CHECK_INT(c.intermediate, 32);                   /* shared_mlp */
    CHECK_INT(c.shared_intermediate, 0);             /* shared_mlp is no MoE shared expert */
    CHECK_INT(c.moe_scoring, QD_MOE_TOPK_SOFTMAX);
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_OK(parse(GRANITE, "\"num_local_experts\":4,\"num_experts_per_tok\":3,\"mamba_n_heads\":8", &c, &err));
    CHECK_INT(c.n_experts, 4);
    CHECK_INT(c.top_k, 3);
    refused(GRANITE, "\"num_local_experts\":4,\"num_experts_per_tok\":5,\"mamba_n_heads\":8", "num_experts_per_tok 5");
    refused(GRANITE, "\"num_local_experts\":1000,\"mamba_n_heads\":8", "num_local_experts 1000");
    refused(GRANITE, "\"hidden_act\":\"gelu\",\"mamba_n_heads\":8", "hidden_act \"gelu\"");
    CHECK_INT(parse(GRANITE, "\"num_local_experts\":-1,\"mamba_n_heads\":8", &c, &err), QD_EFORMAT);
    const char *dense = "\"num_local_experts\":0,\"mamba_n_heads\":8,\"mamba_d_state\":16,\"shared_intermediate_size\":32";
    CHECK_OK(parse(GRANITE, dense, &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_GRANITE_HYBRID);
    CHECK_INT(c.intermediate, 32);                   /* shared_mlp's width, not intermediate_size */
    CHECK_INT(c.mixer.ssm_head_dim, 16);             /* "auto": 2 * 64 / 8 */
    CHECK_INT(c.mixer.ssm_groups, 1);
    CHECK_INT(c.mixer.conv_kernel, 4);
    CHECK_INT(c.mixer.conv_bias, 1);
    CHECK_INT(c.mixer.proj_bias, 0);
    CHECK(c.mixer.dt_min == 0.0f && isinf(c.mixer.dt_max));
    CHECK_NEAR(c.attn_scale, 1.0, 0);                /* attention_multiplier's default: the scale itself */
    CHECK_INT(c.tie_word_embeddings, 0);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(c.layer_mixer[i], QD_MIXER_MAMBA2); /* every layer Mamba-2 by default */
        CHECK_INT(c.layer_nope[i], 1);               /* position_embedding_type null: no RoPE */
    }
    char buf[1024];
    /* The legacy names (layers_block_type, "mamba" / "attention") and the multipliers. */
    snprintf(buf, sizeof buf, "%s,\"layers_block_type\":[\"mamba\",\"attention\",\"mamba\"],\"position_embedding_type\":"
             "\"rope\",\"embedding_multiplier\":12.0,\"attention_multiplier\":0.0078125,\"residual_multiplier\":0.22,"
             "\"logits_scaling\":8.0,\"time_step_limit\":[0.001,100.0],\"mamba_n_groups\":2", dense);
    CHECK_OK(parse(GRANITE, buf, &c, &err));
    CHECK_INT(c.layer_mixer[1], QD_MIXER_ATTENTION);
    CHECK_INT(c.layer_nope[1], 0);
    CHECK_NEAR(c.embed_scale, 12.0, 0);
    CHECK_NEAR(c.attn_scale, 0.0078125, 0);
    CHECK_NEAR(c.residual_scale, 0.22f, 0);
    CHECK_NEAR(c.logit_scale, 0.125, 0);
    CHECK_NEAR(c.mixer.dt_min, 0.001f, 0);
    CHECK_NEAR(c.mixer.dt_max, 100.0, 0);
    /* transformers 5 writes the default's inf as {"__float__": "Infinity"}. */
    snprintf(buf, sizeof buf, "%s,\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}]", dense);
    CHECK_OK(parse(GRANITE, buf, &c, &err));
    CHECK(c.mixer.dt_min == 0.0f && isinf(c.mixer.dt_max) && c.mixer.dt_max > 0);
    snprintf(buf, sizeof buf, "%s,\"time_step_limit\":[0.0,{\"__float__\":\"NaN\"}]", dense);
    CHECK_INT(parse(GRANITE, buf, &c, &err), QD_EFORMAT);
    snprintf(buf, sizeof buf, "%s,\"position_embedding_type\":\"alibi\"", dense);
    refused(GRANITE, buf, "position_embedding_type \"alibi\"");
    snprintf(buf, sizeof buf, "%s,\"time_step_limit\":null", dense);
    refused(GRANITE, buf, "time_step_limit null");
    snprintf(buf, sizeof buf, "%s,\"layer_types\":[\"mamba\",\"conv\",\"mamba\"]", dense);
    refused(GRANITE, buf, "layer_types[1] \"conv\"");
    snprintf(buf, sizeof buf, "%s,\"mamba_d_head\":12", dense);   /* 12 * 8 != 128 */
    CHECK_INT(parse(GRANITE, buf, &c, &err), QD_EFORMAT);
    snprintf(buf, sizeof buf, "%s,\"mamba_n_groups\":3", dense);  /* 3 does not divide 8 heads */
    CHECK_INT(parse(GRANITE, buf, &c, &err), QD_EFORMAT);
}

#define FALCON "FalconH1ForCausalLM"

/* Falcon-H1: FalconH1Config's defaults (mamba_d_ssm 1024 in 128 heads, state 256, no gated
 * norm, multipliers 1), its multipliers read, and what is not computed refused by name. */
static void test_falcon_h1(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse(FALCON, "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_FALCON_H1);
    CHECK_INT(c.parallel_block, 1);
    CHECK_INT(c.mixer.ssm_heads, 128);
    CHECK_INT(c.mixer.ssm_head_dim, 8);
    CHECK_INT(c.mixer.ssm_groups, 1);
    CHECK_INT(c.mixer.ssm_state, 256);
    CHECK_INT(c.mixer.conv_kernel, 4);
    CHECK_INT(c.mixer.conv_bias, 1);
    CHECK_INT(c.mixer.proj_bias, 0);
    CHECK_INT(c.mixer.no_norm, 1);
    CHECK(isinf(c.mixer.dt_max));
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-9);
    CHECK_NEAR(c.attn_scale, 0.25, 1e-7);   /* head_dim 16 */
    for (int i = 0; i < 3; i++) CHECK_INT(c.layer_mixer[i], QD_MIXER_MAMBA2);
    for (int i = 0; i < 5; i++) CHECK_NEAR(c.mixer.mup[i], 1, 0);
    CHECK_NEAR(c.falcon.attn_in, 1, 0);
    CHECK_NEAR(c.falcon.mlp_down, 1, 0);
    /* mamba_d_ssm null: mamba_expand * hidden_size (128, heads of 1); the multipliers. */
    CHECK_OK(parse(FALCON, "\"mamba_d_ssm\":null,\"key_multiplier\":0.5,\"mlp_multipliers\":[2,3],"
                           "\"ssm_multipliers\":[1,2,3,4,5],\"embedding_multiplier\":4,\"lm_head_multiplier\":0.25,"
                           "\"attention_in_multiplier\":6,\"ssm_out_multiplier\":7", &c, &err));
    CHECK_INT(c.mixer.ssm_head_dim, 1);
    CHECK_NEAR(c.attn_scale, 0.125, 1e-7);
    CHECK_NEAR(c.falcon.mlp_gate, 2, 0);
    CHECK_NEAR(c.falcon.mlp_down, 3, 0);
    CHECK_NEAR(c.mixer.mup[4], 5, 0);
    CHECK_NEAR(c.embed_scale, 4, 0);
    CHECK_NEAR(c.logit_scale, 0.25, 0);
    CHECK_NEAR(c.falcon.attn_in, 6, 0);
    CHECK_NEAR(c.falcon.ssm_out, 7, 0);
    /* The gated norm after the gate (Granite's, vLLM's) is computed; before it, refused. */
    CHECK_OK(parse(FALCON, "\"mamba_rms_norm\":true,\"mamba_norm_before_gate\":false", &c, &err));
    CHECK_INT(c.mixer.no_norm, 0);
    refused(FALCON, "\"mamba_rms_norm\":true", "mamba_rms_norm true with mamba_norm_before_gate true");
    CHECK_OK(parse(FALCON, "\"mamba_proj_bias\":true,\"projectors_bias\":true", &c, &err));
    CHECK_INT(c.mixer.proj_bias, 1);
    refused(FALCON, "\"mamba_proj_bias\":true", "mamba_proj_bias true with projectors_bias false");
    refused(FALCON, "\"projectors_bias\":true", "mamba_proj_bias false with projectors_bias true");
    refused(FALCON, "\"key_multiplier\":0", "key_multiplier");
    refused(FALCON, "\"lm_head_multiplier\":-1", "lm_head_multiplier");
    refused(FALCON, "\"hidden_act\":\"gelu\"", "hidden_act \"gelu\"");
    refused(FALCON, "\"time_step_limit\":null", "time_step_limit null");
    refused(FALCON, "\"sliding_window\":16", "sliding_window");
    CHECK_INT(parse(FALCON, "\"ssm_multipliers\":[1,2,3,4]", &c, &err), QD_EFORMAT);
    CHECK_INT(parse(FALCON, "\"mamba_d_head\":3", &c, &err), QD_EFORMAT);   /* 3 * 128 != 1024 */
}

int main(void)
{
    TEST_RUN(test_lfm2);
    TEST_RUN(test_granite);
    TEST_RUN(test_falcon_h1);
    return test_finish();
}
