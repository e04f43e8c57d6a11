/* DeepSeek-V3.2's config.json (config_dsa.c): DeepseekV32Config's defaults for the indexer,
 * the V3 keys read as V3's, and what transformers' DeepseekV32 does not compute refused by
 * name. Forward parity is test_model_families (tests/data/families/deepseek_v32). */
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"

static int parse(const char *body, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"architectures\":[\"DeepseekV32ForCausalLM\"],\"model_type\":\"deepseek_v32\",\"hidden_size\":256,"
             "\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":4,\"vocab_size\":512,"
             "\"intermediate_size\":512,\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"n_group\":4,"
             "\"topk_group\":2%s%s}",
             body[0] ? "," : "", body);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void test_defaults(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_DEEPSEEK);
    CHECK_INT(c.index_topk, 2048);             /* DeepseekV32Config's */
    CHECK_INT(c.index_heads, 64);
    CHECK_INT(c.index_head_dim, 128);
    CHECK_INT(c.q_lora_rank, 1536);
    CHECK_INT(c.qk_rope_dim, 64);
    CHECK_INT(c.head_dim, 64);
    CHECK_INT(c.rope_interleave, 1);
    CHECK_INT(c.first_dense, 3);
    /* The hub's keys: V3's routing names, its own indexer sizes, every layer indexed. */
    CHECK_OK(parse("\"index_topk\":16,\"index_head_dim\":96,\"index_n_heads\":8,\"scoring_func\":\"sigmoid\","
                   "\"topk_method\":\"noaux_tc\",\"layer_types\":[\"indexed_attention\",\"indexed_attention\","
                   "\"indexed_attention\"],\"indexer_rope_interleave\":false,\"index_topk_freq\":1",
                   &c, &err));
    CHECK_INT(c.index_topk, 16);
    CHECK_INT(c.index_heads, 8);
    CHECK_INT(c.index_head_dim, 96);
    /* mlp_layer_types wins over first_k_dense_replace, as transformers reads it. */
    CHECK_OK(parse("\"first_k_dense_replace\":1,\"mlp_layer_types\":[\"dense\",\"dense\",\"sparse\"]", &c, &err));
    CHECK_INT(c.first_dense, 2);
    CHECK_OK(parse("\"mlp_layer_types\":[\"dense\",\"dense\",\"dense\"]", &c, &err));
    CHECK_INT(c.first_dense, 3);
}

static void test_refused(void)
{
    static const struct { const char *body, *needle; int code; } cases[] = {
        {"\"q_lora_rank\":null", "q_lora_rank null", QD_EUNSUPPORTED},
        {"\"rope_interleave\":false", "rope_interleave false", QD_EUNSUPPORTED},
        {"\"indexer_rope_interleave\":true", "indexer_rope_interleave true", QD_EUNSUPPORTED},
        {"\"index_topk_freq\":2", "index_topk_freq 2", QD_EUNSUPPORTED},
        {"\"index_topk_pattern\":\"FFS\"", "index_topk_pattern", QD_EUNSUPPORTED},
        {"\"layer_types\":[\"full_attention\",\"indexed_attention\",\"indexed_attention\"]", "indexed_attention",
         QD_EUNSUPPORTED},
        {"\"mlp_layer_types\":[\"dense\",\"sparse\",\"dense\"]", "dense layer 2 after a sparse one", QD_EUNSUPPORTED},
        {"\"mlp_layer_types\":[\"dense\",\"moe\",\"sparse\"]", "mlp_layer_types[1]", QD_EFORMAT},
        {"\"mlp_layer_types\":[\"dense\",\"sparse\"]", "mlp_layer_types must list", QD_EFORMAT},
        {"\"index_head_dim\":32", "index_head_dim 32", QD_EFORMAT},
        {"\"index_topk\":0", "index_topk 0", QD_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qd_model_config c;
        qd_err err;
        CHECK_INT(parse(cases[i].body, &c, &err), cases[i].code);
        CHECK_CONTAINS(err.msg, cases[i].needle);
    }
}

int main(void)
{
    TEST_RUN(test_defaults);
    TEST_RUN(test_refused);
    return test_finish();
}
