/* Redis key builders (layout in keys.h and redis.md). Names are validated here so that a
 * node or id with a ':' or a space can never produce a key that aliases another one. */
#include "proto/keys.h"
#include "quant/job/jsonutil.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int prefix_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (!(isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-')) return 0;
    }
    return n >= 1 && n <= QP_PREFIX_MAX;
}

int qp_keys_init(qp_keys *k, const char *queue, const char *job_prefix, qp_err *err)
{
    if (!queue || !queue[0]) queue = QP_KEYS_DEFAULT_QUEUE;
    if (!job_prefix || !job_prefix[0]) job_prefix = QP_KEYS_DEFAULT_JOB;
    if (!prefix_valid(queue))
        return qp_err_set(err, QP_EINVAL, "redis queue name \"%.80s\": must be 1 to %d of letters, digits, '.', '_', ':' or '-'",
                          queue, QP_PREFIX_MAX);
    if (!prefix_valid(job_prefix))
        return qp_err_set(err, QP_EINVAL, "redis job key prefix \"%.80s\": must be 1 to %d of letters, digits, '.', '_', ':' or '-'",
                          job_prefix, QP_PREFIX_MAX);
    /* A prefix equal to the other, or extending it with ':', lets keys alias: job prefix
     * "qjobs:node" would make qjob:<id> and the heartbeat of a node called <id> one key. */
    size_t nq = strlen(queue), nj = strlen(job_prefix);
    if (strcmp(queue, job_prefix) == 0 ||
        (nj > nq && strncmp(job_prefix, queue, nq) == 0 && job_prefix[nq] == ':') ||
        (nq > nj && strncmp(queue, job_prefix, nj) == 0 && queue[nj] == ':'))
        return qp_err_set(err, QP_EINVAL,
                          "redis job key prefix \"%s\" and queue name \"%s\" must differ, and neither may be the other followed by ':'",
                          job_prefix, queue);
    snprintf(k->queue, sizeof k->queue, "%s", queue);
    snprintf(k->job, sizeof k->job, "%s", job_prefix);
    return 0;
}

int qp_name_valid(const char *s)
{
    return qpj_name_valid(s, QP_NODE_MAX);
}

static int build(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int build(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) buf[0] = '\0';
        return QP_EINVAL;
    }
    return 0;
}

static int named(const char *name, char *buf, size_t cap)
{
    if (qp_name_valid(name)) return 0;
    if (cap) buf[0] = '\0';
    return QP_EINVAL;
}

int qp_key_queue(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s", k->queue); }
int qp_key_failed(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:failed", k->queue); }
int qp_key_events_channel(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:events", k->queue); }
int qp_key_cancel_channel(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:cancel", k->queue); }
int qp_key_nodes(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:nodes", k->queue); }
int qp_key_fence(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:fence", k->queue); }
int qp_key_index(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:index", k->queue); }
int qp_key_fanouts(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:fanouts", k->queue); }
int qp_key_parts_nodes(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:parts_nodes", k->queue); }
int qp_key_parts_channel(const qp_keys *k, char *buf, size_t cap) { return build(buf, cap, "%s:parts", k->queue); }

int qp_key_processing(const qp_keys *k, const char *node, char *buf, size_t cap)
{
    return named(node, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:processing:%s", k->queue, node);
}

int qp_key_node(const qp_keys *k, const char *node, char *buf, size_t cap)
{
    return named(node, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:node:%s", k->queue, node);
}

int qp_key_status(const qp_keys *k, const char *id, char *buf, size_t cap)
{
    return named(id, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:%s", k->job, id);
}

int qp_key_job_events(const qp_keys *k, const char *id, char *buf, size_t cap)
{
    return named(id, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:%s:events", k->job, id);
}

int qp_key_lease(const qp_keys *k, const char *id, char *buf, size_t cap)
{
    return named(id, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:%s:lease", k->job, id);
}

int qp_key_cancel(const qp_keys *k, const char *id, char *buf, size_t cap)
{
    return named(id, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:%s:cancel", k->job, id);
}

int qp_key_fanout(const qp_keys *k, const char *id, char *buf, size_t cap)
{
    return named(id, buf, cap) ? QP_EINVAL : build(buf, cap, "%s:%s:fanout", k->job, id);
}

int qp_lease_value_format(uint64_t token, const char *node, char *buf, size_t cap)
{
    if (token == 0 || named(node, buf, cap)) return QP_EINVAL;
    return build(buf, cap, "%" PRIu64 " %s", token, node);
}

int qp_lease_value_parse(const char *value, uint64_t *token, char *node)
{
    if (!value || !isdigit((unsigned char)value[0])) return QP_EFORMAT;
    char *end = NULL;
    errno = 0;
    unsigned long long t = strtoull(value, &end, 10);
    if (errno || t == 0 || *end != ' ' || !qp_name_valid(end + 1)) return QP_EFORMAT;
    *token = t;
    strcpy(node, end + 1);
    return 0;
}
