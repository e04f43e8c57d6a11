/* The status API request fuzz harness. One server (qdd_http_start on 127.0.0.1:0, token
 * HTTP_FUZZ_TOKEN, two CORS origins, a 2048-byte body limit, no Redis connection, so every
 * Redis-backed route answers 503 at once) lives for the process; each input is written on a
 * fresh socketpair handed to it with MHD_add_connection, the loop runs until nothing moves,
 * the client end is closed, and the loop runs until the connection is gone.
 *
 * The layer's trace seam (http_internal.h) reports each request's birth, route, queued
 * response and end. Invariants checked:
 *   - a request that MHD completed normally had exactly one response queued, none had two,
 *     and every status is in 100..599; a JSON body parses, is valid UTF-8 and, for an error
 *     status, carries an "error" string;
 *   - the mutating routes (POST /v1/jobs, DELETE /v1/jobs/{id}) run only for a request whose
 *     Authorization header, as MHD parsed it, is "Bearer " + the token; every route matches
 *     its method;
 *   - the bytes the client receives start with a well-formed status line (after any
 *     100 Continue) whose code is the first request's;
 *   - once the connection is gone no request record is left (reference counts), and the
 *     sanitizers see no error or leak. */
#define _GNU_SOURCE
#include "fuzz/http_fuzz_one.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/http.h"
#include "daemon/http_internal.h"
#include "quant/core/log.h"

#define OUT_CAP (256 * 1024)

typedef struct rec {
    const qh_req *r;
    qh_method method;
    int routes, route, responses, status, ended, toe;
} rec;

static struct {
    uv_loop_t loop;
    qdd_http *h;
    int drained;
    rec *recs;            /* one per request on the connection, in order (grown as needed) */
    int n_recs, cap_recs, events;
    char why[512];        /* the first invariant a trace callback saw broken */
    char out[OUT_CAP];    /* what the client received */
    size_t n_out;
} S;

static int fail(const char *fmt, const char *detail)
{
    fprintf(stderr, "http_fuzz_one: invariant broken: %s%s%s\n", fmt, detail ? ": " : "", detail ? detail : "");
    return -1;
}

static void broken(const char *why)
{
    if (!S.why[0]) snprintf(S.why, sizeof S.why, "%s", why);
}

/* ---- the fake daemon view ---------------------------------------------------------------- */

static int view_ready(void *ud, char *why, size_t cap)
{
    snprintf(why, cap, "no worker is up");
    return 0;
}

static int view_workers(void *ud, qdd_worker_view *out, int cap)
{
    if (cap < 1) return 1;
    memset(out, 0, sizeof *out);
    strcpy(out[0].name, "cpu-0");
    strcpy(out[0].state, "idle");
    out[0].block = -1;
    out[0].part = -1;
    out[0].gpu_mem_used = out[0].gpu_mem_total = -1;
    return 1;
}

static size_t view_drain(void *ud, double *out, size_t cap) { return 0; }
static const char *view_node(void *ud) { return "fuzz"; }

/* ---- the trace seam ---------------------------------------------------------------------- */

static int utf8_valid(const unsigned char *s)
{
    while (*s) {
        unsigned c = *s;
        int n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
        if (n < 0 || (n == 1 && c < 0xc2) || (n == 3 && c > 0xf4)) return 0;
        unsigned cp = n ? c & (0x3f >> n) : c;
        for (int i = 1; i <= n; i++) {
            if ((s[i] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i] & 0x3f);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        s += n + 1;
    }
    return 1;
}

static void check_body(int status, const char *body)
{
    if (!body || body[0] != '{') return;
    if (!utf8_valid((const unsigned char *)body)) { broken("a JSON body is not valid UTF-8"); return; }
    cJSON *o = cJSON_Parse(body);
    if (!o) broken("a JSON body does not parse");
    else if (status >= 400 && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "error")))
        broken("an error body has no \"error\" string");
    cJSON_Delete(o);
}

static rec *rec_find(const qh_req *r)
{
    for (int i = S.n_recs - 1; i >= 0; i--)
        if (S.recs[i].r == r && !S.recs[i].ended) return &S.recs[i];
    return NULL;
}

static int authorized(const qh_req *r)
{
    const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    return a && !strncasecmp(a, "Bearer ", 7) && !strcmp(a + 7, HTTP_FUZZ_TOKEN);
}

