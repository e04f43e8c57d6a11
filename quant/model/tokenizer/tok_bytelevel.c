/* Byte-level BPE support: GPT-2's bytes_to_unicode alphabet, UTF-8 helpers, and regex
 * pre-tokenisation through PCRE2 with Unicode properties (\p{L}, \p{N}, \s as Unicode
 * white space), which is what the GPT-2 / Llama-3 / Qwen2 patterns need to split text the
 * way HF tokenizers (Rust `fancy-regex`/`onig`) does. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "quant/model/tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* bytes_to_unicode: printable Latin-1 bytes keep their code point; the other 68 bytes are
 * spelled 256, 257, ... in byte order, so every byte is a visible character. */
static int byte_is_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    uint32_t k = 0;
    for (int i = 0; i < b; i++) k += !byte_is_printable(i);
    return 256 + k;
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b) && k-- == 0) return b;
    return -1;
}

int tok_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_get(const char *s, size_t n, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s;
    int len;
    uint32_t c;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    if ((u[0] & 0xE0) == 0xC0) { len = 2; c = u[0] & 0x1F; }
    else if ((u[0] & 0xF0) == 0xE0) { len = 3; c = u[0] & 0x0F; }
    else if ((u[0] & 0xF8) == 0xF0) { len = 4; c = u[0] & 0x07; }
    else { *cp = 0xFFFFFFFFu; return 1; }
    if ((size_t)len > n) { *cp = 0xFFFFFFFFu; return 1; }
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) { *cp = 0xFFFFFFFFu; return 1; }
        c = (c << 6) | (u[i] & 0x3F);
    }
    *cp = c;
    return len;
}

void *tok_regex_compile(const char *pattern, int literal, qd_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    /* MATCH_INVALID_UTF lets arbitrary bytes through instead of failing the whole text. */
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        qd_err_set(err, QD_EFORMAT, "pre-tokenizer regex does not compile at offset %zu: %s",
                   (size_t)eo, (const char *)msg);
        return NULL;
    }
    /* JIT is an optimisation only; the interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

void tok_regex_free(void *re)
{
    if (re) pcre2_code_free((pcre2_code *)re);
}

int tok_regex_split(void *rev, const char *s, size_t n,
                    int (*emit)(void *ctx, size_t off, size_t len), void *ctx, qd_err *err)
{
    pcre2_code *re = rev;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory for regex match data");
    size_t pos = 0, last = 0;
    int rc = 0;
    while (pos <= n) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = qd_err_set(err, QD_EFORMAT, "pre-tokenizer regex failed at byte %zu: %s", pos,
                            (const char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing; step over one character. */
            if (ms >= n) break;
            uint32_t cp;
            pos = ms + (size_t)tok_utf8_get(s + ms, n - ms, &cp);
            continue;
        }
        if (ms > last && (rc = emit(ctx, last, ms - last))) break;
        if ((rc = emit(ctx, ms, me - ms))) break;
        last = pos = me;
    }
    if (!rc && last < n) rc = emit(ctx, last, n - last);
    pcre2_match_data_free(md);
    if (rc && err && err->code == 0) qd_err_set(err, rc, "tokenizer: pre-tokenizer failed");
    return rc;
}
