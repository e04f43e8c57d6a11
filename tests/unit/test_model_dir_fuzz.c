/* Fuzzes everything a job points at in a model directory on every test run, without
 * libFuzzer (issue #33), through the libFuzzer target's harness
 * (tests/fuzz/model_dir_fuzz_one.c). The seeds are made here: two tiny checkpoints from
 * quant/model/testgen.h (a Llama in two F16 shards with an index and a tokenizer.json; an
 * OPT in one model.safetensors with vocab.json + merges.txt), each with its tokenizer,
 * generation and special-token files, written plainly, confined, and confined with the
 * component walk, at the exact size limits and one byte under; and then each of their files
 * in turn made a FIFO, a directory, a socket, a link to /dev/zero, a link out of the
 * directory (absolute and "../"), a link inside it, a dangling link and a sparse file past
 * every limit. Every seed must come out as the rules of quant/core/confine.h say, and the
 * plain ones must open; then 2500 mutants of them (QUANTD_FUZZ_ITERS overrides; each one
 * builds a directory and runs the job's reads twice) must too. The inputs in
 * tests/fuzz/corpus/model_dir (plain seeds for the libFuzzer target, written here with
 * QUANTD_FUZZ_SEED_DIR=dir, and regress_* inputs) run as seeds as well. */
#include "test_util.h"

#include <stdlib.h>

#include "fuzz/fuzz_mutate.h"
#include "fuzz/model_dir_fuzz_one.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/model/testgen.h"

