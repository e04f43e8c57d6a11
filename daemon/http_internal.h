/* Internal to the HTTP layer (daemon/http_*.c): the server struct, the per-request record
 * and the functions the files share. Not part of the daemon's API (that is http.h).
 *
 * Lifetime of a request: MHD calls on_request first with *con_cls NULL (qh_req is made),
 * then with body chunks, then a last time with no data, where the route either answers at
 * once or starts Redis commands and suspends the connection. Each Redis callback holds a
 * reference on the qh_req (refs), and MHD's completion notice drops another, so a reply
 * that lands after the client went away never touches freed memory. */
#ifndef QUANTD_DAEMON_HTTP_INTERNAL_H
#define QUANTD_DAEMON_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "daemon/http.h"
#include "daemon/rconn.h"
#include "proto/keys.h"

#define QH_MAX_BODY_DEFAULT (64 * 1024)
/* Connections past the configured limits are still accepted, up to this many more, so they
 * can be answered 503 rather than left waiting; past the slack libmicrohttpd itself stops
 * accepting (the total: clients wait in the kernel's backlog until a connection ends) or
 * closes at once (per client address). */
#define QH_CONN_SLACK(n) ((n) / 8 + 4)
#define QH_N_BUCKETS 12
#define QH_SSE_KEEPALIVE_MS 15000
#define QH_SSE_POLL_MS 2000    /* re-read streams even without a Pub/Sub wake-up */

typedef enum qh_method { QH_GET = 0, QH_HEAD, QH_POST, QH_DELETE, QH_OPTIONS, QH_OTHER } qh_method;

typedef struct qh_req qh_req;

/* One TCP connection (MHD's socket context, from MHD_OPTION_NOTIFY_CONNECTION): what the
 * limits need to know of it. Owned by the server's list; freed when MHD closes it. */
typedef struct qh_conn {
    struct qh_conn *prev, *next;
    uint32_t ip;                  /* IPv4 address, network order (0 when unknown) */
    int over;                     /* accepted past a limit: its requests get 503 */
    int nul_in_url;               /* the request being parsed has %00 in its URL */
} qh_conn;

/* What qh_route decided for a request: the handler it runs. QH_ROUTE_NONE means the
 * dispatcher answered by itself (404, 405, a bad job id, a refused token). */
typedef enum qh_route_id {
    QH_ROUTE_NONE = 0,
    QH_ROUTE_PREFLIGHT,           /* OPTIONS anything: 204 with the CORS headers */
    QH_ROUTE_HEALTHZ,
    QH_ROUTE_READYZ,
    QH_ROUTE_METRICS,
    QH_ROUTE_WORKERS,
    QH_ROUTE_EVENTS,              /* GET /v1/events */
    QH_ROUTE_JOBS_LIST,           /* GET /v1/jobs */
    QH_ROUTE_JOB_SUBMIT,          /* POST /v1/jobs: needs the token */
    QH_ROUTE_JOB_GET,             /* GET /v1/jobs/{id} */
    QH_ROUTE_JOB_CANCEL,          /* DELETE /v1/jobs/{id}: needs the token */
    QH_ROUTE_JOB_EVENTS,          /* GET /v1/jobs/{id}/events */
    QH_ROUTE_ASSET,               /* a dashboard file */
} qh_route_id;

/* A test seam (tests/fuzz/http_fuzz_one.c): the points of a request's life a test checks
 * its invariants at. NULL in the daemon. */
typedef enum qh_trace_kind {
    QH_TRACE_BEGIN = 0,           /* a request record was made (value 0) */
    QH_TRACE_ROUTE,               /* its handler is about to run (value: qh_route_id) */
    QH_TRACE_RESPONSE,            /* a response was queued (value: status; body may be NULL) */
    QH_TRACE_END,                 /* MHD completed it (value: MHD_RequestTerminationCode) */
} qh_trace_kind;
typedef void qh_trace_fn(void *ud, const qh_req *r, qh_trace_kind kind, int value, const char *body);

