/* One Redis connection with reconnect, connect deadline, PING watchdog and re-subscription
 * (rconn.h says what it promises). The single timer's meaning follows the state:
 *   closing            close deadline: a clean disconnect that has not finished is forced
 *   no context         retry: connect again (backoff 100 ms doubling to 5 s)
 *   context, not up    connect deadline: drop the context and retry
 *   up                 watchdog: send a probe, or drop when one went unanswered too long
 * The timer never fires inside a hiredis callback, so it may free the context there. */
#define _GNU_SOURCE
#include "daemon/rconn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/redis_uv.h"
#include "quant/core/log.h"

#define CLOSE_WAIT_MS 2000

static void schedule_retry(qdd_rconn *c);
static void on_timer(uv_timer_t *t);
static void timer_close(qdd_rconn *c);

static void set_err(qdd_rconn *c, int err, const char *msg)
{
    c->err = err ? err : REDIS_ERR_OTHER;
    snprintf(c->errstr, sizeof c->errstr, "%s", msg && *msg ? msg : "unknown error");
}

static void arm(qdd_rconn *c, uv_timer_cb cb, uint64_t ms, uint64_t repeat)
{
    if (!c->closed && !uv_is_closing((uv_handle_t *)&c->timer)) uv_timer_start(&c->timer, cb, ms, repeat);
}

/* ---- subscriptions ---------------------------------------------------------------------- */

static void send_subscribe(qdd_rconn *c, const char *channel);

/* Every reply on a subscribed channel lands here: messages are dispatched by channel, and a
 * "subscribe" confirmation also answers the watchdog probe (see probe()). */
static void on_sub_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    redisReply *m = r;
    if (!m || c->ac != ac || m->type != REDIS_REPLY_ARRAY || m->elements < 3) return;
    const redisReply *kind = m->element[0], *chan = m->element[1], *body = m->element[2];
    if (kind->type != REDIS_REPLY_STRING || chan->type != REDIS_REPLY_STRING) return;
    if (!strcasecmp(kind->str, "subscribe")) {
        c->ping_outstanding = 0;
        return;
    }
    if (strcasecmp(kind->str, "message") || body->type != REDIS_REPLY_STRING) return;
    for (int i = 0; i < c->n_subs; i++)
        if (!strcmp(c->subs[i].channel, chan->str)) {
            c->subs[i].fn(c->subs[i].pd, chan->str, body->str, body->len);
            return;
        }
}

static void send_subscribe(qdd_rconn *c, const char *channel)
{
    redisAsyncCommand(c->ac, on_sub_reply, c, "SUBSCRIBE %s", channel);
}

int qdd_rconn_subscribe(qdd_rconn *c, const char *channel, qdd_rconn_msg_fn *fn, void *pd)
{
    if (c->n_subs >= QDD_RCONN_MAX_SUBS) return QD_EINVAL;
    char *ch = strdup(channel);
    if (!ch) return QD_ENOMEM;
    c->subs[c->n_subs++] = (qdd_rconn_sub){ch, fn, pd};
    if (c->up && c->ac) send_subscribe(c, ch);
    return 0;
}

static void ignore_reply(redisAsyncContext *ac, void *r, void *pd) {}

void qdd_rconn_unsubscribe(qdd_rconn *c, const char *channel, void *pd)
{
    for (int i = 0; i < c->n_subs; i++) {
        if (strcmp(c->subs[i].channel, channel) || c->subs[i].pd != pd) continue;
        int still = 0;   /* another subscriber of the same channel keeps it subscribed */
        for (int k = 0; k < c->n_subs; k++) still |= k != i && !strcmp(c->subs[k].channel, channel);
        if (!still && c->up && c->ac && !c->closing) redisAsyncCommand(c->ac, ignore_reply, NULL, "UNSUBSCRIBE %s", channel);
        free(c->subs[i].channel);
        c->subs[i] = c->subs[--c->n_subs];
        return;
    }
}

/* ---- connect, up, down --------------------------------------------------------------------- */

static int is_auth_error(const char *s)
{
    return s && (!strncmp(s, "NOAUTH", 6) || !strncmp(s, "WRONGPASS", 9) || strstr(s, "invalid password") ||
                 strstr(s, "invalid username-password"));
}

