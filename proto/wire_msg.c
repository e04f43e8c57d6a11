/* Wire messages <-> JSON payloads. One table lists every field of every message type with
 * its kind, so encoding, decoding and the required-field checks share a single source; the
 * range rules that a table cannot say live in qp_msg_validate. */
#include "proto/wire.h"
#include "quant/job/jsonutil.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[QP_MSG_COUNT_] = {
    NULL, "hello", "task", "progress", "block_done", "task_done", "task_failed", "heartbeat",
    "cancel", "shutdown", "parts", "part", "part_done", "parts_done", "part_stop",
};

const char *const qp_part_steps[] = { "quantize", "factor", "capture", NULL };

const char *qp_msg_type_name(qp_msg_type t)
{
    return (unsigned)t < QP_MSG_COUNT_ ? type_names[t] : NULL;
}

enum kind {
    K_STR,      /* char * */
    K_OBJ,      /* char * holding a JSON object, embedded as an object on the wire */
    K_INT,      /* int */
    K_I64,      /* int64_t */
    K_U64,      /* uint64_t, at most 2^53 - 1 */
    K_DBL,      /* double */
    K_BOOL,     /* int */
    K_BLOCK,    /* int: an index, or QP_TASK_WHOLE_JOB written as "all" */
    K_STRV,     /* qp_strv: an array of strings */
};

typedef struct field_def {
    qp_msg_type type;
    const char *name;
    enum kind kind;
    size_t off;
    int required;
} field_def;

