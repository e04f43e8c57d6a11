/* The HTTP API's resource limits against a real redis-server (issue #33): connections in all
 * and per client address (503 past them, and the API still answers once they are gone, idle
 * or half-closed, even past libmicrohttpd's own limit), the idle timeout (it closes idle
 * connections but not a quiet event stream), the event stream limit, and the size of the
 * job as it will be queued (its canonical form) against max-job-bytes.
 *
 * Each phase starts the layer (qdd_http_start) with its own limits on a uv loop in the main
 * thread; a client thread makes the requests over 127.0.0.1, then stops the layer, and the
 * phase checks that every handle closed (uv_loop_close == 0). Nothing here measures time:
 * waits are loops with a bound that is only a guard against a hang. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/http.h"
#include "daemon/http_internal.h"
#include "daemon/rconn.h"
#include "http_client.h"
#include "redis_fixture.h"
#include "test_util.h"

static rf_redis rs;
static int http_port;

/* ---- a plain-socket client (tests/http_client.h) ------------------------------------------ */

typedef hc_resp resp;

static int sock_open(int secs) { return hc_connect(http_port, secs); }
/* -1 when no answer came (refused, closed without one, or the read guard of secs ran out). */
static int http_g(int secs, const char *method, const char *path, const char *headers, const char *body, resp *out)
{
    return hc_request(http_port, secs, method, path, headers, body, out);
}

static int http(const char *method, const char *path, const char *headers, const char *body, resp *out)
{
    return http_g(10, method, path, headers, body, out);
}

/* Asks /healthz until it answers `want` (the server may still be closing what the test just
 * closed); returns the last status seen. */
static int healthz_until(int want)
{
    resp r;
    int last = -1;
    for (int i = 0; i < 100 && last != want; i++) {
        last = http_g(3, "GET", "/healthz", NULL, NULL, &r) ? -1 : r.status;
        if (last != want) usleep(25000);
    }
    return last;
}

