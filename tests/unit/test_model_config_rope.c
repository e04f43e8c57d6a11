/* config.json's RoPE and attention keys: both spellings read alike, what quantd does not
 * implement refused by name, and the frequencies of the scaling types at their edges
 * (dynamic below its length is plain RoPE; llama3 keeps, smooths and divides by band). The
 * forward parity itself is test_model_families. */
#include <stdio.h>

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
    refused("Gemma2ForCausalLM", "", "Qwen3ForCausalLM");   /* the list of supported ones */
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
    CHECK_OK(qd_rope_freqs_compute(&a, 16, &fa, &err));
    CHECK_OK(qd_rope_freqs_compute(&b, 16, &fb, &err));
    CHECK(!memcmp(fa.inv_freq, fb.inv_freq, sizeof fa.inv_freq));
    /* llama3 bands: the fastest frequency is kept, the slowest divided by the factor. */
    qd_model_config p = a;
    p.rope.type = QD_ROPE_DEFAULT;
    qd_rope_freqs fp;
    CHECK_OK(qd_rope_freqs_compute(&p, 16, &fp, &err));
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
    p.rope.type = QD_ROPE_DEFAULT;
    qd_rope_freqs fd, fp;
    CHECK_OK(qd_rope_freqs_compute(&p, 64, &fp, &err));
    CHECK_OK(qd_rope_freqs_compute(&c, 64, &fd, &err));          /* up to max_position_embeddings: plain */
    CHECK(!memcmp(fd.inv_freq, fp.inv_freq, sizeof fd.inv_freq));
    CHECK_OK(qd_rope_freqs_compute(&c, 100, &fd, &err));         /* past it: the base grows */
    CHECK(fd.inv_freq[1] < fp.inv_freq[1]);
    CHECK_INT(qd_rope_max_seq(&c), 128);
    CHECK_INT(qd_rope_max_seq(&p), 64);
}

int main(void)
{
    TEST_RUN(test_refusals);
    TEST_RUN(test_spellings);
    TEST_RUN(test_dynamic);
    return test_finish();
}
