/* Redis key layout: every key and channel quantd uses, built from two configurable prefixes.
 *
 * proto/redis.md documents each key's type, writer, TTL and the job state machine. With the
 * defaults (queue "qjobs", job prefix "qjob"):
 *   qjobs                      list    the queue; users LPUSH job JSON, daemons BLMOVE from the right
 *   qjobs:processing:<node>    list    jobs a node has taken and not finished
 *   qjobs:failed               list    payloads refused at admission (bad JSON, failed validation)
 *   qjobs:events               channel every status change, as event JSON
 *   qjobs:cancel               channel job ids whose cancel flag was just set
 *   qjobs:node:<node>          string  node heartbeat, with a TTL
 *   qjobs:nodes                set     every node that ever registered (to find dead ones)
 *   qjobs:fence                string  INCR counter handing out fencing tokens
 *   qjobs:index                zset    job ids scored by submit time (ms), for listing
 *   qjob:<id>                  hash    the job's status (proto/status.h) plus its spec
 *   qjob:<id>:events           stream  the job's events, capped
 *   qjob:<id>:lease            string  "<token> <node>", SET NX PX, renewed while running
 *   qjob:<id>:cancel           string  persistent cancel flag
 * Every builder writes a NUL-terminated key into buf (cap bytes) and returns 0, or QP_EINVAL
 * when a node name or id is not a valid name or the key does not fit. */
#ifndef QUANTD_PROTO_KEYS_H
#define QUANTD_PROTO_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/job/perr.h"

#define QP_KEY_MAX 256          /* a buffer this size holds any key */
#define QP_PREFIX_MAX 63
#define QP_NODE_MAX 64          /* node and worker names: [A-Za-z0-9._-], as job ids */
#define QP_KEYS_DEFAULT_QUEUE "qjobs"
#define QP_KEYS_DEFAULT_JOB "qjob"

/* Defaults the daemon's configuration table starts from (documented in redis.md). */
#define QP_STREAM_MAXLEN 1000           /* XADD MAXLEN ~ for qjob:<id>:events */
#define QP_NODE_TTL_MS 15000            /* heartbeat key TTL; renewed every third of it */
#define QP_LEASE_TTL_MS 30000           /* lease TTL; renewed every third of it */
#define QP_RETENTION_S (7 * 24 * 3600)  /* finished jobs' hash, stream and flag expire after this */

typedef struct qp_keys {
    char queue[QP_PREFIX_MAX + 1];   /* queue list name, also the prefix of cluster-wide keys */
    char job[QP_PREFIX_MAX + 1];     /* prefix of per-job keys */
} qp_keys;

/* NULL or "" selects the default. Prefixes are 1..63 bytes of [A-Za-z0-9._:-] and must
 * differ (else "qjobs:events" could be a job's key). */
int qp_keys_init(qp_keys *k, const char *queue, const char *job_prefix, qp_err *err);

/* True when s is a valid node/worker name or job id (1..64 of [A-Za-z0-9._-]). */
int qp_name_valid(const char *s);

int qp_key_queue(const qp_keys *k, char *buf, size_t cap);
int qp_key_processing(const qp_keys *k, const char *node, char *buf, size_t cap);
int qp_key_failed(const qp_keys *k, char *buf, size_t cap);
int qp_key_events_channel(const qp_keys *k, char *buf, size_t cap);
int qp_key_cancel_channel(const qp_keys *k, char *buf, size_t cap);
int qp_key_node(const qp_keys *k, const char *node, char *buf, size_t cap);
int qp_key_nodes(const qp_keys *k, char *buf, size_t cap);
int qp_key_fence(const qp_keys *k, char *buf, size_t cap);
int qp_key_index(const qp_keys *k, char *buf, size_t cap);
int qp_key_status(const qp_keys *k, const char *id, char *buf, size_t cap);
int qp_key_job_events(const qp_keys *k, const char *id, char *buf, size_t cap);
int qp_key_lease(const qp_keys *k, const char *id, char *buf, size_t cap);
int qp_key_cancel(const qp_keys *k, const char *id, char *buf, size_t cap);
/* Fan-outs of a block's step that other nodes may take parts of (redis.md, "Parts over
 * several nodes"): the open fan-out of a job (hash), the set of jobs with one, the set of
 * nodes that offer their workers (remote-parts), and the channel that wakes them. */
int qp_key_fanout(const qp_keys *k, const char *id, char *buf, size_t cap);
int qp_key_fanouts(const qp_keys *k, char *buf, size_t cap);
int qp_key_parts_nodes(const qp_keys *k, char *buf, size_t cap);
int qp_key_parts_channel(const qp_keys *k, char *buf, size_t cap);

/* Lease value "<token> <node>": the fencing token (from INCR on the fence key) and the
 * holder, compared as a whole string by the renew/release scripts. */
int qp_lease_value_format(uint64_t token, const char *node, char *buf, size_t cap);
/* node must hold QP_NODE_MAX + 1 bytes. Returns QP_EFORMAT for anything else. */
int qp_lease_value_parse(const char *value, uint64_t *token, char *node);

#endif
