/* quantctl tokenize: encode a text file with a model's tokenizer and write the ids.
 *
 *   quantctl tokenize --model DIR --text FILE [--bos|--no-bos] [--jsonl] --out ids.json
 *
 * DIR holds tokenizer.json, or vocab.json + merges.txt, or tokenizer.model (a path to one of
 * those files also works). --jsonl reads FILE as one {"text": ...} document per line and
 * encodes each separately (BOS per document as configured), concatenated in file order — the
 * way the C4 calibration/eval streams are built. --out ending in .bin writes raw uint32 LE.
 * On success one JSON summary line goes to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/quantctl.h"
#include "quant/core/clock.h"
#include "quant/model/token_file.h"
#include "quant/model/tokenizer/tokenizer.h"
#include "quant/core/fsutil.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl tokenize --model DIR --text FILE [--bos|--no-bos] [--jsonl] --out IDS.json|IDS.bin\n"
               "  --model DIR   directory with tokenizer.json, vocab.json+merges.txt or tokenizer.model\n"
               "  --text FILE   UTF-8 text to encode (--jsonl: one {\"text\": ...} document per line)\n"
               "  --bos/--no-bos  force BOS on or off (default: as the tokenizer config says)\n"
               "  --out FILE    ids as a JSON array, or raw uint32 LE when the name ends in .bin\n");
}

static int append(int32_t **all, size_t *n, size_t *cap, const int32_t *ids, size_t k)
{
    if (*n + k > *cap) {
        size_t nc = *cap ? *cap : 1024;
        while (nc < *n + k) nc *= 2;
        int32_t *p = realloc(*all, nc * sizeof *p);
        if (!p) return -1;
        *all = p;
        *cap = nc;
    }
    memcpy(*all + *n, ids, k * sizeof *ids);
    *n += k;
    return 0;
}

/* Encodes each line's "text"; returns 0, or a qd status with err filled. */
static int encode_jsonl(const qd_tokenizer *tok, const char *path, const char *buf, size_t len, int bos,
                        int32_t **all, size_t *n_all, size_t *docs, qd_err *err)
{
    size_t cap = 0, line = 0;
    for (const char *p = buf; p < buf + len; line++) {
        const char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        const char *end = nl ? nl : buf + len;
        const char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < end) {
            cJSON *o = cJSON_ParseWithLength(p, (size_t)(end - p));
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
            if (!cJSON_IsString(t)) {
                cJSON_Delete(o);
                return qd_err_set(err, QD_EFORMAT, "%s: line %zu is not a JSON object with a \"text\" string", path, line + 1);
            }
            int32_t *ids;
            size_t n;
            int rc = qd_tokenizer_encode(tok, t->valuestring, strlen(t->valuestring), bos, &ids, &n, err);
            cJSON_Delete(o);
            if (rc) return qd_err_prefix(err, "%s: line %zu", path, line + 1);
            rc = append(all, n_all, &cap, ids, n);
            free(ids);
            if (rc) return qd_err_set(err, QD_ENOMEM, "out of memory");
            (*docs)++;
        }
        p = nl ? nl + 1 : buf + len;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *model = NULL, *text = NULL, *out = NULL;
    int bos = QD_TOK_BOS_DEFAULT, jsonl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return QCTL_OK; }
        else if (!strcmp(a, "--bos")) bos = QD_TOK_BOS_ON;
        else if (!strcmp(a, "--no-bos")) bos = QD_TOK_BOS_OFF;
        else if (!strcmp(a, "--jsonl")) jsonl = 1;
        else if ((!strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--out")) && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(a, "--model")) model = v; else if (!strcmp(a, "--text")) text = v; else out = v;
        } else {
            fprintf(stderr, "quantctl tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return QCTL_USAGE;
        }
    }
    if (!model || !text || !out) {
        fprintf(stderr, "quantctl tokenize: --model, --text and --out are required\n");
        usage(stderr);
        return QCTL_USAGE;
    }

    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    struct stat st;
    int rc = stat(model, &st) == 0 && !S_ISDIR(st.st_mode) ? qd_tokenizer_load_file(model, &tok, &err)
                                                             : qd_tokenizer_load(model, &tok, &err);
    if (rc) {
        fprintf(stderr, "quantctl tokenize: %s\n", err.msg);
        return rc == QD_ENOMEM ? QCTL_FAIL : QCTL_USAGE;
    }
    char *buf = NULL;
    size_t len = 0;
    if ((rc = qd_fs_read_file(text, &buf, &len, &err))) {
        fprintf(stderr, "quantctl tokenize: %s\n", err.msg);
        qd_tokenizer_free(tok);
        return QCTL_USAGE;
    }
    double t0 = qd_clock_now_s();
    int32_t *ids = NULL;
    size_t n = 0, docs = 1;
    if (jsonl) {
        docs = 0;
        rc = encode_jsonl(tok, text, buf, len, bos, &ids, &n, &docs, &err);
    } else {
        rc = qd_tokenizer_encode(tok, buf, len, bos, &ids, &n, &err);
    }
    double secs = qd_clock_now_s() - t0;
    int status = QCTL_OK;
    if (rc) {
        fprintf(stderr, "quantctl tokenize: %s\n", err.msg);
        status = rc == QD_EFORMAT || rc == QD_EINVAL ? QCTL_USAGE : QCTL_FAIL;
    } else {
        size_t ol = strlen(out);
        rc = ol > 4 && !strcmp(out + ol - 4, ".bin") ? qd_token_file_write_bin(out, ids ? ids : (int32_t[1]){0}, n, &err)
                                                      : qd_token_file_write_json(out, ids, n, &err);
        if (rc) {
            fprintf(stderr, "quantctl tokenize: %s\n", err.msg);
            status = QCTL_FAIL;
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "tokens", (double)n);
            cJSON_AddNumberToObject(o, "seconds", secs);
            cJSON_AddNumberToObject(o, "bytes", (double)len);
            cJSON_AddNumberToObject(o, "documents", (double)docs);
            cJSON_AddStringToObject(o, "tokenizer", qd_tokenizer_kind(tok));
            cJSON_AddNumberToObject(o, "vocab_size", qd_tokenizer_vocab_size(tok));
            cJSON_AddStringToObject(o, "out", out);
            char *s = cJSON_PrintUnformatted(o);
            if (s) printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        }
    }
    free(ids);
    free(buf);
    qd_tokenizer_free(tok);
    return status;
}
