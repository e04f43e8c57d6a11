/* The tokenizer.json fuzz harness. An accepted tokenizer must give special ids inside its
 * vocabulary (or -1), find each piece again by its string, and encode every text it is given
 * either to ids that all name a piece, the same ids every time and decodable, or to a refusal
 * with a message; a refused file must leave no handle and a message naming the source.
 * Texts: a few fixed ones (ASCII, multi-byte UTF-8, invalid UTF-8, special-token spellings)
 * and the input's last 48 bytes, so the fuzzer steers the text too. */
#include "fuzz/tokenizer_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/tokenizer/tokenizer.h"

#define WHAT "fuzz/tokenizer.json"

static int fail(const char *why, const char *detail)
{
    fprintf(stderr, "tokenizer_fuzz_one: invariant broken: %s%s%s\n", why, detail ? ": " : "", detail ? detail : "");
    return -1;
}

static int check_text(const qd_tokenizer *t, const char *s, size_t n, int bos)
{
    int32_t *ids = NULL, *ids2 = NULL;
    size_t k = 0, k2 = 0;
    qd_err err = {0};
    int bad = 0, nv = qd_tokenizer_vocab_size(t);
    int rc = qd_tokenizer_encode(t, s, n, bos, &ids, &k, &err);
    if (rc) {
        if (rc > 0 || !err.msg[0]) bad = fail("encode failed without a negative code and a message", NULL);
        free(ids);
        return bad;
    }
    for (size_t i = 0; i < k && !bad; i++)
        if (ids[i] < 0 || ids[i] >= nv || !qd_tokenizer_piece(t, ids[i])) bad = fail("encode gave an id that names no piece", NULL);
    if (!bad && (qd_tokenizer_encode(t, s, n, bos, &ids2, &k2, &err) || k2 != k || (k && memcmp(ids, ids2, k * sizeof *ids))))
        bad = fail("encoding the same text twice differs", NULL);
    char *text = NULL;
    size_t tl = 0;
    if (!bad && qd_tokenizer_decode(t, ids, k, 0, &text, &tl, &err)) bad = fail("the ids encode gave do not decode", err.msg);
    if (text && strlen(text) > tl) bad = fail("decode length", NULL);
    free(text);
    text = NULL;
    if (!bad && qd_tokenizer_decode(t, ids, k, QD_TOK_DECODE_SKIP_SPECIAL, &text, &tl, &err))
        bad = fail("the ids encode gave do not decode (skipping specials)", err.msg);
    free(text);
    free(ids);
    free(ids2);
    return bad;
}

static int check_tokenizer(const qd_tokenizer *t, const uint8_t *data, size_t size)
{
    int32_t nv = qd_tokenizer_vocab_size(t);
    if (nv < 0) return fail("negative vocabulary size", NULL);
    int32_t sp[3] = {qd_tokenizer_bos_id(t), qd_tokenizer_eos_id(t), qd_tokenizer_unk_id(t)};
    for (int i = 0; i < 3; i++)
        if (sp[i] < -1 || sp[i] >= nv || (sp[i] >= 0 && !qd_tokenizer_piece(t, sp[i]))) return fail("a special id outside the vocabulary", NULL);
    if (qd_tokenizer_adds_bos(t) && sp[0] < 0) return fail("adds BOS without a BOS id", NULL);
    if (!qd_tokenizer_kind(t)) return fail("no kind", NULL);
    if (qd_tokenizer_piece(t, -1) || qd_tokenizer_piece(t, nv)) return fail("a piece outside the id range", NULL);
    for (int32_t i = 0; i < nv && i < 512; i++) {
        const char *p = qd_tokenizer_piece(t, i);
        if (!p) continue;
        int32_t j = qd_tokenizer_piece_id(t, p);
        /* Two ids may share a string; the lookup must find one of them. */
        if (j < 0 || j >= nv || !qd_tokenizer_piece(t, j) || strcmp(qd_tokenizer_piece(t, j), p))
            return fail("a piece is not found by its string", p);
    }
    static const char *const texts[] = {
        "Hello world, it's 123 aaaa b!", "  leading and  double  spaces\n\ttabs\r\n", "", "\xc3\xa9t\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80",
        "\xff\xfe\xc3 broken \xed\xa0\x80 utf-8", "<s>x</s><|endoftext|><unk>", "<0x41>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (check_text(t, texts[i], strlen(texts[i]), (int)(i % 3))) return -1;
    size_t tail = size < 48 ? size : 48;
    if (check_text(t, (const char *)data + size - tail, tail, QD_TOK_BOS_DEFAULT)) return -1;
    return 0;
}

int tokenizer_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    if (accepted) *accepted = 0;
    qd_tokenizer *t = (qd_tokenizer *)(uintptr_t)1;
    qd_err err = {0};
    int bad = 0, rc = qd_tokenizer_load_json_text((const char *)data, size, WHAT, &t, &err);
    if (rc == 0) {
        if (!t) return fail("success without a tokenizer", NULL);
        if (accepted) *accepted = 1;
        bad = check_tokenizer(t, data, size);
        qd_tokenizer_free(t);
    } else {
        if (rc > 0) bad = fail("an error path returned a positive code", NULL);
        if (t) bad = fail("a refused file still produced a tokenizer", NULL);
        if (strncmp(err.msg, WHAT ":", strlen(WHAT) + 1)) bad = fail("the message does not name the source", err.msg);
    }
    return bad ? -1 : 0;
}
