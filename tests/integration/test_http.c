/* The HTTP status API against a real redis-server: every endpoint, auth, CORS, limits,
 * malformed input, live SSE, a reconfiguration (token rotation, generation), and a Redis
 * restart (503 meanwhile, then back). The server runs on the main thread's uv loop with a
 * fake daemon view and two Redis connections of its own made with rconn.h (command and
 * subscribe, as the daemon hands them over); a client thread makes the requests with plain
 * sockets and hiredis, then stops the server, and the test checks that every handle closed
 * (uv_loop_close == 0).
 *
 * `test_http --serve HTTP_PORT REDIS_PORT` instead serves until SIGTERM (for
 * test_dashboard.sh when no quantd binary exists). */
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
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/http.h"
#include "daemon/http_internal.h"
#include "daemon/rconn.h"
#include "http_client.h"
#include "redis_fixture.h"
#include "test_util.h"

static rf_redis rs;           /* the redis-server (tests/redis_fixture.h) */
static int http_port;
static const char *tmp;

/* ---- redis-server --------------------------------------------------------------------- */

static int redis_start(void) { return rf_start(&rs, tmp, NULL); }
static void redis_stop(void) { rf_kill9(&rs); }
static redisContext *redis_sync(void) { return rf_connect(&rs); }

static void redis_do(const char *fmt, ...)
{
    redisContext *c = redis_sync();
    if (!c) { TEST_FAIL_("redis unreachable"); return; }
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR) TEST_FAIL_("redis %s: %s", fmt, r ? r->str : c->errstr);
    freeReplyObject(r);
    redisFree(c);
}