#define F(t, member, field, kind, req) { t, #field, kind, offsetof(qp_msg, member.field), req }
static const field_def fields[] = {
    F(QP_MSG_HELLO, hello, worker, K_STR, 1),
    F(QP_MSG_HELLO, hello, pid, K_I64, 0),
    F(QP_MSG_HELLO, hello, backend, K_STR, 1),
    F(QP_MSG_HELLO, hello, device, K_STR, 0),
    F(QP_MSG_HELLO, hello, protocol, K_INT, 1),
    F(QP_MSG_HELLO, hello, selftest_ok, K_BOOL, 1),
    F(QP_MSG_HELLO, hello, selftest, K_STR, 0),
    F(QP_MSG_TASK, task, job_id, K_STR, 1),
    F(QP_MSG_TASK, task, job, K_OBJ, 1),
    F(QP_MSG_TASK, task, block, K_BLOCK, 1),
    F(QP_MSG_TASK, task, checkpoint_dir, K_STR, 1),
    F(QP_MSG_TASK, task, fence, K_U64, 1),
    F(QP_MSG_TASK, task, fanout, K_BOOL, 0),
    F(QP_MSG_PROGRESS, progress, job_id, K_STR, 1),
    F(QP_MSG_PROGRESS, progress, stage, K_STR, 1),
    F(QP_MSG_PROGRESS, progress, block, K_INT, 0),
    F(QP_MSG_PROGRESS, progress, n_blocks, K_INT, 0),
    F(QP_MSG_PROGRESS, progress, layer, K_STR, 0),
    F(QP_MSG_PROGRESS, progress, fraction, K_DBL, 1),
    F(QP_MSG_PROGRESS, progress, eta_s, K_DBL, 0),
    F(QP_MSG_PROGRESS, progress, layer_error, K_DBL, 0),
    F(QP_MSG_BLOCK_DONE, block_done, job_id, K_STR, 1),
    F(QP_MSG_BLOCK_DONE, block_done, block, K_INT, 1),
    F(QP_MSG_BLOCK_DONE, block_done, n_blocks, K_INT, 1),
    F(QP_MSG_BLOCK_DONE, block_done, seconds, K_DBL, 0),
    F(QP_MSG_BLOCK_DONE, block_done, fence, K_U64, 1),
    F(QP_MSG_BLOCK_DONE, block_done, cost, K_OBJ, 0),
    F(QP_MSG_TASK_DONE, task_done, job_id, K_STR, 1),
    F(QP_MSG_TASK_DONE, task_done, job_finished, K_BOOL, 1),
    F(QP_MSG_TASK_DONE, task_done, output, K_STR, 0),
    F(QP_MSG_TASK_DONE, task_done, report, K_OBJ, 0),
    F(QP_MSG_TASK_FAILED, task_failed, job_id, K_STR, 1),
    F(QP_MSG_TASK_FAILED, task_failed, error, K_STR, 1),
    F(QP_MSG_TASK_FAILED, task_failed, code, K_INT, 0),
    F(QP_MSG_TASK_FAILED, task_failed, retryable, K_BOOL, 1),
    F(QP_MSG_TASK_FAILED, task_failed, cancelled, K_BOOL, 0),
    F(QP_MSG_TASK_FAILED, task_failed, exiting, K_BOOL, 0),
    F(QP_MSG_HEARTBEAT, heartbeat, t_ms, K_I64, 1),
    F(QP_MSG_HEARTBEAT, heartbeat, job_id, K_STR, 0),
    F(QP_MSG_HEARTBEAT, heartbeat, rss_bytes, K_I64, 0),
    F(QP_MSG_CANCEL, cancel, job_id, K_STR, 1),
    F(QP_MSG_CANCEL, cancel, reason, K_STR, 0),
    F(QP_MSG_SHUTDOWN, shutdown, graceful, K_BOOL, 1),
    F(QP_MSG_PARTS, parts, job_id, K_STR, 1),
    F(QP_MSG_PARTS, parts, block, K_INT, 1),
    F(QP_MSG_PARTS, parts, step, K_STR, 1),
    F(QP_MSG_PARTS, parts, n, K_INT, 1),
    F(QP_MSG_PARTS, parts, names, K_STRV, 0),
    F(QP_MSG_PARTS, parts, fence, K_U64, 1),
    F(QP_MSG_PART, part, job_id, K_STR, 1),
    F(QP_MSG_PART, part, job, K_OBJ, 1),
    F(QP_MSG_PART, part, checkpoint_dir, K_STR, 1),
    F(QP_MSG_PART, part, block, K_INT, 1),
    F(QP_MSG_PART, part, step, K_STR, 1),
    F(QP_MSG_PART, part, index, K_INT, 1),
    F(QP_MSG_PART, part, fence, K_U64, 1),
    F(QP_MSG_PART_DONE, part_done, job_id, K_STR, 1),
    F(QP_MSG_PART_DONE, part_done, block, K_INT, 1),
    F(QP_MSG_PART_DONE, part_done, step, K_STR, 1),
    F(QP_MSG_PART_DONE, part_done, index, K_INT, 1),
    F(QP_MSG_PART_DONE, part_done, ok, K_BOOL, 1),
    F(QP_MSG_PART_DONE, part_done, error, K_STR, 0),
    F(QP_MSG_PART_DONE, part_done, seconds, K_DBL, 0),
    F(QP_MSG_PARTS_DONE, parts_done, job_id, K_STR, 1),
    F(QP_MSG_PARTS_DONE, parts_done, block, K_INT, 1),
    F(QP_MSG_PARTS_DONE, parts_done, step, K_STR, 1),
    F(QP_MSG_PART_STOP, part_stop, job_id, K_STR, 1),
    F(QP_MSG_PART_STOP, part_stop, block, K_INT, 1),
    F(QP_MSG_PART_STOP, part_stop, step, K_STR, 1),
    F(QP_MSG_PART_STOP, part_stop, index, K_INT, 1),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

#define AT(m, f, type) ((type *)((char *)(m) + (f)->off))
#define CAT(m, f, type) ((const type *)((const char *)(m) + (f)->off))

void qp_msg_init(qp_msg *m, qp_msg_type type)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    switch (type) {
    case QP_MSG_HELLO: m->hello.protocol = QP_WIRE_VERSION; break;
    case QP_MSG_TASK: m->task.block = QP_TASK_WHOLE_JOB; break;
    case QP_MSG_PROGRESS:
        m->progress.block = -1;
        m->progress.eta_s = -1;
        m->progress.layer_error = -1;
        break;
    default: break;
    }
}

static void strv_free(qp_strv *sv)
{
    for (int i = 0; sv->v && i < sv->n; i++) free(sv->v[i]);
    free(sv->v);
    sv->v = NULL;
    sv->n = 0;
}

