/* config.json of GLM-4.5 MoE, dots.llm1, OLMoE, MiniMax-M2, ERNIE 4.5 MoE and PhiMoE (config_moe.c):
 * the config classes' defaults where a key is absent (GLM's partial_rotary_factor 0.5,
 * MiniMax-M2's head_dim 128, rope_theta 5e6 and rotary_dim), and the keys the forward does
 * not compute refused by name. The forward parity itself is test_model_families. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *arch, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{\"architectures\":[\"%s\"],%s%s\"hidden_size\":64,\"intermediate_size\":64,"
             "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,"
             "\"max_position_embeddings\":64}", arch, extra, extra[0] ? "," : "");
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void test_glm4_moe(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_MOE_SHARED);
    CHECK_INT(c.moe_scoring, QD_MOE_SIGMOID_GROUPED);
    CHECK_INT(c.first_dense, 1);                 /* Glm4MoeConfig's defaults */
    CHECK_INT(c.shared_intermediate, 1408);
    CHECK_INT(c.norm_topk_prob, 1);
    CHECK_INT(c.n_group, 1);
    CHECK_INT(c.qk_norm, 0);
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.5, 0);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.routed_scale, 1.0, 0);
    CHECK_OK(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"attention_bias\":true,"
                   "\"use_qk_norm\":true,\"partial_rotary_factor\":1.0,\"n_shared_experts\":0", &c, &err));
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.o_bias, 0);                      /* o_proj never has one */
    CHECK_INT(c.qk_norm, 1);
    CHECK_INT(c.shared_intermediate, 0);
    CHECK_NEAR(c.rope.partial_rotary_factor, 1.0, 0);
    CHECK_OK(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6,\"partial_rotary_factor\":0.25}",
                   &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.25, 0);
    CHECK_INT(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"scoring_func\":\"softmax\"",
                    &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "scoring_func");
    CHECK_INT(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"topk_method\":\"greedy\"",
                    &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "topk_method");
    CHECK_INT(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"n_group\":8", &c, &err),
              QD_EFORMAT);                       /* groups of 1: a group scores its two best */
    CHECK_INT(parse("Glm4MoeForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"use_sliding_window\":true",
                    &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "use_sliding_window");
}

