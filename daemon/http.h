/* The HTTP status API and dashboard, served from the daemon's libuv loop through
 * libmicrohttpd (external epoll mode driven by uv_poll and a uv_timer).
 *
 * Contract between the HTTP layer and the rest of the daemon. The HTTP layer reads job
 * state from Redis itself, over connections the daemon owns and hands to it (rconn.h: its
 * commands go over the daemon's command connection, the events channel arrives through the
 * daemon's subscribe connection; keys from proto/keys.h; MHD connections are suspended
 * while a reply is pending), and submits and
 * cancels jobs the way proto/redis.md documents (validate + LPUSH, with a "queued" status
 * hash written in the same script so the job can be seen and cancelled while it waits;
 * cancel flag + PUBLISH, or straight off the queue for a job still on it).
 * What only the daemon knows in memory — readiness, worker states, metrics counters — it
 * asks for through qdd_http_view, whose callbacks the daemon implements. All callbacks run
 * on the loop thread and must not block.
 *
 * Endpoints: GET /healthz, /readyz, /metrics (Prometheus text), /v1/jobs[?state=],
 * /v1/jobs/{id}, /v1/jobs/{id}/events (SSE), POST /v1/jobs, DELETE /v1/jobs/{id}, and the
 * dashboard at / (static files shipped in daemon/dashboard/, compiled in).
 *
 * Every resource a client can hold is bounded: connections in all and per client address
 * (http-max-connections, http-max-connections-per-ip: a request on a connection past them is
 * answered 503 and the connection closed), idle connections (http-timeout; a quiet event
 * stream is not idle), event streams (http-max-streams, and a buffer each), request bodies
 * (max-job-bytes), headers (libmicrohttpd's per-connection memory). */
#ifndef QUANTD_DAEMON_HTTP_H
#define QUANTD_DAEMON_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"
#include "quant/core/error.h"

struct cJSON;

/* A snapshot of one worker for /metrics and the dashboard. */
typedef struct qdd_worker_view {
    char name[32];           /* "cpu-0", "cuda-1" */
    char state[16];          /* "starting", "idle", "busy", "dead", "failed_selftest" */
    char job_id[72];         /* current job or "" */
    int block;               /* current block or -1 */
    int part;                /* the part of the block's step it runs (daemon/parts.c) or -1 */
    int pid;
    int restarts;
    int64_t gpu_mem_used, gpu_mem_total;   /* bytes, -1 when not a GPU worker */
    char selftest[128];      /* the worker's self-test summary */
} qdd_worker_view;

typedef struct qdd_http_view {
    void *ud;
    /* 1 when Redis is connected and at least one worker is up; else 0 with the reason. */
    int (*ready)(void *ud, char *why, size_t cap);
    /* Fills up to cap workers; returns how many there are. */
    int (*workers)(void *ud, qdd_worker_view *out, int cap);
    /* Block durations seen by this daemon (seconds), for the histogram in /metrics:
     * appends the observations since the last call into the HTTP layer's own histogram. */
    size_t (*drain_block_seconds)(void *ud, double *out, size_t cap);
    /* Node name and the jobs running here now (for /metrics and the dashboard). */
    const char *(*node)(void *ud);
} qdd_http_view;

typedef struct qdd_http qdd_http;
struct qdd_rconn;

/* Starts listening on cfg->http (ADDR:PORT; "" disables the API and returns 0 with *out
 * NULL). Mutating endpoints need `Authorization: Bearer <cfg http token>`; CORS origins
 * come from the config. Redis commands go over cmd and the events channel is subscribed on
 * sub (both borrowed: they must stay initialised until qdd_http_stop; they may be down).
 * What the layer needs of cfg is copied: cfg may be freed once this returns. The
 * configuration generation starts at 1. *out is owned by the caller (qdd_http_stop). */
int qdd_http_start(uv_loop_t *loop, const qdd_config *cfg, const qdd_http_view *view,
                   struct qdd_rconn *cmd, struct qdd_rconn *sub, qdd_http **out, qd_err *err);
/* Applies a reloaded configuration from the next request on: the bearer token (the old one
 * is refused from then on), the CORS origins, the body limit (max-job-bytes), the retention of
 * a job cancelled while queued and the event stream limit (http-max-streams), copied;
 * generation is shown by /healthz, /readyz and /metrics. On failure (out of memory) the
 * running settings stay and err says so. The listening address and the connection limits
 * and timeout are not changed here. */
int qdd_http_reconfigure(qdd_http *h, const qdd_config *cfg, uint64_t generation, qd_err *err);
/* Stops accepting, closes every connection and handle; done(ud) runs once all libuv
 * handles are closed (the struct is freed before done is called). Requests waiting for a
 * Redis reply are answered 503 at once (their late replies are dropped). Accepts NULL (done
 * is then called at once). */
void qdd_http_stop(qdd_http *h, void (*done)(void *ud), void *ud);

#endif
