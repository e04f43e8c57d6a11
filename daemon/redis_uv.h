/* The daemon's hiredis <-> libuv adapter (instead of hiredis/adapters/libuv.h).
 *
 * hiredis 0.14.1's own adapter returns without doing anything when uv_poll reports an error
 * status. libuv reports POLLERR that way (UV_EBADF, with the poll already stopped), which is
 * exactly what a non-blocking connect to a closed port produces: hiredis then never learns
 * that the connect failed, never calls the connect callback, and the caller never retries.
 * This adapter hands an error status to hiredis as a write event while connecting (hiredis
 * reads SO_ERROR and runs its connect-failure path) and as a read event once connected (the
 * read fails and hiredis runs its disconnect path), and re-arms the poll libuv stopped when
 * hiredis found nothing wrong.
 *
 * Ownership: the adapter state belongs to the context; hiredis frees it through the cleanup
 * hook (redisAsyncFree or a disconnect), and the poll handle is closed with uv_close before
 * its memory goes, so a loop run to completion holds no trace of it. */
#ifndef QUANTD_DAEMON_REDIS_UV_H
#define QUANTD_DAEMON_REDIS_UV_H

#include <uv.h>
#include <hiredis/async.h>

/* Attaches ac to loop. REDIS_OK, or REDIS_ERR (the caller then frees ac with redisAsyncFree). */
int qdd_redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);

#endif
