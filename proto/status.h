/* Job status: the record kept in the qjob:<id> hash, and the event published on every change.
 *
 * One struct, two encodings: a list of hash field/value pairs for HSET/HGETALL, and an event
 * JSON object for PUBLISH on the events channel and XADD to the job's stream (as the single
 * stream field "event"). Both carry the version QP_STATUS_VERSION ("v"). Readers ignore
 * fields they do not know, so adding a field is compatible and does not bump the version;
 * changing a field's meaning does, and readers refuse versions newer than their own.
 *
 * Unset values: strings NULL (written to the hash as "", so HSET clears a stale value),
 * numbers -1 (block, eta_s, layer_error) or 0 (timestamps, n_blocks). */
#ifndef QUANTD_PROTO_STATUS_H
#define QUANTD_PROTO_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/job/perr.h"

#define QP_STATUS_VERSION 1
/* The hash also holds the job's canonical spec JSON under this field, written once at
 * admission; it is not part of qp_status (it would ride along on every event). */
#define QP_STATUS_FIELD_SPEC "spec"
/* The single field of each XADD entry in qjob:<id>:events. */
#define QP_STREAM_FIELD_EVENT "event"

typedef enum qp_state {
    QP_STATE_QUEUED = 0,
    QP_STATE_RUNNING,
    QP_STATE_DONE,
    QP_STATE_FAILED,
    QP_STATE_CANCELLED,
    QP_STATE_COUNT_,
} qp_state;

const char *qp_state_name(qp_state s);          /* "queued", ...; NULL when invalid */
int qp_state_parse(const char *s, qp_state *out);  /* 0 or QP_EINVAL */
int qp_state_is_final(qp_state s);              /* done, failed, cancelled */
/* The state machine of redis.md: queued -> running | failed | cancelled; running -> queued
 * (handed back: SIGTERM, dead node) | done | failed | cancelled; a final state -> queued
 * only by resubmitting. Staying in a state is allowed (progress updates). */
int qp_state_can_move(qp_state from, qp_state to);

typedef struct qp_status {
    char *id;                 /* owned strings throughout; NULL = unset */
    qp_state state;
    char *stage;              /* "load", "calibrate", "quantize", "checkpoint", "write", "eval", ... */
    int block;                /* 0-based index of the block being worked on, -1 before the first */
    int n_blocks;             /* L, 0 until known */
    char *layer;              /* e.g. "model.layers.3.self_attn.q_proj" */
    double progress;          /* 0..1 over the whole job */
    double eta_s;             /* seconds, -1 unknown */
    double layer_error;       /* last finished layer's output error, -1 none */
    char *node;
    char *worker;
    int attempts;             /* times the job was (re)started */
    char *error;              /* why it failed, or the last retried error */
    char *output;             /* output directory */
    int64_t submitted_ms;     /* Unix time in milliseconds; 0 = unset */
    int64_t started_ms;
    int64_t updated_ms;
    int64_t finished_ms;
    char *report;             /* compact JSON object: the report summary */
    char *last_block;         /* compact JSON object: the last committed block's cost (seconds per
                                 stage, forward passes, bytes written, MoE coverage) */
    char *estimate;           /* compact JSON object: the pre-flight estimate the job was admitted
                                 under, {"peak_ram_bytes": .., "disk_bytes": ..}; the report's
                                 resources compare it with the measured peaks */
    char *parts;              /* compact JSON array: the parts of a block's step in flight on the
                                 node's workers, [{"worker": "cpu-1", "block": 3, "step":
                                 "quantize", "part": 5, "layer": "mlp.down_proj"}, ...] ("layer"
                                 absent when unnamed); NULL when none */
} qp_status;

/* Sets every field to "unset" (no allocation). */
void qp_status_init(qp_status *st);
/* Frees the owned strings and re-initialises. Safe on an initialised status and on NULL. */
void qp_status_clear(qp_status *st);
/* Deep copy into a fresh dst (dst is overwritten without freeing). 0 or QP_ENOMEM. */
int qp_status_copy(qp_status *dst, const qp_status *src);
/* Replaces an owned string field with a copy of value (NULL clears). 0 or QP_ENOMEM. */
int qp_status_set_str(char **field, const char *value);

/* Field selection for partial HSETs. */
enum {
    QP_SF_STATE = 1u << 0,      /* state, attempts, estimate */
    QP_SF_PROGRESS = 1u << 1,   /* stage, block, n_blocks, layer, progress, eta_s, layer_error, last_block */
    QP_SF_PLACE = 1u << 2,      /* node, worker */
    QP_SF_RESULT = 1u << 3,     /* error, output, report */
    QP_SF_TIMES = 1u << 4,      /* submitted_ms, started_ms, finished_ms */
    QP_SF_PARTS = 1u << 5,      /* parts */
    QP_SF_ALL = 0x3f,           /* "v", "id" and "updated_ms" are always written */
};

#define QP_STATUS_MAX_FIELDS 24
typedef struct qp_fields {
    size_t n;
    const char *name[QP_STATUS_MAX_FIELDS];   /* static strings */
    char *value[QP_STATUS_MAX_FIELDS];        /* owned; free with qp_fields_free */
} qp_fields;

/* Fills out with the selected fields (HSET key name[0] value[0] ...). Fails with
 * QP_EINVAL when id is not a valid name, QP_EFORMAT when report (or another object field)
 * is not a JSON object or parts not a JSON array. */
int qp_status_to_fields(const qp_status *st, unsigned which, qp_fields *out, qp_err *err);
void qp_fields_free(qp_fields *f);
/* Applies one hash field to st: unknown names are ignored, malformed values fail naming
 * the field ("status.progress: \"x\" is not a number"), "v" newer than ours fails. */
int qp_status_set_field(qp_status *st, const char *name, const char *value, qp_err *err);
/* HGETALL-style alternating array kv[0]=name, kv[1]=value, ... of n_strings entries. */
int qp_status_from_fields(qp_status *st, const char *const *kv, size_t n_strings, qp_err *err);

typedef enum qp_event_type {
    QP_EVENT_STATE = 0,      /* the state changed (including submission) */
    QP_EVENT_PROGRESS,       /* stage/block/progress moved */
    QP_EVENT_LAYER,          /* a layer finished: layer and layer_error are its result */
} qp_event_type;
const char *qp_event_type_name(qp_event_type t);

/* Event JSON: {"v":1,"type":"progress","id":...,"state":...,...,"report":{...}}; unset
 * strings are left out, the report is embedded as an object. Caller frees (cJSON_Delete,
 * or free() for the string form); NULL on allocation failure or an invalid status. */
cJSON *qp_status_to_event_cjson(const qp_status *st, qp_event_type type);
char *qp_status_to_event(const qp_status *st, qp_event_type type);
/* Decodes an event into a fresh st (initialised here; clear it after). type may be NULL. */
int qp_status_from_event(qp_status *st, qp_event_type *type, const char *json, size_t len, qp_err *err);
int qp_status_from_event_cjson(qp_status *st, qp_event_type *type, const cJSON *obj, qp_err *err);

#endif
