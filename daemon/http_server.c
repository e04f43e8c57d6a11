/* The HTTP layer's plumbing: libmicrohttpd in external epoll mode driven by libuv (one
 * uv_poll on MHD's epoll fd plus a uv_timer for its timeouts), the request lifecycle
 * (reference counts, suspend/resume while Redis answers), and the layer's Redis plumbing over
 * the daemon's connections (rconn.h): commands on the command connection, live events from
 * the subscribe connection; reconnects are rconn's business, not this layer's. Also here: the
 * connection limits (counted per connection, 503 past them, libmicrohttpd's own limits a
 * little above ours), the idle timeout, and the refusal of a NUL byte decoded from the URL.
 * Routes live in http_routes.c, SSE in http_sse.c, /metrics in http_metrics.c. */
#define _GNU_SOURCE
#include "daemon/http_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"

char *qh_strdup_printf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

/* ---- MHD on the libuv loop ------------------------------------------------------ */

static void on_mhd_timer(uv_timer_t *t);

/* One MHD turn, then the timer for its next deadline. A turn that closed a connection is
 * followed by another at once: at its connection limit MHD takes the listening socket out of
 * its epoll set, and puts it back only at the start of a later turn. Without that turn
 * nothing would wake us (the socket that would is the one taken out), and clients queued in
 * the kernel's backlog would wait for good. */
static void mhd_run(qdd_http *h)
{
    if (!h->mhd) return;
    uint64_t closed = h->n_closed;
    MHD_run(h->mhd);
    MHD_UNSIGNED_LONG_LONG ms = 0;
    /* MHD_NO means no timeout is pending; a connection with work queued asks for 0. */
    if (h->n_closed != closed)
        uv_timer_start(&h->timer, on_mhd_timer, 0, 0);
    else if (MHD_get_timeout(h->mhd, &ms) == MHD_YES)
        uv_timer_start(&h->timer, on_mhd_timer, ms > 60000 ? 60000 : ms, 0);
    else
        uv_timer_stop(&h->timer);
}

static void on_mhd_timer(uv_timer_t *t) { mhd_run(t->data); }

static void on_mhd_poll(uv_poll_t *p, int status, int events) { mhd_run(p->data); }

void qh_kick(qdd_http *h)
{
    if (h->mhd) uv_timer_start(&h->timer, on_mhd_timer, 0, 0);
}

/* ---- requests -------------------------------------------------------------------- */

void qh_req_ref(qh_req *r) { r->refs++; }

void qh_req_unref(qh_req *r)
{
    if (--r->refs > 0) return;
    qdd_http *h = r->h;
    if (r->prev) r->prev->next = r->next;
    else if (h->reqs == r) h->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    free(r->body);
    free(r->resp);
    free(r->out);
    free(r);
}

/* The length of the valid UTF-8 sequence at p (1-4), or 0 when p does not start one
 * (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short). */
static size_t utf8_seq_len(const unsigned char *p)
{
    unsigned c = p[0];
    size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n <= 1) return n;
    unsigned cp = c & (0x7fu >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;   /* also stops at the terminating NUL */
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

/* JSON string escaping for error messages (the rest of the JSON goes through cJSON). The
 * message may quote the client's bytes (a path, a query value), so anything that is not
 * valid UTF-8 becomes U+FFFD: the body stays valid JSON for any request. */
static char *json_error(const char *msg)
{
    size_t n = strlen(msg);
    char *s = malloc(n * 6 + 16), *w = s;
    if (!s) return NULL;
    w += sprintf(w, "{\"error\":\"");
    for (const unsigned char *p = (const unsigned char *)msg; *p;) {
        size_t k = utf8_seq_len(p);
        if (*p == '"' || *p == '\\') { *w++ = '\\'; *w++ = (char)*p; }
        else if (*p < 0x20) w += sprintf(w, "\\u%04x", *p);
        else if (k) { memcpy(w, p, k); w += k; p += k; continue; }
        else w += sprintf(w, "\\ufffd");
        p++;
    }
    strcpy(w, "\"}\n");
    return s;
}

static void add_common_headers(qh_req *r, struct MHD_Response *resp, const char *ctype)
{
    if (ctype) MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (r->refused) {
        MHD_add_response_header(resp, "Connection", "close");
        MHD_add_response_header(resp, "Retry-After", "1");
    }
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (r->origin[0]) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
}

enum MHD_Result qh_respond(qh_req *r, unsigned status, char *body, const char *ctype)
{
    size_t len = body ? strlen(body) : 0;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body ? body : (char *)"",
                                                                body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) { free(body); return MHD_NO; }
    add_common_headers(r, resp, body ? (ctype ? ctype : "application/json") : NULL);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == MHD_HTTP_NO_CONTENT && r->method == QH_OPTIONS) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type, Last-Event-ID");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ret = qh_queue(r, status, resp, body);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result qh_queue(qh_req *r, unsigned status, struct MHD_Response *resp, const char *body)
{
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    if (ret == MHD_YES && r->h->trace) r->h->trace(r->h->trace_ud, r, QH_TRACE_RESPONSE, (int)status, body);
    return ret;
}

