/* Llama 4 text's config.json (config_llama4.c): Llama4TextConfig's defaults where a key is
 * absent, meta-llama's Scout text config read as transformers reads it, and what this
 * forward does not compute refused by name. Forward parity is test_model_families
 * (tests/data/families/llama4). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *body, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{\"architectures\":[\"Llama4ForCausalLM\"],\"model_type\":\"llama4_text\"%s%s}",
             body[0] ? "," : "", body);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

/* meta-llama/Llama-4-Scout-17B-16E's text_config (the keys that matter to the forward). */
#define SCOUT "\"hidden_size\":5120,\"intermediate_size\":8192,\"intermediate_size_mlp\":16384," \
              "\"num_hidden_layers\":48,\"num_attention_heads\":40,\"num_key_value_heads\":8,\"head_dim\":128," \
              "\"vocab_size\":202048,\"max_position_embeddings\":10485760,\"num_local_experts\":16," \
              "\"num_experts_per_tok\":1,\"interleave_moe_layer_step\":1,\"use_qk_norm\":true," \
              "\"attention_chunk_size\":8192,\"attn_temperature_tuning\":4,\"floor_scale\":8192,\"attn_scale\":0.1," \
              "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":16.0,\"high_freq_factor\":1.0," \
              "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}," \
              "\"rms_norm_eps\":1e-05,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false"

static void test_scout_and_defaults(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse(SCOUT, &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_LLAMA4);
    CHECK_INT(c.n_experts, 16);
    CHECK_INT(c.top_k, 1);
    CHECK_INT(c.moe_scoring, QD_MOE_SIGMOID_INPUT);
    CHECK_INT(c.intermediate, 16384);
    CHECK_INT(c.moe_intermediate, 8192);
    CHECK_INT(c.shared_intermediate, 8192);
    CHECK_INT(c.rope.type, QD_ROPE_LLAMA3);
    CHECK_NEAR(c.rope.factor, 16.0, 0);
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.qk_l2norm, 1);
    CHECK_INT(c.attn_chunk, 8192);
    /* Every 4th layer is NoPE and attends globally with the temperature; the others chunk. */
    CHECK_INT(!c.layer_nope[0] && !c.layer_nope[2] && c.layer_nope[3] && c.layer_nope[47], 1);
    CHECK_INT(c.layer_chunked[0] && !c.layer_chunked[3] && c.layer_chunked[46], 1);
    CHECK_INT(c.q_pos_scale_nope, 1);
    CHECK_NEAR(c.q_pos_scale_beta, 0.1f, 0);
    CHECK_INT(c.q_pos_scale_orig, 8192);
    /* interleave_moe_layer_step 1: every layer is MoE. */
    CHECK_INT(c.layer_dense[0] || c.layer_dense[47], 0);
    /* Nothing but the architecture: Llama4TextConfig's defaults. */
    CHECK_OK(parse("", &c, &err));
    CHECK_INT(c.hidden, 5120);
    CHECK_INT(c.n_layers, 48);
    CHECK_INT(c.n_heads, 40);
    CHECK_INT(c.n_kv_heads, 8);
    CHECK_INT(c.head_dim, 128);
    CHECK_INT(c.vocab, 202048);
    CHECK_INT(c.max_pos, 131072);
    CHECK_INT(c.intermediate, 16384);
    CHECK_INT(c.moe_intermediate, 8192);
    CHECK_INT(c.n_experts, 16);
    CHECK_NEAR(c.norm_eps, 1e-5f, 0);
    CHECK_NEAR(c.rope_theta, 500000.0, 0);
    CHECK_INT(c.rope.type, QD_ROPE_DEFAULT);
    CHECK_INT(c.qk_l2norm && c.q_pos_scale_nope, 1);
    CHECK_NEAR(c.q_pos_scale_beta, 0.1f, 0);
    /* Maverick's shape: dense and MoE layers interleaved, no q/k norm, no temperature. */
    CHECK_OK(parse("\"num_hidden_layers\":4,\"interleave_moe_layer_step\":2,\"use_qk_norm\":false,"
                   "\"attn_temperature_tuning\":false", &c, &err));
    CHECK_INT(c.layer_dense[0] && !c.layer_dense[1] && c.layer_dense[2] && !c.layer_dense[3], 1);
    CHECK_INT(c.qk_l2norm || c.q_pos_scale_beta > 0, 0);
    /* moe_layers and no_rope_layers as written (a longer no_rope_layers list is read from its start). */
    CHECK_OK(parse("\"num_hidden_layers\":3,\"moe_layers\":[2],\"no_rope_layers\":[0,1,1,1]", &c, &err));
    CHECK_INT(c.layer_dense[0] && c.layer_dense[1] && !c.layer_dense[2], 1);
    CHECK_INT(c.layer_nope[0] && !c.layer_nope[1] && !c.layer_nope[2], 1);
    CHECK_INT(!c.layer_chunked[0] && c.layer_chunked[1], 1);
    /* layer_types as written decides the chunking. */
    CHECK_OK(parse("\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\",\"chunked_attention\"]", &c, &err));
    CHECK_INT(!c.layer_chunked[0] && c.layer_chunked[1], 1);
}

