/* config.json of the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE): the config
 * classes' defaults (layer_types from full_attention_interval, partial_rotary_factor 0.25,
 * the linear attention's heads), dense layers among experts (mlp_only_layers,
 * decoder_sparse_step), Qwen3.5's M-RoPE keys read and set aside, and what the forward does
 * not implement refused by name. The forward parity itself is test_model_families. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

#define BASE "\"architectures\":[\"%s\"],\"hidden_size\":64,\"num_hidden_layers\":%d,\"num_attention_heads\":4," \
             "\"num_key_value_heads\":2,\"vocab_size\":256,\"max_position_embeddings\":64,\"num_experts_per_tok\":2"

static int parse(const char *arch, int layers, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{" BASE "%s%s}", arch, layers, extra[0] ? "," : "", extra);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void refused(const char *arch, int layers, const char *extra, const char *needle)
{
    qd_model_config c;
    qd_err err;
    char ex[1024];
    snprintf(ex, sizeof ex, "%s%s", strcmp(arch, "Qwen3NextForCausalLM") ? "" : "\"num_experts\":8,", extra);
    int rc = parse(arch, layers, ex, &c, &err);
    CHECK(rc == QD_EUNSUPPORTED || rc == QD_EFORMAT);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_defaults(void)
{
    qd_model_config c;
    qd_err err;
    /* Qwen3NextConfig's 512 experts are the most the MoE forward takes (QD_MAX_EXPERTS);
     * more are refused by count, not truncated. */
    CHECK_OK(parse("Qwen3NextForCausalLM", 8, "", &c, &err));
    CHECK_INT(c.n_experts, 512);
    CHECK_INT(parse("Qwen3NextForCausalLM", 8, "\"num_experts\":513", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "513 experts");
    CHECK_OK(parse("Qwen3NextForCausalLM", 8, "\"num_experts\":64", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_QWEN_NEXT);
    /* Qwen3NextConfig: every 4th layer full attention; the linear attention's shape. */
    for (int i = 0; i < 8; i++) CHECK_INT(c.layer_mixer[i], (i + 1) % 4 ? QD_MIXER_GATED_DELTANET : QD_MIXER_ATTENTION);
    CHECK_INT(c.gdn_k_heads, 16);
    CHECK_INT(c.gdn_v_heads, 32);
    CHECK_INT(c.gdn_k_dim, 128);
    CHECK_INT(c.gdn_v_dim, 128);
    CHECK_INT(c.gdn_conv, 4);
    CHECK_INT(c.head_dim, 256);
    CHECK_INT(c.n_experts, 64);
    CHECK_INT(c.top_k, 2);
    CHECK_INT(c.intermediate, 5632);
    CHECK(c.norm_topk_prob && c.attn_gate && c.qk_norm);
    CHECK(c.norm_offset == 1.0f);
    CHECK(c.rope.partial_rotary_factor == 0.25f);
    for (int i = 0; i < 8; i++) CHECK_INT(c.layer_dense[i], 0);
    /* full_attention_interval, mlp_only_layers and decoder_sparse_step. */
    CHECK_OK(parse("Qwen3NextForCausalLM", 6, "\"num_experts\":8,\"full_attention_interval\":2,\"mlp_only_layers\":[0,4,99],"
                   "\"decoder_sparse_step\":2", &c, &err));
    for (int i = 0; i < 6; i++) CHECK_INT(c.layer_mixer[i], i % 2 ? QD_MIXER_ATTENTION : QD_MIXER_GATED_DELTANET);
    static const int dense[6] = {1, 0, 1, 0, 1, 0};   /* 0, 4 listed; 0, 2, 4 off the sparse step */
    for (int i = 0; i < 6; i++) CHECK_INT(c.layer_dense[i], dense[i]);
    /* num_experts 0: every layer dense, as transformers builds it. */
    CHECK_OK(parse("Qwen3NextForCausalLM", 2, "\"num_experts\":0", &c, &err));
    CHECK_INT(c.n_experts, 0);
    /* partial_rotary_factor given (top level or in rope_parameters) is taken as given. */
    CHECK_OK(parse("Qwen3NextForCausalLM", 2, "\"num_experts\":8,\"partial_rotary_factor\":0.5,\"rope_theta\":1e6", &c, &err));
    CHECK(c.rope.partial_rotary_factor == 0.5f && c.rope_theta == 1e6f);
    /* Qwen3.5: M-RoPE's keys set aside (text positions are equal in its three sections). */
    CHECK_OK(parse("Qwen3_5ForCausalLM", 4, "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e7,"
                   "\"mrope_section\":[11,11,10],\"mrope_interleaved\":true,\"partial_rotary_factor\":0.25}", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_QWEN35);
    CHECK_INT(c.n_experts, 0);
    CHECK_INT(c.intermediate, 12288);
    CHECK_INT(c.n_kv_heads, 2);
    CHECK(c.rope_theta == 1e7f && c.rope.partial_rotary_factor == 0.25f);
    CHECK_OK(parse("Qwen3_5MoeForCausalLM", 4, "", &c, &err));
    CHECK_INT(c.n_experts, 256);
    CHECK_INT(c.top_k, 2);
    CHECK(c.norm_topk_prob);
}

static void test_refusals(void)
{
    refused("Qwen3NextForCausalLM", 2, "\"layer_types\":[\"linear_attention\",\"sliding_attention\"]", "sliding_attention");
    refused("Qwen3NextForCausalLM", 2, "\"layer_types\":[\"linear_attention\"]", "layer_types");
    refused("Qwen3NextForCausalLM", 2, "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4,\"rope_theta\":1e4}",
            "rope_type other than");
    refused("Qwen3NextForCausalLM", 2, "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e4,"
            "\"mrope_section\":[1,1,2]}", "mrope_section");
    refused("Qwen3NextForCausalLM", 2, "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e4,\"foo\":1}",
            "rope_parameters.foo");
    refused("Qwen3NextForCausalLM", 2, "\"hidden_act\":\"gelu\"", "hidden_act");
    refused("Qwen3NextForCausalLM", 2, "\"mlp_bias\":true", "mlp_bias");
    refused("Qwen3NextForCausalLM", 2, "\"sliding_window\":16", "sliding_window");
    refused("Qwen3NextForCausalLM", 2, "\"routed_scaling_factor\":2.5", "routed_scaling_factor");
    refused("Qwen3NextForCausalLM", 2, "\"linear_num_value_heads\":3,\"linear_num_key_heads\":2", "linear_num_value_heads");
    refused("Qwen3NextForCausalLM", 2, "\"linear_key_head_dim\":512", "linear_key_head_dim");
    refused("Qwen3_5ForCausalLM", 2, "\"attn_logit_softcapping\":50", "attn_logit_softcapping");
    refused("Qwen3_5ForCausalLM", 2, "\"layer_types\":[\"mamba\",\"full_attention\"]", "\"mamba\"");
}

int main(void)
{
    TEST_RUN(test_defaults);
    TEST_RUN(test_refusals);
    return test_finish();
}