void qp_msg_clear(qp_msg *m)
{
    if (!m) return;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (fields[i].type != m->type) continue;
        if (fields[i].kind == K_STR || fields[i].kind == K_OBJ) free(*AT(m, &fields[i], char *));
        if (fields[i].kind == K_STRV) strv_free(AT(m, &fields[i], qp_strv));
    }
    memset(m, 0, sizeof *m);
}

static int step_known(const char *s)
{
    for (size_t i = 0; s && qp_part_steps[i]; i++)
        if (!strcmp(s, qp_part_steps[i])) return 1;
    return 0;
}

/* The rules the four parts messages share: a block index and a step this build knows. */
static int validate_part_common(const char *tn, int block, const char *step, qp_err *err)
{
    if (block < 0) return qp_err_set(err, QP_EINVAL, "wire.%s.block: must be a block index >= 0, got %d", tn, block);
    if (!step_known(step))
        return qp_err_set(err, QP_EINVAL, "wire.%s.step: \"%.40s\" is not a step that runs as parts (quantize, factor)", tn,
                          step ? step : "");
    return 0;
}

static int validate_index(const char *tn, int index, qp_err *err)
{
    if (index < 0 || index >= QP_PARTS_MAX)
        return qp_err_set(err, QP_EINVAL, "wire.%s.index: must be in [0, %d), got %d", tn, QP_PARTS_MAX, index);
    return 0;
}

static int is_object_text(const char *s)
{
    cJSON *o = cJSON_Parse(s);
    int ok = cJSON_IsObject(o);
    cJSON_Delete(o);
    return ok;
}

