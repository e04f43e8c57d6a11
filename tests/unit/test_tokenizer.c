/* Tokenizer unit tests on tiny hand-made tokenizer.json files written by the test: byte-level
 * regex pre-tokenisation and merges, merge priority and tie-breaking, SentencePiece-style
 * '▁' normalisation with byte fallback, special tokens split out before BPE, BOS control,
 * decode round trips, malformed-file errors, token files, and the O(n log n) merge on a
 * long unsplit input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "test_util.h"
#include "quant/core/clock.h"
#include "quant/model/token_file.h"
#include "quant/model/tokenizer/tokenizer.h"

#define MS "\xE2\x96\x81"   /* U+2581 */

/* GPT-2 bytes_to_unicode, written independently of the library's copy. */
static uint32_t b2u(int b)
{
    static uint32_t table[256];
    static int init;
    if (!init) {
        int n = 0;
        for (int i = 0; i < 256; i++) {
            int keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
            table[i] = keep ? (uint32_t)i : (uint32_t)(256 + n++);
        }
        init = 1;
    }
    return table[b];
}

static void utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; o[1] = 0; }
    else if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); o[2] = 0; }
    else { o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F)); o[3] = 0; }
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fputs(s, f);
    fclose(f);
}

static const char *mkdir_in_tmp(const char *name)
{
    const char *d = test_path(test_tmpdir(), name);
    static char keep[8][1024];
    static int slot;
    char *k = keep[slot++ % 8];
    snprintf(k, 1024, "%s", d);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", k);
    if (system(cmd) != 0) exit(1);
    return k;
}

