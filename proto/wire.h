/* The worker wire protocol: framed, versioned JSON messages over the daemon<->worker pipes.
 *
 * Frame: 'Q' 'D' 'W' <version byte> | payload length, u32 little-endian | payload: one JSON
 * object of payload length bytes, {"type": "<message type>", ...}. proto/wire.md lists each
 * message, its direction and fields. The stream decoder accepts bytes in chunks of any size
 * (one at a time, or many frames at once) and yields whole messages; a bad magic, a foreign
 * version, a zero or oversize length breaks the stream for good (the peer is not speaking
 * this protocol: kill it), while a well-framed message with a bad body fails alone and the
 * stream goes on.
 *
 * Versioning: QP_WIRE_VERSION is in every frame header and in hello. Adding an optional
 * field is compatible (readers ignore fields they do not know) and keeps the version;
 * anything else bumps it, and the daemon refuses workers that speak another version. */
#ifndef QUANTD_PROTO_WIRE_H
#define QUANTD_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/job/perr.h"

/* 2: the parts messages (parts, part, part_done, parts_done) of a step fanned out over workers.
 * 3: part_stop. */
#define QP_WIRE_VERSION 3
#define QP_WIRE_HEADER_BYTES 8
#define QP_WIRE_MAX_PAYLOAD (1u << 20)   /* 1 MiB: a task carries a job spec of at most 64 KiB */
#define QP_TASK_WHOLE_JOB (-1)            /* task.block: run every remaining block */
#define QP_PARTS_MAX 4096                 /* parts.n: the most parts one step is cut into */
#define QP_PART_NAME_MAX 160              /* parts.names[i]: the longest name of a part */

typedef enum qp_msg_type {
    QP_MSG_NONE = 0,
    QP_MSG_HELLO,        /* worker -> daemon, first message */
    QP_MSG_TASK,         /* daemon -> worker */
    QP_MSG_PROGRESS,     /* worker -> daemon */
    QP_MSG_BLOCK_DONE,   /* worker -> daemon: a block's checkpoint is committed */
    QP_MSG_TASK_DONE,    /* worker -> daemon: the task ended well */
    QP_MSG_TASK_FAILED,  /* worker -> daemon: the task ended badly (or was cancelled) */
    QP_MSG_HEARTBEAT,    /* worker -> daemon, every few seconds, busy or not */
    QP_MSG_CANCEL,       /* daemon -> worker: stop the task at the next safe point */
    QP_MSG_SHUTDOWN,     /* daemon -> worker: exit (after the current block when graceful) */
    QP_MSG_PARTS,        /* worker -> daemon: a lead announces a step cut into parts */
    QP_MSG_PART,         /* daemon -> worker: run one part */
    QP_MSG_PART_DONE,    /* worker -> daemon: a part ended (well or not) */
    QP_MSG_PARTS_DONE,   /* daemon -> worker (the lead): no part of the step runs any more */
    QP_MSG_PART_STOP,    /* daemon -> worker: another copy of the part it runs finished */
    QP_MSG_COUNT_,
} qp_msg_type;

/* Every char * below is owned by the message when it came from a decoder (free with
 * qp_msg_clear); a message you fill in to send may point at your own strings and then must
 * not be cleared. NULL = absent. */
typedef struct qp_msg_hello {
    char *worker;            /* required: worker name, e.g. "cuda0" or "cpu1" */
    int64_t pid;
    char *backend;           /* required: "cpu" or "cuda" */
    char *device;            /* "NVIDIA H100 80GB HBM3", "cpu: 16 threads" */
    int protocol;            /* QP_WIRE_VERSION of the sender */
    int selftest_ok;         /* the kernel self-test passed on this device */
    char *selftest;          /* its one-line summary or failure */
} qp_msg_hello;

typedef struct qp_msg_task {
    char *job_id;            /* required */
    char *job;               /* required: the job spec JSON object (canonical form) */
    int block;               /* block index, or QP_TASK_WHOLE_JOB */
    char *checkpoint_dir;    /* required: where the job's checkpoint lives */
    uint64_t fence;          /* required, >= 1: the lease's fencing token */
    int fanout;              /* optional, default 0: the job's steps may go out as parts (the
                                daemon sets it where job.workers != 1 and it has other workers) */
} qp_msg_task;

