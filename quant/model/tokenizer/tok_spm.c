/* SentencePiece-style pieces: the normaliser steps ('▁' prefix, ' ' -> '▁', whitespace
 * collapsing), the initial symbols of a word (characters, or <0xNN> byte-fallback ids for
 * characters the vocabulary lacks), and decoding of '▁'-alphabet pieces. Also the small
 * growable-array helpers the other tok_*.c files share. */
#include "quant/model/tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

int tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t v)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        int32_t *p = realloc(*ids, nc * sizeof *p);
        if (!p) return QD_ENOMEM;
        *ids = p;
        *cap = nc;
    }
    (*ids)[(*n)++] = v;
    return 0;
}

int tok_bytes_push(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *p = realloc(*buf, nc);
        if (!p) return QD_ENOMEM;
        *buf = p;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static int replace_all(const char *s, size_t n, const char *a, const char *b, char **out, size_t *n_out)
{
    size_t la = strlen(a), lb = strlen(b), len = 0, cap = 0;
    char *buf = NULL;
    if (la == 0) {   /* an empty pattern replaces nothing */
        if (tok_bytes_push(&buf, &len, &cap, s, n)) { free(buf); return QD_ENOMEM; }
        *out = buf; *n_out = len;
        return 0;
    }
    size_t i = 0, run = 0;
    while (i < n) {
        if (i + la <= n && !memcmp(s + i, a, la)) {
            if (tok_bytes_push(&buf, &len, &cap, s + run, i - run) || tok_bytes_push(&buf, &len, &cap, b, lb)) {
                free(buf);
                return QD_ENOMEM;
            }
            i += la;
            run = i;
        } else {
            i++;
        }
    }
    if (tok_bytes_push(&buf, &len, &cap, s + run, n - run) || (!buf && tok_bytes_push(&buf, &len, &cap, "", 0))) {
        free(buf);
        return QD_ENOMEM;
    }
    *out = buf;
    *n_out = len;
    return 0;
}

/* sentencepiece's remove_extra_whitespaces: no leading or trailing spaces, runs -> one. */
static int collapse_ws(const char *s, size_t n, char **out, size_t *n_out)
{
    char *buf = malloc(n + 1);
    if (!buf) return QD_ENOMEM;
    size_t k = 0;
    int pending = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { pending = k > 0; continue; }
        if (pending) { buf[k++] = ' '; pending = 0; }
        buf[k++] = s[i];
    }
    buf[k] = 0;
    *out = buf;
    *n_out = k;
    return 0;
}

int tok_normalize(const qd_tokenizer *t, const char *s, size_t n, char **out, size_t *n_out, qd_err *err)
{
    char *cur = malloc(n + 1);
    if (!cur) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory normalising %zu bytes", n);
    memcpy(cur, s, n);
    cur[n] = 0;
    size_t len = n;
    for (int i = 0; i < t->n_norm; i++) {
        const tok_norm_step *st = &t->norm[i];
        char *next = NULL;
        size_t nl = 0;
        int rc = 0;
        switch (st->kind) {
        case TOK_NORM_PREPEND:
            if (len == 0) continue;   /* HF's Prepend leaves an empty string empty */
            nl = strlen(st->a) + len;
            next = malloc(nl + 1);
            if (!next) { rc = QD_ENOMEM; break; }
            memcpy(next, st->a, strlen(st->a));
            memcpy(next + strlen(st->a), cur, len + 1);
            break;
        case TOK_NORM_REPLACE:
            rc = replace_all(cur, len, st->a, st->b, &next, &nl);
            break;
        case TOK_NORM_COLLAPSE_WS:
            rc = collapse_ws(cur, len, &next, &nl);
            break;
        default:
            rc = QD_EINVAL;
        }
        if (rc) {
            free(cur);
            return qd_err_set(err, rc, "tokenizer: normaliser step %d failed (%s)", i, qd_strerror(rc));
        }
        free(cur);
        cur = next;
        len = nl;
    }
    *out = cur;
    *n_out = len;
    return 0;
}

int tok_spm_initial_symbols(const qd_tokenizer *t, const char *s, size_t n,
                            int32_t **ids, size_t *n_ids, size_t *cap, qd_err *err)
{
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = (size_t)tok_utf8_get(s + i, n - i, &cp);
        int32_t id = tok_strmap_get(&t->vocab, s + i, cl);
        int rc = 0;
        if (id >= 0) {
            rc = tok_ids_push(ids, n_ids, cap, id);
            last_unk = 0;
        } else {
            int have_bytes = t->byte_fallback;
            for (size_t k = 0; have_bytes && k < cl; k++) have_bytes = t->byte_id[(uint8_t)s[i + k]] >= 0;
            if (have_bytes) {
                for (size_t k = 0; !rc && k < cl; k++) rc = tok_ids_push(ids, n_ids, cap, t->byte_id[(uint8_t)s[i + k]]);
                last_unk = 0;
            } else if (t->unk_id < 0) {
                return qd_err_set(err, QD_EINVAL, "tokenizer: character at byte %zu is not in the vocabulary and "
                                  "there is neither byte fallback nor an unk token", i);
            } else if (!(t->fuse_unk && last_unk)) {
                rc = tok_ids_push(ids, n_ids, cap, t->unk_id);
                last_unk = 1;
            }
        }
        if (rc) return qd_err_set(err, rc, "tokenizer: out of memory");
        i += cl;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int tok_spm_decode_piece(const qd_tokenizer *t, int32_t id, char **buf, size_t *len, size_t *cap)
{
    const char *p = t->piece[id];
    size_t n = t->piece_len[id];
    if (t->piece_flags[id] & TOK_PIECE_BYTE) {
        char b = (char)(hexval(p[3]) * 16 + hexval(p[4]));
        return tok_bytes_push(buf, len, cap, &b, 1);
    }
    size_t run = 0;
    for (size_t i = 0; i + 3 <= n;) {
        if (!memcmp(p + i, "\xE2\x96\x81", 3)) {
            if (tok_bytes_push(buf, len, cap, p + run, i - run) || tok_bytes_push(buf, len, cap, " ", 1))
                return QD_ENOMEM;
            i += 3;
            run = i;
        } else {
            i++;
        }
    }
    return tok_bytes_push(buf, len, cap, p + run, n - run);
}