enum MHD_Result qh_respond_error(qh_req *r, unsigned status, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return qh_respond(r, status, json_error(msg), "application/json");
}

enum MHD_Result qh_suspend(qh_req *r)
{
    if (!r->suspended) {
        MHD_suspend_connection(r->conn);
        r->suspended = 1;
    }
    return MHD_YES;
}

static void req_resume(qh_req *r)
{
    if (r->suspended && !r->mhd_done) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
        qh_kick(r->h);
    }
}

void qh_req_finish(qh_req *r, unsigned status, char *body, const char *ctype)
{
    if (r->resp_ready || r->mhd_done) { free(body); return; }
    r->resp_ready = 1;
    r->status = status;
    free(r->resp);
    r->resp = body;
    r->ctype = ctype;
    req_resume(r);
}

void qh_req_finish_error(qh_req *r, unsigned status, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    qh_req_finish(r, status, json_error(msg), "application/json");
}

/* Called by SSE when bytes are ready for a suspended stream. */
void qh_req_wake(qh_req *r) { req_resume(r); }

static qh_method method_parse(const char *m)
{
    if (!strcmp(m, "GET")) return QH_GET;
    if (!strcmp(m, "HEAD")) return QH_HEAD;
    if (!strcmp(m, "POST")) return QH_POST;
    if (!strcmp(m, "DELETE")) return QH_DELETE;
    if (!strcmp(m, "OPTIONS")) return QH_OPTIONS;
    return QH_OTHER;
}

static void origin_check(qh_req *r)
{
    const char *o = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!o || strlen(o) >= sizeof r->origin) return;
    for (size_t i = 0; i < r->h->n_cors; i++)
        if (!strcmp(r->h->cors[i], "*") || !strcasecmp(r->h->cors[i], o)) {
            snprintf(r->origin, sizeof r->origin, "%s", o);
            return;
        }
}

/* ---- connections and their limits ------------------------------------------------------- */

static qh_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: counts connections, in all and per client address, and marks
 * one past a limit so that its requests are answered 503 (and it is closed after the answer).
 * The counts are bounded by MHD's own limits, so the linear count per address stays short. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    qdd_http *h = cls;
    qh_conn *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        h->n_closed++;
        if (!c) return;
        *socket_context = NULL;
        if (c->prev) c->prev->next = c->next;
        else h->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        h->n_conns--;
        free(c);
        return;
    }
    if (!(c = calloc(1, sizeof *c))) return;   /* no context: its requests get 503 */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        c->ip = ((const struct sockaddr_in *)ci->client_addr)->sin_addr.s_addr;
    size_t same = 1;
    for (const qh_conn *o = h->conns; o; o = o->next) same += o->ip == c->ip;
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    h->n_conns++;
    c->over = h->n_conns > h->max_conns || (h->max_conns_per_ip && same > h->max_conns_per_ip);
    /* Once per episode: a client hammering the limit must not flood the log. */
    if (c->over && !h->over_logged)
        QD_LOG(QD_LOG_WARN, "http_connection_limit", "connections=%zu max=%zu from_this_client=%zu max_per_client=%zu",
               h->n_conns, h->max_conns, same, h->max_conns_per_ip);
    h->over_logged = c->over;
    *socket_context = c;
}

