/* Calibration sampling (see calib.h): reads the corpus, tokenizes document by document,
 * and draws GPTQ-style random windows or AWQ-style consecutive blocks of shuffled
 * documents. The generator is our own (splitmix64) so samples never depend on the C
 * library's rand(). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/rng.h"
#include "quant/model/calib.h"
#include "quant/model/token_file.h"

qd_calib_opts qd_calib_opts_default(void)
{
    qd_calib_opts o;
    memset(&o, 0, sizeof o);
    o.field = "text";
    o.style = QD_CALIB_GPTQ;
    o.n_samples = 128;
    o.seq_len = 2048;
    return o;
}

void qd_calib_free(qd_calib_set *s)
{
    if (!s) return;
    free(s->ids);
    s->ids = NULL;
}

/* Uniform in [0, range) without modulo bias (Lemire). */
static uint64_t uniform(uint64_t *s, uint64_t range)
{
    unsigned __int128 m = (unsigned __int128)qd_splitmix64(s) * range;
    uint64_t lo = (uint64_t)m;
    if (lo < range) {
        uint64_t t = (0 - range) % range;
        while (lo < t) {
            m = (unsigned __int128)qd_splitmix64(s) * range;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

int qd_calib_sample_random(const int32_t *ids, size_t n, int64_t n_samples, int64_t seq_len,
                           uint64_t seed, int32_t *out, qd_err *err)
{
    if (n_samples <= 0 || seq_len <= 0)
        return qd_err_set(err, QD_EINVAL, "calibration: n_samples %lld and seq_len %lld must be positive",
                          (long long)n_samples, (long long)seq_len);
    if (n < (size_t)seq_len + 1)
        return qd_err_set(err, QD_EINVAL, "calibration: the corpus has %zu tokens, fewer than seq_len %lld + 1 needed for one random window",
                          n, (long long)seq_len);
    uint64_t s = seed, range = (uint64_t)(n - (size_t)seq_len);   /* starts in [0, n - seq_len - 1] */
    for (int64_t i = 0; i < n_samples; i++) {
        uint64_t start = uniform(&s, range);
        memcpy(out + i * seq_len, ids + start, (size_t)seq_len * sizeof *ids);
    }
    return 0;
}

int qd_calib_sample_blocks(const int32_t *ids, size_t n, int64_t n_samples, int64_t seq_len,
                           int32_t *out, qd_err *err)
{
    if (n_samples <= 0 || seq_len <= 0)
        return qd_err_set(err, QD_EINVAL, "calibration: n_samples %lld and seq_len %lld must be positive",
                          (long long)n_samples, (long long)seq_len);
    if ((uint64_t)n < (uint64_t)n_samples * (uint64_t)seq_len)
        return qd_err_set(err, QD_EINVAL, "calibration: the corpus has %zu tokens, fewer than %lld blocks x %lld = %lld",
                          n, (long long)n_samples, (long long)seq_len, (long long)(n_samples * seq_len));
    memcpy(out, ids, (size_t)(n_samples * seq_len) * sizeof *ids);
    return 0;
}

typedef struct stream { int32_t *ids; size_t n, cap; int64_t docs; } stream;

static int stream_add(stream *s, const int32_t *ids, size_t n)
{
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n) cap *= 2;
        int32_t *p = realloc(s->ids, cap * sizeof *p);
        if (!p) return QD_ENOMEM;
        s->ids = p;
        s->cap = cap;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    s->n += n;
    return 0;
}

/* Tokenizes one document and appends it (AWQ: unless it is too long). */
static int add_doc(const qd_calib_opts *o, const qd_tokenizer *tok, const char *text, size_t len, stream *s, qd_err *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = qd_tokenizer_encode(tok, text, len, QD_TOK_BOS_DEFAULT, &ids, &n, err);
    if (rc) return rc;
    if (n > 0 && !(o->style == QD_CALIB_AWQ && o->max_doc_tokens > 0 && (int64_t)n > o->max_doc_tokens)) {
        if ((rc = stream_add(s, ids, n))) qd_err_set(err, rc, "calibration: out of memory");
        s->docs++;
    }
    free(ids);
    return rc;
}

static qd_calib_input detect(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (dot && !strcmp(dot, ".jsonl")) return QD_CALIB_INPUT_JSONL;
    if (dot && (!strcmp(dot, ".json") || !strcmp(dot, ".bin"))) return QD_CALIB_INPUT_TOKENS;
    return QD_CALIB_INPUT_TEXT;
}

/* One JSONL line: its bytes and its 1-based number (for messages). */
typedef struct jsonl_line { const char *p, *end; size_t no; } jsonl_line;

/* The non-blank lines of buf; *out owned by the caller (free). */
static int jsonl_lines(const char *buf, size_t len, jsonl_line **out, size_t *n_out)
{
    size_t n = 0, cap = 0, no = 0;
    jsonl_line *v = NULL;
    for (const char *p = buf; p < buf + len; no++) {
        const char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        const char *end = nl ? nl : buf + len;
        const char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < end) {
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                jsonl_line *w = realloc(v, cap * sizeof *w);
                if (!w) { free(v); return QD_ENOMEM; }
                v = w;
            }
            v[n++] = (jsonl_line){p, end, no + 1};
        }
        p = end + 1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

void qd_calib_shuffle_order(size_t n, uint64_t seed, size_t *order)
{
    for (size_t i = 0; i < n; i++) order[i] = i;
    uint64_t s = seed;
    for (size_t i = n; i > 1; i--) {   /* Fisher-Yates */
        size_t j = (size_t)uniform(&s, (uint64_t)i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

/* Tokenizes the documents (AWQ style: in the seed's shuffled order) until enough ids. */
static int read_jsonl(const qd_calib_opts *o, const qd_tokenizer *tok, const char *buf, size_t len, stream *s,
                      int64_t enough, qd_err *err)
{
    const char *field = o->field ? o->field : "text";
    jsonl_line *lines = NULL;
    size_t n = 0;
    if (jsonl_lines(buf, len, &lines, &n)) return qd_err_set(err, QD_ENOMEM, "calibration: out of memory");
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) { free(lines); return qd_err_set(err, QD_ENOMEM, "calibration: out of memory"); }
    if (o->style == QD_CALIB_AWQ) qd_calib_shuffle_order(n, o->seed, order);
    else for (size_t i = 0; i < n; i++) order[i] = i;
    int rc = 0;
    for (size_t i = 0; i < n && !rc && (enough <= 0 || (int64_t)s->n < enough); i++) {
        const jsonl_line *l = &lines[order[i]];
        cJSON *obj = cJSON_ParseWithLength(l->p, (size_t)(l->end - l->p));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, field);
        if (!cJSON_IsString(t))
            rc = qd_err_set(err, QD_EFORMAT, "%s: line %zu is not a JSON object with a \"%s\" string", o->path, l->no, field);
        else if ((rc = add_doc(o, tok, t->valuestring, strlen(t->valuestring), s, err)))
            qd_err_prefix(err, "%s: line %zu", o->path, l->no);
        cJSON_Delete(obj);
    }
    free(order);
    free(lines);
    return rc;
}

int qd_calib_load(const qd_calib_opts *o, const qd_tokenizer *tok, qd_calib_set *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    if (!o->path) return qd_err_set(err, QD_EINVAL, "calibration: no dataset path");
    if (o->n_samples <= 0 || o->seq_len <= 0)
        return qd_err_set(err, QD_EINVAL, "calibration: n_samples %lld and seq_len %lld must be positive",
                          (long long)o->n_samples, (long long)o->seq_len);
    int64_t L = o->seq_len;
    if (o->max_pos > 0 && L > o->max_pos) {
        QD_LOG(QD_LOG_WARN, "calibration seq_len clamped", "requested=%lld max_position_embeddings=%lld",
               (long long)L, (long long)o->max_pos);
        L = o->max_pos;
    }
    qd_calib_input in = o->input == QD_CALIB_INPUT_AUTO ? detect(o->path) : o->input;
    if (in != QD_CALIB_INPUT_TOKENS && !tok)
        return qd_err_set(err, QD_EINVAL, "%s: a tokenizer is needed for text calibration data", o->path);
    stream s = {0};
    int rc = 0;
    /* AWQ needs only the first n_samples * L tokens; stop tokenizing there. */
    int64_t enough = o->style == QD_CALIB_AWQ ? o->n_samples * L : 0;
    if (in == QD_CALIB_INPUT_TOKENS) {
        rc = qd_token_file_read(o->path, &s.ids, &s.n, err);
        s.docs = 1;
    } else {
        char *buf = NULL;
        size_t len = 0;
        if (!(rc = qd_input_read(o->path, QD_INPUT_TEXT, &buf, &len, err))) {
            if (in == QD_CALIB_INPUT_JSONL) rc = read_jsonl(o, tok, buf, len, &s, enough, err);
            else if ((rc = add_doc(o, tok, buf, len, &s, err))) qd_err_prefix(err, "%s", o->path);
        }
        free(buf);
    }
    if (rc) { free(s.ids); return rc; }
    out->ids = malloc((size_t)(o->n_samples * L) * sizeof *out->ids);
    if (!out->ids) { free(s.ids); return qd_err_set(err, QD_ENOMEM, "calibration: out of memory for %lld x %lld ids", (long long)o->n_samples, (long long)L); }
    if (o->style == QD_CALIB_AWQ) rc = qd_calib_sample_blocks(s.ids, s.n, o->n_samples, L, out->ids, err);
    else rc = qd_calib_sample_random(s.ids, s.n, o->n_samples, L, o->seed, out->ids, err);
    if (rc) {
        qd_err_prefix(err, "%s", o->path);
        free(out->ids);
        out->ids = NULL;
    } else {
        out->n_samples = o->n_samples;
        out->seq_len = L;
        out->corpus_tokens = (int64_t)s.n;
        out->docs = s.docs;
    }
    free(s.ids);
    return rc;
}