/* A byte-level tokenizer: the 256 byte characters, a few merged pieces and one special. */
static const char *make_bytelevel(const char *name, const char *merges_json, const char *extra_config)
{
    const char *dir = mkdir_in_tmp(name);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    int id = 0;
    for (int b = 0; b < 256; b++) {
        char u[8];
        utf8(b2u(b), u);
        cJSON_AddNumberToObject(vocab, u, id++);
    }
    const char *extra[] = {"or", "ld", "orld", "\xC4\xA0w", "\xC4\xA0world", "He", "Hel", "Hell", "Hello",
                           "ab", "bc", "it", "'s", "\xC4\xA0" "1", "12", "<|endoftext|>"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) cJSON_AddNumberToObject(vocab, extra[i], id++);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", cJSON_Parse(merges_json));
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens",
                          cJSON_Parse("[{\"id\": 271, \"content\": \"<|endoftext|>\", \"special\": true}]"));
    cJSON_AddItemToObject(root, "pre_tokenizer",
                          cJSON_Parse("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *s = cJSON_Print(root);
    write_text(test_path(dir, "tokenizer.json"), s);
    free(s);
    cJSON_Delete(root);
    if (extra_config) write_text(test_path(dir, "tokenizer_config.json"), extra_config);
    return dir;
}

static const char *bl_merges =
    "[\"o r\", \"l d\", \"or ld\", \"\xC4\xA0 w\", \"\xC4\xA0w orld\", \"H e\", \"He l\", \"Hel l\", \"Hell o\","
    " \"a b\", \"b c\", \"i t\", \"' s\", [\"\xC4\xA0\", \"1\"], \"1 2\"]";

static int encode(const qd_tokenizer *t, const char *s, int bos, int32_t **ids, size_t *n)
{
    qd_err err = {0};
    int rc = qd_tokenizer_encode(t, s, strlen(s), bos, ids, n, &err);
    if (rc) fprintf(stderr, "encode: %s\n", err.msg);
    return rc;
}

static void check_ids(const int32_t *ids, size_t n, const int32_t *want, size_t nw)
{
    CHECK_INT(n, nw);
    for (size_t i = 0; i < n && i < nw; i++)
        if (ids[i] != want[i]) { CHECK_INT(ids[i], want[i]); fprintf(stderr, "  at index %zu\n", i); break; }
}

static void check_roundtrip(const qd_tokenizer *t, const char *s)
{
    int32_t *ids;
    size_t n, len;
    char *back = NULL;
    qd_err err = {0};
    CHECK_OK(encode(t, s, QD_TOK_BOS_OFF, &ids, &n));
    CHECK_OK(qd_tokenizer_decode(t, ids, n, QD_TOK_DECODE_SKIP_SPECIAL, &back, &len, &err));
    CHECK_STR(back, s);
    CHECK_INT(len, strlen(s));
    free(back);
    free(ids);
}

static void test_bytelevel(void)
{
    const char *dir = make_bytelevel("bl", bl_merges, NULL);
    qd_tokenizer *t = NULL;
    qd_err err = {0};
    CHECK_OK(qd_tokenizer_load(dir, &t, &err));
    if (!t) { fprintf(stderr, "%s\n", err.msg); return; }
    CHECK_STR(qd_tokenizer_kind(t), "bpe-bytelevel");
    CHECK_INT(qd_tokenizer_vocab_size(t), 272);
    CHECK_INT(qd_tokenizer_adds_bos(t), 0);
    int32_t *ids;
    size_t n;
    /* "Hello world" -> pre-tokens "Hello", " world" -> 264 ("Hello"), 260 ("Ġworld"). */
    CHECK_OK(encode(t, "Hello world", QD_TOK_BOS_DEFAULT, &ids, &n));
    check_ids(ids, n, (int32_t[]){264, 260}, 2);
    free(ids);
    /* The regex gives "it", "'s", " 12"; in " 12" the rank-13 "Ġ 1" beats the rank-14
     * "1 2", leaving "Ġ1" + "2". Byte ids equal the byte values in this vocabulary. */
    CHECK_OK(encode(t, "it's 12", QD_TOK_BOS_OFF, &ids, &n));
    check_ids(ids, n, (int32_t[]){267, 268, 269, '2'}, 4);
    free(ids);
    /* Unicode letters stay in one pre-token: "é" is 2 bytes -> 2 byte-level ids. */
    CHECK_OK(encode(t, "\xC3\xA9", QD_TOK_BOS_OFF, &ids, &n));
    check_ids(ids, n, (int32_t[]){0xC3, 0xA9}, 2);
    free(ids);
    check_roundtrip(t, "Hello world, it's 12 \xC3\xA9t\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C\n\n\t \x01\x7F end");
    qd_tokenizer_free(t);
}

static void test_merge_priority(void)
{
    /* "a b" ranked before "b c": "abc" -> "ab" + "c"; reversed ranks -> "a" + "bc". */
    const char *d1 = make_bytelevel("prio1", bl_merges, NULL);
    const char *d2 = make_bytelevel("prio2", "[\"b c\", \"a b\"]", NULL);
    qd_tokenizer *t1 = NULL, *t2 = NULL;
    CHECK_OK(qd_tokenizer_load(d1, &t1, NULL));
    CHECK_OK(qd_tokenizer_load(d2, &t2, NULL));
    if (!t1 || !t2) { qd_tokenizer_free(t1); qd_tokenizer_free(t2); return; }
    int32_t *ids;
    size_t n;
    CHECK_OK(encode(t1, "abc", QD_TOK_BOS_OFF, &ids, &n));
    check_ids(ids, n, (int32_t[]){265, 'c'}, 2);
    free(ids);
    CHECK_OK(encode(t2, "abc", QD_TOK_BOS_OFF, &ids, &n));
    check_ids(ids, n, (int32_t[]){'a', 266}, 2);
    free(ids);
    qd_tokenizer_free(t1);
    qd_tokenizer_free(t2);
}

static void test_special_and_bos(void)
{
    const char *dir = make_bytelevel("sp", bl_merges,
                                     "{\"add_bos_token\": true, \"bos_token\": {\"content\": \"<|endoftext|>\"}}");
    qd_tokenizer *t = NULL;
    CHECK_OK(qd_tokenizer_load(dir, &t, NULL));
    if (!t) return;
    CHECK_INT(qd_tokenizer_bos_id(t), 271);
    CHECK_INT(qd_tokenizer_adds_bos(t), 1);
    int32_t *ids;
    size_t n;
    /* The special is cut out before the regex, which would otherwise split "<|" and "|>". */
    CHECK_OK(encode(t, "ab<|endoftext|>Hello", QD_TOK_BOS_DEFAULT, &ids, &n));
    check_ids(ids, n, (int32_t[]){271, 265, 271, 264}, 4);
    free(ids);
    CHECK_OK(encode(t, "ab", QD_TOK_BOS_OFF, &ids, &n));
    check_ids(ids, n, (int32_t[]){265}, 1);
    free(ids);
    char *s;
    size_t len;
    CHECK_OK(qd_tokenizer_decode(t, (int32_t[]){271, 265, 271, 264}, 4, 0, &s, &len, NULL));
    CHECK_STR(s, "<|endoftext|>ab<|endoftext|>Hello");
    free(s);
    CHECK_OK(qd_tokenizer_decode(t, (int32_t[]){271, 265}, 2, QD_TOK_DECODE_SKIP_SPECIAL, &s, &len, NULL));
    CHECK_STR(s, "ab");
    free(s);
    qd_err err = {0};
    CHECK_ERR(qd_tokenizer_decode(t, (int32_t[]){272}, 1, 0, &s, &len, &err));
    CHECK_CONTAINS(err.msg, "272");
    qd_tokenizer_free(t);

    /* No BOS token at all: forcing BOS is an error, not a silent no-op. */
    const char *d2 = make_bytelevel("nobos", bl_merges, NULL);
    CHECK_OK(qd_tokenizer_load(d2, &t, NULL));
    if (!t) return;
    CHECK_INT(qd_tokenizer_bos_id(t), -1);
    CHECK_ERR(qd_tokenizer_encode(t, "x", 1, QD_TOK_BOS_ON, &ids, &n, &err));
    qd_tokenizer_free(t);
}

/* SentencePiece style, as Llama-2's tokenizer.json: Prepend '▁' + Replace ' ' -> '▁', byte
 * fallback, BOS from the post-processor template. */
static const char *make_spm(const char *name, int metaspace, const char *merges, const char *config)
{
    const char *dir = mkdir_in_tmp(name);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON_AddNumberToObject(vocab, "<unk>", 0);
    cJSON_AddNumberToObject(vocab, "<s>", 1);
    cJSON_AddNumberToObject(vocab, "</s>", 2);
    for (int b = 0; b < 256; b++) {
        char p[8];
        snprintf(p, sizeof p, "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, p, 3 + b);
    }
    const char *pieces[] = {MS, "a", "b", MS "a", "aa", "aaaa", MS "b", "c"};
    for (int i = 0; i < 8; i++) cJSON_AddNumberToObject(vocab, pieces[i], 259 + i);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", cJSON_Parse(merges));
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", cJSON_Parse(
        "[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}]"));
    if (metaspace) {
        cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(
            "{\"type\":\"Metaspace\",\"replacement\":\"" MS "\",\"prepend_scheme\":\"first\",\"split\":false}"));
        cJSON_AddItemToObject(root, "decoder", cJSON_Parse(
            "{\"type\":\"Metaspace\",\"replacement\":\"" MS "\",\"prepend_scheme\":\"first\",\"split\":false}"));
    } else {
        cJSON_AddItemToObject(root, "normalizer", cJSON_Parse(
            "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"" MS "\"},"
            "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" MS "\"}]}"));
        cJSON_AddItemToObject(root, "decoder", cJSON_Parse(
            "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"" MS "\"},"
            "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
            "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}"));
    }
    cJSON_AddItemToObject(root, "post_processor", cJSON_Parse(
        "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}"));
    char *s = cJSON_Print(root);
    write_text(test_path(dir, "tokenizer.json"), s);
    free(s);
    cJSON_Delete(root);
    if (config) write_text(test_path(dir, "tokenizer_config.json"), config);
    return dir;
}

