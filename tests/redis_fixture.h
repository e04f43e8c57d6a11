/* A throwaway redis-server for tests (hiredis's habit): started on a random loopback port in
 * a temp dir, no persistence, optionally with a password; killed with -9 or shut down
 * without saving, and started again on the same port to simulate a restart. Shared by the
 * tests that need Redis (test_rconn, test_http, test_daemon_jobs). */
#ifndef QUANTD_TESTS_REDIS_FIXTURE_H
#define QUANTD_TESTS_REDIS_FIXTURE_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

typedef struct rf_redis {
    int port;            /* the loopback port; set before rf_start (rf_free_port) and kept */
    pid_t pid;           /* 0 when not running */
    char dir[1024];      /* its working directory (--dir) */
} rf_redis;

/* 1 when redis-server is on PATH (a test without it returns TEST_SKIP). */
int rf_installed(void);
/* A loopback port nothing listens on right now. */
int rf_free_port(void);
/* Starts redis-server on r->port with --dir dir and, when pass is not NULL or "", that
 * password; waits (at most 5 s) until it answers a PING. 0, or -1 when it did not start. */
int rf_start(rf_redis *r, const char *dir, const char *pass);
/* kill -9 and reap; nothing when not running. */
void rf_kill9(rf_redis *r);
/* SHUTDOWN NOSAVE (a clean stop) and reap; with a password set, use rf_kill9. */
void rf_shutdown(rf_redis *r);
/* A blocking connection (2 s timeout), NULL when Redis does not answer. The caller frees it
 * (redisFree). */
redisContext *rf_connect(const rf_redis *r);

#endif