int qp_msg_validate(const qp_msg *m, qp_err *err)
{
    const char *tn = qp_msg_type_name(m->type);
    if (!tn || m->type == QP_MSG_NONE) return qp_err_set(err, QP_EINVAL, "wire: message type %d is not valid", (int)m->type);
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_def *f = &fields[i];
        if (f->type != m->type) continue;
        if ((f->kind == K_STR || f->kind == K_OBJ)) {
            const char *s = *CAT(m, f, char *);
            if (f->required && (!s || !s[0]))
                return qp_err_set(err, QP_EINVAL, "wire.%s.%s: required", tn, f->name);
            if (s && f->kind == K_OBJ && !is_object_text(s))
                return qp_err_set(err, QP_EINVAL, "wire.%s.%s: must be a JSON object", tn, f->name);
            if (s && strcmp(f->name, "job_id") == 0 && !qpj_name_valid(s, 64))
                return qp_err_set(err, QP_EINVAL, "wire.%s.job_id: \"%.80s\" is not a valid job id", tn, s);
        }
        if (f->kind == K_DBL && !isfinite(*CAT(m, f, double)))
            return qp_err_set(err, QP_EINVAL, "wire.%s.%s: must be a finite number", tn, f->name);
        if (f->kind == K_U64 && *CAT(m, f, uint64_t) > (uint64_t)QPJ_INT_MAX)
            return qp_err_set(err, QP_EINVAL, "wire.%s.%s: must be at most 2^53 - 1", tn, f->name);
    }
    switch (m->type) {
    case QP_MSG_HELLO:
        if (m->hello.pid < 0) return qp_err_set(err, QP_EINVAL, "wire.hello.pid: must not be negative");
        if (m->hello.protocol < 1) return qp_err_set(err, QP_EINVAL, "wire.hello.protocol: must be >= 1, got %d", m->hello.protocol);
        break;
    case QP_MSG_TASK:
        if (m->task.block < QP_TASK_WHOLE_JOB)
            return qp_err_set(err, QP_EINVAL, "wire.task.block: must be a block index or \"all\", got %d", m->task.block);
        if (m->task.fence < 1) return qp_err_set(err, QP_EINVAL, "wire.task.fence: must be a fencing token >= 1");
        break;
    case QP_MSG_PROGRESS: {
        const qp_msg_progress *p = &m->progress;
        if (!(p->fraction >= 0 && p->fraction <= 1))
            return qp_err_set(err, QP_EINVAL, "wire.progress.fraction: must be in [0, 1], got %g", p->fraction);
        if (p->block < -1) return qp_err_set(err, QP_EINVAL, "wire.progress.block: must be >= -1, got %d", p->block);
        if (p->n_blocks < 0) return qp_err_set(err, QP_EINVAL, "wire.progress.n_blocks: must be >= 0, got %d", p->n_blocks);
        if (p->n_blocks > 0 && p->block >= p->n_blocks)
            return qp_err_set(err, QP_EINVAL, "wire.progress.block: %d is not below n_blocks %d", p->block, p->n_blocks);
        if (p->eta_s < 0 && p->eta_s != -1)
            return qp_err_set(err, QP_EINVAL, "wire.progress.eta_s: must be >= 0 or -1 (unknown), got %g", p->eta_s);
        if (p->layer_error < 0 && p->layer_error != -1)
            return qp_err_set(err, QP_EINVAL, "wire.progress.layer_error: must be >= 0 or -1 (none), got %g", p->layer_error);
        break;
    }
    case QP_MSG_BLOCK_DONE: {
        const qp_msg_block_done *b = &m->block_done;
        if (b->block < 0 || b->block >= b->n_blocks)
            return qp_err_set(err, QP_EINVAL, "wire.block_done.block: %d is not in [0, n_blocks %d)", b->block, b->n_blocks);
        if (b->seconds < 0) return qp_err_set(err, QP_EINVAL, "wire.block_done.seconds: must not be negative");
        if (b->fence < 1) return qp_err_set(err, QP_EINVAL, "wire.block_done.fence: must be a fencing token >= 1");
        break;
    }
    case QP_MSG_TASK_DONE:
        if (m->task_done.job_finished && !m->task_done.output)
            return qp_err_set(err, QP_EINVAL, "wire.task_done.output: required when job_finished is true");
        break;
    case QP_MSG_HEARTBEAT:
        if (m->heartbeat.rss_bytes < 0) return qp_err_set(err, QP_EINVAL, "wire.heartbeat.rss_bytes: must not be negative");
        break;
    case QP_MSG_PARTS: {
        const qp_msg_parts *p = &m->parts;
        int rc = validate_part_common(tn, p->block, p->step, err);
        if (rc) return rc;
        if (p->n < 1 || p->n > QP_PARTS_MAX)
            return qp_err_set(err, QP_EINVAL, "wire.parts.n: must be in [1, %d], got %d", QP_PARTS_MAX, p->n);
        if (p->names.n < 0 || p->names.n > p->n)
            return qp_err_set(err, QP_EINVAL, "wire.parts.names: %d names for %d parts", p->names.n, p->n);
        for (int i = 0; i < p->names.n; i++) {
            if (!p->names.v || !p->names.v[i])
                return qp_err_set(err, QP_EINVAL, "wire.parts.names[%d]: must be a string", i);
            if (strlen(p->names.v[i]) > QP_PART_NAME_MAX)
                return qp_err_set(err, QP_EINVAL, "wire.parts.names[%d]: longer than %d bytes", i, QP_PART_NAME_MAX);
        }
        if (p->fence < 1) return qp_err_set(err, QP_EINVAL, "wire.parts.fence: must be a fencing token >= 1");
        break;
    }
    case QP_MSG_PART: {
        int rc = validate_part_common(tn, m->part.block, m->part.step, err);
        if (!rc) rc = validate_index(tn, m->part.index, err);
        if (rc) return rc;
        if (m->part.fence < 1) return qp_err_set(err, QP_EINVAL, "wire.part.fence: must be a fencing token >= 1");
        break;
    }
    case QP_MSG_PART_DONE: {
        int rc = validate_part_common(tn, m->part_done.block, m->part_done.step, err);
        if (!rc) rc = validate_index(tn, m->part_done.index, err);
        if (rc) return rc;
        if (m->part_done.seconds < 0) return qp_err_set(err, QP_EINVAL, "wire.part_done.seconds: must not be negative");
        break;
    }
    case QP_MSG_PARTS_DONE:
        return validate_part_common(tn, m->parts_done.block, m->parts_done.step, err);
    case QP_MSG_PART_STOP: {
        int rc = validate_part_common(tn, m->part_stop.block, m->part_stop.step, err);
        return rc ? rc : validate_index(tn, m->part_stop.index, err);
    }
    default:
        break;
    }
    return 0;
}