static void on_trace(void *ud, const qh_req *r, qh_trace_kind kind, int value, const char *body)
{
    S.events++;
    if (kind == QH_TRACE_BEGIN) {
        if (S.n_recs == S.cap_recs) {
            int cap = S.cap_recs ? 2 * S.cap_recs : 64;
            rec *nr = realloc(S.recs, (size_t)cap * sizeof *nr);
            if (!nr) { broken("out of memory for request records"); return; }
            S.recs = nr;
            S.cap_recs = cap;
        }
        S.recs[S.n_recs++] = (rec){.r = r, .method = r->method, .route = -1, .status = -1, .toe = -1};
        return;
    }
    rec *e = rec_find(r);
    if (!e) { broken("an event for a request that was never begun (or already ended)"); return; }
    switch (kind) {
    case QH_TRACE_ROUTE: {
        e->routes++;
        e->route = value;
        int get = e->method == QH_GET || e->method == QH_HEAD;
        if (value == QH_ROUTE_JOB_SUBMIT || value == QH_ROUTE_JOB_CANCEL) {
            if (!authorized(r)) broken("a request without the bearer token reached a mutating handler");
            if (e->method != (value == QH_ROUTE_JOB_SUBMIT ? QH_POST : QH_DELETE)) broken("a mutating route ran for another method");
        } else if (value == QH_ROUTE_PREFLIGHT) {
            if (e->method != QH_OPTIONS) broken("the preflight route ran for another method");
        } else if (!get) {
            broken("a read-only route ran for a method other than GET or HEAD");
        }
        break;
    }
    case QH_TRACE_RESPONSE:
        e->responses++;
        if (e->status < 0) e->status = value;
        if (value < 100 || value > 599) broken("a response status outside 100..599");
        check_body(value, body);
        break;
    case QH_TRACE_END:
        e->ended = 1;
        e->toe = value;
        break;
    default:
        broken("an unknown trace event");
    }
}

/* ---- the server -------------------------------------------------------------------------- */

static int server_start(void)
{
    char *argv[] = {"quantd", "--http", "127.0.0.1:0", "--http-token", HTTP_FUZZ_TOKEN, "--http-cors",
                    "https://dash.example, http://other.example", "--max-job-bytes", "2048", "--node", "fuzz", NULL};
    char *envp[] = {NULL};
    qdd_config *cfg = NULL;
    qd_err err = {0};
    qd_log_set_level(QD_LOG_WARN);
    if (qdd_config_load(11, argv, envp, &cfg, &err)) return fail("config", err.msg);
    if (uv_loop_init(&S.loop)) {
        qdd_config_free(cfg);
        return fail("uv_loop_init failed", NULL);
    }
    qdd_http_view view = {&S.drained, view_ready, view_workers, view_drain, view_node};
    int rc = qdd_http_start(&S.loop, cfg, &view, NULL, NULL, &S.h, &err);
    qdd_config_free(cfg);
    if (rc || !S.h) {
        uv_loop_close(&S.loop);
        return fail("qdd_http_start", err.msg);
    }
    S.h->trace = on_trace;
    return 0;
}

static void on_stopped(void *ud) { *(int *)ud = 1; }

int http_fuzz_teardown(void)
{
    if (!S.h) return 0;
    int done = 0;
    qdd_http_stop(S.h, on_stopped, &done);
    S.h = NULL;
    uv_run(&S.loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&S.loop);
    free(S.recs);
    S.recs = NULL;
    S.n_recs = S.cap_recs = 0;
    if (!done || rc) return fail("the HTTP layer left handles on the loop", NULL);
    return 0;
}

/* One turn: MHD's work and the loop's (resumes, timers); then whatever the client can read.
 * Returns how many bytes were read, or -1 at end of stream. */
static long pump(int fd)
{
    MHD_run(S.h->mhd);
    uv_run(&S.loop, UV_RUN_NOWAIT);
    long got = 0;
    while (fd >= 0) {
        char buf[16384];
        ssize_t k = read(fd, buf, sizeof buf);
        if (k > 0) {
            size_t keep = S.n_out + (size_t)k <= OUT_CAP ? (size_t)k : OUT_CAP - S.n_out;
            memcpy(S.out + S.n_out, buf, keep);
            S.n_out += keep;
            got += k;
            continue;
        }
        if (k == 0) return -1;
        break;   /* EAGAIN, or an error: the server closed */
    }
    return got;
}

/* Skips "HTTP/1.x 100 ...\r\n...\r\n\r\n" interim answers; returns the first final status
 * line's code, 0 when there are only interim answers, -1 when the bytes do not start with
 * a well-formed status line. */