typedef struct qp_msg_progress {
    char *job_id;            /* required */
    char *stage;             /* required */
    int block;               /* -1 before the first block */
    int n_blocks;            /* 0 until known */
    char *layer;
    double fraction;         /* 0..1 over the whole job */
    double eta_s;            /* -1 unknown */
    double layer_error;      /* -1 none; else the finished layer's output error */
} qp_msg_progress;

typedef struct qp_msg_block_done {
    char *job_id;            /* required */
    int block;               /* >= 0 */
    int n_blocks;            /* >= block + 1 */
    double seconds;          /* time the block took */
    uint64_t fence;          /* the token the checkpoint was committed under */
    char *cost;              /* JSON object or NULL: the block's cost record (seconds per stage,
                                forward passes, bytes written, MoE coverage) */
} qp_msg_block_done;

typedef struct qp_msg_task_done {
    char *job_id;            /* required */
    int job_finished;        /* 1 when the output is complete; 0 after a single-block task */
    char *output;            /* output directory, when job_finished */
    char *report;            /* report summary, a JSON object, when job_finished */
} qp_msg_task_done;

typedef struct qp_msg_task_failed {
    char *job_id;            /* required */
    char *error;             /* required: one sentence */
    int code;                /* the QD_E* code, 0 when unknown */
    int retryable;           /* 1: a retry from the checkpoint may succeed (OOM, CUDA error) */
    int cancelled;           /* 1: stopped by a cancel message; not an error */
    int exiting;             /* 1: the worker exits after this reply (a device error broke its
                              * context): send it nothing more, a fresh one replaces it */
} qp_msg_task_failed;

typedef struct qp_msg_heartbeat {
    int64_t t_ms;            /* sender's clock, Unix ms */
    char *job_id;            /* the task in hand, NULL when idle */
    int64_t rss_bytes;       /* resident memory, 0 unknown */
} qp_msg_heartbeat;

typedef struct qp_msg_cancel {
    char *job_id;            /* required */
    char *reason;
} qp_msg_cancel;

typedef struct qp_msg_shutdown {
    int graceful;            /* 1: finish and checkpoint the current block first */
} qp_msg_shutdown;

/* An array of strings: v[0..n-1], owned (each string and v) when decoded. */
typedef struct qp_strv {
    char **v;
    int n;
} qp_strv;

/* The steps a block may fan out as parts ("quantize", "factor", "capture"); NULL-terminated. */
extern const char *const qp_part_steps[];

/* The parts of one step of one block (docs/parallel.md): the lead worker, running the
 * job's task, has written their inputs into the checkpoint directory. */
typedef struct qp_msg_parts {
    char *job_id;            /* required */
    int block;               /* required, >= 0 */
    char *step;              /* required: one of qp_part_steps */
    int n;                   /* required: 1..QP_PARTS_MAX */
    qp_strv names;           /* optional: at most n names (what part i works on, for status),
                                each at most QP_PART_NAME_MAX bytes */
    uint64_t fence;          /* required, >= 1: the lease's token the task runs under */
} qp_msg_parts;

typedef struct qp_msg_part {
    char *job_id;            /* required */
    char *job;               /* required: the job spec JSON object (canonical form, as task) */
    char *checkpoint_dir;    /* required */
    int block;               /* required, >= 0 */
    char *step;              /* required: one of qp_part_steps */
    int index;               /* required: 0..n-1 of the parts message */
    uint64_t fence;          /* required, >= 1 */
} qp_msg_part;

typedef struct qp_msg_part_done {
    char *job_id;            /* required */
    int block;               /* required, >= 0 */
    char *step;              /* required */
    int index;               /* required, >= 0 */
    int ok;                  /* required: the part's output is written */
    char *error;             /* why not, when ok is 0 */
    double seconds;          /* the part's compute time, >= 0 (0 unknown) */
} qp_msg_part_done;

typedef struct qp_msg_parts_done {
    char *job_id;            /* required */
    int block;               /* required, >= 0 */
    char *step;              /* required */
} qp_msg_parts_done;