char *qp_msg_to_json(const qp_msg *m, qp_err *err)
{
    if (qp_msg_validate(m, err)) return NULL;
    cJSON *o = cJSON_CreateObject();
    int rc = o ? qpj_add_str(o, "type", qp_msg_type_name(m->type)) : QP_ENOMEM;
    for (size_t i = 0; i < NFIELDS && !rc; i++) {
        const field_def *f = &fields[i];
        if (f->type != m->type) continue;
        switch (f->kind) {
        case K_STR:
            if (*CAT(m, f, char *)) rc = qpj_add_str(o, f->name, *CAT(m, f, char *));
            break;
        case K_OBJ:
            if (*CAT(m, f, char *)) {
                cJSON *v = cJSON_Parse(*CAT(m, f, char *));
                if (!v || !cJSON_AddItemToObject(o, f->name, v)) { cJSON_Delete(v); rc = QP_ENOMEM; }
            }
            break;
        case K_INT: rc = qpj_add_num(o, f->name, *CAT(m, f, int)); break;
        case K_I64: rc = qpj_add_num(o, f->name, (double)*CAT(m, f, int64_t)); break;
        case K_U64: rc = qpj_add_num(o, f->name, (double)*CAT(m, f, uint64_t)); break;
        case K_DBL: rc = qpj_add_num(o, f->name, *CAT(m, f, double)); break;
        case K_BOOL: rc = qpj_add_bool(o, f->name, *CAT(m, f, int)); break;
        case K_BLOCK:
            rc = *CAT(m, f, int) == QP_TASK_WHOLE_JOB ? qpj_add_str(o, f->name, "all")
                                                      : qpj_add_num(o, f->name, *CAT(m, f, int));
            break;
        case K_STRV: {
            const qp_strv *sv = CAT(m, f, qp_strv);
            if (!sv->n) break;   /* absent and empty mean the same */
            cJSON *a = cJSON_CreateArray();
            if (!a || !cJSON_AddItemToObject(o, f->name, a)) { cJSON_Delete(a); rc = QP_ENOMEM; break; }
            for (int k = 0; k < sv->n && !rc; k++) {
                cJSON *e = cJSON_CreateString(sv->v[k]);
                if (!e || !cJSON_AddItemToArray(a, e)) { cJSON_Delete(e); rc = QP_ENOMEM; }
            }
            break;
        }
        }
    }
    char *s = rc ? NULL : qpj_print(o, 0);
    cJSON_Delete(o);
    if (!s) qp_err_set(err, QP_ENOMEM, "wire.%s: out of memory", qp_msg_type_name(m->type));
    return s;
}

/* An array of at most QP_PARTS_MAX strings; the lengths are qp_msg_validate's. */
static int decode_strv(qp_strv *sv, const cJSON *v, const char *path, const char *name, qp_err *err)
{
    char desc[64];
    if (!cJSON_IsArray(v))
        return qp_err_set(err, QP_EFORMAT, "%s.%s: must be an array of strings, got %s", path, name, qpj_describe(v, desc, sizeof desc));
    int n = cJSON_GetArraySize(v);
    if (n > QP_PARTS_MAX) return qp_err_set(err, QP_EFORMAT, "%s.%s: more than %d names", path, name, QP_PARTS_MAX);
    if (n == 0) return 0;
    if (!(sv->v = calloc((size_t)n, sizeof *sv->v))) return qp_err_set(err, QP_ENOMEM, "%s.%s: out of memory", path, name);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e))
            return qp_err_set(err, QP_EFORMAT, "%s.%s[%d]: must be a string, got %s", path, name, i, qpj_describe(e, desc, sizeof desc));
        if (!(sv->v[i] = strdup(e->valuestring))) return qp_err_set(err, QP_ENOMEM, "%s.%s: out of memory", path, name);
        sv->n = ++i;
    }
    return 0;
}

