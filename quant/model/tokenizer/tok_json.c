/* Loads an HF tokenizers `tokenizer.json` with a BPE model into a qd_tokenizer: vocab,
 * merges (rank = position in "merges", "a b" strings or ["a", "b"] pairs), added tokens,
 * the normaliser (Sequence / Prepend / Replace), the pre-tokenizer (Sequence / Split with a
 * regex / ByteLevel / Metaspace), the post-processor's BOS and the decoder's leading-space
 * strip. Anything that would change the ids and is not implemented is refused with
 * QD_EUNSUPPORTED rather than silently tokenised differently. */
#include "quant/model/tokenizer/tok_internal.h"
#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"
#include "quant/core/log.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* The largest token id a file may use. Real vocabularies stop near 256k; an id of two
 * billion (accepted before, found by fuzzing) made the loader allocate gigabytes for the id
 * space, and an added token at INT_MAX overflowed max_id + 1. */
#define TOK_MAX_ID ((1 << 24) - 1)

typedef struct json_ctx { qd_tokenizer *t; const char *path; qd_err *err; } json_ctx;

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static const char *get_str(const cJSON *o, const char *k)
{
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int get_bool(const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = get(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (c) memcpy(c, s, n + 1);
    return c;
}

static int add_norm(json_ctx *c, int kind, const char *a, const char *b)
{
    qd_tokenizer *t = c->t;
    tok_norm_step *n = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *n);
    if (!n) return qd_err_set(c->err, QD_ENOMEM, "%s: out of memory", c->path);
    t->norm = n;
    tok_norm_step *st = &n[t->n_norm];
    st->kind = kind;
    st->a = a ? dupstr(a) : NULL;
    st->b = b ? dupstr(b) : NULL;
    t->n_norm++;
    if ((a && !st->a) || (b && !st->b)) return qd_err_set(c->err, QD_ENOMEM, "%s: out of memory", c->path);
    return 0;
}

static int parse_normalizer(json_ctx *c, const cJSON *n)
{
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = get_str(n, "type");
    if (!type) return qd_err_set(c->err, QD_EFORMAT, "%s: normalizer has no \"type\"", c->path);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(n, "normalizers"), *it;
        cJSON_ArrayForEach(it, list) {
            int rc = parse_normalizer(c, it);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        const char *p = get_str(n, "prepend");
        if (!p) return qd_err_set(c->err, QD_EFORMAT, "%s: normalizer Prepend has no \"prepend\" string", c->path);
        return add_norm(c, TOK_NORM_PREPEND, p, NULL);
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = get(n, "pattern");
        const char *s = get_str(pat, "String"), *to = get_str(n, "content");
        if (!s || !to)
            return qd_err_set(c->err, get(pat, "Regex") ? QD_EUNSUPPORTED : QD_EFORMAT,
                              "%s: normalizer Replace needs a {\"String\": ...} pattern and a \"content\" string", c->path);
        return add_norm(c, TOK_NORM_REPLACE, s, to);
    }
    if (!strcmp(type, "ByteLevel")) { c->t->byte_level = 1; return 0; }
    if (!strcmp(type, "NFC")) {
        /* Text that is already NFC (nearly all real text) is unchanged by it; composing
         * arbitrary input would need the Unicode tables, which we do not carry. */
        QD_LOG(QD_LOG_WARN, "tokenizer_nfc_ignored", "file=%s", c->path);
        return 0;
    }
    return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: normalizer type '%s' is not supported", c->path, type);
}

static int add_pre(json_ctx *c, tok_pre_step st)
{
    qd_tokenizer *t = c->t;
    tok_pre_step *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p) { tok_regex_free(st.re); return qd_err_set(c->err, QD_ENOMEM, "%s: out of memory", c->path); }
    t->pre = p;
    p[t->n_pre++] = st;
    return 0;
}