static long long rint_(const char *fmt, const char *arg)
{
    redisContext *c = redis_sync();
    if (!c) return -1;
    redisReply *r = redisCommand(c, fmt, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    redisFree(c);
    return v;
}

/* ---- a plain-socket HTTP client (tests/http_client.h) ------------------------------------ */

typedef hc_resp resp;

static int http_connect(void) { return hc_connect(http_port, 5); }
static int http_raw(const char *req, size_t len, resp *out) { return hc_raw(http_port, 5, req, len, out); }
static int http(const char *method, const char *path, const char *extra_headers, const char *body, resp *out)
{
    return hc_request(http_port, 5, method, path, extra_headers, body, out);
}

#define AUTH "Authorization: Bearer s3cret\r\n"

/* ---- the fake daemon view ------------------------------------------------------------- */

static int fake_ready(void *ud, char *why, size_t cap) { return 1; }
static int fake_workers(void *ud, qdd_worker_view *out, int cap)
{
    if (cap < 2) return 2;
    memset(out, 0, 2 * sizeof *out);
    strcpy(out[0].name, "cpu-0"); strcpy(out[0].state, "busy"); strcpy(out[0].job_id, "j1");
    out[0].block = 1; out[0].part = 2; out[0].pid = 4242; out[0].gpu_mem_used = out[0].gpu_mem_total = -1;
    strcpy(out[1].name, "cuda-0"); strcpy(out[1].state, "idle"); out[1].block = -1; out[1].part = -1; out[1].restarts = 2;
    out[1].gpu_mem_used = 1 << 30; out[1].gpu_mem_total = (int64_t)80 << 30;
    return 2;
}
static size_t fake_drain(void *ud, double *out, size_t cap)
{
    int *calls = ud;
    if ((*calls)++ || cap < 3) return 0;
    out[0] = 0.3; out[1] = 4.0; out[2] = 1000.0;
    return 3;
}
static const char *fake_node(void *ud) { return "node-a"; }

/* ---- the server side ------------------------------------------------------------------- */

typedef struct server {
    uv_loop_t loop;
    uv_async_t stop, reconf;
    qdd_http *h;
    qdd_config *cfg;
    qdd_rconn cmd, sub;          /* what the daemon would hand over */
    int drained, stopped;
    volatile int reconf_rc;      /* 1 while pending, then qdd_http_reconfigure's result */
} server;

static void on_closed(uv_handle_t *hd) {}
static void on_http_done(void *ud)
{
    server *s = ud;
    s->stopped = 1;
    uv_close((uv_handle_t *)&s->stop, on_closed);
    uv_close((uv_handle_t *)&s->reconf, on_closed);
    qdd_rconn_close(&s->cmd);
    qdd_rconn_close(&s->sub);
}
static void on_stop(uv_async_t *a)
{
    server *s = a->data;
    qdd_http_stop(s->h, on_http_done, s);
    s->h = NULL;
}

/* A SIGHUP's effect on the layer: a new configuration (token n3w, another CORS origin, a
 * 1000-byte body limit) handed over as generation 2, then freed at once. */
static void on_reconf(uv_async_t *a)
{
    server *s = a->data;
    char http[64], redis[64];
    snprintf(http, sizeof http, "127.0.0.1:%d", http_port);
    snprintf(redis, sizeof redis, "redis://127.0.0.1:%d", rs.port);
    char *argv[] = {"quantd", "--http", http, "--redis", redis, "--http-token", "n3w",
                    "--http-cors", "http://new.example", "--max-job-bytes", "1000", NULL};
    qdd_config *nc = NULL;
    qd_err err = {0};
    int rc = qdd_config_load(11, argv, NULL, &nc, &err);
    if (!rc) rc = qdd_http_reconfigure(s->h, nc, 2, &err);
    qdd_config_free(nc);
    s->reconf_rc = rc;
}

static int server_start(server *s)
{
    char http[64], redis[64];
    snprintf(http, sizeof http, "127.0.0.1:%d", http_port);
    snprintf(redis, sizeof redis, "redis://127.0.0.1:%d", rs.port);
    char *argv[] = {"quantd", "--http", http, "--redis", redis, "--http-token", "s3cret",
                    "--http-cors", "http://dash.example, http://other.example", "--node", "node-a", NULL};
    qd_err err = {0};
    if (qdd_config_load(11, argv, NULL, &s->cfg, &err)) { fprintf(stderr, "config: %s\n", err.msg); return -1; }
    uv_loop_init(&s->loop);
    uv_async_init(&s->loop, &s->stop, on_stop);
    uv_async_init(&s->loop, &s->reconf, on_reconf);
    s->stop.data = s->reconf.data = s;
    if (qdd_rconn_init(&s->cmd, &s->loop, &s->cfg->redis_url, "cmd") ||
        qdd_rconn_init(&s->sub, &s->loop, &s->cfg->redis_url, "sub")) return -1;
    qdd_rconn_connect(&s->cmd);
    qdd_rconn_connect(&s->sub);
    qdd_http_view view = {&s->drained, fake_ready, fake_workers, fake_drain, fake_node};
    if (qdd_http_start(&s->loop, s->cfg, &view, &s->cmd, &s->sub, &s->h, &err)) {
        fprintf(stderr, "start: %s\n", err.msg);
        return -1;
    }
    /* The layer copied what it needs: the configuration may go (as the daemon's does on reload). */
    qdd_config_free(s->cfg);
    s->cfg = NULL;
    return 0;
}

/* ---- the checks (client thread) --------------------------------------------------------- */

static int wait_ready(void)
{
    resp r;
    for (int i = 0; i < 100; i++) {
        if (!http("GET", "/readyz", NULL, NULL, &r) && r.status == 200) return 0;
        usleep(50000);
    }
    return -1;
}

static void check_basics(void)
{
    resp r;
    CHECK_OK(http("GET", "/healthz", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"ok\":true");
    CHECK_OK(wait_ready());
    CHECK_OK(http("GET", "/", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "<title>quantd</title>");
    CHECK_CONTAINS(r.head, "text/html");
    CHECK_OK(http("GET", "/app.js", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "EventSource");
    CHECK_OK(http("GET", "/nowhere", NULL, NULL, &r));
    CHECK_INT(r.status, 404);
    CHECK_CONTAINS(r.body, "\"error\"");
    CHECK_OK(http("PUT", "/v1/jobs", NULL, NULL, &r));
    CHECK_INT(r.status, 405);
    CHECK_OK(http("POST", "/healthz", NULL, NULL, &r));
    CHECK_INT(r.status, 405);
    CHECK_OK(http("GET", "/v1/workers", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"name\":\"cuda-0\"");
    CHECK_CONTAINS(r.body, "\"node\":\"node-a\"");
    /* The part a worker runs (daemon/parts.c), left out where it runs none. */
    CHECK_CONTAINS(r.body, "\"job\":\"j1\",\"block\":1,\"part\":2,\"pid\":4242");
    CHECK(!strstr(r.body, "\"block\":-1,\"part\""));
}

static void check_jobs(void)
{
    redis_do("HSET qjob:j1 v 1 id j1 state running stage quantize block 1 blocks 4 progress 0.25 eta_s 30 "
         "node node-a worker cpu-0 report {\"ppl\":5.5} spec {\"model\":\"/m\"}");
    redis_do("ZADD qjobs:index 1000 j1");
    redis_do("HSET qjob:j0 v 1 id j0 state done progress 1");
    redis_do("ZADD qjobs:index 900 j0");
    resp r;
    CHECK_OK(http("GET", "/v1/jobs/j1", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"state\":\"running\"");
    CHECK_CONTAINS(r.body, "\"progress\":0.25");
    CHECK_CONTAINS(r.body, "\"ppl\":5.5");
    CHECK_CONTAINS(r.body, "\"spec\":{\"model\":\"/m\"}");
    CHECK_OK(http("GET", "/v1/jobs/nope", NULL, NULL, &r));
    CHECK_INT(r.status, 404);
    CHECK_CONTAINS(r.body, "no job 'nope'");
    CHECK_OK(http("GET", "/v1/jobs/bad%24id", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_OK(http("GET", "/v1/jobs", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"count\":2");
    CHECK(strstr(r.body, "\"j1\"") && strstr(r.body, "\"j1\"") < strstr(r.body, "\"j0\""));   /* newest first */
    CHECK_OK(http("GET", "/v1/jobs?state=done", NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "\"count\":1");
    CHECK_CONTAINS(r.body, "\"id\":\"j0\"");
    CHECK_OK(http("GET", "/v1/jobs?state=bogus", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_OK(http("GET", "/v1/jobs?limit=x", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    /* A NUL byte (%00) cannot cut an id or an argument short, nor can a byte outside the id
     * alphabet pass escaped (issue #33, item 14). */
    CHECK_OK(http("GET", "/v1/jobs/j1%00x", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_CONTAINS(r.body, "NUL");
    CHECK_OK(http("GET", "/v1/jobs/j1%00", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_OK(http("GET", "/v1/jobs?state=done%00x", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_OK(http("GET", "/v1/jobs/j%C3%A9", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_OK(http("GET", "/v1/jobs/j1%20", NULL, NULL, &r));
    CHECK_INT(r.status, 400);
    /* A clean request on a connection whose earlier request had %00 is not refused for it. */
    const char two[] = "GET /v1/jobs/j1%00x HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/jobs/j1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    CHECK_OK(http_raw(two, sizeof two - 1, &r));
    CHECK_INT(r.status, 400);
    CHECK(!strstr(r.body, "HTTP/1.1 400"));   /* MHD may close after the refusal; if not, the next is judged alone */
}

static void check_sse(void)
{
    redis_do("XADD qjob:j1:events * event {\"v\":1,\"type\":\"progress\",\"id\":\"j1\",\"state\":\"running\",\"progress\":0.25}");
    int fd = http_connect();
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char req[] = "GET /v1/jobs/j1/events HTTP/1.0\r\nHost: x\r\n\r\n";
    CHECK_INT(write(fd, req, sizeof req - 1), (long long)(sizeof req - 1));
    char buf[16384];
    size_t n = 0;
    int stage = 0;
    for (int i = 0; i < 200 && stage < 2; i++) {
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        if (stage == 0 && strstr(buf, "\"progress\":0.25")) {
            stage = 1;   /* replayed; now a live event */
            redis_do("XADD qjob:j1:events * event {\"v\":1,\"type\":\"progress\",\"id\":\"j1\",\"state\":\"running\",\"progress\":0.5}");
            redis_do("PUBLISH qjobs:events {\"v\":1,\"type\":\"progress\",\"id\":\"j1\",\"progress\":0.5}");
        }
        if (stage == 1 && strstr(buf, "\"progress\":0.5")) stage = 2;
    }
    close(fd);
    CHECK_INT(stage, 2);
    CHECK_CONTAINS(buf, "text/event-stream");
    CHECK_CONTAINS(buf, "\nid: ");
    CHECK_CONTAINS(buf, "data: {");
    /* Each stream entry once: the Pub/Sub wake-up must not duplicate it. */
    char *first = strstr(buf, "\"progress\":0.5");
    CHECK(first && !strstr(first + 1, "\"progress\":0.5}"));
    resp r;
    CHECK_OK(http("GET", "/v1/jobs/nope/events", NULL, NULL, &r));
    CHECK_INT(r.status, 404);
}

/* A job submitted over HTTP is visible while it waits on the queue, listed as queued and
 * cancellable; cancelled there it leaves the queue at once; resubmitted it is queued afresh
 * (issue #33, item 9). Leaves the job queued, as it found it. */
static void check_queued_job(const char *submit_answer, const char *job)
{
    char id[80] = "", path[128], key[128];
    const char *p = strstr(submit_answer, "\"id\":\"");
    if (p) sscanf(p + 6, "%70[^\"]", id);
    CHECK(id[0]);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    snprintf(key, sizeof key, "qjob:%s", id);
    resp r;
    CHECK_OK(http("GET", path, NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"state\":\"queued\"");
    CHECK_CONTAINS(r.body, "\"submitted_ms\":");
    CHECK_CONTAINS(r.body, "\"spec\":{\"version\":1");
    CHECK_OK(http("GET", "/v1/jobs?state=queued", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, id);
    CHECK_CONTAINS(r.body, "\"count\":1");
    CHECK_INT(rint_("TTL %s", key), -1);   /* no expiry while it waits */
    /* Its event stream exists and starts with the queued state. */
    char events[160];
    snprintf(events, sizeof events, "qjob:%s:events", id);
    CHECK_INT(rint_("XLEN %s", events), 1);
    /* Submitting it again while it waits is refused; the queue keeps one copy. */
    CHECK_OK(http("POST", "/v1/jobs", AUTH, job, &r));
    CHECK_INT(r.status, 409);
    CHECK_CONTAINS(r.body, "already queued");
    CHECK_INT(rint_("LLEN %s", "qjobs"), 1);
    /* Cancelled while on the queue: off it at once, cancelled, kept for the retention. */
    CHECK_OK(http("DELETE", path, AUTH, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.body, "\"state\":\"cancelled\"");
    CHECK_INT(rint_("LLEN %s", "qjobs"), 0);
    CHECK_OK(http("GET", path, NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "\"state\":\"cancelled\"");
    CHECK_CONTAINS(r.body, "cancelled through the HTTP API");
    CHECK(rint_("TTL %s", key) > 0);
    CHECK_INT(rint_("XLEN %s", events), 2);
    CHECK_OK(http("DELETE", path, AUTH, NULL, &r));
    CHECK_INT(r.status, 409);
    /* Resubmitted: queued afresh, nothing of the cancelled run left (error, TTL, flag). */
    CHECK_OK(http("POST", "/v1/jobs", AUTH, job, &r));
    CHECK_INT(r.status, 202);
    CHECK_INT(rint_("LLEN %s", "qjobs"), 1);
    CHECK_OK(http("GET", path, NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "\"state\":\"queued\"");
    CHECK(!strstr(r.body, "cancelled"));
    CHECK_INT(rint_("TTL %s", key), -1);
    CHECK_INT(rint_("TTL %s", events), -1);
    /* Once a daemon has popped it (BLMOVE to its processing list) it is not on the queue: a
     * cancel then sets the flag, which the daemon's take reads as "cancelled while queued". */
    redis_do("LMOVE qjobs qjobs:processing:node-z RIGHT LEFT");
    CHECK_OK(http("DELETE", path, AUTH, NULL, &r));
    CHECK_INT(r.status, 202);
    CHECK_CONTAINS(r.body, "\"cancel\":\"requested\"");
    char flag[160];
    snprintf(flag, sizeof flag, "qjob:%s:cancel", id);
    CHECK_INT(rint_("EXISTS %s", flag), 1);
    redis_do("LMOVE qjobs:processing:node-z qjobs LEFT RIGHT");
    CHECK_INT(rint_("LLEN %s", "qjobs"), 1);
}

static void check_mutations(void)
{
    const char *job = "{\"model\":\"/srv/m\",\"output\":\"/srv/out/x\",\"method\":\"rtn\",\"bits\":4}";
    resp r;
    CHECK_OK(http("POST", "/v1/jobs", NULL, job, &r));
    CHECK_INT(r.status, 401);
    CHECK_CONTAINS(r.head, "WWW-Authenticate: Bearer");
    CHECK_OK(http("POST", "/v1/jobs", "Authorization: Bearer wrong\r\n", job, &r));
    CHECK_INT(r.status, 401);
    CHECK_OK(http("POST", "/v1/jobs", AUTH, "{not json", &r));
    CHECK_INT(r.status, 400);
    CHECK_CONTAINS(r.body, "\"error\"");
    CHECK_OK(http("POST", "/v1/jobs", AUTH, "{\"model\":\"/m\",\"output\":\"/o\",\"method\":\"rtn\",\"bits\":5}", &r));
    CHECK_INT(r.status, 400);
    CHECK_CONTAINS(r.body, "bits");
    CHECK_OK(http("POST", "/v1/jobs", AUTH, job, &r));
    CHECK_INT(r.status, 202);
    CHECK_CONTAINS(r.body, "\"id\":\"j-");
    CHECK_CONTAINS(r.body, "\"state\":\"queued\"");
    CHECK_INT(rint_("LLEN %s", "qjobs"), 1);
    check_queued_job(r.body, job);
    /* Over the body limit (max-job-bytes, 64 KiB by default). */
    size_t big = 70000;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[big] = 0;
    CHECK_OK(http("POST", "/v1/jobs", AUTH, huge, &r));
    CHECK_INT(r.status, 413);
    free(huge);
    CHECK_INT(rint_("LLEN %s", "qjobs"), 1);
    /* %00 does not cut the id short: "j1%00x" is refused, not taken for j1 (item 14). */
    CHECK_OK(http("DELETE", "/v1/jobs/j1%00x", AUTH, NULL, &r));
    CHECK_INT(r.status, 400);
    CHECK_INT(rint_("EXISTS %s", "qjob:j1:cancel"), 0);
    /* Cancel: the flag and the notification. */
    CHECK_OK(http("DELETE", "/v1/jobs/j1", NULL, NULL, &r));
    CHECK_INT(r.status, 401);
    CHECK_OK(http("DELETE", "/v1/jobs/j1", AUTH, NULL, &r));
    CHECK_INT(r.status, 202);
    CHECK_INT(rint_("EXISTS %s", "qjob:j1:cancel"), 1);
    CHECK_OK(http("DELETE", "/v1/jobs/nope", AUTH, NULL, &r));
    CHECK_INT(r.status, 404);
    CHECK_OK(http("DELETE", "/v1/jobs/j0", AUTH, NULL, &r));
    CHECK_INT(r.status, 409);
}

static void check_cors_and_garbage(void)
{
    resp r;
    CHECK_OK(http("OPTIONS", "/v1/jobs", "Origin: http://dash.example\r\nAccess-Control-Request-Method: POST\r\n", NULL, &r));
    CHECK_INT(r.status, 204);
    CHECK_CONTAINS(r.head, "Access-Control-Allow-Origin: http://dash.example");
    CHECK_CONTAINS(r.head, "Access-Control-Allow-Methods");
    CHECK_OK(http("GET", "/healthz", "Origin: http://evil.example\r\n", NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK(!strstr(r.head, "Access-Control-Allow-Origin"));
    CHECK_OK(http("GET", "/healthz", "Origin: http://other.example\r\n", NULL, &r));
    CHECK_CONTAINS(r.head, "Access-Control-Allow-Origin: http://other.example");
    /* Nonsense on the wire: an error or a closed connection, never a crash. */
    const char *bad[] = {"GARBAGE\r\n\r\n", "GET\r\n\r\n", "GET / HTTP/9.9\r\n\r\n",
                         "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
                         "\x01\x02\x03\xff\r\n\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        resp g;
        http_raw(bad[i], strlen(bad[i]), &g);
        CHECK(g.status == 0 || (g.status >= 400 && g.status < 500) || g.status == 505);
    }
    char longurl[9000] = "GET /";
    memset(longurl + 5, 'a', 8000);
    strcpy(longurl + 8005, " HTTP/1.0\r\n\r\n");
    http_raw(longurl, strlen(longurl), &r);
    CHECK(r.status == 0 || r.status == 414 || r.status == 400 || r.status == 431);
    CHECK_OK(http("GET", "/healthz", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
}

static void check_metrics(void)
{
    resp r;
    CHECK_OK(http("GET", "/metrics", NULL, NULL, &r));
    CHECK_INT(r.status, 200);
    CHECK_CONTAINS(r.head, "text/plain; version=0.0.4");
    CHECK_CONTAINS(r.body, "quantd_jobs{state=\"running\"} 1");
    CHECK_CONTAINS(r.body, "quantd_jobs{state=\"done\"} 1");
    CHECK_CONTAINS(r.body, "quantd_queue_depth 1");
    CHECK_CONTAINS(r.body, "quantd_block_duration_seconds_bucket{le=\"0.5\"} 1");
    CHECK_CONTAINS(r.body, "quantd_block_duration_seconds_bucket{le=\"5\"} 2");
    CHECK_CONTAINS(r.body, "quantd_block_duration_seconds_bucket{le=\"+Inf\"} 3");
    CHECK_CONTAINS(r.body, "quantd_block_duration_seconds_count 3");
    CHECK_CONTAINS(r.body, "quantd_worker_state{worker=\"cpu-0\",state=\"busy\"} 1");
    CHECK_CONTAINS(r.body, "quantd_worker_restarts_total{worker=\"cuda-0\"} 2");
    CHECK_CONTAINS(r.body, "quantd_gpu_memory_bytes{worker=\"cuda-0\",kind=\"total\"} 85899345920");
    CHECK(!strstr(r.body, "quantd_gpu_memory_bytes{worker=\"cpu-0\""));
    CHECK_CONTAINS(r.body, "quantd_redis_up 1");
}

static server *the_server;

static void check_reconfigure(void)
{
    const char *job = "{\"model\":\"/srv/m\",\"output\":\"/srv/out/y\",\"method\":\"rtn\",\"bits\":4}";
    resp r;
    CHECK_OK(http("GET", "/healthz", NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "\"config_generation\":1");
    the_server->reconf_rc = 1;
    uv_async_send(&the_server->reconf);
    for (int i = 0; i < 100 && the_server->reconf_rc == 1; i++) usleep(20000);
    CHECK_INT(the_server->reconf_rc, 0);
    /* The old token is refused from the next request on, the new one accepted. */
    CHECK_OK(http("DELETE", "/v1/jobs/nope", AUTH, NULL, &r));
    CHECK_INT(r.status, 401);
    CHECK_OK(http("DELETE", "/v1/jobs/nope", "Authorization: Bearer n3w\r\n", NULL, &r));
    CHECK_INT(r.status, 404);
    /* The body limit and the CORS origins follow too. */
    char big[1200];
    snprintf(big, sizeof big, "%s", job);
    memset(big + strlen(job), ' ', sizeof big - 1 - strlen(job));
    big[sizeof big - 1] = 0;
    CHECK_OK(http("POST", "/v1/jobs", "Authorization: Bearer n3w\r\n", big, &r));
    CHECK_INT(r.status, 413);
    CHECK_OK(http("GET", "/healthz", "Origin: http://dash.example\r\n", NULL, &r));
    CHECK(!strstr(r.head, "Access-Control-Allow-Origin"));
    CHECK_OK(http("GET", "/healthz", "Origin: http://new.example\r\n", NULL, &r));
    CHECK_CONTAINS(r.head, "Access-Control-Allow-Origin: http://new.example");
    CHECK_CONTAINS(r.body, "\"config_generation\":2");
    CHECK_OK(http("GET", "/readyz", NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "\"config_generation\":2");
    CHECK_OK(http("GET", "/metrics", NULL, NULL, &r));
    CHECK_CONTAINS(r.body, "quantd_config_generation 2");
}

static void check_redis_restart(void)
{
    resp r;
    redis_stop();
    int saw503 = 0;
    for (int i = 0; i < 50 && !saw503; i++) {
        http("GET", "/v1/jobs", NULL, NULL, &r);
        saw503 = r.status == 503;
        if (!saw503) usleep(50000);
    }
    CHECK(saw503);
    CHECK_CONTAINS(r.body, "Redis");
    CHECK_OK(http("GET", "/readyz", NULL, NULL, &r));
    CHECK_INT(r.status, 503);
    CHECK_OK(http("GET", "/metrics", NULL, NULL, &r));   /* still answers, saying Redis is down */
    CHECK_CONTAINS(r.body, "quantd_redis_up 0");
    CHECK_OK(redis_start());
    int back = 0;
    for (int i = 0; i < 200 && !back; i++) {
        http("GET", "/v1/jobs", NULL, NULL, &r);
        back = r.status == 200;
        if (!back) usleep(50000);
    }
    CHECK(back);
}

static void *client(void *arg)
{
    server *s = arg;
    TEST_RUN(check_basics);
    TEST_RUN(check_jobs);
    TEST_RUN(check_sse);
    TEST_RUN(check_mutations);
    TEST_RUN(check_cors_and_garbage);
    TEST_RUN(check_metrics);
    TEST_RUN(check_reconfigure);
    TEST_RUN(check_redis_restart);
    uv_async_send(&s->stop);
    return NULL;
}

static int have_redis(void)
{
    return system("command -v redis-server >/dev/null 2>&1") == 0;
}

static void on_term(uv_signal_t *sg, int signum) { uv_async_send(sg->data); uv_signal_stop(sg); }

/* Serves until SIGTERM/SIGINT with the fake view (the dashboard test drives Redis). */
static int serve(int hp, int rp)
{
    http_port = hp;
    rs.port = rp;
    server s = {0};
    if (server_start(&s)) return 1;
    uv_signal_t sg;
    uv_signal_init(&s.loop, &sg);
    sg.data = &s.stop;
    uv_signal_start(&sg, on_term, SIGTERM);
    uv_unref((uv_handle_t *)&sg);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&sg, NULL);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    qdd_config_free(s.cfg);
    return uv_loop_close(&s.loop) ? 1 : 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && !strcmp(argv[1], "--serve")) return serve(atoi(argv[2]), atoi(argv[3]));
    if (!have_redis()) {
        fprintf(stderr, "test_http: redis-server not installed; skipping\n");
        return TEST_SKIP;
    }
    tmp = test_tmpdir();
    rs.port = rf_free_port();
    http_port = rf_free_port();
    if (redis_start()) { fprintf(stderr, "test_http: redis-server did not start\n"); return 1; }
    server s = {0};
    the_server = &s;
    CHECK_OK(server_start(&s));
    if (!s.h) { redis_stop(); return test_finish(); }
    pthread_t t;
    pthread_create(&t, NULL, client, &s);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    pthread_join(t, NULL);
    test_current = "shutdown";
    CHECK(s.stopped);
    CHECK_INT(uv_loop_close(&s.loop), 0);
    qdd_config_free(s.cfg);
    redis_stop();
    return test_finish();
}
