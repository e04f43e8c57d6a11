/* One hiredis async connection on the daemon's libuv loop, with AUTH/SELECT from the URL
 * and reconnection with exponential backoff (100 ms doubling to 5 s) whenever Redis goes
 * away. Callers send commands only while it is up; a command in flight when the connection
 * drops gets its callback with a NULL reply, and callers treat that as "unknown, redo after
 * reconnect" (daemon.h). */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <hiredis/adapters/libuv.h>

#include "quant/core/log.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

static void schedule_retry(qdd_rconn *c);

static void on_ready_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    redisReply *reply = r;
    if (!reply || c->ac != ac) return;
    if (reply->type == REDIS_REPLY_ERROR) {
        QD_LOG(QD_LOG_ERROR, "redis_auth_failed", "conn=%s err=\"%s\"", c->name, reply->str);
        redisAsyncDisconnect(ac);
        return;
    }
    c->up = 1;
    c->backoff_ms = BACKOFF_MIN_MS;
    QD_LOG(QD_LOG_INFO, "redis_up", "conn=%s host=%s port=%d", c->name, c->d->url.host, c->d->url.port);
    if (c->on_up) c->on_up(c);
}

static void on_auth_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    redisReply *reply = r;
    if (!reply || c->ac != ac) return;
    if (reply->type == REDIS_REPLY_ERROR) {
        QD_LOG(QD_LOG_ERROR, "redis_auth_failed", "conn=%s err=\"%s\"", c->name, reply->str);
        redisAsyncDisconnect(ac);
    }
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    qdd_rconn *c = ac->data;
    if (status != REDIS_OK) {
        QD_LOG(QD_LOG_WARN, "redis_connect_failed", "conn=%s err=\"%s\" retry_ms=%d", c->name, ac->errstr, c->backoff_ms);
        c->ac = NULL;   /* hiredis frees the context after this callback */
        schedule_retry(c);
        return;
    }
    const qdd_redis_url *u = &c->d->url;
    if (u->pass) {
        if (u->user) redisAsyncCommand(ac, on_auth_reply, c, "AUTH %s %s", u->user, u->pass);
        else redisAsyncCommand(ac, on_auth_reply, c, "AUTH %s", u->pass);
    }
    /* SELECT doubles as the "ready" probe: its reply comes after AUTH's. */
    redisAsyncCommand(ac, on_ready_reply, c, "SELECT %d", u->db);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    qdd_rconn *c = ac->data;
    int was_up = c->up;
    c->ping_outstanding = 0;
    c->ac = NULL;
    c->up = 0;
    if (!c->closing) QD_LOG(QD_LOG_WARN, "redis_down", "conn=%s err=\"%s\"", c->name, status == REDIS_OK ? "closed" : ac->errstr);
    if (was_up && c->on_down) c->on_down(c);
    if (!c->closing) schedule_retry(c);
}

static void on_retry(uv_timer_t *t)
{
    qdd_rconn_connect(t->data);
}

static void schedule_retry(qdd_rconn *c)
{
    if (c->closing) return;
    uv_timer_start(&c->retry, on_retry, (uint64_t)c->backoff_ms, 0);
    c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

void qdd_rconn_init(qdd_rconn *c, qdd_daemon *d, const char *name)
{
    memset(c, 0, sizeof *c);
    c->d = d;
    c->name = name;
    c->backoff_ms = BACKOFF_MIN_MS;
    uv_timer_init(d->loop, &c->retry);
    c->retry.data = c;
}

void qdd_rconn_connect(qdd_rconn *c)
{
    if (c->closing || c->ac) return;
    redisAsyncContext *ac = redisAsyncConnect(c->d->url.host, c->d->url.port);
    if (!ac || ac->err) {
        QD_LOG(QD_LOG_WARN, "redis_connect_failed", "conn=%s err=\"%s\"", c->name, ac ? ac->errstr : "out of memory");
        if (ac) redisAsyncFree(ac);
        schedule_retry(c);
        return;
    }
    ac->data = c;
    if (redisLibuvAttach(ac, c->d->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        schedule_retry(c);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
}

void qdd_rconn_close(qdd_rconn *c)
{
    c->closing = 1;
    uv_timer_stop(&c->retry);
    if (!uv_is_closing((uv_handle_t *)&c->retry)) uv_close((uv_handle_t *)&c->retry, NULL);
    if (c->ac) redisAsyncDisconnect(c->ac);
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

static void on_ping_reply(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_rconn *c = pd;
    if (c->ac == ac) c->ping_outstanding = 0;
}

void qdd_rconn_probe(qdd_rconn *c, double now_s, double timeout_s)
{
    if (!c->up || !c->ac) return;
    if (!c->ping_outstanding) {
        if (redisAsyncCommand(c->ac, on_ping_reply, c, "PING") == REDIS_OK) {
            c->ping_outstanding = 1;
            c->ping_sent_s = now_s;
        }
        return;
    }
    if (now_s - c->ping_sent_s < timeout_s) return;
    QD_LOG(QD_LOG_WARN, "redis_stalled", "conn=%s waited_s=%.1f (dropping the connection)", c->name, now_s - c->ping_sent_s);
    /* redisAsyncFree runs every pending callback with a NULL reply and then the disconnect
     * callback, which schedules the reconnect. */
    redisAsyncContext *ac = c->ac;
    redisAsyncFree(ac);
}
