/* quantctl status [ID]: one job's status (every field of its qjob:<id> hash, the report
 * and the spec), or without ID the job list, read from Redis or from the HTTP API.
 *
 * This file also holds what the job commands (submit, status, watch, cancel, list) share:
 * the connection flags (--redis URL or --http URL with --token), a Redis connection, a
 * minimal HTTP/1.0 client for the daemon's own API, and the status printer. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "cli/quantctl.h"
#include "proto/keys.h"
#include "proto/status.h"

void qctl_conn_defaults(qctl_conn *c)
{
    memset(c, 0, sizeof *c);
    const char *e = getenv("QUANTD_REDIS");
    c->redis = e && *e ? e : "redis://127.0.0.1:6379";
    c->http = getenv("QUANTD_HTTP");
    if (c->http && !*c->http) c->http = NULL;
    c->token = getenv("QUANTD_HTTP_TOKEN");
    c->queue = getenv("QUANTD_QUEUE");
    c->prefix = getenv("QUANTD_KEY_PREFIX");
}

int qctl_conn_option(qctl_conn *c, int opt, const char *arg)
{
    switch (opt) {
    case QCTL_OPT_REDIS: c->redis = arg; c->http = NULL; return 1;
    case QCTL_OPT_HTTP: c->http = arg; return 1;
    case QCTL_OPT_TOKEN: c->token = arg; return 1;
    case QCTL_OPT_QUEUE: c->queue = arg; return 1;
    case QCTL_OPT_PREFIX: c->prefix = arg; return 1;
    default: return 0;
    }
}

const char *qctl_conn_help =
    "  --redis URL       Redis holding the queue (redis://[user:pass@]HOST:PORT[/db]; $QUANTD_REDIS)\n"
    "  --http URL        use the daemon's HTTP API instead (http://HOST:PORT; $QUANTD_HTTP)\n"
    "  --token T         bearer token for submit/cancel over HTTP ($QUANTD_HTTP_TOKEN)\n"
    "  --queue NAME      queue name (default qjobs); --key-prefix P  job key prefix (default qjob)\n";

int qctl_keys(const qctl_conn *c, qp_keys *k)
{
    qp_err pe = {0};
    if (qp_keys_init(k, c->queue, c->prefix, &pe)) {
        fprintf(stderr, "quantctl: %s\n", pe.msg);
        return -1;
    }
    return 0;
}

redisContext *qctl_redis(const qctl_conn *c)
{
    const char *u = c->redis;
    if (strncmp(u, "redis://", 8)) {
        fprintf(stderr, "quantctl: --redis '%s' does not start with redis://\n", u);
        return NULL;
    }
    char buf[512], *user = NULL, *pass = NULL, *host, *port, *db;
    snprintf(buf, sizeof buf, "%s", u + 8);
    char *at = strrchr(buf, '@');
    host = buf;
    if (at) {
        *at = 0;
        host = at + 1;
        char *colon = strchr(buf, ':');
        if (colon) { *colon = 0; user = *buf ? buf : NULL; pass = colon + 1; }
        else pass = buf;
    }
    if ((db = strchr(host, '/'))) *db++ = 0;
    port = strrchr(host, ':');
    if (!port) { fprintf(stderr, "quantctl: --redis '%s': expected HOST:PORT\n", u); return NULL; }
    *port++ = 0;
    struct timeval tv = {5, 0};
    redisContext *r = redisConnectWithTimeout(host, atoi(port), tv);
    if (!r || r->err) {
        fprintf(stderr, "quantctl: cannot reach Redis at %s:%s: %s\n", host, port, r ? r->errstr : "out of memory");
        redisFree(r);
        return NULL;
    }
    redisReply *rep = NULL;
    if (pass) rep = user ? redisCommand(r, "AUTH %s %s", user, pass) : redisCommand(r, "AUTH %s", pass);
    if (pass && (!rep || rep->type == REDIS_REPLY_ERROR)) {
        fprintf(stderr, "quantctl: Redis AUTH failed: %s\n", rep ? rep->str : r->errstr);
        freeReplyObject(rep);
        redisFree(r);
        return NULL;
    }
    freeReplyObject(rep);
    if (db && atoi(db)) freeReplyObject(redisCommand(r, "SELECT %d", atoi(db)));
    return r;
}

int qctl_http_open(const qctl_conn *c, const char *method, const char *path, const char *body)
{
    const char *u = c->http;
    if (!strncmp(u, "http://", 7)) u += 7;
    char host[256], port[16] = "80";
    snprintf(host, sizeof host, "%s", u);
    char *slash = strchr(host, '/');
    if (slash) *slash = 0;
    char *colon = strrchr(host, ':');
    if (colon) { *colon = 0; snprintf(port, sizeof port, "%s", colon + 1); }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai)) {
        fprintf(stderr, "quantctl: cannot resolve %s\n", host);
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) { close(fd); fd = -1; }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "quantctl: cannot reach the HTTP API at %s:%s: %s\n", host, port, strerror(errno));
        return -1;
    }
    char *req = NULL;
    size_t blen = body ? strlen(body) : 0;
    int n = asprintf(&req, "%s %s HTTP/1.0\r\nHost: %s\r\n%s%s%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", method, path, host, c->token ? "Authorization: Bearer " : "",
                     c->token ? c->token : "", c->token ? "\r\n" : "", blen, body ? body : "");
    if (n < 0 || write(fd, req, (size_t)n) != n) { free(req); close(fd); return -1; }
    free(req);
    return fd;
}

int qctl_http(const qctl_conn *c, const char *method, const char *path, const char *body, int *status,
              char **resp)
{
    *status = 0;
    *resp = NULL;
    int fd = qctl_http_open(c, method, path, body);
    if (fd < 0) return -1;
    /* HTTP/1.0: the server closes after the body, so read to EOF. */
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (cap - len < 2) { char *nb = realloc(buf, cap *= 2); if (!nb) { free(buf); buf = NULL; } else buf = nb; }
    }
    close(fd);
    if (!buf) return -1;
    buf[len] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/%*s %d", status) != 1) {
        fprintf(stderr, "quantctl: malformed answer from %s\n", c->http);
        free(buf);
        return -1;
    }
    *resp = strdup(sep + 4);
    free(buf);
    return *resp ? 0 : -1;
}