/* Opens n sockets that send nothing; returns how many connected. */
static int open_idle(int *fds, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((fds[i] = sock_open(5)) >= 0) k++;
    return k;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* 1 once the server has closed fd (end of file or a reset), 0 if the guard ran out first. */
static int closed_by_server(int fd)
{
    char b[256];
    for (int i = 0; i < 12; i++) {   /* 12 reads of up to 5 s each: a guard */
        ssize_t k = read(fd, b, sizeof b);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
    }
    return 0;
}

/* An event stream: the request sent and the response head read. */
static int sse_open(const char *path, char *head, size_t cap)
{
    int fd = sock_open(10);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) { close(fd); return -1; }
    size_t got = 0;
    head[0] = 0;
    while (got < cap - 1 && !strstr(head, "\r\n\r\n")) {
        ssize_t k = read(fd, head + got, cap - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        head[got] = 0;
    }
    return fd;
}

/* Reads fd until needle shows up; 1 when it did. */
static int sse_wait_for(int fd, const char *needle)
{
    char buf[16384];
    size_t got = 0;
    for (int i = 0; i < 100 && got < sizeof buf - 1; i++) {
        ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
        if (k <= 0) return 0;
        got += (size_t)k;
        buf[got] = 0;
        if (strstr(buf, needle)) return 1;
    }
    return 0;
}

static void redis_do(const char *cmd, const char *a1, const char *a2)
{
    redisContext *c = rf_connect(&rs);
    if (!c) { TEST_FAIL_("redis unreachable"); return; }
    redisReply *r = a2 ? redisCommand(c, cmd, a1, a2) : redisCommand(c, cmd, a1);
    if (!r || r->type == REDIS_REPLY_ERROR) TEST_FAIL_("redis %s: %s", cmd, r ? r->str : c->errstr);
    freeReplyObject(r);
    redisFree(c);
}

static long long redis_int(const char *cmd, const char *arg)
{
    redisContext *c = rf_connect(&rs);
    if (!c) return -1;
    redisReply *r = redisCommand(c, cmd, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    redisFree(c);
    return v;
}

/* ---- the server ------------------------------------------------------------------------------ */

typedef struct server {
    uv_loop_t loop;
    uv_async_t stop, pause;
    qdd_http *h;
    qdd_rconn cmd, sub;
    int stopped;
    /* server_pause: the loop blocks in on_pause until server_resume (the client thread's). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int paused, release;
    size_t conns;                /* the layer's connection count, read while paused */
} server;

static void on_pause(uv_async_t *a)
{
    server *s = a->data;
    pthread_mutex_lock(&s->mu);
    s->conns = s->h ? s->h->n_conns : 0;
    s->paused = 1;
    pthread_cond_broadcast(&s->cv);
    while (!s->release) pthread_cond_wait(&s->cv, &s->mu);
    s->paused = s->release = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Stops the server's loop between two turns; returns its connection count then. */
static size_t server_pause(server *s)
{
    uv_async_send(&s->pause);
    pthread_mutex_lock(&s->mu);
    while (!s->paused) pthread_cond_wait(&s->cv, &s->mu);
    size_t n = s->conns;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void server_resume(server *s)
{
    pthread_mutex_lock(&s->mu);
    s->release = 1;
    pthread_cond_broadcast(&s->cv);
    while (s->paused) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static server *the_server;

static int fake_ready(void *ud, char *why, size_t cap) { return 1; }
static int fake_workers(void *ud, qdd_worker_view *out, int cap) { return 0; }
static size_t fake_drain(void *ud, double *out, size_t cap) { return 0; }
static const char *fake_node(void *ud) { return "node-l"; }

static void on_closed(uv_handle_t *hd) {}
static void on_http_done(void *ud)
{
    server *s = ud;
    s->stopped = 1;
    uv_close((uv_handle_t *)&s->stop, on_closed);
    uv_close((uv_handle_t *)&s->pause, on_closed);
    qdd_rconn_close(&s->cmd);
    qdd_rconn_close(&s->sub);
}
static void on_stop(uv_async_t *a)
{
    server *s = a->data;
    qdd_http_stop(s->h, on_http_done, s);
    s->h = NULL;
}

/* Starts the layer with the common options plus `extra` (NULL-terminated flag/value pairs). */
static int server_start(server *s, const char *const *extra)
{
    char hp[64], rp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", http_port);
    snprintf(rp, sizeof rp, "redis://127.0.0.1:%d", rs.port);
    const char *argv[32] = {"quantd", "--http", hp, "--redis", rp, "--http-token", "s3cret", "--node", "node-l"};
    int argc = 9;
    for (int i = 0; extra && extra[i] && argc < 30; i++) argv[argc++] = extra[i];
    argv[argc] = NULL;
    qdd_config *cfg = NULL;
    qd_err err = {0};
    if (qdd_config_load(argc, (char *const *)argv, NULL, &cfg, &err)) {
        fprintf(stderr, "config: %s\n", err.msg);
        return -1;
    }
    memset(s, 0, sizeof *s);
    uv_loop_init(&s->loop);
    uv_async_init(&s->loop, &s->stop, on_stop);
    uv_async_init(&s->loop, &s->pause, on_pause);
    s->stop.data = s->pause.data = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = -1;
    if (qdd_rconn_init(&s->cmd, &s->loop, &cfg->redis_url, "cmd") || qdd_rconn_init(&s->sub, &s->loop, &cfg->redis_url, "sub"))
        goto out;
    qdd_rconn_connect(&s->cmd);
    qdd_rconn_connect(&s->sub);
    qdd_http_view view = {NULL, fake_ready, fake_workers, fake_drain, fake_node};
    if (qdd_http_start(&s->loop, cfg, &view, &s->cmd, &s->sub, &s->h, &err) || !s->h) {
        fprintf(stderr, "start: %s\n", err.msg);
        goto out;
    }
    rc = 0;
out:
    qdd_config_free(cfg);
    return rc;
}

typedef struct phase { server *s; void (*checks)(void); } phase;

static void *client(void *arg)
{
    phase *p = arg;
    /* Redis first, so the Redis-backed routes answer. */
    resp r;
    for (int i = 0; i < 200; i++) {
        if (!http("GET", "/readyz", NULL, NULL, &r) && r.status == 200) break;
        usleep(25000);
    }
    p->checks();
    uv_async_send(&p->s->stop);
    return NULL;
}

/* Runs checks against a layer started with extra. */
static void run_phase(const char *name, const char *const *extra, void (*checks)(void))
{
    test_current = name;
    http_port = rf_free_port();
    server s;
    if (server_start(&s, extra)) { TEST_FAIL_("the HTTP layer did not start"); return; }
    the_server = &s;
    phase p = {&s, checks};
    pthread_t t;
    pthread_create(&t, NULL, client, &p);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    pthread_join(t, NULL);
    test_current = name;
    CHECK(s.stopped);
    CHECK_INT(uv_loop_close(&s.loop), 0);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    the_server = NULL;
}

/* ---- the checks ------------------------------------------------------------------------------- */

/* http-max-connections 8 (MHD's own limit is 8 + QH_CONN_SLACK(8) = 13), no per-client limit,
 * http-max-streams 2, the default timeout (long enough that nothing idles out here). */
static const char *const total_limits[] = {"--http-max-connections", "8", "--http-max-connections-per-ip", "0",
                                           "--http-max-streams", "2", NULL};

static void check_total_limit(void)
{
    int idle[40];
    /* At the limit, the next request is answered 503, and that connection is closed. */
    CHECK_INT(open_idle(idle, 8), 8);
    resp r;
    CHECK_OK(http("GET", "/healthz", NULL, NULL, &r));
    CHECK_INT(r.status, 503);
    CHECK_CONTAINS(r.body, "too many connections");
    CHECK_CONTAINS(r.head, "Connection: close");
    close_all(idle, 8);
    CHECK_INT(healthz_until(200), 200);
    /* Far past MHD's own limit (13), half of them half-closed: once they are gone the API
     * answers again. The server is held between two turns while they close, so it sees every
     * close in one turn: at its limit MHD had taken its listening socket out of its epoll set
     * and puts it back only in a later turn, which nothing used to start, so every later
     * client waited in the backlog for good (issue #33, item 4). */
    for (int round = 0; round < 2; round++) {
        CHECK_INT(open_idle(idle, 40), 40);
        size_t n = 0;
        for (int i = 0; i < 400 && (n = server_pause(the_server)) < 13; i++) {   /* until all 13 are accepted */
            server_resume(the_server);
            usleep(25000);
        }
        CHECK_INT(n, 13);
        for (int i = round; i < 40; i += 2) shutdown(idle[i], SHUT_WR);
        close_all(idle, 40);
        usleep(100000);   /* lets the kernel deliver the closes; the outcome does not depend on it */
        server_resume(the_server);
        CHECK_INT(healthz_until(200), 200);
    }
}

static void check_stream_limit(void)
{
    char head[4096];
    int a = sse_open("/v1/events", head, sizeof head);
    CHECK_CONTAINS(head, "200 OK");
    int b = sse_open("/v1/events", head, sizeof head);
    CHECK_CONTAINS(head, "200 OK");
    resp r;
    CHECK_OK(http("GET", "/v1/events", NULL, NULL, &r));
    CHECK_INT(r.status, 503);
    CHECK_CONTAINS(r.body, "http-max-streams");
    /* A per-job stream counts too. */
    redis_do("HSET qjob:%s state running", "lim1", NULL);
    CHECK_OK(http("GET", "/v1/jobs/lim1/events", NULL, NULL, &r));
    CHECK_INT(r.status, 503);
    if (a >= 0) close(a);
    int c = -1;
    for (int i = 0; i < 400 && c < 0; i++) {   /* until the server has seen a go */
        c = sse_open("/v1/jobs/lim1/events", head, sizeof head);
        if (c >= 0 && !strstr(head, "200 OK")) { close(c); c = -1; usleep(25000); }
    }
    CHECK(c >= 0);
    if (b >= 0) close(b);
    if (c >= 0) close(c);
    redis_do("DEL qjob:%s", "lim1", NULL);
}

/* A client that stops reading its event stream is not buffered for without end: once it is
 * SSE_MAX_BUFFER behind, its stream ends (before, events were dropped silently and the stream
 * went on). 200 events of 100 KB are published while it does not read; then it reads to the
 * end: the stream must end, short of the 200. */
/* An event stream read through a 4 KB receive buffer; retried while the server still counts
 * the streams the previous check closed. */
static int slow_stream_open(void)
{
    for (int i = 0; i < 400; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int small = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        struct timeval tv = {10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        const char req[] = "GET /v1/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (!connect(fd, (struct sockaddr *)&sa, sizeof sa) && write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1) &&
            sse_wait_for(fd, "quantd events"))
            return fd;
        close(fd);
        usleep(25000);
    }
    return -1;
}

static void check_slow_reader(void)
{
    int fd = slow_stream_open();
    CHECK(fd >= 0);
    if (fd < 0) return;
    size_t len = 100000;
    char *ev = malloc(len + 64);
    int n = snprintf(ev, len + 64, "{\"v\":1,\"type\":\"state\",\"id\":\"big\",\"pad\":\"");
    memset(ev + n, 'x', len);
    strcpy(ev + n + len, "\"}");
    for (int i = 0; i < 200; i++) redis_do("PUBLISH qjobs:events %s", ev, NULL);
    free(ev);
    /* Read to the end (all of it fits: at most the server's buffer and the kernel's). */
    size_t cap = 64u << 20, got = 0;
    char *buf = malloc(cap + 1);
    int eof = 0;
    while (got < cap) {
        ssize_t k = read(fd, buf + got, cap - got);
        if (k == 0) eof = 1;
        if (k <= 0) break;
        got += (size_t)k;
    }
    buf[got] = 0;
    close(fd);
    long events = 0;
    for (char *p = buf; (p = strstr(p, "\"id\":\"big\"")); p++) events++;
    free(buf);
    CHECK(eof);
    CHECK(events >= 1 && events < 200);
}

/* The job as queued is its canonical form (~480 bytes for this 64-byte body): with
 * max-job-bytes 300 the body passes the body limit, and the queued form must not. */
static void check_canonical_size(void)
{
    const char *job = "{\"model\":\"/srv/m\",\"output\":\"/srv/out/y\",\"method\":\"rtn\",\"bits\":4}";
    resp r;
    CHECK_OK(http("POST", "/v1/jobs", "Authorization: Bearer s3cret\r\n", job, &r));
    CHECK_INT(r.status, 413);
    CHECK_CONTAINS(r.body, "canonical");
    CHECK_CONTAINS(r.body, "max-job-bytes 300");
    CHECK_INT(redis_int("LLEN %s", "qjobs"), 0);
    CHECK_INT(redis_int("ZCARD %s", "qjobs:index"), 0);
}

static void phase_total(void)
{
    TEST_RUN(check_total_limit);
    TEST_RUN(check_stream_limit);
    TEST_RUN(check_slow_reader);
    TEST_RUN(check_canonical_size);
}

/* Per client address: 3 (MHD's own: 3 + QH_CONN_SLACK(3) = 7). */
static const char *const ip_limits[] = {"--http-max-connections", "64", "--http-max-connections-per-ip", "3", NULL};

static void check_ip_limit(void)
{
    int idle[30];
    CHECK_INT(open_idle(idle, 3), 3);
    resp r;
    CHECK_OK(http("GET", "/healthz", NULL, NULL, &r));
    CHECK_INT(r.status, 503);
    CHECK_CONTAINS(r.body, "http-max-connections-per-ip 3");
    close_all(idle, 3);
    CHECK_INT(healthz_until(200), 200);
    /* Past MHD's per-address limit it closes new connections at once; afterwards all is well. */
    CHECK_INT(open_idle(idle, 30), 30);
    for (int i = 1; i < 30; i += 2) shutdown(idle[i], SHUT_WR);
    close_all(idle, 30);
    CHECK_INT(healthz_until(200), 200);
}

static void phase_ip(void) { TEST_RUN(check_ip_limit); }

/* A 1-second idle timeout and room for 4 connections: idle ones are closed by the server,
 * the API answers again, and an event stream opened before them is still live after. */
static const char *const timeout_limits[] = {"--http-max-connections", "4", "--http-max-connections-per-ip", "0",
                                             "--http-timeout", "1", NULL};

static void check_timeout(void)
{
    char head[4096];
    int sse = sse_open("/v1/events", head, sizeof head);
    CHECK_CONTAINS(head, "200 OK");
    int idle[8];
    CHECK_INT(open_idle(idle, 8), 8);   /* 3 fit beside the stream, the rest are past the limit */
    int closed = 0;
    for (int i = 0; i < 8; i++) closed += closed_by_server(idle[i]);
    CHECK_INT(closed, 8);
    close_all(idle, 8);
    CHECK_INT(healthz_until(200), 200);
    /* The stream sat quiet for longer than the timeout that closed the idle ones. */
    redis_do("PUBLISH qjobs:events %s", "{\"v\":1,\"type\":\"state\",\"id\":\"tmo1\",\"state\":\"queued\"}", NULL);
    CHECK(sse >= 0 && sse_wait_for(sse, "\"id\":\"tmo1\""));
    if (sse >= 0) close(sse);
}

static void phase_timeout(void) { TEST_RUN(check_timeout); }

static void check_size_function(void)
{
    char why[128] = "";
    CHECK_OK(qdd_job_size_check(480, 480, why, sizeof why));
    CHECK_INT(qdd_job_size_check(481, 480, why, sizeof why), -1);
    CHECK_STR(why, "job payload of 481 bytes is over max-job-bytes 480");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(check_size_function);
    if (!rf_installed()) {
        fprintf(stderr, "test_http_limits: redis-server not installed; skipping the rest\n");
        return test_finish() ? 1 : TEST_SKIP;
    }
    rs.port = rf_free_port();
    if (rf_start(&rs, test_tmpdir(), NULL)) { fprintf(stderr, "test_http_limits: redis-server did not start\n"); return 1; }
    const char *total_and_size[16];
    int n = 0;
    for (int i = 0; total_limits[i]; i++) total_and_size[n++] = total_limits[i];
    total_and_size[n++] = "--max-job-bytes";
    total_and_size[n++] = "300";
    total_and_size[n] = NULL;
    run_phase("total", total_and_size, phase_total);
    run_phase("per_ip", ip_limits, phase_ip);
    run_phase("timeout", timeout_limits, phase_timeout);
    rf_kill9(&rs);
    return test_finish();
}
