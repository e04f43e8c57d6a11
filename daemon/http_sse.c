/* Server-Sent Events: /v1/jobs/{id}/events and /v1/events.
 *
 * A per-job stream first replays the capped stream qjob:<id>:events (XRANGE from the start,
 * or after Last-Event-ID when the browser reconnects), then stays live. Pub/Sub on the
 * events channel is only the wake-up: each message naming the job triggers another XRANGE
 * from the last entry sent, so events are sent once each, in stream order, with their
 * stream id as the SSE id, and a missed message costs at most QH_SSE_POLL_MS (the periodic
 * re-read). /v1/events forwards every Pub/Sub message as it comes (for job lists).
 *
 * The response is an MHD callback response: the reader hands out buffered bytes, and when
 * there are none it suspends the connection; new bytes resume it.
 *
 * Bounds: each stream buffers at most SSE_MAX_BUFFER bytes for its client, and a per-job
 * replay reads the next page only while less than SSE_REFILL_BELOW is waiting, so a slow
 * reader slows the replay down instead of growing the buffer. A client that still falls
 * SSE_MAX_BUFFER behind (the all-jobs stream cannot wait) has its stream ended after the
 * whole messages already buffered; it reconnects, and a per-job stream resumes from
 * Last-Event-ID. The number of streams is limited by http-max-streams (http_routes.c). */
#define _GNU_SOURCE
#include "daemon/http_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/status.h"
#include "quant/core/clock.h"
#include "quant/core/log.h"

#define SSE_FETCH_COUNT "200"
#define SSE_MAX_BUFFER (1u << 20)      /* a client this far behind is dropped */
#define SSE_REFILL_BELOW (256u << 10)  /* a replay reads its next page below this */

size_t qh_sse_count(const qdd_http *h, const qh_req *except)
{
    size_t n = 0;
    for (const qh_req *r = h->reqs; r; r = r->next) n += r != except && r->sse && !r->mhd_done;
    return n;
}

static size_t out_pending(const qh_req *r) { return r->out_len - r->out_pos; }

/* Ends the stream once what is buffered has gone out (the reader sees overflow). */
static void sse_drop(qh_req *r)
{
    if (!r->overflow)
        QD_LOG(QD_LOG_WARN, "http_sse_dropped", "job=%s pending=%zu (the client reads too slowly)",
               r->sse == 1 ? r->job : "*", out_pending(r));
    r->overflow = 1;
    qh_req_wake(r);
}

/* Appends whole messages only: a message that does not fit ends the stream (overflow). */
static int out_append(qh_req *r, const char *s, size_t n)
{
    if (r->out_pos == r->out_len) r->out_pos = r->out_len = 0;
    if (r->overflow || out_pending(r) + n > SSE_MAX_BUFFER) goto overflow;
    if (r->out_len + n > r->out_cap) {
        if (r->out_pos) {   /* compact before growing */
            memmove(r->out, r->out + r->out_pos, r->out_len - r->out_pos);
            r->out_len -= r->out_pos;
            r->out_pos = 0;
        }
        size_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_len + n) cap *= 2;
        char *nb = realloc(r->out, cap);
        if (!nb) goto overflow;
        r->out = nb;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
    return 0;
overflow:
    sse_drop(r);
    return -1;
}

/* One SSE message; data may hold newlines (each line becomes a data: line). Built whole
 * first, so the buffer never holds part of a message. */
static void sse_send(qh_req *r, const char *id, const char *data, size_t len)
{
    if (r->mhd_done || r->overflow) return;
    size_t lines = 1;
    for (const char *p = data, *end = data + len; (p = memchr(p, '\n', (size_t)(end - p))); p++) lines++;
    size_t cap = (id ? strlen(id) + 5 : 0) + len + lines * 7 + 2;
    char *m = malloc(cap), *w = m;
    if (!m) { sse_drop(r); return; }
    if (id) w += sprintf(w, "id: %s\n", id);
    const char *p = data, *end = data + len;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        memcpy(w, "data: ", 6);
        memcpy(w + 6, p, (size_t)(le - p));
        w += 6 + (le - p);
        *w++ = '\n';
        if (!nl) break;
        p = nl + 1;
    }
    *w++ = '\n';
    int rc = out_append(r, m, (size_t)(w - m));
    free(m);
    if (rc) return;
    r->last_write_ms = qd_clock_now_ms();
    qh_req_wake(r);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    qh_req *r = cls;
    if (r->out_pos < r->out_len) {
        size_t n = r->out_len - r->out_pos;
        if (n > max) n = max;
        memcpy(buf, r->out + r->out_pos, n);
        r->out_pos += n;
        /* A replay held back by a full buffer reads its next page once it has drained. */
        if (r->sse == 1 && r->dirty && !r->fetching && out_pending(r) < SSE_REFILL_BELOW) qh_sse_fetch(r);
        return (ssize_t)n;
    }
    if (r->h->stopping || r->overflow || r->peer_closed) return MHD_CONTENT_READER_END_OF_STREAM;
    qh_suspend(r);   /* resumed by sse_send */
    return 0;
}