static void auth_failed(qdd_rconn *c, redisAsyncContext *ac, const char *msg)
{
    if (!c->auth_failed) {
        c->auth_failed = 1;
        c->auth_failures++;
        set_err(c, REDIS_ERR_OTHER, msg);
        QD_LOG(QD_LOG_ERROR, "redis_auth_failed", "conn=%s host=%s port=%d user=%s err=\"%s\" retry_ms=%d", c->name,
               c->url.host, c->url.port, c->url.user ? c->url.user : "-", msg, c->backoff_ms);
    }
    redisAsyncDisconnect(ac);   /* the disconnect callback schedules the retry */
}

static void on_auth_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    redisReply *reply = r;
    if (!reply || c->ac != ac) return;
    if (reply->type == REDIS_REPLY_ERROR) auth_failed(c, ac, reply->str);
}

/* SELECT doubles as the "ready" probe: its reply comes after AUTH's and CLIENT SETNAME's. */
static void on_ready_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    redisReply *reply = r;
    if (!reply || c->ac != ac || c->closing) return;
    if (reply->type == REDIS_REPLY_ERROR) {
        if (c->auth_failed || is_auth_error(reply->str)) {
            auth_failed(c, ac, reply->str);
        } else {
            set_err(c, REDIS_ERR_OTHER, reply->str);
            QD_LOG(QD_LOG_ERROR, "redis_select_failed", "conn=%s db=%d err=\"%s\"", c->name, c->url.db, reply->str);
            redisAsyncDisconnect(ac);
        }
        return;
    }
    c->up = 1;
    c->ac_was_up = 1;
    c->ups++;
    c->backoff_before_up = c->backoff_ms;
    c->backoff_ms = c->backoff_min_ms;
    c->ping_outstanding = 0;
    QD_LOG(QD_LOG_INFO, "redis_up", "conn=%s host=%s port=%d attempts=%llu", c->name, c->url.host, c->url.port,
           (unsigned long long)c->attempts);
    for (int i = 0; i < c->n_subs; i++) send_subscribe(c, c->subs[i].channel);
    /* The timer turns from connect deadline into the watchdog. */
    arm(c, on_timer, (uint64_t)c->ping_interval_ms, (uint64_t)c->ping_interval_ms);
    if (c->on_up) c->on_up(c);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    qdd_rconn *c = ac->data;
    if (c->ac != ac) return;
    if (status != REDIS_OK) {
        set_err(c, ac->err, ac->errstr);
        QD_LOG(QD_LOG_WARN, "redis_connect_failed", "conn=%s host=%s port=%d err=\"%s\" retry_ms=%d", c->name,
               c->url.host, c->url.port, ac->errstr, c->backoff_ms);
        c->ac = NULL;   /* hiredis frees the context after this callback */
        schedule_retry(c);
        return;
    }
    const qdd_redis_url *u = &c->url;
    if (u->pass) {
        if (u->user) redisAsyncCommand(ac, on_auth_reply, c, "AUTH %s %s", u->user, u->pass);
        else redisAsyncCommand(ac, on_auth_reply, c, "AUTH %s", u->pass);
    }
    if (c->client_name[0]) redisAsyncCommand(ac, ignore_reply, NULL, "CLIENT SETNAME %s", c->client_name);
    redisAsyncCommand(ac, on_ready_reply, c, "SELECT %d", u->db);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    qdd_rconn *c = ac->data;
    if (c->ac != ac) return;
    int was_up = c->ac_was_up;
    c->ac = NULL;
    c->up = c->ac_was_up = 0;
    c->ping_outstanding = 0;
    if (c->closing) {
        timer_close(c);
        return;
    }
    if (status != REDIS_OK) set_err(c, ac->err, ac->errstr);
    /* Ended by an error reply Redis sent unasked (hiredis ends a connection on one; a
     * SUBSCRIBE the ACL forbids is answered that way): Redis refuses this connection, and
     * would again after the next connect, so the backoff goes on from where it was when
     * the connection came up rather than from the minimum, or that would be a reconnect
     * loop. A connection that closes or breaks starts from the minimum as before. */
    if (was_up && status != REDIS_OK && ac->err == REDIS_ERR_OTHER && c->backoff_before_up > c->backoff_ms)
        c->backoff_ms = c->backoff_before_up;
    QD_LOG(QD_LOG_WARN, "redis_down", "conn=%s err=\"%s\" retry_ms=%d", c->name,
           status == REDIS_OK ? "closed" : ac->errstr, c->backoff_ms);
    if (was_up && c->on_down) c->on_down(c);
    schedule_retry(c);
}