/* A part that is done (another copy of it, a backup or the original, finished first): the
 * worker stops its own copy, if it runs it or has it queued, and reports it not done. */
typedef struct qp_msg_part_stop {
    char *job_id;            /* required */
    int block;               /* required, >= 0 */
    char *step;              /* required */
    int index;               /* required, >= 0 */
} qp_msg_part_stop;

typedef struct qp_msg {
    qp_msg_type type;
    union {
        qp_msg_hello hello;
        qp_msg_task task;
        qp_msg_progress progress;
        qp_msg_block_done block_done;
        qp_msg_task_done task_done;
        qp_msg_task_failed task_failed;
        qp_msg_heartbeat heartbeat;
        qp_msg_cancel cancel;
        qp_msg_shutdown shutdown;
        qp_msg_parts parts;
        qp_msg_part part;
        qp_msg_part_done part_done;
        qp_msg_parts_done parts_done;
        qp_msg_part_stop part_stop;
    };
} qp_msg;

const char *qp_msg_type_name(qp_msg_type t);   /* "hello", ...; NULL when invalid */
/* Zeroes m and sets its type and the -1 "unset" defaults of that type's numbers. */
void qp_msg_init(qp_msg *m, qp_msg_type type);
/* Frees the strings of a decoded message and zeroes it. NULL-safe. */
void qp_msg_clear(qp_msg *m);
/* Checks required fields and ranges ("wire.progress.fraction: must be in [0, 1], got 2"). */
int qp_msg_validate(const qp_msg *m, qp_err *err);

/* Message <-> JSON payload. to_json returns a malloc'd string (free()) or NULL with err set;
 * from_json fills a fresh m (owned strings) after validating it. */
char *qp_msg_to_json(const qp_msg *m, qp_err *err);
int qp_msg_from_json(qp_msg *m, const char *json, size_t len, qp_err *err);

/* Wraps payload in a frame: *frame is malloc'd (free()), *frame_len = header + n. */
int qp_wire_frame(const void *payload, size_t n, uint8_t **frame, size_t *frame_len, qp_err *err);
/* Validates, serialises and frames m in one step. */
int qp_wire_encode(const qp_msg *m, uint8_t **frame, size_t *frame_len, qp_err *err);
/* Writes the 8-byte header for a payload of n bytes. */
void qp_wire_header(uint8_t hdr[QP_WIRE_HEADER_BYTES], uint32_t n);

/* Streaming decoder. Owns its buffer; init/free pair, free accepts NULL. */
typedef struct qp_wire_decoder {
    uint8_t *buf;
    size_t len;              /* bytes held */
    size_t off;              /* bytes already consumed from buf */
    size_t cap;
    uint32_t max_payload;
    int broken;              /* a framing error was seen: every later call repeats it */
    qp_err broken_err;
} qp_wire_decoder;

/* max_payload 0 selects QP_WIRE_MAX_PAYLOAD. */
void qp_wire_decoder_init(qp_wire_decoder *d, uint32_t max_payload);
void qp_wire_decoder_free(qp_wire_decoder *d);
/* Appends n bytes. Fails (and breaks the stream) as soon as the next frame's header is
 * visibly wrong, so garbage is never buffered without bound. */
int qp_wire_decoder_feed(qp_wire_decoder *d, const void *data, size_t n, qp_err *err);
/* Takes the next whole frame: returns 1 with *payload pointing into the decoder (valid until
 * the next feed/next call) and *n its length, 0 when more bytes are needed, < 0 on a
 * framing error. */
int qp_wire_decoder_next_frame(qp_wire_decoder *d, const char **payload, size_t *n, qp_err *err);
/* Takes and decodes the next message: 1 with *m filled (clear it after), 0 when more bytes
 * are needed, < 0 on error. A bad body (QP_EFORMAT naming the field) consumes that frame
 * only and the stream goes on; a framing error breaks it. qp_wire_decoder_broken tells which. */
int qp_wire_decoder_next(qp_wire_decoder *d, qp_msg *m, qp_err *err);
int qp_wire_decoder_broken(const qp_wire_decoder *d);
/* Bytes held that do not yet make a whole frame (nonzero at EOF means a truncated frame). */
size_t qp_wire_decoder_pending(const qp_wire_decoder *d);

#endif