static const char *spm_merges = "[\"" MS " a\", \"a a\", \"aa aa\", \"" MS " b\"]";

static void test_spm(void)
{
    for (int meta = 0; meta < 2; meta++) {
        const char *dir = make_spm(meta ? "spm_meta" : "spm", meta, spm_merges, NULL);
        qd_tokenizer *t = NULL;
        qd_err err = {0};
        CHECK_OK(qd_tokenizer_load(dir, &t, &err));
        if (!t) { fprintf(stderr, "%s\n", err.msg); return; }
        CHECK_STR(qd_tokenizer_kind(t), "bpe-spm");
        CHECK_INT(qd_tokenizer_adds_bos(t), 1);
        CHECK_INT(qd_tokenizer_bos_id(t), 1);
        int32_t *ids;
        size_t n;
        /* "ab é" -> "▁ab▁é": ▁a, b, ▁, then é's two bytes through byte fallback (3 + byte). */
        CHECK_OK(encode(t, "ab \xC3\xA9", QD_TOK_BOS_DEFAULT, &ids, &n));
        check_ids(ids, n, (int32_t[]){1, 262, 261, 259, 3 + 0xC3, 3 + 0xA9}, 6);
        free(ids);
        /* Ties go leftmost: "aaaaa" -> ▁a + "aaaa" (aa, aa, then aa+aa). */
        CHECK_OK(encode(t, "aaaaa", QD_TOK_BOS_OFF, &ids, &n));
        check_ids(ids, n, (int32_t[]){262, 264}, 2);
        free(ids);
        CHECK_OK(encode(t, "xaaa", QD_TOK_BOS_OFF, &ids, &n));
        check_ids(ids, n, (int32_t[]){259, 3 + 'x', 263, 260}, 4);
        free(ids);
        /* A special token inside the text is matched, not byte-encoded. */
        CHECK_OK(encode(t, "a</s>", QD_TOK_BOS_OFF, &ids, &n));
        check_ids(ids, n, (int32_t[]){262, 2}, 2);
        free(ids);
        CHECK_OK(encode(t, "", QD_TOK_BOS_DEFAULT, &ids, &n));
        check_ids(ids, n, (int32_t[]){1}, 1);
        free(ids);
        check_roundtrip(t, "ab \xC3\xA9  cab\n\xF0\x9F\x98\x80 aaaa");
        qd_tokenizer_free(t);
    }
    /* tokenizer_config.json's add_bos_token wins over the post-processor template. */
    const char *dir = make_spm("spm_nobos", 0, spm_merges, "{\"add_bos_token\": false}");
    qd_tokenizer *t = NULL;
    CHECK_OK(qd_tokenizer_load(dir, &t, NULL));
    if (!t) return;
    CHECK_INT(qd_tokenizer_adds_bos(t), 0);
    int32_t *ids;
    size_t n;
    CHECK_OK(encode(t, "a", QD_TOK_BOS_DEFAULT, &ids, &n));
    check_ids(ids, n, (int32_t[]){262}, 1);
    free(ids);
    CHECK_OK(encode(t, "a", QD_TOK_BOS_ON, &ids, &n));
    check_ids(ids, n, (int32_t[]){1, 262}, 2);
    free(ids);
    qd_tokenizer_free(t);
}