/* ---- the timer ------------------------------------------------------------------------------ */

/* Drops the current context (never from inside a hiredis callback). A connected one goes
 * through the disconnect callback (pending callbacks get NULL, on_down, retry); one still
 * connecting has no disconnect callback, so the retry is scheduled here. */
static void drop(qdd_rconn *c)
{
    redisAsyncContext *ac = c->ac;
    if (!ac) return;
    c->drops++;
    c->up = 0;   /* pending callbacks run next and must not send on this context */
    if (ac->c.flags & REDIS_CONNECTED) {
        redisAsyncFree(ac);
    } else {
        c->ac = NULL;
        redisAsyncFree(ac);
        schedule_retry(c);
    }
}

/* The probe: PING, except on a subscribed connection, where hiredis 0.14.1 would never hand
 * the ["pong", ""] reply to a callback; there re-subscribing to a channel already subscribed
 * is the probe (Redis confirms with a "subscribe" reply, on_sub_reply clears the flag). */
static void on_ping_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    if (r && c->ac == ac) c->ping_outstanding = 0;
}

static void probe(qdd_rconn *c)
{
    if (!c->up || !c->ac || c->ping_outstanding) return;
    int rc;
    if (c->ac->c.flags & REDIS_SUBSCRIBED) {
        if (!c->n_subs) return;   /* leaving subscribed mode: skip this round */
        rc = redisAsyncCommand(c->ac, on_sub_reply, c, "SUBSCRIBE %s", c->subs[0].channel);
    } else {
        rc = redisAsyncCommand(c->ac, on_ping_reply, c, "PING");
    }
    if (rc == REDIS_OK) {
        c->ping_outstanding = 1;
        c->ping_sent_ms = uv_now(c->loop);
    }
}

void qdd_rconn_probe_now(qdd_rconn *c) { probe(c); }

static void on_timer(uv_timer_t *t)
{
    qdd_rconn *c = t->data;
    if (c->closing) {
        /* The clean disconnect did not finish in time (Redis stalled): force it. */
        if (c->ac) {
            QD_LOG(QD_LOG_WARN, "redis_close_forced", "conn=%s (replies still pending after %d ms)", c->name, CLOSE_WAIT_MS);
            redisAsyncContext *ac = c->ac;
            int connected = ac->c.flags & REDIS_CONNECTED;
            if (!connected) c->ac = NULL;
            redisAsyncFree(ac);   /* a connected one reaches on_disconnect, which closes the timer */
            if (!connected) timer_close(c);
        } else {
            timer_close(c);
        }
        return;
    }
    if (!c->ac) { qdd_rconn_connect(c); return; }
    if (!c->up) {
        set_err(c, REDIS_ERR_IO, "not connected and ready within the connect timeout");
        QD_LOG(QD_LOG_WARN, "redis_connect_timeout", "conn=%s host=%s port=%d timeout_ms=%d retry_ms=%d", c->name,
               c->url.host, c->url.port, c->connect_timeout_ms, c->backoff_ms);
        drop(c);
        return;
    }
    if (c->ping_outstanding) {
        uint64_t waited = uv_now(c->loop) - c->ping_sent_ms;
        if (waited < (uint64_t)c->ping_timeout_ms) return;
        set_err(c, REDIS_ERR_IO, "the watchdog probe went unanswered");
        QD_LOG(QD_LOG_WARN, "redis_stalled", "conn=%s waited_ms=%llu (dropping the connection)", c->name,
               (unsigned long long)waited);
        drop(c);
        return;
    }
    probe(c);
}

static void schedule_retry(qdd_rconn *c)
{
    if (c->closing) return;
    c->last_retry_ms = c->backoff_ms;
    arm(c, on_timer, (uint64_t)c->backoff_ms, 0);
    c->backoff_ms = c->backoff_ms * 2 > c->backoff_max_ms ? c->backoff_max_ms : c->backoff_ms * 2;
}

