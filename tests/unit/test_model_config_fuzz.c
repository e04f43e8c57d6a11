/* Fuzzes the config.json parser on every test run, without libFuzzer: 100000 configs made
 * by mutating one seed per supported family (llama, mistral, qwen2, opt; plain, GPTQ- and
 * AWQ-quantized; tests/fuzz/corpus/model_config, plus the real configs in ../shared/data
 * when present) with a fixed-seed RNG, through the libFuzzer target's harness
 * (tests/fuzz/model_config_fuzz_one.c). The mutator knows the config keys and numbers at the
 * edges (0, negatives, odd head sizes, values past int64). QUANTD_FUZZ_ITERS overrides. */
#include "test_util.h"

#include "fuzz/fuzz_mutate.h"
#include "fuzz/model_config_fuzz_one.h"

static const char *const TOKENS[] = {
    "\"architectures\":", "\"model_type\":", "\"hidden_size\":", "\"intermediate_size\":", "\"ffn_dim\":",
    "\"num_hidden_layers\":", "\"num_attention_heads\":", "\"num_key_value_heads\":", "\"head_dim\":",
    "\"vocab_size\":", "\"max_position_embeddings\":", "\"rms_norm_eps\":", "\"rope_theta\":", "\"rope_scaling\":",
    "\"rope_type\":", "\"type\":", "\"tie_word_embeddings\":", "\"attention_bias\":", "\"mlp_bias\":", "\"hidden_act\":",
    "\"word_embed_proj_dim\":", "\"do_layer_norm_before\":", "\"enable_bias\":", "\"layer_norm_elementwise_affine\":",
    "\"_remove_final_layer_norm\":", "\"activation_function\":", "\"bos_token_id\":", "\"eos_token_id\":",
    "\"torch_dtype\":", "\"quantization_config\":", "\"quant_method\":", "\"bits\":", "\"group_size\":",
    "\"desc_act\":", "\"sym\":", "\"checkpoint_format\":", "\"version\":", "\"zero_point\":",
    "\"compressed-tensors\"", "\"config_groups\":", "\"weights\":", "\"num_bits\":", "\"symmetric\":",
    "\"strategy\":", "\"actorder\":", "\"quantization_status\":", "\"pack-quantized\"", "\"compressed\"",
    "\"channel\"", "\"group\"", "\"weight\"", "\"input_activations\":", "\"format\":",
    "[\"LlamaForCausalLM\"]", "[\"MistralForCausalLM\"]", "[\"Qwen2ForCausalLM\"]", "[\"OPTForCausalLM\"]",
    "[\"GPT2LMHeadModel\"]", "\"gptq\"", "\"awq\"", "\"gptq_v2\"", "\"gemm\"", "\"GEMV\"", "\"silu\"", "\"gelu\"",
    "\"relu\"", "\"default\"", "\"linear\"", "\"llama3\"", "\"float16\"", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
    "0", "1", "2", "3", "-1", "-2", "7", "1e-5", "0.0", "-1e-6", "1e38", "1e39", "1e300", "-1e300", "0.5",
    "2147483647", "2147483648", "-2147483649", "4294967296", "9223372036854775807", "9223372036854775808",
    "1e19", "-9.3e18", "18446744073709551616", "true", "false", "null", "{}", "[]", "\"\"", "\\u0000", "\xc3\xa9",
    ",", ":", "{", "}", "[", "]", "\"",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void test_model_config_fuzz(void)
{
    fz_seeds seeds = {0};
    int n = fz_seeds_load_corpus(&seeds, "model_config");
    CHECK(n >= 6);
    if (n < 1) return;
    const char *sd = test_shared_data();
    if (sd) {
        fz_seeds_add_file(&seeds, test_path(sd, "models/stories260K/config.json"));
        fz_seeds_add_file(&seeds, test_path(sd, "models/tiny-llama-c4/config.json"));
    }
    /* The seeds are configs the loader takes, plus regression inputs (regress_*) it refuses. */
    int n_acc = 0;
    for (int i = 0; i < seeds.n; i++) {
        int acc = 0;
        CHECK_OK(model_config_fuzz_one(seeds.s[i].data, seeds.s[i].len, &acc));
        n_acc += acc;
    }
    CHECK(n_acc >= 7);
    fz_stats st = fz_run("model_config", &seeds, model_config_fuzz_one, 100000, 20250117, TOKENS, N_TOKENS, 8192, 4);
    CHECK_INT(st.broken, 0);
    CHECK(st.accepted > st.iters / 20);
    CHECK(st.refused > st.iters / 10);
    fz_seeds_free(&seeds);
}

int main(void)
{
    TEST_RUN(test_model_config_fuzz);
    return test_finish();
}
