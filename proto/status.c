/* Job status encodings (see status.h). One table lists each field once, with its kind and
 * group, and drives the hash encoding, the hash decoding and the event JSON both ways, so
 * the three can never disagree about a name. */
#include "proto/status.h"
#include "quant/job/jsonutil.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[] = { "queued", "running", "done", "failed", "cancelled" };
static const char *const event_names[] = { "state", "progress", "layer" };

const char *qp_state_name(qp_state s)
{
    return (unsigned)s < QP_STATE_COUNT_ ? state_names[s] : NULL;
}

int qp_state_parse(const char *s, qp_state *out)
{
    for (int i = 0; s && i < QP_STATE_COUNT_; i++)
        if (strcmp(s, state_names[i]) == 0) { *out = (qp_state)i; return 0; }
    return QP_EINVAL;
}

int qp_state_is_final(qp_state s)
{
    return s == QP_STATE_DONE || s == QP_STATE_FAILED || s == QP_STATE_CANCELLED;
}

int qp_state_can_move(qp_state from, qp_state to)
{
    if ((unsigned)from >= QP_STATE_COUNT_ || (unsigned)to >= QP_STATE_COUNT_) return 0;
    if (from == to) return 1;
    if (qp_state_is_final(from)) return to == QP_STATE_QUEUED;   /* resubmission */
    if (from == QP_STATE_QUEUED) return to != QP_STATE_DONE;     /* nothing finishes unrun */
    return 1;                                                    /* running -> anything */
}

const char *qp_event_type_name(qp_event_type t)
{
    return (unsigned)t < 3 ? event_names[t] : NULL;
}

void qp_status_init(qp_status *st)
{
    memset(st, 0, sizeof *st);
    st->state = QP_STATE_QUEUED;
    st->block = -1;
    st->eta_s = -1;
    st->layer_error = -1;
}

/* K_REPORT: JSON text of an object; K_ARRAY: of an array. */
enum kind { K_STR, K_INT, K_I64, K_DBL, K_STATE, K_REPORT, K_ARRAY };

typedef struct field_def {
    const char *name;
    enum kind kind;
    size_t off;
    unsigned group;       /* 0 = always written */
} field_def;

#define F(name, kind, member, group) { name, kind, offsetof(qp_status, member), group }
static const field_def fields[] = {
    F("id", K_STR, id, 0),
    F("state", K_STATE, state, QP_SF_STATE),
    F("attempts", K_INT, attempts, QP_SF_STATE),
    F("estimate", K_REPORT, estimate, QP_SF_STATE),
    F("stage", K_STR, stage, QP_SF_PROGRESS),
    F("block", K_INT, block, QP_SF_PROGRESS),
    F("blocks", K_INT, n_blocks, QP_SF_PROGRESS),
    F("layer", K_STR, layer, QP_SF_PROGRESS),
    F("progress", K_DBL, progress, QP_SF_PROGRESS),
    F("eta_s", K_DBL, eta_s, QP_SF_PROGRESS),
    F("layer_error", K_DBL, layer_error, QP_SF_PROGRESS),
    F("last_block", K_REPORT, last_block, QP_SF_PROGRESS),
    F("node", K_STR, node, QP_SF_PLACE),
    F("worker", K_STR, worker, QP_SF_PLACE),
    F("error", K_STR, error, QP_SF_RESULT),
    F("output", K_STR, output, QP_SF_RESULT),
    F("report", K_REPORT, report, QP_SF_RESULT),
    F("submitted_ms", K_I64, submitted_ms, QP_SF_TIMES),
    F("started_ms", K_I64, started_ms, QP_SF_TIMES),
    F("updated_ms", K_I64, updated_ms, 0),
    F("finished_ms", K_I64, finished_ms, QP_SF_TIMES),
    F("parts", K_ARRAY, parts, QP_SF_PARTS),
};
#define NFIELDS (sizeof fields / sizeof fields[0])
_Static_assert(NFIELDS + 1 <= QP_STATUS_MAX_FIELDS, "qp_fields too small for the status table");

/* Fields held as owned strings (plain, or JSON text). */
static int is_text(const field_def *f) { return f->kind == K_STR || f->kind == K_REPORT || f->kind == K_ARRAY; }

