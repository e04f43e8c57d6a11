/* hiredis on the libuv loop: one uv_poll per async context, driven by hiredis's add/del
 * read/write hooks. See redis_uv.h for why the daemon does not use hiredis's own adapter. */
#include "daemon/redis_uv.h"

#include <stdlib.h>

typedef struct redis_uv {
    redisAsyncContext *ac;   /* NULL once hiredis has let go of the context (cleanup ran) */
    uv_poll_t poll;
    int events;              /* UV_READABLE | UV_WRITABLE wanted by hiredis */
} redis_uv;

static void on_poll(uv_poll_t *h, int status, int events)
{
    redis_uv *p = h->data;
    if (!p->ac) return;
    if (status < 0) {
        /* libuv stopped the poll (POLLERR). Let hiredis look at the socket: while connecting
         * a write event makes it read SO_ERROR and call the connect callback with the error;
         * once connected a read event makes the read fail and the disconnect path run. */
        redisAsyncContext *ac = p->ac;
        if (!(ac->c.flags & REDIS_CONNECTED)) redisAsyncHandleWrite(ac);
        else redisAsyncHandleRead(ac);
        /* Still alive (hiredis saw no error after all): re-arm what libuv stopped. */
        if (p->ac && p->events) uv_poll_start(&p->poll, p->events, on_poll);
        return;
    }
    if (events & UV_READABLE) redisAsyncHandleRead(p->ac);
    /* The read may have freed the context (cleanup clears p->ac). */
    if (p->ac && (events & UV_WRITABLE)) redisAsyncHandleWrite(p->ac);
}

static void update(redis_uv *p)
{
    if (uv_is_closing((uv_handle_t *)&p->poll)) return;
    if (p->events) uv_poll_start(&p->poll, p->events, on_poll);
    else uv_poll_stop(&p->poll);
}

static void add_read(void *pd) { redis_uv *p = pd; p->events |= UV_READABLE; update(p); }
static void del_read(void *pd) { redis_uv *p = pd; p->events &= ~UV_READABLE; update(p); }
static void add_write(void *pd) { redis_uv *p = pd; p->events |= UV_WRITABLE; update(p); }
static void del_write(void *pd) { redis_uv *p = pd; p->events &= ~UV_WRITABLE; update(p); }

static void on_closed(uv_handle_t *h) { free(h->data); }

/* hiredis is done with the context: the state goes once the poll handle has closed. */
static void cleanup(void *pd)
{
    redis_uv *p = pd;
    p->ac = NULL;
    p->events = 0;
    uv_close((uv_handle_t *)&p->poll, on_closed);
}

int qdd_redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data) return REDIS_ERR;
    redis_uv *p = calloc(1, sizeof *p);
    if (!p) return REDIS_ERR;
    if (uv_poll_init(loop, &p->poll, ac->c.fd)) {
        free(p);
        return REDIS_ERR;
    }
    p->ac = ac;
    p->poll.data = p;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    ac->ev.data = p;
    return REDIS_OK;
}
