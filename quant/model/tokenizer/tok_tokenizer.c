/* The tokenizer handle: loading dispatch (which files a model directory holds), the shared
 * finishing step every loader ends with, the encode pipeline (special tokens -> normalisers
 * -> pre-tokenisers -> BPE per piece), decoding, and the accessors in tokenizer.h. */
#include "quant/model/tokenizer/tok_internal.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

int tok_alloc(qd_tokenizer **out, int32_t n_vocab, qd_err *err)
{
    qd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory");
    if (n_vocab < 1) n_vocab = 1;
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)n_vocab, sizeof *t->piece_len);
    t->piece_flags = calloc((size_t)n_vocab, 1);
    t->n_vocab = n_vocab;
    t->unk_id = t->bos_id = t->eos_id = -1;
    if (!t->piece || !t->piece_len || !t->piece_flags) {
        qd_tokenizer_free(t);
        return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory for %d pieces", (int)n_vocab);
    }
    *out = t;
    return 0;
}

int tok_set_piece(qd_tokenizer *t, int32_t id, const char *s, size_t len, qd_err *err)
{
    if (id < 0) return qd_err_set(err, QD_EFORMAT, "tokenizer: negative id %d for piece '%.40s'", (int)id, s);
    if (id >= t->n_vocab) {
        int32_t nv = id + 1;
        char **p = realloc(t->piece, (size_t)nv * sizeof *p);
        if (p) t->piece = p;
        uint32_t *l = realloc(t->piece_len, (size_t)nv * sizeof *l);
        if (l) t->piece_len = l;
        uint8_t *f = realloc(t->piece_flags, (size_t)nv);
        if (f) t->piece_flags = f;
        if (!p || !l || !f) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory growing to %d ids", (int)nv);
        for (int32_t i = t->n_vocab; i < nv; i++) { p[i] = NULL; l[i] = 0; f[i] = 0; }
        t->n_vocab = nv;
    }
    char *c = malloc(len + 1);
    if (!c) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory");
    memcpy(c, s, len);
    c[len] = 0;
    free(t->piece[id]);
    t->piece[id] = c;
    t->piece_len[id] = (uint32_t)len;
    /* A special entry borrows the piece string: point it at the new one, or drop it when the
     * piece became empty (an id given twice in added_tokens left it dangling; found by fuzzing). */
    for (int i = 0; i < t->n_special; i++) {
        if (t->special[i].id != id) continue;
        if (len) {
            t->special[i].s = c;
            t->special[i].len = (uint32_t)len;
        } else {
            t->special[i--] = t->special[--t->n_special];
        }
    }
    return 0;
}

int tok_add_special(qd_tokenizer *t, int32_t id, qd_err *err)
{
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return qd_err_set(err, QD_EFORMAT, "tokenizer: special token id %d has no piece", (int)id);
    t->piece_flags[id] |= TOK_PIECE_SPECIAL;
    if (t->piece_len[id] == 0) return 0;   /* an empty special can never be matched */
    for (int i = 0; i < t->n_special; i++)
        if (t->special[i].id == id) return 0;
    tok_special *s = realloc(t->special, (size_t)(t->n_special + 1) * sizeof *s);
    if (!s) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory");
    t->special = s;
    s[t->n_special++] = (tok_special){t->piece[id], t->piece_len[id], id};
    return 0;
}

static int special_cmp(const void *a, const void *b)
{
    const tok_special *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;   /* longest first */
    return x->id - y->id;
}

static int is_byte_piece(const char *p, size_t n, int *val)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(p, "<0x", 3) || p[5] != '>') return 0;
    const char *h = strchr(hex, p[3]), *l = strchr(hex, p[4]);
    if (!h || !l || !p[3] || !p[4]) return 0;
    *val = (int)((h - hex) * 16 + (l - hex));
    return 1;
}

