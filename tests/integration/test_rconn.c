/* rconn.h against a real redis-server on a random loopback port, without a daemon:
 *   - connect refusals (nothing listens yet) are retried with backoff, and the connection
 *     comes up once redis-server starts (hiredis's own libuv adapter never retried here);
 *   - Redis killed with -9, and stopped with SHUTDOWN NOSAVE: down, then up again, with the
 *     subscriptions re-sent and dispatched by channel;
 *   - a stalled Redis (SIGSTOP): the watchdog drops the connection, connects that never get
 *     an answer hit the connect deadline, and SIGCONT brings it back;
 *   - a subscribed connection's watchdog probe is answered (no drop while idle);
 *   - AUTH refused: logged, counted, retried; the right password connects;
 *   - a user the ACL refuses the subscription (Redis answers the SUBSCRIBE with NOPERM and
 *     hiredis ends the connection): up, down, up ... with the delay still doubling to its
 *     cap, not started afresh at every up (issue #33: no reconnect loop on an error reply);
 *   - the retry delay doubles from backoff_min_ms up to backoff_max_ms while Redis refuses,
 *     and starts again from the minimum after the connection was up;
 *   - closing leaves no handle on the loop (uv_loop_close == 0). */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/rconn.h"
#include "redis_fixture.h"
#include "test_util.h"

static rf_redis rs;           /* the redis-server (tests/redis_fixture.h) */
static const char *tmp;
static uv_loop_t loop;

static int redis_start(const char *pass) { return rf_start(&rs, tmp, pass); }