static int first_status(const char *s, size_t n)
{
    for (;;) {
        if (!n) return 0;
        if (n < 13 || (memcmp(s, "HTTP/1.1 ", 9) && memcmp(s, "HTTP/1.0 ", 9))) return -1;
        if (s[9] < '1' || s[9] > '5' || s[10] < '0' || s[10] > '9' || s[11] < '0' || s[11] > '9' || s[12] != ' ') return -1;
        int code = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
        const char *end = memmem(s, n, "\r\n\r\n", 4);
        if (!end) return -1;
        if (code != 100) return code;
        n -= (size_t)(end + 4 - s);
        s = end + 4;
    }
}

static void fz_print_answer(void)
{
    fprintf(stderr, "answer (%zu bytes): \"", S.n_out);
    for (size_t i = 0; i < S.n_out && i < 400; i++) {
        unsigned char c = (unsigned char)S.out[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"\n");
    for (int i = 0; i < S.n_recs; i++)
        fprintf(stderr, "request %d: method=%d route=%d status=%d responses=%d toe=%d\n", i, (int)S.recs[i].method,
                S.recs[i].route, S.recs[i].status, S.recs[i].responses, S.recs[i].toe);
}

int http_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    if (accepted) *accepted = 0;
    if (!S.h && server_start()) return -1;
    S.n_recs = 0;
    S.events = 0;
    S.why[0] = 0;
    S.n_out = 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return fail("socketpair failed", strerror(errno));
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (MHD_add_connection(S.h->mhd, sv[0], (const struct sockaddr *)&peer, sizeof peer) != MHD_YES) {
        close(sv[1]);   /* MHD closed sv[0] */
        return fail("MHD_add_connection refused the connection", NULL);
    }
    /* Write it all (the server reads as the loop turns), then let the loop run until no byte
     * and no event moved for a few turns; then half-close (a body without a length ends
     * there) and run again: the server has answered all it will. */
    size_t off = 0;
    int eof = 0;
    for (int phase = 0; phase < 2 && !eof; phase++) {
        if (phase == 1) shutdown(sv[1], SHUT_WR);
        for (int turn = 0, idle = 0; turn < 10000 && idle < 3 && !eof; turn++) {
            int moved = 0;
            if (phase == 0 && off < size) {
                ssize_t k = write(sv[1], data + off, size - off);
                if (k > 0) { off += (size_t)k; moved = 1; }
                else if (k < 0 && errno != EAGAIN) off = size;   /* the server closed: stop writing */
            }
            int ev = S.events;
            long got = pump(sv[1]);
            if (got < 0) eof = 1;
            moved |= got > 0 || S.events != ev;
            idle = moved ? 0 : idle + 1;
        }
    }
    /* The client goes away. A live event stream is suspended until it has bytes to send:
     * one published event makes it write, see the closed socket and end. */
    close(sv[1]);
    for (int turn = 0; turn < 1000 && S.h->reqs; turn++) {
        if (turn % 50 == 1) qh_sse_event_published(S.h, "{\"id\":\"fuzz\"}", 13);
        pump(-1);
    }
    int bad = 0;
    if (S.why[0]) bad = fail(S.why, NULL);
    if (S.h->reqs) bad = fail("a request record is left after its connection closed", NULL);
    int first = -1;
    for (int i = 0; i < S.n_recs; i++) {
        const rec *e = &S.recs[i];
        char d[96];
        snprintf(d, sizeof d, "request %d: responses=%d routes=%d toe=%d", i, e->responses, e->routes, e->toe);
        if (!e->ended) bad = fail("a request never completed", d);
        if (e->responses > 1) bad = fail("more than one response queued for one request", d);
        if (e->routes > 1) bad = fail("a request was routed twice", d);
        if (e->toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && e->responses != 1)
            bad = fail("a request completed without a response", d);
        if (e->routes && accepted) *accepted = 1;
        if (i == 0 && e->toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) first = e->status;
    }
    int code = first_status(S.out, S.n_out);
    char d[64];
    snprintf(d, sizeof d, "sent %d, queued %d", code, first);
    if (code < 0) {
        fz_print_answer();
        bad = fail("the answer does not start with a well-formed status line", NULL);
    } else if (first >= 0 && code != first) {
        fz_print_answer();
        bad = fail("the status on the wire is not the one queued", d);
    } else if (first < 0 && S.n_recs == 0 && code > 0 && code < 400) {
        bad = fail("libmicrohttpd answered a request the layer never saw with a success", d);
    }
    return bad ? -1 : 0;
}