/* Prints the "error" of an API answer, or the answer itself. */
void qctl_http_error(int status, const char *resp)
{
    cJSON *o = cJSON_Parse(resp ? resp : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    fprintf(stderr, "quantctl: HTTP %d: %s\n", status, cJSON_IsString(e) ? e->valuestring : (resp ? resp : ""));
    cJSON_Delete(o);
}

void qctl_print_status(const qp_status *st)
{
    printf("id:        %s\nstate:     %s\n", st->id ? st->id : "?", qp_state_name(st->state));
    if (st->stage) printf("stage:     %s\n", st->stage);
    if (st->n_blocks) printf("block:     %d/%d\n", st->block + 1, st->n_blocks);
    printf("progress:  %.1f%%\n", st->progress * 100);
    if (st->eta_s >= 0 && st->state == QP_STATE_RUNNING) printf("eta:       %.0f s\n", st->eta_s);
    if (st->layer) printf("layer:     %s\n", st->layer);
    if (st->node) printf("node:      %s%s%s\n", st->node, st->worker ? " / " : "", st->worker ? st->worker : "");
    if (st->attempts) printf("attempts:  %d\n", st->attempts);
    if (st->error) printf("error:     %s\n", st->error);
    if (st->estimate) printf("estimate:  %s\n", st->estimate);
    if (st->output) printf("output:    %s\n", st->output);
    if (st->report) printf("report:    %s\n", st->report);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl status [ID] [--json] [--redis URL | --http URL]\n"
               "  Shows one job's status, or every job (like `quantctl list`) without ID.\n"
               "  --json            print the status as JSON\n%s"
               "exit status: 0 shown, 1 no such job or the server failed, 2 bad usage\n", qctl_conn_help);
}

int cmd_status(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    int json = 0, o;
    static const struct option opts[] = {QCTL_CONN_OPTIONS, {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0}};
    optind = 1;
    while ((o = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 'j') json = 1;
        else if (o == 'h') { usage(stdout); return QCTL_OK; }
        else { usage(stderr); return QCTL_USAGE; }
    }
    if (optind == argc) return cmd_list(argc, argv, rt);
    if (optind + 1 != argc) { usage(stderr); return QCTL_USAGE; }
    const char *id = argv[optind];
    if (!qp_name_valid(id)) { fprintf(stderr, "quantctl: '%s' is not a job id\n", id); return QCTL_USAGE; }
    if (c.http) {
        char path[128], *resp;
        int status;
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        if (qctl_http(&c, "GET", path, NULL, &status, &resp)) return QCTL_FAIL;
        if (status != 200) { qctl_http_error(status, resp); free(resp); return QCTL_FAIL; }
        qp_status st;
        qp_err pe = {0};
        if (json || qp_status_from_event(&st, NULL, resp, strlen(resp), &pe)) fputs(resp, stdout);
        else { qctl_print_status(&st); qp_status_clear(&st); }
        free(resp);
        return QCTL_OK;
    }
    qp_keys k;
    if (qctl_keys(&c, &k)) return QCTL_USAGE;
    redisContext *r = qctl_redis(&c);
    if (!r) return QCTL_FAIL;
    char key[QP_KEY_MAX];
    qp_key_status(&k, id, key, sizeof key);
    redisReply *rep = redisCommand(r, "HGETALL %s", key);
    int rc = QCTL_FAIL;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) fprintf(stderr, "quantctl: Redis: %s\n", rep ? rep->str : r->errstr);
    else if (!rep->elements) fprintf(stderr, "quantctl: no job '%s'\n", id);
    else {
        const char **kv = calloc(rep->elements, sizeof *kv);
        for (size_t i = 0; kv && i < rep->elements; i++) kv[i] = rep->element[i]->str ? rep->element[i]->str : "";
        qp_status st;
        qp_status_init(&st);
        qp_err pe = {0};
        if (kv && !qp_status_from_fields(&st, kv, rep->elements, &pe)) {
            if (json) {
                char *s = qp_status_to_event(&st, QP_EVENT_STATE);
                if (s) puts(s);
                free(s);
            } else {
                qctl_print_status(&st);
            }
            rc = QCTL_OK;
        } else {
            fprintf(stderr, "quantctl: job '%s': %s\n", id, pe.msg);
        }
        qp_status_clear(&st);
        free(kv);
    }
    freeReplyObject(rep);
    redisFree(r);
    return rc;
}
