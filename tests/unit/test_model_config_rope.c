/* config.json's RoPE and attention keys: both spellings read alike, what quantd does not
 * implement refused by name, and the frequencies of the scaling types at their edges
 * (dynamic below its length is plain RoPE; llama3 keeps, smooths and divides by band). The
 * forward parity itself is test_model_families. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"
#include "quant/model/config.h"
#include "quant/model/rope.h"

#define BASE "\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":64,\"num_hidden_layers\":2," \
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"max_position_embeddings\":64"

static int parse(const char *arch, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{" BASE "%s%s}", arch, extra[0] ? "," : "", extra);
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

/* The same with hidden_size and num_hidden_layers of one's own. */
static int parse_sized(const char *arch, int hidden, int layers, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    snprintf(json, sizeof json, "{\"architectures\":[\"%s\"],\"hidden_size\":%d,\"intermediate_size\":64,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,"
             "\"max_position_embeddings\":64,%s}", arch, hidden, layers, extra);
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

static void test_refusals(void)
{
    refused("LlamaForCausalLM", "\"rope_parameters\":{\"rope_type\":\"made-up\",\"rope_theta\":10000}", "made-up");
    refused("LlamaForCausalLM", "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2,\"beta_fast\":4}",
            "rope_parameters.beta_fast");
    refused("LlamaForCausalLM", "\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2,\"low_freq_factor\":1}",
            "rope_scaling.low_freq_factor");
    refused("LlamaForCausalLM", "\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,1,1],"
            "\"long_factor\":[1,1,1,1,1,1,1,1]}", "longrope");
    refused("LlamaForCausalLM", "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6}}", "per layer type");
    refused("LlamaForCausalLM", "\"attn_logit_softcapping\":50", "attn_logit_softcapping");
    refused("MistralForCausalLM", "\"final_logit_softcapping\":30", "final_logit_softcapping");
    refused("Qwen2ForCausalLM", "\"layer_types\":[\"full_attention\",\"sliding_attention\"]", "sliding_attention");
    refused("Qwen2ForCausalLM", "\"use_sliding_window\":true,\"sliding_window\":16", "use_sliding_window");
    refused("Gemma3ForConditionalGeneration", "", "text_config");   /* the text keys are read from text_config */
    refused("Gemma2ForCausalLM", "\"hidden_activation\":\"gelu\"", "hidden_activation \"gelu\"");
    refused("Gemma3ForCausalLM", "\"use_bidirectional_attention\":true", "use_bidirectional_attention");
    refused("Gemma3ForCausalLM", "\"layer_types\":[\"sliding_attention\",\"chunked_attention\"]", "chunked_attention");
    refused("Gemma3ForCausalLM", "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6},\"chunked\":{}}", "chunked");
    refused("LlamaForCausalLM", "\"rope_local_base_freq\":10000", "rope_local_base_freq");
    refused("Gemma2ForCausalLM", "\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,1,1],"
            "\"long_factor\":[1,1,1,1,1,1,1,1]}", "Phi3ForCausalLM only");
    qd_model_config c;
    qd_err err;
    CHECK_INT(parse("LlamaForCausalLM", "\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8}", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "low_freq_factor");
}

static void test_spellings(void)
{
    qd_model_config a, b;
    qd_err err;
    CHECK_OK(parse("LlamaForCausalLM", "\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                   "\"high_freq_factor\":4,\"original_max_position_embeddings\":32,\"rope_theta\":500000}", &a, &err));
    CHECK_OK(parse("LlamaForCausalLM", "\"rope_theta\":500000,\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8,"
                   "\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":32}", &b, &err));
    CHECK_NEAR(a.rope_theta, 500000.0, 0);
    CHECK_NEAR(b.rope_theta, 500000.0, 0);
    CHECK_INT(a.rope.type, QD_ROPE_LLAMA3);
    CHECK_INT(b.rope.type, QD_ROPE_LLAMA3);
    qd_rope_freqs fa, fb;
    CHECK_OK(qd_rope_freqs_compute(&a, 0, 16, &fa, &err));
    CHECK_OK(qd_rope_freqs_compute(&b, 0, 16, &fb, &err));
    CHECK(!memcmp(fa.inv_freq, fb.inv_freq, sizeof fa.inv_freq));
    /* llama3 bands: the fastest frequency is kept, the slowest divided by the factor. */
    qd_model_config p = a;
    p.rope.type = QD_ROPE_DEFAULT;
    qd_rope_freqs fp;
    CHECK_OK(qd_rope_freqs_compute(&p, 0, 16, &fp, &err));
    int half = (int)(fa.rot_dim / 2);
    CHECK_NEAR(fa.inv_freq[0], fp.inv_freq[0], 0);
    CHECK_NEAR(fa.inv_freq[half - 1], fp.inv_freq[half - 1] / 8.0f, 1e-12);
    /* Mistral's window. */
    CHECK_OK(parse("MistralForCausalLM", "\"sliding_window\":16", &a, &err));
    CHECK_INT(a.sliding_window, 16);
    CHECK_OK(parse("MistralForCausalLM", "\"sliding_window\":null", &a, &err));
    CHECK_INT(a.sliding_window, 0);
}

static void test_dynamic(void)
{
    qd_model_config c, p;
    qd_err err;
    CHECK_OK(parse("LlamaForCausalLM", "\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}", &c, &err));
    p = c;
    p.rope.type = p.rope_local.type = QD_ROPE_DEFAULT;
    qd_rope_freqs fd, fp;
    CHECK_OK(qd_rope_freqs_compute(&p, 0, 64, &fp, &err));
    CHECK_OK(qd_rope_freqs_compute(&c, 0, 64, &fd, &err));          /* up to max_position_embeddings: plain */
    CHECK(!memcmp(fd.inv_freq, fp.inv_freq, sizeof fd.inv_freq));
    CHECK_OK(qd_rope_freqs_compute(&c, 0, 100, &fd, &err));         /* past it: the base grows */
    CHECK(fd.inv_freq[1] < fp.inv_freq[1]);
    CHECK_INT(qd_rope_max_seq(&c), 128);
    CHECK_INT(qd_rope_max_seq(&p), 64);
}

/* Gemma: transformers' defaults for absent keys, null turning a soft-cap off, the layer
 * pattern of older files, and the per-layer-type RoPE of transformers 5 and its older
 * spelling (rope_local_base_freq + rope_scaling on the global layers only). */
static void test_gemma(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse_sized("Gemma2ForCausalLM", 3584, 2, "\"torch_dtype\":\"bfloat16\"", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_GEMMA);
    CHECK_NEAR(c.attn_softcap, 50.0, 0);
    CHECK_NEAR(c.final_softcap, 30.0, 0);
    CHECK_NEAR(c.query_pre_attn_scalar, 256.0, 0);
    CHECK_NEAR(c.norm_offset, 1.0, 0);
    CHECK_NEAR(c.embed_scale, 59.75, 0);           /* sqrt(3584) = 59.87, rounded to bf16 */
    CHECK_INT(c.tie_word_embeddings, 1);
    CHECK_INT(c.sliding_window, 4096);
    CHECK_INT(c.layer_sliding[0], 1);              /* Gemma 2: even layers slide */
    CHECK_INT(c.layer_sliding[1], 0);
    CHECK_OK(parse_sized("Gemma2ForCausalLM", 3584, 2, "\"attn_logit_softcapping\":null,\"final_logit_softcapping\":null,"
                         "\"dtype\":\"float32\"", &c, &err));
    CHECK_NEAR(c.attn_softcap, 0.0, 0);
    CHECK_NEAR(c.final_softcap, 0.0, 0);
    CHECK_NEAR(c.embed_scale, sqrtf(3584.0f), 0);
    /* An explicit null window is none (transformers' None), not the class's 4096. */
    CHECK_OK(parse("Gemma2ForCausalLM", "\"sliding_window\":null", &c, &err));
    CHECK_INT(c.sliding_window, 0);
    /* Gemma 3, older file: 6-layer pattern, local base, linear scaling on global layers. */
    CHECK_OK(parse_sized("Gemma3ForCausalLM", 64, 12, "\"rope_theta\":1e6,\"rope_local_base_freq\":10000,"
                   "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":8}", &c, &err));
    CHECK_INT(c.qk_norm, 1);
    CHECK_NEAR(c.attn_softcap, 0.0, 0);
    for (int i = 0; i < 12; i++) CHECK_INT(c.layer_sliding[i], (i + 1) % 6 != 0);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK_INT(c.rope.type, QD_ROPE_LINEAR);
    CHECK_NEAR(c.rope_theta_local, 10000.0, 0);
    CHECK_INT(c.rope_local.type, QD_ROPE_DEFAULT);
    /* The same in transformers 5's spelling gives the same frequencies per layer type. */
    qd_model_config d;
    CHECK_OK(parse_sized("Gemma3ForCausalLM", 64, 12, "\"_sliding_window_pattern\":6,\"rope_parameters\":{"
                   "\"full_attention\":{\"rope_type\":\"linear\",\"factor\":8,\"rope_theta\":1e6},"
                   "\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000}}", &d, &err));
    CHECK(!memcmp(c.layer_sliding, d.layer_sliding, sizeof c.layer_sliding));
    for (int s = 0; s < 2; s++) {
        qd_rope_freqs fc, fd;
        CHECK_OK(qd_rope_freqs_compute(&c, s, 32, &fc, &err));
        CHECK_OK(qd_rope_freqs_compute(&d, s, 32, &fd, &err));
        CHECK(!memcmp(fc.inv_freq, fd.inv_freq, sizeof fc.inv_freq));
    }
    qd_rope_freqs fl, fg;
    CHECK_OK(qd_rope_freqs_compute(&d, 1, 32, &fl, &err));
    CHECK_OK(qd_rope_freqs_compute(&d, 0, 32, &fg, &err));
    CHECK(fl.inv_freq[1] > fg.inv_freq[1]);       /* the local base is smaller: faster */
    CHECK_NEAR(fg.inv_freq[0], 1.0 / 8.0, 1e-9);  /* linear: every frequency divided by 8 */
    /* layer_types must name every layer. */
    CHECK_INT(parse("Gemma3ForCausalLM", "\"layer_types\":[\"sliding_attention\"]", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "layer_types");
}

/* Mixture of experts: each family's defaults, both spellings of the expert count, and the
 * layouts and routing variants quantd does not run refused by name. */
static void test_moe(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("MixtralForCausalLM", "\"num_local_experts\":8,\"num_experts_per_tok\":2", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_MIXTRAL);
    CHECK_INT(c.n_experts, 8);
    CHECK_INT(c.moe_intermediate, 64);   /* Mixtral's experts are intermediate_size wide */
    CHECK_INT(c.norm_topk_prob, 1);
    CHECK_OK(parse("Qwen2MoeForCausalLM", "\"num_experts\":4,\"moe_intermediate_size\":32,"
                   "\"shared_expert_intermediate_size\":64", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_QWEN_MOE);
    CHECK_INT(c.n_experts, 4);
    CHECK_INT(c.top_k, 4);                /* Qwen2MoeConfig's default */
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_INT(c.qkv_bias, 1);
    CHECK_INT(c.shared_intermediate, 64);
    CHECK_OK(parse("Qwen3MoeForCausalLM", "\"num_local_experts\":16,\"num_experts_per_tok\":4,\"norm_topk_prob\":true",
                   &c, &err));
    CHECK_INT(c.n_experts, 16);
    CHECK_INT(c.qk_norm, 1);
    CHECK_INT(c.shared_intermediate, 0);
    refused("Qwen3MoeForCausalLM", "\"decoder_sparse_step\":2", "decoder_sparse_step");
    refused("Qwen2MoeForCausalLM", "\"mlp_only_layers\":[0]", "mlp_only_layers");
    refused("MixtralForCausalLM", "\"n_group\":8", "n_group");
    refused("DeepseekV2ForCausalLM", "", "num_key_value_heads");   /* MLA: one key per head */
    CHECK_INT(parse("MixtralForCausalLM", "\"num_local_experts\":513", &c, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "experts");
    CHECK_INT(parse("MixtralForCausalLM", "\"num_local_experts\":4,\"num_experts_per_tok\":5", &c, &err), QD_EFORMAT);
}

static void test_phi3(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse("Phi3ForCausalLM", "\"sliding_window\":2047,\"attention_bias\":true", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_PHI3);
    CHECK_INT(c.sliding_window, 2047);
    CHECK_INT(c.layer_sliding[0] && c.layer_sliding[1], 1);
    CHECK_INT(c.qkv_bias, 0);
    CHECK_NEAR(c.norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(c.norm_offset, 0.0, 0);
}

/* DeepSeek-V3's own keys (with num_key_value_heads equal to the heads, as it must be). */
static int parse_dsv(const char *arch, const char *extra, qd_model_config *c, qd_err *err)
{
    char json[4096];
    /* extra first: cJSON finds the first of two equal keys. */
    snprintf(json, sizeof json, "{\"architectures\":[\"%s\"],%s%s\"hidden_size\":64,"
             "\"intermediate_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":4,\"vocab_size\":256,"
             "\"max_position_embeddings\":64,\"n_routed_experts\":8,\"n_group\":4,\"topk_group\":2,"
             "\"num_experts_per_tok\":2}", arch, extra, extra[0] ? "," : "");
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static int parse_ds(const char *extra, qd_model_config *c, qd_err *err)
{
    return parse_dsv("DeepseekV3ForCausalLM", extra, c, err);
}

static void test_deepseek(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse_ds("", &c, &err));
    CHECK_INT(c.layout, QD_LAYOUT_DEEPSEEK);
    CHECK_INT(c.moe_scoring, QD_MOE_SIGMOID_GROUPED);
    CHECK_INT(c.first_dense, 3);               /* DeepseekV3Config's defaults */
    CHECK_INT(c.q_lora_rank, 1536);
    CHECK_INT(c.kv_lora_rank, 512);
    CHECK_INT(c.head_dim, 64);                 /* qk_rope_head_dim, whatever config.json says */
    CHECK_INT(c.n_kv_heads, 4);
    CHECK_INT(c.shared_intermediate, 2048);    /* n_shared_experts * moe_intermediate_size */
    CHECK_INT(c.rope_interleave, 1);
    CHECK_NEAR(c.routed_scale, 2.5, 0);
    CHECK_OK(parse_ds("\"q_lora_rank\":null,\"n_shared_experts\":2,\"moe_intermediate_size\":16,\"head_dim\":8,"
                      "\"qk_rope_head_dim\":16,\"rope_interleave\":false", &c, &err));
    CHECK_INT(c.q_lora_rank, 0);
    CHECK_INT(c.shared_intermediate, 32);
    CHECK_INT(c.head_dim, 16);
    CHECK_INT(c.rope_interleave, 0);
    CHECK_INT(parse_ds("\"moe_layer_freq\":2", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "moe_layer_freq");
    CHECK_INT(parse_ds("\"scoring_func\":\"softmax\"", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "scoring_func");
    CHECK_INT(parse_ds("\"topk_method\":\"greedy\"", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "topk_method");
    CHECK_INT(parse_ds("\"num_key_value_heads\":2", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "num_key_value_heads");
    CHECK_INT(parse_ds("\"attention_bias\":true", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "attention_bias");
    CHECK_INT(parse_ds("\"n_group\":3", &c, &err), QD_EFORMAT);      /* 8 experts do not split in 3 */
    CHECK_CONTAINS(err.msg, "n_group");
    CHECK_INT(parse_ds("\"n_group\":8,\"topk_group\":1", &c, &err), QD_EFORMAT);   /* groups of 1 */
    CHECK_INT(parse_ds("\"topk_group\":5", &c, &err), QD_EFORMAT);
    CHECK_INT(parse_ds("\"qk_rope_head_dim\":7", &c, &err), QD_EFORMAT);
    /* DeepSeek-V2: softmax routing, greedy by default, group_limited_greedy with groups. */
    CHECK_OK(parse_dsv("DeepseekV2ForCausalLM", "\"q_lora_rank\":null", &c, &err));
    CHECK_INT(c.moe_scoring, QD_MOE_SOFTMAX);
    CHECK_INT(c.q_lora_rank, 0);
    CHECK_INT(c.first_dense, 0);               /* DeepseekV2Config's defaults */
    CHECK_INT(c.shared_intermediate, 2 * 1407);
    CHECK_INT(c.norm_topk_prob, 0);
    CHECK_NEAR(c.routed_scale, 1.0, 0);
    CHECK_OK(parse_dsv("DeepseekV2ForCausalLM", "\"topk_method\":\"group_limited_greedy\",\"n_group\":8,\"topk_group\":2",
                       &c, &err));   /* groups of 1 are fine: V2 scores a group by its best */
    CHECK_INT(c.moe_scoring, QD_MOE_SOFTMAX_GROUPED);
    CHECK_INT(parse_dsv("DeepseekV2ForCausalLM", "\"topk_method\":\"noaux_tc\"", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "topk_method");
    CHECK_INT(parse_dsv("DeepseekV2ForCausalLM", "\"norm_topk_prob\":true", &c, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "norm_topk_prob");
    CHECK_INT(parse_dsv("DeepseekV2ForCausalLM", "\"scoring_func\":\"sigmoid\"", &c, &err), QD_EUNSUPPORTED);
    CHECK_INT(parse_dsv("DeepseekV2ForCausalLM", "\"num_experts_per_tok\":null", &c, &err), QD_EFORMAT);
}

int main(void)
{
    TEST_RUN(test_refusals);
    TEST_RUN(test_spellings);
    TEST_RUN(test_dynamic);
    TEST_RUN(test_gemma);
    TEST_RUN(test_phi3);
    TEST_RUN(test_moe);
    TEST_RUN(test_deepseek);
    return test_finish();
}