/* MHD_OPTION_URI_LOG_CALLBACK, called as each request's line is read (before the unescaping
 * below): a request starts with no NUL noted, whatever became of the one before (MHD may
 * have refused it before our handler saw it). Returns the request's initial *con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    qh_conn *c = conn_of(conn);
    if (c) c->nul_in_url = 0;
    return NULL;
}

/* MHD_OPTION_UNESCAPE_CALLBACK: MHD's own %HH decoding, noting a decoded NUL byte (the path
 * and arguments reach us as C strings, so "/v1/jobs/a%00b" would read as "/v1/jobs/a"). */
static size_t on_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    size_t n = MHD_http_unescape(s);
    if (memchr(s, 0, n)) {
        qh_conn *c = conn_of(conn);
        if (c) c->nul_in_url = 1;
    }
    return n;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    qdd_http *h = cls;
    qh_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->h = h;
        r->conn = conn;
        r->refs = 1;   /* MHD's, dropped in on_completed */
        r->method = method_parse(method);
        strcpy(r->last_id, "0");
        r->next = h->reqs;
        if (h->reqs) h->reqs->prev = r;
        h->reqs = r;
        *con_cls = r;
        if (h->trace) h->trace(h->trace_ud, r, QH_TRACE_BEGIN, 0, NULL);
        qh_conn *c = conn_of(conn);
        if (!c || c->over) {
            r->refused = 1;
            return qh_respond_error(r, MHD_HTTP_SERVICE_UNAVAILABLE, "too many connections (http-max-connections %zu, "
                                    "http-max-connections-per-ip %zu); try again", h->max_conns, h->max_conns_per_ip);
        }
        if (c->nul_in_url) return qh_respond_error(r, MHD_HTTP_BAD_REQUEST, "the URL holds a NUL byte (%%00)");
        if (strlen(url) >= sizeof r->path) return qh_respond_error(r, MHD_HTTP_URI_TOO_LONG, "the URL is too long");
        strcpy(r->path, url);
        origin_check(r);
        /* Refuse an oversized body before reading it, when the client says its size. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > h->max_body)
            return qh_respond_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "request body over %zu bytes", h->max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->body_too_big && r->body_len + *upload_size <= h->max_body) {
            char *nb = realloc(r->body, r->body_len + *upload_size + 1);
            if (!nb) return MHD_NO;
            memcpy(nb + r->body_len, upload_data, *upload_size);
            r->body = nb;
            r->body_len += *upload_size;
            r->body[r->body_len] = 0;
        } else {
            r->body_too_big = 1;   /* keep reading (and dropping) so the answer is clean */
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->resp_ready) {
        r->resp_ready = 0;
        char *b = r->resp;
        r->resp = NULL;
        if (r->sse && r->status == MHD_HTTP_OK && !r->sse_started) { free(b); return qh_sse_start(r); }
        return qh_respond(r, r->status, b, r->ctype);
    }
    if (r->routed) return MHD_YES;   /* woken without an answer yet (should not happen) */
    r->routed = 1;
    if (r->body_too_big)
        return qh_respond_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "request body over %zu bytes", h->max_body);
    return qh_route(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    qh_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    r->mhd_done = 1;
    qdd_http *h = cls;
    if (h->trace) h->trace(h->trace_ud, r, QH_TRACE_END, (int)toe, NULL);
    qh_req_unref(r);
}

/* ---- Redis ------------------------------------------------------------------------------
 * Commands go over the daemon's command connection (h->cmd). Each pending one is listed, so
 * qdd_http_stop can answer its request at once and leave a marker behind for the late reply
 * (the connection outlives the layer). */

int qh_redis_ready(const qdd_http *h) { return h->cmd && h->cmd->up; }