static void test_dots1(void)
{
    qd_model_config c;
    qd_err err;
    const char *need = "\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"n_shared_experts\":2";
    CHECK_OK(parse("Dots1ForCausalLM", need, &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_MOE_SHARED);
    CHECK_INT(c.first_dense, 0);                 /* Dots1Config's defaults */
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_INT(c.qk_norm, 1);
    CHECK_INT(c.shared_intermediate, 2 * 1408);
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.layer_sliding[2], 0);            /* max_window_layers 62: no layer slides */
    char ex[512];
    snprintf(ex, sizeof ex, "%s,\"sliding_window\":16,\"max_window_layers\":1", need);
    CHECK_OK(parse("Dots1ForCausalLM", ex, &c, &err));
    CHECK_INT(c.layer_sliding[0], 0);
    CHECK_INT(c.layer_sliding[1], 1);
    CHECK_INT(c.layer_sliding[2], 1);
    snprintf(ex, sizeof ex, "%s,\"layer_types\":[\"full_attention\",\"chunked_attention\",\"full_attention\"]", need);
    CHECK_INT(parse("Dots1ForCausalLM", ex, &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "layer_types[1]");
    CHECK_INT(parse("Dots1ForCausalLM", "\"n_routed_experts\":8,\"num_experts_per_tok\":2", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "n_shared_experts");
}

static void test_olmoe(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("OlmoeForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_QWEN_MOE);
    CHECK_INT(c.n_experts, 64);                  /* OlmoeConfig's defaults */
    CHECK_INT(c.top_k, 8);
    CHECK_INT(c.moe_intermediate, 64);           /* intermediate_size */
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_INT(c.qk_norm, 2);
    CHECK_INT(c.moe_scoring, QD_MOE_SOFTMAX);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_INT(parse("OlmoeForCausalLM", "\"clip_qkv\":8.0", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "clip_qkv");
    CHECK_OK(parse("OlmoeForCausalLM", "\"clip_qkv\":null", &c, &err));
    CHECK_INT(parse("OlmoeForCausalLM", "\"head_dim\":32", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "head_dim");
}

static void test_minimax_m2(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("MiniMaxM2ForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_MINIMAX);
    CHECK_INT(c.head_dim, 128);                  /* MiniMaxM2Config's defaults */
    CHECK_INT(c.n_experts, 256);
    CHECK_INT(c.top_k, 8);
    CHECK_INT(c.norm_topk_prob, 1);
    CHECK_INT(c.n_group, 1);
    CHECK_INT(c.qk_norm, 2);
    CHECK_NEAR(c.rope_theta, 5e6, 0);
    CHECK_NEAR(c.rope.partial_rotary_factor, 1.0, 0);
    CHECK_OK(parse("MiniMaxM2ForCausalLM", "\"head_dim\":16,\"rotary_dim\":8,\"rope_theta\":10000,\"qk_norm_type\":"
                   "\"per_layer\",\"scoring_func\":\"sigmoid\",\"use_routing_bias\":true,\"attn_type_list\":[1,1,1]",
                   &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.5, 0);
    CHECK_NEAR(c.rope_theta, 1e4, 0);
    /* partial_rotary_factor, where given, wins over rotary_dim (transformers' setdefault). */
    CHECK_OK(parse("MiniMaxM2ForCausalLM", "\"head_dim\":16,\"rotary_dim\":8,\"partial_rotary_factor\":0.25", &c, &err));
    CHECK_NEAR(c.rope.partial_rotary_factor, 0.25, 0);
    static const char *const refused[][2] = {
        {"\"qk_norm_type\":\"per_head\"", "qk_norm_type"},
        {"\"scoring_func\":\"softmax\"", "scoring_func"},
        {"\"use_routing_bias\":false", "use_routing_bias"},
        {"\"use_qk_norm\":false", "use_qk_norm"},
        {"\"shared_intermediate_size\":64", "shared_intermediate_size"},
        {"\"attn_type_list\":[0,1,1]", "attn_type_list"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        CHECK_INT(parse("MiniMaxM2ForCausalLM", refused[i][0], &c, &err), QD_EUNSUPPORTED);
        CHECK_CONTAINS(err.msg, refused[i][1]);
    }
}

static void test_ernie_moe(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Ernie4_5_MoeForCausalLM", "", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_ERNIE_MOE);
    CHECK_INT(c.moe_scoring, QD_MOE_SOFTMAX_BIAS);
    CHECK_INT(c.n_experts, 64);                  /* Ernie4_5_MoeConfig's defaults */
    CHECK_INT(c.top_k, 6);
    CHECK_INT(c.shared_intermediate, 2 * 1536);
    CHECK_INT(c.layer_dense[0], 1);              /* moe_layer_start_index 1 */
    CHECK_INT(c.layer_dense[2], 0);              /* end index -1: the last layer */
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_NEAR(c.rope_theta, 5e5, 0);
    CHECK_OK(parse("Ernie4_5_MoeForCausalLM", "\"num_experts\":8,\"moe_k\":2,\"moe_layer_start_index\":0,"
                   "\"moe_layer_end_index\":1,\"moe_layer_interval\":2,\"tie_word_embeddings\":false", &c, &err));
    CHECK_INT(c.n_experts, 8);
    CHECK_INT(c.top_k, 2);
    CHECK_INT(c.layer_dense[0], 1);              /* (0 + 1) % 2 */
    CHECK_INT(c.layer_dense[1], 0);
    CHECK_INT(c.layer_dense[2], 1);              /* past moe_layer_end_index 1 */
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK_INT(parse("Ernie4_5_MoeForCausalLM", "\"use_bias\":true", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "use_bias");
    CHECK_INT(parse("Ernie4_5_MoeForCausalLM", "\"partial_rotary_factor\":0.5", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "partial_rotary_factor");
    CHECK_INT(parse("Ernie4_5_MoeForCausalLM", "\"moe_layer_interval\":0", &c, &err), QD_EFORMAT);
    CHECK_INT(parse("Ernie4_5_MoeForCausalLM", "\"moe_layer_start_index\":2,\"moe_layer_end_index\":1", &c, &err),
              QD_EFORMAT);
}

/* PhiMoE: PhimoeConfig's defaults for a bare config; Phi-3.5-MoE's keys (shrunk): biases,
 * a window on every layer, its longrope with short_mscale/long_mscale; any other RoPE
 * scaling and a top-k the sparsemixer does not compute refused by name. */
static void test_phimoe(void)
{
    qd_model_config c;
    qd_err err;
    memset(&err, 0, sizeof err);
    CHECK_OK(qd_model_config_parse("{\"architectures\":[\"PhimoeForCausalLM\"]}", "config.json", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_PHIMOE);
    CHECK_INT(c.moe_scoring, QD_MOE_SPARSEMIXER);
    CHECK_INT(c.n_experts, 16);
    CHECK_INT(c.top_k, 2);
    CHECK_INT(c.intermediate, 6400);
    CHECK_INT(c.moe_intermediate, 6400);
    CHECK_INT(c.vocab, 32064);
    CHECK_INT(c.max_pos, 131072);
    CHECK_INT(c.n_kv_heads, 8);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK_NEAR(c.router_jitter, 0.01, 1e-9);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_INT(c.o_bias, 0);
    CHECK_INT(c.lm_head_bias, 0);
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_INT(c.sliding_window, 0);
    CHECK_OK(parse("PhimoeForCausalLM", "\"num_local_experts\":8,\"attention_bias\":true,\"lm_head_bias\":true,"
                   "\"router_jitter_noise\":0.3,\"sliding_window\":32,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-5,"
                   "\"rope_scaling\":null,\"input_jitter_noise\":0.01", &c, &err));
    CHECK_INT(c.n_experts, 8);
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.o_bias, 1);
    CHECK_INT(c.lm_head_bias, 1);
    CHECK_NEAR(c.router_jitter, 0.3, 1e-7);
    CHECK_INT(c.sliding_window, 32);
    CHECK_INT(c.layer_sliding[0], 1);
    CHECK_INT(c.layer_sliding[2], 1);
    CHECK_NEAR(c.rope_theta, 1e4, 0);
    CHECK_INT(parse("PhimoeForCausalLM", "\"num_experts_per_tok\":3", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "num_experts_per_tok 3");
    /* Phi-3.5-MoE's longrope (PhimoeRotaryEmbedding's: rope.c); its mscales are required. */
    CHECK_OK(parse("PhimoeForCausalLM", "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,1,1],"
                   "\"long_factor\":[2,2,2,2,2,2,2,2],\"short_mscale\":1.2,\"long_mscale\":1.5,"
                   "\"original_max_position_embeddings\":32}", &c, &err));
    CHECK_INT(c.rope.type, QD_ROPE_LONGROPE);
    CHECK_NEAR(c.rope.short_mscale, 1.2, 1e-6);
    CHECK_NEAR(c.rope.long_mscale, 1.5, 1e-6);
    CHECK_INT(parse("PhimoeForCausalLM", "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,1,1],"
                    "\"long_factor\":[2,2,2,2,2,2,2,2],\"original_max_position_embeddings\":32}", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "short_mscale");
    /* The mscales are PhiMoE's: Phi-3's longrope with them is refused. */
    CHECK_INT(parse("Phi3ForCausalLM", "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,1,1],"
                    "\"long_factor\":[2,2,2,2,2,2,2,2],\"short_mscale\":1.2,\"long_mscale\":1.5,"
                    "\"original_max_position_embeddings\":32}", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "short_mscale");
    CHECK_INT(parse("PhimoeForCausalLM", "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}", &c, &err),
              QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "rope_type");
    CHECK_INT(parse("PhimoeForCausalLM", "\"partial_rotary_factor\":0.5", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "partial_rotary_factor");
    CHECK_INT(parse("PhimoeForCausalLM", "\"hidden_act\":\"gelu\"", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "hidden_act");
    CHECK_INT(parse("PhimoeForCausalLM", "\"router_jitter_noise\":-1", &c, &err), QD_EFORMAT);
}

int main(void)
{
    TEST_RUN(test_glm4_moe);
    TEST_RUN(test_dots1);
    TEST_RUN(test_olmoe);
    TEST_RUN(test_minimax_m2);
    TEST_RUN(test_ernie_moe);
    TEST_RUN(test_phimoe);
    return test_finish();
}