static void on_timer_closed(uv_handle_t *h)
{
    qdd_rconn *c = h->data;
    c->closed = 1;
    for (int i = 0; i < c->n_subs; i++) free(c->subs[i].channel);
    c->n_subs = 0;
    qdd_redis_url_clear(&c->url);
    if (c->on_closed) c->on_closed(c);
}

static void timer_close(qdd_rconn *c)
{
    if (c->closed || uv_is_closing((uv_handle_t *)&c->timer)) return;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

/* ---- the API ------------------------------------------------------------------------------- */

int qdd_rconn_init(qdd_rconn *c, uv_loop_t *loop, const qdd_redis_url *url, const char *name)
{
    memset(c, 0, sizeof *c);
    c->loop = loop;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->backoff_ms = c->backoff_min_ms = QDD_BACKOFF_MIN_MS;
    c->backoff_max_ms = QDD_BACKOFF_MAX_MS;
    c->connect_timeout_ms = 3000;
    c->ping_interval_ms = 1000;
    c->ping_timeout_ms = 3000;
    c->url.port = url->port;
    c->url.db = url->db;
    if (!(c->url.host = strdup(url->host ? url->host : "127.0.0.1")) || (url->user && !(c->url.user = strdup(url->user))) ||
        (url->pass && !(c->url.pass = strdup(url->pass)))) {
        qdd_redis_url_clear(&c->url);
        return QD_ENOMEM;
    }
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    return 0;
}

void qdd_rconn_connect(qdd_rconn *c)
{
    if (c->closing || c->ac) return;
    if (!c->attempts) c->backoff_ms = c->backoff_min_ms;   /* tunables are set after init */
    c->attempts++;
    c->auth_failed = c->ac_was_up = 0;
    redisAsyncContext *ac = redisAsyncConnect(c->url.host, c->url.port);
    if (!ac || ac->err) {
        set_err(c, ac ? ac->err : REDIS_ERR_OOM, ac ? ac->errstr : "out of memory");
        QD_LOG(QD_LOG_WARN, "redis_connect_failed", "conn=%s host=%s port=%d err=\"%s\" retry_ms=%d", c->name,
               c->url.host, c->url.port, c->errstr, c->backoff_ms);
        if (ac) redisAsyncFree(ac);
        schedule_retry(c);
        return;
    }
    ac->data = c;
    if (qdd_redis_uv_attach(ac, c->loop) != REDIS_OK) {
        set_err(c, REDIS_ERR_OTHER, "cannot watch the socket on the loop");
        redisAsyncFree(ac);
        schedule_retry(c);
        return;
    }
    c->ac = ac;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    arm(c, on_timer, (uint64_t)c->connect_timeout_ms, 0);
}

void qdd_rconn_close(qdd_rconn *c)
{
    if (c->closing) return;
    c->closing = 1;
    c->up = 0;
    redisAsyncContext *ac = c->ac;
    if (!ac) { timer_close(c); return; }
    if (!(ac->c.flags & REDIS_CONNECTED)) {
        c->ac = NULL;
        redisAsyncFree(ac);
        timer_close(c);
        return;
    }
    /* A clean disconnect: queued writes go out and pending replies are awaited, at most
     * CLOSE_WAIT_MS; on_disconnect then closes the timer. It may run right here. */
    arm(c, on_timer, CLOSE_WAIT_MS, 0);
    redisAsyncDisconnect(ac);
}

int qdd_rconn_cmdv(qdd_rconn *c, redisCallbackFn *fn, void *pd, int argc, const char **argv, const size_t *lens)
{
    if (!c->up || !c->ac) return -1;
    return redisAsyncCommandArgv(c->ac, fn, pd, argc, argv, lens) == REDIS_OK ? 0 : -1;
}

int qdd_rconn_cmdf(qdd_rconn *c, redisCallbackFn *fn, void *pd, const char *fmt, ...)
{
    if (!c->up || !c->ac) return -1;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAsyncCommand(c->ac, fn, pd, fmt, ap);
    va_end(ap);
    return rc == REDIS_OK ? 0 : -1;
}