/* One unsplit 2 MB "word": the heap-based merge must stay far from quadratic. */
static void test_long_input_speed(void)
{
    const char *dir = make_spm("spm_long", 0, spm_merges, NULL);
    qd_tokenizer *t = NULL;
    CHECK_OK(qd_tokenizer_load(dir, &t, NULL));
    if (!t) return;
    size_t n = 2u << 20;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) s[i] = "aaaab"[i % 5];
    s[n] = 0;
    double t0 = qd_clock_now_s();
    int32_t *ids;
    size_t k;
    CHECK_OK(encode(t, s, QD_TOK_BOS_OFF, &ids, &k));
    double secs = qd_clock_now_s() - t0;
    fprintf(stderr, "  2 MB unsplit encode: %zu ids in %.3f s\n", k, secs);
    CHECK(secs < 5.0);
    /* "▁aaaab aaaab ..." -> ▁a, aa, a, b and then "aaaa", "b" repeated. */
    CHECK_INT(k, 4 + 2 * (n / 5 - 1) + 1);
    char *back;
    size_t len;
    CHECK_OK(qd_tokenizer_decode(t, ids, k, 0, &back, &len, NULL));
    CHECK_INT(len, n);
    CHECK(back && !memcmp(back, s, n));
    free(back);
    free(ids);
    free(s);
    qd_tokenizer_free(t);
}