static int decode_field(qp_msg *m, const cJSON *o, const field_def *f, const char *path, qp_err *err)
{
    const cJSON *v = qpj_field(o, f->name);
    char desc[64];
    if (!v) return f->required ? qp_err_set(err, QP_EFORMAT, "%s.%s: missing", path, f->name) : 0;
    int64_t iv;
    int rc = 0;
    switch (f->kind) {
    case K_STR:
        return qpj_get_str(o, path, f->name, 1, AT(m, f, char *), NULL, err);
    case K_OBJ: {
        if (!cJSON_IsObject(v))
            return qp_err_set(err, QP_EFORMAT, "%s.%s: must be an object, got %s", path, f->name, qpj_describe(v, desc, sizeof desc));
        char *s = qpj_print_copy(v);
        if (!s) return qp_err_set(err, QP_ENOMEM, "%s.%s: out of memory", path, f->name);
        *AT(m, f, char *) = s;
        return 0;
    }
    case K_INT:
        rc = qpj_get_int(o, path, f->name, -2147483647 - 1, 2147483647, "must be an integer", &iv, NULL, err);
        if (!rc) *AT(m, f, int) = (int)iv;
        return rc;
    case K_I64:
        return qpj_get_int(o, path, f->name, -QPJ_INT_MAX, QPJ_INT_MAX, "must be an integer", AT(m, f, int64_t), NULL, err);
    case K_U64:
        rc = qpj_get_int(o, path, f->name, 0, QPJ_INT_MAX, "must be a non-negative integer", &iv, NULL, err);
        if (!rc) *AT(m, f, uint64_t) = (uint64_t)iv;
        return rc;
    case K_DBL:
        return qpj_get_double(o, path, f->name, "must be a number", AT(m, f, double), NULL, err);
    case K_BOOL:
        return qpj_get_bool(o, path, f->name, AT(m, f, int), NULL, err);
    case K_BLOCK:
        if (cJSON_IsString(v) && strcmp(v->valuestring, "all") == 0) {
            *AT(m, f, int) = QP_TASK_WHOLE_JOB;
            return 0;
        }
        rc = qpj_get_int(o, path, f->name, 0, 2147483647, "must be a block index or \"all\"", &iv, NULL, err);
        if (!rc) *AT(m, f, int) = (int)iv;
        return rc;
    case K_STRV:
        return decode_strv(AT(m, f, qp_strv), v, path, f->name, err);
    }
    return 0;
}

int qp_msg_from_json(qp_msg *m, const char *json, size_t len, qp_err *err)
{
    memset(m, 0, sizeof *m);
    cJSON *o = cJSON_ParseWithLength(json, len);
    char desc[64];
    if (!o) return qp_err_set(err, QP_EFORMAT, "wire: message payload is not valid JSON");
    if (!cJSON_IsObject(o)) {
        int rc = qp_err_set(err, QP_EFORMAT, "wire: message payload must be a JSON object, got %s",
                            qpj_describe(o, desc, sizeof desc));
        cJSON_Delete(o);
        return rc;
    }
    const cJSON *t = qpj_field(o, "type");
    qp_msg_type type = QP_MSG_NONE;
    for (int i = 1; cJSON_IsString(t) && i < QP_MSG_COUNT_; i++)
        if (strcmp(t->valuestring, type_names[i]) == 0) type = (qp_msg_type)i;
    if (type == QP_MSG_NONE) {
        int rc = qp_err_set(err, QP_EFORMAT, "wire.type: %s is not a known message type", qpj_describe(t, desc, sizeof desc));
        cJSON_Delete(o);
        return rc;
    }
    qp_msg_init(m, type);
    char path[32];
    snprintf(path, sizeof path, "wire.%s", type_names[type]);
    int rc = 0;
    for (size_t i = 0; i < NFIELDS && !rc; i++)
        if (fields[i].type == type) rc = decode_field(m, o, &fields[i], path, err);
    cJSON_Delete(o);
    if (!rc) rc = qp_msg_validate(m, err);
    if (rc) {
        if (rc == QP_EINVAL) { rc = QP_EFORMAT; if (err) err->code = rc; }
        qp_msg_clear(m);
    }
    return rc;
}