typedef struct qh_pending {
    struct qh_pending *prev, *next;
    qdd_http *h;                  /* NULL once orphaned by qdd_http_stop */
    qh_req *r;
    redisCallbackFn *fn;
} qh_pending;

static void pending_unlink(qh_pending *p)
{
    if (p->prev) p->prev->next = p->next;
    else if (p->h && p->h->pending == p) p->h->pending = p->next;
    if (p->next) p->next->prev = p->prev;
    p->prev = p->next = NULL;
}

static void on_redis_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_pending *p = priv;
    if (!p->h) { free(p); return; }   /* the layer stopped; its request was answered then */
    pending_unlink(p);
    qh_req *r = p->r;
    redisCallbackFn *fn = p->fn;
    free(p);
    fn(ac, reply, r);   /* reply NULL: the connection went away; the route answers 503 */
    qh_req_unref(r);
}

int qh_redis_cmd(qh_req *r, redisCallbackFn *fn, int argc, const char **argv, const size_t *lens)
{
    qdd_http *h = r->h;
    if (!qh_redis_ready(h) || h->stopping) return -1;
    qh_pending *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->h = h;
    p->r = r;
    p->fn = fn;
    if (qdd_rconn_cmdv(h->cmd, on_redis_reply, p, argc, argv, lens)) {
        free(p);
        return -1;
    }
    p->next = h->pending;
    if (h->pending) h->pending->prev = p;
    h->pending = p;
    qh_req_ref(r);
    return 0;
}

/* Every request waiting for Redis gets its callback with no reply now (503, streams end);
 * the entries stay allocated, orphaned, until hiredis hands their replies back. */
static void pending_orphan_all(qdd_http *h)
{
    while (h->pending) {
        qh_pending *p = h->pending;
        pending_unlink(p);
        qh_req *r = p->r;
        redisCallbackFn *fn = p->fn;
        p->h = NULL;
        fn(NULL, NULL, r);
        qh_req_unref(r);
    }
}

static void on_events_msg(void *pd, const char *channel, const char *payload, size_t len)
{
    qh_sse_event_published(pd, payload, len);
}

/* ---- start / stop -------------------------------------------------------------------- */