int tok_finalize(qd_tokenizer *t, qd_err *err)
{
    tok_strmap_free(&t->vocab);
    if (tok_strmap_init(&t->vocab, (size_t)t->n_vocab))
        return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory for the vocabulary map");
    for (int i = 0; i < 256; i++) t->byte_id[i] = t->bytelevel_id[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!t->piece[id]) continue;
        /* The first id of a duplicated string wins, as in a JSON object read in order. */
        if (tok_strmap_get(&t->vocab, t->piece[id], t->piece_len[id]) < 0 &&
            tok_strmap_put(&t->vocab, t->piece[id], t->piece_len[id], id))
            return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory for the vocabulary map");
        int b;
        if (!t->byte_level && is_byte_piece(t->piece[id], t->piece_len[id], &b) && t->byte_id[b] < 0) {
            t->byte_id[b] = id;
            t->piece_flags[id] |= TOK_PIECE_BYTE;
        }
    }
    if (t->byte_level) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            int l = tok_utf8_put(tok_byte_to_cp((uint8_t)b), u);
            t->bytelevel_id[b] = tok_strmap_get(&t->vocab, u, (size_t)l);
        }
    }
    if (t->n_special > 0) qsort(t->special, (size_t)t->n_special, sizeof *t->special, special_cmp);
    memset(t->special_first, 0, sizeof t->special_first);
    for (int i = 0; i < t->n_special; i++) t->special_first[(uint8_t)t->special[i].s[0]] = 1;
    return 0;
}

/* bos_token / eos_token are a string or {"content": "..."} (AddedToken form). */
static const char *token_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