static int parse_pretok(json_ctx *c, const cJSON *n)
{
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = get_str(n, "type");
    if (!type) return qd_err_set(c->err, QD_EFORMAT, "%s: pre_tokenizer has no \"type\"", c->path);
    tok_pre_step st = {0};
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(n, "pretokenizers"), *it;
        cJSON_ArrayForEach(it, list) {
            int rc = parse_pretok(c, it);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = get(n, "pattern");
        const char *re = get_str(pat, "Regex"), *lit = get_str(pat, "String");
        const char *behavior = get_str(n, "behavior");
        if (!re && !lit) return qd_err_set(c->err, QD_EFORMAT, "%s: pre_tokenizer Split has no pattern", c->path);
        if ((behavior && strcmp(behavior, "Isolated")) || get_bool(n, "invert", 0))
            return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: pre_tokenizer Split with behavior '%s'%s is not supported "
                              "(only Isolated)", c->path, behavior ? behavior : "?", get_bool(n, "invert", 0) ? " and invert" : "");
        st.kind = TOK_PRE_SPLIT;
        st.re = tok_regex_compile(re ? re : lit, !re, c->err);
        if (!st.re) return qd_err_prefix(c->err, "%s", c->path);
        return add_pre(c, st);
    }
    if (!strcmp(type, "ByteLevel")) {
        st.kind = TOK_PRE_BYTELEVEL;
        st.add_prefix_space = get_bool(n, "add_prefix_space", 1);
        c->t->byte_level = 1;
        if (get_bool(n, "use_regex", 1)) {
            st.re = tok_regex_compile(tok_gpt2_pattern, 0, c->err);
            if (!st.re) return qd_err_prefix(c->err, "%s", c->path);
        }
        return add_pre(c, st);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = get_str(n, "replacement");
        if (rep && strcmp(rep, "\xE2\x96\x81"))
            return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: Metaspace replacement other than U+2581 is not supported", c->path);
        st.kind = TOK_PRE_METASPACE;
        const char *scheme = get_str(n, "prepend_scheme");
        if (scheme) st.prepend_scheme = !strcmp(scheme, "always") ? TOK_PREPEND_ALWAYS
                                      : !strcmp(scheme, "first") ? TOK_PREPEND_FIRST : TOK_PREPEND_NEVER;
        else st.prepend_scheme = get_bool(n, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        st.split = get_bool(n, "split", 1);
        return add_pre(c, st);
    }
    return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported", c->path, type);
}

/* The BOS a post-processor puts first, by token name; NULL when it adds none. */
static const char *postproc_bos(const cJSON *n)
{
    const char *type = get_str(n, "type");
    if (!type) return NULL;
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, get(n, "processors")) {
            const char *b = postproc_bos(it);
            if (b) return b;
        }
        return NULL;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *first = cJSON_GetArrayItem(get(n, "single"), 0);
        return get_str(get(first, "SpecialToken"), "id");
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetArrayItem(get(n, "cls"), 0);
        return cJSON_IsString(cls) ? cls->valuestring : NULL;
    }
    return NULL;
}

static int decoder_strips(const cJSON *n)
{
    const char *type = get_str(n, "type");
    if (!type) return 0;
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, get(n, "decoders")) if (decoder_strips(it)) return 1;
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        const cJSON *start = get(n, "start");
        const char *content = get_str(n, "content");
        return cJSON_IsNumber(start) && start->valueint >= 1 && content && !strcmp(content, " ");
    }
    if (!strcmp(type, "Metaspace")) {
        const char *scheme = get_str(n, "prepend_scheme");
        return scheme ? strcmp(scheme, "never") != 0 : get_bool(n, "add_prefix_space", 1);
    }
    return 0;
}

static int merge_lookup(json_ctx *c, size_t rank, const char *a, size_t la, const char *b, size_t lb,
                        char **scratch, size_t *scap)
{
    qd_tokenizer *t = c->t;
    if (la + lb + 1 > *scap) {
        size_t nc = (la + lb + 1) * 2;
        char *p = realloc(*scratch, nc);
        if (!p) return qd_err_set(c->err, QD_ENOMEM, "%s: out of memory", c->path);
        *scratch = p;
        *scap = nc;
    }
    memcpy(*scratch, a, la);
    memcpy(*scratch + la, b, lb);
    int32_t ia = tok_strmap_get(&t->vocab, a, la), ib = tok_strmap_get(&t->vocab, b, lb);
    int32_t im = tok_strmap_get(&t->vocab, *scratch, la + lb);
    if (ia < 0 || ib < 0 || im < 0)
        return qd_err_set(c->err, QD_EFORMAT, "%s: merges[%zu] '%.*s' + '%.*s': %s is not in the vocabulary",
                          c->path, rank, (int)la, a, (int)lb, b, ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the merged piece");
    if (tok_pairmap_put(&t->merges, ia, ib, (int32_t)rank, im))
        return qd_err_set(c->err, QD_ENOMEM, "%s: out of memory", c->path);
    return 0;
}

static int parse_merges(json_ctx *c, const cJSON *merges)
{
    if (merges && !cJSON_IsArray(merges))
        return qd_err_set(c->err, QD_EFORMAT, "%s: model.merges is not an array", c->path);
    size_t n = (size_t)cJSON_GetArraySize(merges), rank = 0, scap = 0;
    char *scratch = NULL;
    int rc = tok_pairmap_init(&c->t->merges, n);
    if (rc) return qd_err_set(c->err, rc, "%s: out of memory", c->path);
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = qd_err_set(c->err, QD_EFORMAT, "%s: merges[%zu] \"%.60s\" is not two pieces separated by one space",
                                c->path, rank, s);
                break;
            }
            rc = merge_lookup(c, rank, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), &scratch, &scap);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            const char *a = cJSON_GetArrayItem(m, 0)->valuestring, *b = cJSON_GetArrayItem(m, 1)->valuestring;
            rc = merge_lookup(c, rank, a, strlen(a), b, strlen(b), &scratch, &scap);
        } else {
            rc = qd_err_set(c->err, QD_EFORMAT, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", c->path, rank);
        }
        if (rc) break;
        rank++;
    }
    free(scratch);
    return rc;
}