#define MEMBER(st, f, type) ((type *)((char *)(st) + (f)->off))
#define CMEMBER(st, f, type) ((const type *)((const char *)(st) + (f)->off))

void qp_status_clear(qp_status *st)
{
    if (!st) return;
    for (size_t i = 0; i < NFIELDS; i++)
        if (is_text(&fields[i])) free(*MEMBER(st, &fields[i], char *));
    qp_status_init(st);
}

int qp_status_set_str(char **field, const char *value)
{
    char *s = NULL;
    if (value && !(s = strdup(value))) return QP_ENOMEM;
    free(*field);
    *field = s;
    return 0;
}

int qp_status_copy(qp_status *dst, const qp_status *src)
{
    *dst = *src;
    for (size_t i = 0; i < NFIELDS; i++)
        if (is_text(&fields[i])) *MEMBER(dst, &fields[i], char *) = NULL;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (!is_text(&fields[i])) continue;
        const char *s = *CMEMBER(src, &fields[i], char *);
        if (s && !(*MEMBER(dst, &fields[i], char *) = strdup(s))) {
            qp_status_clear(dst);
            return QP_ENOMEM;
        }
    }
    return 0;
}

/* A K_REPORT field must be a JSON object, a K_ARRAY one an array; returns its compact form
 * (malloc'd) or NULL. */
static char *json_compact(const char *s, enum kind kind)
{
    cJSON *o = cJSON_Parse(s);
    char *out = (kind == K_ARRAY ? cJSON_IsArray(o) : cJSON_IsObject(o)) ? qpj_print(o, 0) : NULL;
    cJSON_Delete(o);
    return out;
}

static int check_encodable(const qp_status *st, qp_err *err)
{
    if (!qpj_name_valid(st->id, 64))
        return qp_err_set(err, QP_EINVAL, "status.id: \"%s\" is not a valid job id", st->id ? st->id : "(null)");
    if (!qp_state_name(st->state))
        return qp_err_set(err, QP_EINVAL, "status.state: invalid value %d", (int)st->state);
    return 0;
}

int qp_status_to_fields(const qp_status *st, unsigned which, qp_fields *out, qp_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_encodable(st, err);
    if (rc) return rc;
    char buf[64];
    out->name[0] = "v";
    snprintf(buf, sizeof buf, "%d", QP_STATUS_VERSION);
    if (!(out->value[0] = strdup(buf))) return qp_err_set(err, QP_ENOMEM, "status: out of memory");
    out->n = 1;
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_def *f = &fields[i];
        if (f->group && !(f->group & which)) continue;
        char *v = NULL;
        switch (f->kind) {
        case K_STR: v = strdup(*CMEMBER(st, f, char *) ? *CMEMBER(st, f, char *) : ""); break;
        case K_REPORT:
        case K_ARRAY: {
            const char *r = *CMEMBER(st, f, char *);
            if (r && !(v = json_compact(r, f->kind))) {
                qp_fields_free(out);
                return qp_err_set(err, QP_EFORMAT, "status.%s: must be a JSON %s", f->name,
                                  f->kind == K_ARRAY ? "array" : "object");
            }
            if (!r) v = strdup("");
            break;
        }
        case K_INT: snprintf(buf, sizeof buf, "%d", *CMEMBER(st, f, int)); v = strdup(buf); break;
        case K_I64: snprintf(buf, sizeof buf, "%" PRId64, *CMEMBER(st, f, int64_t)); v = strdup(buf); break;
        case K_DBL: v = strdup(qpj_fmt_double(*CMEMBER(st, f, double), buf)); break;
        case K_STATE: v = strdup(qp_state_name(*CMEMBER(st, f, qp_state))); break;
        }
        if (!v) {
            qp_fields_free(out);
            return qp_err_set(err, QP_ENOMEM, "status: out of memory");
        }
        out->name[out->n] = f->name;
        out->value[out->n++] = v;
    }
    return 0;
}

void qp_fields_free(qp_fields *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->value[i]);
    memset(f, 0, sizeof *f);
}

static const field_def *find_field(const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (strcmp(fields[i].name, name) == 0) return &fields[i];
    return NULL;
}