static int parse_addr(const char *spec, struct sockaddr_in *sa, qd_err *err)
{
    const char *colon = strrchr(spec, ':');
    char host[64];
    if (!colon || (size_t)(colon - spec) >= sizeof host)
        return qd_err_set(err, QD_EINVAL, "http: '%s' is not ADDR:PORT", spec);
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    if (!strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return qd_err_set(err, QD_EINVAL, "http: '%s' is not an IPv4 address", host);
    return 0;
}

static void cors_free(char **cors, size_t n)
{
    for (size_t i = 0; i < n; i++) free(cors[i]);
    free(cors);
}

/* Splits "a, b,c" into a new owned list (*out, *n); on failure nothing is left allocated. */
static int split_cors(const char *list, char ***out, size_t *n_out)
{
    char **cors = NULL;
    size_t n = 0;
    char *copy = strdup(list ? list : ""), *save = NULL;
    if (!copy) return QD_ENOMEM;
    for (char *t = strtok_r(copy, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        char **nc = realloc(cors, (n + 1) * sizeof *nc);
        if (!nc) goto nomem;
        cors = nc;
        if (!(cors[n] = strdup(t))) goto nomem;
        n++;
    }
    free(copy);
    *out = cors;
    *n_out = n;
    return 0;
nomem:
    free(copy);
    cors_free(cors, n);
    return QD_ENOMEM;
}

/* The settings a reload may change, copied from cfg; all or nothing. */
static int settings_apply(qdd_http *h, const qdd_config *cfg)
{
    char **cors = NULL;
    size_t n_cors = 0;
    char *token = strdup(cfg->http_token ? cfg->http_token : "");
    if (!token || split_cors(cfg->http_cors, &cors, &n_cors)) {
        free(token);
        return QD_ENOMEM;
    }
    free(h->token);
    cors_free(h->cors, h->n_cors);
    h->token = token;
    h->cors = cors;
    h->n_cors = n_cors;
    h->max_body = cfg->max_job_bytes > 0 ? (size_t)cfg->max_job_bytes : QH_MAX_BODY_DEFAULT;
    h->max_job_bytes = cfg->max_job_bytes;
    h->retention_s = cfg->retention_s > 0 ? cfg->retention_s : 1;
    h->max_streams = cfg->http_max_streams > 0 ? (size_t)cfg->http_max_streams : 1;
    return 0;
}

int qdd_http_reconfigure(qdd_http *h, const qdd_config *cfg, uint64_t generation, qd_err *err)
{
    if (!h) return 0;
    if (settings_apply(h, cfg)) return qd_err_set(err, QD_ENOMEM, "http: out of memory; running settings kept");
    h->config_gen = generation;
    QD_LOG(QD_LOG_INFO, "http_reconfigured", "generation=%llu mutating=%s cors=%zu max_body=%zu max_streams=%zu",
           (unsigned long long)generation, h->token[0] ? "on" : "off", h->n_cors, h->max_body, h->max_streams);
    return 0;
}

static void http_free(qdd_http *h)
{
    if (!h) return;
    while (h->conns) {   /* MHD_stop_daemon's close notices freed them; this is a guard */
        qh_conn *c = h->conns;
        h->conns = c->next;
        free(c);
    }
    free(h->token);
    cors_free(h->cors, h->n_cors);
    free(h);
}

/* MHD's messages are mostly about clients' malformed requests: debug level, one line. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    if (QD_LOG_DEBUG < qd_log_threshold) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '"') *p = ' ';
    QD_LOG(QD_LOG_DEBUG, "http mhd", "msg=\"%s\"", msg);
}

static void on_sse_timer(uv_timer_t *t) { qh_sse_tick(t->data); }

int qdd_http_start(uv_loop_t *loop, const qdd_config *cfg, const qdd_http_view *view,
                   qdd_rconn *cmd, qdd_rconn *sub, qdd_http **out, qd_err *err)
{
    *out = NULL;
    if (!cfg->http || !*cfg->http) return 0;
    qdd_http *h = calloc(1, sizeof *h);
    if (!h) return qd_err_set(err, QD_ENOMEM, "out of memory");
    h->loop = loop;
    h->cmd = cmd;
    h->sub = sub;
    h->config_gen = 1;
    if (view) h->view = *view;
    qp_err pe = {0};
    int rc;
    if (qp_keys_init(&h->keys, cfg->queue, cfg->key_prefix, &pe)) {
        rc = qd_err_set(err, QD_EINVAL, "http: %s", pe.msg);
        goto fail;
    }
    if (settings_apply(h, cfg)) {
        rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        goto fail;
    }
    if (qp_key_events_channel(&h->keys, h->events_chan, sizeof h->events_chan)) {
        rc = qd_err_set(err, QD_EINVAL, "http: the events channel name is too long");
        goto fail;
    }
    struct sockaddr_in sa;
    if ((rc = parse_addr(cfg->http, &sa, err))) goto fail;
    /* The limits: ours answer 503; MHD's sit QH_CONN_SLACK above them. The idle timeout does
     * not end a quiet event stream (a suspended connection has none; a resume restarts it),
     * only one whose client stopped reading or a connection that sends nothing. */
    h->max_conns = cfg->http_max_conns > 0 ? (size_t)cfg->http_max_conns : 256;
    h->max_conns_per_ip = cfg->http_max_conns_per_ip > 0 ? (size_t)cfg->http_max_conns_per_ip : 0;
    unsigned hard = (unsigned)(h->max_conns + QH_CONN_SLACK(h->max_conns));
    unsigned hard_ip = h->max_conns_per_ip ? (unsigned)(h->max_conns_per_ip + QH_CONN_SLACK(h->max_conns_per_ip)) : 0;
    unsigned timeout_s = cfg->http_timeout_s > 0 ? (unsigned)cfg->http_timeout_s : 30;
    /* External epoll mode: no MHD thread; the loop polls MHD's epoll fd. Suspend/resume
     * lets a request wait for Redis without blocking the loop. */
    h->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                              on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                              MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
                              MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, h,
                              MHD_OPTION_CONNECTION_LIMIT, hard,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, hard_ip,
                              MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                              MHD_OPTION_END);
    if (!h->mhd) {
        rc = qd_err_set(err, QD_EIO, "http: cannot listen on %s (%s)", cfg->http,
                        errno ? strerror(errno) : "libmicrohttpd refused");
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info) {
        MHD_stop_daemon(h->mhd);
        rc = qd_err_set(err, QD_EUNSUPPORTED, "http: libmicrohttpd has no epoll support");
        goto fail;
    }
    uv_poll_init(loop, &h->poll, info->epoll_fd);
    uv_timer_init(loop, &h->timer);
    uv_timer_init(loop, &h->sse_timer);
    h->poll.data = h->timer.data = h->sse_timer.data = h;
    h->n_open_handles = 3;
    uv_poll_start(&h->poll, UV_READABLE, on_mhd_poll);
    uv_timer_start(&h->sse_timer, on_sse_timer, 1000, 1000);
    if (sub && qdd_rconn_subscribe(sub, h->events_chan, on_events_msg, h) == 0) h->subscribed = 1;
    else if (sub) QD_LOG(QD_LOG_ERROR, "http", "err=\"cannot subscribe to %s: live events only by polling\"", h->events_chan);
    mhd_run(h);
    const union MHD_DaemonInfo *port = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    QD_LOG(QD_LOG_INFO, "http listening", "addr=%s port=%u mutating=%s cors=%zu max_connections=%zu "
           "max_connections_per_ip=%zu timeout_s=%u max_streams=%zu", cfg->http, port ? (unsigned)port->port : 0u,
           h->token[0] ? "on" : "off", h->n_cors, h->max_conns, h->max_conns_per_ip, timeout_s, h->max_streams);
    *out = h;
    return 0;
fail:
    http_free(h);
    return rc;
}

