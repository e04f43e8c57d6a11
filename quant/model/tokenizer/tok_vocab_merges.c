/* Loads the older GPT-2 layout: vocab.json (piece -> id) + merges.txt ("a b" per line, an
 * optional "#version" header, rank = line order). It is always byte-level BPE with GPT-2's
 * regex; add_prefix_space and the special tokens (bos/eos/unk/pad/...) come from
 * tokenizer_config.json and special_tokens_map.json beside it, as the HF slow tokenizer reads
 * them. Special tokens found in the text are matched before BPE, as that tokenizer does. */
#include "quant/model/tokenizer/tok_internal.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

static const char *special_keys[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                     "sep_token", "cls_token", "mask_token"};

static const char *token_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* Reads an optional JSON object file from dir; *out NULL when the file does not exist. */
static int read_opt_json(const char *dir, const char *name, cJSON **out, qd_err *err)
{
    char path[4096];
    *out = NULL;
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) return qd_err_set(err, QD_EINVAL, "%s: path too long", dir);
    if (!qd_input_exists(path)) return 0;
    return qd_json_read_object(path, QD_INPUT_JSON, out, err);
}

static int load_vocab(qd_tokenizer **out, const char *path, qd_err *err)
{
    cJSON *root = NULL;
    int rc = qd_json_read_object(path, QD_INPUT_TOKENIZER, &root, err);
    if (rc) return rc;
    const cJSON *it;
    int32_t max_id = -1;
    cJSON_ArrayForEach(it, root) {
        if (rc) break;
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX - 1)
            rc = qd_err_set(err, QD_EFORMAT, "%s: entry \"%.40s\" is not a non-negative integer id", path, it->string);
        else if (it->valueint > max_id) max_id = it->valueint;
    }
    if (!rc) rc = tok_alloc(out, max_id + 1, err);
    cJSON_ArrayForEach(it, root) {
        if (rc) break;
        rc = tok_set_piece(*out, it->valueint, it->string, strlen(it->string), err);
    }
    cJSON_Delete(root);
    return rc;
}

static int load_merges(qd_tokenizer *t, const char *path, qd_err *err)
{
    char *buf;
    size_t len;
    int rc = qd_input_read(path, QD_INPUT_TOKENIZER, &buf, &len, err);
    if (rc) return rc;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    rc = tok_pairmap_init(&t->merges, lines);
    char *scratch = NULL;
    size_t scap = 0, rank = 0, lineno = 0;
    for (char *p = buf; !rc && p < buf + len; lineno++) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        char *end = nl ? nl : buf + len;
        char *next = nl ? nl + 1 : buf + len;
        if (end > p && end[-1] == '\r') end--;
        if (end == p || (lineno == 0 && !strncmp(p, "#version", 8))) { p = next; continue; }
        char *sp = memchr(p, ' ', (size_t)(end - p));
        if (!sp || memchr(sp + 1, ' ', (size_t)(end - sp - 1))) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: line %zu is not two pieces separated by one space", path, lineno + 1);
            break;
        }
        size_t la = (size_t)(sp - p), lb = (size_t)(end - sp - 1);
        if (la + lb > scap) {
            scap = (la + lb) * 2;
            char *s2 = realloc(scratch, scap);
            if (!s2) { rc = QD_ENOMEM; break; }
            scratch = s2;
        }
        memcpy(scratch, p, la);
        memcpy(scratch + la, sp + 1, lb);
        int32_t ia = tok_strmap_get(&t->vocab, p, la), ib = tok_strmap_get(&t->vocab, sp + 1, lb);
        int32_t im = tok_strmap_get(&t->vocab, scratch, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: line %zu '%.*s': a part or the merged piece is not in vocab.json",
                            path, lineno + 1, (int)(end - p), p);
            break;
        }
        rc = tok_pairmap_put(&t->merges, ia, ib, (int32_t)rank++, im);
        p = next;
    }
    if (rc == QD_ENOMEM) qd_err_set(err, rc, "%s: out of memory", path);
    free(scratch);
    free(buf);
    return rc;
}

int tok_load_vocab_merges(qd_tokenizer **out, const char *vocab_path, const char *merges_path, qd_err *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", vocab_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    *out = NULL;
    cJSON *cfg = NULL, *map = NULL;
    int rc = read_opt_json(dir, "tokenizer_config.json", &cfg, err);
    if (!rc) rc = read_opt_json(dir, "special_tokens_map.json", &map, err);
    if (!rc) rc = load_vocab(out, vocab_path, err);
    qd_tokenizer *t = *out;
    if (!rc) {
        t->byte_level = 1;
        tok_pre_step st = {.kind = TOK_PRE_BYTELEVEL};
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(cfg, "add_prefix_space");
        st.add_prefix_space = cJSON_IsTrue(aps);
        st.re = tok_regex_compile(tok_gpt2_pattern, 0, err);
        t->pre = malloc(sizeof *t->pre);
        if (!st.re || !t->pre) {
            tok_regex_free(st.re);
            rc = st.re ? qd_err_set(err, QD_ENOMEM, "tokenizer: out of memory") : QD_EFORMAT;
        } else {
            t->pre[0] = st;
            t->n_pre = 1;
            rc = tok_finalize(t, err);
        }
    }
    /* Special tokens named in either config file take part in text matching. */
    for (size_t k = 0; !rc && k < sizeof special_keys / sizeof special_keys[0]; k++) {
        const char *names[2] = {token_name(cJSON_GetObjectItemCaseSensitive(cfg, special_keys[k])),
                                token_name(cJSON_GetObjectItemCaseSensitive(map, special_keys[k]))};
        for (int j = 0; j < 2 && !rc; j++) {
            int32_t id = names[j] ? tok_strmap_get(&t->vocab, names[j], strlen(names[j])) : -1;
            if (id < 0) continue;
            rc = tok_add_special(t, id, err);
            if (k == 2) t->unk_id = id;
        }
    }
    if (!rc) rc = tok_finalize(t, err);   /* re-index the specials just added */
    if (!rc) rc = load_merges(t, merges_path, err);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    if (rc) { qd_tokenizer_free(*out); *out = NULL; }
    return rc;
}