enum MHD_Result qh_sse_start(qh_req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    if (r->origin[0]) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    enum MHD_Result ret = qh_queue(r, 200, resp, NULL);
    MHD_destroy_response(resp);
    if (ret != MHD_YES) return ret;
    r->sse_started = 1;
    /* The retry hint and a first comment make clients see the stream open at once. */
    const char hello[] = "retry: 2000\n: quantd events\n\n";
    out_append(r, hello, sizeof hello - 1);
    r->last_write_ms = qd_clock_now_ms();
    if (r->sse == 1) qh_sse_fetch(r);
    return MHD_YES;
}

static void on_fetch(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    r->fetching = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || r->mhd_done) return;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING) continue;
        const redisReply *kv = e->element[1];
        snprintf(r->last_id, sizeof r->last_id, "%s", e->element[0]->str);
        for (size_t k = 0; kv->type == REDIS_REPLY_ARRAY && k + 1 < kv->elements; k += 2)
            if (kv->element[k]->str && !strcmp(kv->element[k]->str, QP_STREAM_FIELD_EVENT) && kv->element[k + 1]->str)
                sse_send(r, e->element[0]->str, kv->element[k + 1]->str, kv->element[k + 1]->len);
    }
    /* A full page means there may be more; a wake-up during the read means there is. */
    if (rep->elements >= (size_t)atoi(SSE_FETCH_COUNT) || r->dirty) qh_sse_fetch(r);
}

void qh_sse_fetch(qh_req *r)
{
    if (r->overflow) return;
    if (r->fetching || r->mhd_done || r->h->stopping || out_pending(r) >= SSE_REFILL_BELOW) {
        r->dirty = 1;
        return;
    }
    r->dirty = 0;
    char key[QP_KEY_MAX], from[72];
    qp_key_job_events(&r->h->keys, r->job, key, sizeof key);
    if (!strcmp(r->last_id, "0")) strcpy(from, "-");
    else snprintf(from, sizeof from, "(%s", r->last_id);   /* exclusive start: Redis 6.2 */
    const char *argv[] = {"XRANGE", key, from, "+", "COUNT", SSE_FETCH_COUNT};
    if (qh_redis_cmd(r, on_fetch, 6, argv, NULL) == 0) r->fetching = 1;
}

void qh_sse_event_published(qdd_http *h, const char *payload, size_t len)
{
    char id[72] = "";
    cJSON *o = cJSON_ParseWithLength(payload, len);
    const cJSON *j = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
    if (cJSON_IsString(j) && strlen(j->valuestring) < sizeof id) strcpy(id, j->valuestring);
    cJSON_Delete(o);
    for (qh_req *r = h->reqs, *next; r; r = next) {
        next = r->next;
        if (!r->sse_started || r->mhd_done) continue;
        if (r->sse == 2 && id[0]) sse_send(r, NULL, payload, len);
        else if (r->sse == 1 && !strcmp(r->job, id)) qh_sse_fetch(r);
    }
}

/* 1 when the client of a suspended stream has gone (end of file or an error on its socket).
 * libmicrohttpd does not look at a suspended connection at all, so without this a closed
 * stream would hold its connection and its stream slot until the next keep-alive write. */
static int peer_closed(qh_req *r)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t k = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void qh_sse_tick(qdd_http *h)
{
    uint64_t now = qd_clock_now_ms();
    for (qh_req *r = h->reqs; r; r = r->next) {
        if (!r->sse_started || r->mhd_done) continue;
        if (r->suspended && !r->peer_closed && peer_closed(r)) {
            r->peer_closed = 1;
            qh_req_wake(r);   /* the reader ends the stream; MHD then closes the connection */
            continue;
        }
        if (r->sse == 1 && now - r->last_write_ms >= QH_SSE_POLL_MS) qh_sse_fetch(r);
        if (now - r->last_write_ms >= QH_SSE_KEEPALIVE_MS && !r->overflow) {
            if (out_append(r, ": keep-alive\n\n", 14) == 0) qh_req_wake(r);
            r->last_write_ms = now;
        }
    }
}

void qh_sse_close_all(qdd_http *h)
{
    for (qh_req *r = h->reqs; r; r = r->next)
        if (r->sse_started && !r->mhd_done) qh_req_wake(r);   /* the reader sees stopping */
}
