/* Fuzzes tokenizer.json loading on every test run, without libFuzzer: 100000 files made by
 * mutating the seeds in tests/fuzz/corpus/tokenizer (byte-level GPT-2 style, SentencePiece
 * style with a normaliser or Metaspace, a Llama-3 style Split regex, a tiny one; the real
 * stories260K and tiny-llama-c4 tokenizers from ../shared/data when present) with a
 * fixed-seed RNG, through the libFuzzer target's harness (tests/fuzz/tokenizer_fuzz_one.c),
 * which also encodes and decodes with every accepted tokenizer. The mutator knows the
 * tokenizer.json keys and type names. QUANTD_FUZZ_ITERS overrides the count. */
#include "test_util.h"

#include "fuzz/fuzz_mutate.h"
#include "fuzz/tokenizer_fuzz_one.h"
#include "quant/core/log.h"

static const char *const TOKENS[] = {
    "\"model\":", "\"type\":", "\"BPE\"", "\"WordPiece\"", "\"vocab\":", "\"merges\":", "\"added_tokens\":", "\"id\":",
    "\"content\":", "\"special\":", "\"unk_token\":", "\"byte_fallback\":", "\"fuse_unk\":", "\"ignore_merges\":",
    "\"continuing_subword_prefix\":", "\"end_of_word_suffix\":", "\"normalizer\":", "\"normalizers\":",
    "\"pre_tokenizer\":", "\"pretokenizers\":", "\"decoder\":", "\"post_processor\":", "\"processors\":",
    "\"single\":", "\"SpecialToken\":", "\"Sequence\"", "\"Prepend\"", "\"prepend\":", "\"Replace\"", "\"pattern\":",
    "\"String\":", "\"Regex\":", "\"ByteLevel\"", "\"NFC\"", "\"NFKC\"", "\"Split\"", "\"behavior\":", "\"Isolated\"",
    "\"invert\":", "\"Metaspace\"", "\"replacement\":", "\"prepend_scheme\":", "\"always\"", "\"first\"", "\"never\"",
    "\"split\":", "\"add_prefix_space\":", "\"use_regex\":", "\"TemplateProcessing\"", "\"RobertaProcessing\"",
    "\"ByteFallback\"", "\"Fuse\"", "\"Strip\"", "\"<s>\"", "\"<unk>\"", "\"<0x41>\"", "\"<0xFF>\"", "\"\xe2\x96\x81\"",
    "\"\xc4\xa0\"", "\"a b\"", "[\"a\",\"b\"]", "\"(a|b)*c\"", "\"(?<!x)\\\\p{L}+\"", "\"[\"", "\"(a+)+$\"", "\"\\\\\"",
    "\"\"", "0", "1", "-1", "255", "256", "65536", "2147483646", "2147483647", "1e10", "0.5", "true", "false",
    "null", "{}", "[]", "\\u0000", "\\ud800", "\xc3\xa9", "\xff", ",", ":", "{", "}", "[", "]", "\"",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void test_tokenizer_fuzz(void)
{
    qd_log_set_level(QD_LOG_ERROR);   /* mutants with NFC normalisers each log a warning */
    fz_seeds seeds = {0};
    int n = fz_seeds_load_corpus(&seeds, "tokenizer");
    CHECK(n >= 5);
    if (n < 1) return;
    const char *sd = test_shared_data();
    if (sd) {
        fz_seeds_add_file(&seeds, test_path(sd, "models/stories260K/tokenizer.json"));
        fz_seeds_add_file(&seeds, test_path(sd, "models/tiny-llama-c4/tokenizer.json"));
    }
    int n_acc = 0;
    for (int i = 0; i < seeds.n; i++) {
        int acc = 0;
        CHECK_OK(tokenizer_fuzz_one(seeds.s[i].data, seeds.s[i].len, &acc));
        n_acc += acc;
    }
    CHECK(n_acc >= 5);
    fz_stats st = fz_run("tokenizer", &seeds, tokenizer_fuzz_one, 100000, 20250119, TOKENS, N_TOKENS, 32768, 4);
    CHECK_INT(st.broken, 0);
    CHECK(st.accepted > st.iters / 20);
    CHECK(st.refused > st.iters / 10);
    fz_seeds_free(&seeds);
}

int main(void)
{
    TEST_RUN(test_tokenizer_fuzz);
    return test_finish();
}