static int load_model(json_ctx *c, const cJSON *root, qd_tokenizer **out)
{
    const cJSON *model = get(root, "model");
    if (!cJSON_IsObject(model)) return qd_err_set(c->err, QD_EFORMAT, "%s: no \"model\" object", c->path);
    const char *type = get_str(model, "type");
    if (type && strcmp(type, "BPE"))
        return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: model.type '%s' is not supported (only BPE)", c->path, type);
    const cJSON *vocab = get(model, "vocab"), *added = get(root, "added_tokens"), *it;
    if (!cJSON_IsObject(vocab)) return qd_err_set(c->err, QD_EFORMAT, "%s: model.vocab is not an object", c->path);
    const char *cont = get_str(model, "continuing_subword_prefix"), *suffix = get_str(model, "end_of_word_suffix");
    if ((cont && *cont) || (suffix && *suffix))
        return qd_err_set(c->err, QD_EUNSUPPORTED, "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", c->path);

    int32_t max_id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > TOK_MAX_ID)
            return qd_err_set(c->err, QD_EFORMAT, "%s: model.vocab[\"%.40s\"] is not a non-negative integer id", c->path, it->string);
        if (it->valueint > max_id) max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = get(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > TOK_MAX_ID || !get_str(it, "content"))
            return qd_err_set(c->err, QD_EFORMAT, "%s: added_tokens entry without a valid \"id\" and \"content\"", c->path);
        if (id->valueint > max_id) max_id = id->valueint;
    }
    int rc = tok_alloc(out, max_id + 1, c->err);
    if (rc) return rc;
    qd_tokenizer *t = c->t = *out;
    cJSON_ArrayForEach(it, vocab)
        if ((rc = tok_set_piece(t, it->valueint, it->string, strlen(it->string), c->err))) return rc;
    cJSON_ArrayForEach(it, added) {
        int32_t id = get(it, "id")->valueint;
        const char *content = get_str(it, "content");
        if ((rc = tok_set_piece(t, id, content, strlen(content), c->err))) return rc;
        if (get_bool(it, "special", 0) && (rc = tok_add_special(t, id, c->err))) return rc;
    }
    t->byte_fallback = get_bool(model, "byte_fallback", 0);
    t->fuse_unk = get_bool(model, "fuse_unk", 0);
    t->ignore_merges = get_bool(model, "ignore_merges", 0);
    if ((rc = parse_normalizer(c, get(root, "normalizer")))) return rc;
    if ((rc = parse_pretok(c, get(root, "pre_tokenizer")))) return rc;
    const cJSON *dec = get(root, "decoder");
    if (get_str(dec, "type") && !strcmp(get_str(dec, "type"), "ByteLevel")) t->byte_level = 1;
    t->decode_strip_space = !t->byte_level && decoder_strips(dec);
    if ((rc = tok_finalize(t, c->err))) return rc;
    if ((rc = parse_merges(c, get(model, "merges")))) return rc;

    const char *unk = get_str(model, "unk_token");
    if (unk) t->unk_id = tok_strmap_get(&t->vocab, unk, strlen(unk));
    const char *bos = postproc_bos(get(root, "post_processor"));
    if (bos) {
        t->bos_id = tok_strmap_get(&t->vocab, bos, strlen(bos));
        if (t->bos_id < 0)
            return qd_err_set(c->err, QD_EFORMAT, "%s: post_processor prepends '%s', which is not in the vocabulary", c->path, bos);
        t->add_bos = 1;
    }
    return 0;
}

int qd_tokenizer_load_json_text(const char *json, size_t len, const char *what, qd_tokenizer **out, qd_err *err)
{
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: not a valid JSON object", what);
    }
    json_ctx c = {NULL, what, err};
    int rc = load_model(&c, root, out);
    cJSON_Delete(root);
    if (rc) { qd_tokenizer_free(*out); *out = NULL; }
    return rc;
}

int tok_load_json(qd_tokenizer **out, const char *path, qd_err *err)
{
    cJSON *root = NULL;
    *out = NULL;
    int rc = qd_json_read_object(path, QD_INPUT_TOKENIZER, &root, err);
    if (rc) return rc;
    json_ctx c = {NULL, path, err};
    rc = load_model(&c, root, out);
    cJSON_Delete(root);
    if (rc) { qd_tokenizer_free(*out); *out = NULL; }
    return rc;
}