static void on_handle_closed(uv_handle_t *hd)
{
    qdd_http *h = hd->data;
    if (--h->n_open_handles > 0) return;
    void (*done)(void *) = h->done;
    void *ud = h->done_ud;
    /* Requests still referenced by nobody else were freed by MHD's completion notices. */
    while (h->reqs) {
        qh_req *r = h->reqs;
        h->reqs = r->next;
        free(r->body);
        free(r->resp);
        free(r->out);
        free(r);
    }
    http_free(h);
    if (done) done(ud);
}

void qdd_http_stop(qdd_http *h, void (*done)(void *ud), void *ud)
{
    if (!h) {
        if (done) done(ud);
        return;
    }
    h->stopping = 1;
    h->done = done;
    h->done_ud = ud;
    /* Pending Redis callbacks run now with a NULL reply and answer 503; streams end. The
     * connections are the daemon's and stay. */
    if (h->subscribed) qdd_rconn_unsubscribe(h->sub, h->events_chan, h);
    h->subscribed = 0;
    pending_orphan_all(h);
    qh_sse_close_all(h);
    /* Every suspended connection must be resumed before MHD_stop_daemon. */
    for (qh_req *r = h->reqs; r; r = r->next)
        if (r->suspended && !r->mhd_done) {
            if (!r->resp_ready && !r->sse_started) {
                r->resp_ready = 1;
                r->status = MHD_HTTP_SERVICE_UNAVAILABLE;
                r->resp = json_error("the daemon is stopping");
                r->ctype = "application/json";
            }
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
    MHD_run(h->mhd);
    uv_poll_stop(&h->poll);
    MHD_stop_daemon(h->mhd);   /* closes every connection; completion notices free the requests */
    h->mhd = NULL;
    uv_close((uv_handle_t *)&h->poll, on_handle_closed);
    uv_close((uv_handle_t *)&h->timer, on_handle_closed);
    uv_close((uv_handle_t *)&h->sse_timer, on_handle_closed);
}