static const char *const TOKENS[] = {
    " fifo", " dir", " sock", " zero", " out", " up", " in", " gone", " big", " file", "\n--- ", "\n--- config.json zero\n",
    "\n--- tokenizer_config.json fifo\n", "\n--- special_tokens_map.json dir\n", "\n--- generation_config.json out\n",
    "\n--- tokenizer.json big\n", "\n--- model.safetensors up\n", "\n--- model.safetensors.index.json in\n",
    "\n--- pytorch_model.bin\n", "\n--- vocab.json gone\n", "\n--- added_tokens.json sock\n",
    "qdir confine walk json=700 tok=300\n", " confine", " walk", " json=", " tok=", "config.json", "tokenizer.json",
    "model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    "\"model-00002-of-00002.safetensors\"", "\"../x/config.json\"", "\"/dev/zero\"", "\"weight_map\":", "\"metadata\":",
    "\"architectures\":", "\"hidden_size\":", "\"bos_token\":", "\"add_bos_token\":", "\"eos_token\":", "\"<s>\"",
    "\"model.embed_tokens.weight\"", "true", "false", "null", "0", "1", "-1", "16", "1e9", "{}", "[]", "\"\"", ",", ":",
    "{", "}", "\"",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static const char TOKENIZER_JSON[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3}, \"merges\": [\"a b\"], "
    "\"unk_token\": \"<unk>\"}, \"added_tokens\": [{\"id\": 4, \"content\": \"<s>\", \"special\": true}]}";
static const char TOKENIZER_CONFIG[] = "{\"bos_token\": \"<s>\", \"add_bos_token\": true, \"model_max_length\": 32}";
static const char SPECIAL_TOKENS[] = "{\"bos_token\": \"<s>\", \"unk_token\": \"<unk>\"}";
static const char GENERATION_CONFIG[] = "{\"bos_token_id\": 4, \"eos_token_id\": 4, \"max_length\": 32}";
static const char VOCAB_JSON[] = "{\"a\": 0, \"b\": 1, \"ab\": 2, \"<s>\": 3}";
static const char MERGES_TXT[] = "#version: 0.2\na b\n";
static const char OPT_TOKENIZER_CONFIG[] = "{\"bos_token\": \"<s>\", \"add_prefix_space\": false}";

static const char *const KINDS[] = {"fifo", "dir", "sock", "zero", "out", "up", "in", "gone", "big"};
#define N_KINDS (sizeof KINDS / sizeof KINDS[0])

#define MAX_SEED_FILES 12

typedef struct seed_dir {
    model_dir_fuzz_file f[MAX_SEED_FILES];
    char *owned[MAX_SEED_FILES];
    size_t n;
} seed_dir;

static model_dir_fuzz_stats g_stats;   /* summed over the run, for the coverage checks */

static int one(const uint8_t *data, size_t size, int *accepted)
{
    return model_dir_fuzz_run(data, size, accepted, &g_stats);
}

static void add_text(seed_dir *sd, const char *name, const char *text)
{
    sd->f[sd->n++] = (model_dir_fuzz_file){name, NULL, text, strlen(text)};
}

/* Adds the files testgen wrote into dir (config, weights, index). */
static void add_generated(seed_dir *sd, const char *dir)
{
    static const char *const names[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *b = NULL;
        size_t len = 0;
        qd_err err = {0};
        if (qd_fs_read_file(test_path(dir, names[i]), &b, &len, &err)) continue;
        sd->owned[sd->n] = b;
        sd->f[sd->n++] = (model_dir_fuzz_file){names[i], NULL, b, len};
    }
}

static void seed_dir_free(seed_dir *sd)
{
    for (size_t i = 0; i < sd->n; i++) free(sd->owned[i]);
}

static size_t file_len(const seed_dir *sd, const char *name)
{
    for (size_t i = 0; i < sd->n; i++)
        if (!strcmp(sd->f[i].name, name)) return sd->f[i].len;
    return 0;
}

/* Packs sd under header into a seed; returns 0 when a file's bytes could not be framed. */
static int add_seed(fz_seeds *ss, const char *header, const seed_dir *sd, const char *dump, const char *dump_name)
{
    uint8_t *b = NULL;
    size_t len = 0;
    if (model_dir_fuzz_pack(header, sd->f, sd->n, &b, &len)) return 0;
    fz_seeds_add(ss, b, len);
    if (dump) {
        FILE *f = fopen(test_path(dump, dump_name), "wb");
        if (f) {
            fwrite(b, 1, len, f);
            fclose(f);
        }
    }
    free(b);
    return 1;
}

/* The plain seeds of sd (under four headers), then every file of it as every other kind.
 * Returns how many plain seeds were added: they must all open. */
static int add_variants(fz_seeds *ss, seed_dir *sd, const char *tag, const char *dump)
{
    char hdr[128], name[128];
    static const char *const plain[] = {"qdir", "qdir confine", "qdir confine walk"};
    static const char *const plain_tag[] = {"plain", "confined", "walked"};
    int n_plain = 0;
    for (size_t h = 0; h < 3; h++) {
        snprintf(name, sizeof name, "%s_%s.qdir", tag, plain_tag[h]);
        n_plain += add_seed(ss, plain[h], sd, dump, name);
    }
    /* The limits at the largest JSON and tokenizer file: allowed, to the byte. */
    size_t json_max = 0, tok_max = 0;
    for (size_t i = 0; i < sd->n; i++) {
        const char *nm = sd->f[i].name;
        int tok = !strcmp(nm, "tokenizer.json") || !strcmp(nm, "vocab.json") || !strcmp(nm, "merges.txt");
        if (strstr(nm, ".safetensors") && !strstr(nm, ".json")) continue;
        if (tok && sd->f[i].len > tok_max) tok_max = sd->f[i].len;
        if (!tok && sd->f[i].len > json_max) json_max = sd->f[i].len;
    }
    snprintf(hdr, sizeof hdr, "qdir confine json=%zu tok=%zu", json_max, tok_max);
    snprintf(name, sizeof name, "%s_limits.qdir", tag);
    n_plain += add_seed(ss, hdr, sd, dump, name);
    /* One byte under: the largest files are refused by size. */
    snprintf(hdr, sizeof hdr, "qdir json=%zu tok=%zu", json_max - 1, tok_max - 1);
    add_seed(ss, hdr, sd, NULL, NULL);
    snprintf(hdr, sizeof hdr, "qdir json=%zu", file_len(sd, "config.json") - 1);
    add_seed(ss, hdr, sd, NULL, NULL);
    for (size_t i = 0; i < sd->n; i++)
        for (size_t k = 0; k < N_KINDS; k++) {
            sd->f[i].kind = KINDS[k];
            add_seed(ss, plain[(i + k) % 3], sd, NULL, NULL);
            if (!strcmp(KINDS[k], "out") || !strcmp(KINDS[k], "zero"))   /* outside: refused only when confined */
                add_seed(ss, plain[(i + k + 1) % 3], sd, NULL, NULL);
            sd->f[i].kind = NULL;
        }
    return n_plain;
}

static void gen(const char *dir, qd_arch_family fam, int shards)
{
    qd_testgen_opts o = qd_testgen_defaults(fam);
    o.hidden = 16;
    o.intermediate = 32;
    o.n_layers = 1;
    o.n_heads = 2;
    o.n_kv_heads = fam == QD_ARCH_OPT ? 2 : 1;
    o.vocab = 32;
    o.max_pos = 32;
    o.dtype = QD_DTYPE_F16;
    o.n_shards = shards;
    qd_err err = {0};
    CHECK_OK(qd_testgen_write(dir, &o, &err));
}

static void test_model_dir_fuzz(void)
{
    qd_log_set_level(QD_LOG_ERROR);
    const char *dump = getenv("QUANTD_FUZZ_SEED_DIR");
    fz_seeds seeds = {0};

    const char *llama = test_fresh_dir("llama");
    gen(llama, QD_ARCH_LLAMA, 2);
    seed_dir a = {0};
    add_generated(&a, llama);
    CHECK_INT(a.n, 4);   /* config, index, two shards */
    add_text(&a, "tokenizer.json", TOKENIZER_JSON);
    add_text(&a, "tokenizer_config.json", TOKENIZER_CONFIG);
    add_text(&a, "special_tokens_map.json", SPECIAL_TOKENS);
    add_text(&a, "generation_config.json", GENERATION_CONFIG);
    int n_plain = add_variants(&seeds, &a, "llama_sharded", dump);

    const char *opt = test_fresh_dir("opt");
    gen(opt, QD_ARCH_OPT, 1);
    seed_dir b = {0};
    int b0 = seeds.n;
    add_generated(&b, opt);
    CHECK_INT(b.n, 2);   /* config, model.safetensors */
    add_text(&b, "vocab.json", VOCAB_JSON);
    add_text(&b, "merges.txt", MERGES_TXT);
    add_text(&b, "tokenizer_config.json", OPT_TOKENIZER_CONFIG);
    add_text(&b, "generation_config.json", GENERATION_CONFIG);
    n_plain += add_variants(&seeds, &b, "opt_single", dump);
    CHECK_INT(n_plain, 8);

    /* The plain seeds come first and all open; the rest must merely keep the rules. */
    int n_gen = seeds.n;
    fz_seeds_load_corpus(&seeds, "model_dir");
    for (int i = 0; i < seeds.n; i++) {
        int acc = 0;
        CHECK_OK(one(seeds.s[i].data, seeds.s[i].len, &acc));
        if ((i < 4 || (i >= b0 && i < b0 + 4)) && !acc) TEST_FAIL_("plain seed %d did not open", i);
    }
    printf("model_dir seeds: %d (%d generated); refused by type %ld, size %ld, outside %ld, link %ld, missing %ld\n",
           seeds.n, n_gen, g_stats.refused_type, g_stats.refused_size, g_stats.refused_outside, g_stats.refused_link,
           g_stats.refused_missing);
    CHECK(g_stats.refused_type > 0 && g_stats.refused_size > 0 && g_stats.refused_outside > 0 &&
          g_stats.refused_link > 0 && g_stats.refused_missing > 0);

    memset(&g_stats, 0, sizeof g_stats);
    fz_stats st = fz_run("model_dir", &seeds, one, 2500, 20250233, TOKENS, N_TOKENS, 32768, 3);
    CHECK_INT(st.broken, 0);
    printf("model_dir mutants: %ld confined (%ld walked); opened %ld, tokenizer %ld, copied %ld, copy refused %ld, "
           "fingerprinted %ld; refused by type %ld, size %ld, outside %ld, link %ld, missing %ld\n",
           g_stats.confined, g_stats.walked, g_stats.model_opened, g_stats.tok_loaded, g_stats.copied,
           g_stats.copy_refused, g_stats.fingerprinted, g_stats.refused_type, g_stats.refused_size,
           g_stats.refused_outside, g_stats.refused_link, g_stats.refused_missing);
    /* Enough directories got through to the end, and (in a run of some length) every path the
     * rules cover was taken. */
    CHECK(st.accepted > st.iters / 20);
    CHECK(st.refused > st.iters / 10);
    if (st.iters >= 500) {
        CHECK(g_stats.confined > 0 && g_stats.walked > 0 && g_stats.tok_loaded > 0 && g_stats.copied > 0 &&
              g_stats.copy_refused > 0 && g_stats.fingerprinted > 0);
        CHECK(g_stats.refused_type > 0 && g_stats.refused_size > 0 && g_stats.refused_outside > 0 &&
              g_stats.refused_link > 0);
    }
    fz_seeds_free(&seeds);
    seed_dir_free(&a);
    seed_dir_free(&b);
}

int main(void)
{
    TEST_RUN(test_model_dir_fuzz);
    return test_finish();
}