static long long publish(const char *chan, const char *msg)
{
    redisContext *c = rf_connect(&rs);
    if (!c) return -1;
    redisReply *r = redisCommand(c, "PUBLISH %s %s", chan, msg);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* ---- running the loop until something holds ---------------------------------------------- */

typedef struct waiter {
    uv_timer_t t;
    int (*cond)(void *);
    void *arg;
    uint64_t deadline;
    int met;
} waiter;

static void on_wait_tick(uv_timer_t *t)
{
    waiter *w = t->data;
    if ((w->cond && w->cond(w->arg)) || uv_now(&loop) >= w->deadline) {
        w->met = w->cond ? w->cond(w->arg) : 1;
        uv_stop(&loop);
    }
}

/* Runs the loop until cond(arg) or ms pass; returns whether cond held (1 when cond is NULL). */
static int run_until(int (*cond)(void *), void *arg, int ms)
{
    waiter w = {.cond = cond, .arg = arg};
    uv_update_time(&loop);
    w.deadline = uv_now(&loop) + (uint64_t)ms;
    uv_timer_init(&loop, &w.t);
    w.t.data = &w;
    uv_timer_start(&w.t, on_wait_tick, 10, 10);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&w.t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return w.met;
}

/* ---- the connection under test ------------------------------------------------------------- */

typedef struct probe {
    int ups, downs;
    int msgs_a, msgs_b;
    char last[64];
} probe;

static void on_up(qdd_rconn *c) { ((probe *)c->ud)->ups++; }
static void on_down(qdd_rconn *c) { ((probe *)c->ud)->downs++; }

static void on_msg_a(void *pd, const char *ch, const char *payload, size_t len)
{
    probe *p = pd;
    p->msgs_a++;
    snprintf(p->last, sizeof p->last, "%.*s", (int)len, payload);
}

static void on_msg_b(void *pd, const char *ch, const char *payload, size_t len) { ((probe *)pd)->msgs_b++; }

static int is_up(void *arg) { return ((qdd_rconn *)arg)->up; }
static int is_down(void *arg) { return !((qdd_rconn *)arg)->up; }
static int got_a(void *arg) { return ((probe *)arg)->msgs_a > 0; }
static int got_b(void *arg) { return ((probe *)arg)->msgs_b > 0; }
static int two_drops(void *arg) { return ((qdd_rconn *)arg)->drops >= 2; }
static int attempts_3(void *arg) { return ((qdd_rconn *)arg)->attempts >= 3; }
static int auth_refused(void *arg) { return ((qdd_rconn *)arg)->auth_failures >= 2; }
static int closed(void *arg) { return ((qdd_rconn *)arg)->closed; }

static void conn_init(qdd_rconn *c, const char *name, const char *pass, probe *p)
{
    qdd_redis_url u = {.host = "127.0.0.1", .port = rs.port, .pass = (char *)pass};
    CHECK_OK(qdd_rconn_init(c, &loop, &u, name));
    c->ud = p;
    c->on_up = on_up;
    c->on_down = on_down;
    /* Short deadlines keep the test fast; the daemon uses 3 s. */
    c->connect_timeout_ms = 600;
    c->ping_interval_ms = 200;
    c->ping_timeout_ms = 600;
}

static probe pc, ps;
static qdd_rconn cmd, sub;

static void test_refused_then_up(void)
{
    conn_init(&cmd, "cmd", NULL, &pc);
    conn_init(&sub, "sub", NULL, &ps);
    CHECK_OK(qdd_rconn_subscribe(&sub, "chan:a", on_msg_a, &ps));
    CHECK_OK(qdd_rconn_subscribe(&sub, "chan:b", on_msg_b, &ps));
    qdd_rconn_connect(&cmd);
    qdd_rconn_connect(&sub);
    /* Nothing listens: each refusal must come back as a failure and a retry. */
    CHECK(run_until(attempts_3, &cmd, 3000));
    CHECK(cmd.attempts >= 3);
    CHECK(sub.attempts >= 3);
    CHECK_INT(cmd.up, 0);
    CHECK(cmd.err != 0);
    CHECK_CONTAINS(cmd.errstr, "refused");
    /* 100 ms doubling: the next delay is 100 << failures (one attempt may be in flight). */
    CHECK(cmd.backoff_ms == 100 << cmd.attempts || cmd.backoff_ms == 100 << (cmd.attempts - 1));
    CHECK_OK(redis_start(""));
    CHECK(run_until(is_up, &cmd, 8000));
    CHECK(run_until(is_up, &sub, 8000));
    CHECK_INT(pc.ups, 1);
    CHECK_INT(ps.ups, 1);
    CHECK_INT(pc.downs, 0);
    CHECK_INT(cmd.backoff_ms, 100);   /* reset by the successful connect */
}

static int attempts_8(void *arg) { return ((qdd_rconn *)arg)->attempts >= 8; }

/* Backoff alone, with small bounds: nothing listens on the port. */
static void test_backoff(void)
{
    probe p = {0};
    qdd_rconn c;
    qdd_redis_url u = {.host = "127.0.0.1", .port = rf_free_port()};
    CHECK_OK(qdd_rconn_init(&c, &loop, &u, "backoff"));
    c.ud = &p;
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 80;
    uv_update_time(&loop);
    uint64_t t0 = uv_now(&loop);
    qdd_rconn_connect(&c);
    CHECK(run_until(attempts_3, &c, 3000));
    /* Attempts 2 and 3 came after 20 and 40 ms. */
    CHECK(uv_now(&loop) - t0 >= 60);
    CHECK(run_until(attempts_8, &c, 3000));
    uint64_t took = uv_now(&loop) - t0;
    /* 20 + 40 + 80 (capped) x 5 = 460 ms before the 8th attempt, not a hot loop; the delay
     * stays at the cap (timers never fire early, so the bound below holds on any machine). */
    CHECK(took >= 460);
    CHECK_INT(c.backoff_ms, 80);
    CHECK_INT(c.up, 0);
    CHECK_INT(p.ups, 0);
    CHECK_INT(p.downs, 0);   /* never up, so never "down" */
    qdd_rconn_close(&c);
    CHECK(run_until(closed, &c, 3000));
}

static void test_subscribe_dispatch(void)
{
    run_until(NULL, NULL, 100);   /* the SUBSCRIBE replies */
    CHECK_INT(publish("chan:a", "hello"), 1);
    CHECK(run_until(got_a, &ps, 3000));
    CHECK_STR(ps.last, "hello");
    CHECK_INT(ps.msgs_b, 0);
    CHECK_INT(publish("chan:b", "x"), 1);
    CHECK(run_until(got_b, &ps, 3000));
    CHECK_INT(ps.msgs_a, 1);
    /* Idle for several watchdog rounds: the probes (PING on cmd, a re-SUBSCRIBE on sub) are
     * answered, nothing is dropped. */
    run_until(NULL, NULL, 1500);
    CHECK_INT(cmd.drops, 0);
    CHECK_INT(sub.drops, 0);
    CHECK(cmd.up && sub.up);
}

static void restart_case(int use_kill9)
{
    int ups_c = pc.ups, ups_s = ps.ups, downs_c = pc.downs;
    if (use_kill9) rf_kill9(&rs);
    else rf_shutdown(&rs);
    CHECK(run_until(is_down, &cmd, 5000));
    CHECK(run_until(is_down, &sub, 5000));
    CHECK_INT(pc.downs, downs_c + 1);
    run_until(NULL, NULL, 700);   /* a few refused reconnects */
    CHECK_INT(cmd.up, 0);
    CHECK_OK(redis_start(""));
    CHECK(run_until(is_up, &cmd, 8000));
    CHECK(run_until(is_up, &sub, 8000));
    CHECK_INT(pc.ups, ups_c + 1);
    CHECK_INT(ps.ups, ups_s + 1);
    /* The subscriptions came back with the connection. */
    run_until(NULL, NULL, 100);
    ps.msgs_a = 0;
    CHECK_INT(publish("chan:a", use_kill9 ? "after-kill" : "after-shutdown"), 1);
    CHECK(run_until(got_a, &ps, 3000));
    CHECK_STR(ps.last, use_kill9 ? "after-kill" : "after-shutdown");
}

static void test_restart_kill9(void) { restart_case(1); }
static void test_restart_shutdown(void) { restart_case(0); }

static void test_stalled(void)
{
    uint64_t drops = cmd.drops;
    kill(rs.pid, SIGSTOP);
    /* The watchdog drops the up connection; the reconnects that follow get a TCP connection
     * (the kernel accepts) but no reply to SELECT, so the connect deadline drops them too. */
    CHECK(run_until(is_down, &cmd, 3000));
    CHECK(run_until(two_drops, &cmd, 5000));
    CHECK(cmd.drops >= drops + 2);
    CHECK_INT(cmd.up, 0);
    kill(rs.pid, SIGCONT);
    CHECK(run_until(is_up, &cmd, 8000));
    CHECK(run_until(is_up, &sub, 8000));
}

static void test_auth(void)
{
    rf_kill9(&rs);
    CHECK_OK(redis_start("pw1"));
    probe pa = {0}, pb = {0};
    qdd_rconn bad, good;
    conn_init(&bad, "bad", "wrong", &pa);
    conn_init(&good, "good", "pw1", &pb);
    qdd_rconn_connect(&bad);
    qdd_rconn_connect(&good);
    CHECK(run_until(is_up, &good, 5000));
    CHECK(run_until(auth_refused, &bad, 5000));
    CHECK_INT(bad.up, 0);
    CHECK_INT(pa.ups, 0);
    CHECK(bad.auth_failures >= 2);   /* refused, logged and retried */
    qdd_rconn_close(&bad);
    qdd_rconn_close(&good);
    CHECK(run_until(closed, &bad, 3000));
    CHECK(run_until(closed, &good, 3000));
}

static int attempts_6(void *arg) { return ((qdd_rconn *)arg)->attempts >= 6; }

/* Redis (still running with password pw1 from test_auth) gets a user that may run every
 * command but subscribe to no channel. */
static void test_acl_subscribe_refused(void)
{
    redisContext *rc = rf_connect(&rs);
    CHECK(rc != NULL);
    if (!rc) return;
    freeReplyObject(redisCommand(rc, "AUTH pw1"));
    redisReply *r = redisCommand(rc, "ACL SETUSER nochan on >pw2 ~* +@all resetchannels");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    redisFree(rc);
    if (!ok) {
        fprintf(stderr, "test_rconn: this redis-server has no ACL; skipping the ACL case\n");
        return;
    }
    probe p = {0};
    qdd_rconn c;
    qdd_redis_url u = {.host = "127.0.0.1", .port = rs.port, .user = "nochan", .pass = "pw2"};
    CHECK_OK(qdd_rconn_init(&c, &loop, &u, "nochan"));
    c.ud = &p;
    c.on_up = on_up;
    c.on_down = on_down;
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 80;
    CHECK_OK(qdd_rconn_subscribe(&c, "chan:forbidden", on_msg_a, &p));
    qdd_rconn_connect(&c);
    CHECK(run_until(attempts_6, &c, 10000));
    /* Each attempt came up (AUTH and SELECT are allowed) and was ended by the refusal. */
    CHECK(p.ups >= 4);
    CHECK(p.downs >= 4);
    CHECK_CONTAINS(c.errstr, "NOPERM");
    /* 20, 40, 80, 80, ...: without the fix every retry after an up waited the minimum. */
    CHECK_INT(c.last_retry_ms, 80);
    CHECK_INT(p.msgs_a, 0);
    qdd_rconn_close(&c);
    CHECK(run_until(closed, &c, 3000));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!rf_installed()) {
        fprintf(stderr, "test_rconn: redis-server not installed; skipping\n");
        return TEST_SKIP;
    }
    tmp = test_tmpdir();
    rs.port = rf_free_port();
    uv_loop_init(&loop);
    TEST_RUN(test_backoff);
    TEST_RUN(test_refused_then_up);
    TEST_RUN(test_subscribe_dispatch);
    TEST_RUN(test_restart_kill9);
    TEST_RUN(test_restart_shutdown);
    TEST_RUN(test_stalled);
    test_current = "close";
    qdd_rconn_close(&cmd);
    qdd_rconn_close(&sub);
    CHECK(run_until(closed, &cmd, 3000));
    CHECK(run_until(closed, &sub, 3000));
    TEST_RUN(test_auth);
    TEST_RUN(test_acl_subscribe_refused);
    test_current = "loop";
    run_until(NULL, NULL, 50);
    CHECK_INT(uv_loop_close(&loop), 0);
    rf_kill9(&rs);
    return test_finish();
}