static void expect_load_error(const char *name, const char *json, int code, const char *needle)
{
    const char *dir = mkdir_in_tmp(name);
    write_text(test_path(dir, "tokenizer.json"), json);
    qd_tokenizer *t = NULL;
    qd_err err = {0};
    int rc = qd_tokenizer_load(dir, &t, &err);
    CHECK_INT(rc, code);
    CHECK(t == NULL);
    CHECK_CONTAINS(err.msg, needle);
    CHECK_CONTAINS(err.msg, "tokenizer.json");
    qd_tokenizer_free(t);
}

static void test_errors(void)
{
    expect_load_error("e1", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,", QD_EFORMAT, "invalid JSON");
    expect_load_error("e2", "[1, 2]", QD_EFORMAT, "not a JSON object");
    expect_load_error("e3", "{\"version\": \"1.0\"}", QD_EFORMAT, "model");
    expect_load_error("e4", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", QD_EUNSUPPORTED, "Unigram");
    expect_load_error("e5", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                      QD_EFORMAT, "merges[0]");
    expect_load_error("e6", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", QD_EFORMAT, "vocab");
    expect_load_error("e7", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}}", QD_EFORMAT, "regex");
    qd_tokenizer *t = NULL;
    qd_err err = {0};
    CHECK_INT(qd_tokenizer_load(mkdir_in_tmp("empty"), &t, &err), QD_ENOTFOUND);
    CHECK_CONTAINS(err.msg, "no tokenizer.json");
    CHECK_INT(qd_tokenizer_load_file(test_path(test_tmpdir(), "missing.json"), &t, &err), QD_ENOTFOUND);
}

static void test_token_files(void)
{
    const char *dir = test_tmpdir();
    int32_t want[] = {1, 450, 0, 2147483647, 31414};
    int32_t *ids;
    size_t n;
    qd_err err = {0};
    const char *p = test_path(dir, "ids.json");
    CHECK_OK(qd_token_file_write_json(p, want, 5, &err));
    CHECK_OK(qd_token_file_read(p, &ids, &n, &err));
    check_ids(ids, n, want, 5);
    free(ids);
    p = test_path(dir, "ids.bin");
    CHECK_OK(qd_token_file_write_bin(p, want, 5, &err));
    CHECK_OK(qd_token_file_read(p, &ids, &n, &err));
    check_ids(ids, n, want, 5);
    free(ids);
    const char *obj = "{\"name\": \"x\", \"meta\": {\"tokens\": [9]}, \"tokens\" : [ 1 ,2,\n3 ] }";
    CHECK_OK(qd_token_json_parse("obj", obj, strlen(obj), &ids, &n, &err));
    check_ids(ids, n, (int32_t[]){1, 2, 3}, 3);
    free(ids);
    CHECK_OK(qd_token_json_parse("empty", " [ ] ", 5, &ids, &n, &err));
    CHECK_INT(n, 0);
    free(ids);
    CHECK_ERR(qd_token_json_parse("f", "[1, 2.5]", 8, &ids, &n, &err));
    CHECK_CONTAINS(err.msg, "element 1");
    CHECK_ERR(qd_token_json_parse("neg", "[-1]", 4, &ids, &n, &err));
    CHECK_ERR(qd_token_json_parse("big", "[4294967296]", 12, &ids, &n, &err));
    CHECK_ERR(qd_token_json_parse("open", "[1, 2", 5, &ids, &n, &err));
    CHECK_ERR(qd_token_json_parse("nokey", "{\"x\": [1]}", 10, &ids, &n, &err));
    CHECK_CONTAINS(err.msg, "tokens");
    p = test_path(dir, "odd.bin");
    write_text(p, "abc");
    CHECK_ERR(qd_token_file_read(p, &ids, &n, &err));
    CHECK_CONTAINS(err.msg, "multiple of 4");
    CHECK_INT(qd_token_file_read(test_path(dir, "nope.json"), &ids, &n, &err), QD_ENOTFOUND);
}

int main(void)
{
    TEST_RUN(test_bytelevel);
    TEST_RUN(test_merge_priority);
    TEST_RUN(test_special_and_bos);
    TEST_RUN(test_spm);
    TEST_RUN(test_long_input_speed);
    TEST_RUN(test_errors);
    TEST_RUN(test_token_files);
    return test_finish();
}