static int parse_i64(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int version_check(int64_t v, const char *path, qp_err *err)
{
    if (v < 1)
        return qp_err_set(err, QP_EFORMAT, "%s: %lld is not a valid version", path, (long long)v);
    if (v > QP_STATUS_VERSION)
        return qp_err_set(err, QP_EUNSUPPORTED, "%s: version %lld is newer than this build reads (%d)",
                          path, (long long)v, QP_STATUS_VERSION);
    return 0;
}

int qp_status_set_field(qp_status *st, const char *name, const char *value, qp_err *err)
{
    if (!name || !value) return qp_err_set(err, QP_EINVAL, "status: NULL field name or value");
    if (strcmp(name, "v") == 0) {
        int64_t v;
        if (parse_i64(value, &v)) return qp_err_set(err, QP_EFORMAT, "status.v: \"%.40s\" is not a number", value);
        return version_check(v, "status.v", err);
    }
    const field_def *f = find_field(name);
    if (!f) return 0;   /* a newer writer's field, or "spec": not ours to interpret */
    int64_t iv;
    char *end = NULL;
    switch (f->kind) {
    case K_STR:
    case K_REPORT:
    case K_ARRAY:
        if (qp_status_set_str(MEMBER(st, f, char *), value[0] ? value : NULL))
            return qp_err_set(err, QP_ENOMEM, "status.%s: out of memory", name);
        return 0;
    case K_INT:
        if (parse_i64(value, &iv) || iv < -2147483647 - 1 || iv > 2147483647)
            return qp_err_set(err, QP_EFORMAT, "status.%s: \"%.40s\" is not an integer", name, value);
        *MEMBER(st, f, int) = (int)iv;
        return 0;
    case K_I64:
        if (parse_i64(value, &iv))
            return qp_err_set(err, QP_EFORMAT, "status.%s: \"%.40s\" is not an integer", name, value);
        *MEMBER(st, f, int64_t) = iv;
        return 0;
    case K_DBL: {
        double d = strtod(value, &end);
        if (end == value || *end || !isfinite(d))
            return qp_err_set(err, QP_EFORMAT, "status.%s: \"%.40s\" is not a number", name, value);
        *MEMBER(st, f, double) = d;
        return 0;
    }
    case K_STATE:
        if (qp_state_parse(value, MEMBER(st, f, qp_state)))
            return qp_err_set(err, QP_EFORMAT, "status.state: \"%.40s\" is not one of queued, running, done, failed, cancelled",
                              value);
        return 0;
    }
    return 0;
}

int qp_status_from_fields(qp_status *st, const char *const *kv, size_t n_strings, qp_err *err)
{
    if (n_strings % 2)
        return qp_err_set(err, QP_EINVAL, "status: %zu strings do not make name/value pairs", n_strings);
    for (size_t i = 0; i < n_strings; i += 2) {
        int rc = qp_status_set_field(st, kv[i], kv[i + 1], err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- event JSON ----------------------------------------------------------- */

cJSON *qp_status_to_event_cjson(const qp_status *st, qp_event_type type)
{
    if (check_encodable(st, NULL) || !qp_event_type_name(type)) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int rc = qpj_add_num(o, "v", QP_STATUS_VERSION) | qpj_add_str(o, "type", qp_event_type_name(type));
    for (size_t i = 0; i < NFIELDS && !rc; i++) {
        const field_def *f = &fields[i];
        switch (f->kind) {
        case K_STR: {
            const char *s = *CMEMBER(st, f, char *);
            if (s) rc |= qpj_add_str(o, f->name, s);
            break;
        }
        case K_REPORT:
        case K_ARRAY: {
            const char *s = *CMEMBER(st, f, char *);
            if (!s) break;
            cJSON *r = cJSON_Parse(s);
            int ok = f->kind == K_ARRAY ? cJSON_IsArray(r) : cJSON_IsObject(r);
            if (!ok || !cJSON_AddItemToObject(o, f->name, r)) { cJSON_Delete(r); rc = QP_EFORMAT; }
            break;
        }
        case K_INT: rc |= qpj_add_num(o, f->name, *CMEMBER(st, f, int)); break;
        case K_I64: rc |= qpj_add_num(o, f->name, (double)*CMEMBER(st, f, int64_t)); break;
        case K_DBL: rc |= qpj_add_num(o, f->name, *CMEMBER(st, f, double)); break;
        case K_STATE: rc |= qpj_add_str(o, f->name, qp_state_name(*CMEMBER(st, f, qp_state))); break;
        }
    }
    if (rc) { cJSON_Delete(o); return NULL; }
    return o;
}

char *qp_status_to_event(const qp_status *st, qp_event_type type)
{
    cJSON *o = qp_status_to_event_cjson(st, type);
    char *s = o ? qpj_print(o, 0) : NULL;
    cJSON_Delete(o);
    return s;
}

int qp_status_from_event_cjson(qp_status *st, qp_event_type *type, const cJSON *o, qp_err *err)
{
    qp_status_init(st);
    char desc[64];
    if (!cJSON_IsObject(o))
        return qp_err_set(err, QP_EFORMAT, "event: expected a JSON object, got %s", qpj_describe(o, desc, sizeof desc));
    int64_t v = 0;
    int present = 0, rc;
    if ((rc = qpj_get_int(o, "event", "v", 1, 1000000, "must be a positive integer", &v, &present, err))) return rc;
    if (!present) return qp_err_set(err, QP_EFORMAT, "event.v: missing");
    if ((rc = version_check(v, "event.v", err))) return rc;
    const cJSON *t = qpj_field(o, "type");
    int ti = -1;
    for (int i = 0; cJSON_IsString(t) && i < 3; i++)
        if (strcmp(t->valuestring, event_names[i]) == 0) ti = i;
    if (ti < 0)
        return qp_err_set(err, QP_EFORMAT, "event.type: must be one of state, progress, layer, got %s",
                          qpj_describe(t, desc, sizeof desc));
    if (type) *type = (qp_event_type)ti;
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_def *f = &fields[i];
        const cJSON *x = qpj_field(o, f->name);
        if (!x) continue;
        switch (f->kind) {
        case K_STR:
            rc = qpj_get_str(o, "event", f->name, 1, MEMBER(st, f, char *), NULL, err);
            break;
        case K_REPORT:
        case K_ARRAY: {
            if (f->kind == K_ARRAY ? !cJSON_IsArray(x) : !cJSON_IsObject(x)) {
                rc = qp_err_set(err, QP_EFORMAT, "event.%s: must be an %s, got %s", f->name,
                                f->kind == K_ARRAY ? "array" : "object", qpj_describe(x, desc, sizeof desc));
                break;
            }
            char *s = qpj_print_copy(x);
            if (!s) { rc = qp_err_set(err, QP_ENOMEM, "event.%s: out of memory", f->name); break; }
            free(*MEMBER(st, f, char *));
            *MEMBER(st, f, char *) = s;
            break;
        }
        case K_INT: {
            int64_t iv = 0;
            rc = qpj_get_int(o, "event", f->name, -2147483647 - 1, 2147483647, "must be an integer", &iv, NULL, err);
            if (!rc) *MEMBER(st, f, int) = (int)iv;
            break;
        }
        case K_I64:
            rc = qpj_get_int(o, "event", f->name, -QPJ_INT_MAX, QPJ_INT_MAX, "must be an integer",
                             MEMBER(st, f, int64_t), NULL, err);
            break;
        case K_DBL:
            rc = qpj_get_double(o, "event", f->name, "must be a number", MEMBER(st, f, double), NULL, err);
            break;
        case K_STATE:
            if (!cJSON_IsString(x) || qp_state_parse(x->valuestring, MEMBER(st, f, qp_state)))
                rc = qp_err_set(err, QP_EFORMAT, "event.state: must be one of queued, running, done, failed, cancelled, got %s",
                                qpj_describe(x, desc, sizeof desc));
            break;
        }
        if (rc) {
            qp_status_clear(st);
            return rc;
        }
    }
    if (!st->id) {
        qp_status_clear(st);
        return qp_err_set(err, QP_EFORMAT, "event.id: missing");
    }
    return 0;
}

int qp_status_from_event(qp_status *st, qp_event_type *type, const char *json, size_t len, qp_err *err)
{
    qp_status_init(st);
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!o) return qp_err_set(err, QP_EFORMAT, "event: invalid JSON");
    int rc = qp_status_from_event_cjson(st, type, o, err);
    cJSON_Delete(o);
    return rc;
}