int tok_apply_config(qd_tokenizer *t, const char *dir, qd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!qd_input_exists(path)) return 0;
    char *buf;
    size_t len;
    int rc = qd_input_read(path, QD_INPUT_JSON, &buf, &len, err);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: not a valid JSON object", path);
    }
    const char *bos = token_name(cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
    const char *eos = token_name(cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
    if (bos) {
        int32_t id = tok_strmap_get(&t->vocab, bos, strlen(bos));
        if (id >= 0) t->bos_id = id;
    }
    if (eos) {
        int32_t id = tok_strmap_get(&t->vocab, eos, strlen(eos));
        if (id >= 0) t->eos_id = id;
    }
    if (cJSON_IsBool(add)) t->add_bos = cJSON_IsTrue(add);
    /* bos points into root: the message is made before root goes. */
    rc = 0;
    if (t->add_bos && t->bos_id < 0)
        rc = qd_err_set(err, QD_EFORMAT, "%s: add_bos_token is true but bos_token '%s' is not in the vocabulary", path,
                        bos ? bos : "(none)");
    cJSON_Delete(root);
    return rc;
}

static int path_join(char *out, size_t cap, const char *dir, const char *name)
{
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap ? 0 : QD_EINVAL;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int load_and_configure(qd_tokenizer **out, const char *path, const char *dir, qd_err *err)
{
    qd_tokenizer *t = NULL;
    int rc = ends_with(path, ".model") ? tok_load_spmodel(&t, path, err) : tok_load_json(&t, path, err);
    if (!rc) rc = tok_apply_config(t, dir, err);
    if (rc) { qd_tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

int qd_tokenizer_load_file(const char *path, qd_tokenizer **out, qd_err *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    return load_and_configure(out, path, dir, err);
}

int qd_tokenizer_load(const char *dir, qd_tokenizer **out, qd_err *err)
{
    char p1[4096], p2[4096];
    *out = NULL;
    if (path_join(p1, sizeof p1, dir, "tokenizer.json"))
        return qd_err_set(err, QD_EINVAL, "tokenizer: directory path too long");
    if (qd_input_exists(p1)) return load_and_configure(out, p1, dir, err);
    path_join(p1, sizeof p1, dir, "vocab.json");
    path_join(p2, sizeof p2, dir, "merges.txt");
    if (qd_input_exists(p1) && qd_input_exists(p2)) {
        qd_tokenizer *t = NULL;
        int rc = tok_load_vocab_merges(&t, p1, p2, err);
        if (!rc) rc = tok_apply_config(t, dir, err);
        if (rc) { qd_tokenizer_free(t); return rc; }
        *out = t;
        return 0;
    }
    path_join(p1, sizeof p1, dir, "tokenizer.model");
    if (qd_input_exists(p1)) return load_and_configure(out, p1, dir, err);
    return qd_err_set(err, QD_ENOTFOUND, "%s: no tokenizer.json, vocab.json + merges.txt or tokenizer.model", dir);
}

void qd_tokenizer_free(qd_tokenizer *t)
{
    if (!t) return;
    for (int32_t i = 0; i < t->n_vocab && t->piece; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->piece_flags);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) tok_regex_free(t->pre[i].re);
    free(t->pre);
    free(t->special);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------ */

/* Pieces produced by the pre-tokenisers: spans over one buffer. */
typedef struct span_list { char *buf; size_t len; size_t *off, *n; size_t count, cap; } span_list;

static int spans_add(span_list *s, size_t off, size_t n)
{
    if (s->count == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        size_t *o = realloc(s->off, nc * sizeof *o);
        if (!o) return QD_ENOMEM;
        s->off = o;
        size_t *l = realloc(s->n, nc * sizeof *l);
        if (!l) return QD_ENOMEM;
        s->n = l;
        s->cap = nc;
    }
    s->off[s->count] = off;
    s->n[s->count++] = n;
    return 0;
}

static void spans_free(span_list *s)
{
    free(s->buf);
    free(s->off);
    free(s->n);
    memset(s, 0, sizeof *s);
}

typedef struct split_ctx { span_list *dst; size_t base; } split_ctx;

static int split_emit(void *ctx, size_t off, size_t len)
{
    split_ctx *c = ctx;
    return spans_add(c->dst, c->base + off, len);
}

/* Splits every span with re; the buffer moves to dst unchanged. */
static int spans_regex(span_list *src, span_list *dst, void *re, qd_err *err)
{
    for (size_t i = 0; i < src->count; i++) {
        split_ctx c = {dst, src->off[i]};
        int rc = tok_regex_split(re, src->buf + src->off[i], src->n[i], split_emit, &c, err);
        if (rc) return rc;
    }
    dst->buf = src->buf;
    dst->len = src->len;
    src->buf = NULL;
    return 0;
}

#define METASPACE "\xE2\x96\x81"

/* Rewrites each span into a new buffer: ByteLevel's prefix space, or Metaspace's ' ' -> '▁'
 * plus prefix, optionally splitting before every '▁' (Metaspace split=true). */
static int spans_rewrite(const tok_pre_step *st, span_list *src, span_list *dst, int first_segment)
{
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < src->count && !rc; i++) {
        const char *s = src->buf + src->off[i];
        size_t n = src->n[i], start = dst->len;
        if (n == 0) continue;
        if (st->kind == TOK_PRE_BYTELEVEL) {
            if (st->add_prefix_space && (n == 0 || s[0] != ' ')) rc = tok_bytes_push(&dst->buf, &dst->len, &cap, " ", 1);
            if (!rc) rc = tok_bytes_push(&dst->buf, &dst->len, &cap, s, n);
            if (!rc) rc = spans_add(dst, start, dst->len - start);
            continue;
        }
        int prepend = st->prepend_scheme == TOK_PREPEND_ALWAYS ||
                      (st->prepend_scheme == TOK_PREPEND_FIRST && first_segment && src->off[i] == 0);
        if (prepend && (n < 3 || memcmp(s, METASPACE, 3)) && s[0] != ' ')
            rc = tok_bytes_push(&dst->buf, &dst->len, &cap, METASPACE, 3);
        for (size_t k = 0; k < n && !rc; k++)
            rc = s[k] == ' ' ? tok_bytes_push(&dst->buf, &dst->len, &cap, METASPACE, 3)
                             : tok_bytes_push(&dst->buf, &dst->len, &cap, s + k, 1);
        if (rc) break;
        if (!st->split) { rc = spans_add(dst, start, dst->len - start); continue; }
        size_t piece = start;
        for (size_t k = start + 1; k + 3 <= dst->len && !rc; k++)
            if (!memcmp(dst->buf + k, METASPACE, 3)) { rc = spans_add(dst, piece, k - piece); piece = k; }
        if (!rc && dst->len > piece) rc = spans_add(dst, piece, dst->len - piece);
    }
    return rc;
}

typedef struct enc_state {
    const qd_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    tok_bpe_work work;
    char *scratch;
    size_t scratch_cap;
} enc_state;

static int encode_word(enc_state *e, const char *s, size_t n, qd_err *err)
{
    const qd_tokenizer *t = e->t;
    int rc = 0;
    if (n == 0) return 0;
    if (t->ignore_merges) {
        const char *key = s;
        size_t kl = n;
        if (t->byte_level) {   /* the vocabulary spells bytes through bytes_to_unicode */
            size_t sl = 0;
            for (size_t i = 0; i < n && !rc; i++) {
                char u[4];
                int l = tok_utf8_put(tok_byte_to_cp((uint8_t)s[i]), u);
                rc = tok_bytes_push(&e->scratch, &sl, &e->scratch_cap, u, (size_t)l);
            }
            if (rc) return qd_err_set(err, rc, "tokenizer: out of memory");
            key = e->scratch;
            kl = sl;
        }
        int32_t id = tok_strmap_get(&t->vocab, key, kl);
        if (id >= 0) return tok_ids_push(&e->ids, &e->n, &e->cap, id) ? qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory") : 0;
    }
    size_t start = e->n;
    if (t->byte_level) {
        for (size_t i = 0; i < n && !rc; i++) {
            int32_t id = t->bytelevel_id[(uint8_t)s[i]];
            if (id < 0) {
                if (t->unk_id < 0)
                    return qd_err_set(err, QD_EFORMAT, "tokenizer: byte 0x%02X has no byte-level vocabulary entry",
                                      (uint8_t)s[i]);
                id = t->unk_id;
            }
            rc = tok_ids_push(&e->ids, &e->n, &e->cap, id);
        }
        if (rc) return qd_err_set(err, rc, "tokenizer: out of memory");
    } else {
        rc = tok_spm_initial_symbols(t, s, n, &e->ids, &e->n, &e->cap, err);
        if (rc) return rc;
    }
    size_t merged;
    rc = tok_bpe_merge(&t->merges, &e->work, e->ids + start, e->n - start, &merged);
    if (rc) return qd_err_set(err, rc, "tokenizer: BPE merge failed (%s)", qd_strerror(rc));
    e->n = start + merged;
    return 0;
}

/* Normalises, pre-tokenises and BPE-encodes one stretch of text without special tokens. */
static int encode_plain(enc_state *e, const char *s, size_t n, int first_segment, qd_err *err)
{
    const qd_tokenizer *t = e->t;
    if (n == 0) return 0;
    span_list cur = {0};
    int rc = tok_normalize(t, s, n, &cur.buf, &cur.len, err);
    if (rc) return rc;
    rc = spans_add(&cur, 0, cur.len);
    for (int i = 0; i < t->n_pre && !rc; i++) {
        const tok_pre_step *st = &t->pre[i];
        span_list nxt = {0};
        if (st->kind == TOK_PRE_SPLIT || (st->kind == TOK_PRE_BYTELEVEL && !st->add_prefix_space)) {
            if (st->re) rc = spans_regex(&cur, &nxt, st->re, err);
            else { spans_free(&nxt); continue; }
        } else {
            rc = spans_rewrite(st, &cur, &nxt, first_segment);
            if (rc) qd_err_set(err, rc, "tokenizer: out of memory in the pre-tokenizer");
            if (!rc && st->kind == TOK_PRE_BYTELEVEL && st->re) {
                span_list again = {0};
                rc = spans_regex(&nxt, &again, st->re, err);
                spans_free(&nxt);
                nxt = again;
            }
        }
        spans_free(&cur);
        cur = nxt;
    }
    if (rc && err && !err->code) qd_err_set(err, rc, "tokenizer: out of memory in the pre-tokenizer");
    for (size_t i = 0; i < cur.count && !rc; i++) rc = encode_word(e, cur.buf + cur.off[i], cur.n[i], err);
    spans_free(&cur);
    return rc;
}

int qd_tokenizer_encode(const qd_tokenizer *t, const char *text, size_t len, int bos_mode,
                        int32_t **ids, size_t *n_ids, qd_err *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return qd_err_set(err, QD_EINVAL, "tokenizer: encode called without a tokenizer or text");
    int bos = bos_mode == QD_TOK_BOS_ON ? 1 : bos_mode == QD_TOK_BOS_OFF ? 0 : t->add_bos;
    if (bos && t->bos_id < 0) return qd_err_set(err, QD_EINVAL, "tokenizer: BOS requested but the tokenizer has no BOS token");
    enc_state e = {.t = t};
    int rc = 0;
    if (bos) rc = tok_ids_push(&e.ids, &e.n, &e.cap, t->bos_id);
    size_t seg = 0, i = 0;
    while (i < len && !rc) {
        int matched = 0;
        if (t->special_first[(uint8_t)text[i]]) {
            for (int k = 0; k < t->n_special; k++) {
                const tok_special *sp = &t->special[k];
                if (sp->len <= len - i && !memcmp(text + i, sp->s, sp->len)) {
                    rc = encode_plain(&e, text + seg, i - seg, seg == 0, err);
                    if (!rc && tok_ids_push(&e.ids, &e.n, &e.cap, sp->id)) rc = QD_ENOMEM;
                    i += sp->len;
                    seg = i;
                    matched = 1;
                    break;
                }
            }
        }
        if (!matched) i++;
    }
    if (!rc) rc = encode_plain(&e, text + seg, len - seg, seg == 0, err);
    tok_bpe_work_free(&e.work);
    free(e.scratch);
    if (rc) {
        free(e.ids);
        if (err && !err->code) qd_err_set(err, rc, "tokenizer: out of memory");
        return rc;
    }
    if (!e.ids) e.ids = malloc(sizeof *e.ids);   /* an empty result is still a valid buffer */
    if (!e.ids) return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory");
    *ids = e.ids;
    *n_ids = e.n;
    return 0;
}

/* ---- decoding -------------------------------------------------------------------------- */

int qd_tokenizer_decode(const qd_tokenizer *t, const int32_t *ids, size_t n_ids, int flags,
                        char **text, size_t *len, qd_err *err)
{
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = tok_bytes_push(&buf, &n, &cap, "", 0);
    for (size_t i = 0; i < n_ids && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->piece[id]) {
            free(buf);
            return qd_err_set(err, QD_EINVAL, "tokenizer: id %d at position %zu is not in the vocabulary (size %d)",
                              (int)id, i, (int)t->n_vocab);
        }
        const char *p = t->piece[id];
        size_t pl = t->piece_len[id];
        if (t->piece_flags[id] & TOK_PIECE_SPECIAL) {
            if (!(flags & QD_TOK_DECODE_SKIP_SPECIAL)) rc = tok_bytes_push(&buf, &n, &cap, p, pl);
        } else if (t->byte_level) {
            for (size_t k = 0; k < pl && !rc;) {
                uint32_t cp;
                int l = tok_utf8_get(p + k, pl - k, &cp);
                int b = cp == 0xFFFFFFFFu ? -1 : tok_cp_to_byte(cp);
                if (b >= 0) { char c = (char)b; rc = tok_bytes_push(&buf, &n, &cap, &c, 1); }
                else rc = tok_bytes_push(&buf, &n, &cap, p + k, (size_t)l);
                k += (size_t)l;
            }
        } else {
            rc = tok_spm_decode_piece(t, id, &buf, &n, &cap);
        }
    }
    if (rc) { free(buf); return qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory decoding"); }
    if (t->decode_strip_space && n > 0 && buf[0] == ' ') {
        memmove(buf, buf + 1, n);   /* moves the NUL too */
        n--;
    }
    *text = buf;
    *len = n;
    return 0;
}

/* ---- accessors -------------------------------------------------------------------------- */

int32_t qd_tokenizer_vocab_size(const qd_tokenizer *t) { return t->n_vocab; }
int32_t qd_tokenizer_bos_id(const qd_tokenizer *t) { return t->bos_id; }
int32_t qd_tokenizer_eos_id(const qd_tokenizer *t) { return t->eos_id; }
int32_t qd_tokenizer_unk_id(const qd_tokenizer *t) { return t->unk_id; }
int qd_tokenizer_adds_bos(const qd_tokenizer *t) { return t->add_bos; }

const char *qd_tokenizer_piece(const qd_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->piece[id] : NULL;
}

int32_t qd_tokenizer_piece_id(const qd_tokenizer *t, const char *piece)
{
    return piece ? tok_strmap_get(&t->vocab, piece, strlen(piece)) : -1;
}

const char *qd_tokenizer_kind(const qd_tokenizer *t)
{
    return t->byte_level ? "bpe-bytelevel" : "bpe-spm";
}