static void test_refused(void)
{
    static const struct { const char *body; int rc; const char *msg; } cases[] = {
        {"\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":500000.0,\"factor\":4.0}", QD_EUNSUPPORTED,
         "rope_type \"yarn\" is not supported for Llama4ForCausalLM"},
        {"\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0,\"partial_rotary_factor\":0.5}",
         QD_EUNSUPPORTED, "partial_rotary_factor 0.5 is not supported"},
        {"\"attention_chunk_size\":null", QD_EUNSUPPORTED, "attention_chunk_size null is not supported"},
        {"\"num_hidden_layers\":2,\"layer_types\":[\"sliding_attention\",\"full_attention\"]", QD_EUNSUPPORTED,
         "layer_types[0] \"sliding_attention\" is not supported"},
        {"\"sliding_window\":4096", QD_EUNSUPPORTED, "sliding_window is set"},
        {"\"hidden_act\":\"gelu\"", QD_EUNSUPPORTED, "hidden_act \"gelu\" is not supported"},
        {"\"num_hidden_layers\":2,\"moe_layers\":[2]", QD_EFORMAT, "moe_layers entries must be layer indices"},
        {"\"num_hidden_layers\":3,\"no_rope_layers\":[1,0]", QD_EFORMAT, "no_rope_layers must be a list"},
        {"\"num_experts_per_tok\":17", QD_EFORMAT, "num_experts_per_tok 17"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qd_model_config c;
        qd_err err;
        CHECK_INT(parse(cases[i].body, &c, &err), cases[i].rc);
        CHECK_CONTAINS(err.msg, cases[i].msg);
    }
}

/* Llama4ForConditionalGeneration: the text tower's keys from text_config, with
 * Llama4TextConfig's defaults; another text model_type is refused. */
static void test_multimodal(void)
{
    qd_model_config c;
    qd_err err;
    memset(&err, 0, sizeof err);
    CHECK_OK(qd_model_config_parse("{\"architectures\":[\"Llama4ForConditionalGeneration\"],\"model_type\":\"llama4\","
                                   "\"text_config\":{\"model_type\":\"llama4_text\",\"num_hidden_layers\":4,"
                                   "\"interleave_moe_layer_step\":2},\"vision_config\":{\"model_type\":"
                                   "\"llama4_vision_model\"}}", "config.json", &c, &err));
    CHECK_INT(c.multimodal, 1);
    CHECK_INT(c.layout, QD_LAYOUT_LLAMA4);
    CHECK_INT(c.hidden, 5120);
    CHECK_INT(c.tie_word_embeddings, 0);
    CHECK_INT(c.layer_dense[0] && !c.layer_dense[1], 1);
    CHECK_INT(c.layer_nope[3] && !c.layer_nope[2], 1);
    memset(&err, 0, sizeof err);
    CHECK_INT(qd_model_config_parse("{\"architectures\":[\"Llama4ForConditionalGeneration\"],\"text_config\":"
                                    "{\"model_type\":\"llama\"}}", "config.json", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "text_config.model_type \"llama\" is not supported");
}

int main(void)
{
    TEST_RUN(test_multimodal);
    TEST_RUN(test_scout_and_defaults);
    TEST_RUN(test_refused);
    return test_finish();
}