struct qdd_http {
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    uv_poll_t poll;               /* MHD's epoll fd */
    uv_timer_t timer;             /* MHD's own timeouts, and a kick after a resume */
    uv_timer_t sse_timer;         /* SSE keep-alives and periodic stream re-reads */
    int n_open_handles;           /* handles still to close at stop */
    qdd_http_view view;
    qp_keys keys;
    /* The reloadable settings: copied from the configuration at start and by
     * qdd_http_reconfigure, so the layer never points into a configuration. */
    char *token;                  /* owned; "" = mutating endpoints off */
    char **cors;                  /* owned list of origins */
    size_t n_cors;
    size_t max_body;
    int64_t max_job_bytes;        /* the queue's payload limit (qdd_job_size_check) */
    int64_t retention_s;          /* a job cancelled while queued keeps its keys this long */
    size_t max_streams;           /* SSE streams open at once */
    uint64_t config_gen;          /* the daemon's configuration generation (readyz, metrics) */
    /* Redis: borrowed connections (rconn.h) that outlive the layer. Commands go over cmd;
     * the events channel arrives through sub, which dispatches by channel. */
    qdd_rconn *cmd, *sub;
    char events_chan[QP_KEY_MAX];
    int subscribed;               /* events_chan is registered on sub */
    struct qh_pending *pending;   /* commands awaiting a reply (doubly linked) */
    qh_req *reqs;                 /* every live request (doubly linked) */
    /* Connections, for the limits (fixed at start: libmicrohttpd's own limits sit above). */
    qh_conn *conns;               /* every open connection (doubly linked) */
    size_t n_conns;
    size_t max_conns, max_conns_per_ip;   /* 0 per IP = no per-client limit */
    uint64_t n_closed;            /* connections closed so far (MHD_run re-runs after a close) */
    int over_logged;              /* the last connection was past a limit (logged once) */
    /* Block-duration histogram: cumulative over the daemon's life, fed by the view. */
    uint64_t bucket[QH_N_BUCKETS];   /* per bucket (not cumulative); the last is +Inf */
    uint64_t n_obs;
    double sum_obs;
    int stopping;
    qh_trace_fn *trace;           /* the test seam above; NULL in the daemon */
    void *trace_ud;
    void (*done)(void *ud);
    void *done_ud;
};

struct qh_req {
    qdd_http *h;
    struct MHD_Connection *conn;
    qh_req *prev, *next;
    int refs;                     /* MHD (until completed) + one per pending Redis reply */
    int mhd_done;
    qh_method method;
    char path[512];
    char origin[256];             /* the Origin header when it is allowed, else "" */
    char *body;                   /* owned */
    size_t body_len;
    int body_too_big;
    int suspended;
    int routed;                   /* the route ran; later calls only answer */
    int refused;                  /* answered 503 for a limit: the connection closes after it */
    /* A deferred answer, filled by a Redis callback and queued on the next MHD call. */
    int resp_ready;
    unsigned status;
    char *resp;                   /* owned JSON or text */
    const char *ctype;
    /* Server-Sent Events. */
    int sse;                      /* 1: per-job stream, 2: every job (Pub/Sub) */
    int sse_started;              /* the streaming response is queued */
    char job[65];                 /* job id (QP_JOB_ID_MAX + 1) */
    char last_id[64];             /* last stream entry sent ("0" before any) */
    int fetching, dirty;
    char *out;                    /* owned; bytes waiting for the client */
    size_t out_len, out_cap, out_pos;
    int overflow;                 /* the client fell too far behind: the stream ends */
    int peer_closed;              /* the client went away while the stream was suspended */
    uint64_t last_write_ms;
};

/* http_server.c */
void qh_req_ref(qh_req *r);
void qh_req_unref(qh_req *r);
void qh_kick(qdd_http *h);                      /* run MHD soon (after a resume) */
/* Finishes a suspended request with status and a body (taken over; NULL = no body). */
void qh_req_finish(qh_req *r, unsigned status, char *body, const char *ctype);
void qh_req_finish_error(qh_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Queues an answer at once (inside on_request). Takes body over. */
enum MHD_Result qh_respond(qh_req *r, unsigned status, char *body, const char *ctype);
enum MHD_Result qh_respond_error(qh_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
enum MHD_Result qh_suspend(qh_req *r);
/* MHD_queue_response for r, reported to the trace seam; every response goes through it. */
enum MHD_Result qh_queue(qh_req *r, unsigned status, struct MHD_Response *resp, const char *body);
/* Sends a Redis command for r (ref held until the reply); returns 0 or -1 when Redis is away. */
int qh_redis_cmd(qh_req *r, redisCallbackFn *fn, int argc, const char **argv, const size_t *lens);
int qh_redis_ready(const qdd_http *h);
char *qh_strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Resumes a suspended SSE stream that has bytes to send. */
void qh_req_wake(qh_req *r);

/* http_routes.c */
enum MHD_Result qh_route(qh_req *r);

/* http_sse.c */
enum MHD_Result qh_sse_start(qh_req *r);        /* queue the streaming response (status 200) */
void qh_sse_event_published(qdd_http *h, const char *payload, size_t len);   /* Pub/Sub message */
void qh_sse_tick(qdd_http *h);                  /* keep-alives and periodic re-reads */
void qh_sse_fetch(qh_req *r);                   /* read new stream entries for a per-job stream */
void qh_sse_close_all(qdd_http *h);             /* at stop: end every stream */
size_t qh_sse_count(const qdd_http *h, const qh_req *except);   /* streams open or opening */

/* http_metrics.c */
void qh_metrics_drain(qdd_http *h);
/* Renders /metrics from the Redis counts (EVAL reply) and the view; malloc'd text. */
char *qh_metrics_render(qdd_http *h, const redisReply *counts);
/* The Lua script that returns the counts qh_metrics_render reads. */
extern const char qh_metrics_script[];

/* The dashboard files, compiled in (daemon/http_assets.h). */
#include "daemon/http_assets.h"

#endif
