/* One Redis connection of the daemon: a hiredis async context on a libuv loop (through the
 * daemon's own adapter, redis_uv.h), with AUTH / CLIENT SETNAME / SELECT from the URL,
 * reconnection with exponential backoff (100 ms doubling to 5 s) whenever Redis goes away
 * or refuses, a connect deadline (a connection not up within connect_timeout_ms is dropped
 * and retried, so a Redis that black-holes the connect or never answers AUTH cannot stall
 * reconnection), a PING watchdog while up (a probe unanswered for ping_timeout_ms drops the
 * connection, since an idle connection to a killed host may never notice on its own), and
 * Pub/Sub subscriptions that are re-sent on every reconnect and dispatched by channel.
 *
 * It knows nothing of the daemon: it takes the loop and the parsed URL, so tests and the
 * HTTP layer can create connections without one. Every Redis connection of the daemon is one
 * of these (cmd, pop, sub: three in all; the HTTP layer borrows cmd and sub).
 *
 * Callers send commands only while it is up; a command in flight when the connection drops
 * gets its callback with a NULL reply, and callers treat that as "unknown, redo after
 * reconnect". A connection ended by an error reply that Redis sent unasked (hiredis ends it
 * then; a SUBSCRIBE the ACL forbids is one) does not start the backoff afresh, so a refusal
 * that comes after every connect cannot make a reconnect loop. on_up runs after every (re)connect once AUTH and SELECT succeeded; on_down runs
 * when an up connection went away, after the pending callbacks ran.
 *
 * Ownership: the struct is the caller's (usually embedded); qdd_rconn_init copies the URL.
 * qdd_rconn_close ends it for good; the struct must stay valid until on_closed runs (or the
 * loop has no handle of it left). */
#ifndef QUANTD_DAEMON_RCONN_H
#define QUANTD_DAEMON_RCONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <hiredis/async.h>

#include "daemon/config.h"

#define QDD_RCONN_MAX_SUBS 8

/* The retry delay of every Redis step that failed, a connection or an error reply
 * (rerr.h): the first retry after QDD_BACKOFF_MIN_MS, doubling up to QDD_BACKOFF_MAX_MS. */
#define QDD_BACKOFF_MIN_MS 100
#define QDD_BACKOFF_MAX_MS 5000

/* A Pub/Sub message for one subscribed channel (payload is not NUL-terminated for the
 * callee's benefit; len says how long it is). */
typedef void qdd_rconn_msg_fn(void *pd, const char *channel, const char *payload, size_t len);

typedef struct qdd_rconn_sub {
    char *channel;            /* owned */
    qdd_rconn_msg_fn *fn;
    void *pd;
} qdd_rconn_sub;

typedef struct qdd_rconn {
    uv_loop_t *loop;
    qdd_redis_url url;        /* owned copy of the URL connected to */
    char name[16];            /* "cmd", "pop", "sub" (logs) */
    char client_name[96];     /* CLIENT SETNAME value; "" = none */
    void *ud;                 /* the owner's; callbacks find it here */
    void (*on_up)(struct qdd_rconn *c);
    void (*on_down)(struct qdd_rconn *c);
    void (*on_closed)(struct qdd_rconn *c);   /* after close, once its last handle closed */
    /* Tunables: defaults from init, change before connecting. */
    int connect_timeout_ms;   /* not up within this: dropped and retried (3000) */
    int ping_interval_ms;     /* watchdog probe period while up (1000) */
    int ping_timeout_ms;      /* a probe unanswered this long drops the connection (3000) */
    int backoff_min_ms;       /* the first retry's delay, and again after every up (100) */
    int backoff_max_ms;       /* the delay doubles up to this (5000) */
    /* State. */
    redisAsyncContext *ac;    /* NULL while down */
    int up;                   /* connected, authenticated, database selected */
    int ac_was_up;            /* the current context reached up (on_down is due when it goes) */
    int auth_failed;          /* the current context's AUTH was refused (logged once) */
    int closing;              /* qdd_rconn_close was called: no reconnect */
    int closed;               /* the timer handle is closed: nothing of it is left on the loop */
    int backoff_ms;           /* the next retry's delay */
    int backoff_before_up;    /* backoff_ms when it last came up: a connection Redis ended
                               * with an error reply goes on doubling from there */
    int last_retry_ms;        /* the delay of the last retry scheduled (logs, tests) */
    uv_timer_t timer;         /* retry while down, connect deadline while connecting, watchdog
                               * while up, close deadline while closing: one state at a time */
    int ping_outstanding;
    uint64_t ping_sent_ms;    /* uv_now of the outstanding probe */
    qdd_rconn_sub subs[QDD_RCONN_MAX_SUBS];
    int n_subs;
    /* Counters and the last failure (logs, tests). */
    uint64_t attempts, ups, drops, auth_failures;
    int err;                  /* hiredis REDIS_ERR_* of the last failure, 0 = none */
    char errstr[128];
} qdd_rconn;

/* Sets c up (copies url; no connection yet). 0, or QD_ENOMEM. */
int qdd_rconn_init(qdd_rconn *c, uv_loop_t *loop, const qdd_redis_url *url, const char *name);
/* Starts connecting; from then on it reconnects with backoff until closed. */
void qdd_rconn_connect(qdd_rconn *c);
/* Disconnects for good: commands already queued are flushed and their replies awaited (at
 * most 2 s), then the context and the timer close. Accepts a connection never connected. */
void qdd_rconn_close(qdd_rconn *c);
/* Sends a watchdog probe now (when up and none is outstanding): used when another connection
 * saw Redis go away, so this one notices within ping_timeout_ms. */
void qdd_rconn_probe_now(qdd_rconn *c);
/* Sends a command (argv with lengths). 0, or -1 when the connection is down (fn not called). */
int qdd_rconn_cmdv(qdd_rconn *c, redisCallbackFn *fn, void *pd, int argc, const char **argv,
                   const size_t *lens);
/* printf-style form of hiredis (%s, %b, %d ...). */
int qdd_rconn_cmdf(qdd_rconn *c, redisCallbackFn *fn, void *pd, const char *fmt, ...);
/* Subscribes to channel (now when up, and after every reconnect); messages go to fn(pd, ...).
 * 0, QD_ENOMEM, or QD_EINVAL when the table is full. */
int qdd_rconn_subscribe(qdd_rconn *c, const char *channel, qdd_rconn_msg_fn *fn, void *pd);
/* Removes the subscription of (channel, pd); fn is never called for it again. */
void qdd_rconn_unsubscribe(qdd_rconn *c, const char *channel, void *pd);

#endif
